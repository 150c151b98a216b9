"""Activations a device keeps for backward: Korthikanti et al. 2022 for transformers, scaled to the activations'
width and to what the attention kernel keeps."""

from __future__ import annotations

import math

from accelbench.estimate.facts import WorkloadFacts
from accelbench.estimate.notes import Notes
from accelbench.estimate.parallel import (
    RoutedExperts,
    TransformerShape,
    activation_bytes_per_layer,
    in_flight_microbatches,
)
from accelbench.estimate.stack import dropout_mask_bytes
from accelbench.estimate.state import StateBytes
from accelbench.parallel_dims import ParallelDims


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
    notes: Notes,
    tp: int = 1,
    sequence_parallel: bool = False,
    *,
    device_type: str = "cuda",
    checkpointing: bool = False,
) -> float | None:
    """Activations one device keeps at the end of forward (its layers, for one microbatch of ``micro_batch``).

    Transformers: Korthikanti et al. 2022 (seed 001's ``b(34 s d + 5 a s^2) l`` in 16-bit values) through
    :func:`accelbench.estimate.parallel.activation_bytes_per_layer`, scaled to the activations' width:

    - the ``34 s b h`` part always; under autocast ``+ 4 s b h``, since both norms' inputs (the residual stream)
      stay fp32 where Korthikanti counts 16 bits;
    - its two dropout masks (1 byte each in Korthikanti's count, fused dropout's bool mask) at the width the device
      keeps them: torch's CPU dropout multiplies by a noise tensor of the activation's type
      (:func:`accelbench.estimate.stack.dropout_mask_bytes`);
    - on a CPU under autocast, attention's inputs q, k and v in fp32 (CPU autocast runs
      scaled_dot_product_attention in fp32, so it keeps fp32 copies: 12 bytes ``s b h``, not Korthikanti's 6);
    - the ``a s^2`` part only where attention keeps its scores: not with fused attention (flash, memory-efficient
      SDPA), which recomputes them; with torch's math path (a CPU with dropout) 12 bytes a score, not 5 (see
      :data:`MATH_ATTENTION_BYTES_PER_SCORE`);
    - around the layers (Korthikanti's first and last stages): the embedding dropout's mask, the final norm's and
      output layer's inputs ``4 s b h`` (16-bit) and the fp32 log-probabilities ``4 s b V``.

    With activation checkpointing each layer keeps only its input (the residual stream, fp32 under autocast) and
    one layer's activations are rebuilt at a time in backward (counted in :func:`backward_transient_bytes`).
    """
    shape = facts.transformer
    if shape is None:
        notes.assume(
            f"no activation formula for workload {facts.workload!r} (not a transformer): activations unknown"
        )
        return None
    mask = dropout_mask_bytes(device_type, state.activation)
    b = micro_batch
    if checkpointing:
        per_layer = checkpointed_layer_bytes(shape, b, state, tp, sequence_parallel)
        notes.assume(
            "activation checkpointing: each layer keeps its input (the residual stream) and rebuilds the rest in "
            "backward, one layer at a time"
        )
    else:
        per_layer = layer_activation_bytes(
            shape,
            b,
            state,
            keeps_scores,
            tp,
            sequence_parallel,
            device_type=device_type,
            dropout=facts.dropout > 0,
        )
        note_activations(state, keeps_scores, notes)
    if facts.dropout > 0:
        notes.assume(
            f"dropout masks: {mask} byte(s) a value ("
            + (
                "torch's fused dropout keeps a bool mask)"
                if mask == 1
                else "torch multiplies by a noise tensor of the activation's type; Korthikanti counts 1 byte)"
            )
        )
    return per_layer * shape.layers + outside_layer_bytes(facts, micro_batch, state, device_type)


def outside_layer_bytes(facts: WorkloadFacts, micro_batch: int, state: StateBytes, device_type: str) -> float:
    """What a whole model keeps for backward around its layers (Korthikanti's first and last stages): the embedding
    dropout's mask, the final norm's and output layer's inputs ``4 s b h`` (16-bit) and the fp32 log-probabilities
    ``4 s b V``, of every position or of a masked language model's predicted ones (BERT's head picks them). Whole
    on every tensor-parallel rank: accelbench's tensor parallelism splits the layers only."""
    shape = facts.transformer
    assert shape is not None
    s, h, b = shape.sequence, shape.hidden, micro_batch
    mask = dropout_mask_bytes(device_type, state.activation) * (facts.dropout > 0)
    return s * b * h * (mask + 4 * state.activation / 2) + 4 * shape.logit_tokens * b * shape.loss_columns


def checkpointed_layer_bytes(
    shape: TransformerShape, micro_batch: int, state: StateBytes, tp: int = 1, sequence_parallel: bool = False
) -> float:
    """What a checkpointed layer keeps for one microbatch: its input, the residual stream (fp32 under autocast),
    replicated over tensor parallelism unless sequence parallelism shards it."""
    residual = 4 if state.autocast_copy else state.activation
    return shape.sequence * micro_batch * shape.hidden * residual / (tp if sequence_parallel else 1)


def layer_activation_bytes(
    shape: TransformerShape,
    micro_batch: int,
    state: StateBytes,
    keeps_scores: bool,
    tp: int = 1,
    sequence_parallel: bool = False,
    *,
    device_type: str = "cuda",
    dropout: bool = True,
) -> float:
    """One layer's activations for one microbatch (see :func:`activation_bytes`); without ``dropout`` no masks.

    Under sequence parallelism torch's ``ColwiseParallel(input_layouts=Shard(1))`` all-gathers the sequence-sharded
    input and the linear keeps the gathered tensor for its weight's gradient, where Megatron keeps the shard and
    gathers again in backward (Korthikanti's ``34/t``): the qkv and first feed-forward linears' inputs are whole,
    ``2 (1 - 1/t)`` more ``s b h`` values than Korthikanti's count (gpt-micro at tp=2 measured −6.2% without this,
    −0.3% with it)."""
    if shape.gated_ffn is not None:
        return gated_layer_activation_bytes(
            shape, micro_batch, state, keeps_scores, tp, sequence_parallel, device_type=device_type
        )
    s, h, a, b = shape.sequence, shape.hidden, shape.heads, micro_batch
    split = tp if sequence_parallel else 1
    per_layer = activation_bytes_per_layer(b, s, h, 0, tp, sequence_parallel, state.activation)
    # Korthikanti's two 1-byte dropout masks (scaled with the width above) at the width the device keeps them
    mask = dropout_mask_bytes(device_type, state.activation) if dropout else 0
    per_layer += 2 * s * b * h * (mask - state.activation / 2) / split
    if state.autocast_copy:
        per_layer += 4 * s * b * h / split
        if device_type == "cpu":  # q, k, v cast to fp32 for CPU autocast's fp32 attention: 12 bytes, not 6
            per_layer += 6 * s * b * h / tp
    if keeps_scores:
        per_layer += MATH_ATTENTION_BYTES_PER_SCORE * a * s * s * b / tp
    if sequence_parallel and tp > 1:  # the two column-parallel linears keep their gathered inputs whole
        per_layer += 2 * s * b * h * state.activation * (1 - 1 / tp)
    return per_layer


def gated_layer_activation_bytes(
    shape: TransformerShape,
    micro_batch: int,
    state: StateBytes,
    keeps_scores: bool,
    tp: int = 1,
    sequence_parallel: bool = False,
    *,
    device_type: str = "cuda",
) -> float:
    """One Llama-style layer's activations for one microbatch (RMSNorm, rotary grouped-query attention, SwiGLU, no
    dropout), tensor by tensor as autograd saves them, with ``a`` the activations' bytes a value and ``r`` the
    residual stream's (fp32 under autocast over fp32 weights, else ``a``):

    - each RMSNorm its input (``r s b h``) and a per-token scale with CUDA's fused kernel; torch's CPU norm is
      composite, computes in fp32 and keeps its input in fp32 and the normalised values (``4 + 4`` bytes a value);
    - the linears' inputs: under autocast each linear casts its input itself, so q, k, v and the gate and up
      projections keep one ``a s b h`` copy each (5); without autocast the two norms' outputs (2);
    - attention: the rotated queries and the output (``a s b h`` each), the rotated keys and the values
      (``a s b h_kv`` each, ``h_kv`` = kv heads x head width), the output serving as wo's input; the scores only
      where the kernel keeps them;
    - SwiGLU: the gate and up projections, SiLU's output and the product that is the down projection's input (4
      of ``a s b f``);
    - under sequence parallelism each of the five column-parallel linears (q, k, v, gate, up) gathers its
      sequence-sharded input itself and keeps it (or its own cast) whole, and the shards are kept by no one (see
      :func:`layer_activation_bytes`; llama-tiny at tp=2, vocabulary 512, fp32: −13.8% without this, −1.8% with it).

    A mixture of experts (``shape.routed``) has, in each of its MoE blocks, in place of the SwiGLU (:func:`_routed`):
    the router's and the shared expert's input casts, the shared expert's SwiGLU, and the routed rows; its first
    dense blocks, if any, are Llama blocks. The mean over the blocks is returned (times the layers: the total).

    Measured on this CPU by a saved-tensor hook over llama-small's and moe-mini's steps (bf16-mixed, batch 4: 55
    bytes per ``s b h`` a llama-small layer, exact); for CUDA the norms' difference is inferred from an H100's
    llama-small tensor peak (1,841 MiB of activations at batch 32; 47 bytes per ``s b h`` a layer by this count).
    """
    s, h, b = shape.sequence, shape.hidden, micro_batch
    f, kv = shape.gated_ffn or 4 * h, shape.kv_width or h
    a = state.activation
    r = 4 if state.autocast_copy else a
    split = tp if sequence_parallel else 1
    tokens = s * b
    # the two norms: their inputs (the CPU's composite norm keeps an fp32 copy of a 16-bit one) and the CPU's fp32
    # normalised values, and their outputs where no cast follows
    norm = (r if device_type == "cuda" else 4 + 4) + (0 if state.autocast_copy else a)
    common = tokens * h * 2 * norm / split
    common += tokens * (2 * a * h + 2 * a * kv) / tp  # rotated q and the output; rotated k and v
    if keeps_scores:
        common += MATH_ATTENTION_BYTES_PER_SCORE * shape.heads * s * s * b / tp
    # one linear's own cast of its input, of the gathered input under sequence parallelism (whole: see
    # :func:`layer_activation_bytes`)
    casts = tokens * h * a if state.autocast_copy else 0.0
    if sequence_parallel and tp > 1 and not state.autocast_copy:
        # the norms' outputs are kept as the linears' inputs: each of the five column-parallel linears gathers its
        # own, whole, and no one keeps the shards
        common += tokens * h * a * (5 - 2 / tp)
    dense = common + 3 * casts + 2 * casts + tokens * 4 * a * f / tp  # q, k, v; gate, up; SwiGLU
    routed = shape.routed
    if routed is None:
        return dense
    moe = common + 3 * casts + _routed(routed, tokens, h, a, r, casts)
    return (moe * routed.moe_layers + dense * (shape.layers - routed.moe_layers)) / shape.layers


def _routed(routed: RoutedExperts, tokens: int, h: int, a: int, r: int, casts: float) -> float:
    """One MoE block's feed-forward activations (see :func:`gated_layer_activation_bytes`): the router's input
    cast; the shared expert's two input casts and its SwiGLU (4 of ``a t f_shared``); the routed rows, ``t k`` of
    them (as many on an expert-parallel rank, routing even): their copy in the experts' dtype, the buffer padded
    per expert for the grouped matmuls (each expert's rows rounded up to 16 bytes' worth: ``t k + E x (align - 1)``
    rows, the worst case the buffer is sized for; an expert-parallel rank's E/ep experts pad less), the experts'
    SwiGLU over it (4 of ``a rows f``), their outputs and those weighted by the gates (in the norm output's dtype,
    ``r``)."""
    rows = tokens * routed.top_k
    align = 16 // a
    padded = rows + routed.experts * (align - 1) if routed.grouped else rows
    shared = 2 * casts + tokens * 4 * a * routed.shared_ffn if routed.shared_ffn else 0.0
    experts = rows * h * a + padded * h * a + padded * 4 * a * routed.ffn + rows * h * (a + r)
    return casts + shared + experts


def backward_transient_bytes(
    facts: WorkloadFacts,
    micro_batch: int,
    state: StateBytes,
    keeps_scores: bool,
    *,
    device_type: str = "cuda",
    checkpointing: bool = False,
    tp: int = 1,
    sequence_parallel: bool = False,
) -> float:
    """What backward holds at its high point beside the activations: at its start the cross-entropy's gradients
    with respect to the log-probabilities and to the logits, fp32 ``4 s b V`` each (``s``: the positions whose
    logits are computed, a masked language model's predicted ones; whole on every tensor-parallel rank, as the head
    is); with activation checkpointing the larger of those and what the last layer's backward holds once it is
    rebuilt (:func:`rebuilt_layer_bytes`)."""
    shape = facts.transformer
    if shape is None:
        return 0.0
    loss = loss_gradient_bytes(shape, micro_batch)
    if checkpointing:
        rebuilt = rebuilt_layer_bytes(
            facts, micro_batch, state, keeps_scores, tp, sequence_parallel, device_type
        )
        return max(loss, rebuilt)
    return loss


def sharded_block_backward_bytes(
    facts: WorkloadFacts,
    micro_batch: int,
    state: StateBytes,
    device_type: str,
    tp: int = 1,
    sequence_parallel: bool = False,
) -> float:
    """Under FSDP (which gathers a block's parameters as its backward starts, and the next block's beside them), what
    the last block's backward holds at its first linear (the feed-forward's second) beside the activations counted
    at the end of forward: the gradient of that linear's input (``s b f``, split over ``tp``) and of the block's
    output before and after its dropout (``s b h`` each, one without dropout, whole unless sequence parallelism
    shards it), the linear's weight gradient (``f h``, split; unsharded until the block's reduce-scatter) and the
    head's (``V h``: the root unit's, reduce-scattered at the end of backward); less what the head kept, freed by
    its backward (the final norm's and output layer's inputs and the log-probabilities; the loss's gradients are
    gone too). Measured: rank 0 of a 2-layer, 64-wide GPT under FSDP on two processes, MemTracker's peak in the
    last block's ``mlp.proj`` backward, within 0.2% of this count beside two blocks and the root gathered."""
    shape = facts.transformer
    assert shape is not None
    s, h, b, a, g = shape.sequence, shape.hidden, micro_batch, state.activation, state.grad
    f = shape.gated_ffn or 4 * h
    mask = dropout_mask_bytes(device_type, a) if facts.dropout > 0 else 0
    output = s * b * h * ((2 * a - mask) if mask else a) / (tp if sequence_parallel else 1)
    gradients = s * b * f * a / tp + f * h * g / tp + shape.vocab * h * g
    head = outside_layer_bytes(facts, b, state, device_type) - s * b * h * mask
    return output + gradients - head


def rebuilt_layer_bytes(
    facts: WorkloadFacts,
    micro_batch: int,
    state: StateBytes,
    keeps_scores: bool,
    tp: int,
    sequence_parallel: bool,
    device_type: str,
) -> float:
    """With activation checkpointing, what the backward of the last layer holds beside the activations counted at
    the end of forward, at its feed-forward's nonlinearity: the layer rebuilt (its activations, split over ``tp``);
    the gradients of the nonlinearity's output and input (``2 s b f``, split) and of the layer's output before and
    after its dropout (``2 s b h``, whole unless sequence parallelism shards it), less the two tensors already freed (the second linear's input, ``s b f``,
    and the output dropout's mask); and less what the head kept, freed by its backward before the layer is rebuilt
    (the final norm's and output layer's inputs, ``2 s b h``, and the log-probabilities; the loss's gradients are gone
    too)."""
    shape = facts.transformer
    assert shape is not None
    s, h, b, a = shape.sequence, shape.hidden, micro_batch, state.activation
    f = shape.gated_ffn or 4 * h
    mask = dropout_mask_bytes(device_type, a) if facts.dropout > 0 else 0
    rebuilt = layer_activation_bytes(
        shape, b, state, keeps_scores, tp, sequence_parallel, device_type=device_type, dropout=mask > 0
    )
    feed_forward = s * b * f * a / tp + s * b * h * (2 * a - mask) / (tp if sequence_parallel else 1)
    # what the model keeps around its layers, less the embedding dropout's mask (alive until the embedding's backward)
    head = outside_layer_bytes(facts, b, state, device_type) - s * b * h * mask
    return max(0.0, rebuilt + feed_forward - head)


def first_layer_backward(
    facts: WorkloadFacts,
    micro_batch: int,
    state: StateBytes,
    keeps_scores: bool,
    tp: int = 1,
    sequence_parallel: bool = False,
    device_type: str = "cuda",
) -> tuple[float, float]:
    """With activation checkpointing, the backward of the first layer, the last one backpropagated: what it holds
    beside the activations counted at the end of forward, and the share of the gradients made by then.

    It holds what the last layer's does (:func:`rebuilt_layer_bytes`: the layer rebuilt, its feed-forward's
    gradients, the head's tensors freed) less the later layers' inputs, freed by their backward, and beside it the
    gradients of the later layers and of the head's own parameters (a head tied to the embedding accumulates its
    gradient last, with the embedding's). Where the layers' inputs are small beside their gradients (sequence
    parallelism shards them; a narrow, short model) this is the high point of backward: measured on the 2-layer,
    64-wide configuration at tp=2 with sequence parallelism (MemTracker's peak in the first block's feed-forward
    backward, the second block's gradients alive)."""
    shape = facts.transformer
    assert shape is not None
    later = max(0, shape.layers - 1)
    freed_inputs = later * checkpointed_layer_bytes(shape, micro_batch, state, tp, sequence_parallel)
    extra = rebuilt_layer_bytes(facts, micro_batch, state, keeps_scores, tp, sequence_parallel, device_type)
    per_layer, outside = shape.parameters_per_layer, shape.parameters_outside_layers
    head_own = outside - shape.stem_parameters if shape.stem_parameters is not None else 0
    made = (later * per_layer + head_own) / max(1, shape.layers * per_layer + outside)
    return extra - freed_inputs, made


def layer_gradient_bytes(
    shape: TransformerShape, micro_batch: int, state: StateBytes, keeps_scores: bool, tp: int = 1
) -> float:
    """The gradients one layer's backward holds at its widest, beside its saved activations: the gradient of the
    attention's probabilities and of its scores where the scores are kept (``2 a s^2 b``, fp32 on a CPU's math
    path), else the feed-forward's, of its hidden activations before and after the nonlinearity (``2 s b f``); at
    the activations' width, the scores' fp32 under CPU autocast."""
    s, b = shape.sequence, micro_batch
    if keeps_scores:
        return 2 * shape.heads * s * s * b * max(4 if state.autocast_copy else 0, state.activation) / tp
    return 2 * s * b * (shape.gated_ffn or 4 * shape.hidden) * state.activation / tp


def pipeline_boundary_bytes(
    facts: WorkloadFacts,
    mesh: ParallelDims,
    micro_batch: int,
    state: StateBytes,
    device_type: str,
    stage_rank: int = 0,
) -> tuple[float, int]:
    """What pipeline rank ``stage_rank`` holds for its microbatches in flight beside its layers' activations, and
    how many microbatch-stages are in flight: each stage's output (``s b h``), kept by the stage to run its
    backward; on the last stage that output is the logits (:func:`head_bytes`, with the loss's log-probabilities);
    on the first, the embedding dropout noise (or mask) for each of its own microbatches in flight; less, on the
    later stages, their inputs, which are the stages' receive buffers."""
    shape = facts.transformer
    assert shape is not None
    in_flight = in_flight_microbatches(
        mesh.schedule, stage_rank, mesh.pp, mesh.microbatches, mesh.virtual_stages
    )
    values = boundary_values(facts, mesh, micro_batch)
    heads = head_microbatches(mesh, stage_rank)
    held = values * state.activation * (in_flight - heads) + heads * head_bytes(shape, micro_batch, state)
    # a later stage's input, which its first layer keeps, is its receive buffer (pipeline_receive_buffer_bytes)
    own = math.ceil(in_flight / mesh.virtual_stages) if mesh.stage_holder(0) == stage_rank else 0
    held -= values * state.activation * (in_flight - own)
    held += embedding_noise_bytes(facts, mesh, micro_batch, state, device_type, stage_rank) * own
    return held, in_flight


def embedding_noise_bytes(
    facts: WorkloadFacts,
    mesh: ParallelDims,
    micro_batch: int,
    state: StateBytes,
    device_type: str,
    stage_rank: int,
) -> float:
    """The embedding dropout's noise (or mask) the first stage keeps for one microbatch in flight, on the pipeline
    rank holding it (none elsewhere, nor without dropout)."""
    if mesh.stage_holder(0) != stage_rank or facts.dropout <= 0:
        return 0.0
    return boundary_values(facts, mesh, micro_batch) * dropout_mask_bytes(device_type, state.activation)


def boundary_values(facts: WorkloadFacts, mesh: ParallelDims, micro_batch: int) -> float:
    """The values of one microbatch's tensor at a pipeline stage boundary (the residual stream, ``s b h``), on one
    tensor-parallel rank: sharded by sequence parallelism, else whole."""
    shape = facts.transformer
    assert shape is not None
    return shape.sequence * micro_batch * shape.hidden / (mesh.tp if mesh.sequence_parallel else 1)


def pipeline_receive_buffer_bytes(
    facts: WorkloadFacts, mesh: ParallelDims, micro_batch: int, state: StateBytes, stage_rank: int = 0
) -> float:
    """The receive buffers torch.distributed.pipelining keeps on pipeline rank ``stage_rank`` from step to step:
    each of its stages allocates, at its first step, one buffer a microbatch for the activations it receives
    (every stage but the first) and one for the gradients sent back to it (every stage but the last), each a
    stage boundary's ``s b h`` (sharded by sequence parallelism). Measured: rank 0 of a looped-BFS gpt-micro (stages
    0 and 2, 4 microbatches) held 12 such buffers."""
    ends = sum(int(stage > 0) + int(stage < mesh.stages - 1) for stage in mesh.stage_ids(stage_rank))
    return boundary_values(facts, mesh, micro_batch) * state.activation * mesh.microbatches * ends


def pipeline_sent_bytes(
    facts: WorkloadFacts, mesh: ParallelDims, micro_batch: int, state: StateBytes
) -> float:
    """What a looped BFS rank's later stages have sent, held until the step ends: torch's runtime schedules wait
    for their sends only then, so each send keeps its tensor, every microbatch's output sent forward and every
    input gradient sent back (``2 m s b h`` a stage that is neither the first nor the last)."""
    return (
        2
        * boundary_values(facts, mesh, micro_batch)
        * state.activation
        * mesh.microbatches
        * (mesh.virtual_stages - 1)
    )


def head_microbatches(mesh: ParallelDims, stage_rank: int) -> int:
    """The microbatches whose logits pipeline rank ``stage_rank`` holds at once: none where it does not hold the
    last stage; all of them where every forward runs first (GPipe, looped BFS); else one, as each last-stage
    forward is followed by its backward before the next (measured: the last rank of a 1F1B pipeline holds one
    microbatch's logits whatever the microbatch count, once the schedule returns no outputs)."""
    if mesh.stage_holder(mesh.stages - 1) != stage_rank:
        return 0
    return mesh.microbatches if mesh.schedule in ("gpipe", "looped-bfs") else 1


def head_bytes(shape: TransformerShape, micro_batch: int, state: StateBytes) -> float:
    """What the last pipeline stage keeps of one microbatch for its backward beyond its layers': its output, the
    logits (``s b V`` at the activations' width: the output layer's), kept by the stage until the loss's backward,
    and the loss's fp32 log-probabilities (``4 s b V``, over the columns the loss reads); the final norm's output
    besides (``s b h``). Whole on every tensor-parallel rank: the head is not split."""
    positions = shape.logit_tokens * micro_batch
    logits = positions * (shape.vocab * state.activation + 4 * shape.loss_columns)
    return logits + shape.sequence * micro_batch * shape.hidden * state.activation


def loss_gradient_bytes(shape: TransformerShape, micro_batch: int) -> float:
    """The loss's gradients, fp32, alive at the start of backward: with respect to the log-probabilities (the
    columns the loss reads) and to the logits (every column: dropping the padding's columns pads their gradient
    back with zeros), ``4 s b V`` each."""
    return 4 * shape.logit_tokens * micro_batch * (shape.loss_columns + shape.vocab)


def pipeline_runs_forward_after_backward(mesh: ParallelDims, in_flight: int) -> bool:
    """Whether a pipeline rank, holding ``in_flight`` microbatch-stages at its first backward, runs a forward
    after it (so that its microbatches in flight meet the gradients made): 1F1B's and interleaved 1F1B's steady
    phase, where the microbatch-stages outnumber those; never GPipe's or looped BFS's (every forward first)."""
    if mesh.schedule in ("gpipe", "looped-bfs"):
        return False
    return mesh.microbatches * mesh.virtual_stages > in_flight


def note_activations(state: StateBytes, keeps_scores: bool, notes: Notes) -> None:
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
