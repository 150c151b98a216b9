"""The prediction for a run configuration: what the runner calls and ``accelbench estimate`` prints.

:func:`predict` takes the run's :class:`~accelbench.config.RunConfig` (resolved: the workload's options filled in),
the workload's :class:`~accelbench.estimate.model.WorkloadFacts` (:func:`accelbench.estimate.facts.facts_of` on the
job the runner built, or :func:`~accelbench.estimate.facts.meta_facts` without building anything real), and what is
known of the device: its :class:`~accelbench.devices.DeviceInfo` (name, memory), its peak figures (vendor table,
measured, or ``--peak-tflops``) and the collectives' bus bandwidth.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accelbench.config import RunConfig
from accelbench.errors import ConfigError
from accelbench.estimate.model import (
    DEFAULT_EFFICIENCY,
    Bandwidth,
    Hardware,
    Overlap,
    Prediction,
    RunShape,
    ScalingPrediction,
    WorkloadFacts,
    predict_speedup,
    predict_step,
)
from accelbench.parallel_dims import ParallelDims

if TYPE_CHECKING:
    from accelbench.contract import DeviceInfo, PeakFigures


def run_shape(config: RunConfig) -> RunShape:
    """The run's shape for the formulas: strategy, precision, per-device (per-replica) batch, and its parallel
    layout, the same :class:`~accelbench.parallel_dims.ParallelDims` the executors run."""
    return RunShape(
        strategy=config.strategy,
        precision=config.precision,
        batch_size=config.batch_size,
        grad_accum=config.grad_accum,
        dims=ParallelDims.of(config),
    )


def predict(
    config: RunConfig,
    facts: WorkloadFacts,
    *,
    device_type: str,
    device: DeviceInfo | None = None,
    peak: PeakFigures | None = None,
    bandwidth: Bandwidth | None = None,
    efficiency: float = DEFAULT_EFFICIENCY,
    overlap: Overlap = "auto",
    runtime_bytes: float = 0.0,
) -> Prediction:
    """Predicted step time, peak memory per device (with its breakdown), communication per device per step and
    FLOPs for ``config`` on ``device`` (of ``device_type``: 'cuda', 'cpu', ...). Pure arithmetic on what it is
    given: nothing is built or measured here.

    ``peak`` is the device's peak for the run's precision; ``config.peak_tflops`` (``--peak-tflops``) overrides
    it, as it does for MFU. ``bandwidth`` answers the collectives' bus bandwidth
    (:func:`accelbench.estimate.comm.load_bus_bandwidth`); without it communication time is unknown, and so is
    the step time of a multi-device run. ``runtime_bytes`` is memory the process holds before the model (the CPU
    backend's resident-set peak counts the interpreter and its libraries).
    """
    flops, source = (peak.flops_per_s, peak.source) if peak is not None else (None, None)
    if config.peak_tflops is not None:
        flops, source = config.peak_tflops * 1e12, "user (--peak-tflops)"
    hardware = Hardware(
        name=device.name if device is not None else device_type,
        device_type=device_type,
        memory_bytes=device.memory_bytes if device is not None else None,
        peak_flops_per_s=flops,
        peak_source=source,
        memory_bandwidth_bytes_per_s=peak.memory_bandwidth_bytes_per_s if peak is not None else None,
        bandwidth=bandwidth,
        devices_per_node=config.devices,
    )
    return predict_step(
        facts,
        run_shape(config),
        hardware,
        efficiency=efficiency,
        overlap=overlap,
        runtime_bytes=runtime_bytes,
    )


def predict_scaling(
    config: RunConfig,
    facts: WorkloadFacts,
    devices_to: int,
    *,
    measured_step_s: float | None = None,
    device_type: str,
    device: DeviceInfo | None = None,
    peak: PeakFigures | None = None,
    bandwidth: Bandwidth | None = None,
    efficiency: float = DEFAULT_EFFICIENCY,
    overlap: Overlap = "auto",
) -> ScalingPrediction:
    """Seed 001's speedup of ``config`` (at its g devices) to ``devices_to`` = n devices, same per-device batch.

    The step at g is ``measured_step_s`` (a record's, or a profile's) when given, else the predicted one; its
    exposed communication, and that at n, are predicted (bus bytes over the bus bandwidth at each size), so
    ``bandwidth`` is needed whenever either has collectives. A ``single`` run scales as ``ddp``.
    """
    if config.mesh is not None:
        raise ConfigError(
            "--scale-to models data parallelism; for tp/pp/mesh give each layout to estimate instead"
        )
    if config.nnodes > 1 and devices_to % config.nnodes:
        raise ConfigError(f"--scale-to {devices_to}: not a multiple of --nnodes {config.nnodes}")
    strategy = "ddp" if config.strategy == "single" and devices_to > 1 else config.strategy
    wider = config.model_copy(update={"devices": devices_to // config.nnodes, "strategy": strategy})
    at_g, at_n = (
        predict(
            c,
            facts,
            device_type=device_type,
            device=device,
            peak=peak,
            bandwidth=bandwidth,
            efficiency=efficiency,
            overlap=overlap,
        )
        for c in (config, wider)
    )
    if at_g.comm_exposed_s is None or at_n.comm_exposed_s is None:
        raise ConfigError(
            "--scale-to needs the collectives' bus bandwidth at both device counts: give --comm RECORDS or "
            "--bus-bandwidth GB/s"
        )
    step = measured_step_s if measured_step_s is not None else at_g.step_time_s
    if step is None:
        raise ConfigError(
            "--scale-to needs a step time at the starting device count: a peak FLOP/s (--peak-tflops, --device, "
            "--measure-peak) or a measured step (--measured RECORD)"
        )
    config_devices = config.devices * config.nnodes
    return predict_speedup(
        step, min(at_g.comm_exposed_s, step), config_devices, devices_to, at_n.comm_exposed_s
    )
