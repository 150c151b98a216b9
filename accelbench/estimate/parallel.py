"""Why a tensor/pipeline-parallel run runs at its speed: the analytical model, pure arithmetic (no torch).

The parallel executor records these figures beside what it measured, and ``accelbench estimate`` (issue 13) calls the
same functions. Every formula names its source:

- Megatron-LM's FLOPs per iteration (Narayanan et al. 2021, seed 002): ``72 B s l h^2 (1 + s/(6h) + V/(12 l h))``
  without activation recomputation, ``96 B s l h^2 (1 + s/(6h) + V/(16 l h))`` with full recomputation; "achieved
  TFLOP/s per GPU" divides it by devices and seconds.
- The pipeline bubble as a fraction of a step: ``(p-1) / (m+p-1)`` for GPipe and 1F1B, ``(p-1) / (v m + p-1)``
  with ``v`` stages per rank (interleaved 1F1B, looped BFS; Megatron's "bubble shrinks by v").
- Communication per device per step, nccl-tests' conventions (nccl-tests' doc/PERFORMANCE.md): an all-reduce of S bytes
  over n ranks moves ``2 (n-1)/n S`` per device, an all-gather or a reduce-scatter ``(n-1)/n S``. Tensor parallelism
  all-reduces ``b s h`` values twice per layer forward and twice backward (with sequence parallelism each all-reduce
  becomes an all-gather plus a reduce-scatter: the same volume); a pipeline stage sends ``b s h`` activations forward
  and their gradient backward at each boundary; data parallelism all-reduces the gradients (DDP) or all-gathers the
  parameters twice and reduce-scatters the gradients (FSDP / ZeRO-3).
- Activation memory per layer (Korthikanti et al. 2022; seed 001's ``b(34 s h + 5 a s^2)`` per layer, 16-bit):
  ``s b h (10 + 24/t + 5 a s/(h t))`` with tensor parallelism, ``s b h (34/t + 5 a s/(h t))`` with sequence
  parallelism too. Fused attention (flash, SDPA) stores no ``a s^2`` scores, so that term is an upper bound.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from accelbench.contract.strategies import Strategy

if TYPE_CHECKING:
    from accelbench.parallel_dims import ParallelDims

# pipeline schedules whose bubble has the closed form above; the zero-bubble schedules (interleaved-zb, zbv,
# dualpipev) split the backward to fill it and have none recorded here (their ideal is no bubble)
ONE_STAGE_SCHEDULES = ("gpipe", "1f1b")
LOOPED_SCHEDULES = ("interleaved-1f1b", "looped-bfs")


def megatron_flops_per_iteration(
    batch: int, sequence: int, layers: int, hidden: int, vocab: int, recompute: bool = False
) -> float:
    """Training FLOPs of one iteration of ``batch`` sequences by Megatron-LM's count (seed 002's slide "calculating
    the FLOPs/GPU"): ``96 B s l h^2 (1 + s/6h + V/16lh)`` with full activation recomputation (one more forward),
    ``72 B s l h^2 (1 + s/6h + V/12lh)`` without (the logit layer, never recomputed, is ``6 B s h V`` either way)."""
    if recompute:
        return (
            96.0
            * batch
            * sequence
            * layers
            * hidden**2
            * (1 + sequence / (6 * hidden) + vocab / (16 * layers * hidden))
        )
    return (
        72.0
        * batch
        * sequence
        * layers
        * hidden**2
        * (1 + sequence / (6 * hidden) + vocab / (12 * layers * hidden))
    )


def megatron_recompute_flops(batch: int, sequence: int, layers: int, hidden: int) -> float:
    """What full activation recomputation adds to Megatron-LM's count: one more forward pass of the layers,
    ``24 B s l h^2 (1 + s/6h)``, the difference of seed 002's ``96 B s l h^2 (1 + s/6h + V/16lh)`` and the
    no-recomputation ``72 B s l h^2 (1 + s/6h + V/12lh)`` (the logit layer's ``6 B s h V`` is in both)."""
    return 24.0 * batch * sequence * layers * hidden**2 * (1 + sequence / (6 * hidden))


def pipeline_bubble(schedule: str, stages: int, microbatches: int, virtual_stages: int = 1) -> float | None:
    """The analytical bubble: the fraction of a step a pipeline rank idles while the pipeline fills and drains,
    ``(p-1)/(v m + p-1)`` (``v = 1`` for GPipe and 1F1B). ``stages`` is the pipeline ranks ``p``. None for the
    zero-bubble schedules, which have no closed form here (they are built to remove it)."""
    if stages <= 1:
        return 0.0
    if schedule in ONE_STAGE_SCHEDULES:
        virtual_stages = 1
    elif schedule not in LOOPED_SCHEDULES:
        return None
    return (stages - 1) / (virtual_stages * microbatches + stages - 1)


def allreduce_bytes(size_bytes: float, ranks: int) -> float:
    """Bytes one device moves in a ring all-reduce of ``size_bytes`` over ``ranks`` (nccl-tests' bus bytes)."""
    return 2.0 * (ranks - 1) / ranks * size_bytes if ranks > 1 else 0.0


def allgather_bytes(size_bytes: float, ranks: int) -> float:
    """Bytes one device moves in an all-gather (or a reduce-scatter) whose whole array is ``size_bytes``."""
    return (ranks - 1) / ranks * size_bytes if ranks > 1 else 0.0


def tensor_parallel_bytes(
    batch: int, sequence: int, hidden: int, layers: int, tp: int, bytes_per_value: int
) -> float:
    """Tensor-parallel traffic per device per step: ``layers`` (those on the device) x 4 all-reduces of
    ``b s h`` values (attention and MLP, forward and backward; the same volume as all-gather + reduce-scatter with
    sequence parallelism). ``batch`` is what one replica trains per step (all its microbatches)."""
    return layers * 4 * allreduce_bytes(batch * sequence * hidden * bytes_per_value, tp)


def pipeline_bytes(
    batch: int, sequence: int, hidden: int, pp: int, virtual_stages: int, bytes_per_value: int
) -> float:
    """Pipeline traffic per device per step for a rank holding interior stages: each of its ``virtual_stages``
    stages sends the ``b s h`` activations of every microbatch forward and receives their gradient back, so
    ``2 v b s h`` values (the first and last stage send half of that)."""
    if pp <= 1:
        return 0.0
    return 2.0 * virtual_stages * batch * sequence * hidden * bytes_per_value


def data_parallel_bytes(parameters: float, dp: int, kind: str, param_bytes: int, grad_bytes: int) -> float:
    """Data-parallel traffic per device per step for ``parameters`` held by each replica's device: DDP all-reduces
    the gradients; FSDP (ZeRO-3) all-gathers the parameters for forward and again for backward and reduce-scatters
    the gradients (seed 001: 2P + 2P + 2P bytes of 16-bit values, against 4P for the all-reduce)."""
    if kind == Strategy.DDP:
        return allreduce_bytes(parameters * grad_bytes, dp)
    return 2 * allgather_bytes(parameters * param_bytes, dp) + allgather_bytes(parameters * grad_bytes, dp)


def activation_bytes_per_layer(
    micro_batch: int,
    sequence: int,
    hidden: int,
    heads: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    bytes_per_value: int = 2,
) -> float:
    """Activations one transformer layer keeps for backward, for one microbatch (Korthikanti et al. 2022, in
    16-bit values; scaled for other widths): ``s b h (10 + 24/t + 5 a s/(h t))``, or ``s b h (34/t + 5 a s/(h t))``
    with sequence parallelism (which also shards the norms and dropouts the first form keeps whole)."""
    s, b, h, a, t = sequence, micro_batch, hidden, heads, tp
    attention = 5 * a * s / (h * t)
    per_value = (34 / t if sequence_parallel or t == 1 else 10 + 24 / t) + attention
    return s * b * h * per_value * bytes_per_value / 2


def in_flight_microbatches(schedule: str, stage_rank: int, pp: int, microbatches: int, virtual: int) -> int:
    """Microbatches whose activations a pipeline rank holds at once, at most: all of them for GPipe and looped BFS
    (every forward before any backward), ``min(m, p - rank)`` for 1F1B (the warm-up depth), and ``v`` times that
    for the zero-bubble schedules (an upper bound). Interleaved 1F1B as torch's ``ScheduleInterleaved1F1B`` runs it:
    its warm-up forwards, ``(v - 1)`` rounds of microbatches plus two a hop from the last rank, and the first
    forward of its steady phase, which runs before the first backward (microbatch-stages, at most ``m v``)."""
    if schedule in ("gpipe", "looped-bfs"):
        return microbatches * virtual
    if schedule == "interleaved-1f1b":
        per_round = microbatches // max(1, microbatches // pp)
        warmup = (virtual - 1) * per_round + 2 * (pp - 1 - stage_rank)
        return min(microbatches * virtual, warmup + 1)
    depth = min(microbatches, pp - stage_rank)
    return depth if schedule == "1f1b" else min(microbatches * virtual, depth * virtual)


@dataclass(frozen=True)
class RoutedExperts:
    """A mixture of experts' feed-forward as the activation count sees it: ``experts`` SwiGLU experts of hidden
    width ``ffn``, ``top_k`` of them per token, a shared expert of width ``shared_ffn`` (0: none), in ``moe_layers``
    of the blocks (the first ones may be dense SwiGLUs of the shape's ``gated_ffn``); ``grouped``: the experts run
    as grouped matmuls over rows padded per expert (else one matmul per expert)."""

    experts: int
    top_k: int
    ffn: int
    shared_ffn: int
    moe_layers: int
    grouped: bool = True


@dataclass(frozen=True)
class TransformerShape:
    """A GPT-like model as the formulas see it: layers ``l``, width ``h``, heads ``a``, context ``s``, vocabulary
    ``V``; ``layer_parameters`` and ``other_parameters`` (embeddings, final norm) where known, else the usual
    ``12 h^2 + 13 h`` per layer and ``(V + s) h`` besides."""

    layers: int
    hidden: int
    heads: int
    sequence: int
    vocab: int
    layer_parameters: int | None = None
    other_parameters: int | None = None
    # the positions of a sequence whose logits are computed: all of them (None), or a masked language model's
    # predicted positions (BERT's head runs on those alone)
    logit_positions: int | None = None
    # a Llama-style block (RMSNorm, rotary attention with grouped-query heads, SwiGLU): the gated MLP's hidden width
    # and the keys' and values' width (n_kv_heads x head_dim); None for a GPT-style block (LayerNorm, 4h GELU MLP)
    gated_ffn: int | None = None
    kv_width: int | None = None
    # a mixture of experts' routed feed-forward (with gated_ffn its dense blocks' width, where it has any)
    routed: RoutedExperts | None = None
    # the logits' columns the loss reads, where it drops the vocabulary's padding columns first (the GPT's and
    # BERT's); None: all of them
    loss_vocab: int | None = None
    # the parameters of the stem (embeddings) and of the head (final norm, output layer), each counted whole: a head
    # tied to the embedding counts it in both, as the pipeline stage holding the head gets its own copy; None where
    # unknown (then every pipeline rank is taken to hold all of other_parameters)
    stem_parameters: int | None = None
    head_parameters: int | None = None

    @property
    def logit_tokens(self) -> int:
        """Positions per sequence whose vocabulary-wide logits (and their gradients) exist."""
        return self.logit_positions if self.logit_positions is not None else self.sequence

    @property
    def loss_columns(self) -> int:
        """The vocabulary columns the loss's log-probabilities span (the padding left out where the loss drops it)."""
        return self.loss_vocab if self.loss_vocab is not None else self.vocab

    @property
    def parameters_per_layer(self) -> int:
        h = self.hidden
        return self.layer_parameters if self.layer_parameters is not None else 12 * h * h + 13 * h

    @property
    def parameters_outside_layers(self) -> int:
        if self.other_parameters is not None:
            return self.other_parameters
        return (self.vocab + self.sequence) * self.hidden + 2 * self.hidden

    def outside_parameters_on(self, stem: bool, head: bool) -> int:
        """The parameters outside the layers that a pipeline rank holding the ``stem`` and/or the ``head`` keeps:
        each part's where the shape knows them (a tied head gets its own copy on its stage, even on the stem's rank),
        else all of them either way."""
        if self.stem_parameters is None or self.head_parameters is None:
            return self.parameters_outside_layers if stem or head else 0
        return self.stem_parameters * stem + self.head_parameters * head


@dataclass(frozen=True)
class ParallelEstimate:
    """Per device, for the busiest pipeline rank (the first: the embeddings and the deepest warm-up): memory by
    kind, communication per step by mesh axis, and the bubble. Bytes; figures are estimates, not measurements."""

    layers_per_stage: float
    parameters_per_device: float
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    communication_bytes: dict[str, float]
    bubble: float | None

    @property
    def memory_bytes(self) -> float:
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes + self.activations_bytes

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "memory_bytes": self.memory_bytes}


def estimate_parallel(
    shape: TransformerShape,
    mesh: ParallelDims,
    batch: int,
    param_bytes: int = 4,
    grad_bytes: int = 4,
    optimizer_bytes: int = 8,
    activation_bytes: int = 4,
    stage_rank: int = 0,
) -> ParallelEstimate:
    """Memory and communication per device of one step of ``batch`` samples per replica on ``mesh``, on pipeline
    rank ``stage_rank`` (the first by default).

    A pipeline rank holds ``l / (p v)`` layers per stage, ``v`` stages, and the embeddings if it holds the first
    stage, the final norm and output layer if it holds the last (both kept whole on every tensor-parallel rank, as
    accelbench's tensor parallelism does; without a pipeline, all of them); tensor parallelism divides the layers'
    parameters, FSDP divides everything by ``dp``. AdamW keeps two fp32 moments (``optimizer_bytes`` = 8 per
    parameter). Activations: :func:`activation_bytes_per_layer` for the layers of the stage times the microbatches
    in flight (:func:`in_flight_microbatches`).
    """
    stages = mesh.pp * mesh.virtual_stages
    layers_per_stage = shape.layers / stages
    layers_here = layers_per_stage * mesh.virtual_stages
    outside = (
        shape.outside_parameters_on(
            stem=mesh.stage_holder(0) == stage_rank, head=mesh.stage_holder(mesh.stages - 1) == stage_rank
        )
        if mesh.pp > 1
        else shape.parameters_outside_layers
    )
    parameters = layers_here * shape.parameters_per_layer / mesh.tp + outside
    held = parameters / mesh.dp if mesh.shards_parameters else parameters  # FSDP shards; DDP replicates
    micro_batch = batch // max(1, mesh.microbatches) if mesh.pp > 1 else batch
    in_flight = (
        in_flight_microbatches(mesh.schedule, stage_rank, mesh.pp, mesh.microbatches, mesh.virtual_stages)
        if mesh.pp > 1
        else 1
    )
    per_layer = activation_bytes_per_layer(
        micro_batch,
        shape.sequence,
        shape.hidden,
        shape.heads,
        mesh.tp,
        mesh.sequence_parallel,
        activation_bytes,
    )
    activations = per_layer * layers_per_stage * in_flight
    communication = {
        "tp": tensor_parallel_bytes(
            batch, shape.sequence, shape.hidden, round(layers_here), mesh.tp, activation_bytes
        ),
        "pp": pipeline_bytes(
            batch, shape.sequence, shape.hidden, mesh.pp, mesh.virtual_stages, activation_bytes
        ),
        "dp": data_parallel_bytes(
            parameters, mesh.dp, mesh.data_parallel or Strategy.FSDP.value, param_bytes, grad_bytes
        ),
    }
    return ParallelEstimate(
        layers_per_stage=layers_per_stage,
        parameters_per_device=held,
        weights_bytes=held * param_bytes,
        gradients_bytes=held * grad_bytes,
        optimizer_bytes=held * optimizer_bytes,
        activations_bytes=activations,
        communication_bytes=communication,
        bubble=pipeline_bubble(mesh.schedule, mesh.pp, mesh.microbatches, mesh.virtual_stages),
    )
