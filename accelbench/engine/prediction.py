"""The analytical model's prediction for a run's own configuration, stored in its record beside what was measured.

The runner reads the workload's facts off the job it built (:func:`accelbench.estimate.facts.facts_of`, before an
executor wraps or shards the model), the memory the backend's reading already counts before the model exists (a
CPU's resident set holds the interpreter and its libraries; a GPU allocator's peak holds nothing yet), the peak it
reports MFU against, and, with ``--comm-records``, the collectives' bus bandwidth measured by ``accelbench comm``;
:func:`predict_run` turns them into a :class:`~accelbench.results.RunPrediction` with the same functions
``accelbench estimate`` calls. The prediction never fails a run: what it cannot predict it says in ``note``.

The peak it is against is the one MFU is against: :func:`accelbench.engine.metrics.peak_for`.

The step time is the calibrated one (:mod:`accelbench.estimate.calibration`): the step's operators are traced (a
few seconds) and timed at the device's rates for the run's matmul dtype and thread count. Where none is cached
(``accelbench estimate --calibrate`` makes one too), rank 0 measures it once, after every epoch is timed and the
record's measurements are drafted (seconds; cached for every later run), so that a first run on a device already
shows the calibrated prediction. A cached one more than an hour old, or measured on a busy host, is spot-checked
first (two of its points timed again, a few tenths of a second) and measured again where the device now runs more
than 10% away from it (a shared host's speed moves by tens of percent within an hour; a calibration measured beside
other jobs was once 20 to 1,000 times too slow, and priced a quiet run's step at 38 times what it took).
``--no-calibration`` skips all of this, and the compute is then the cached calibration's where there is one, else
the peak at the default efficiency; ``time_model`` says which.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from accelbench.errors import AccelbenchError, ConfigError
from accelbench.parallel_dims import ParallelDims
from accelbench.results import RunPrediction

if TYPE_CHECKING:
    import torch

    from accelbench.config import RunConfig
    from accelbench.contract import Backend, DeviceInfo, PeakFigures, PrecisionPlan
    from accelbench.estimate.calibration import Calibration
    from accelbench.estimate.facts import WorkloadFacts
    from accelbench.estimate.hardware import Bandwidth
    from accelbench.estimate.operators import StepOperators
    from accelbench.workloads import Workload


@dataclass(frozen=True)
class CalibratedRun:
    """What the calibrated step time needs of a run: its workload, the precision plan that ran, the backend and
    the device it bound."""

    workload: Workload
    plan: PrecisionPlan
    backend: Backend
    device: torch.device
    note: Callable[[str], None]  # says what is measured for the prediction (the run's progress display)
    # why nothing may be measured for the prediction (the run was interrupted, or ended otherwise than ok), or None
    no_measuring: str | None = None


def cached_calibration(
    config: RunConfig, run: CalibratedRun, device: DeviceInfo | None
) -> tuple[Calibration, StepOperators] | str | None:
    """This device's calibration and the run's traced step: the cached one (measured again where, an hour or more
    on, the device has drifted from it), else measured now, unless ``--no-calibration``. Without one the efficiency
    model predicts instead: None where that was asked for (``--no-calibration`` and none cached), else why (a
    device fed from the host, whose timings say nothing of it, or a step that could not be traced, with the
    error)."""
    from accelbench.estimate.calibration import (
        calibrate,
        drift_beyond_tolerance,
        needs_spot_check,
    )
    from accelbench.estimate.operators import UntraceableStep, has_tensor_parallelism, operators_for
    from accelbench.estimate.peak import cache_dir, matmul_dtype

    if run.device.type != run.backend.info.device_type:
        return (
            f"the {run.backend.info.device_type} device is fed from the {run.device.type}, whose timings say "
            "nothing of it"
        )
    dtype = matmul_dtype(run.plan)

    def calibration_of_device(cached_only: bool = False, refresh: bool = False) -> Calibration | None:
        return calibrate(
            run.device,
            run.backend.synchronize,
            backend=run.backend.name,
            device_name=device.name if device is not None else run.backend.name,
            dtype=dtype,
            cached_only=cached_only,
            refresh=refresh,
        )

    calibration = calibration_of_device(cached_only=True)
    if calibration is not None and calibration.contended:  # an older accelbench cached one: a lower bound
        calibration = None
    if run.no_measuring is not None:  # nothing is measured after an interrupt: the cache, or no calibration
        if calibration is None:
            return (
                f"no calibration of this device for {dtype} is cached, and nothing is measured after "
                f"{run.no_measuring}"
            )
    # spot-checked where over an hour old (a shared host's speed moves over the hour)
    elif calibration is not None and not config.no_calibration and needs_spot_check(calibration):
        drift = drift_beyond_tolerance(calibration, run.device, run.backend.synchronize)
        if drift is not None:
            run.note(
                f"this device runs {drift:+.0%} against its cached calibration for {dtype} (measured "
                f"{calibration.measured_at}): measuring it again for the prediction (seconds; --no-calibration "
                "skips it)"
            )
            calibration = calibration_of_device(refresh=True)
    if calibration is None and not config.no_calibration:
        run.note(
            f"no calibration of this device for {dtype} is cached: measuring one for the prediction (seconds, "
            f"once; cached in {cache_dir()}; --no-calibration skips it)"
        )
        calibration = calibration_of_device()
    if calibration is None:
        return None if config.no_calibration else f"no calibration of this device for {dtype} was measured"
    if config.strategy == "deepspeed-zero3" and run.device.type == "cpu":
        import torch

        from accelbench.estimate.engine_cost import with_zero3_hooks

        calibration = with_zero3_hooks(
            calibration,
            torch.get_num_threads(),
            cached_only=config.no_calibration or run.no_measuring is not None,
        )
    kernels = run.backend.optimizer_implementation(run.device)
    if (
        config.strategy == "fsdp" or ParallelDims.of(config).shards_parameters
    ) and run.device.type == "cpu":  # fsdp, or a mesh's FSDP axis
        import torch

        from accelbench.estimate.engine_cost import with_fsdp_hooks

        calibration = with_fsdp_hooks(
            calibration,
            torch.get_num_threads(),
            kernels,
            cached_only=config.no_calibration or run.no_measuring is not None,
        )
    if has_tensor_parallelism(config):
        import torch

        from accelbench.estimate.engine_cost import with_dtensor_dispatch

        calibration = with_dtensor_dispatch(
            calibration,
            torch.get_num_threads(),
            cached_only=config.no_calibration or run.no_measuring is not None,
        )
    try:
        return calibration, operators_for(run.workload, config, run.plan, run.device.type, kernels)
    except UntraceableStep as exc:  # the efficiency model predicts instead, saying why
        return str(exc)


# A calibration whose largest product runs this many times slower than the peak the same run measured (or its
# vendor's table gives) was not measured on the device as it runs (a host busy 10^4-fold: 0.002 GFLOP/s against 30)
INCONSISTENT_WITH_PEAK = 100.0


def consistent_with_peak(
    found: tuple[Calibration, StepOperators], peak: PeakFigures | None
) -> tuple[Calibration, StepOperators] | str:
    """``found``, or why its calibration cannot price this run: its largest product's rate is
    :data:`INCONSISTENT_WITH_PEAK` times below the run's peak for that dtype."""
    from accelbench.estimate.calibration import MATMUL_SIZES

    calibration, _ = found
    if peak is None or not peak.flops_per_s:
        return found
    largest = MATMUL_SIZES[-1]
    rate = calibration.matmul_rate(largest, largest, largest)
    if rate * INCONSISTENT_WITH_PEAK >= peak.flops_per_s:
        return found
    return (
        f"the calibration's {calibration.dtype} products ({rate / 1e9:.3g} GFLOP/s at {largest}^3) run over "
        f"{INCONSISTENT_WITH_PEAK:g}x below this run's peak ({peak.flops_per_s / 1e9:.3g} GFLOP/s, {peak.source}): "
        "not a measurement of this device as it runs; nothing is priced with it"
    )


def load_comm_records(config: RunConfig) -> Bandwidth | None:
    """The bus bandwidth in ``--comm-records``, or None without; a ConfigError naming the flag when unreadable."""
    if config.comm_records is None:
        return None
    from accelbench.estimate.comm import load_bus_bandwidth

    try:
        return load_bus_bandwidth([config.comm_records])
    except ConfigError as exc:
        text = str(exc).replace("--comm ", "--comm-records ", 1).replace("--comm:", "--comm-records:", 1)
        raise ConfigError(text) from None


def predict_run(
    config: RunConfig,
    facts: WorkloadFacts | None,
    *,
    device_type: str,
    device: DeviceInfo | None,
    peak: PeakFigures | None,
    runtime_bytes: float | None,
    calibrated: CalibratedRun | None = None,
) -> RunPrediction:
    """The prediction for ``config`` as it ran: ``estimate``'s, on the facts of the built model; calibrated where
    ``calibrated`` is given and this device has a cached calibration."""
    if facts is None:
        return RunPrediction.absent("the model was never built")
    from accelbench.estimate.predictor import predict
    from accelbench.estimate.profile import EFFICIENCY_SOURCE, Source, error_band

    try:
        bandwidth = load_comm_records(config)
        found = cached_calibration(config, calibrated, device) if calibrated is not None else None
        if isinstance(found, tuple):
            found = consistent_with_peak(found, peak)
        calibration, operators = found if isinstance(found, tuple) else (None, None)
        p = predict(
            config,
            facts,
            device_type=device_type,
            device=device,
            peak=peak,
            bandwidth=bandwidth,
            runtime_bytes=runtime_bytes or 0.0,
            calibration=calibration,
            operators=operators,
        )
    except (AccelbenchError, ValueError, ZeroDivisionError) as exc:
        return RunPrediction.absent(str(exc))
    source = f"accelbench comm records in {config.comm_records}" if bandwidth is not None else None
    rates: Source = "measured here" if calibration is not None else EFFICIENCY_SOURCE
    band = error_band(rates)
    if calibration is not None and calibration.contended:  # the band is a quiet calibration's: not this one's
        band = "no band: rates measured on a busy host are a lower bound, and the step an upper bound"
    p = p.model_copy(update={"rates_source": rates, "error_band": band})
    prediction = RunPrediction.from_prediction(p, bandwidth_source=source)
    if calibration is not None and calibration.contended:
        busy = "calibrated on a busy host: its rates are a lower bound, so this step is an upper bound (not cached)"
        return prediction.model_copy(update={"note": "; ".join(n for n in (prediction.note, busy) if n)})
    if not isinstance(found, str):
        return prediction
    # a calibration was wanted and none priced the step: the record says why, for whoever reads a miss
    why = f"step time at the efficiency, not calibrated: {found}"
    return prediction.model_copy(update={"note": "; ".join(n for n in (prediction.note, why) if n)})
