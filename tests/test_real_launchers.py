"""accelbench started by a real Slurm (srun, sbatch) and a real Open MPI (mpirun), as on a cluster.

The fast tests check the launcher fixes unit by unit (the single-node rendezvous every rank derives alike, the
clear error across nodes, the note about a launcher's core binding). The slow ones start a one-node Slurm and
``mpirun`` (tests/cluster_support.py) and skip, saying why, where their packages are not installed
(``apt-get install slurm-wlm munge openmpi-bin``; ``.ci/run`` does so where it can).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from pathlib import Path

import pytest
from cluster_support import REPO, ClusterUnavailable, SlurmCluster, check_mpirun, job_env, start_slurm

from accelbench.comm.records import read_comm_record
from accelbench.errors import ConfigError
from accelbench.launch import (
    LaunchEnv,
    binding_note,
    check_launch,
    check_rendezvous_port,
    detect_launch,
    node_addr_from_scontrol,
    slurm_node_address,
    threads_note,
    with_reachable_master,
    worker_threads,
)
from accelbench.results import read_record

# gpt-nano, 1 epoch of 3 steps: a real DDP run of two ranks in a few seconds
RUN = ["run", "--backend", "cpu", "--model", "gpt-nano", "--strategy", "ddp", "--epochs", "1",
       "--steps-per-epoch", "3", "--batch-size", "4", "-q"]  # fmt: skip
COMM = ["comm", "--backend", "cpu", "--ops", "all_reduce,all_gather", "--sizes", "1KiB,64KiB", "--warmup", "1",
        "--iters", "3", "-q"]  # fmt: skip
MODULE = ["python", "-m", "accelbench.cli"]
DOC = REPO / "docs" / "workflow.md"

# ------------------------------------------------------------------------------------------------------------------
# the fixes, unit by unit

OMPI_ONE_NODE = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                 "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_MCA_ess_base_jobid": "405667841"}  # fmt: skip


def test_mpirun_on_one_node_agrees_on_a_loopback_rendezvous_from_the_job_id() -> None:
    """mpirun -np 2 on one host: every rank derives the same port from the job id mpirun gave it (no message
    passing), on 127.0.0.1; another job gets another port; an exported MASTER_PORT still wins."""
    rank1 = detect_launch(OMPI_ONE_NODE)
    rank0 = detect_launch({**OMPI_ONE_NODE, "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_RANK": "0"})
    assert rank0.master_addr == rank1.master_addr == "127.0.0.1"
    assert rank0.master_port == rank1.master_port and 20000 <= (rank0.master_port or 0) < 30000
    check_launch(rank1, None, None)  # no longer refused
    other = detect_launch({**OMPI_ONE_NODE, "OMPI_MCA_ess_base_jobid": "405667842"})
    assert other.master_port != rank1.master_port
    open_mpi_5 = {k: v for k, v in OMPI_ONE_NODE.items() if k != "OMPI_MCA_ess_base_jobid"}
    assert detect_launch({**open_mpi_5, "PMIX_NAMESPACE": "prterun-vm-4242@1"}).master_port is not None
    assert detect_launch({**OMPI_ONE_NODE, "MASTER_PORT": "29500"}).master_port == 29500


def test_mpirun_across_nodes_still_needs_master_addr_and_port() -> None:
    across = {**OMPI_ONE_NODE, "OMPI_COMM_WORLD_SIZE": "4"}  # 2 of 4 ranks here: the others are elsewhere
    launch = detect_launch(across)
    assert (launch.master_addr, launch.master_port, launch.nnodes) == (None, None, 2)
    with pytest.raises(ConfigError, match="across nodes but MASTER_ADDR/MASTER_PORT are not set"):
        check_launch(launch, None, None)


def test_one_node_mpi_without_a_job_id_names_master_port() -> None:
    """MPICH's hydra gives its ranks no job id: on one node the error asks for the port only, not for nodes."""
    hydra = {"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}
    with pytest.raises(ConfigError, match="2 ranks on this node .* export MASTER_PORT=<free port>"):
        check_launch(detect_launch(hydra), None, None)


def test_srun_on_one_node_uses_the_loopback_and_the_job_port() -> None:
    env = {"SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NUM_NODES": "1",
           "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_STEP_NODELIST": "vm", "SLURM_JOB_ID": "7"}  # fmt: skip
    assert detect_launch(env) == LaunchEnv("slurm", 1, 1, 2, 2, 1, "127.0.0.1", 10007)


SRUN_TWO_NODES = {"SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_STEP_NUM_TASKS": "2",
                  "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
                  "SLURM_STEP_NODELIST": "vm-[1-2]", "SLURM_JOB_ID": "7"}  # fmt: skip
SCONTROL_NODE = ("NodeName=vm-1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=1 CPUTot=1 NodeAddr=127.0.0.1 "
                 "NodeHostName=vm Version=22.05.8 OS=Linux State=ALLOCATED Partitions=debug")  # fmt: skip


def test_srun_across_nodes_rendezvous_at_the_first_nodes_address() -> None:
    """A 2-node step whose node names are not host names (two ``slurmd -N`` on one host; or slurm.conf's
    ``NodeName=gpu-a NodeAddr=10.1.0.17``): before the fix every rank connected to ``vm-1``, which does not resolve,
    and retried for the store's 10 minutes. Now the name where it resolves, else the node's NodeAddr, else a
    ConfigError naming MASTER_ADDR; an exported MASTER_ADDR and a one-node step are left alone."""
    launch = detect_launch(SRUN_TWO_NODES)
    assert launch == LaunchEnv("slurm", 1, 0, 2, 1, 2, "vm-1", 10007)
    asked: list[str] = []

    def address(node: str) -> str:
        asked.append(node)
        return slurm_node_address(node, resolves=lambda n: False, node_addr=lambda n: "127.0.0.1")

    assert with_reachable_master(launch, exported_addr=False, address=address).master_addr == "127.0.0.1"
    assert asked == ["vm-1"]
    assert slurm_node_address("gpu003", resolves=lambda n: True, node_addr=lambda n: "unused") == "gpu003"
    with pytest.raises(ConfigError, match=r"'vm-1' .* no NodeAddr; export MASTER_ADDR=<its address>"):
        slurm_node_address("vm-1", resolves=lambda n: False, node_addr=lambda n: None)
    exported = detect_launch({**SRUN_TWO_NODES, "MASTER_ADDR": "10.0.0.1"})
    one_node = detect_launch({**SRUN_TWO_NODES, "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_TASKS_PER_NODE": "2",
                              "SLURM_LOCALID": "1"})  # fmt: skip
    for kept, flag in ((exported, True), (one_node, False)):
        assert with_reachable_master(kept, exported_addr=flag, address=address) == kept
    assert asked == ["vm-1"]  # neither asked
    assert node_addr_from_scontrol(SCONTROL_NODE) == "127.0.0.1"
    assert node_addr_from_scontrol("NodeName=vm-1 NodeAddr=(null) State=DOWN") is None


def test_a_busy_rendezvous_port_is_refused_on_rank_0_before_anything_runs() -> None:
    """Something already listens on the port: rank 0 says so (which port, where it came from, what to export)
    instead of torch's DistNetworkError traceback; torchrun's workers (whose agent holds the port) are not checked."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        rank0 = LaunchEnv("openmpi", 0, 0, 2, 2, 1, "127.0.0.1", port)
        with pytest.raises(
            ConfigError, match=rf"port {port} \(the port accelbench derived from the openmpi job id\)"
        ):
            check_rendezvous_port(rank0, exported_port=False)
        with pytest.raises(
            ConfigError, match=rf"port {port} \(MASTER_PORT\) .* export MASTER_PORT=<free port>"
        ):
            check_rendezvous_port(LaunchEnv("slurm", 0, 0, 2, 2, 1, "127.0.0.1", port), exported_port=True)
        check_rendezvous_port(LaunchEnv("openmpi", 1, 1, 2, 2, 1, "127.0.0.1", port), exported_port=False)
        check_rendezvous_port(LaunchEnv("torchrun", 0, 0, 2, 2, 1, "127.0.0.1", port), exported_port=True)
    check_rendezvous_port(rank0, exported_port=False)  # free again


@pytest.mark.parametrize(
    ("launch", "usable", "cores", "lift"),
    [
        (LaunchEnv("openmpi", 0, 0, 2, 2), 1, 16, "mpirun --bind-to none"),
        (LaunchEnv("slurm", 0, 0, 4, 4), 2, 16, "srun --cpu-bind=none"),
        (LaunchEnv("openmpi", 0, 0, 2, 2), 1, 2, None),  # 2 ranks x 1 core = every core of the host
        (LaunchEnv("torchrun", 0, 0, 2, 2), 1, 16, None),
        (LaunchEnv("none"), 1, 16, None),
    ],
)
def test_a_launchers_core_binding_is_said(
    launch: LaunchEnv, usable: int, cores: int, lift: str | None
) -> None:
    note = binding_note(launch, usable, cores)
    if lift is None:
        assert note is None
    else:
        assert note is not None and lift in note and f"to {usable} core(s) of {cores}" in note


@pytest.mark.parametrize(
    ("environ", "nproc", "threads", "usable", "expected"),
    [
        ({}, 2, None, 16, {"OMP_NUM_THREADS": "8"}),  # the node's cores shared out
        ({}, 3, None, 2, {"OMP_NUM_THREADS": "1"}),  # never below one
        ({}, 2, 4, 16, {"OMP_NUM_THREADS": "4"}),  # --threads
        ({"OMP_NUM_THREADS": "6"}, 2, 4, 16, {}),  # the user's is kept
        ({}, 1, None, 16, {}),  # one worker: its OpenMP may have every core
    ],
)
def test_the_workers_openmp_threads_are_the_cores_each_gets(
    environ: dict[str, str], nproc: int, threads: int | None, usable: int, expected: dict[str, str]
) -> None:
    assert worker_threads(environ, nproc, threads, usable) == expected


def test_a_launcher_that_leaves_openmp_unsized_is_said() -> None:
    slurm = LaunchEnv("slurm", 0, 0, 4, 4)
    note = threads_note(slurm, {})
    assert note is not None and "export OMP_NUM_THREADS" in note and "4 ranks" in note
    assert threads_note(slurm, {"OMP_NUM_THREADS": "2"}) is None
    assert threads_note(LaunchEnv("openmpi", 0, 0, 2, 1), {}) is None  # one rank on this node
    assert threads_note(LaunchEnv("torchrun", 0, 0, 2, 2), {}) is None  # torchrun exports it
    assert threads_note(LaunchEnv("none"), {}) is None


# ------------------------------------------------------------------------------------------------------------------
# real launchers


def test_a_missing_slurm_binary_is_a_reason_to_skip(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Where a package is missing the fixture skips naming what is missing and how to install it; nothing starts."""
    import cluster_support

    real = cluster_support._binary
    monkeypatch.setattr(cluster_support, "_binary", lambda name: None if name == "slurmd" else real(name))
    with pytest.raises(ClusterUnavailable, match=r"slurmd[\w, ]*missing\): apt-get install slurm-wlm munge"):
        start_slurm(tmp_path)
    assert not (tmp_path / "slurm.conf").exists()


@pytest.fixture(scope="session")
def mpirun() -> list[str]:
    try:
        return check_mpirun()
    except ClusterUnavailable as exc:
        pytest.skip(f"no real Open MPI here: {exc}")


def _only(folder: Path) -> Path:
    files = sorted(folder.glob("*.json"))
    assert len(files) == 1, files
    return files[0]


def _mpirun(
    mpirun: list[str], args: list[str], cwd: Path, ranks: int = 2
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*mpirun, "-np", str(ranks), *args], capture_output=True, text=True, env=job_env(), cwd=cwd, timeout=300,
        check=False,
    )  # fmt: skip


@pytest.mark.slow
def test_srun_trains_ddp_on_two_ranks(slurm: SlurmCluster, tmp_path: Path) -> None:
    """srun starts one process per rank: accelbench adopts them (--devices agrees with the 2 srun started)."""
    proc = slurm.srun("-n", "2", *MODULE, *RUN, "--devices", "2", "--output-dir", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:] + slurm.logs()
    record = read_record(_only(tmp_path))
    assert record.outcome.status == "ok"
    assert (record.launcher, record.world_size, record.nodes) == ("slurm", 2, 1)
    assert record.metrics is not None
    assert [r.rank for r in record.metrics.ranks] == [0, 1]
    assert record.system.scheduler == "slurm" and record.system.job_id
    assert record.metrics.epochs[0].samples == 2 * 3 * 4  # both ranks' samples: 3 steps of 4 each


@pytest.mark.slow
def test_srun_with_devices_that_disagree_is_refused(slurm: SlurmCluster, tmp_path: Path) -> None:
    proc = slurm.srun("-n", "2", *MODULE, *RUN, "--devices", "4", "--output-dir", str(tmp_path), cwd=tmp_path)
    assert proc.returncode != 0
    assert "--devices 4, but slurm started 2 process(es) on this node" in proc.stderr
    assert not list(tmp_path.glob("*.json"))


@pytest.mark.slow
def test_mpirun_trains_ddp_on_two_ranks_and_records_the_binding(mpirun: list[str], tmp_path: Path) -> None:
    """Before the fix this exited 2 ("... across nodes but MASTER_ADDR/MASTER_PORT are not set"). mpirun binds
    each rank to one core by default: the record says so (rank 0's usable cores and affinity)."""
    proc = _mpirun(mpirun, [*MODULE, *RUN, "--output-dir", str(tmp_path), "--json"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = read_record(_only(tmp_path))
    assert record.outcome.status == "ok"
    assert (record.launcher, record.world_size, record.nodes) == ("openmpi", 2, 1)
    assert json.loads(proc.stdout)["launcher"] == "openmpi"  # rank 0 alone prints the record
    assert record.system.cpu_usable_cores == 1 and re.fullmatch(r"\d+", record.system.cpu_affinity or "")


@pytest.mark.slow
def test_mpirun_with_a_busy_rendezvous_port_is_refused_before_training(
    mpirun: list[str], tmp_path: Path
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = _mpirun(
            mpirun, ["-x", f"MASTER_PORT={port}", *MODULE, *RUN, "--output-dir", str(tmp_path)], tmp_path
        )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"rendezvous port {port} (MASTER_PORT) is not available" in proc.stderr
    assert "Traceback" not in proc.stderr and not list(tmp_path.glob("*.json"))


@pytest.mark.slow
def test_srun_with_a_busy_rendezvous_port_ends_with_kill_on_bad_exit(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """Rank 0 refuses the busy port; the other rank cannot tell a busy port from rank 0's own rendezvous, so it
    would wait the collective timeout: ``srun --kill-on-bad-exit`` (the docs say so) ends the step at once."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = slurm.srun(
            "-n", "2", "--kill-on-bad-exit=1", f"--export=ALL,MASTER_PORT={port}", *MODULE, *RUN,
            "--output-dir", str(tmp_path), cwd=tmp_path, timeout=120,
        )  # fmt: skip
    assert proc.returncode != 0
    assert f"rendezvous port {port} (MASTER_PORT) is not available" in proc.stderr
    assert "Traceback" not in proc.stderr and not list(tmp_path.glob("*.json"))


@pytest.mark.slow
def test_mpiruns_binding_is_said_and_recorded_and_bind_to_none_lifts_it(
    mpirun: list[str], tmp_path: Path
) -> None:
    """One rank under mpirun is bound to one core of the host's (2 here): rank 0 says so, naming the flag, and the
    record keeps it; with ``--bind-to none`` the rank gets every core and nothing is said."""
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        pytest.skip(f"binding to one core changes nothing on a host with {cores} usable core")
    bound = _mpirun(mpirun, [*MODULE, *RUN, "--output-dir", str(tmp_path / "bound")], tmp_path, ranks=1)
    assert bound.returncode == 0, bound.stderr[-3000:]
    assert f"openmpi bound each of this node's 1 rank(s) to 1 core(s) of {os.cpu_count()}" in bound.stderr
    assert "mpirun --bind-to none gives them all" in bound.stderr
    assert read_record(_only(tmp_path / "bound")).system.cpu_usable_cores == 1
    free = _mpirun(
        mpirun, ["--bind-to", "none", *MODULE, *RUN, "--output-dir", str(tmp_path / "free")], tmp_path, 1
    )
    assert free.returncode == 0, free.stderr[-3000:]
    assert "bound each" not in free.stderr
    assert read_record(_only(tmp_path / "free")).system.cpu_usable_cores == cores


@pytest.mark.slow
def test_srun_measures_collectives(slurm: SlurmCluster, tmp_path: Path) -> None:
    proc = slurm.srun("-n", "2", *MODULE, *COMM, "--output-dir", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = read_comm_record(_only(tmp_path))
    assert record.outcome.status == "ok", record.outcome
    assert (record.launcher, record.world_size) == ("slurm", 2)
    assert {m.op for m in record.measurements} == {"all_reduce", "all_gather"}


@pytest.mark.slow
def test_mpirun_measures_collectives(mpirun: list[str], tmp_path: Path) -> None:
    proc = _mpirun(mpirun, [*MODULE, *COMM, "--output-dir", str(tmp_path)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = read_comm_record(_only(tmp_path))
    assert record.outcome.status == "ok", record.outcome
    assert (record.launcher, record.world_size) == ("openmpi", 2)


def documented_batch_script() -> str:
    """The batch script docs/workflow.md shows for a 2-rank job (the ```bash block with ``--ntasks-per-node=2``)."""
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S)
    (script,) = [b for b in blocks if b.startswith("#!/bin/bash") and "--ntasks-per-node=2" in b]
    return script


@pytest.mark.slow
def test_the_documented_batch_script_runs_through_sbatch(slurm: SlurmCluster, tmp_path: Path) -> None:
    """The script exactly as the docs show it, submitted from a folder: its record appears under results/slurm."""
    script = tmp_path / "ddp.sbatch"
    script.write_text(documented_batch_script())
    job = slurm.sbatch(script, cwd=tmp_path)
    state = slurm.wait_for_job(job, timeout=300)
    log = tmp_path / f"accelbench-{job}.out"
    output = log.read_text() if log.exists() else "(no job output)"
    assert state == "COMPLETED", f"{state}\n{output}\n{slurm.logs()}"
    record = read_record(_only(tmp_path / "results" / "slurm"))
    assert (record.launcher, record.world_size, record.outcome.status) == ("slurm", 2, "ok")
    assert record.system.job_id == job


# ------------------------------------------------------------------------------------------------------------------
# one job across two Slurm nodes (two slurmd on this host: a real 2-node job to Slurm, one host to the network)

TWO_NODES = ["--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]


def _epoch_losses(path: Path) -> list[float]:
    metrics = read_record(path).metrics
    assert metrics is not None
    return [e.loss for e in metrics.epochs if e.loss is not None]


@pytest.mark.slow
def test_srun_trains_one_ddp_job_across_two_nodes(slurm_two_nodes: SlurmCluster, tmp_path: Path) -> None:
    """``srun --nodes=2 --ntasks-per-node=1``: each node's one task adopts its Slurm rank, both meet at the first
    node's address, and rank 0 writes the one record of a 2-node job; its losses are those of the same run as two
    workers on one node (the same ranks and data shards; only the threads per rank differ)."""
    run = [*RUN[: RUN.index("--epochs") + 1], "2", *RUN[RUN.index("--epochs") + 2 :]]
    proc = slurm_two_nodes.srun(
        *TWO_NODES, *MODULE, *run, "--output-dir", str(tmp_path / "slurm"), cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:] + slurm_two_nodes.logs()
    path = _only(tmp_path / "slurm")
    record = read_record(path)
    assert record.outcome.status == "ok", record.outcome
    assert (record.launcher, record.world_size, record.nodes) == ("slurm", 2, 2)
    assert record.system.scheduler == "slurm" and record.system.job_id
    assert record.metrics is not None
    # both ranks' logs; each "node" is this host, so both name it (Slurm's node names, vm-1/vm-2, are not recorded)
    assert [(r.rank, r.host) for r in record.metrics.ranks] == [
        (0, record.system.host),
        (1, record.system.host),
    ]
    assert [e.samples for e in record.metrics.epochs] == [2 * 3 * 4] * 2
    local = subprocess.run(
        [*MODULE, *run, "--devices", "2", "--output-dir", str(tmp_path / "local")], capture_output=True, text=True,
        env=job_env(), cwd=tmp_path, timeout=300, check=False,
    )  # fmt: skip
    assert local.returncode == 0, local.stderr[-3000:]
    reference = read_record(_only(tmp_path / "local"))
    assert (reference.launcher, reference.world_size, reference.nodes) == ("torchrun", 2, 1)
    assert _epoch_losses(path) == pytest.approx(_epoch_losses(_only(tmp_path / "local")), abs=1e-5)
    assert len(_epoch_losses(path)) == 2


@pytest.mark.slow
def test_srun_measures_collectives_across_two_nodes(slurm_two_nodes: SlurmCluster, tmp_path: Path) -> None:
    comm = ["comm", "--backend", "cpu", "--ops", "all_reduce", "--sizes", "64KiB", "--warmup", "1", "--iters", "3",
            "-q"]  # fmt: skip
    proc = slurm_two_nodes.srun(*TWO_NODES, *MODULE, *comm, "--output-dir", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:] + slurm_two_nodes.logs()
    record = read_comm_record(_only(tmp_path))
    assert record.outcome.status == "ok", record.outcome
    assert (record.launcher, record.world_size, record.nodes) == ("slurm", 2, 2)
    assert [(m.op, m.size_bytes) for m in record.measurements] == [("all_reduce", 64 * 1024)]


def documented_two_node_script() -> str:
    """The batch script docs/workflow.md shows for a job across nodes (``--nodes=2``)."""
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S)
    (script,) = [b for b in blocks if b.startswith("#!/bin/bash") and "--nodes=2 --ntasks-per-node=1" in b]
    return script


@pytest.mark.slow
def test_the_documented_two_node_batch_script_runs_through_sbatch(
    slurm_two_nodes: SlurmCluster, tmp_path: Path
) -> None:
    """The docs' 2-node script as written: one record, of 2 nodes and 2 ranks, under results/slurm-2node."""
    script = tmp_path / "ddp-2node.sbatch"
    script.write_text(documented_two_node_script())
    job = slurm_two_nodes.sbatch(script, cwd=tmp_path)
    state = slurm_two_nodes.wait_for_job(job, timeout=300)
    log = tmp_path / f"accelbench-{job}.out"
    output = log.read_text() if log.exists() else "(no job output)"
    assert state == "COMPLETED", f"{state}\n{output}\n{slurm_two_nodes.logs()}"
    record = read_record(_only(tmp_path / "results" / "slurm-2node"))
    assert (record.launcher, record.world_size, record.nodes, record.outcome.status) == ("slurm", 2, 2, "ok")
    assert record.system.job_id == job
