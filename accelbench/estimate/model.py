"""Why a run takes the time and memory it takes, before running it: the analytical model, pure arithmetic (no torch).

:func:`predict_step` turns what a workload is (:class:`WorkloadFacts`: parameters, FLOPs, a transformer's shape), how it
is spread (strategy, devices, precision) and what the hardware can do (peak FLOP/s, bus bandwidth, memory) into a
:class:`Prediction`: memory per device by kind, communication per device per step by collective, FLOPs and the step
time. Every formula says where it comes from; docs/estimate.md has them all, with their sources and where they miss.

Tensor and pipeline parallelism (``tp``, ``pp``, ``mesh``) come from :mod:`accelbench.estimate.parallel`, whose
functions this module calls rather than restates. Conventions:

- Communication is counted in nccl-tests' *bus bytes* per device (shared/notes/MEASUREMENT.md): an all-reduce of S
  bytes over p ranks moves ``2 (p-1)/p S``, an all-gather or reduce-scatter whose whole array is S moves
  ``(p-1)/p S``, a broadcast, reduce or point-to-point send ``S``. Its time is those bytes over the bus bandwidth
  (busbw) the same convention measures, so a figure from ``nccl-tests`` or ``accelbench comm`` plugs in directly.
  Seed 001's table (AllReduce ``4(1-1/p)P`` for P parameters of 2 bytes) is the same count.
- FLOPs are the workload's own formula (the GPT's ``6N + 12 l d s`` per token); Megatron-LM's count is reported
  beside it for transformers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from accelbench.contract import PeakFigures
from accelbench.contract.strategies import MODEL_PARALLEL_STRATEGIES
from accelbench.errors import ConfigError
from accelbench.estimate.parallel import (
    TransformerShape,
    activation_bytes_per_layer,
    allgather_bytes,
    allreduce_bytes,
    estimate_parallel,
    pipeline_bubble,
)
from accelbench.parallel_dims import ParallelDims

SCHEMA_NAME = "accelbench.estimate"
SCHEMA_VERSION = 1

# Fraction of the peak FLOP/s a training step reaches (override with --efficiency): defined beside the flags
from accelbench.estimate.arguments import DEFAULT_EFFICIENCY  # noqa: E402

DATA_PARALLEL = ("single", "ddp", "fsdp", "deepspeed-zero1", "deepspeed-zero2", "deepspeed-zero3")
MODEL_PARALLEL = MODEL_PARALLEL_STRATEGIES
STRATEGIES = DATA_PARALLEL + MODEL_PARALLEL

# torch DistributedDataParallel's default gradient bucket (bucket_cap_mb=25)
DDP_BUCKET_BYTES = 25 * 2**20
# DeepSpeed's ZeRO defaults (deepspeed/runtime/zero/config.py, read in DeepSpeed 0.19.8), in elements
DS_REDUCE_BUCKET = 500_000_000  # reduce_bucket_size: the gradient bucket (allocated whole, filled as it goes)
DS_ALLGATHER_BUCKET = 500_000_000  # allgather_bucket_size: parameter all-gather after the step (ZeRO-1/2)
DS_PREFETCH_BUCKET = 50_000_000  # stage3_prefetch_bucket_size: ZeRO-3 parameters fetched ahead of use
DS_PERSISTENCE_THRESHOLD = (
    100_000  # stage3_param_persistence_threshold: smaller tensors stay whole on every rank
)

Overlap = Literal["none", "backward", "auto"]


# --------------------------------------------------------------------------------------------------------------
# What the model needs to know about a workload
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkloadFacts:
    """A workload as the formulas see it, for one configuration; :mod:`accelbench.estimate.facts` reads it off a
    built (or meta-device) model.

    ``parameters`` is the workload's count (the GPT's leaves out its vocabulary padding rows, which compute nothing
    useful); ``stored_parameters`` what is allocated and communicated (padding included, tied tensors once).
    ``tensor_sizes`` are the elements of each parameter tensor (ZeRO-3 keeps small ones whole), ``unit_parameters``
    those of each repeated unit (FSDP's wrapping units) and ``outer_parameters`` those outside them (the root unit).
    ``matmul_parameters`` are the parameters of linear layers, which autocast copies to 16 bits.
    ``transformer`` is set for transformers (layers, width, heads, context, vocabulary as the logits are wide).
    """

    workload: str
    model: str
    parameters: int
    stored_parameters: int
    flops_per_sample: float
    flops_formula: str
    tokens_per_sample: int
    tensor_sizes: tuple[int, ...] = ()
    unit_parameters: tuple[int, ...] = ()
    outer_parameters: int = 0
    matmul_parameters: int = 0
    megatron_flops_per_sample: float | None = None
    transformer: TransformerShape | None = None
    dropout: float = 0.0
    source: str = ""


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of each kind of training state, for one precision under one engine."""

    param: int
    grad: int
    optimizer: int  # AdamW's two moments
    master: int  # an fp32 copy of the parameters beside 16-bit ones (0 where the parameters are the master)
    autocast_copy: int  # autocast's 16-bit copy of each linear layer's weights, kept from forward to backward
    activation: int  # bytes of an activation value (Korthikanti's count is for 2)
    reduction: int  # bytes of a gradient in DeepSpeed's reduction bucket


def state_bytes(precision: str, strategy: str) -> StateBytes:
    """Bytes per parameter by precision (``accelbench.precision``) and engine.

    torch's own loop (single, DDP, FSDP2, tp/pp): fp32 keeps fp32 weights, gradients and AdamW's two fp32 moments
    (4 + 4 + 8); ``*-mixed`` is autocast over those same fp32 weights (they are the master copy), with a 16-bit
    copy of every linear weight that autocast makes in forward and backward keeps; ``bf16-true`` keeps everything in
    bf16 (2 + 2 + 4). DeepSpeed (ZeRO 1-3) runs the model in 16 bits in its bf16/fp16 modes and always keeps an fp32
    master partition and fp32 moments (2 + 2, + 4 + 8 per rank's share); in fp32 it still clones the partition as
    its "fp32" master copy (``stage_1_and_2.py``: ``.detach().clone().to(master dtype)``).
    """
    mixed = precision in ("bf16-mixed", "fp16-mixed")
    if strategy.startswith("deepspeed-"):
        if precision == "bf16-true":
            raise ConfigError(
                "DeepSpeed keeps fp32 master weights: use bf16-mixed, not bf16-true, with deepspeed"
            )
        sixteen = 2 if mixed else 4
        # "ZeRO-1 stages the fp32 accumulator; ZeRO-2 keeps low-precision staging" (stage_1_and_2.py)
        reduction = 4 if strategy == "deepspeed-zero1" else sixteen
        return StateBytes(
            param=sixteen,
            grad=sixteen,
            optimizer=8,
            master=4,
            autocast_copy=0,
            activation=sixteen,
            reduction=reduction,
        )
    if precision == "bf16-true":
        return StateBytes(param=2, grad=2, optimizer=4, master=0, autocast_copy=0, activation=2, reduction=2)
    if mixed:
        return StateBytes(param=4, grad=4, optimizer=8, master=0, autocast_copy=2, activation=2, reduction=4)
    return StateBytes(param=4, grad=4, optimizer=8, master=0, autocast_copy=0, activation=4, reduction=4)


# --------------------------------------------------------------------------------------------------------------
# The prediction (what the runner stores in a record and `accelbench estimate --json` prints)
# --------------------------------------------------------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MemoryBreakdown(_Model):
    """Predicted peak memory of one device, by kind, in bytes. ``None`` where the model has no formula."""

    weights_bytes: float = Field(description="Parameters this device holds (its shard under FSDP/ZeRO-3).")
    master_weights_bytes: float = Field(description="fp32 master copy beside 16-bit parameters (DeepSpeed).")
    gradients_bytes: float = Field(description="Gradients held (sharded under ZeRO-2/3 and FSDP).")
    optimizer_bytes: float = Field(description="AdamW's two moments (sharded from ZeRO-1 on).")
    activations_bytes: float | None = Field(
        description="Activations kept for backward at the end of forward (transformers: Korthikanti et al.)."
    )
    transient_bytes: float = Field(
        description="Live while computing: full parameters gathered by FSDP/ZeRO-3, autocast's 16-bit weight "
        "copies, DeepSpeed's gradient bucket."
    )
    runtime_bytes: float = Field(
        default=0.0,
        description="What the process holds before the model (given, e.g. measured: the CPU backend's resident-set "
        "peak counts the interpreter and libraries; a GPU allocator's peak does not).",
    )

    gradients_freed_each_step: bool = Field(
        default=False,
        description="True where the optimizer frees the gradients after each step (zero_grad(set_to_none=True) "
        "without DDP's or DeepSpeed's persistent buffers): they are then allocated during backward as the "
        "activations are freed, and the peak holds the larger of the two, not both.",
    )

    @property
    def total_bytes(self) -> float | None:
        if self.activations_bytes is None:
            return None
        if self.gradients_freed_each_step:
            backward = max(self.gradients_bytes, self.activations_bytes)
        else:
            backward = self.gradients_bytes + self.activations_bytes
        return (
            self.weights_bytes
            + self.master_weights_bytes
            + self.optimizer_bytes
            + backward
            + self.transient_bytes
            + self.runtime_bytes
        )


class CommOp(_Model):
    """One kind of collective a device takes part in each step."""

    op: str = Field(description="all_reduce, all_gather, reduce_scatter, sendrecv (nccl-tests' names).")
    dtype: str = Field(description="Element type moved: fp32, bf16 or fp16 (as accelbench comm names them).")
    axis: str = Field(description="The group it runs over: dp (data), tp or pp.")
    ranks: int = Field(description="Ranks in that group.")
    what: str = Field(description="What is moved, in words.")
    count: int = Field(description="Operations per step.")
    message_bytes: float = Field(
        description="Bytes of one operation's whole array (the size bandwidth is read at)."
    )
    bus_bytes: float = Field(description="Bus bytes this device moves per step over all `count` operations.")
    overlappable: bool = Field(description="Whether the engine can overlap it with compute.")
    busbw_bytes_per_s: float | None = None
    time_s: float | None = None
    bandwidth_source: str | None = None


class ScalingPrediction(_Model):
    """Predicted speedup from g to n devices (seed 001, "Speedup formulation"), weak scaling: each device keeps its
    batch, so the job's throughput grows with n while each step's compute stays the same."""

    devices_from: int
    devices_to: int
    step_s_from: float
    comm_s_from: float
    comm_s_to: float
    step_s_to: float = Field(description="t_compute(g) + t_comm(n).")
    network_efficiency: float | None = Field(
        description="eff = t_comm(g) / t_comm(n); None when g has no communication (one device)."
    )
    step_ratio: float = Field(
        description="t_iter(g) / t_iter(n) = (r_compute + r_comm) / (r_compute + r_comm / eff)."
    )
    throughput_speedup: float = Field(description="(n / g) x step_ratio: samples per second at n over at g.")


class Prediction(_Model):
    """What ``accelbench estimate`` predicts for one configuration on one kind of device, per device and step."""

    schema_name: Literal["accelbench.estimate"] = Field(default="accelbench.estimate", alias="schema")
    schema_version: int = SCHEMA_VERSION
    workload: str
    model: str
    strategy: str
    precision: str
    devices: int = Field(description="Devices in the job (all nodes).")
    batch_size: int = Field(description="Samples per device (per replica for tp/pp/mesh) per step.")
    device: str = Field(description="The device the prediction is for, and where its figures come from.")
    device_memory_bytes: int | None = None
    parameters: int = Field(description="The workload's parameter count.")
    stored_parameters: int = Field(description="Parameter elements allocated (padding included, tied once).")
    flops_per_step: float = Field(
        description="FLOPs one device computes per step, by the workload's formula."
    )
    flops_formula: str
    megatron_flops_per_step: float | None = Field(
        default=None,
        description="The same by Megatron-LM's count, 72 B s l h^2 (1 + s/6h + V/12lh) (seed 002).",
    )
    memory: MemoryBreakdown
    peak_memory_bytes: float | None = Field(description="Sum of the breakdown; None when a part is unknown.")
    fits: bool | None = Field(description="Whether the peak fits the device's memory; None when unknown.")
    comm: list[CommOp]
    comm_bytes_per_step: float = Field(
        description="Bus bytes one device moves per step (nccl-tests' convention)."
    )
    peak_flops_per_s: float | None
    peak_source: str | None
    efficiency: float = Field(description="Assumed fraction of the peak a step reaches.")
    compute_s: float | None = Field(description="FLOPs / (peak x efficiency), and the pipeline bubble.")
    optimizer_s: float | None = Field(
        default=None, description="AdamW's update, memory-bound: bytes it streams / memory bandwidth."
    )
    comm_s: float | None = Field(description="Sum of the collectives' times at their bus bandwidth.")
    comm_exposed_s: float | None = Field(description="The part of comm_s not hidden behind compute.")
    overlap: str = Field(description="What is assumed to overlap with compute, in words.")
    step_time_s: float | None = Field(description="compute + optimizer + exposed communication.")
    samples_per_s: float | None = Field(description="Samples per second of the whole job.")
    bubble: float | None = None
    assumptions: list[str] = Field(default_factory=list)
    sources: list[str] = Field(default_factory=list)
    measured_peaks: dict[str, PeakFigures] = Field(
        default_factory=dict,
        description="Dense-matmul rates measured on this device, by precision (--measure-peak).",
    )
    scaling: list[ScalingPrediction] = Field(
        default_factory=list, description="Predicted speedups to other device counts (seed 001; --scale-to)."
    )

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2)


# --------------------------------------------------------------------------------------------------------------
# Bandwidth: what the collectives' times are read from
# --------------------------------------------------------------------------------------------------------------


class Bandwidth:
    """Bus bandwidth by collective, group size and message size: what :func:`predict_step` divides bus bytes by.
    :class:`accelbench.estimate.comm.BusBandwidth` reads it from comm records; a test may give any object with
    this method."""

    def lookup(self, op: str, ranks: int, message_bytes: float, dtype: str) -> tuple[float, str] | None:
        """(bytes/s, where the figure comes from), or None when nothing is known for ``op``."""
        raise NotImplementedError


# --------------------------------------------------------------------------------------------------------------
# The estimate
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hardware:
    """What the device can do, as far as known: a name, memory, peak FLOP/s (vendor table, measured, or given),
    memory bandwidth, the collectives' bandwidth, and its device type (which attention kernel runs, whether
    collectives can overlap compute)."""

    name: str
    device_type: str
    memory_bytes: int | None = None
    peak_flops_per_s: float | None = None
    peak_source: str | None = None
    memory_bandwidth_bytes_per_s: float | None = None
    bandwidth: Bandwidth | None = None
    devices_per_node: int = 1


@dataclass(frozen=True)
class RunShape:
    """The run as the formulas see it (from a RunConfig: :func:`accelbench.estimate.predictor.run_shape`): the
    strategy, precision, per-device (per-replica) batch and its accumulation steps, and the parallel layout (a data
    axis over every device for ddp, fsdp and ZeRO; the mesh for tp, pp and mesh)."""

    strategy: str
    precision: str
    batch_size: int
    dims: ParallelDims
    grad_accum: int = 1

    @property
    def devices(self) -> int:
        """Devices in the whole job."""
        return self.dims.world


@dataclass
class _Notes:
    assumptions: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)

    def assume(self, text: str) -> None:
        if text not in self.assumptions:
            self.assumptions.append(text)

    def cite(self, text: str) -> None:
        if text not in self.sources:
            self.sources.append(text)


def _dtype(width: int, precision: str) -> str:
    """The element type of a ``width``-byte value under ``precision``, as comm records name types."""
    if width == 4:
        return "fp32"
    return "fp16" if precision.startswith("fp16") else "bf16"


def attention_keeps_scores(device_type: str, dropout: float) -> bool:
    """Whether attention keeps its ``a s^2`` scores for backward. Fused kernels (flash, memory-efficient) recompute
    them; torch's CPU flash kernel takes no dropout, so on a CPU with dropout torch runs the math path, which keeps
    them (``torch._fused_sdp_choice`` answers MATH there, FLASH without dropout)."""
    return device_type == "cpu" and dropout > 0.0


# Bytes torch's math attention path keeps per score (b a s^2 of them): the softmax output, the dropout's noise (a
# float tensor: at::dropout multiplies by it) and the dropout output the product with V needs, all fp32 (CPU autocast
# runs scaled_dot_product_attention in fp32). Korthikanti's count for Megatron's 16-bit kernels is 5 (2 + 1 + 2).
MATH_ATTENTION_BYTES_PER_SCORE = 12


def activation_bytes(
    facts: WorkloadFacts,
    micro_batch: int,
    state: StateBytes,
    keeps_scores: bool,
    notes: _Notes,
    tp: int = 1,
    sequence_parallel: bool = False,
) -> float | None:
    """Activations one device keeps at the end of forward (its layers, for one microbatch of ``micro_batch``).

    Transformers: Korthikanti et al. 2022 (seed 001's ``b(34 s d + 5 a s^2) l`` in 16-bit values) through
    :func:`accelbench.estimate.parallel.activation_bytes_per_layer`, scaled to the activations' width:

    - the ``34 s b h`` part always; under autocast ``+ 4 s b h``, since both norms' inputs (the residual stream)
      stay fp32 where Korthikanti counts 16 bits;
    - the ``a s^2`` part only where attention keeps its scores: not with fused attention (flash, memory-efficient
      SDPA), which recomputes them; with torch's math path (a CPU with dropout) 12 bytes a score, not 5 (see
      :data:`MATH_ATTENTION_BYTES_PER_SCORE`);
    - around the layers (Korthikanti's first and last stages): the embedding dropout mask ``s b h``, the final
      norm's and output layer's inputs ``4 s b h`` (16-bit) and the fp32 logits ``4 s b V``.
    """
    shape = facts.transformer
    if shape is None:
        notes.assume(
            f"no activation formula for workload {facts.workload!r} (not a transformer): activations unknown"
        )
        return None
    s, h, v, b = shape.sequence, shape.hidden, shape.vocab, micro_batch
    per_layer = layer_activation_bytes(shape, b, state, keeps_scores, tp, sequence_parallel)
    _note_activations(state, keeps_scores, notes)
    outside = s * b * h * (1 + 4 * state.activation / 2) + 4 * s * b * v
    return per_layer * shape.layers + outside


def layer_activation_bytes(
    shape: TransformerShape,
    micro_batch: int,
    state: StateBytes,
    keeps_scores: bool,
    tp: int = 1,
    sequence_parallel: bool = False,
) -> float:
    """One layer's activations for one microbatch (see :func:`activation_bytes`)."""
    s, h, a, b = shape.sequence, shape.hidden, shape.heads, micro_batch
    per_layer = activation_bytes_per_layer(b, s, h, 0, tp, sequence_parallel, state.activation)
    if state.autocast_copy:
        per_layer += 4 * s * b * h / (tp if sequence_parallel else 1)
    if keeps_scores:
        per_layer += MATH_ATTENTION_BYTES_PER_SCORE * a * s * s * b / tp
    return per_layer


def _note_activations(state: StateBytes, keeps_scores: bool, notes: _Notes) -> None:
    if state.autocast_copy:
        notes.assume("under autocast both norms' inputs stay fp32: + 4 s b h a layer over the 16-bit count")
    if keeps_scores:
        notes.assume(
            "attention keeps its a*s^2 scores: torch's CPU flash kernel takes no dropout, so the math path runs and "
            "keeps softmax, dropout noise and output in fp32, 12 bytes a score (Korthikanti's 16-bit count: 5)"
        )
    else:
        notes.assume(
            "fused attention (flash / memory-efficient SDPA) keeps no a*s^2 scores: seed 001's 5as^2 term is left "
            "out (with it the figure would be an upper bound)"
        )
    notes.cite(
        "activations: Korthikanti et al. 2022, s b h (34 + 5 a s/h) bytes a layer in 16-bit values (seed 001's "
        "b(34sd + 5as^2)l), scaled to the activation width, the scores as the attention kernel keeps them; + s b h "
        "(1 + 4) + 4 s b V for the embedding dropout, the final norm and output layer and the fp32 logits"
    )


def predict_step(
    facts: WorkloadFacts,
    layout: RunShape,
    hardware: Hardware,
    *,
    efficiency: float = DEFAULT_EFFICIENCY,
    overlap: Overlap = "auto",
    runtime_bytes: float = 0.0,
) -> Prediction:
    """The prediction for one configuration on one kind of device (see the module's docstring for conventions).

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
    if layout.strategy == "single" and layout.devices > 1:
        raise ConfigError(
            f"strategy 'single' trains on one device, but {layout.devices} were asked for; choose ddp, fsdp, "
            "deepspeed-zero1/2/3, tp, pp or mesh"
        )
    if layout.batch_size % layout.grad_accum:
        raise ConfigError(
            f"--batch-size {layout.batch_size} is not divisible by --grad-accum {layout.grad_accum}"
        )
    notes = _Notes()
    state = state_bytes(layout.precision, layout.strategy)
    keeps_scores = attention_keeps_scores(hardware.device_type, facts.dropout)
    if layout.strategy in MODEL_PARALLEL:
        memory, comm, flops, bubble = _model_parallel(facts, layout, state, keeps_scores, notes)
    else:
        memory, comm = _data_parallel(facts, layout, state, keeps_scores, hardware, notes)
        flops, bubble = facts.flops_per_sample * layout.batch_size, 0.0
    memory = memory.model_copy(update={"runtime_bytes": float(runtime_bytes)})
    if runtime_bytes:
        notes.assume(f"runtime held before the model: {runtime_bytes / 2**20:.0f} MiB (given)")
    megatron = (
        facts.megatron_flops_per_sample * layout.batch_size / _model_ranks(layout)
        if facts.megatron_flops_per_sample
        else None
    )
    notes.cite(f"FLOPs: the workload's formula, {facts.flops_formula}")
    if megatron:
        notes.cite("Megatron-LM FLOPs: 72 B s l h^2 (1 + s/6h + V/12lh), no recomputation (seed 002)")
    total = memory.total_bytes
    fits = _fits(total, hardware, notes)
    comm = _time_comm(comm, hardware, notes)
    compute_s = _compute_time(flops, hardware, efficiency, bubble, notes)
    optimizer_s = _optimizer_time(facts, layout, state, hardware, notes)
    comm_s = None if any(op.time_s is None for op in comm) else sum(op.time_s or 0.0 for op in comm)
    overlap_text, exposed = _exposed(comm, comm_s, compute_s, overlap, hardware, notes)
    step = None
    if compute_s is not None and exposed is not None:
        step = compute_s + (optimizer_s or 0.0) + exposed
    replicas = layout.devices // _model_ranks(layout)
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
        flops_per_step=flops,
        flops_formula=facts.flops_formula,
        megatron_flops_per_step=megatron,
        memory=memory,
        peak_memory_bytes=total,
        fits=fits,
        comm=comm,
        comm_bytes_per_step=sum(op.bus_bytes for op in comm),
        peak_flops_per_s=hardware.peak_flops_per_s,
        peak_source=hardware.peak_source,
        efficiency=efficiency,
        compute_s=compute_s,
        optimizer_s=optimizer_s,
        comm_s=comm_s,
        comm_exposed_s=exposed,
        overlap=overlap_text,
        step_time_s=step,
        samples_per_s=samples,
        bubble=bubble,
        assumptions=notes.assumptions,
        sources=notes.sources,
    )


def _model_ranks(layout: RunShape) -> int:
    """Devices that hold one copy of the model together (tensor x pipeline), 1 for data parallelism."""
    return layout.dims.model_parallel


# --- data parallelism: single, DDP, FSDP2, DeepSpeed ZeRO 1-3 ------------------------------------------------


def _data_parallel(
    facts: WorkloadFacts,
    layout: RunShape,
    state: StateBytes,
    keeps_scores: bool,
    hardware: Hardware,
    notes: _Notes,
) -> tuple[MemoryBreakdown, list[CommOp]]:
    """Memory and collectives of one device under the data-parallel strategies, by ZeRO's partitioning (Rajbhandari
    et al. 2019; seed 001): single and DDP replicate everything; ZeRO-1 shards the optimizer state over the p ranks,
    ZeRO-2 the gradients too, ZeRO-3 and FSDP the parameters too."""
    p, n = layout.devices, facts.stored_parameters
    strategy = layout.strategy
    micro = layout.batch_size // layout.grad_accum
    activations = activation_bytes(facts, micro, state, keeps_scores, notes)
    autocast = state.autocast_copy * facts.matmul_parameters
    if autocast:
        notes.assume(
            "autocast keeps a 16-bit copy of every linear weight from forward to backward (2 bytes x "
            f"{facts.matmul_parameters:,} parameters; whole even under FSDP, whose gathered weights it copies)"
        )
    comm: list[CommOp] = []
    grad_total = n * state.grad
    if strategy in ("single", "ddp"):
        memory = MemoryBreakdown(
            weights_bytes=n * state.param,
            master_weights_bytes=0.0,
            gradients_bytes=n * state.grad,
            optimizer_bytes=n * state.optimizer,
            activations_bytes=activations,
            transient_bytes=autocast,
            gradients_freed_each_step=strategy == "single",
        )
        if strategy == "ddp" and p > 1:
            message = min(grad_total, DDP_BUCKET_BYTES)
            comm.append(
                CommOp(
                    op="all_reduce",
                    dtype=_dtype(state.grad, layout.precision),
                    axis="dp",
                    ranks=p,
                    what="gradients, in 25 MiB buckets during backward",
                    count=math.ceil(grad_total / message),
                    message_bytes=message,
                    bus_bytes=allreduce_bytes(grad_total, p),
                    overlappable=True,
                )
            )
        notes.cite(
            f"memory: {'replicated' if p > 1 else 'one device'}: weights {state.param} + gradients {state.grad} + "
            f"AdamW moments {state.optimizer} bytes per parameter (DDP's gradient buckets are the gradients, "
            "gradient_as_bucket_view, and stay allocated; one device's gradients are freed each step, so its peak "
            "holds the larger of gradients and activations)"
        )
    elif strategy == "fsdp":
        units = facts.unit_parameters or (n,)
        largest = max(units)
        gathered = (facts.outer_parameters + 2 * largest) * state.param
        memory = MemoryBreakdown(
            weights_bytes=n * state.param / p,
            master_weights_bytes=0.0,
            gradients_bytes=n * state.grad / p,
            optimizer_bytes=n * state.optimizer / p,
            activations_bytes=activations,
            transient_bytes=gathered + autocast,
            gradients_freed_each_step=True,
        )
        notes.cite(
            "memory: FSDP2 shards weights, gradients and AdamW moments over p (the gradients are freed each step: "
            "the peak holds the larger of them and the activations); while computing it holds the root unit (stem "
            "and head: not resharded after forward) and two units' full parameters (one in use, the next prefetched)"
        )
        if p > 1:
            outer = facts.outer_parameters * state.param
            comm += [
                CommOp(
                    op="all_gather",
                    dtype=_dtype(state.param, layout.precision),
                    axis="dp",
                    ranks=p,
                    what="parameters: each unit in forward and again in backward, the root unit once",
                    count=2 * len(units) + 1,
                    message_bytes=(2 * sum(units) * state.param + outer) / (2 * len(units) + 1),
                    bus_bytes=allgather_bytes(2 * sum(units) * state.param + outer, p),
                    overlappable=True,
                ),
                CommOp(
                    op="reduce_scatter",
                    dtype=_dtype(state.grad, layout.precision),
                    axis="dp",
                    ranks=p,
                    what="gradients, one unit at a time in backward",
                    count=len(units) + 1,
                    message_bytes=grad_total / (len(units) + 1),
                    bus_bytes=allgather_bytes(grad_total, p),
                    overlappable=True,
                ),
            ]
    else:
        memory, comm = _zero(facts, layout, state, activations, hardware, notes)
    if p > 1:
        notes.cite(
            "communication: nccl-tests' bus bytes per device: all_reduce 2(p-1)/p S, all_gather and reduce_scatter "
            "(p-1)/p S (shared/notes/MEASUREMENT.md; seed 001's 4(1-1/p)P and 2(1-1/p)P for 2-byte values)"
        )
    return memory, comm


def _zero(
    facts: WorkloadFacts,
    layout: RunShape,
    state: StateBytes,
    activations: float | None,
    hardware: Hardware,
    notes: _Notes,
) -> tuple[MemoryBreakdown, list[CommOp]]:
    """DeepSpeed ZeRO stages 1-3 as DeepSpeed 0.19.8 runs them with accelbench's config (its defaults).

    Memory: the 16-bit (or fp32) model, an fp32 master partition and fp32 moments of 1/p of the parameters, the
    gradients (whole for ZeRO-1, the partition from ZeRO-2 on) and an fp32 gradient partition for the step, and
    the contiguous gradient bucket of ``reduce_bucket_size`` elements: an accelerator's allocator takes it whole,
    a CPU's resident memory only as far as it is written (at most the gradients). ZeRO-3 keeps tensors under
    ``stage3_param_persistence_threshold`` elements whole on every rank and fetches up to
    ``stage3_prefetch_bucket_size`` elements ahead.
    Communication: ZeRO-1 and ZeRO-2 all-reduce the gradient bucket (``use_multi_rank_bucket_allreduce``, on by
    default, makes the per-partition reduces one all-reduce) and all-gather the updated partitions; ZeRO-3
    all-gathers the parameters in forward and again in backward and reduce-scatters the gradients (seed 001).
    Only ZeRO-3 overlaps them (``overlap_comm`` defaults to on for stage 3 alone).
    """
    p, n = layout.devices, facts.stored_parameters
    stage = int(layout.strategy[-1])
    bucket_elements = DS_REDUCE_BUCKET if hardware.device_type != "cpu" else min(n, DS_REDUCE_BUCKET)
    bucket = bucket_elements * state.reduction
    if hardware.device_type == "cpu":
        notes.assume(
            "DeepSpeed's gradient bucket (reduce_bucket_size, 5e8 elements) is resident on a CPU only as far as it "
            "is written: at most the gradients"
        )
    else:
        notes.assume(
            f"DeepSpeed allocates its gradient bucket whole: 5e8 elements x {state.reduction} bytes = "
            f"{DS_REDUCE_BUCKET * state.reduction / 2**30:.1f} GiB, whatever the model's size"
        )
    fp32_grad_partition = 4 * n / p
    persistent = sum(t for t in facts.tensor_sizes if t < DS_PERSISTENCE_THRESHOLD) if stage == 3 else 0
    partitioned = n - persistent
    if stage == 3:
        weights = partitioned * state.param / p + persistent * state.param
        gradients = n * state.grad / p + fp32_grad_partition
        gathered = float(min(partitioned, DS_PREFETCH_BUCKET + max(facts.tensor_sizes or (0,))) * state.param)
        if persistent:
            notes.assume(
                f"ZeRO-3 keeps {persistent:,} parameters (tensors under 1e5 elements) whole on every rank"
            )
    else:
        weights = float(n * state.param)
        gradients = (n * state.grad if stage == 1 else n * state.grad / p) + fp32_grad_partition
        gathered = 0.0
    memory = MemoryBreakdown(
        weights_bytes=weights,
        master_weights_bytes=state.master * n / p,
        gradients_bytes=gradients,
        optimizer_bytes=state.optimizer * n / p,
        activations_bytes=activations,
        transient_bytes=gathered + bucket,
    )
    notes.cite(
        f"memory: ZeRO-{stage} (Rajbhandari et al. 2019) as DeepSpeed 0.19.8 runs it: fp32 master partition and "
        "moments per rank, gradient bucket of reduce_bucket_size elements"
    )
    comm: list[CommOp] = []
    if p <= 1:
        return memory, comm
    grad_total, param_total = n * state.grad, n * state.param
    if stage in (1, 2):
        message = min(n, DS_REDUCE_BUCKET) * state.grad
        comm += [
            CommOp(
                op="all_reduce",
                dtype=_dtype(state.grad, layout.precision),
                axis="dp",
                ranks=p,
                what="gradients (the contiguous bucket), at the end of backward",
                count=math.ceil(grad_total / message),
                message_bytes=message,
                bus_bytes=allreduce_bytes(grad_total, p),
                overlappable=False,
            ),
            CommOp(
                op="all_gather",
                dtype=_dtype(state.param, layout.precision),
                axis="dp",
                ranks=p,
                what="updated parameter partitions, after the optimizer step",
                count=math.ceil(n / DS_ALLGATHER_BUCKET),
                message_bytes=min(n, DS_ALLGATHER_BUCKET) * state.param,
                bus_bytes=allgather_bytes(param_total, p),
                overlappable=False,
            ),
        ]
    else:
        tensors = [t for t in facts.tensor_sizes if t >= DS_PERSISTENCE_THRESHOLD] or [partitioned]
        if partitioned:  # persistent tensors are never gathered
            comm.append(
                CommOp(
                    op="all_gather",
                    dtype=_dtype(state.param, layout.precision),
                    axis="dp",
                    ranks=p,
                    what="partitioned parameters, in forward and again in backward",
                    count=2 * len(tensors),
                    message_bytes=partitioned * state.param / len(tensors),
                    bus_bytes=allgather_bytes(2 * partitioned * state.param, p),
                    overlappable=True,
                )
            )
        comm.append(
            CommOp(
                op="reduce_scatter",
                dtype=_dtype(state.grad, layout.precision),
                axis="dp",
                ranks=p,
                what="gradients, in reduce_bucket_size buckets during backward",
                count=math.ceil(n / DS_REDUCE_BUCKET),
                message_bytes=min(n, DS_REDUCE_BUCKET) * state.grad,
                bus_bytes=allgather_bytes(grad_total, p),
                overlappable=True,
            )
        )
    return memory, comm


# --- tensor and pipeline parallelism: accelbench.estimate.parallel ---------------------------------------


def _model_parallel(
    facts: WorkloadFacts, layout: RunShape, state: StateBytes, keeps_scores: bool, notes: _Notes
) -> tuple[MemoryBreakdown, list[CommOp], float, float | None]:
    """tp, pp and mesh through :func:`accelbench.estimate.parallel.estimate_parallel` (its memory for the first pipeline
    rank, its communication by axis), with this module's state widths; FLOPs per device are the replica's divided
    by tp x pp, and the bubble is the schedule's."""
    mesh, shape = layout.dims, facts.transformer
    if shape is None:
        raise ConfigError(
            f"strategy {layout.strategy!r}: the tensor/pipeline model needs a transformer's shape; workload "
            f"{facts.workload!r} gives none"
        )
    result = estimate_parallel(
        shape,
        mesh,
        layout.batch_size,
        param_bytes=state.param,
        grad_bytes=state.grad,
        optimizer_bytes=state.optimizer,
        activation_bytes=state.activation,
    )
    micro = layout.batch_size // max(1, mesh.microbatches) if mesh.pp > 1 else layout.batch_size
    theirs = activation_bytes_per_layer(
        micro, shape.sequence, shape.hidden, shape.heads, mesh.tp, mesh.sequence_parallel, state.activation
    )
    mine = layer_activation_bytes(shape, micro, state, keeps_scores, mesh.tp, mesh.sequence_parallel)
    activations = result.activations_bytes * mine / theirs  # its layers and microbatches in flight, our count
    _note_activations(state, keeps_scores, notes)
    autocast = state.autocast_copy * result.parameters_per_device * (mesh.dp if mesh.shards_parameters else 1)
    memory = MemoryBreakdown(
        weights_bytes=result.weights_bytes,
        master_weights_bytes=0.0,
        gradients_bytes=result.gradients_bytes,
        optimizer_bytes=result.optimizer_bytes,
        activations_bytes=activations,
        transient_bytes=autocast,
    )
    notes.cite(
        "tensor/pipeline parallelism: accelbench.estimate.parallel.estimate (memory of the first pipeline "
        "rank; Korthikanti et al. 2022 activations with t and sequence parallelism; Megatron's bubble)"
    )
    b, s, h = layout.batch_size, shape.sequence, shape.hidden
    micro_bytes = b // max(1, mesh.microbatches) * s * h * state.activation
    comm: list[CommOp] = []
    bytes_by_axis = result.communication_bytes
    layers_here = round(result.layers_per_stage * mesh.virtual_stages)
    if mesh.tp > 1:
        comm.append(
            CommOp(
                op="all_reduce",
                dtype=_dtype(state.activation, layout.precision),
                axis="tp",
                ranks=mesh.tp,
                what="b s h activations, twice per layer in forward and twice in backward",
                count=4 * layers_here * max(1, mesh.microbatches if mesh.pp > 1 else 1),
                message_bytes=micro_bytes if mesh.pp > 1 else b * s * h * state.activation,
                bus_bytes=bytes_by_axis["tp"],
                overlappable=False,
            )
        )
    if mesh.pp > 1:
        comm.append(
            CommOp(
                op="sendrecv",
                dtype=_dtype(state.activation, layout.precision),
                axis="pp",
                ranks=mesh.pp,
                what="b s h activations forward and their gradients back, per microbatch and stage",
                count=2 * mesh.virtual_stages * mesh.microbatches,
                message_bytes=micro_bytes,
                bus_bytes=bytes_by_axis["pp"],
                overlappable=False,
            )
        )
    if mesh.dp > 1:
        if mesh.data_parallel == "ddp":
            comm.append(
                CommOp(
                    op="all_reduce",
                    dtype=_dtype(state.grad, layout.precision),
                    axis="dp",
                    ranks=mesh.dp,
                    what="gradients",
                    count=1,
                    message_bytes=result.parameters_per_device * state.grad,
                    bus_bytes=bytes_by_axis["dp"],
                    overlappable=True,
                )
            )
        else:
            held = result.parameters_per_device * mesh.dp  # the stage's parameters before FSDP's sharding
            comm += [
                CommOp(
                    op="all_gather",
                    dtype=_dtype(state.param, layout.precision),
                    axis="dp",
                    ranks=mesh.dp,
                    what="parameters, in forward and again in backward",
                    count=2,
                    message_bytes=held * state.param,
                    bus_bytes=allgather_bytes(2 * held * state.param, mesh.dp),
                    overlappable=True,
                ),
                CommOp(
                    op="reduce_scatter",
                    dtype=_dtype(state.grad, layout.precision),
                    axis="dp",
                    ranks=mesh.dp,
                    what="gradients",
                    count=1,
                    message_bytes=held * state.grad,
                    bus_bytes=allgather_bytes(held * state.grad, mesh.dp),
                    overlappable=True,
                ),
            ]
    flops = facts.flops_per_sample * layout.batch_size / (mesh.tp * mesh.pp)
    bubble = pipeline_bubble(mesh.schedule, mesh.pp, mesh.microbatches, mesh.virtual_stages)
    if mesh.pp > 1 and bubble is None:
        notes.assume(f"pipeline schedule {mesh.schedule}: no closed-form bubble; taken as none (its ideal)")
    return memory, comm, flops, bubble


# --- time -----------------------------------------------------------------------------------------------------


def _fits(total: float | None, hardware: Hardware, notes: _Notes) -> bool | None:
    if total is None or hardware.memory_bytes is None:
        return None
    if hardware.device_type == "cpu":  # the worker processes of a node share its memory
        notes.assume(
            f"a CPU device is a process: the node's {hardware.devices_per_node} process(es) share its "
            f"{hardware.memory_bytes / 2**30:.1f} GiB"
        )
        return total * hardware.devices_per_node <= hardware.memory_bytes
    return total <= hardware.memory_bytes


def _time_comm(comm: Sequence[CommOp], hardware: Hardware, notes: _Notes) -> list[CommOp]:
    """Each collective with its time: its bus bytes over the bus bandwidth at its message size."""
    timed = []
    for op in comm:
        found = (
            hardware.bandwidth.lookup(op.op, op.ranks, op.message_bytes, op.dtype)
            if hardware.bandwidth
            else None
        )
        if found is not None:
            busbw, where = found
            op = op.model_copy(
                update={"busbw_bytes_per_s": busbw, "time_s": op.bus_bytes / busbw, "bandwidth_source": where}
            )
        timed.append(op)
    missing = sorted({op.op for op in timed if op.time_s is None})
    if missing:
        notes.assume(
            f"no bus bandwidth for {', '.join(missing)}: communication time unknown (give --comm RECORDS or "
            "--bus-bandwidth GB/s)"
        )
    return timed


def _compute_time(
    flops: float, hardware: Hardware, efficiency: float, bubble: float | None, notes: _Notes
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


def _optimizer_time(
    facts: WorkloadFacts, layout: RunShape, state: StateBytes, hardware: Hardware, notes: _Notes
) -> float | None:
    """AdamW's update is memory-bound: it reads the weights, gradients and two moments and writes the weights and
    moments back, for the parameters this device updates (its shard from ZeRO-1 and FSDP on)."""
    bandwidth = hardware.memory_bandwidth_bytes_per_s
    if not bandwidth:
        notes.assume("optimizer step time left out: the device's memory bandwidth is unknown")
        return None
    p = layout.devices
    updated = float(facts.stored_parameters)
    if layout.strategy in ("fsdp", "deepspeed-zero1", "deepspeed-zero2", "deepspeed-zero3"):
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


def _exposed(
    comm: Sequence[CommOp],
    comm_s: float | None,
    compute_s: float | None,
    overlap: Overlap,
    hardware: Hardware,
    notes: _Notes,
) -> tuple[str, float | None]:
    if not comm:
        return "nothing to communicate", 0.0
    if comm_s is None:
        return "unknown (no bandwidth)", None
    mode = overlap
    if mode == "auto":
        mode = "none" if hardware.device_type == "cpu" else "backward"
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


# --------------------------------------------------------------------------------------------------------------
# Scaling (seed 001)
# --------------------------------------------------------------------------------------------------------------


def predict_speedup(
    step_s: float, comm_s: float, devices_from: int, devices_to: int, comm_s_to: float
) -> ScalingPrediction:
    """Seed 001's speedup from a measured (or profiled) step at ``devices_from`` = g devices, of which ``comm_s``
    seconds were exposed communication, to ``devices_to`` = n devices whose exposed communication is predicted to
    take ``comm_s_to`` (bytes at n over the bus bandwidth at n).

    ``r_compute = (t_iter - t_comm) / t_iter``, ``r_comm = t_comm / t_iter``, ``eff = t_comm(g) / t_comm(n)``,
    ``speedup = (r_compute + r_comm) / (r_compute + r_comm / eff)``: the step-time ratio with per-device compute
    unchanged. From one device (no communication) it is ``t_iter(1) / (t_iter(1) + t_comm(n))``.
    """
    if step_s <= 0 or comm_s < 0 or comm_s_to < 0 or comm_s > step_s:
        raise ValueError(
            f"step {step_s} s with {comm_s} s of communication: give a positive step time and communication "
            "between 0 and the step time"
        )
    if devices_from < 1 or devices_to < 1:
        raise ValueError(f"device counts must be at least 1 (got {devices_from} -> {devices_to})")
    compute = step_s - comm_s
    step_to = compute + comm_s_to
    efficiency = comm_s / comm_s_to if comm_s > 0 and comm_s_to > 0 else None
    ratio = step_s / step_to
    return ScalingPrediction(
        devices_from=devices_from,
        devices_to=devices_to,
        step_s_from=step_s,
        comm_s_from=comm_s,
        comm_s_to=comm_s_to,
        step_s_to=step_to,
        network_efficiency=efficiency,
        step_ratio=ratio,
        throughput_speedup=devices_to / devices_from * ratio,
    )
