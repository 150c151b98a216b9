"""A step's time: compute at a fraction of the peak (and the pipeline bubble), AdamW's memory-bound update, each
collective's bus bytes over its bus bandwidth, and the part of the communication not hidden behind compute.

With a :class:`~accelbench.estimate.calibration.Calibration` of the device and the step's traced operators
(:mod:`accelbench.estimate.operators`), :func:`calibrated_times` replaces the first two: each operator's roofline
time at the rates measured on this device, plus its dispatch cost, by phase."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from accelbench.estimate.calibration import MATMUL_SIZES, Calibration
from accelbench.estimate.engine_cost import Zero3Hooks
from accelbench.estimate.facts import WorkloadFacts
from accelbench.estimate.hardware import Hardware
from accelbench.estimate.notes import Notes
from accelbench.estimate.operators import PHASES, Operator, StepOperators
from accelbench.estimate.schema import CommOp
from accelbench.estimate.shape import MODEL_PARALLEL, SHARDED_OPTIMIZER, RunShape
from accelbench.estimate.state import StateBytes

Overlap = Literal["none", "backward", "auto"]


def time_comm(comm: Sequence[CommOp], hardware: Hardware, notes: Notes) -> list[CommOp]:
    """Each collective with its time: its bus bytes over the bus bandwidth at its message size; a burst of calls
    issued back to back (ZeRO-3's persistent gathers), at a call's time in a burst where the comm records measured
    one (``accelbench comm --burst``)."""
    timed = []
    for op in comm:
        found = (
            hardware.bandwidth.lookup(op.op, op.ranks, op.message_bytes, op.dtype)
            if hardware.bandwidth
            else None
        )
        if found is not None:
            busbw, where = found
            update: dict[str, object] = {"busbw_bytes_per_s": busbw, "time_s": op.bus_bytes / busbw,
                                         "bandwidth_source": where}  # fmt: skip
            burst = (
                hardware.bandwidth.lookup_burst(op.op, op.ranks, op.message_bytes, op.dtype)
                if op.burst and op.count > 1 and hardware.bandwidth
                else None
            )
            if burst is not None:
                per_call, where = burst
                update |= {"time_s": per_call * op.count, "bandwidth_source": where}
            op = op.model_copy(update=update)
        timed.append(op)
    missing = sorted({op.op for op in timed if op.time_s is None})
    if missing:
        notes.assume(
            f"no bus bandwidth for {', '.join(missing)}: communication time unknown (give --comm RECORDS or "
            "--bus-bandwidth GB/s)"
        )
    return timed


def in_step_comm(
    comm: Sequence[CommOp],
    compute_s: float | None,
    optimizer_s: float | None,
    overlap: Overlap,
    hardware: Hardware,
    notes: Notes,
) -> list[CommOp]:
    """Where every collective is exposed (``overlap`` none: a CPU's), each priced as a step meets it, where the
    comm records measured that (``accelbench comm --in-step``): a call after its share of the step's compute
    (forward, backward and the optimizer over the step's calls, a burst counted as one call), the wait for the
    slower rank included, in place of its bus bytes over the bus bandwidth of calls timed alone. Of a burst (calls
    issued back to back) only the first call meets the step; the others cost what a call in a burst costs where the
    comm records measured that (``accelbench comm --burst``), else what they cost timed alone."""
    if (
        not comm
        or compute_s is None
        or hardware.bandwidth is None
        or overlap_mode(overlap, hardware) != "none"
    ):
        return list(comm)
    calls = sum(1 if op.burst else op.count for op in comm)
    segment = (compute_s + (optimizer_s or 0.0)) / max(1, calls)
    timed, priced = [], 0
    for op in comm:
        found = hardware.bandwidth.lookup_in_step(op.op, op.ranks, op.message_bytes, op.dtype, segment)
        if found is not None:
            per_call, where = found
            seconds = per_call * op.count
            if op.burst and op.time_s is not None and op.count > 1:
                seconds = per_call + op.time_s * (op.count - 1) / op.count
                # time_comm priced them as a burst where the records timed bursts, else as calls alone
                burst = hardware.bandwidth.lookup_burst(op.op, op.ranks, op.message_bytes, op.dtype)
                where += f"; the {op.count - 1} calls after it back to back, " + (
                    f"as a burst: {op.bandwidth_source}" if burst is not None else "as timed alone"
                )
            op = op.model_copy(update={"time_s": seconds, "bandwidth_source": f"in step: {where}"})
            priced += 1
        timed.append(op)
    if priced:
        notes.assume(
            f"collectives priced as a step meets them ({priced} of {len(comm)} kinds, accelbench comm --in-step): "
            f"each call after {segment * 1e3:.3g} ms of compute (the step's over its {calls} calls), the wait for "
            "the slower rank included"
        )
    return timed


def oversubscription(hardware: Hardware, calibration: Calibration | None, notes: Notes) -> float:
    """How many times longer a rank's work on the CPU takes when a CPU node's worker processes, at the
    calibration's threads each, ask for more threads than the cores the calibration found usable: busy threads
    over cores (each thread gets that share of one), else 1. The calibration measured one process with those cores
    to itself; the runner warns of such a run, and its record says the host was contended."""
    if (
        hardware.device_type != "cpu"
        or calibration is None
        or not calibration.threads
        or not calibration.cores
    ):
        return 1.0
    busy = hardware.devices_per_node * calibration.threads
    if busy <= calibration.cores:
        return 1.0
    factor = busy / calibration.cores
    notes.assume(
        f"{hardware.devices_per_node} worker processes x {calibration.threads} thread(s) on {calibration.cores} "
        f"usable core(s): each rank's compute, optimizer and engine work take {factor:.3g}x their calibrated "
        "time (each thread a share of a core)"
    )
    return factor


def engine_time(
    facts: WorkloadFacts,
    layout: RunShape,
    hardware: Hardware,
    calibration: Calibration | None,
    notes: Notes,
) -> float | None:
    """An engine's cost beyond the traced operators and the collectives, where the calibration carries this host's
    (:mod:`accelbench.estimate.engine_cost`): DeepSpeed ZeRO-3's per module and per parameter tensor for each
    micro-batch (its hooks and gradient partitioning run in each forward and backward), per step once; FSDP2's per
    unit (each wrapped unit and the root) and per parameter tensor for each micro-batch, per step once, on the
    strategy or a mesh's FSDP data axis. A pipeline rank of such a mesh shards what it holds: its share of the units
    (the replica's divided evenly over the stages, as its operators are) and a root for each of its stages, their
    hooks run for each of the step's microbatches, and its share of the tensors once (torch's pipeline stage keeps
    FSDP's gradient sync off until the last microbatch's backward and reduce-scatters then, ``perform_reduce_grad``).
    On a CPU the cores run the hooks and the operators in turn: the cost adds to the step. An accelerator's host runs
    them beside its dispatching while the device works: the step is then the longer of the device's work and the
    host's (:func:`host_bound`)."""
    if calibration is None:
        return None
    dims, tensors = layout.dims, float(len(facts.tensor_sizes))
    module_repeats = tensor_repeats = layout.grad_accum
    repeated = f" x {layout.grad_accum} micro-batches" if layout.grad_accum > 1 else ""
    hooks: Zero3Hooks
    if layout.strategy == "deepspeed-zero3" and calibration.zero3_hooks is not None:
        hooks, modules = calibration.zero3_hooks, float(facts.modules)
        engine, parts = "DeepSpeed ZeRO-3's", f"{facts.modules} modules"
        doing = "module hooks, per-tensor gradient partitioning"
    elif calibration.fsdp_hooks is not None and (
        layout.strategy == "fsdp" or (dims.data_parallel == "fsdp" and dims.dp > 1)
    ):
        hooks, units = calibration.fsdp_hooks, len(facts.unit_parameters)
        engine = "FSDP2's"
        doing = (
            "each unit's gathers and reshards, its DTensor parameters through the clipping and the optimizer"
        )
        if layout.strategy == "mesh" and dims.pipelined:
            modules, tensors = units / dims.pp + dims.virtual_stages, tensors / dims.pp
            module_repeats, tensor_repeats = dims.microbatches, 1
            parts = (
                f"{modules:.3g} FSDP units a rank ({units} over {dims.pp} pipeline ranks, {dims.virtual_stages} "
                f"root(s)) x {dims.microbatches} microbatches"
            )
            repeated = " once"
        else:
            modules = float(units + 1)
            parts = f"{units + 1} FSDP units (the root among them)"
    else:
        return None
    seconds = (
        modules * hooks.per_module_s * module_repeats
        + tensors * hooks.per_tensor_s * tensor_repeats
        + hooks.per_step_s
    )
    notes.assume(
        f"{engine} engine ({doing}): {seconds * 1e3:.3g} ms a step for {parts} and "
        f"{round(tensors) if tensors.is_integer() else f'{tensors:.3g}'} parameter tensors{repeated}, at "
        f"{hooks.describe()}"
        + ("" if hardware.device_type == "cpu" else ", on the host beside its dispatching")
    )
    return seconds


def host_bound(device_s: float, dispatch_s: float, engine_s: float, notes: Notes) -> float:
    """What an accelerator's step adds for an engine's host cost ``engine_s``: the host's timeline (its operators'
    dispatch and the engine's hooks) past the device's work, or nothing where the device is the longer."""
    host = dispatch_s + engine_s
    added = max(0.0, host - device_s)
    notes.assume(
        f"the host's timeline (dispatch {dispatch_s * 1e3:.3g} ms + the engine's hooks {engine_s * 1e3:.3g} ms) "
        + (
            f"outlasts the device's work ({device_s * 1e3:.3g} ms): the step waits {added * 1e3:.3g} ms for the host"
            if added
            else f"stays within the device's work ({device_s * 1e3:.3g} ms): the hooks cost the step nothing"
        )
    )
    return added


def overlap_mode(overlap: Overlap, hardware: Hardware) -> Literal["none", "backward"]:
    """``auto`` resolved: ``none`` on a CPU (gloo runs on the cores that compute), ``backward`` elsewhere."""
    if overlap == "auto":
        return "none" if hardware.device_type == "cpu" else "backward"
    return overlap


def compute_time(
    flops: float, hardware: Hardware, efficiency: float, bubble: float | None, notes: Notes
) -> float | None:
    if not hardware.peak_flops_per_s:
        notes.assume(
            "no peak FLOP/s for this device and precision: compute time unknown (give --peak-tflops, --device "
            "NAME or --measure-peak)"
        )
        return None
    seconds = flops / (hardware.peak_flops_per_s * efficiency)
    notes.assume(
        f"compute at {efficiency:.0%} of the peak FLOP/s ({hardware.peak_flops_per_s / 1e12:g} TFLOP/s, "
        f"{hardware.peak_source})"
    )
    if bubble:
        seconds /= 1.0 - bubble
        notes.assume(f"pipeline bubble {bubble:.1%} of a step: (p-1)/(v m + p-1)")
    return seconds


def optimizer_time(
    facts: WorkloadFacts, layout: RunShape, state: StateBytes, hardware: Hardware, notes: Notes
) -> float | None:
    """AdamW's update is memory-bound: it reads the weights, gradients and two moments and writes the weights and
    moments back, for the parameters this device updates (its shard from ZeRO-1 and FSDP on)."""
    bandwidth = hardware.memory_bandwidth_bytes_per_s
    if not bandwidth:
        notes.assume("optimizer step time left out: the device's memory bandwidth is unknown")
        return None
    p = layout.devices
    updated = float(facts.stored_parameters)
    if layout.strategy in SHARDED_OPTIMIZER:
        updated /= p
    elif layout.strategy in MODEL_PARALLEL:
        dims = layout.dims
        updated /= dims.model_parallel * (dims.dp if dims.shards_parameters else 1)
    master = state.master or state.param
    streamed = updated * (2 * master + max(state.grad, state.reduction) + 2 * state.optimizer)
    notes.assume(
        f"AdamW update: {streamed / max(updated, 1):.0f} bytes streamed per parameter at "
        f"{bandwidth / 1e9:g} GB/s memory bandwidth"
    )
    return streamed / bandwidth


def exposed_comm(
    comm: Sequence[CommOp],
    comm_s: float | None,
    compute_s: float | None,
    overlap: Overlap,
    hardware: Hardware,
    notes: Notes,
) -> tuple[str, float | None]:
    if not comm:
        return "nothing to communicate", 0.0
    if comm_s is None:
        return "unknown (no bandwidth)", None
    mode = overlap_mode(overlap, hardware)
    if mode == "none" or compute_s is None:
        text = "none: every collective is exposed (t_compute + t_comm, seed 001)"
        if overlap == "auto":
            text += "; on a CPU the collectives (gloo) run on the cores that compute"
        return text, comm_s
    hidden_budget = (
        compute_s * 2.0 / 3.0
    )  # backward is two thirds of a step's FLOPs (6N: 2N forward, 4N backward)
    overlappable = sum(op.time_s or 0.0 for op in comm if op.overlappable)
    hidden = min(overlappable, hidden_budget)
    notes.assume(
        "collectives the engine overlaps (DDP's buckets, FSDP and ZeRO-3 prefetch) hide behind the backward "
        "pass, up to 2/3 of the compute time; the others (ZeRO-1/2's, tensor and pipeline parallelism's) are exposed"
    )
    return "backward: overlappable collectives hidden behind backward compute", comm_s - hidden


def operator_seconds(op: Operator, calibration: Calibration, device_type: str) -> tuple[float, float]:
    """One call of ``op`` at the calibrated rates: its work (the roofline) and its dispatch, in seconds. A marker of
    DTensor's dispatch does no work and costs the host's DTensor dispatch cost, where the calibration carries it
    (else an operator's dispatch)."""
    if op.distributed and calibration.dtensor_dispatch is not None:
        return 0.0, calibration.dtensor_dispatch.per_operator_s
    work = op.bytes_moved / calibration.stream_rate(op.bytes_moved) if op.bytes_moved else 0.0
    elementwise = calibration.elementwise_rate(op.name, op.strided, op.elements)
    if elementwise and op.elements:  # random numbers, exp, norms, masks: arithmetic, not memory, bounds them
        work = max(work, op.elements / elementwise)
    if op.flops:
        shape = op.matmul
        # a CPU runs a batched product's products one after another, each at its own size's rate; an accelerator
        # runs them as one kernel over all its cores (a batched GEMM, a fused attention kernel), as fast as one
        # product of the same work: the batch stacked along m
        rate = (
            calibration.matmul_rate(
                shape.m if device_type == "cpu" else shape.m * shape.batch, shape.n, shape.k, op.dtype
            )
            if shape is not None
            else calibration.matmul_rate(MATMUL_SIZES[-1], MATMUL_SIZES[-1], MATMUL_SIZES[-1], op.dtype)
        )
        work = max(work, op.flops / rate)
        if op.name == "addmm" and device_type == "cpu" and shape is not None:
            # the CPU's addmm first copies the broadcast bias into its output, then accumulates the product
            # there: one more pass over the output, besides the product
            out = shape.m * shape.n * shape.batch
            work += out * _itemsize(op.dtype) * 2 / calibration.stream_rate(out * 8)
    if calibration.step_dispatch_s is not None and op.phase != "optimizer":
        dispatch = calibration.step_dispatch_s  # an operator's cost within a step, beyond its work
    else:
        dispatch = calibration.autograd_dispatch_s if op.autograd else calibration.dispatch_s
    return work, dispatch


@dataclass(frozen=True)
class CalibratedTimes:
    """One step's compute by phase, from the calibrated rates (:func:`calibrated_times`), per device."""

    forward_s: float
    backward_s: float
    optimizer_s: float
    dispatch_s: float
    operators: int
    description: str

    def stretched(self, factor: float) -> CalibratedTimes:
        """The same phases ``factor`` times longer (:func:`oversubscription`)."""
        return replace(
            self,
            forward_s=self.forward_s * factor,
            backward_s=self.backward_s * factor,
            optimizer_s=self.optimizer_s * factor,
            dispatch_s=self.dispatch_s * factor,
            description=f"{self.description}; x {factor:.3g} for threads beyond the cores",
        )


def calibrated_times(
    operators: StepOperators, calibration: Calibration, layout: RunShape, notes: Notes
) -> CalibratedTimes:
    """Each operator's roofline time at the calibrated rates plus its dispatch (:func:`operator_seconds`; in
    forward and backward the cost of an operator within a training step, where the calibration measured it),
    summed by phase: a matrix multiply takes ``max(FLOPs / rate(m, n, k, dtype), bytes / bandwidth(bytes))``,
    the kinds the calibration times by the element (random numbers, softmax, exp-like activations, norms, masks,
    copies of a permuted tensor) ``max(elements / their rate, bytes / bandwidth)``, other work
    ``bytes / bandwidth`` (elementwise and normalisation work is bound by memory), a view only its dispatch; forward
    and backward count once per micro-batch. On a CPU a batched product (attention's) runs its products one by one,
    each at the rate of its own ``m x n x k``, and the CPU's ``addmm`` adds a pass writing the bias into its output;
    a phase is its operators' work plus their dispatch. On an accelerator a batched product runs at the rate of one
    product of its whole work (``batch * m x n x k``), and a phase takes the longer of its operators' work and their
    dispatch, which the host does while the device works. A step traced as one tensor-parallel rank runs it
    (:attr:`StepOperators.tensor_parallel`) is that rank's, DTensor's dispatch priced at the host's cost per DTensor
    operator and once a step, where the calibration carries it; otherwise (pipeline stages, or a tp layout traced
    whole) the replica's operators are divided evenly over its model-parallel ranks."""
    # A CPU runs each operator as it is dispatched: a phase takes its operators' work and dispatch one after the
    # other. An accelerator's operators are queued by the host and run while it dispatches the next: a phase takes
    # the longer of the two, its device work or its host's dispatching (an eager step of a small model is bound by
    # its launches; a large one by its kernels).
    queued = operators.device_type != "cpu"
    work_by_phase = {phase: 0.0 for phase in PHASES}
    dispatch_by_phase = {phase: 0.0 for phase in PHASES}
    measured = dict(operators.measured_s)
    by_name: dict[
        str, float
    ] = {}  # calibrated seconds per step of the profiled operators, forward and backward
    times = []
    # the optimizer phase's host cost, measured whole (clipping, AdamW's step, zero_grad), in place of its
    # operators' dispatch, where the calibration has it for these kernels
    host_optimizer = calibration.optimizer_phase.get(operators.optimizer_kernels)
    for op in operators.operators:
        work, dispatch = operator_seconds(op, calibration, operators.device_type)
        if op.phase == "optimizer" and host_optimizer is not None:
            dispatch = 0.0
        repeat = operators.micro_batches if op.phase != "optimizer" else 1
        # what a profile's kernel time replaces: the device work where the host's dispatch runs beside it
        own = work * repeat if queued else (work + dispatch) * repeat
        times.append((op, own, dispatch * repeat))
        if op.name in measured and op.phase != "optimizer":
            by_name[op.name] = by_name.get(op.name, 0.0) + own
    for op, seconds, dispatch in times:
        if op.name in by_name and op.phase != "optimizer" and by_name[op.name] > 0:
            seconds *= (
                measured[op.name] / by_name[op.name]
            )  # the profile's time, shared as the calibration shares it
        work_by_phase[op.phase] += seconds
        dispatch_by_phase[op.phase] += dispatch
    if host_optimizer is not None:
        host = host_optimizer.seconds(operators.parameter_tensors)
        if not queued:  # a CPU pays it between its operators; an accelerator's host while the device works
            work_by_phase["optimizer"] += host
        dispatch_by_phase["optimizer"] += host
        notes.assume(
            f"the optimizer phase's host cost (clipping, AdamW's {operators.optimizer_kernels} step, zero_grad; "
            f"measured after a backward, caches cold): {host * 1e3:.3g} ms for {operators.parameter_tensors} "
            f"parameter tensors, at {host_optimizer.describe()}"
        )
    dispatch_total = sum(dispatch_by_phase.values())
    phases = {
        phase: max(work_by_phase[phase], dispatch_by_phase[phase]) if queued else work_by_phase[phase]
        for phase in PHASES
    }
    if by_name:
        notes.assume(
            f"measured times from {operators.measured_source} replace the calibrated ones for "
            f"{', '.join(sorted(by_name))} (forward and backward; the profiler's own overhead included)"
        )
    share = 1.0
    traced_tp = operators.tensor_parallel
    if traced_tp > 1:
        markers = sum(1 for op in operators.operators if op.distributed)
        cost = calibration.dtensor_dispatch
        if cost is not None:
            phases["optimizer"] += cost.per_step_s
            dispatch_total += cost.per_step_s
        notes.assume(
            f"calibrated compute of a tensor-parallel rank as it runs (its DTensor styles over a fake process group "
            f"of {traced_tp}): its own matmuls, the stem and head whole, and {markers} operators through DTensor's "
            "dispatch"
            + (f", at {cost.describe()}" if cost is not None else ", at an operator's dispatch cost (DTensor's was "
               "not measured)")
        )  # fmt: skip
    if operators.whole_replica:
        notes.assume(operators.whole_replica)
    if layout.strategy in MODEL_PARALLEL and layout.dims.model_parallel > traced_tp:
        rest = layout.dims.model_parallel // traced_tp
        share = 1.0 / rest
        notes.assume(
            f"calibrated compute of a {layout.strategy} rank: the "
            + ("tensor-parallel rank's" if traced_tp > 1 else "replica's")
            + f" operators divided evenly over {rest} "
            + (
                "pipeline stages"
                if traced_tp > 1
                else "model-parallel ranks (its own smaller matmuls are not traced)"
            )
        )
    description = (
        f"calibrated: {len(operators.operators)} operators of a {operators.micro_batch}-sample micro-batch x "
        f"{operators.micro_batches} and the optimizer step ({operators.optimizer_kernels} kernels), at "
        f"{calibration.describe()}"
        + (f"; refined by {operators.measured_source} for {len(by_name)} operator(s)" if by_name else "")
        + (f"; {operators.traced_elsewhere}" if operators.traced_elsewhere else "")
    )
    if operators.traced_elsewhere:
        notes.assume(f"the step's operators were {operators.traced_elsewhere}")
    notes.assume(
        "compute time: each operator's roofline time (matmul rate by shape, or elementwise bandwidth) plus its "
        f"dispatch cost, summed over {len(operators.operators)} traced operators"
        if not queued
        else "compute time: each phase the longer of its operators' device time (matmul rate by shape, a batched "
        "product as one product of its whole work, or elementwise bandwidth) and the host's dispatching of "
        f"them, which runs ahead of the device; over {len(operators.operators)} traced operators"
    )
    return CalibratedTimes(
        forward_s=phases["forward"] * share,
        backward_s=phases["backward"] * share,
        optimizer_s=phases["optimizer"] * share,
        dispatch_s=dispatch_total * share,
        operators=len(operators.operators),
        description=description,
    )


def _itemsize(dtype: str) -> int:
    """Bytes of one value of a dtype named as torch names it without its module (``float32``, ``bfloat16``)."""
    return (
        8 if dtype in ("float64", "int64", "complex64") else 1 if "8" in dtype else 2 if "16" in dtype else 4
    )
