"""benchmarks/estimate_vs_measured.py's --repeats: a configuration's repeated runs combined into the figures its
prediction is judged against (the benchmark itself runs for minutes: docs/estimate.md has its figures)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from core_support import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "estimate_vs_measured.py"


@pytest.fixture(scope="module")
def script() -> ModuleType:
    return load_script(SCRIPT)


def _run(step_s: float, tensor_peak: int | None, waiting: float) -> dict[str, float | int | None]:
    return {"step_s": step_s, "cpu_step_s": step_s * 0.9, "samples_per_s": 16 / step_s,
            "peak_bytes": 500 << 20, "tensor_peak_bytes": tensor_peak, "waiting": waiting}  # fmt: skip


def test_repeated_runs_give_each_figure_their_median_and_the_step_its_spread(script: ModuleType) -> None:
    runs = [_run(0.30, 100, 0.2), _run(0.20, None, 0.1), _run(0.22, 120, 0.0)]
    combined = script.median_of(runs)
    assert combined["step_s"] == 0.22  # not the mean (0.24), which the slow run would pull up
    assert combined["samples_per_s"] == pytest.approx(16 / 0.22)  # the median run's, each figure apart
    assert combined["step_spread"] == pytest.approx((0.30 - 0.20) / 0.22)
    assert combined["steps_s"] == [0.30, 0.20, 0.22]  # every run's step kept, in the order they ran
    assert combined["tensor_peak_bytes"] == 120  # of the runs that measured one: the upper of the middle two
    assert combined["waiting"] == 0.1


def test_one_run_is_its_own_figures_without_a_spread(script: ModuleType) -> None:
    only = _run(0.25, None, 0.05)
    combined = script.median_of([only])
    assert {k: combined[k] for k in only} == only
    assert combined["step_spread"] is None and combined["tensor_peak_bytes"] is None


def test_again_prices_the_engine_costs_of_the_strategies_its_reading_ran(script: ModuleType) -> None:
    reading = {"rows": [{"strategy": s} for s in ("single", "tp", "deepspeed-zero3", "tp")]}
    # --strategies' default names neither tp nor ZeRO-3 alone: the reading's own decide (tp's DTensor dispatch was
    # left out of a reading's --again before)
    assert script.priced_strategies(reading, ["ddp", "fsdp"]) == ["deepspeed-zero3", "single", "tp"]
    assert script.priced_strategies(None, ["ddp", "fsdp"]) == ["ddp", "fsdp"]
