"""What a newcomer reads while a run goes (tests for the first hour's readings): the time left as a duration, and a
busy host said the moment an epoch finds it, not only in the final summary."""

from __future__ import annotations

import io

from accelbench.display import LogProgress, contention_text, fmt_left
from accelbench.results import EpochMetrics


def epoch(
    number: int, cpu_s: float | None = 1.0, cpu_wait_s: float | None = 0.0, steal: float | None = 0.0
) -> EpochMetrics:
    return EpochMetrics(epoch=number, wall_s=2.0, steps=4, samples=256, tokens=32768, samples_per_s=128.0,
                        tokens_per_s=16384.0, loss=3.0, peak_memory_bytes=None, cpu_s=cpu_s, cpu_wait_s=cpu_wait_s,
                        steal=steal)  # fmt: skip


def test_the_time_left_is_a_duration_never_a_clock_time() -> None:
    """`run ends in ~18:07` printed at 18:08 read as a time of day already past; it is a duration, in words."""
    assert fmt_left(42) == "about 42 s left"
    assert fmt_left(18 * 60 + 7) == "about 18 min left"
    assert fmt_left(2 * 3600 + 5 * 60) == "about 2 h 05 min left"
    assert fmt_left(-3) == "about 0 s left"


def test_a_busy_host_is_said_in_the_epochs_progress_line() -> None:
    quiet, waited, stolen = epoch(1), epoch(2, cpu_s=1.0, cpu_wait_s=0.5), epoch(3, steal=0.2)
    assert contention_text(quiet) == "" and contention_text(epoch(1, cpu_s=None, cpu_wait_s=None)) == ""
    assert contention_text(waited).startswith("contended: its threads waited 33% of the time for a core")
    assert "the hypervisor took 20% of the cores' time" in contention_text(stolen)
    stream = io.StringIO()
    progress = LogProgress(stream)
    for metrics in (quiet, waited):
        progress.start_epoch(metrics.epoch, 3, 4, 64)
        progress.end_epoch(metrics)
    first, busy = stream.getvalue().splitlines()[-2:]
    assert "contended" not in first and "about 4 s left" in first
    assert (
        "epoch 2/3 done" in busy
        and "contended: its threads waited 33%" in busy
        and "the record marks it" in busy
    )
