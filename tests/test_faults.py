"""Faults and bad input a user meets on a real cluster: each ends in a clear message, and nothing measured is lost.

One test per class of fault, each against the guard at its root: the output folder checked before training, a full
disk that keeps the record elsewhere and prints it, SIGTERM to a multi-process job, hostile result files, a closed
pipe, more CPU workers than cores, a backend whose plugin is not installed.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from core_support import TINY, accelbench

from accelbench.cli import main
from accelbench.config import RunConfig
from accelbench.engine.runner import preflight
from accelbench.exitcodes import ExitCode
from accelbench.plugins import get_host
from accelbench.results import ResultRecord, read_record

QUICK = [*TINY, "--epochs", "2", "--steps-per-epoch", "2"]


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("a-file", "is a file, not a folder"),
        ("/proc/accelbench-results", "files cannot be written there"),
    ],
)
def test_an_output_folder_that_cannot_take_records_is_refused_before_training(
    where: str, message: str, tmp_path: Path, capsys
) -> None:
    target = tmp_path / where if not where.startswith("/") else Path(where)
    if where == "a-file":
        target.write_text("not a folder")
    code = main(["run", *QUICK, "--output-dir", str(target)])
    assert code == ExitCode.REFUSED
    err = " ".join(capsys.readouterr().err.split())
    assert f"--output-dir {target}: {message}" in err
    assert "epoch" not in err  # refused before anything was measured


def test_a_full_disk_prints_the_record_and_keeps_it_elsewhere(tmp_path: Path, monkeypatch, capsys) -> None:
    """The folder's disk fills while the record is written: no partial file, the record on stdout, a copy in the
    fallback folder named in the message, exit 1."""
    out, fallback = tmp_path / "out", tmp_path / "fallback"
    monkeypatch.setenv("ACCELBENCH_FALLBACK_DIR", str(fallback))
    real_fsync = os.fsync

    def fsync(
        fd: int,
    ) -> None:  # the record is fsynced before its rename: a full disk shows there at the latest
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(out)):
            raise OSError(28, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    code = main(["run", *QUICK, "-q", "--output-dir", str(out)])
    captured = capsys.readouterr()
    assert code == ExitCode.ERROR
    printed = ResultRecord.model_validate_json(captured.out)
    assert printed.outcome.status == "ok" and len(printed.metrics.epochs) == 2  # every measurement is there
    kept = list(fallback.iterdir())
    err = " ".join(captured.err.split())
    assert len(kept) == 1 and str(kept[0]) in err and "No space left on device" in err
    assert read_record(kept[0]) == printed
    assert list(out.iterdir()) == []  # nothing half-written where the disk was full


@pytest.mark.slow
def test_sigterm_to_a_two_process_job_keeps_every_ranks_completed_epochs(tmp_path: Path) -> None:
    """A scheduler's time limit sends SIGTERM to every process of the job (launcher and workers): the record says
    interrupted and keeps the epochs every rank completed, gathered from both ranks; no traceback anywhere."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "accelbench.cli", "run", *TINY, "--epochs", "200", "--steps-per-epoch", "3",
         "--strategy", "ddp", "--devices", "2", "--output-dir", str(tmp_path)],
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a batch job's
    )  # fmt: skip
    assert proc.stderr is not None
    lines = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        lines.append(line)
        # batch-log progress lines (the output is a pipe), printed by rank 0 as its epoch ends; rank 1 may still be
        # finishing that epoch's last step when the signal lands, so wait for a 4th to be sure of 3 on both ranks
        if "epoch 4/200 done" in line:
            break
    else:
        proc.kill()
        pytest.fail("no epoch completed in 180 s:\n" + "".join(lines))
    os.killpg(proc.pid, signal.SIGTERM)
    rest = proc.stderr.read()
    assert proc.wait(timeout=120) == ExitCode.INTERRUPTED, rest[-3000:]
    assert "Traceback" not in rest, rest[-3000:]
    record = read_record(next(tmp_path.glob("*.json")))
    assert record.outcome.status == "interrupted"
    assert "SIGTERM" in record.outcome.message and "the epochs every rank completed" in record.outcome.message
    assert [r.rank for r in record.metrics.ranks] == [0, 1]
    assert len(record.metrics.epochs) >= 3 and record.metrics.epochs[0].epoch == 1
    completed = min(len(r.epoch_wall_s) for r in record.metrics.ranks)
    assert len(record.metrics.epochs) == completed
    assert record.metrics.epochs_decision.startswith("ended early after")


def test_hostile_json_is_named_and_skipped_by_compare_and_report(tmp_path: Path, capsys) -> None:
    """100,000 nested arrays among records: named and skipped (the others compared); --strict fails clearly;
    --config refuses it too."""
    good = tmp_path / "records"
    assert main(["run", *QUICK, "-q", "--output-dir", str(good)]) == 0
    (good / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (good / "deep-record.json").write_text(
        '{"schema": "accelbench.result", "schema_version": 2, "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    )
    capsys.readouterr()
    assert main(["compare", str(good), "--format", "json"]) == 0
    captured = capsys.readouterr()
    assert len(json.loads(captured.out)["groups"]) == 1  # the real record is compared
    assert "deep.json: not a result record: its JSON is nested too deeply" in " ".join(captured.err.split())
    assert "deep-record.json: not a result record" in " ".join(captured.err.split())
    assert main(["compare", str(good), "--strict"]) == ExitCode.REFUSED
    assert "nested too deeply" in capsys.readouterr().err
    assert main(["run", "--config", str(good / "deep.json")]) == ExitCode.REFUSED
    assert "not a run configuration: its JSON is nested too deeply" in capsys.readouterr().err
    pytest.importorskip("matplotlib")
    assert main(["report", str(good), "--output", str(tmp_path / "r.html")]) == 0
    assert "deep.json" in capsys.readouterr().err and (tmp_path / "r.html").exists()


def _closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    """Run accelbench writing into a small pipe whose reader leaves after the first bytes (`| head -c 20`)."""
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, 1031, 4096)  # F_SETPIPE_SZ: a pipe smaller than the output
    proc = subprocess.Popen(
        [sys.executable, "-m", "accelbench.cli", *args], stdout=write_end, stderr=subprocess.PIPE, text=True
    )
    os.close(write_end)
    assert os.read(read_end, 20)
    os.close(read_end)
    _, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "", err)


@pytest.mark.parametrize(
    "args", [("schema",), ("sweep", "seed-model-parallel", "--dry-run"), ("run", "--help")]
)
def test_a_closed_pipe_ends_every_command_quietly(args: tuple[str, ...]) -> None:
    proc = _closed_pipe(*args)
    assert proc.stderr == "", proc.stderr  # no traceback, no "Exception ignored"
    assert proc.returncode in (0, 1, ExitCode.CLOSED_PIPE)


def test_more_cpu_workers_than_cores_is_warned_and_more_accelerators_than_detected_refused(
    monkeypatch, tmp_path: Path
) -> None:
    from accelbench.engine import runner

    monkeypatch.setattr(runner, "usable_cores", lambda: 2)
    host = get_host()
    warned = preflight(RunConfig(devices=3, strategy="ddp", output_dir=tmp_path), host)
    assert len(warned.warnings) == 1
    assert "3 worker process(es) x 1 thread(s) on 2 usable core(s): they will contend" in warned.warnings[0]
    assert "use --devices 2 or fewer" in warned.warnings[0]
    assert not preflight(RunConfig(devices=2, strategy="ddp", output_dir=tmp_path), host).warnings
    threads = preflight(RunConfig(devices=2, threads=2, strategy="ddp", output_dir=tmp_path), host)
    assert "2 worker process(es) x 2 thread(s) on 2 usable core(s)" in threads.warnings[0]
    # what fits: fewer processes where one process's threads fit the cores, fewer threads where a thread each does
    for devices, threads_each, advice in (
        (2, 2, "use --devices 1 or fewer, or --threads 1 or fewer for"),
        (1, 4, "use --threads 2 or fewer for"),  # one process is the fewest: --devices 0 is no advice
        (4, 4, "use --devices 2 or fewer with --threads 1 for"),
    ):
        strategy = "ddp" if devices > 1 else "single"
        config = RunConfig(devices=devices, threads=threads_each, strategy=strategy, output_dir=tmp_path)
        assert advice in preflight(config, host).warnings[0], (devices, threads_each)


def test_the_warning_is_printed_before_the_run(tmp_path: Path) -> None:
    proc = accelbench(
        "run", *QUICK, "-q", "--threads", "64", "--no-calibration", "--output-dir", str(tmp_path)
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    said = " ".join(proc.stderr.split())
    assert "warning: 1 worker process(es) x 64 thread(s) on" in said
    assert "use --threads" in said and "--devices" not in said  # one process is already the fewest


def test_a_backend_whose_plugin_is_not_installed_says_how_to_install_it(tmp_path: Path) -> None:
    proc = accelbench(
        "run", "--backend", "cuda", *QUICK, "--output-dir", str(tmp_path),
        env={**os.environ, "ACCELBENCH_PLUGINS": "none"},  # as on a machine with the core alone
    )  # fmt: skip
    assert proc.returncode == ExitCode.REFUSED
    assert "pip install accelbench-cuda" in proc.stderr and "./plugins/cuda" in proc.stderr


def test_every_path_a_command_writes_is_checked_before_the_work(tmp_path: Path, capsys) -> None:
    """report --output / --figures, compare --output and sweep --output-dir that cannot be written are refused
    with the path named, before records are read or points run."""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    cases = [
        (["report", str(tmp_path), "--output", str(a_file / "r.html")], "--output's folder"),
        (["report", str(tmp_path), "--output", str(tmp_path)], "is a folder; give the HTML file's name"),
        (["report", str(tmp_path), "--figures", str(a_file)], f"--figures {a_file}: is a file"),
        (["compare", str(tmp_path), "--output", str(a_file / "c.txt")], "--output's folder"),
        (["sweep", "seed-single", "--scale", "tiny", "--output-dir", str(a_file)], "is a file, not a folder"),
    ]
    for args, message in cases:
        assert main(args) == ExitCode.REFUSED, args
        assert message in " ".join(capsys.readouterr().err.split()), args
