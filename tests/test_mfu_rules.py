"""MFU that is never wrong: above 100% it is an error in the record, not a figure (also in older records compare
reads); a run mixing maths is measured against the FLOP-weighted peak of the maths it ran; an unknown device never
borrows another device's peak; every record states its FLOP convention."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from core_support import derived

from accelbench.compare import compare, load_records
from accelbench.contract import PeakFigures
from accelbench.engine.metrics import FLOP_CONVENTION, flop_weighted_peak, model_flops_utilisation
from accelbench.results import ResultRecord


def test_an_mfu_above_100_percent_is_an_error_naming_the_peak_not_a_figure() -> None:
    peak = PeakFigures(flops_per_s=1e12, source="a table that is wrong for this device")
    mfu, error = model_flops_utilisation(achieved=0.5e12, peak=peak, devices=1)
    assert mfu == pytest.approx(0.5) and error is None
    mfu, error = model_flops_utilisation(achieved=3e12, peak=peak, devices=2)  # 150%
    assert mfu is None and error is not None
    assert "150%" in error and "a table that is wrong for this device" in error and "--peak-tflops" in error
    assert model_flops_utilisation(achieved=1e12, peak=None, devices=1) == (None, None)


def test_a_mixed_precision_step_is_measured_against_the_flop_weighted_peak() -> None:
    # 3/4 of the FLOPs in FP8 linears at 2 PFLOP/s, 1/4 in BF16 attention at 1 PFLOP/s: the step's FLOPs would
    # take 0.75/2 + 0.25/1 = 0.625 s per PFLOP at peak, so the peak is 1.6 PFLOP/s (not the FP8 or BF16 figure)
    peaks = {"fp8": 2e15, "bf16": 1e15}
    assert flop_weighted_peak({"fp8": 0.75, "bf16": 0.25}, peaks) == pytest.approx(1.6e15)
    assert flop_weighted_peak({"bf16": 1.0, "fp8": 0.0}, peaks) == pytest.approx(1e15)
    with pytest.raises(KeyError, match="fp4"):  # a math without a peak: unknown, never another math's figure
        flop_weighted_peak({"fp4": 1.0, "bf16": 1.0}, peaks)
    with pytest.raises(ValueError):
        flop_weighted_peak({}, peaks)


def test_a_run_whose_peak_is_below_what_it_achieved_records_the_error(
    tiny_run: tuple[ResultRecord, Path], tmp_path: Path
) -> None:
    from accelbench.engine.metrics import build_metrics

    record, _ = tiny_run
    assert record.metrics.flop_convention == FLOP_CONVENTION and "model FLOPs" in FLOP_CONVENTION
    steady = record.metrics.steady
    assert steady is not None and steady.achieved_flops_per_s > 0
    assert steady.mfu is None or steady.mfu <= 1.0
    # the same logs against a peak a tenth of what the run achieved: the record carries the error instead
    from accelbench.engine.metrics import RankLog, WorkCounts

    log = RankLog(rank=0, host="h")
    log.epoch_wall_s, log.epoch_samples, log.epoch_steps = [1.0, 1.0], [100, 100], [10, 10]
    log.epoch_loss, log.epoch_peak_bytes = [1.0, 0.9], [None, None]
    log.epoch_cpu_s, log.epoch_cpu_wait_s, log.epoch_load = [1.0, 1.0], [None, None], [None, None]
    log.epoch_energy_j, log.epoch_telemetry = [None, None], [{}, {}]
    work = WorkCounts(flops_per_sample=1e9, flops_formula="test", tokens_per_sample=1)
    low = PeakFigures(flops_per_s=1e10, source="wrong table")
    metrics = build_metrics([log], work, low, devices=1, setup_s=0.0, compile_s=None, memory=None)
    assert metrics.steady is not None and metrics.steady.mfu is None
    assert metrics.steady.mfu_error and "1000%" in metrics.steady.mfu_error


def test_compare_never_shows_an_mfu_above_100_percent_from_an_older_record(
    tiny_run: tuple[ResultRecord, Path], tmp_path: Path
) -> None:
    _, path = tiny_run
    raw = json.loads(path.read_text())
    older = derived(raw, metrics__steady__mfu=1.52)  # as records were written before the rule
    older["metrics"]["steady"].pop("mfu_error", None)
    (tmp_path / "older.json").write_text(json.dumps(older))
    (group,) = compare(load_records([tmp_path])).groups
    from accelbench.compare.columns import fmt_mfu

    (cell,) = group.cells
    assert cell.mfu is None and fmt_mfu(cell) == "error: >100%"
