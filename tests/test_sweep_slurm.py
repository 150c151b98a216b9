"""``sweep --submit slurm``: every point a Slurm job, resumable and idempotent as a local sweep.

The fast tests check the resources (file table, flags, what comes from the point), the batch script and the
refusals. The slow one submits a real 2-point sweep to the one-node Slurm of tests/cluster_support.py, cancels one
job with scancel, and re-runs the sweep: only the missing point is submitted, and a point whose job is queued is
not submitted twice.
"""

from __future__ import annotations

import json
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
from accelbench.sweep.slurm import batch_script, job_name

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


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--time", "10"], r"--time is a Slurm job's option and this sweep runs its points here"),
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


@pytest.mark.slow
def test_a_slurm_sweep_survives_a_cancelled_job_and_resubmits_only_the_missing_point(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    sweep_file(tmp_path)
    # 1. both points submitted; the job of batch size 4 is cancelled while the sweep follows the jobs
    first = subprocess.Popen(
        _sweep(slurm, tmp_path), env=slurm.env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
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
    again = subprocess.run(_sweep(slurm, tmp_path, "--no-wait"), env=slurm.env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "already recorded: 1 ok" in again.stderr
    resubmitted = _submitted(tmp_path)[2:]
    assert [size for size, _ in resubmitted] == [4]
    job = resubmitted[0][1]
    slurm.command("scontrol", "hold", job)

    # 3. a point whose job is in the queue is followed, not submitted twice; released, it completes
    follow = subprocess.Popen(
        _sweep(slurm, tmp_path), env=slurm.env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
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
