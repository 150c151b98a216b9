"""What the analytical model needs to know about a workload (:class:`WorkloadFacts`), read off its model without
training it.

:func:`facts_of` reads a built :class:`~accelbench.workloads.TrainingJob` (the runner has one); :func:`meta_facts`
builds the workload on torch's ``meta`` device first, which creates every parameter's shape and no storage, so
``accelbench estimate --model gpt2-xl`` costs no memory. torch is imported inside the functions that need it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from accelbench.estimate.parallel import (
    RoutedExperts,
    TransformerShape,
    megatron_flops_per_iteration,
    megatron_recompute_flops,
)

if TYPE_CHECKING:
    from accelbench.config import RunConfig
    from accelbench.workloads import TrainingJob, Workload


@dataclass(frozen=True)
class WorkloadFacts:
    """A workload as the formulas see it, for one configuration; :func:`facts_of` reads it off a built model,
    :func:`meta_facts` off a meta-device one.

    ``parameters`` is the workload's count (the GPT's leaves out its vocabulary padding rows, which compute nothing
    useful); ``stored_parameters`` what is allocated and communicated (padding included, tied tensors once).
    ``tensor_sizes`` are the elements of each parameter tensor (ZeRO-3 keeps small ones whole), ``modules`` how many
    modules the model has (containers too: ZeRO-3 hooks each), ``unit_parameters``
    those of each repeated unit (FSDP's wrapping units) and ``outer_parameters`` those outside them (the root unit).
    ``matmul_parameters`` are the parameters of linear layers, which autocast copies to 16 bits.
    ``transformer`` is set for transformers (layers, width, heads, context, vocabulary as the logits are wide).
    ``megatron_flops_per_sample`` is one sample's training FLOPs by Megatron-LM's count without activation
    recomputation, ``72 s l h^2 (1 + s/6h + V/12lh)``; ``megatron_recompute_flops_per_sample`` the same with full
    recomputation, seed 002's ``96 s l h^2 (1 + s/6h + V/16lh)`` (Narayanan et al. 2021, 4 forward passes).
    """

    workload: str
    model: str
    parameters: int
    stored_parameters: int
    flops_per_sample: float
    flops_formula: str
    tokens_per_sample: int
    tensor_sizes: tuple[int, ...] = ()
    modules: int = 0  # the model's modules, containers included: DeepSpeed ZeRO-3 hooks every one
    unit_parameters: tuple[int, ...] = ()
    outer_parameters: int = 0
    matmul_parameters: int = 0
    megatron_flops_per_sample: float | None = None
    megatron_recompute_flops_per_sample: float | None = None
    transformer: TransformerShape | None = None
    dropout: float = 0.0
    source: str = ""
    # a mixture of experts (its summary's): the routed experts' parameters (what an ep axis shards), the parameters
    # one token is computed with, and per MoE layer the experts each token visits and the layers
    expert_parameters: int = 0
    active_parameters: int | None = None
    top_k: int = 0
    moe_layers: int = 0


def meta_facts(workload: Workload, config: RunConfig) -> WorkloadFacts:
    """Build ``workload`` for ``config`` (resolved: its workload options filled in) on the meta device and read its
    facts. The data source is built too (workloads build both), on the host; nothing trains."""
    import torch

    from accelbench.workloads import shapes_only

    with torch.device("meta"), shapes_only():
        job = workload.build(config)
    return facts_of(job, config, source=f"{workload.name} built on the meta device (shapes, no storage)")


def facts_of(job: TrainingJob, config: RunConfig, source: str = "the built model") -> WorkloadFacts:
    """The facts of a built job: its parameters (each tensor once, tied ones included once), those of each of its
    units and outside them, those of its linear layers, its FLOPs, and a transformer's shape where its summary names
    one (``n_layer``, ``n_head``, ``n_embd`` and ``block_size`` or ``seq_len``, as the GPT and BERT workloads do)."""
    from torch import nn

    model = job.model
    sizes = {id(p): p.numel() for p in model.parameters()}  # parameters() yields a shared tensor once
    stored = sum(sizes.values())
    counted: set[int] = set()
    units = []
    for module in job.units.modules(model):
        total = 0
        for p in module.parameters():
            if id(p) not in counted:
                counted.add(id(p))
                total += p.numel()
        units.append(total)
    linear: set[int] = set()
    for module in model.modules():
        if isinstance(module, nn.Linear):
            linear.update(id(p) for p in module.parameters())
    summary: dict[str, Any] = job.summary
    shape = _transformer(summary, units, stored - sum(units), workload=config.workload)
    if shape is not None:  # what a pipeline's first and last stages hold beside their layers
        shape = replace(
            shape,
            stem_parameters=job.units.parameter_count(model, job.units.stem),
            head_parameters=job.units.parameter_count(model, job.units.head),
        )
    megatron = job.megatron_flops_per_sample
    # Megatron's dense count has no routed experts: a mixture of experts is counted by its own formula only
    if megatron is None and shape is not None and not summary.get("expert_parameters"):
        megatron = megatron_flops_per_iteration(
            1, shape.sequence, shape.layers, shape.hidden, int(summary.get("vocab_size", shape.vocab))
        )
    recompute = None
    if megatron is not None and shape is not None:  # the same count, one more forward pass of the layers
        recompute = megatron + megatron_recompute_flops(1, shape.sequence, shape.layers, shape.hidden)
    return WorkloadFacts(
        workload=config.workload,
        model=str(summary.get("name", config.model)),
        parameters=int(summary.get("parameters", stored)),
        stored_parameters=stored,
        flops_per_sample=float(job.flops_per_sample),
        flops_formula=job.flops_formula,
        tokens_per_sample=job.tokens_per_sample,
        tensor_sizes=tuple(sizes.values()),
        modules=sum(1 for _ in model.modules()),
        unit_parameters=tuple(units),
        outer_parameters=stored - sum(units),
        matmul_parameters=sum(sizes[i] for i in linear if i in sizes),
        megatron_flops_per_sample=megatron,
        megatron_recompute_flops_per_sample=recompute,
        transformer=shape,
        dropout=float(summary.get("dropout", 0.0) or 0.0),
        source=source,
        expert_parameters=int(summary.get("expert_parameters", 0) or 0),
        active_parameters=int(summary["active_parameters"]) if summary.get("active_parameters") else None,
        top_k=int(summary.get("top_k", 0) or 0),
        # the blocks with experts: all of them, or the summary's count where the first ones are dense
        moe_layers=int(summary.get("moe_layers", summary.get("n_layer", 0)) or 0)
        if summary.get("expert_parameters")
        else 0,
    )


def _transformer(
    summary: dict[str, Any], units: list[int], outer: int, workload: str = ""
) -> TransformerShape | None:
    """A transformer's shape from a workload summary, or None when it names none. The vocabulary is the logits'
    width (padded, where the workload pads it: that is what is computed and stored)."""
    keys = ("n_layer", "n_head", "n_embd")
    sequence = summary.get("block_size", summary.get("seq_len"))
    vocab = summary.get("vocab_padded_to", summary.get("vocab_size"))
    if any(summary.get(k) is None for k in keys) or sequence is None or vocab is None:
        return None
    return TransformerShape(
        layers=int(summary["n_layer"]),
        hidden=int(summary["n_embd"]),
        heads=int(summary["n_head"]),
        sequence=int(sequence),
        vocab=int(vocab),
        # the mean block: a mixture's dense first blocks are smaller than its MoE blocks, and the total is right
        layer_parameters=sum(units) // len(units) if units else None,
        other_parameters=outer,
        loss_vocab=int(summary["vocab_size"])
        if summary.get("vocab_padded_to") and summary.get("vocab_size")
        else None,
        logit_positions=int(summary["predicted_per_sequence"])
        if summary.get("predicted_per_sequence")
        else None,
        # a Llama block's widths, or a mixture of experts' with grouped-query attention, whose activations are
        # counted as their own tensors (a mixture with latent attention, MLA, by the dense GPT formula)
        **_gated_widths(summary, workload),
    )


def _gated_widths(summary: dict[str, Any], workload: str) -> dict[str, Any]:
    """The Llama-style widths of a ``llama`` or grouped-query ``moe`` summary (:class:`TransformerShape`'s
    ``gated_ffn``, ``kv_width``, ``routed``), none for other workloads."""
    if workload not in ("llama", "moe") or not (summary.get("n_kv_heads") and summary.get("head_dim")):
        return {}
    widths: dict[str, Any] = {"kv_width": int(summary["n_kv_heads"]) * int(summary["head_dim"])}
    if workload == "llama":
        return {**widths, "gated_ffn": int(summary["ffn_dim"])} if summary.get("ffn_dim") else {}
    if str(summary.get("attention_kind", "")).upper() != "GQA" or not summary.get("n_experts"):
        return {}
    ffn = int(summary["ffn_dim"])
    routed = RoutedExperts(
        experts=int(summary["n_experts"]),
        top_k=int(summary["top_k"]),
        ffn=ffn,
        shared_ffn=ffn * int(summary.get("shared_experts", 0) or 0),
        moe_layers=int(summary.get("moe_layers", summary["n_layer"])),
        grouped=summary.get("experts_kernel", "grouped") != "loop",
    )
    return {**widths, "gated_ffn": int(summary.get("dense_ffn_dim", 0) or 0) or ffn, "routed": routed}
