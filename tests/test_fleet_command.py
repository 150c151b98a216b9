"""``accelbench fleet``: one independent run per node through the allocation's launcher, then ``compare --fleet``.

The fast tests check the launcher command for N nodes (srun and mpirun forms), the options every node gets, the
allocation found from the scheduler's environment, the message outside one, and that a node's task, stripped of its
launcher's variables, is no rank of a multi-node job. The slow one runs the fleet for real inside ``salloc`` on the
test Slurm's one node (tests/cluster_support.py), with ``--devices 2``: the node starts its own 2 workers, which
it could not do had it adopted the srun step (1 task) as its job.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cluster_support import ClusterUnavailable, SlurmCluster, check_mpirun, job_env

from accelbench.cli import main
from accelbench.commands.fleet import (
    NODE_MODULE,
    Allocation,
    find_allocation,
    node_command,
    run_options,
)
from accelbench.errors import ConfigError
from accelbench.launch import LaunchEnv, detect_launch, without_launcher
from accelbench.results import read_record

PYTHON = "/venv/bin/python"
# what srun gives the task on a job's third node of four (Slurm 22.05, `srun --nodes=4 --ntasks-per-node=1`)
SRUN_TASK = {
    "SLURM_JOB_ID": "7311", "SLURM_JOB_NODELIST": "gpu[001-004]", "SLURM_JOB_NUM_NODES": "4", "SLURM_NNODES": "4",
    "SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "2", "SLURM_NTASKS": "4", "SLURM_NPROCS": "4",
    "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_NUM_NODES": "4",
    "SLURM_STEP_TASKS_PER_NODE": "1(x4)", "SLURM_STEP_NODELIST": "gpu[001-004]", "SLURM_TASKS_PER_NODE": "1(x4)",
    "SLURMD_NODENAME": "gpu003", "PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "0,1,2,3",
}  # fmt: skip
# what Open MPI 4's `mpirun --map-by ppr:1:node` gives its process on the second node of two
MPIRUN_TASK = {
    "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "OMPI_COMM_WORLD_NODE_RANK": "0", "OMPI_UNIVERSE_SIZE": "2",
    "OMPI_MCA_ess_base_jobid": "405667841", "OMPI_MCA_ess_base_vpid": "1", "PMIX_RANK": "1",
    "PMIX_NAMESPACE": "405667841", "MASTER_ADDR": "node1", "MASTER_PORT": "29500", "PBS_JOBID": "88.pbs",
}  # fmt: skip


def test_srun_starts_one_unbound_task_per_node_that_fails_alone() -> None:
    command = node_command(Allocation("srun", 4, "7311"), ["--model", "gpt2"], PYTHON)
    assert command == [
        "srun", "--nodes=4", "--ntasks-per-node=1", "--ntasks=4", "--whole", "--cpu-bind=none",
        "--kill-on-bad-exit=0", "--label", PYTHON, "-m", NODE_MODULE, "--model", "gpt2",
    ]  # fmt: skip


def test_mpirun_maps_one_process_per_node(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONPATH", raising=False)
    hostfile = Path("/var/spool/pbs/aux/88.pbs")
    command = node_command(Allocation("mpirun", 3, "88.pbs", hostfile), ["-q"], PYTHON)
    assert command == [
        "mpirun", "--map-by", "ppr:1:node", "--bind-to", "none", "--tag-output", "-np", "3",
        "--hostfile", str(hostfile), PYTHON, "-m", NODE_MODULE, "-q",
    ]  # fmt: skip
    monkeypatch.setenv("PYTHONPATH", "/site")
    assert node_command(Allocation("mpirun", None, None), [], PYTHON)[:8] == [
        "mpirun", "--map-by", "ppr:1:node", "--bind-to", "none", "--tag-output", "-x", "PYTHONPATH",
    ]  # fmt: skip


def test_the_fleets_own_options_are_not_passed_to_the_nodes() -> None:
    argv = ["fleet", "--nodes", "4", "--model", "gpt2", "--launcher=srun", "--dry-run", "--hostfile", "h",
            "--epochs", "2", "--nodes=3"]  # fmt: skip
    assert run_options(argv) == ["--model", "gpt2", "--epochs", "2"]


def test_a_task_without_its_launchers_variables_is_a_process_of_its_own() -> None:
    """The node's run must not adopt the step as a 4-rank job across nodes (it would wait for a rendezvous with
    the other nodes); the job's identity stays, for the record."""
    assert detect_launch(SRUN_TASK).world_size == 4
    assert detect_launch(MPIRUN_TASK).world_size == 2
    for task in (SRUN_TASK, MPIRUN_TASK):
        alone = without_launcher(task)
        assert detect_launch(alone) == LaunchEnv("none")
        assert not {k for k in alone if k.startswith(("OMPI_COMM", "PMIX", "MASTER_", "SLURM_STEP"))}
    kept = without_launcher(SRUN_TASK)
    assert kept["SLURM_JOB_ID"] == "7311" and kept["SLURM_JOB_NODELIST"] == "gpu[001-004]"
    assert kept["CUDA_VISIBLE_DEVICES"] == "0,1,2,3" and "SLURM_NTASKS" not in kept  # Lightning reads it


def test_the_allocation_comes_from_the_scheduler(tmp_path: Path) -> None:
    assert find_allocation(
        {"SLURM_JOB_ID": "9", "SLURM_JOB_NUM_NODES": "16"}, "auto", None, None
    ) == Allocation("srun", 16, "9")
    assert find_allocation({"SLURM_JOB_ID": "9", "SLURM_JOB_NUM_NODES": "16"}, "auto", 5, None) == Allocation(
        "srun", 5, "9"
    )
    with pytest.raises(ConfigError, match="--nodes 17, but this Slurm allocation has 16 node"):
        find_allocation({"SLURM_JOB_ID": "9", "SLURM_JOB_NUM_NODES": "16"}, "auto", 17, None)
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("n1\nn1\nn2\nn2\nn3\n")  # PBS: a line per slot
    pbs = {"PBS_NODEFILE": str(nodefile), "PBS_JOBID": "88.pbs"}
    assert find_allocation(pbs, "auto", None, None) == Allocation("mpirun", 3, "88.pbs", nodefile)
    assert find_allocation({}, "auto", None, None) is None
    assert find_allocation({}, "srun", None, None) is None
    assert find_allocation({}, "mpirun", None, None) == Allocation("mpirun", None, None)  # mpirun's own hosts
    in_slurm = {"SLURM_JOB_ID": "9", "SLURM_JOB_NUM_NODES": "16"}
    assert find_allocation(in_slurm, "mpirun", None, None) == Allocation("mpirun", 16, "9")


@pytest.fixture
def no_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith(("SLURM_", "PBS_", "LSB_", "PE_", "OMPI_", "PMI")) or name == "JOB_ID":
            monkeypatch.delenv(name)


@pytest.mark.usefixtures("no_scheduler")
def test_outside_an_allocation_it_says_so_with_the_sbatch_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fleet", "--model", "gpt-nano", "--epochs", "1"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "there is none here" in err
    assert "sbatch --nodes=4 --exclusive --wrap 'accelbench fleet --model gpt-nano --epochs 1'" in err


@pytest.mark.usefixtures("no_scheduler")
def test_in_an_allocation_the_dry_run_prints_the_srun_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "7311")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "4")
    monkeypatch.chdir(tmp_path)
    assert main(["fleet", "--model", "gpt-nano", "--nodes", "2", "--dry-run"]) == 0
    out = capsys.readouterr().out.split()
    assert out[:3] == ["srun", "--nodes=2", "--ntasks-per-node=1"]
    assert out[out.index("-m") + 1 :] == [
        NODE_MODULE, "--model", "gpt-nano", "--output-dir", str(tmp_path / "results" / "fleet-7311"), "--quiet",
    ]  # fmt: skip
    assert not (tmp_path / "results").exists()


@pytest.mark.usefixtures("no_scheduler")
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nnodes", "2"], "a fleet runs one single-node benchmark per node"),
        (["--nodes", "0"], "--nodes 0: give 1 or more"),
        (["--epochs", "0"], "--epochs"),  # the run's options are judged once, before any node starts
    ],
)
def test_what_a_fleet_cannot_run_is_refused_before_launching(
    monkeypatch: pytest.MonkeyPatch, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "7311")
    assert main(["fleet", "--model", "gpt-nano", *args, "--dry-run"]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_salloc_runs_the_fleet_one_record_per_node_and_compares_them(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    folder = tmp_path / "fleet"
    proc = slurm.command(
        "salloc", "--nodes=1", "--exclusive", sys.executable, "-m", "accelbench.cli", "fleet", "--backend", "cpu",
        "--model", "gpt-nano", "--strategy", "ddp", "--devices", "2", "--epochs", "2", "--steps-per-epoch", "2",
        "--batch-size", "4", "--output-dir", str(folder), timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:] + slurm.logs()
    records = [read_record(p) for p in sorted(folder.glob("*.json"))]
    assert len(records) == 1  # one node, one record
    (record,) = records
    assert record.outcome.status == "ok"
    assert (record.world_size, record.nodes) == (2, 1)  # its own 2 workers, not the step's one task
    assert record.system.scheduler == "slurm" and record.system.job_id
    assert f"  {record.system.host}: ok, median steady epoch" in proc.stderr
    assert "fleet: 1 node(s) through srun" in proc.stderr
    assert "1 node(s); a fleet needs 3 or more to tell an outlier" in proc.stdout  # compare --fleet, printed


@pytest.mark.slow
def test_sbatch_on_two_nodes_runs_two_independent_runs(slurm_two_nodes: SlurmCluster, tmp_path: Path) -> None:
    """A real 2-node Slurm job (two slurmd on this host): srun starts a task on each node, and each trains alone,
    a world of 1 on 1 node; joined as one job they would be one 2-rank record (or wait for each other)."""
    folder = tmp_path / "fleet"
    script = tmp_path / "fleet.sbatch"
    script.write_text(
        "#!/bin/bash\n#SBATCH --nodes=2 --output=fleet-%j.out\n"
        f"{sys.executable} -m accelbench.cli fleet --backend cpu --model gpt-nano --epochs 2 --steps-per-epoch 2 "
        f"--batch-size 4 --output-dir {folder}\n"
    )
    job = slurm_two_nodes.sbatch(script, cwd=tmp_path)
    state = slurm_two_nodes.wait_for_job(job, timeout=300)
    log = tmp_path / f"fleet-{job}.out"
    output = log.read_text() if log.exists() else "(no job output)"
    assert state == "COMPLETED", f"{state}\n{output}\n{slurm_two_nodes.logs()}"
    records = [read_record(p) for p in sorted(folder.glob("*.json"))]
    assert len(records) == 2, output
    assert {(r.world_size, r.nodes, r.outcome.status) for r in records} == {(1, 1, "ok")}
    assert len({r.run_id for r in records}) == 2 and {r.system.job_id for r in records} == {job}
    assert "fleet: 2 node(s) through srun" in output and output.count(": ok, median steady epoch") == 2
    assert "a fleet needs 3 or more to tell an outlier" in output  # both share this host's name: one "node"


@pytest.mark.slow
def test_mpirun_runs_the_fleet_on_its_one_host(tmp_path: Path) -> None:
    """``--launcher mpirun`` without a host file: mpirun's own allocation, this host; the process it starts drops
    its MPI ranks and starts its own 2 workers (``--devices 2``)."""
    try:
        check_mpirun()
    except ClusterUnavailable as exc:
        pytest.skip(f"no real Open MPI here: {exc}")
    root = {
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    }  # mpirun refuses root without
    folder = tmp_path / "fleet"
    proc = subprocess.run(
        [sys.executable, "-m", "accelbench.cli", "fleet", "--launcher", "mpirun", "--backend", "cpu", "--model",
         "gpt-nano", "--strategy", "ddp", "--devices", "2", "--epochs", "2", "--steps-per-epoch", "2",
         "--batch-size", "4", "--output-dir", str(folder)],
        capture_output=True, text=True, env=job_env(root), cwd=tmp_path, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (path,) = folder.glob("*.json")
    record = read_record(path)
    assert (record.world_size, record.nodes, record.outcome.status) == (2, 1, "ok")
    assert "fleet: every node of the allocation through mpirun" in proc.stderr
    assert "1 node(s); a fleet needs 3 or more" in proc.stdout
