"""One point in a child process: starting it, stopping it at a timeout, forwarding an interrupt, and finding the
record it wrote.

A point runs as ``accelbench run --config POINT.json --quiet`` in its own process and session, from the
configuration the sweep validated (:meth:`~accelbench.sweep.spec.Sweep.write_point`): a crash, an out-of-memory or
a hard kill ends that child, never the sweep, and a terminal's Ctrl-C reaches only the sweep, which forwards it
once so the child can write an ``interrupted`` record with its completed epochs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from accelbench.config import RunConfig
from accelbench.exitcodes import ExitCode
from accelbench.sweep.resume import Recorded, same_point
from accelbench.sweep.spec import Point, Sweep

INTERRUPT_GRACE_S = 60.0  # how long an interrupted point may take to write its record before it is killed


class SweepInterrupted(BaseException):  # noqa: N818 - an interruption, like KeyboardInterrupt
    """SIGTERM to the sweep (a scheduler's time limit): finish the current point's record, then stop."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@dataclass
class Attempt:
    """One run of one point: how it ended and where its record is (None: no record was written)."""

    status: str  # ok, oom, error, interrupted, diverged (from the record); refused, crashed, timeout, failed (no record)
    exit_code: int
    seconds: float
    record: Path | None = None
    message: str = ""


def child_command(argv: Sequence[str], memory_cap: int | None) -> list[str]:
    """The command that runs one point. With a memory cap, the address-space limit is set in the child itself
    (not through preexec_fn, which is unsafe while the progress display's thread runs); a CPU run that hits it
    fails its allocation and is recorded as out of memory. GPU runtimes reserve large address ranges, so a cap
    is for CPU runs."""
    if memory_cap is None:
        return [sys.executable, "-m", "accelbench.cli", *argv]
    code = (
        "import resource, sys; "
        f"resource.setrlimit(resource.RLIMIT_AS, ({memory_cap}, {memory_cap})); "
        "from accelbench.cli import main; sys.exit(main())"
    )
    return [sys.executable, "-c", code, *argv]


def run_point(
    sweep: Sweep,
    point: Point,
    output_dir: Path,
    recorded: Recorded,
    timeout_s: float | None = None,
) -> Attempt:
    """Run one point in a child process and find the record it wrote.

    A SIGINT (KeyboardInterrupt) or SIGTERM (:class:`SweepInterrupted`) to the sweep is forwarded once to the
    child, which writes an ``interrupted`` record with its completed epochs; the exception is then re-raised.
    """
    config = sweep.config(point, output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    before = set(output_dir.glob("*.json"))
    start = time.monotonic()
    argv = ["run", "--config", str(sweep.write_point(point, output_dir)), "--quiet"]
    proc = subprocess.Popen(
        child_command(argv, sweep.memory_cap),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a terminal's Ctrl-C reaches the sweep only; it forwards one signal
    )
    timed_out = False
    try:
        _, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        proc.send_signal(signal.SIGTERM)  # the child writes an interrupted record
        stderr = _finish(proc)
    except KeyboardInterrupt:
        _acknowledge("Ctrl-C")
        proc.send_signal(signal.SIGINT)
        _finish(proc)
        _collect(recorded, before, output_dir, config)
        raise
    except SweepInterrupted as exc:
        _acknowledge(signal.Signals(exc.signum).name)
        proc.send_signal(exc.signum)
        _finish(proc)
        _collect(recorded, before, output_dir, config)
        raise
    seconds = time.monotonic() - start
    found = _collect(recorded, before, output_dir, config)
    return _attempt(proc.returncode, stderr, seconds, found, timed_out, timeout_s)


def _attempt(
    code: int,
    stderr: str,
    seconds: float,
    found: tuple[Path, str] | None,
    timed_out: bool,
    timeout_s: float | None,
) -> Attempt:
    """How a finished child ended: its record's outcome if it wrote one, else what its exit says."""
    if found is not None and not (timed_out and found[1] == "interrupted"):
        # it ended by itself (perhaps just as time ran out); a diverged run says what its numerics checks found
        why = _diverged_cause(found[0]) if found[1] == "diverged" else ""
        return Attempt(found[1], code, seconds, found[0], why)
    if timed_out:
        kept = (
            "its completed epochs are in an interrupted record"
            if found
            else "no record (training had not begun)"
        )
        return Attempt(
            "timeout", code, seconds, found[0] if found else None, f"stopped at {timeout_s:g} s; {kept}"
        )
    if code == ExitCode.REFUSED:
        return Attempt("refused", code, seconds, message=_last_lines(stderr, 2).removeprefix("error: "))
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (on Linux, SIGKILL is often the kernel's out-of-memory killer)" if name == "SIGKILL" else ""
        return Attempt("crashed", code, seconds, message=f"killed by {name}{hint}; no record")
    return Attempt("failed", code, seconds, message=f"exit code {code} and no record: {_last_lines(stderr)}")


def _diverged_cause(path: Path) -> str:
    """What the quality checks found in the diverged run recorded at ``path`` (a NaN/inf loss and its step, the
    gradient norm over the limit, a loss stalled for K epochs), as its record says it."""
    from accelbench.errors import ResultFileError
    from accelbench.results import diverged_cause, read_record

    try:
        record = read_record(path)
    except ResultFileError:
        return ""
    said = (record.quality.problem if record.quality else None) or record.outcome.message or ""
    return diverged_cause(said)


def _acknowledge(what: str) -> None:
    """Say at once that the interrupt was heard and what happens now (the point may take seconds to stop)."""
    print(f"\n{what}: stopping; the running point keeps its completed epochs in an interrupted record (again: stop at "
          "once)", file=sys.stderr, flush=True)  # fmt: skip


def _finish(proc: subprocess.Popen[str]) -> str:
    """Wait for an interrupted child to write its record; kill it (and its workers) after the grace period, or at
    once on a second Ctrl-C (the sweep's finished points stay recorded; this point's record may then be missing)."""
    try:
        _, stderr = proc.communicate(timeout=INTERRUPT_GRACE_S)
    except (subprocess.TimeoutExpired, KeyboardInterrupt) as exc:
        os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate()
        if isinstance(exc, KeyboardInterrupt):
            print("stopped at once: the running point was killed (no record of it); the finished points are kept",
                  file=sys.stderr, flush=True)  # fmt: skip
    return stderr or ""


def _collect(
    recorded: Recorded, before: set[Path], output_dir: Path, config: RunConfig
) -> tuple[Path, str] | None:
    """Add the records a point wrote to ``recorded``; return the one that is this point's run."""
    mine = None
    for path in sorted(set(output_dir.glob("*.json")) - before):
        status = recorded.add_file(path)
        if status is not None and same_point(config, recorded.entries[-1][0]):
            mine = (path, status)
    return mine


def _last_lines(text: str, n: int = 3) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " ".join(lines[-n:])[:1000]
