"""``sweep --submit slurm``: the points as job arrays (or a job each), resumable and idempotent as a local sweep.

The fast tests check the resources (file table, flags, what comes from the point), the batch script, the array's
script and points file, which points share an array, how squeue's array tasks map back to points and how
MaxArraySize is read (stand-in commands printing what Slurm prints), and the refusals. The slow ones use the
one-node Slurm of tests/cluster_support.py: a 3-point sweep goes as one array and every point is recorded; an array
task cancelled with ``scancel JOBID_TASK`` is resubmitted alone, and followed, not submitted twice, while it is
queued; and the same cancel-and-resubmit with ``--no-slurm-array`` (a job per point).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from cluster_support import SlurmCluster

from accelbench.cli import main
from accelbench.errors import ConfigError
from accelbench.results import read_record
from accelbench.sweep import SWEEP_LOG, load_sweep
from accelbench.sweep.resources import SlurmResources, check_resources
from accelbench.sweep.slurm import (
    Due,
    QueueReader,
    array_groups,
    array_name,
    array_script,
    batch_script,
    job_name,
    max_array_size,
    points_file,
    sweep_prefix,
)

TWO_POINTS = """
description = "two tiny points"
[run]
backend = "cpu"
model = "gpt-nano"
epochs = 1
steps_per_epoch = 2
[[grid]]
batch_size = [2, 4]
"""


def sweep_file(folder: Path, body: str = TWO_POINTS) -> Path:
    path = folder / "two.toml"
    path.write_text(textwrap.dedent(body))
    return path


# ------------------------------------------------------------------------------------------------------------------
# resources and the batch script


def test_resources_come_from_the_point_unless_the_table_or_a_flag_says() -> None:
    point = {"devices": 4, "nnodes": 2, "backend": "cuda"}
    derived = SlurmResources().for_point(point)
    assert (derived.nodes, derived.ntasks_per_node, derived.gpus_per_node) == (2, 4, 4)
    assert SlurmResources().for_point({"backend": "cpu"}).directives() == ["--nodes=1", "--ntasks-per-node=1"]
    table = check_resources({"time": "00:30:00", "gpus_per_node": 8, "sbatch_args": ["--exclusive"]}, "t")
    flags = check_resources({"time": "5", "partition": "gpu"}, "flags")
    merged = table.merged(flags).for_point(point)
    assert merged.directives() == [
        "--nodes=2", "--ntasks-per-node=4", "--gpus-per-node=8", "--time=5", "--partition=gpu", "--exclusive",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ({"nodes": 0}, r"nodes = 0; give a whole number of at least 1"),
        ({"time": "an hour"}, r"time = 'an hour'; give a Slurm time limit such as 30"),
        ({"partition": "gpu; rm"}, r"partition = 'gpu; rm'; give a partition name"),
        ({"sbatch_args": "--exclusive"}, r"give a list of sbatch options"),
        ({"sbatch_args": ["exclusive"]}, r"each is one sbatch option starting with '-'"),
        ({"gpu": 1}, r"unknown key 'gpu'; allowed: nodes, ntasks_per_node, gpus_per_node"),
    ],
)
def test_bad_resources_are_refused_naming_the_key(raw: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        check_resources(raw, "two.toml [slurm] table")


def test_a_sweep_files_slurm_table_is_checked_when_the_file_is_read(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"two.toml \[slurm\] table: time = '2h'"):
        load_sweep(sweep_file(tmp_path, TWO_POINTS + '[slurm]\ntime = "2h"\n'), output_dir=tmp_path / "out")


def test_the_batch_script_runs_each_repeat_under_srun_with_the_points_resources(tmp_path: Path) -> None:
    sweep = load_sweep(sweep_file(tmp_path, TWO_POINTS + '[slurm]\ntime = "00:10:00"\n'), output_dir=tmp_path)
    point = sweep.points[1]
    name = job_name(sweep, point, tmp_path)
    script = batch_script(sweep, point, tmp_path, name, runs=2)
    assert f"#SBATCH --job-name={name}" in script
    assert "#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=1\n#SBATCH --time=00:10:00\n" in script
    assert "for run in $(seq 2); do" in script
    assert f"srun --kill-on-bad-exit=1 {sys.executable} -m accelbench.cli run --config " in script
    assert "--gpus-per-node" not in script  # a CPU point asks for no GPU
    config = json.loads(next((tmp_path / ".accelbench-points").glob("*.json")).read_text())
    assert config["batch_size"] == 4
    # the name is the same in every process (no salted hash) and differs by point and by output folder
    assert name == job_name(sweep, point, tmp_path) != job_name(sweep, sweep.points[0], tmp_path)
    assert name != job_name(sweep, point, tmp_path / "elsewhere")


FOUR_POINTS = TWO_POINTS + "devices = [1, 2]\n"  # batch_size 2, 4 x devices 1, 2: two layouts


def test_points_needing_the_same_resources_share_an_array_and_others_get_their_own(tmp_path: Path) -> None:
    sweep = load_sweep(sweep_file(tmp_path, FOUR_POINTS), output_dir=tmp_path)
    due = [Due(p, job_name(sweep, p, tmp_path), 1) for p in sweep.points]
    groups = array_groups(sweep, due, max_tasks=1001)
    layouts = [[(d.point.values["devices"], d.point.values["batch_size"]) for d in g] for g in groups]
    # --ntasks-per-node 1 and 2: two arrays, each in sweep order
    assert layouts == [[(1, 2), (1, 4)], [(2, 2), (2, 4)]]
    # a fixed --ntasks-per-node makes every point ask the same: one array, cut at the cluster's MaxArraySize
    sweep.slurm = check_resources({"ntasks_per_node": 2}, "--ntasks-per-node")
    assert [len(g) for g in array_groups(sweep, due, max_tasks=1001)] == [4]
    assert [len(g) for g in array_groups(sweep, due, max_tasks=3)] == [3, 1]


def test_an_arrays_script_runs_the_point_on_its_tasks_line_of_the_points_file(tmp_path: Path) -> None:
    sweep = load_sweep(sweep_file(tmp_path, TWO_POINTS + '[slurm]\ntime = "00:10:00"\n'), output_dir=tmp_path)
    group = [Due(p, job_name(sweep, p, tmp_path), runs) for p, runs in zip(sweep.points, (3, 1), strict=True)]
    name = array_name(sweep, [d.key for d in group])
    script = array_script(sweep, group, tmp_path, name, max_concurrent=4)
    assert f"#SBATCH --job-name={name}\n" in script and name.startswith("ab-two-array-")
    assert f"#SBATCH --output={tmp_path.resolve()}/.accelbench-slurm/{name}-%A_%a.out\n" in script
    assert (
        "#SBATCH --array=0-1%4\n#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=1\n#SBATCH --time=00:10:00\n"
        in script
    )
    assert '"$((SLURM_ARRAY_TASK_ID + 1))p"' in script and 'for run in $(seq "$runs"); do' in script
    assert (
        f'srun --kill-on-bad-exit=1 {sys.executable} -m accelbench.cli run --config "$config" --quiet'
        in script
    )
    assert "%" not in array_script(sweep, group, tmp_path, name).split("--array=")[1].splitlines()[0]
    lines = [line.split("\t") for line in points_file(sweep, group, tmp_path).splitlines()]
    assert [(key, runs, label) for key, runs, _, label in lines] == [
        (group[0].key, "3", "batch_size=2"), (group[1].key, "1", "batch_size=4"),
    ]  # fmt: skip
    assert [json.loads(Path(config).read_text())["batch_size"] for _, _, config, _ in lines] == [2, 4]
    # the name hashes the set of points: the same in every process, another for a subset (a resubmission)
    assert name == array_name(sweep, [d.key for d in reversed(group)]) != array_name(sweep, [group[1].key])


def test_the_array_script_runs_a_points_line_in_bash(tmp_path: Path) -> None:
    """The script's own lines pick each task's point: run with ``srun`` replaced by ``echo``."""
    sweep = load_sweep(sweep_file(tmp_path), output_dir=tmp_path / "my out")
    out = tmp_path / "my out"
    group = [Due(p, job_name(sweep, p, out), runs) for p, runs in zip(sweep.points, (2, 1), strict=True)]
    name = array_name(sweep, [d.key for d in group])
    (out / ".accelbench-slurm").mkdir(parents=True)
    (out / ".accelbench-slurm" / f"{name}.points").write_text(points_file(sweep, group, out))
    script = tmp_path / "task.sh"
    script.write_text(array_script(sweep, group, out, name).replace("srun --kill-on-bad-exit=1", "echo"))
    runs = []
    for task in ("0", "1", "2"):
        env = {"PATH": "/usr/bin:/bin", "SLURM_ARRAY_TASK_ID": task}
        done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, check=False)
        srun_lines = [line for line in done.stdout.splitlines() if " run --config " in line]
        runs.append((done.returncode, srun_lines))
    assert [len(lines) for _, lines in runs[:2]] == [2, 1] and runs[0][0] == runs[1][0] == 0
    config = runs[1][1][0].split(" --config ")[1].removesuffix(" --quiet")
    assert json.loads(Path(config).read_text())["batch_size"] == 4  # a folder with a space in its path
    assert runs[2] == (2, [])  # a task beyond the points file: refused, nothing run


def _stand_in(folder: Path, command: str, output: str) -> None:
    """A Slurm command on PATH that prints what the real one would (for the parsing; the slow tests use Slurm)."""
    path = folder / command
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}EOF\n")
    path.chmod(0o755)


def test_the_queue_maps_each_array_task_to_its_point_through_the_points_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    sweep = load_sweep(sweep_file(tmp_path, FOUR_POINTS), output_dir=out)
    keys = [job_name(sweep, p, out) for p in sweep.points]
    group = [Due(p, key, 1) for p, key in zip(sweep.points[:2], keys[:2], strict=True)]
    name = array_name(sweep, [d.key for d in group])
    (out / ".accelbench-slurm").mkdir(parents=True)
    (out / ".accelbench-slurm" / f"{name}.points").write_text(points_file(sweep, group, out))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _stand_in(bin_dir, "squeue", (
        f"7_1|{name}|RUNNING\n7_0|{name}|PENDING\n"  # squeue -r: every task on its own line
        f"9|{keys[3]}|PENDING\n"  # a job of one point (--no-slurm-array)
        "8_0|ab-two-array-0123456789ab|PENDING\n"  # an array of another output folder: no points file here
        "5|someone-elses-job|RUNNING\n"
    ))  # fmt: skip
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    queue = QueueReader(sweep_prefix(sweep), out).read()
    assert {k: (j.job_id, j.state, j.name) for k, j in queue.items()} == {
        keys[0]: ("7_0", "PENDING", name), keys[1]: ("7_1", "RUNNING", name), keys[3]: ("9", "PENDING", keys[3]),
    }  # fmt: skip


def test_a_cluster_without_arrays_is_refused_naming_no_slurm_array(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _stand_in(tmp_path, "scontrol", "MaxArraySize            = 0\nMaxJobCount             = 10000\n")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(ConfigError, match=r"job arrays off \(MaxArraySize = 0\); add --no-slurm-array"):
        max_array_size()
    _stand_in(tmp_path, "scontrol", "MaxArraySize            = 40001\n")
    assert max_array_size() == 40001


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--time", "10"], r"--time is a Slurm job's option and this sweep runs its points here"),
        (["--max-concurrent", "2"], r"--max-concurrent is a Slurm job's option"),
        (["--no-slurm-array"], r"--no-slurm-array is a Slurm job's option"),
        (
            ["--submit", "slurm", "--max-concurrent", "0"],
            r"--max-concurrent 0: give how many of an array's tasks",
        ),
        (["--submit", "slurm", "--no-slurm-array", "--max-concurrent", "2"], r"leave one of them out"),
        (["--submit", "slurm", "--time", "ten"], r"--time: time = 'ten'; give a Slurm time limit"),
        (["--submit", "slurm", "--point-timeout", "60"], r"a Slurm job's limit is --time"),
        (["--submit", "slurm", "--poll-interval", "0"], r"--poll-interval 0.0: give seconds between 0.1"),
        (["--submit", "slurm", "--sbatch-arg", "exclusive"], r"--sbatch-arg: sbatch_args item 'exclusive'"),
    ],
)
def test_slurm_flags_are_refused_before_anything_is_submitted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], match: str
) -> None:
    code = main(["sweep", str(sweep_file(tmp_path)), "--output-dir", str(tmp_path / "out"), *args])
    assert code == 2
    assert re.search(match, capsys.readouterr().err)
    assert not (tmp_path / "out" / ".accelbench-slurm").exists()


# ------------------------------------------------------------------------------------------------------------------
# a real Slurm


def _sweep(slurm: SlurmCluster, folder: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "accelbench.cli", "sweep", str(folder / "two.toml"), "--output-dir",
            str(folder / "out"), "--submit", "slurm", "--poll-interval", "0.5", *extra]  # fmt: skip


def _log(folder: Path) -> list[dict[str, Any]]:
    path = folder / "out" / SWEEP_LOG
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _submitted(folder: Path) -> list[tuple[int, str]]:
    return [
        (e["point"]["batch_size"], str(e["slurm_job"])) for e in _log(folder) if e["status"] == "submitted"
    ]


def _ok_batch_sizes(folder: Path) -> list[int]:
    records = [read_record(p) for p in sorted((folder / "out").glob("*.json"))]
    return sorted(r.config.batch_size for r in records if r.outcome.status == "ok")


THREE_POINTS = TWO_POINTS.replace("[2, 4]", "[2, 4, 8]")


def _array_output(folder: Path, job: str) -> str:
    """The output of array task ``job`` (``JOBID_TASK``), as its script's ``%A_%a`` pattern names it."""
    return next((folder / "out" / ".accelbench-slurm").glob(f"ab-two-array-*-{job}.out")).read_text()


@pytest.mark.slow
def test_a_slurm_sweep_goes_as_one_job_array_and_records_every_point(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    sweep_file(tmp_path, THREE_POINTS)
    done = subprocess.run(_sweep(slurm, tmp_path, "--max-concurrent", "2"), env=slurm.env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr + slurm.logs()
    submitted = _submitted(tmp_path)
    array = submitted[0][1].split("_")[0]
    assert submitted == [(2, f"{array}_0"), (4, f"{array}_1"), (8, f"{array}_2")]  # one sbatch, a task each
    assert f"submitted 3 point(s) as array job {array}, at most 2 at once" in done.stderr
    assert "3 of 3 points done" in done.stderr
    assert _ok_batch_sizes(tmp_path) == [2, 4, 8]
    scripts = list((tmp_path / "out" / ".accelbench-slurm").glob("*.sbatch"))
    assert len(scripts) == 1 and "#SBATCH --array=0-2%2\n" in scripts[0].read_text()
    for task, size in enumerate((2, 4, 8)):
        output = _array_output(tmp_path, f"{array}_{task}")
        assert f"array task {task} runs batch_size={size} (1 run(s)," in output


@pytest.mark.slow
def test_a_cancelled_array_task_is_resubmitted_alone_and_followed_while_queued(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    sweep_file(tmp_path, THREE_POINTS)
    # 1. the array is submitted held; its task of batch size 8 is cancelled, then the others are released
    first = subprocess.Popen(
        _sweep(slurm, tmp_path, "--sbatch-arg=--hold", "--max-concurrent", "1"), env=slurm.env, cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while len(_submitted(tmp_path)) < 3 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    jobs = dict(_submitted(tmp_path))
    assert set(jobs) == {2, 4, 8}, first.communicate(timeout=60)
    array = jobs[2].split("_")[0]
    assert jobs[8] == f"{array}_2"
    assert slurm.command("scancel", jobs[8]).returncode == 0
    assert slurm.command("scontrol", "release", array).returncode == 0
    _, err = first.communicate(timeout=300)
    assert first.returncode == 1, err + slurm.logs()
    assert f"Slurm job {jobs[8]} ended CANCELLED without its record" in err
    assert "2 of 3 points done" in err
    assert _ok_batch_sizes(tmp_path) == [2, 4]

    # 2. re-run without waiting: only the cancelled point is submitted, as an array of one task (held)
    again = subprocess.run(_sweep(slurm, tmp_path, "--no-wait", "--sbatch-arg=--hold"), env=slurm.env,
                           cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert again.returncode == 0, again.stderr
    resubmitted = _submitted(tmp_path)[3:]
    assert [size for size, _ in resubmitted] == [8]
    task = resubmitted[0][1]
    second = task.split("_")[0]
    assert task == f"{second}_0" and second != array

    # 3. a sweep re-run from another shell finds the point queued through the array's points file; released,
    # the task completes and the sweep ends with every point recorded
    follow = subprocess.Popen(
        _sweep(slurm, tmp_path), env=slurm.env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not any(e["status"] == "queued" for e in _log(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert slurm.command("scontrol", "release", second).returncode == 0
    _, err = follow.communicate(timeout=300)
    assert follow.returncode == 0, err + slurm.logs()
    assert f"already in the queue as job {task}" in err
    assert len(_submitted(tmp_path)) == 4  # 3 at first, then only the cancelled point
    assert "3 of 3 points done (2 already recorded)" in err
    assert _ok_batch_sizes(tmp_path) == [2, 4, 8]
    assert "array task 0 runs batch_size=8" in _array_output(tmp_path, task)


@pytest.mark.slow
def test_a_slurm_sweep_survives_a_cancelled_job_and_resubmits_only_the_missing_point(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """The same with ``--no-slurm-array``: a job per point, found in the queue by its name."""
    sweep_file(tmp_path)
    # 1. both points submitted; the job of batch size 4 is cancelled while the sweep follows the jobs
    first = subprocess.Popen(
        _sweep(slurm, tmp_path, "--no-slurm-array"), env=slurm.env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while len(_submitted(tmp_path)) < 2 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    jobs = dict(_submitted(tmp_path))
    assert set(jobs) == {2, 4}, first.communicate(timeout=60)
    assert slurm.command("scancel", jobs[4]).returncode == 0
    _, err = first.communicate(timeout=300)
    assert first.returncode == 1, err + slurm.logs()
    assert f"Slurm job {jobs[4]} ended CANCELLED without its record" in err
    assert "1 of 2 points done" in err and "re-run the same command to retry them" in err
    assert _ok_batch_sizes(tmp_path) == [2]

    # 2. re-run without waiting: only the missing point is submitted; held, it stays in the queue
    again = subprocess.run(_sweep(slurm, tmp_path, "--no-wait", "--no-slurm-array"), env=slurm.env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "already recorded: 1 ok" in again.stderr
    resubmitted = _submitted(tmp_path)[2:]
    assert [size for size, _ in resubmitted] == [4]
    job = resubmitted[0][1]
    slurm.command("scontrol", "hold", job)

    # 3. a point whose job is in the queue is followed, not submitted twice; released, it completes
    follow = subprocess.Popen(
        _sweep(slurm, tmp_path, "--no-slurm-array"), env=slurm.env, cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not any(e["status"] == "queued" for e in _log(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.1)
    slurm.command("scontrol", "release", job)
    _, err = follow.communicate(timeout=300)
    assert follow.returncode == 0, err + slurm.logs()
    assert f"already in the queue as job {job}" in err
    assert len(_submitted(tmp_path)) == 3  # 2 at first, then only the cancelled point
    assert "2 of 2 points done (1 already recorded)" in err
    assert _ok_batch_sizes(tmp_path) == [2, 4]
    record = read_record(
        next(p for p in (tmp_path / "out").glob("*.json") if read_record(p).config.batch_size == 4)
    )
    assert (record.launcher, record.system.job_id) == ("slurm", job)
