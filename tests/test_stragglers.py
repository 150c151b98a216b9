"""Stragglers named: which rank held the others up and what made it slow (data loading or compute), from each
rank's data wait and DDP all-reduce timings; and a real 2-rank gloo run with one rank slowed on purpose."""

from __future__ import annotations

from pathlib import Path

import pytest
from core_support import accelbench

from accelbench.engine.stragglers import SLOW_DATA_ENV, CollectiveClock, name_slowest_rank, slow_data_delay
from accelbench.errors import ConfigError
from accelbench.results import RankMetrics, read_record

STEPS = [10, 10, 10]  # three epochs of 10 steps: the first is the warm-up


def rank(
    r: int, wall: float, data: float, wait: float | None, first: float | None = 0.01, host: str = "n1"
) -> RankMetrics:
    """A rank whose steady epochs each took ``wall`` s per step, ``data`` of it getting batches and ``wait`` of it
    in all-reduces after its backward (the warm-up epoch is wildly different and must not count)."""
    per_epoch = [s * wall for s in STEPS]
    return RankMetrics(
        rank=r, host=host, epoch_wall_s=[9.0, *per_epoch[1:]], epoch_samples=[80] * 3, peak_memory_bytes=None,
        epoch_steps=STEPS, data_wait_s=[9.0 if r == 0 else 0.0, *(s * data for s in STEPS[1:])],
        first_collective_s=[first] * 3, collective_wait_s=[None if wait is None else s * wait for s in STEPS],
    )  # fmt: skip


def test_a_rank_slow_to_load_its_data_is_named_with_that_cause() -> None:
    """Every step took 0.3 s everywhere (DDP makes them equal); rank 1 spent 0.2 s of it loading data, and rank 0
    waited 0.2 s in the all-reduce for it."""
    ranks = [rank(0, 0.3, 0.001, 0.2), rank(1, 0.3, 0.2, 0.001, first=0.25, host="n2")]
    slowest = name_slowest_rank(ranks, [r.epoch_steps for r in ranks])
    assert slowest is not None
    assert (slowest.rank, slowest.host, slowest.cause) == (1, "n2", "data loading")
    assert slowest.excess_s_per_step == pytest.approx(0.199)
    assert "data loading 200.0 ms a step (others 1.0)" in slowest.note
    assert "the others waited 200.0 ms a step in collectives for it" in slowest.note
    assert "first collective after 250.0 ms (others 10.0)" in slowest.note


def test_a_rank_slow_to_compute_is_named_with_that_cause() -> None:
    """Rank 2 of 4 computes 50 ms longer a step: the other three wait that long in the all-reduce."""
    ranks = [rank(r, 0.2, 0.01, 0.051 if r != 2 else 0.001) for r in range(4)]
    slowest = name_slowest_rank(ranks, [r.epoch_steps for r in ranks])
    assert slowest is not None and (slowest.rank, slowest.cause) == (2, "compute")
    assert slowest.excess_s_per_step == pytest.approx(0.05)


@pytest.mark.parametrize(
    "ranks",
    [
        [rank(0, 0.3, 0.01, 0.011), rank(1, 0.3, 0.01, 0.01)],  # balanced: no rank stands out
        [rank(0, 0.3, 0.01, 0.0)],  # one rank
        [rank(0, 0.3, 0.01, 0.024), rank(1, 0.3, 0.034, 0.0)],  # 8% of a step over the other: under 10%
    ],
)
def test_no_rank_is_named_where_none_stands_out(ranks: list[RankMetrics]) -> None:
    assert name_slowest_rank(ranks, [r.epoch_steps for r in ranks]) is None


def test_records_without_the_timings_name_no_rank() -> None:
    old = [
        r.model_copy(update={"data_wait_s": [], "epoch_steps": []})
        for r in (rank(0, 0.3, 0, 0.2), rank(1, 0.3, 0.2, 0))
    ]
    assert name_slowest_rank(old, [[], []]) is None


def test_without_collective_timings_a_data_slow_rank_is_still_named() -> None:
    """FSDP and the others time no all-reduce: data wait alone still tells the rank slow to load."""
    ranks = [rank(0, 0.3, 0.001, None, first=None), rank(1, 0.3, 0.2, None, first=None)]
    slowest = name_slowest_rank(ranks, [r.epoch_steps for r in ranks])
    assert slowest is not None and (slowest.rank, slowest.cause) == (1, "data loading")
    assert "waited" not in slowest.note


def test_the_collective_clock_times_the_first_launch_and_the_wait_after_the_last() -> None:
    clock = CollectiveClock()
    clock.start_step()
    clock.launched()
    clock.launched()
    clock.finished()
    clock.end_step()
    clock.start_step()
    clock.end_step()  # a step with no collective (a micro-batch under no_sync) counts for neither
    first, wait = clock.end_epoch()
    assert first is not None and wait is not None and 0 <= first < 0.1 and 0 <= wait < 0.1
    assert clock.end_epoch() == (None, None)  # reset


def test_the_slow_data_hook_slows_only_the_named_rank() -> None:
    assert slow_data_delay(1, {SLOW_DATA_ENV: "1:0.2"}) == 0.2
    assert slow_data_delay(0, {SLOW_DATA_ENV: "1:0.2"}) == 0.0
    assert slow_data_delay(0, {}) == 0.0
    for bad in ("1", "x:0.2", "1:-1", "1:1e9"):
        with pytest.raises(ConfigError, match=rf"{SLOW_DATA_ENV}=.*write RANK:SECONDS"):
            slow_data_delay(0, {SLOW_DATA_ENV: bad})


@pytest.mark.slow
def test_a_real_two_rank_run_with_one_rank_slowed_names_it(tmp_path: Path) -> None:
    """gloo DDP on 2 CPU processes; rank 1 sleeps 0.2 s in every batch fetch: the record names rank 1 and data
    loading (rank 0 waited in the all-reduce for it), and compare says so."""
    import os

    env = {**os.environ, SLOW_DATA_ENV: "1:0.2"}
    proc = accelbench(
        "run", "--backend", "cpu", "--model", "gpt-nano", "--strategy", "ddp", "--devices", "2", "--epochs", "2",
        "--steps-per-epoch", "4", "--batch-size", "4", "-q", "--output-dir", str(tmp_path), env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = tmp_path.glob("*.json")
    metrics = read_record(path).metrics
    assert metrics is not None and metrics.slowest_rank is not None
    assert (metrics.slowest_rank.rank, metrics.slowest_rank.cause) == (1, "data loading")
    assert metrics.slowest_rank.excess_s_per_step > 0.15
    fast, slow = metrics.ranks
    assert all(d > 0.8 for d in slow.data_wait_s) and all(d < 0.4 for d in fast.data_wait_s)  # 4 x 0.2 s
    # rank 0 sat in the all-reduce for it; rank 1 hardly waited
    assert sum(w or 0 for w in fast.collective_wait_s) > 2 * sum(w or 0 for w in slow.collective_wait_s)
    compared = accelbench("compare", str(tmp_path))
    assert compared.returncode == 0, compared.stderr
    assert "rank 1 (" in compared.stdout and "data loading, +" in compared.stdout
