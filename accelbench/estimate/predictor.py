"""The prediction for a run configuration: what the runner calls and ``accelbench estimate`` prints.

:func:`predict` takes the run's :class:`~accelbench.config.RunConfig` (resolved: the workload's options filled in),
the workload's :class:`~accelbench.estimate.facts.WorkloadFacts` (:func:`accelbench.estimate.facts.facts_of` on the
job the runner built, or :func:`~accelbench.estimate.facts.meta_facts` without building anything real), and what is
known of the device: its :class:`~accelbench.devices.DeviceInfo` (name, memory), its peak figures (vendor table,
measured, or ``--peak-tflops``) and the collectives' bus bandwidth.

:func:`predict_step` is the analytical model's whole-run entry, pure arithmetic (no torch): what a workload is
(:class:`~accelbench.estimate.facts.WorkloadFacts`), how it is spread (:class:`~accelbench.estimate.shape.RunShape`)
and what the hardware can do (:class:`~accelbench.estimate.hardware.Hardware`) become a
:class:`~accelbench.estimate.schema.Prediction`: memory per device by kind and communication per device per step by
collective (:mod:`~accelbench.estimate.strategies`, with :mod:`~accelbench.estimate.state` and
:mod:`~accelbench.estimate.activations`), FLOPs and the step time (:mod:`~accelbench.estimate.step_time`). Every
formula says where it comes from; docs/estimate.md has them all, with their sources and where they miss.
Conventions:

- Communication is counted in nccl-tests' *bus bytes* per device (nccl-tests' doc/PERFORMANCE.md): an all-reduce of S
  bytes over p ranks moves ``2 (p-1)/p S``, an all-gather or reduce-scatter whose whole array is S moves
  ``(p-1)/p S``, a broadcast, reduce or point-to-point send ``S``. Its time is those bytes over the bus bandwidth
  (busbw) the same convention measures, so a figure from ``nccl-tests`` or ``accelbench comm`` plugs in directly.
  Seed 001's table (AllReduce ``4(1-1/p)P`` for P parameters of 2 bytes) is the same count.
- FLOPs are the workload's own formula (the GPT's ``6N + 12 l d s`` per token); Megatron-LM's count is reported
  beside it for transformers, in both forms: without activation recomputation (``72 B s l h^2 (1 + s/6h + V/12lh)``,
  what accelbench's runs compute) and with full recomputation, seed 002's ``96 B s l h^2 (1 + s/6h + V/16lh)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accelbench.config import RunConfig
from accelbench.contract.strategies import Strategy
from accelbench.errors import ConfigError
from accelbench.estimate.arguments import DEFAULT_EFFICIENCY
from accelbench.estimate.facts import WorkloadFacts
from accelbench.estimate.hardware import Bandwidth, Hardware
from accelbench.estimate.notes import Notes
from accelbench.estimate.scaling import predict_speedup
from accelbench.estimate.schema import (
    MEGATRON_NO_RECOMPUTE,
    MEGATRON_RECOMPUTE,
    Prediction,
    ScalingPrediction,
)
from accelbench.estimate.shape import MODEL_PARALLEL, STRATEGIES, RunShape, model_ranks
from accelbench.estimate.stack import Stack, run_stack
from accelbench.estimate.state import state_bytes
from accelbench.estimate.step_time import (
    Overlap,
    calibrated_times,
    compute_time,
    engine_time,
    exposed_comm,
    host_bound,
    in_step_comm,
    optimizer_time,
    oversubscription,
    time_comm,
)
from accelbench.estimate.strategies import (
    data_parallel_breakdown,
    expert_parallel_breakdown,
    expert_pipeline_breakdown,
    model_parallel_breakdown,
)
from accelbench.parallel_dims import ParallelDims

if TYPE_CHECKING:
    from accelbench.contract import DeviceInfo, PeakFigures
    from accelbench.estimate.calibration import Calibration
    from accelbench.estimate.operators import StepOperators


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


def predict_step(
    facts: WorkloadFacts,
    layout: RunShape,
    hardware: Hardware,
    *,
    efficiency: float = DEFAULT_EFFICIENCY,
    overlap: Overlap = "auto",
    runtime_bytes: float = 0.0,
    stack: Stack | None = None,
    calibration: Calibration | None = None,
    operators: StepOperators | None = None,
) -> Prediction:
    """The prediction for one configuration on one kind of device (see the module's docstring for conventions).

    ``stack`` describes the implementation where training stacks differ (:class:`~accelbench.estimate.stack.Stack`:
    attention kernel, optimizer kernels, DDP's bucket view, DeepSpeed's buckets, FSDP's parameter dtype, activation
    checkpointing); by default what ``accelbench run`` does on the device type. The prediction records it.

    With a ``calibration`` of the device and the step's traced ``operators`` the compute and optimizer times are
    the calibrated ones (:func:`~accelbench.estimate.step_time.calibrated_times`); without, FLOPs over the peak
    at ``efficiency`` and AdamW's streamed bytes over the memory bandwidth.

    ``overlap``: ``none`` (every collective exposed, seed 001's ``t_compute + t_comm``), ``backward`` (the
    collectives the engine overlaps hide behind compute), ``auto`` (``backward`` on accelerators, ``none`` on CPUs,
    where the collectives run on the same cores as the compute). ``runtime_bytes`` is added to the memory as what
    the process holds before the model.
    """
    if layout.strategy not in STRATEGIES:
        raise ConfigError(
            f"accelbench estimate has no model for strategy {layout.strategy!r}; it models: {', '.join(STRATEGIES)}"
        )
    if not 0.0 < efficiency <= 1.0:
        raise ConfigError(
            f"--efficiency {efficiency}: give a fraction of the peak above 0 and at most 1, e.g. 0.4"
        )
    if layout.strategy == Strategy.SINGLE and layout.devices > 1:
        raise ConfigError(
            f"strategy 'single' trains on one device, but {layout.devices} were asked for; choose ddp, fsdp, "
            "deepspeed-zero1/2/3, tp, pp or mesh"
        )
    if layout.batch_size % layout.grad_accum:
        raise ConfigError(
            f"--batch-size {layout.batch_size} is not divisible by --grad-accum {layout.grad_accum}"
        )
    notes = Notes()
    stack = stack or Stack()
    state = state_bytes(layout.precision, layout.strategy)
    keeps_scores = stack.keeps_scores(hardware.device_type, facts.dropout)
    bubble: float | None
    if layout.dims.ep > 1 and (layout.dims.pipelined or layout.dims.tp > 1):
        # each ep rank's pipeline, or tensor-parallel group, a replica on its own batch
        memory, comm, flops, bubble = expert_pipeline_breakdown(
            facts, layout, state, keeps_scores, notes, device_type=hardware.device_type, stack=stack
        )
    elif layout.dims.ep > 1:  # each rank its own batch through 1/ep of the experts: FLOPs per device as DDP's
        memory, comm = expert_parallel_breakdown(facts, layout, state, keeps_scores, hardware, notes, stack)
        flops, bubble = facts.flops_per_sample * layout.batch_size, 0.0
    elif layout.strategy in MODEL_PARALLEL:
        memory, comm, flops, bubble = model_parallel_breakdown(
            facts, layout, state, keeps_scores, notes, device_type=hardware.device_type, stack=stack
        )
    else:
        memory, comm = data_parallel_breakdown(facts, layout, state, keeps_scores, hardware, notes, stack)
        flops, bubble = facts.flops_per_sample * layout.batch_size, 0.0
    if stack.activation_checkpointing and facts.megatron_flops_per_sample:
        # one more forward pass of the layers: Megatron's count with recomputation over the one without
        recomputed = facts.megatron_recompute_flops_per_sample or facts.megatron_flops_per_sample
        flops *= recomputed / facts.megatron_flops_per_sample
        notes.assume(
            "activation checkpointing recomputes each layer's forward in backward: FLOPs x "
            f"{recomputed / facts.megatron_flops_per_sample:.3f} (Megatron's counts)"
        )
    memory = memory.model_copy(update={"runtime_bytes": float(runtime_bytes)})
    if runtime_bytes:
        notes.assume(f"runtime held before the model: {runtime_bytes / 2**20:.0f} MiB (given)")
    megatron, recompute = (
        flops * layout.batch_size / model_ranks(layout) if flops else None
        for flops in (facts.megatron_flops_per_sample, facts.megatron_recompute_flops_per_sample)
    )
    notes.cite(f"FLOPs: the workload's formula, {facts.flops_formula}")
    if megatron:
        notes.cite(f"Megatron-LM FLOPs without activation recomputation: {MEGATRON_NO_RECOMPUTE}")
    if recompute:
        notes.cite(f"Megatron-LM FLOPs with full activation recomputation: {MEGATRON_RECOMPUTE}")
    total = memory.total_bytes
    fits = _fits(total, hardware, notes)
    comm = time_comm(comm, hardware, notes)
    phases = calibrated_times(operators, calibration, layout, notes) if calibration and operators else None
    stretch = oversubscription(hardware, calibration, notes) if phases is not None else 1.0
    if phases is not None and stretch != 1.0:
        phases = phases.stretched(stretch)
    if phases is not None:
        compute_s: float | None = (phases.forward_s + phases.backward_s) / (1.0 - bubble if bubble else 1.0)
        optimizer_s: float | None = phases.optimizer_s
        time_model = phases.description
    else:
        compute_s = compute_time(flops, hardware, efficiency, bubble, notes)
        optimizer_s = optimizer_time(facts, layout, state, hardware, notes)
        time_model = (
            f"efficiency {efficiency:g} of the peak FLOP/s; AdamW's streamed bytes over the memory bandwidth"
        )
    comm = in_step_comm(comm, compute_s, optimizer_s, overlap, hardware, notes)
    comm_s = None if any(op.time_s is None for op in comm) else sum(op.time_s or 0.0 for op in comm)
    overlap_text, exposed = exposed_comm(comm, comm_s, compute_s, overlap, hardware, notes)
    engine_s = engine_time(facts, layout, hardware, calibration, notes) if phases is not None else None
    if engine_s is not None:
        engine_s *= stretch
        if hardware.device_type != "cpu" and phases is not None and compute_s is not None:
            engine_s = host_bound(compute_s + (optimizer_s or 0.0), phases.dispatch_s, engine_s, notes)
    step = None
    if compute_s is not None and exposed is not None:
        step = compute_s + (optimizer_s or 0.0) + exposed + (engine_s or 0.0)
    replicas = layout.devices // model_ranks(layout)
    samples = layout.batch_size * replicas / step if step else None
    device_text = hardware.name + (f" ({hardware.peak_source})" if hardware.peak_source else "")
    return Prediction(
        workload=facts.workload,
        model=facts.model,
        strategy=layout.strategy,
        precision=layout.precision,
        devices=layout.devices,
        batch_size=layout.batch_size,
        device=device_text,
        device_memory_bytes=hardware.memory_bytes,
        parameters=facts.parameters,
        stored_parameters=facts.stored_parameters,
        active_parameters=facts.active_parameters,
        expert_parameters=facts.expert_parameters,
        flops_per_step=flops,
        flops_formula=facts.flops_formula,
        megatron_flops_per_step=megatron,
        megatron_recompute_flops_per_step=recompute,
        memory=memory,
        peak_memory_bytes=total,
        phase_bytes=memory.phases(),
        peak_phase=memory.peak_phase,
        stack=stack.described(hardware.device_type, facts.dropout),
        fits=fits,
        sharing_memory=hardware.devices_per_node if hardware.device_type == "cpu" else 1,
        comm=comm,
        comm_bytes_per_step=sum(op.bus_bytes for op in comm),
        peak_flops_per_s=hardware.peak_flops_per_s,
        peak_source=hardware.peak_source,
        efficiency=efficiency,
        compute_s=compute_s,
        optimizer_s=optimizer_s,
        time_model=time_model,
        forward_s=phases.forward_s if phases else None,
        backward_s=phases.backward_s if phases else None,
        dispatch_s=phases.dispatch_s if phases else None,
        engine_s=engine_s,
        comm_s=comm_s,
        comm_exposed_s=exposed,
        overlap=overlap_text,
        step_time_s=step,
        samples_per_s=samples,
        bubble=bubble,
        assumptions=notes.assumptions,
        sources=notes.sources,
    )


def _fits(total: float | None, hardware: Hardware, notes: Notes) -> bool | None:
    if total is None or hardware.memory_bytes is None:
        return None
    if hardware.device_type == "cpu":  # the worker processes of a node share its memory
        notes.assume(
            f"a CPU device is a process: the node's {hardware.devices_per_node} process(es) share its "
            f"{hardware.memory_bytes / 2**30:.1f} GiB"
        )
        return total * hardware.devices_per_node <= hardware.memory_bytes
    return total <= hardware.memory_bytes


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
    stack: Stack | None = None,
    calibration: Calibration | None = None,
    operators: StepOperators | None = None,
) -> Prediction:
    """Predicted step time, peak memory per device (with its breakdown), communication per device per step and
    FLOPs for ``config`` on ``device`` (of ``device_type``: 'cuda', 'cpu', ...). Pure arithmetic on what it is
    given: nothing is built or measured here.

    ``peak`` is the device's peak for the run's precision; ``config.peak_tflops`` (``--peak-tflops``) overrides
    it, as it does for MFU. ``bandwidth`` answers the collectives' bus bandwidth
    (:func:`accelbench.estimate.comm.load_bus_bandwidth`); without it communication time is unknown, and so is
    the step time of a multi-device run. ``runtime_bytes`` is memory the process holds before the model (the CPU
    backend's resident-set peak counts the interpreter and its libraries). ``calibration`` and ``operators``
    (both, or neither): the calibrated step time (:func:`predict_step`).
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
        stack=stack or run_stack(config.engine, config.activation_checkpointing),
        calibration=calibration,
        operators=operators,
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
    calibration: Calibration | None = None,
    operators: StepOperators | None = None,
) -> ScalingPrediction:
    """Seed 001's speedup of ``config`` (at its g devices) to ``devices_to`` = n devices, same per-device batch.

    The step at g is ``measured_step_s`` (a record's, or a profile's) when given, else the predicted one: with a
    ``calibration`` of the device and the step's traced ``operators`` (both, or neither) the calibrated compute and
    optimizer times, as :func:`predict` gives them, else FLOPs at ``efficiency`` of the peak. Its exposed
    communication, and that at n, are predicted (bus bytes over the bus bandwidth at each size), so ``bandwidth`` is
    needed whenever either has collectives. A ``single`` run scales as ``ddp``. The result says which time model
    gave the step (``time_model``).
    """
    if config.mesh is not None:
        raise ConfigError(
            "--scale-to models data parallelism; for tp/pp/mesh give each layout to estimate instead"
        )
    if config.nnodes > 1 and devices_to % config.nnodes:
        raise ConfigError(f"--scale-to {devices_to}: not a multiple of --nnodes {config.nnodes}")
    strategy = (
        Strategy.DDP.value if config.strategy == Strategy.SINGLE and devices_to > 1 else config.strategy
    )
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
            calibration=calibration,
            operators=operators,
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
    speedup = predict_speedup(
        step, min(at_g.comm_exposed_s, step), config_devices, devices_to, at_n.comm_exposed_s
    )
    time_model = "measured step (--measured)" if measured_step_s is not None else at_g.time_model
    return speedup.model_copy(update={"time_model": time_model})
