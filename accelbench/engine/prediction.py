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


def cached_calibration(
    config: RunConfig, run: CalibratedRun, device: DeviceInfo | None
) -> tuple[Calibration, StepOperators] | str | None:
    """This device's calibration and the run's traced step: the cached one (measured again where, an hour or more
    on, the device has drifted from it), else measured now, unless ``--no-calibration``. Without one the efficiency
    model predicts instead: None where that was asked for (``--no-calibration`` and none cached), else why (a
    device fed from the host, whose timings say nothing of it, or a step that could not be traced, with the
    error)."""
    from accelbench.estimate.calibration import (
        _first_line,
        calibrate,
        drift_beyond_tolerance,
        needs_spot_check,
    )
    from accelbench.estimate.operators import has_tensor_parallelism, step_operators
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
    # spot-checked where over an hour old, or measured on a busy host (its rates may be many times too low: a run
    # on the quiet host measures it again; on a still busy one the check finds it near and it is used as it is)
    if (
        calibration is not None
        and not config.no_calibration
        and (calibration.contended or needs_spot_check(calibration))
    ):
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
            calibration, torch.get_num_threads(), cached_only=config.no_calibration
        )
    kernels = run.backend.optimizer_implementation(run.device)
    if (
        config.strategy == "fsdp" or ParallelDims.of(config).shards_parameters
    ) and run.device.type == "cpu":  # fsdp, or a mesh's FSDP axis
        import torch

        from accelbench.estimate.engine_cost import with_fsdp_hooks

        calibration = with_fsdp_hooks(
            calibration, torch.get_num_threads(), kernels, cached_only=config.no_calibration
        )
    if has_tensor_parallelism(config):
        import torch

        from accelbench.estimate.engine_cost import with_dtensor_dispatch

        calibration = with_dtensor_dispatch(
            calibration, torch.get_num_threads(), cached_only=config.no_calibration
        )
    try:
        return calibration, step_operators(run.workload, config, run.plan, run.device.type, kernels)
    except Exception as exc:  # noqa: BLE001 - a model fake tensors cannot trace on this device
        failure = f"{type(exc).__name__}: {_first_line(exc)}"
    if run.device.type == "cpu":
        return f"the step could not be traced ({failure})"
    # An operator with no fake-tensor kernel for this device (a fused kernel the CPU lacks) stops the trace; the
    # same step traced on the CPU has the same matmuls and elementwise passes, priced at this device's rates
    try:
        operators = step_operators(run.workload, config, run.plan, "cpu", kernels)
    except Exception as exc:  # noqa: BLE001 - not traceable at all: the efficiency model predicts instead
        return (
            f"the step could not be traced on the {run.device.type} ({failure}) nor on the CPU "
            f"({type(exc).__name__}: {_first_line(exc)})"
        )
    return calibration, operators.on_device(
        run.device.type, f"traced on the CPU, as the {run.device.type} trace failed ({failure})"
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

    try:
        bandwidth = load_comm_records(config)
        found = cached_calibration(config, calibrated, device) if calibrated is not None else None
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
    prediction = RunPrediction.from_prediction(p, bandwidth_source=source)
    if not isinstance(found, str):
        return prediction
    # a calibration was wanted and none priced the step: the record says why, for whoever reads a miss
    why = f"step time at the efficiency, not calibrated: {found}"
    return prediction.model_copy(update={"note": "; ".join(n for n in (prediction.note, why) if n)})
