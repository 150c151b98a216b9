"""Which rank held the others up, and why.

Under DDP every rank's step looks equally slow: the fast ranks wait in the gradient all-reduce for the slow one, so
epoch times cannot tell them apart. Each rank therefore times, per step, the three things that can:

- **data wait**: the time it spent getting its batch (the loader's ``next`` and the copy to the device);
- **time to its first collective**: from the step's start until its first gradient bucket was ready and its
  all-reduce launched (forward and the first part of backward);
- **collective wait**: from its last bucket's launch until its last all-reduce finished, i.e. the time it sat in
  the collective after its own backward was done, mostly waiting for a slower peer.

The collective times come from a DDP communication hook (:func:`timed_allreduce_hook`: torch's own
``allreduce_hook``, the same all-reduce DDP runs by default, with a timestamp at launch and at completion); other
strategies record data wait only. A rank's *own work* per step is its step time less its collective wait; the
slowest rank is the one with the most own work, a straggler when that exceeds the other ranks' median by
:data:`STRAGGLER_EXCESS` of a step, and the part (data loading or compute) that exceeds the others' most is what
made it slow (:func:`name_slowest_rank`).
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from accelbench.errors import ConfigError
from accelbench.results import RankMetrics, SlowestRank

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

STRAGGLER_EXCESS = 0.10  # own work more than 10% of a step above the other ranks' median names a straggler
# Fault injection, to check the attribution end to end: "RANK:SECONDS" sleeps that long in every batch fetch of
# that rank (e.g. 1:0.2). Documented in docs/results.md; never set it for a measurement.
SLOW_DATA_ENV = "ACCELBENCH_SLOW_DATA"


def slow_data_delay(rank: int, environ: dict[str, str] | None = None) -> float:
    """Seconds this rank sleeps per batch under :data:`SLOW_DATA_ENV` (0 unless it names this rank)."""
    raw = (environ if environ is not None else os.environ).get(SLOW_DATA_ENV, "").strip()
    if not raw:
        return 0.0
    which, sep, seconds = raw.partition(":")
    try:
        target, delay = int(which), float(seconds)
    except ValueError:
        target, delay = -1, -1.0
    if not sep or target < 0 or not 0 <= delay <= 60:
        raise ConfigError(
            f"{SLOW_DATA_ENV}={raw!r}: write RANK:SECONDS (e.g. 1:0.2, at most 60 s), or unset it; it slows one "
            "rank's data loading on purpose"
        )
    return delay if target == rank else 0.0


class CollectiveClock:
    """One rank's collective timings, step by step: the DDP hook marks each bucket's launch and completion (the
    completion from the communication thread, hence the lock); the runner marks the step's start and end."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._start = 0.0
        self._first: float | None = None
        self._last_launch: float | None = None
        self._last_done: float | None = None
        self.first_s: list[float] = []  # this epoch's steps: time to the first collective
        self.wait_s = 0.0  # this epoch: seconds in collectives after the rank's own backward was done

    def start_step(self) -> None:
        with self._lock:
            self._start = time.perf_counter()
            self._first = self._last_launch = self._last_done = None

    def launched(self) -> None:
        now = time.perf_counter()
        with self._lock:
            if self._first is None:
                self._first = now
            self._last_launch = now

    def finished(self) -> None:
        now = time.perf_counter()
        with self._lock:
            self._last_done = now if self._last_done is None else max(self._last_done, now)

    def end_step(self) -> None:
        with self._lock:
            if self._first is None or self._last_launch is None:
                return  # no collective this step (a micro-batch under no_sync)
            self.first_s.append(self._first - self._start)
            if self._last_done is not None:
                self.wait_s += max(0.0, self._last_done - self._last_launch)

    def end_epoch(self) -> tuple[float | None, float | None]:
        """This epoch's median time to the first collective and its total collective wait (None, None: no
        collective ran); resets for the next epoch."""
        with self._lock:
            first = statistics.median(self.first_s) if self.first_s else None
            wait = self.wait_s if self.first_s else None
            self.first_s, self.wait_s = [], 0.0
        return first, wait


def timed_allreduce_hook(
    clock: CollectiveClock,
) -> Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]:
    """A DDP communication hook: torch's ``allreduce_hook`` (DDP's default all-reduce, averaged over the
    ranks), its launch and completion marked on ``clock``."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        clock.launched()
        future = allreduce_hook(state, bucket)

        def done(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            clock.finished()
            return fut.value()

        return future.then(done)

    import torch
    import torch.distributed as dist

    # DDP checks the hook's annotations against the objects themselves, not this module's postponed strings
    hook.__annotations__ = {
        "state": object,
        "bucket": dist.GradBucket,
        "return": torch.futures.Future[torch.Tensor],
    }
    return hook


def _per_step(values: Sequence[float | None], steps: Sequence[int]) -> float | None:
    if not values or len(values) != len(steps) or any(v is None for v in values) or sum(steps) == 0:
        return None
    return sum(v for v in values if v is not None) / sum(steps)


def name_slowest_rank(
    ranks: Sequence[RankMetrics], epoch_steps: Sequence[Sequence[int]]
) -> SlowestRank | None:
    """The rank that held the others up over the steady epochs (all epochs if there is one), and what made it
    slow; None with one rank, without the timings, or when no rank's own work stands out.

    ``epoch_steps``: each rank's steps per epoch (as ``ranks``)."""
    if len(ranks) < 2:
        return None
    rows = []
    for rank, steps in zip(ranks, epoch_steps, strict=True):
        n = len(rank.epoch_wall_s)
        window = slice(1, n) if n >= 2 else slice(0, n)
        counted = list(steps[window])
        wall = _per_step(rank.epoch_wall_s[window], counted)
        data = _per_step(rank.data_wait_s[window], counted)
        if wall is None or data is None:
            return None  # a record from before these timings, or a rank that measured none
        wait = _per_step(rank.collective_wait_s[window], counted)
        known_first = [f for f in rank.first_collective_s[window] if f is not None]
        rows.append((rank, wall, data, wait, statistics.median(known_first) if known_first else None))
    timed = all(wait is not None for _, _, _, wait, _ in rows)
    # own work: the step less the time spent waiting in collectives for the others (unknown: data wait only)
    own = {r.rank: (wall - wait if wait is not None and timed else data) for r, wall, data, wait, _ in rows}
    slow, wall, data, wait, first = max(rows, key=lambda row: own[row[0].rank])
    others = [row for row in rows if row[0] is not slow]
    typical_own = statistics.median(own[r.rank] for r, *_ in others)
    typical_wall = statistics.median(row[1] for row in rows)
    excess = own[slow.rank] - typical_own
    if typical_wall <= 0 or excess <= STRAGGLER_EXCESS * typical_wall:
        return None
    data_excess = data - statistics.median(row[2] for row in others)
    compute = {r.rank: own[r.rank] - d for r, _, d, _, _ in rows} if timed else None
    compute_excess = (
        compute[slow.rank] - statistics.median(compute[r.rank] for r, *_ in others) if compute else None
    )
    cause: Literal["data loading", "compute"] = (
        "data loading" if compute_excess is None or data_excess >= compute_excess else "compute"
    )
    ms = 1e3
    parts = [
        f"rank {slow.rank} ({slow.host}) is the slowest: its own work took {own[slow.rank] * ms:.1f} ms a step, "
        f"{excess * ms:.1f} ms more than the other ranks' median",
        f"data loading {data * ms:.1f} ms a step (others {statistics.median(row[2] for row in others) * ms:.1f})",
    ]
    if compute is not None:
        parts.append(
            f"compute {compute[slow.rank] * ms:.1f} ms (others "
            f"{statistics.median(compute[r.rank] for r, *_ in others) * ms:.1f})"
        )
    if timed:
        waited = statistics.median(row[3] or 0.0 for row in others)
        parts.append(f"the others waited {waited * ms:.1f} ms a step in collectives for it")
    if first is not None:
        other_first = [row[4] for row in others if row[4] is not None]
        if other_first:
            parts.append(
                f"first collective after {first * ms:.1f} ms (others {statistics.median(other_first) * ms:.1f})"
            )
    return SlowestRank(
        rank=slow.rank,
        host=slow.host,
        cause=cause,
        excess_s_per_step=excess,
        note=f"{parts[0]}; cause: {cause} ({'; '.join(parts[1:])})",
    )
