"""Memory and collectives of one device under each strategy: data parallelism (single, DDP, FSDP2), DeepSpeed ZeRO
1-3, and tensor and pipeline parallelism through :mod:`accelbench.estimate.parallel`.

Communication is counted in nccl-tests' bus bytes per device (see :mod:`accelbench.estimate.predictor`).
"""

from __future__ import annotations

import dataclasses
import math

from accelbench.contract.strategies import Strategy
from accelbench.errors import ConfigError
from accelbench.estimate.activations import (
    activation_bytes,
    backward_transient_bytes,
    boundary_values,
    checkpointed_layer_bytes,
    embedding_noise_bytes,
    first_layer_backward,
    head_bytes,
    head_microbatches,
    layer_activation_bytes,
    layer_gradient_bytes,
    loss_gradient_bytes,
    note_activations,
    outside_layer_bytes,
    pipeline_boundary_bytes,
    pipeline_receive_buffer_bytes,
    pipeline_runs_forward_after_backward,
    pipeline_sent_bytes,
    rebuilt_layer_bytes,
    sharded_block_backward_bytes,
)
from accelbench.estimate.facts import WorkloadFacts
from accelbench.estimate.hardware import Hardware
from accelbench.estimate.notes import Notes
from accelbench.estimate.parallel import (
    ParallelEstimate,
    activation_bytes_per_layer,
    allgather_bytes,
    allreduce_bytes,
    estimate_parallel,
    pipeline_bubble,
)
from accelbench.estimate.schema import CommOp, MemoryBreakdown
from accelbench.estimate.shape import RunShape
from accelbench.estimate.stack import Stack
from accelbench.estimate.state import StateBytes, element_type
from accelbench.parallel_dims import ParallelDims

# torch DistributedDataParallel's default gradient bucket (bucket_cap_mb=25)
DDP_BUCKET_BYTES = 25 * 2**20
DS_PERSISTENCE_THRESHOLD = (
    100_000  # stage3_param_persistence_threshold: smaller tensors stay whole on every rank
)


# --- data parallelism: single, DDP, FSDP2, DeepSpeed ZeRO 1-3 ------------------------------------------------


def first_layer_end_of_backward(
    facts: WorkloadFacts,
    micro: int,
    state: StateBytes,
    keeps_scores: bool,
    device_type: str,
    activations: float | None,
    gradients: float,
    freed: bool,
    tp: int = 1,
    sequence_parallel: bool = False,
) -> float | None:
    """Checkpointed, the first layer's backward beside every gradient (``MemoryBreakdown.end_of_backward_bytes``):
    the activations at the end of forward with what that backward adds (:func:`first_layer_backward`), less the
    gradients not made yet (the first layer's, the embeddings'), where they are ``freed`` each step (not DDP's
    bucket views, alive throughout)."""
    if facts.transformer is None or activations is None:
        return None
    extra, made = first_layer_backward(facts, micro, state, keeps_scores, tp, sequence_parallel, device_type)
    return activations + extra - ((1 - made) * gradients if freed else 0.0)


def sharded_backward_transient(
    facts: WorkloadFacts,
    micro: int,
    state: StateBytes,
    keeps_scores: bool,
    device_type: str,
    checkpointing: bool,
    block_bytes: float,
    tp: int = 1,
    sequence_parallel: bool = False,
) -> float:
    """FSDP2's backward beside the activations (``MemoryBreakdown.backward_transient_bytes``), net of the gathered
    parameters the breakdown's ``transient_bytes`` counts (the root unit and two blocks of ``block_bytes``): the
    larger of its start, the loss's gradients with the root and only the last block gathered (the root's
    pre-backward prefetches it), and the last block's backward, both blocks gathered (the next prefetched), at its
    first linear (:func:`~accelbench.estimate.activations.sharded_block_backward_bytes`) or, checkpointed, once
    rebuilt (:func:`~accelbench.estimate.activations.rebuilt_layer_bytes`)."""
    shape = facts.transformer
    assert shape is not None
    start = loss_gradient_bytes(shape, micro) - block_bytes
    if checkpointing:
        block = rebuilt_layer_bytes(facts, micro, state, keeps_scores, tp, sequence_parallel, device_type)
    else:
        block = sharded_block_backward_bytes(facts, micro, state, device_type, tp, sequence_parallel)
    return max(start, block)


def data_parallel_breakdown(
    facts: WorkloadFacts,
    layout: RunShape,
    state: StateBytes,
    keeps_scores: bool,
    hardware: Hardware,
    notes: Notes,
    stack: Stack | None = None,
) -> tuple[MemoryBreakdown, list[CommOp]]:
    """Memory and collectives of one device under the data-parallel strategies, by ZeRO's partitioning (Rajbhandari
    et al. 2019; seed 001): single and DDP replicate everything; ZeRO-1 shards the optimizer state over the p ranks,
    ZeRO-2 the gradients too, ZeRO-3 and FSDP the parameters too. ``stack`` says what the run's implementation
    does where stacks differ (default: what accelbench's own run does)."""
    stack = stack or Stack()
    p, n = layout.devices, facts.stored_parameters
    strategy = layout.strategy
    micro = layout.batch_size // layout.grad_accum
    device_type = hardware.device_type
    checkpointing = stack.activation_checkpointing
    activations = activation_bytes(
        facts, micro, state, keeps_scores, notes, device_type=device_type, checkpointing=checkpointing
    )

    def start_of_backward() -> float:
        """What backward adds at its start when whole units are held (FSDP over a transformer prices its own)."""
        return backward_transient_bytes(
            facts, micro, state, keeps_scores, device_type=device_type, checkpointing=checkpointing
        )

    sixteen_bit_fsdp = strategy == Strategy.FSDP and stack.fsdp_param_dtype in ("bf16", "fp16")
    # the routed experts' weights are copied too (their grouped matmuls cast them as autocast casts a linear's)
    copied = facts.matmul_parameters + facts.expert_parameters
    autocast = 0 if sixteen_bit_fsdp else state.autocast_copy * copied
    if autocast:
        notes.assume(
            "autocast keeps a 16-bit copy of every linear weight from forward to backward (2 bytes x "
            f"{copied:,} parameters; whole even under FSDP, whose gathered weights it copies)"
        )
    comm: list[CommOp] = []
    grad_total = n * state.grad
    if strategy in (Strategy.SINGLE, Strategy.DDP):
        separate_buckets = strategy == Strategy.DDP and not stack.ddp_bucket_view
        memory = MemoryBreakdown(
            weights_bytes=n * state.param,
            master_weights_bytes=0.0,
            gradients_bytes=n * state.grad,
            optimizer_bytes=n * state.optimizer,
            activations_bytes=activations,
            transient_bytes=autocast,
            buffer_bytes=grad_total if separate_buckets else 0.0,
            backward_transient_bytes=start_of_backward(),
            end_of_backward_bytes=first_layer_end_of_backward(
                facts,
                micro,
                state,
                keeps_scores,
                device_type,
                activations,
                grad_total,
                strategy == Strategy.SINGLE or separate_buckets,
            )
            if checkpointing
            else None,
            optimizer_transient_bytes=optimizer_temporaries(
                facts, state, stack, device_type, notes, shards=1
            ),
            gradients_freed_each_step=strategy == Strategy.SINGLE or separate_buckets,
        )
        if separate_buckets:
            notes.assume(
                "DDP without gradient_as_bucket_view: its buckets are a second copy of the gradients, held "
                "throughout, while the gradients themselves are freed each step (zero_grad(set_to_none=True)) and "
                "made as backward frees the activations"
            )
        if strategy == Strategy.DDP and p > 1:
            message = min(grad_total, DDP_BUCKET_BYTES)
            comm.append(
                CommOp(
                    op="all_reduce",
                    dtype=element_type(state.grad, layout.precision),
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
    elif strategy == Strategy.FSDP:
        units = facts.unit_parameters or (n,)
        largest = max(units)
        gathered_width = 2 if sixteen_bit_fsdp else state.param
        gathered = (facts.outer_parameters + 2 * largest) * gathered_width
        if sixteen_bit_fsdp:
            notes.assume(
                f"FSDP gathers and computes in {stack.fsdp_param_dtype} (MixedPrecisionPolicy param_dtype): 2 bytes "
                "a gathered parameter, no autocast copies"
            )
        memory = MemoryBreakdown(
            weights_bytes=n * state.param / p,
            master_weights_bytes=0.0,
            gradients_bytes=n * state.grad / p,
            optimizer_bytes=n * state.optimizer / p,
            activations_bytes=activations,
            transient_bytes=gathered + autocast,
            backward_transient_bytes=sharded_backward_transient(
                facts, micro, state, keeps_scores, device_type, checkpointing, largest * gathered_width
            )
            if facts.transformer is not None
            else start_of_backward(),
            optimizer_transient_bytes=optimizer_temporaries(
                facts, state, stack, device_type, notes, shards=p
            ),
            gradients_freed_each_step=True,
        )
        notes.cite(
            "memory: FSDP2 shards weights, gradients and AdamW moments over p (the gradients are freed each step: "
            "the peak holds the larger of them and the activations); while computing it holds the root unit (stem "
            "and head: not resharded after forward) and two units' full parameters (one in use, the next prefetched), "
            "at the start of backward one (the last, prefetched)"
        )
        if p > 1:
            # MixedPrecisionPolicy(param_dtype=...) gathers in that dtype and, its reduce_dtype left unset,
            # reduce-scatters the gradients in it too
            fsdp_type = stack.fsdp_param_dtype if sixteen_bit_fsdp else None
            reduced_width = gathered_width if sixteen_bit_fsdp else state.grad
            reduced_total = grad_total * reduced_width / state.grad
            outer = facts.outer_parameters * gathered_width
            comm += [
                CommOp(
                    op="all_gather",
                    dtype=fsdp_type or element_type(gathered_width, layout.precision),
                    axis="dp",
                    ranks=p,
                    what="parameters: each unit in forward and again in backward, the root unit once",
                    count=2 * len(units) + 1,
                    message_bytes=(2 * sum(units) * gathered_width + outer) / (2 * len(units) + 1),
                    bus_bytes=allgather_bytes(2 * sum(units) * gathered_width + outer, p),
                    overlappable=True,
                ),
                CommOp(
                    op="reduce_scatter",
                    dtype=fsdp_type or element_type(state.grad, layout.precision),
                    axis="dp",
                    ranks=p,
                    what="gradients, one unit at a time in backward",
                    count=len(units) + 1,
                    message_bytes=reduced_total / (len(units) + 1),
                    bus_bytes=allgather_bytes(reduced_total, p),
                    overlappable=True,
                ),
            ]
    else:
        memory, comm = zero_breakdown(facts, layout, state, activations, hardware, notes, stack)
        memory = memory.model_copy(
            update={
                "backward_transient_bytes": start_of_backward(),
                "optimizer_transient_bytes": memory.optimizer_transient_bytes
                + optimizer_temporaries(facts, state, stack, device_type, notes, shards=p),
            }
        )
    if p > 1:
        notes.cite(
            "communication: nccl-tests' bus bytes per device: all_reduce 2(p-1)/p S, all_gather and reduce_scatter "
            "(p-1)/p S (NVIDIA's nccl-tests, doc/PERFORMANCE.md; seed 001's 4(1-1/p)P and 2(1-1/p)P for 2-byte values)"
        )
    return memory, comm


def optimizer_temporaries(
    facts: WorkloadFacts,
    state: StateBytes,
    stack: Stack,
    device_type: str,
    notes: Notes,
    *,
    shards: int,
    held: float | None = None,
) -> float:
    """What AdamW allocates while it steps this device's 1/``shards`` of the parameters, beside the state
    (torch.optim.adamw in torch 2.x): foreach kernels take the square root of every second moment into a new list
    (``torch._foreach_sqrt``), one temporary the size of the parameters in the moments' type; a plain loop does the
    same one tensor at a time; the fused kernel works in place."""
    kernels = stack.optimizer_kernels(device_type)
    moment = state.optimizer / 2  # bytes of one moment a parameter
    if kernels == "fused":
        temporaries = 0.0
    elif kernels == "foreach":
        temporaries = (facts.stored_parameters / shards if held is None else held) * moment
    else:
        temporaries = max(facts.tensor_sizes or (facts.stored_parameters,)) * moment
    notes.assume(
        f"AdamW runs {kernels} kernels"
        + (
            ""
            if kernels == "fused"
            else f": the step holds a temporary of {temporaries / 2**20:.1f} MiB (sqrt of the second moments) "
            "beside every gradient"
        )
    )
    return temporaries


def zero_breakdown(
    facts: WorkloadFacts,
    layout: RunShape,
    state: StateBytes,
    activations: float | None,
    hardware: Hardware,
    notes: Notes,
    stack: Stack | None = None,
) -> tuple[MemoryBreakdown, list[CommOp]]:
    """DeepSpeed ZeRO stages 1-3 as DeepSpeed 0.19.8 runs them with accelbench's config (its defaults).

    Memory: the 16-bit (or fp32) model, an fp32 master partition and fp32 moments of 1/p of the parameters, and
    the contiguous gradient bucket of ``reduce_bucket_size`` elements, a tensor allocated whole (an accelerator's
    allocator takes it whole; a CPU's resident memory holds only as much as is written, but the prediction is of
    tensors, which the run's tensor peak measures). ZeRO-1/2 hold no gradients between steps (the step drops its
    gradient partitions, the epilogue of backward releases the bucket): the gradients (whole for ZeRO-1, the
    partition for ZeRO-2) and their fp32 partition are made as backward frees the activations, so the peak holds
    the larger of the two (measured: no gradient outside the bucket at the peak, early in backward). ZeRO-3 holds
    every parameter's partition (``ds_tensor``), over several ranks the tensors under
    ``stage3_param_persistence_threshold`` elements whole beside it and up to ``stage3_prefetch_bucket_size``
    elements fetched ahead (on one rank a parameter is a view of its partition: nothing is gathered), and a
    gradient partition buffer allocated once, which its optimizer step flattens into an fp32 copy.
    Communication: ZeRO-1 and ZeRO-2 all-reduce the gradient bucket (``use_multi_rank_bucket_allreduce``, on by
    default, makes the per-partition reduces one all-reduce) and all-gather the updated partitions; ZeRO-3
    all-gathers the parameters in forward and again in backward and reduce-scatters the gradients (seed 001), and
    after its optimizer step gathers the persistent tensors whole again, one call a tensor (``_post_step``).
    Only ZeRO-3 overlaps them (``overlap_comm`` defaults to on for stage 3 alone).
    """
    stack = stack or Stack()
    reduce_bucket, prefetch_bucket = stack.ds_reduce_bucket, stack.ds_prefetch_bucket
    allgather_bucket = stack.ds_allgather_bucket
    p, n = layout.devices, facts.stored_parameters
    stage = Strategy(layout.strategy).zero_stage
    bucket = reduce_bucket * state.reduction
    notes.assume(
        f"DeepSpeed allocates its gradient bucket whole: {reduce_bucket:.3g} elements x {state.reduction} bytes "
        f"= {bucket / 2**30:.1f} GiB, whatever the model's size"
        + (
            " (a tensor that size, as the run's tensor peak counts it; a CPU's resident set holds only as much of "
            "it as is written, at most the gradients)"
            if hardware.device_type == "cpu"
            else ""
        )
    )
    fp32_grad_partition = 4 * n / p
    persistent = sum(t for t in facts.tensor_sizes if t < DS_PERSISTENCE_THRESHOLD) if stage == 3 else 0
    partitioned = n - persistent
    step_copy = 0.0
    if stage == 3:
        # every parameter's partition (ds_tensor, persistent ones' too) and, over several ranks, the persistent
        # tensors whole beside it; on one rank a parameter is a view of its partition, gathered or not
        several = p > 1
        weights = n * state.param / p + (persistent * state.param if several else 0)
        # the gradient partition buffer, allocated once and held; the step flattens it into an fp32 copy
        gradients = n * state.grad / p
        step_copy = fp32_grad_partition
        fetched = min(partitioned, prefetch_bucket + max(facts.tensor_sizes or (0,)))
        gathered = float(fetched * state.param if several else 0)
        if persistent and several:
            notes.assume(
                f"ZeRO-3 keeps {persistent:,} parameters (tensors under 1e5 elements) whole on every rank, beside "
                "every parameter's partition"
            )
        notes.assume(
            "ZeRO-3 holds its gradient partition buffer all step; the optimizer step adds its fp32 flat copy"
        )
    else:
        weights = float(n * state.param)
        gradients = (n * state.grad if stage == 1 else n * state.grad / p) + fp32_grad_partition
        gathered = 0.0
        notes.assume(
            f"ZeRO-{stage} (contiguous_gradients, DeepSpeed's default) holds no gradients between steps: they are "
            "made in backward as the activations are freed (the bucket holds them) and dropped after the step, so "
            "the peak holds the larger of them and the activations"
        )
    memory = MemoryBreakdown(
        weights_bytes=weights,
        master_weights_bytes=state.master * n / p,
        gradients_bytes=gradients,
        optimizer_bytes=state.optimizer * n / p,
        activations_bytes=activations,
        transient_bytes=gathered,
        buffer_bytes=bucket,
        optimizer_transient_bytes=step_copy,
        gradients_freed_each_step=stage != 3,
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
        message = min(n, reduce_bucket) * state.grad
        comm += [
            CommOp(
                op="all_reduce",
                dtype=element_type(state.grad, layout.precision),
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
                dtype=element_type(state.param, layout.precision),
                axis="dp",
                ranks=p,
                what="updated parameter partitions, after the optimizer step",
                count=math.ceil(n / allgather_bucket),
                message_bytes=min(n, allgather_bucket) * state.param,
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
                    dtype=element_type(state.param, layout.precision),
                    axis="dp",
                    ranks=p,
                    what="partitioned parameters, in forward and again in backward",
                    count=2 * len(tensors),
                    message_bytes=partitioned * state.param / len(tensors),
                    bus_bytes=allgather_bytes(2 * partitioned * state.param, p),
                    overlappable=True,
                )
            )
        kept_whole = [t for t in facts.tensor_sizes if t < DS_PERSISTENCE_THRESHOLD]
        if persistent and kept_whole:
            # the optimizer step updates each persistent tensor's partition only: ZeRO-3's _post_step gathers
            # them whole again, one all-gather per tensor (_allgather_params_coalesced launches one a tensor)
            comm.append(
                CommOp(
                    op="all_gather",
                    dtype=element_type(state.param, layout.precision),
                    axis="dp",
                    ranks=p,
                    what="persistent parameters (tensors under 1e5 elements), one call each after the optimizer "
                    "step",
                    count=len(kept_whole),
                    message_bytes=persistent * state.param / len(kept_whole),
                    bus_bytes=allgather_bytes(persistent * state.param, p),
                    overlappable=False,
                    burst=True,
                )
            )
        comm.append(
            CommOp(
                op="reduce_scatter",
                dtype=element_type(state.grad, layout.precision),
                axis="dp",
                ranks=p,
                what="gradients, in reduce_bucket_size buckets during backward",
                count=math.ceil(n / reduce_bucket),
                message_bytes=min(n, reduce_bucket) * state.grad,
                bus_bytes=allgather_bytes(grad_total, p),
                overlappable=True,
            )
        )
    return memory, comm


# --- tensor and pipeline parallelism: accelbench.estimate.parallel ---------------------------------------


def model_parallel_breakdown(
    facts: WorkloadFacts,
    layout: RunShape,
    state: StateBytes,
    keeps_scores: bool,
    notes: Notes,
    *,
    device_type: str = "cuda",
    stack: Stack | None = None,
) -> tuple[MemoryBreakdown, list[CommOp], float, float | None]:
    """tp, pp and mesh through :func:`accelbench.estimate.parallel.estimate_parallel` (its memory for the busiest
    pipeline rank, its communication by axis), with this module's state widths; FLOPs per device are the replica's
    divided by tp x pp, and the bubble is the schedule's.

    A pipeline's busiest rank is the first (the embeddings and the deepest warm-up) or the one holding the last
    stage (the output layer, and the logits and the loss's gradients, ``s b V`` wide, where a large vocabulary makes
    them outweigh the first rank's microbatches in flight): both are predicted and the larger is the figure."""
    mesh, shape = layout.dims, facts.transformer
    if shape is None:
        raise ConfigError(
            f"strategy {layout.strategy!r}: the tensor/pipeline model needs a transformer's shape; workload "
            f"{facts.workload!r} gives none"
        )
    stack = stack or Stack()
    said = Notes()  # each rank's own assumptions: the busiest's are the prediction's
    memory, result = _rank_memory(facts, layout, state, keeps_scores, said, device_type, stack, 0)
    head_rank = mesh.stage_holder(mesh.stages - 1) if mesh.pp > 1 else 0
    if head_rank != 0:
        aside = Notes()
        last, _ = _rank_memory(facts, layout, state, keeps_scores, aside, device_type, stack, head_rank)
        first_total, last_total = memory.total_bytes or 0.0, last.total_bytes or 0.0
        if last_total > first_total:
            memory, said = last, aside
        said.assume(
            f"pipeline: the busiest rank is the {'last' if last_total > first_total else 'first'} (tensors: first "
            f"rank {first_total / 2**20:,.1f} MiB, last rank {last_total / 2**20:,.1f} MiB)"
        )
    for text in said.assumptions:
        notes.assume(text)
    for text in said.sources:
        notes.cite(text)
    checkpointing = stack.activation_checkpointing
    notes.cite(
        "tensor/pipeline parallelism: accelbench.estimate.parallel.estimate_parallel (memory of the busier of the "
        "first and last pipeline ranks; Korthikanti et al. 2022 activations with t and sequence parallelism; Megatron's bubble)"
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
                dtype=element_type(state.activation, layout.precision),
                axis="tp",
                ranks=mesh.tp,
                what="b s h activations, twice per layer in forward and twice in backward"
                + (" and twice more in the recomputed forward" if checkpointing else ""),
                count=(6 if checkpointing else 4)
                * layers_here
                * max(1, mesh.microbatches if mesh.pp > 1 else 1),
                message_bytes=micro_bytes if mesh.pp > 1 else b * s * h * state.activation,
                bus_bytes=bytes_by_axis["tp"] * (1.5 if checkpointing else 1.0),
                overlappable=False,
            )
        )
    if mesh.tp > 1 and facts.moe_layers:
        comm.append(
            _expert_tensor_parallel(facts, layers_here * facts.moe_layers / shape.layers, mesh, state, layout)
        )
    if mesh.pp > 1:
        comm.append(
            CommOp(
                op="sendrecv",
                dtype=element_type(state.activation, layout.precision),
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
        if mesh.data_parallel == Strategy.DDP:
            comm.append(
                CommOp(
                    op="all_reduce",
                    dtype=element_type(state.grad, layout.precision),
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
                    dtype=element_type(state.param, layout.precision),
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
                    dtype=element_type(state.grad, layout.precision),
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


def _rank_memory(
    facts: WorkloadFacts,
    layout: RunShape,
    state: StateBytes,
    keeps_scores: bool,
    notes: Notes,
    device_type: str,
    stack: Stack,
    stage_rank: int,
) -> tuple[MemoryBreakdown, ParallelEstimate]:
    """The memory of pipeline rank ``stage_rank`` (0 without a pipeline) under tp, pp or a mesh of them, and
    :func:`estimate_parallel`'s figures for it."""
    mesh, shape = layout.dims, facts.transformer
    assert shape is not None
    result = estimate_parallel(
        shape,
        mesh,
        layout.batch_size,
        param_bytes=state.param,
        grad_bytes=state.grad,
        optimizer_bytes=state.optimizer,
        activation_bytes=state.activation,
        stage_rank=stage_rank,
    )
    micro = layout.batch_size // max(1, mesh.microbatches) if mesh.pp > 1 else layout.batch_size
    theirs = activation_bytes_per_layer(
        micro, shape.sequence, shape.hidden, shape.heads, mesh.tp, mesh.sequence_parallel, state.activation
    )
    mine = layer_activation_bytes(
        shape,
        micro,
        state,
        keeps_scores,
        mesh.tp,
        mesh.sequence_parallel,
        device_type=device_type,
        dropout=facts.dropout > 0,
    )
    if mesh.sequence_parallel and mesh.tp > 1:
        notes.assume(
            "sequence parallelism as torch's styles run it: each column-parallel linear gathers its sequence-sharded "
            "input and keeps it whole for its backward (Megatron keeps the shard and gathers again; Korthikanti's "
            "34/t counts that)"
        )
    checkpointing = stack.activation_checkpointing
    in_backward = 0.0  # the layer backpropagated: rebuilt with checkpointing, its gradients' temporaries (pp)
    if checkpointing:
        # each layer keeps only its input for each microbatch in flight, and its backward rebuilds one layer at a time
        kept = checkpointed_layer_bytes(shape, micro, state, mesh.tp, mesh.sequence_parallel)
        # the layer rebuilt is its microbatch's, whose input the stage kept: counted once, with the microbatches
        # in flight (without a pipeline: in backward_transient_bytes)
        in_backward = mine - kept if mesh.pp > 1 else 0.0
        mine = kept
        notes.assume(
            "activation checkpointing: each layer keeps its input (the residual stream) for each microbatch in "
            "flight and rebuilds the rest in backward, one layer at a time"
        )
    activations = result.activations_bytes * mine / theirs  # its layers and microbatches in flight, our count
    if mesh.pp == 1:  # the embeddings and the head run whole on every tensor-parallel rank
        activations += outside_layer_bytes(facts, micro, state, device_type)
    note_activations(state, keeps_scores, notes)
    end_of_backward: float | None = None
    # whether the start of backward is counted with the gradients beside it: where DDP's buckets hold them between
    # steps; else each step sets them to None and they are made as backward frees the activations (measured: a tp
    # rank's peak, at the start of backward, holds no gradient)
    gradients_before_backward = mesh.data_parallel == Strategy.DDP
    if mesh.pp > 1:
        # The rank's backward, as its schedule runs it: its first backward holds every microbatch-stage in flight
        # (each stage's output kept for its backward, the first stage's embedding dropout noise, the last stage's
        # logits and log-probabilities) and the gradients only where the schedule runs a forward after a backward
        # (1F1B's steady phase); its last holds every gradient and the microbatches still in flight. Both hold the
        # layer backpropagated: its gradients' temporaries (and, checkpointed, the layer rebuilt), or at the last
        # stage's start of backward the loss's gradients, whichever is larger.
        boundaries, in_flight = pipeline_boundary_bytes(facts, mesh, micro, state, device_type, stage_rank)
        heads = head_microbatches(mesh, stage_rank)
        layer_unit = activations / in_flight
        unit = (activations + boundaries) / in_flight
        activations += boundaries
        in_backward += max(
            layer_gradient_bytes(shape, micro, state, keeps_scores, mesh.tp),
            loss_gradient_bytes(shape, micro) if heads else 0.0,
        )
        steady = pipeline_runs_forward_after_backward(mesh, in_flight)
        if heads:  # the last stage's last backward: one microbatch's layers and logits
            left = 1
            # (its input is its receive buffer, counted in buffer_bytes)
            end_of_backward = (
                layer_unit
                - boundary_values(facts, mesh, micro) * state.activation
                + head_bytes(shape, micro, state)
                + in_backward
            )
        elif mesh.schedule == "looped-bfs":
            # its first stage's second backward, every gradient made: that stage's outputs, all held (for backward
            # or by their sends), the microbatches not yet backpropagated (their layers' inputs or activations and
            # the embedding noise) and what the later stages sent (measured, MemTracker: rank 0 of gpt-micro's)
            left = mesh.microbatches - 1
            noise = embedding_noise_bytes(facts, mesh, micro, state, device_type, stage_rank)
            end_of_backward = (
                mesh.microbatches * boundary_values(facts, mesh, micro) * state.activation
                + left * (layer_unit + noise)
                + pipeline_sent_bytes(facts, mesh, micro, state)
                + in_backward
            )
        else:
            left = math.ceil(in_flight / mesh.virtual_stages) if mesh.virtual_stages > 1 else in_flight - 1
            end_of_backward = unit * left + in_backward
        # DDP's gradients are views into its buckets, held between steps; else set to None after each step
        gradients_before_backward = steady or mesh.data_parallel == Strategy.DDP
        which = "first" if stage_rank == 0 else "last"
        besides = [f"the logits and log-probabilities of {heads} of the last stage's"] if heads else []
        if stage_rank == 0 and facts.dropout > 0:
            besides.append("the first stage's embedding dropout noise")
        notes.assume(
            f"pipeline: the {which} rank holds {in_flight} microbatch-stage(s) in flight at its first backward, "
            "each stage's output kept for its backward"
            + (f" ({' and '.join(besides)})" if besides else "")
            + ", "
            + ("with the gradients its steady phase has made" if steady else "before any gradient is made")
            + f"; its last backward every gradient and {left} microbatch(es) of its "
            + ("last" if heads else "first")
            + " stage"
        )
    if mesh.pp == 1 and checkpointing:  # the first layer's backward, the later layers' gradients beside it
        end_of_backward = first_layer_end_of_backward(
            facts,
            micro,
            state,
            keeps_scores,
            device_type,
            activations,
            result.gradients_bytes,
            not gradients_before_backward,
            mesh.tp,
            mesh.sequence_parallel,
        )
    autocast = state.autocast_copy * result.parameters_per_device * (mesh.dp if mesh.shards_parameters else 1)
    gathered = unsharded_grads = block = 0.0
    if mesh.pp > 1 and mesh.shards_parameters and mesh.dp > 1:
        # torch's pipelining keeps a stage's FSDP parameters gathered between its microbatches (the whole stage, in
        # a buffer of its own beside the shard) and accumulates its gradients unsharded until the last microbatch's
        # backward reduce-scatters them (measured: rank 0 of a dp=2 x pp=2 GPT held its shard and its stage whole,
        # three times the shard, at its first backward, before any gradient was made)
        gathered = result.parameters_per_device * mesh.dp * state.param
        unsharded_grads = result.parameters_per_device * mesh.dp * state.grad
        notes.assume(
            "FSDP under a pipeline: each stage's parameters stay gathered between its microbatches and its gradients "
            "accumulate unsharded until the last backward (torch.distributed.pipelining with fully_shard)"
        )
    elif mesh.shards_parameters and mesh.dp > 1:
        # FSDP2 over the data axis of a tp mesh gathers as it does alone (strategy fsdp), each unit's tensor-parallel
        # slice: the root unit (stem and head, whole on every tp rank; not resharded after forward) and two blocks'
        # (one in use, the next prefetched), one at the start of backward (measured: rank 0 of a 2-layer, 64-wide
        # GPT on dp=2 x tp=2 held that beside its shards in its last block's backward, 5.7% over the count without)
        block = shape.parameters_per_layer / mesh.tp * state.param
        gathered = shape.parameters_outside_layers * state.param + 2 * block
        notes.assume(
            "FSDP over a tensor-parallel mesh: while computing, each rank holds the root unit (stem and head) and two "
            "blocks' tensor-parallel slices gathered over the data axis (one in use, the next prefetched), at the "
            "start of backward one (the last, prefetched)"
        )
    if block:  # FSDP over a tp mesh: its start (one block gathered) or its last block's backward (two)
        backward = sharded_backward_transient(
            facts,
            micro,
            state,
            keeps_scores,
            device_type,
            checkpointing,
            block,
            mesh.tp,
            mesh.sequence_parallel,
        )
    elif mesh.pp == 1:
        backward = backward_transient_bytes(
            facts,
            micro,
            state,
            keeps_scores,
            device_type=device_type,
            checkpointing=checkpointing,
            tp=mesh.tp,
            sequence_parallel=mesh.sequence_parallel,
        )
    else:
        # the loss's gradients are in in_backward on the last stage's rank; FSDP's unsharded gradients accumulate
        # from the first backward on
        backward = unsharded_grads * gradients_before_backward
    memory = MemoryBreakdown(
        weights_bytes=result.weights_bytes,
        master_weights_bytes=0.0,
        gradients_bytes=result.gradients_bytes,
        optimizer_bytes=result.optimizer_bytes,
        activations_bytes=activations,
        transient_bytes=autocast + gathered,
        buffer_bytes=pipeline_receive_buffer_bytes(facts, mesh, micro, state, stage_rank)
        if mesh.pp > 1
        else 0.0,
        backward_transient_bytes=backward + in_backward,
        end_of_backward_bytes=None if end_of_backward is None else end_of_backward + unsharded_grads,
        gradients_freed_each_step=not gradients_before_backward,
        optimizer_transient_bytes=optimizer_temporaries(
            facts,
            state,
            stack,
            device_type,
            notes,
            shards=mesh.tp * mesh.pp * (mesh.dp if mesh.shards_parameters else 1),
            held=result.parameters_per_device if mesh.pp > 1 else None,
        ),
    )
    return memory, result


def _expert_tensor_parallel(
    facts: WorkloadFacts, moe_layers: float, mesh: ParallelDims, state: StateBytes, layout: RunShape
) -> CommOp:
    """Megatron's expert tensor parallelism (the moe workload under a tp axis): each rank computes its slice of
    every expert's hidden width for every routed row, so the experts' partial outputs (b*s*k rows of h) are summed
    over the tp group in forward and the rows' gradients in backward, once per MoE layer each, beside the attention's
    and the shared expert's or dense block's b*s*h all-reduces the dense count already has."""
    shape = facts.transformer
    assert shape is not None
    microbatches = max(1, mesh.microbatches) if mesh.pp > 1 else 1
    rows = layout.batch_size // microbatches * shape.sequence * max(1, facts.top_k)
    message = rows * shape.hidden * state.activation
    count = round(2 * moe_layers) * microbatches
    return CommOp(
        op="all_reduce",
        dtype=element_type(state.activation, layout.precision),
        axis="tp",
        ranks=mesh.tp,
        what="the experts' partial outputs over the routed rows (b s k rows of h) in forward and the rows' "
        "gradients in backward, once per MoE layer each (expert tensor parallelism)",
        count=count,
        message_bytes=message,
        bus_bytes=count * allreduce_bytes(message, mesh.tp),
        overlappable=False,
    )


# --- expert parallelism: a mixture of experts' routed experts over the ep axis ----------------------------------


def expert_parallel_breakdown(
    facts: WorkloadFacts,
    layout: RunShape,
    state: StateBytes,
    keeps_scores: bool,
    hardware: Hardware,
    notes: Notes,
    stack: Stack | None = None,
) -> tuple[MemoryBreakdown, list[CommOp]]:
    """Memory and collectives of one device of ``--mesh ep=N`` / ``ddp=D,ep=N`` (accelbench.engine.parallel.ep):
    DDP's figures for a model holding the replicated parameters whole and 1/ep of the routed experts; the replicated
    gradients all-reduced over every rank, the experts' over the data axis; and the token exchange, an all_to_all
    over the ep group of each rank's b*s*k routed rows of h values, twice per MoE layer in forward and twice in
    backward (nccl-tests' bus bytes, (n-1)/n of each rank's send buffer)."""
    dims = layout.dims
    if not facts.expert_parameters:
        raise ConfigError(
            f"--mesh ep={dims.ep}: workload {facts.workload!r} has no routed experts to shard; use --workload moe"
        )
    ep, world = dims.ep, dims.world
    held_experts = facts.expert_parameters // ep
    replicated = facts.stored_parameters - facts.expert_parameters
    per_device = replicated + held_experts
    exchange = _token_exchange(facts, layout, state)
    if dims.data_parallel == Strategy.FSDP:
        # the experts held (1/ep) sharded over the data axis, the rest over every rank: each device keeps 1/world of
        # every parameter, FSDP over the whole job of the model's parameters; a unit gathers its 1/ep of the experts
        per_layer = facts.expert_parameters // max(1, facts.moe_layers)
        units = tuple(u - per_layer + per_layer // ep for u in facts.unit_parameters)
        fsdp = RunShape(
            strategy=Strategy.FSDP.value,
            precision=layout.precision,
            batch_size=layout.batch_size,
            dims=ParallelDims(dp=world, data_parallel=Strategy.FSDP.value),
            grad_accum=layout.grad_accum,
        )
        memory, comm = data_parallel_breakdown(
            dataclasses.replace(facts, unit_parameters=units, expert_parameters=held_experts),
            fsdp,
            state,
            keeps_scores,
            hardware,
            notes,
            stack,
        )
        notes.assume(
            f"expert parallelism over {ep} ranks with FSDP2: each device keeps 1/{world} of every parameter (the "
            f"{replicated:,} replicated ones sharded over all ranks, its ep rank's {held_experts:,} experts' over the "
            f"data axis); a unit gathers its 1/{ep} of the experts; FSDP's collectives counted over every rank (the "
            "experts' really run over the data axis); activations as one device's on its batch (even routing)"
        )
        return memory, [*comm, exchange]
    matmul = (
        facts.matmul_parameters
    )  # the linear layers: attention, router, head (the experts are not nn.Linear)
    mine = dataclasses.replace(
        facts, stored_parameters=per_device, matmul_parameters=matmul, expert_parameters=held_experts
    )
    ddp = RunShape(
        strategy=Strategy.DDP.value,
        precision=layout.precision,
        batch_size=layout.batch_size,
        dims=ParallelDims(dp=world, data_parallel=Strategy.DDP.value),
        grad_accum=layout.grad_accum,
    )
    memory, _ = data_parallel_breakdown(mine, ddp, state, keeps_scores, hardware, notes, stack)
    notes.assume(
        f"expert parallelism over {ep} ranks: each holds the {replicated:,} replicated parameters and "
        f"{held_experts:,} of the {facts.expert_parameters:,} routed experts' ({per_device:,} in all); the "
        "activations are one device's on its batch, its routed rows an even share (with latent attention, MLA, a "
        "dense layer's: Korthikanti et al.)"
    )
    comm = []
    grad_dtype = element_type(state.grad, layout.precision)
    comm.append(
        CommOp(
            op="all_reduce",
            dtype=grad_dtype,
            axis="dp",
            ranks=world,
            what="the replicated parameters' gradients, over every rank (the ep ranks train their own batches)",
            count=1,
            message_bytes=replicated * state.grad,
            bus_bytes=allreduce_bytes(replicated * state.grad, world),
            overlappable=False,  # after backward, one flat buffer
        )
    )
    if dims.dp > 1:
        comm.append(_experts_over_data_axis(held_experts, state, grad_dtype, dims.dp, "the"))
    comm.append(exchange)
    return memory, comm


def expert_pipeline_breakdown(
    facts: WorkloadFacts,
    layout: RunShape,
    state: StateBytes,
    keeps_scores: bool,
    notes: Notes,
    *,
    device_type: str = "cuda",
    stack: Stack | None = None,
) -> tuple[MemoryBreakdown, list[CommOp], float, float | None]:
    """Memory, collectives, FLOPs and bubble of one device of ``--mesh pp=P,ep=N``, ``tp=T,ep=N`` or either with
    ``ddp=D`` (accelbench.engine.parallel.executor): each ep rank's pipeline (or tensor-parallel group) is a replica
    on its own batch, so the tp/pp figures (:func:`model_parallel_breakdown`, the busiest pipeline rank's) hold for
    blocks keeping 1/N of their routed experts, each split over tp; beside the pipeline's sends and tensor
    parallelism's all-reduces, the stage's replicas (ep group, times the data axis) all-reduce the replicated
    gradients (one flat buffer), the data axis the held experts', and the ep group exchanges the routed rows of each
    of the stage's MoE layers, per microbatch, twice in forward and twice in backward (every tp rank its own copy of
    them; nccl-tests' bus bytes, (n-1)/n of each send buffer; even routing assumed). With an FSDP2 data axis
    (``fsdp=D``) the tp/pp figures are those of a data axis of D x N replicas over the whole blocks, beside the
    exchange."""
    dims, shape = layout.dims, facts.transformer
    axes = ",".join(f"{axis}={size}" for axis, size in (("pp", dims.pp), ("tp", dims.tp)) if size > 1)
    if not facts.expert_parameters:
        raise ConfigError(
            f"--mesh {axes},ep={dims.ep}: workload {facts.workload!r} has no routed experts to shard; use --workload "
            "moe"
        )
    if shape is None:
        raise ConfigError(
            f"--mesh {axes},ep={dims.ep}: the tensor/pipeline model needs a transformer's shape; workload "
            f"{facts.workload!r} gives none"
        )
    ep, microbatches = dims.ep, max(1, dims.microbatches)
    layers_here = shape.layers / dims.pp  # the first pipeline rank's blocks, over its virtual stages
    moe_here = layers_here * facts.moe_layers / shape.layers
    exchange = _token_exchange(
        facts,
        layout,
        state,
        samples=layout.batch_size // microbatches,
        count=round(4 * moe_here) * microbatches,
        what="routed tokens to their experts' ranks and back (b*s*k rows of h per microbatch), twice per MoE "
        "layer of the stage in forward and twice in backward; even routing assumed",
    )
    if dims.shards_parameters:
        # FSDP2 beside ep: the replicated parameters sharded over the stage's dp x ep replicas, the held experts
        # (1/ep) over dp: 1/(dp ep) of every parameter of the stage's tp slice, the tp/pp model's figures for a data
        # axis of dp x ep replicas of the whole blocks
        flattened = dataclasses.replace(dims, dp=dims.dp * ep, ep=1)
        memory, comm, flops, bubble = model_parallel_breakdown(
            facts,
            dataclasses.replace(layout, dims=flattened),
            state,
            keeps_scores,
            notes,
            device_type=device_type,
            stack=stack,
        )
        notes.assume(
            f"expert parallelism over {ep} ranks with FSDP2 over dp={dims.dp}: each device keeps 1/{dims.dp * ep} of "
            "every parameter of its stage's tensor-parallel slice (the replicated ones sharded over the stage's "
            f"{dims.dp * ep} replicas, its ep rank's experts over the data axis); FSDP's collectives counted over the "
            "replicas (the experts' really run over the data axis); the activations as one device's on its "
            "microbatches"
        )
        return memory, [*comm, exchange], flops, bubble
    away = facts.expert_parameters - facts.expert_parameters // ep  # the experts the other ep ranks hold
    blocks = dataclasses.replace(shape, layer_parameters=shape.parameters_per_layer - away // shape.layers)
    memory, comm, flops, bubble = model_parallel_breakdown(
        dataclasses.replace(facts, transformer=blocks),
        layout,
        state,
        keeps_scores,
        notes,
        device_type=device_type,
        stack=stack,
    )
    held_experts = facts.expert_parameters // ep * layers_here / shape.layers / dims.tp
    replicated = memory.weights_bytes / state.param - held_experts
    where = (
        f"inside each of {dims.pp} pipeline stages"
        if dims.pp > 1
        else f"beside tensor parallelism over {dims.tp}"
    )
    split = f", each split over {dims.tp} tp ranks" if dims.tp > 1 else ""
    notes.assume(
        f"expert parallelism over {ep} ranks {where}: each ep rank's replica trains its own batch; a device holds its "
        f"stage's replicated parameters and 1/{ep} of its stage's routed experts{split} ({held_experts:,.0f} of them "
        "on the first stage); the activations as one device's on its microbatches"
    )
    grad_dtype = element_type(state.grad, layout.precision)
    replicas = dims.dp * ep
    # the data axis's gradients are reduced with the expert axis's, by hand: not the pipeline's DDP all-reduce
    comm = [op for op in comm if op.axis != "dp"]
    comm.append(
        CommOp(
            op="all_reduce",
            dtype=grad_dtype,
            axis="ep" if dims.dp == 1 else "dp",
            ranks=replicas,
            what="the stage's replicated parameters' gradients, over its "
            + ("ep group" if dims.dp == 1 else "replicas (its ep group times the data axis)")
            + " (each ep rank's pipeline trains its own batch)",
            count=1,
            message_bytes=replicated * state.grad,
            bus_bytes=allreduce_bytes(replicated * state.grad, replicas),
            overlappable=False,  # after the pipeline's backward, one flat buffer
        )
    )
    if dims.dp > 1:
        comm.append(_experts_over_data_axis(held_experts, state, grad_dtype, dims.dp, "the stage's"))
    comm.append(exchange)
    return memory, comm, flops, bubble


def _token_exchange(
    facts: WorkloadFacts,
    layout: RunShape,
    state: StateBytes,
    *,
    samples: int | None = None,
    count: int | None = None,
    what: str = "routed tokens to their experts' ranks and back (b*s*k rows of h), twice per MoE layer in forward "
    "and twice in backward; even routing assumed",
) -> CommOp:
    """The all_to_all of expert parallelism: each rank's b*s*k routed rows of h values to their experts' ranks and
    back, twice per MoE layer in forward and twice in backward, (n-1)/n of each send buffer over the links.
    ``samples`` per exchange (the rank's batch by default) and ``count`` exchanges a step (4 per MoE layer by
    default): a pipeline stage's per microbatch, for its own layers."""
    ep = layout.dims.ep
    shape = facts.transformer
    hidden = shape.hidden if shape is not None else 0
    sequence = shape.sequence if shape is not None else facts.tokens_per_sample
    rows = (layout.batch_size if samples is None else samples) * sequence * max(1, facts.top_k)
    message = rows * hidden * state.activation
    count = 4 * facts.moe_layers if count is None else count
    return CommOp(
        op="all_to_all",
        dtype=element_type(state.activation, layout.precision),
        axis="ep",
        ranks=ep,
        what=what,
        count=count,
        message_bytes=message,
        bus_bytes=count * message * (ep - 1) / ep,
        overlappable=False,
    )


def _experts_over_data_axis(
    held_experts: float, state: StateBytes, grad_dtype: str, dp: int, whose: str
) -> CommOp:
    """The all-reduce of the held experts' gradients over the data axis (the ranks holding the same experts)."""
    return CommOp(
        op="all_reduce",
        dtype=grad_dtype,
        axis="dp",
        ranks=dp,
        what=f"{whose} held experts' gradients, over the data axis (ranks holding the same experts)",
        count=1,
        message_bytes=held_experts * state.grad,
        bus_bytes=allreduce_bytes(held_experts * state.grad, dp),
        overlappable=False,
    )
