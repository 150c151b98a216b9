"""`accelbench comm` fed the odd and the hostile: message sizes at and past what memory holds, counts no benchmark
needs, jobs the host cannot run, a launcher's environment that contradicts the flags, and SIGTERM while measuring.
A refusal comes before any rank starts (exit 2, nothing written); a job stopped by a signal keeps what it measured.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import psutil
import pytest

from accelbench.cli import main
from accelbench.comm.collectives import OPS, size_label
from accelbench.comm.options import (
    MAX_ITERS,
    MAX_MESSAGE_BYTES,
    buffer_bytes,
    check_sizes_fit,
    largest_case,
    largest_size_that_fits,
    parse_size,
    size_series,
)
from accelbench.comm.records import CommConfig
from accelbench.errors import ConfigError


def refused(args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    out = tmp_path / "out"
    code = main(["comm", "--backend", "cpu", *args, "--output-dir", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    assert not list(tmp_path.rglob("*.json"))  # refused before anything ran: nothing written
    return " ".join(err.split())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # the case: a message no memory holds is refused, naming the largest that fits
        (["--max-bytes", "99999999999999"], "--max-bytes: a 64 TiB message needs 128.0 TiB per rank"),
        (["--max-bytes", "99999999999999"], "the largest message that fits is"),
        (["--sizes", "8,64TiB"], "--sizes: a 64 TiB message needs"),
        (["--max-bytes", "9" * 400], "larger than any message a device or host can hold"),
        (["--min-bytes", "2PiB"], "--min-bytes '2PiB': not a size"),
        (["--sizes", "1.5"], "a message is a whole number of bytes, at least 1"),
        (["--factor", "1.0000000001"], "--factor 1.0000000001 from 8 B to 128 MiB makes more than 200 sizes"),
        (["--factor", "nan"], "--factor nan: sizes grow by it, so it must be a number above 1"),
        (["--factor", "inf"], "--factor inf: sizes grow by it, so it must be a number above 1"),
        (["--iters", "0"], "--iters 0: at least 1 timed iteration per size, and at most 100000"),
        (
            ["--iters", str(MAX_ITERS + 1)],
            "--iters 100001: at least 1 timed iteration per size, and at most 100000",
        ),
        (["--warmup", "-1"], "--warmup -1: 0 or more untimed iterations per size, and at most 100000"),
        (["--warmup", "9" * 20], "untimed iterations per size, and at most 100000"),
        (["--devices", "100000"], "--devices 100000 = 100000 processes on"),
        (["--threads", "100000"], "--devices 2 x --threads 100000 = 200000 threads on"),
        (["--collective-timeout", "inf"], "--collective-timeout: Input should be a finite number"),
        (
            ["--collective-timeout", "1e300"],
            "--collective-timeout: Input should be less than or equal to 1000000000",
        ),
    ],
)
def test_sizes_and_counts_past_their_bounds_are_refused_before_any_rank_starts(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    devices = [] if "--devices" in args else ["--devices", "2"]
    started = time.monotonic()
    assert message in refused([*devices, *args], tmp_path, capsys)
    assert time.monotonic() - started < 10  # a factor near 1 no longer steps through millions of sizes


def _available(monkeypatch: pytest.MonkeyPatch, available: int) -> None:
    monkeypatch.setattr(psutil, "virtual_memory", lambda: types.SimpleNamespace(available=available))


def test_a_size_that_fits_the_host_today_and_not_one_byte_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With 1 GiB available, 2 ranks each get (0.8 GiB - 2 x 256 MiB for the processes) / 2 = 153.6 MiB: every
    collective's buffers (all_to_all's send and receive, out of place) and the scratch of filling and checking them
    must fit, and the refusal names the largest size that does."""
    _available(monkeypatch, 2**30)
    room = (int(2**30 * 0.8) - 2 * 256 * 2**20) // 2
    config = CommConfig(ops=list(OPS), dtypes=["fp32"], sizes=[8, 2**30], warmup=0, iters=1, check=True,  # type: ignore[arg-type]
                        devices=2, nnodes=1, collective_timeout=60.0)  # fmt: skip
    fits = largest_size_that_fits(config, 2, room, 2**30)
    assert largest_case(config, fits, 2)[0] <= room < largest_case(config, fits + 1, 2)[0]
    err = refused(["--devices", "2", "--sizes", f"8,{fits + 1}"], tmp_path, capsys)
    assert "fp32 out-of-place: its buffers and the scratch of filling and checking them" in err
    assert "shared by its 2 rank(s), has 153.6 MiB for each" in err
    assert f"the largest message that fits is {size_label(fits)}: give --sizes 16MiB (or less)" in err
    # at the bound: the same check passes the size that fits (the job itself is not started here)
    check_sizes_fit(config.model_copy(update={"sizes": [8, fits]}), 2, room, "here", "--sizes")
    with pytest.raises(ConfigError, match="not even the smallest size asked for"):
        check_sizes_fit(config.model_copy(update={"sizes": [fits + 1]}), 2, room, "here", "--sizes")


def test_buffer_bytes_count_every_buffer_a_collective_allocates() -> None:
    count, ranks = 1024, 4  # 4 KiB of fp32; a sharded collective's part is 1/4 of it
    scratch = 24 * count
    assert buffer_bytes("all_reduce", "in-place", "fp32", count, ranks) == 4 * count + scratch
    assert buffer_bytes("all_to_all", "out-of-place", "fp32", count, ranks) == 8 * count + scratch
    assert buffer_bytes("sendrecv", "out-of-place", "bf16", count, ranks) == 4 * count + scratch
    assert (
        buffer_bytes("all_gather", "out-of-place", "fp32", count, ranks) == 4 * (count + count // 4) + scratch
    )
    assert buffer_bytes("reduce_scatter", "in-place", "fp32", count, ranks) == 4 * count + scratch


def test_sizes_as_text_at_and_past_their_bounds() -> None:
    assert parse_size("1024TiB") == MAX_MESSAGE_BYTES
    with pytest.raises(ConfigError, match="larger than any message"):
        parse_size("1025TiB")
    assert size_series(1, 2, 1.00001) == [
        1
    ]  # many steps round to the same byte: skipped at once, not stepped
    assert size_series(8, 8, 2) == [8]
    assert len(size_series(8, 128 * 2**20, 1.1)) < 200


def test_a_launcher_environment_that_contradicts_the_flags_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert "--devices 2, but torchrun started 1 process(es) on this node" in refused(
        ["--devices", "2"], tmp_path, capsys
    )
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert "rank 5 is outside 0..1" in refused(["--devices", "2"], tmp_path, capsys)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "two")
    assert "launcher variable WORLD_SIZE='two' is not an integer" in refused([], tmp_path, capsys)


@pytest.mark.slow
def test_sigterm_while_measuring_keeps_the_sizes_measured(tmp_path: Path) -> None:
    """A scheduler's SIGTERM to the command the user started, while rank 0 measures: the record holds every size
    completed on every rank, says it was interrupted, and the exit status is 130."""
    out = tmp_path / "out"
    sizes = ",".join(f"{2**k}" for k in range(6, 25, 2))  # 64 B .. 16 MiB: seconds of work at 2000 iterations
    proc = subprocess.Popen(
        [sys.executable, "-m", "accelbench.cli", "comm", "--devices", "2", "--ops", "all_reduce", "--sizes", sizes,
         "--iters", "2000", "--warmup", "1", "--output-dir", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # the first measured row: the job is measuring
            if line.strip().startswith("64 "):
                break
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    (path,) = out.glob("*.json")
    record = json.loads(path.read_text())
    assert record["outcome"]["status"] == "interrupted" and "they are kept" in record["outcome"]["message"]
    measured = [m for m in record["measurements"] if m["status"] == "ok"]
    assert measured and measured[0]["size_bytes"] == 64 and len(measured) < 10
    assert not [p for p in out.iterdir() if p.name.startswith(".tmp-")]  # no half-written file beside it
