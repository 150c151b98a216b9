"""A sweep on a terminal: what it is about to run, progress point by point, and how it ended.

Progress goes to stderr (a live bar on a terminal, one line per point otherwise), so stdout stays free for what a
script reads (``--dry-run``'s listing).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import Progress
from rich.text import Text

from accelbench.config import MIN_STEADY_EPOCHS
from accelbench.display import fmt_duration, progress_bar
from accelbench.sweep.log import SWEEP_LOG
from accelbench.sweep.spec import Point, Sweep

if TYPE_CHECKING:
    from accelbench.sweep.runner import SweepSummary


class SweepDisplay:
    """Points done / left, the current point, and time so far: a live bar on a terminal, lines otherwise."""

    def __init__(self, console: Console, total: int, live: bool) -> None:
        self.console, self.total, self.finished = console, total, 0
        self.start = time.monotonic()
        self.run_s: list[float] = []  # how long each point run in this invocation took
        self._progress: Progress | None = None
        if live:
            self._progress = progress_bar(console, "points", transient=True)
            self._task = self._progress.add_task("starting", total=total)
            self._progress.start()

    def current(self, point: Point, run: int, runs: int) -> None:
        """``point`` starts its ``run``-th of ``runs`` runs."""
        again = f" (run {run}/{runs})" if runs > 1 else ""
        if self._progress is not None:
            self._progress.update(self._task, description=Text(point.label() + again).plain)
        else:
            self.console.print(
                Text(f"[{self.finished + 1}/{self.total}] running {point.label()}{again}"), soft_wrap=True
            )

    def finish(self, point: Point, outcome: str, style: str = "", seconds: float | None = None) -> None:
        """``point`` is settled for this sweep (``outcome`` says how; ``seconds``: how long it ran, if it ran),
        with the count left, the time so far and, once a point has run, the sweep's ETA."""
        self.finished += 1
        if seconds is not None:
            self.run_s.append(seconds)
        elapsed = time.monotonic() - self.start
        left = self.total - self.finished
        line = Text(f"[{self.finished}/{self.total}] {point.label()}: ", style="bold")
        line.append(outcome, style=style)
        eta = self.eta_s()
        ends = f", ends in ~{fmt_duration(eta)}" if eta is not None and left else ""
        line.append(f"  ({left} left, {fmt_duration(elapsed)} so far{ends})", style="dim")
        self.console.print(line, soft_wrap=True)
        if self._progress is not None:
            self._progress.update(self._task, completed=self.finished)

    def eta_s(self) -> float | None:
        """Seconds the points left should take: their count times the median point so far (points differ in
        size, so this is a rough guide); None before any point has run."""
        if not self.run_s:
            return None
        return statistics.median(self.run_s) * (self.total - self.finished)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


def outcome_text(outcomes: Sequence[str]) -> str:
    """Recorded outcomes counted, in order of first appearance: ``2 ok, 1 error``."""
    counts = {s: outcomes.count(s) for s in dict.fromkeys(outcomes)}
    return ", ".join(f"{n} {s}" for s, n in counts.items())


def print_start(err: Console, sweep: Sweep, scale: str, output_dir: Path) -> None:
    """What is about to run and where its records go, and whether it can give compare's noise test a verdict."""
    cap = f", memory cap {sweep.memory_cap / 2**30:.2f} GiB per point" if sweep.memory_cap else ""
    err.print(
        Text(
            f"sweep {sweep.name} (scale {scale}): {len(sweep.points)} points x {sweep.repeats} run(s), "
            f"records in {output_dir}{cap}"
        ),
        soft_wrap=True,
    )
    note = verdict_note(sweep)
    if note:
        err.print(Text("note: " + note, style="yellow"), soft_wrap=True)


def verdict_note(sweep: Sweep) -> str | None:
    """A warning when the points' steady epochs, over their repeats, are too few for compare's noise test to tell
    two systems apart; None when every point gives it enough (or decides its epochs itself: ``epochs = "auto"``)."""
    timed = [p for p in sweep.points if p.series is None]  # a largest-fit search asks what fits, not how fast
    fixed = [int(e) for e in (p.values.get("epochs", "auto") for p in timed) if e != "auto"]
    if not fixed:
        return None
    steady = (min(fixed) - 1) * sweep.repeats
    if steady >= MIN_STEADY_EPOCHS:
        return None
    needed = -(-MIN_STEADY_EPOCHS // max(1, min(fixed) - 1)) if min(fixed) > 1 else None
    fix = f"--repeats {needed}, " if needed else ""
    return (
        f"some points measure {steady} steady epoch(s) over their repeats: too few for compare's noise test, which "
        f"needs {MIN_STEADY_EPOCHS} per point to tell two systems apart; use {fix}--set epochs=auto or more epochs"
    )


def print_summary(err: Console, sweep: Sweep, summary: SweepSummary, output_dir: Path) -> None:
    """How the sweep ended: points done, the ones that failed and why, and what to do next."""
    left = len(sweep.points) - summary.done - summary.beyond_fit
    err.print(
        Text(
            f"sweep {sweep.name}: {summary.done} of {len(sweep.points)} points done "
            f"({summary.skipped_done} already recorded), {summary.beyond_fit} beyond the largest size that fits, "
            f"{left} not done"
        ),
        soft_wrap=True,
    )
    for point, attempt in summary.failed:
        err.print(
            Text(f"  {point.label()}: {attempt.status}: {attempt.message}", style="red"), soft_wrap=True
        )
    if summary.interrupted:
        err.print(
            Text("interrupted: every finished point is recorded; run the same command again to resume"),
            soft_wrap=True,
        )
    elif summary.failed:
        err.print(
            Text(f"details: {output_dir / SWEEP_LOG}; re-run the same command to retry them"),
            soft_wrap=True,
        )
