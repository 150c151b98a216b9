"""A whole sweep: every point in order, those already done skipped, each largest-fit search stopped at its first
size that does not fit; and ``--dry-run``, which says what a run would do without running anything.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.text import Text

from accelbench.exitcodes import ExitCode
from accelbench.sweep.display import SweepDisplay, outcome_text
from accelbench.sweep.log import log_attempt
from accelbench.sweep.resume import LargestFit, Recorded, point_done
from accelbench.sweep.spec import Point, Sweep
from accelbench.sweep.supervise import Attempt, SweepInterrupted, run_point


@dataclass
class SweepSummary:
    """How a sweep invocation ended, point by point."""

    done: int = 0  # points with their ok / oom records (including those done before)
    skipped_done: int = 0  # of which already done when the sweep started
    beyond_fit: int = 0  # points not run: larger than the first size that did not fit
    failed: list[tuple[Point, Attempt]] = field(default_factory=list)
    interrupted: bool = False

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return ExitCode.INTERRUPTED
        return ExitCode.ERROR if self.failed else ExitCode.OK


def run_sweep(
    sweep: Sweep,
    output_dir: Path,
    console: Console,
    live: bool = False,
    timeout_s: float | None = None,
) -> SweepSummary:
    """Run every point not yet done, in order; a largest-fit series stops after its first out-of-memory.

    A SIGTERM (a scheduler's time limit) or Ctrl-C lets the current point write its record, then ends the sweep
    with ``summary.interrupted`` set; running the same sweep again resumes.
    """
    recorded = Recorded.scan(output_dir)
    summary = SweepSummary()
    fit = LargestFit()
    display = SweepDisplay(console, len(sweep.points), live)

    def on_sigterm(signum: int, frame: object) -> None:
        raise SweepInterrupted(signum)

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        for point in sweep.points:
            if fit.beyond(point):
                summary.beyond_fit += 1
                display.finish(point, "not run: a smaller size already did not fit", "dim")
                continue
            outcomes = recorded.outcomes(sweep.config(point, output_dir))
            if point_done(outcomes, sweep.repeats):
                summary.done += 1
                summary.skipped_done += 1
                if "oom" in outcomes:
                    fit.did_not_fit(point)
                display.finish(point, "already recorded: " + outcome_text(outcomes), "dim")
                continue
            attempt = _run_repeats(
                sweep, point, output_dir, recorded, display, timeout_s, outcomes.count("ok")
            )
            if attempt.status in ("ok", "oom", "diverged"):
                summary.done += 1
                if attempt.status == "oom":
                    fit.did_not_fit(point)
                # diverged: what the quality checks found (a NaN/inf loss, a gradient norm, a stalled loss)
                text = {"oom": "out of memory", "diverged": "diverged"}.get(attempt.status, "ok")
                why = f": {attempt.message}" if attempt.status == "diverged" and attempt.message else ""
                display.finish(
                    point,
                    f"{text}{why} ({attempt.seconds:.1f} s)",
                    "green" if text == "ok" else "yellow",
                    attempt.seconds,
                )
            else:
                summary.failed.append((point, attempt))
                # a crash is most likely the host's out-of-memory killer: larger sizes would crash too
                if attempt.status == "crashed":
                    fit.did_not_fit(point)
                reason = f": {attempt.message}" if attempt.message else ""
                display.finish(point, f"{attempt.status}{reason}", "red", attempt.seconds)
    except (KeyboardInterrupt, SweepInterrupted):
        summary.interrupted = True
    finally:
        signal.signal(signal.SIGTERM, previous)
        display.close()
    return summary


def _run_repeats(
    sweep: Sweep,
    point: Point,
    output_dir: Path,
    recorded: Recorded,
    display: SweepDisplay,
    timeout_s: float | None,
    ok_before: int,
) -> Attempt:
    """The runs a point still needs (``repeats`` less its ``ok`` records), each logged; the first that is not
    ``ok`` ends them. Returns the last attempt."""
    runs = sweep.repeats - ok_before
    attempt = None
    for run in range(1, runs + 1):
        display.current(point, run, runs)
        attempt = run_point(sweep, point, output_dir, recorded, timeout_s)
        log_attempt(output_dir, sweep, point, attempt)
        if attempt.status != "ok":
            break
    assert attempt is not None  # a point not done needs at least one run
    return attempt


def dry_run(sweep: Sweep, output_dir: Path, out: Console) -> None:
    """List every point as the `accelbench run` command a user would type, with what a sweep would do with it
    (run it, or skip it as done or beyond the largest size that fits), from the records in ``output_dir``."""
    recorded = Recorded.scan(output_dir)
    fit = LargestFit()
    for i, point in enumerate(sweep.points, 1):
        outcomes = recorded.outcomes(sweep.config(point, output_dir))
        if fit.beyond(point):
            state = "skip (beyond the largest size that fits)"
        elif point_done(outcomes, sweep.repeats):
            state = "done (" + outcome_text(outcomes) + ")"
            if "oom" in outcomes:
                fit.did_not_fit(point)
        else:
            state = "to run" + (f" (recorded: {outcome_text(outcomes)})" if outcomes else "")
        out.print(
            Text(f"{i:>4}  {state:<28}  accelbench {' '.join(sweep.argv(point, output_dir))}"), soft_wrap=True
        )
