"""The mixture-of-experts model: the Llama decoder with each block's feed-forward a top-k routed set of SwiGLU
experts (imported when a run builds the model).

Built from the Llama workload's pieces (:mod:`accelbench.workloads.llama.model`): its grouped-query attention with
rotary embeddings, its SwiGLU feed-forward (as the shared expert), ``torch.nn.RMSNorm``, its initialisation and
AdamW. What is new is the feed-forward, :class:`MoEFeedForward`, in the style of Mixtral, GPT-OSS and DeepSeek-V3:

- a linear router scores each token against every expert; softmax, the top-k experts are kept and their gates
  renormalised to sum to 1 (the same as GPT-OSS's and Mixtral's softmax over the top-k logits);
- the routed experts are SwiGLU feed-forwards stored stacked (one ``(experts, ...)`` tensor per weight, as
  torchtitan's and GPT-OSS's), so expert parallelism can hand each rank a slice of them;
- an optional shared expert (DeepSeek's), a SwiGLU every token goes through, added to the routed output;
- a load-balancing auxiliary loss, Switch Transformer's ``E * sum_i f_i * P_i`` (f_i the share of the top-k choices
  that went to expert i, P_i its mean router probability; 1 when perfectly balanced) computed per sequence and
  averaged over the batch, as DeepSeek-V3's sequence-wise balance loss: per-sequence, so a batch split over ranks has
  the same loss as on one device. It is added to the cross-entropy, times ``aux_loss_coef``.

The routed experts run as one grouped matmul per weight (``torch._grouped_mm``, torchtitan's and Megatron's way,
each expert's rows padded to the op's alignment) where the op runs on the device, dtype and widths, else as a loop
over experts (:class:`GroupedExperts`; ``--experts-kernel`` chooses).

Each layer counts the tokens routed to each of its experts in training steps (:attr:`MoEFeedForward.routed`), for
the record's routing balance.

Expert parallelism (:meth:`MoEFeedForward.shard_experts`): each of ``ep`` ranks keeps ``experts / ep`` of the
experts; every rank routes its own tokens, sends each to the rank holding its expert and gets the output back with
``all_to_all_single_autograd`` (torch.distributed._functional_collectives, what torch 2.13 names in place of
the deprecated ``torch.distributed.nn.functional.all_to_all_single``, and torchtitan uses; differentiable: its
backward is the reverse exchange).

Tensor parallelism (the workload's plan, :func:`accelbench.workloads.moe.moe_tp_plan`): attention over its heads
(:class:`LatentAttention` sums its shared rotary key's gradient over the ranks, :class:`CopyToTensorParallel`), every
routed expert over its hidden width (:meth:`GroupedExperts.tensor_parallel`, Megatron's expert tensor parallelism).
Pipeline parallelism: each layer adds its balance loss's gradient in backward itself
(:meth:`MoE.add_balance_loss_in_backward`), since a stage hands on hidden states only.

DeepSeek-V3's shape (``kv_lora_rank`` > 0, see :class:`MoEConfig`): multi-head latent attention
(:class:`LatentAttention`) in place of grouped-query attention, sigmoid router scores (:class:`SigmoidRouter`) and
the first ``first_k_dense`` blocks with a dense SwiGLU feed-forward of ``dense_ffn_dim`` instead of experts.

DeepSeek-V3's auxiliary-loss-free balancing (``balance`` "bias" or "both", see :class:`MoEConfig`; arXiv 2412.19437
section 2.1.2): each MoE layer keeps a per-expert bias (:attr:`MoEFeedForward.expert_bias`, a float32 buffer, never
a parameter) added to the router's affinity scores for the top-k choice only; the gates are the unbiased scores
renormalised over the chosen. After each optimizer step, :func:`update_expert_biases` moves every bias by
``-speed * sign(load_i - mean load)`` from the step's tokens per expert, summed over every rank first so that all
ranks keep the same biases. "both" adds the sequence-wise balance loss as well (DeepSeek-V3's, at a tiny weight).

Not modelled: GPT-OSS's attention sinks, sliding-window layers and biases; DeepSeek-V3's node-limited routing
(experts chosen within 4 of 8 groups), its routed-output scale (2.5, a constant: no compute), its
multi-token-prediction module and YaRN's long-context attention scale; token dropping by capacity (every token is
computed: nothing is dropped, so the load is exactly the routing's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from accelbench.workloads.llama.model import (
    Attention,
    DecoderPieces,
    FeedForward,
    LlamaConfig,
    configure_adamw,
    rope_angles,
    rotate,
)

__all__ = [
    "EXPERTS_KERNELS",
    "BalanceLossInBackward",
    "CopyToTensorParallel",
    "DeepSeekFeedForward",
    "GroupedExperts",
    "LatentAttention",
    "MoE",
    "MoEConfig",
    "MoEFeedForward",
    "SigmoidRouter",
    "SumOverTensorParallel",
    "configure_adamw",
    "balance_by_expert_biases",
    "grouped_mm_support",
    "padded_groups",
    "update_expert_biases",
]


@dataclass(frozen=True)
class MoEConfig(LlamaConfig):
    """The Llama's configuration (``ffn_dim`` is each expert's hidden width) plus the experts'."""

    n_experts: int = 8
    top_k: int = 2
    shared_experts: int = 0  # 0 or 1: a shared expert of width ffn_dim * shared_experts
    aux_loss_coef: float = 0.01
    attention_head_dim: int = 0  # 0: dim // n_heads (GPT-OSS's heads are 64 wide on a 2,880 width)
    experts_kernel: str = "auto"  # how GroupedExperts runs: auto, grouped (torch._grouped_mm) or loop
    # DeepSeek-V3's multi-head latent attention, on when kv_lora_rank > 0 (n_kv_heads is then unused)
    kv_lora_rank: int = 0  # the compressed key/value latent every head's keys and values are expanded from
    q_lora_rank: int = 0  # 0: queries projected directly from the input; > 0: through a latent this wide
    qk_nope_head_dim: int = 0  # each head's query/key part without rotary embedding
    # each head's rotary query part; its rotary key part is one key shared by all heads
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0  # each head's value width
    # DeepSeek-V3's routing and dense first blocks
    router_scores: str = "softmax"  # "softmax" (Mixtral's, GPT-OSS's) or "sigmoid" (DeepSeek-V3's)
    first_k_dense: int = 0  # the first blocks with a dense SwiGLU of dense_ffn_dim instead of experts
    dense_ffn_dim: int = 0
    # load balancing: "aux-loss" (the balance loss alone, at aux_loss_coef), "bias" (DeepSeek-V3's
    # auxiliary-loss-free per-expert score biases) or "both" (the biases and the loss)
    balance: str = "aux-loss"
    bias_update_speed: float = 0.001  # DeepSeek-V3's gamma: each bias moves by this much per step

    @property
    def expert_biases(self) -> bool:
        return self.balance in ("bias", "both")

    @property
    def head_dim(self) -> int:
        return self.attention_head_dim or self.dim // self.n_heads

    @property
    def latent_attention(self) -> bool:
        return self.kv_lora_rank > 0


BALANCES = ("aux-loss", "bias", "both")


def check_config(cfg: MoEConfig) -> None:
    """Refuse a configuration the model cannot be built with, saying what would work."""
    if cfg.top_k > cfg.n_experts:
        raise ValueError(f"top-{cfg.top_k} routing needs at least {cfg.top_k} experts, not {cfg.n_experts}")
    if cfg.balance not in BALANCES:
        raise ValueError(f"balance {cfg.balance!r}: use one of {', '.join(map(repr, BALANCES))}")
    if cfg.expert_biases and not 0 < cfg.bias_update_speed <= 1:
        raise ValueError(
            f"bias update speed {cfg.bias_update_speed}: use a value in (0, 1] (DeepSeek-V3's: 0.001)"
        )
    if cfg.router_scores not in ("softmax", "sigmoid"):
        raise ValueError(f"router scores {cfg.router_scores!r}: use 'softmax' or 'sigmoid'")
    if not 0 <= cfg.first_k_dense <= cfg.n_layers or (cfg.first_k_dense and cfg.dense_ffn_dim <= 0):
        raise ValueError(
            f"{cfg.first_k_dense} dense first blocks of width {cfg.dense_ffn_dim}: use 0 to {cfg.n_layers} "
            "(the layers) dense blocks, each with a positive dense_ffn_dim"
        )
    if cfg.latent_attention:
        if min(cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim) <= 0 or cfg.q_lora_rank < 0:
            raise ValueError(
                "multi-head latent attention needs positive qk_nope_head_dim, qk_rope_head_dim and v_head_dim "
                f"(got {cfg.qk_nope_head_dim}, {cfg.qk_rope_head_dim}, {cfg.v_head_dim}) and q_lora_rank >= 0"
            )
        if cfg.qk_rope_head_dim % 2:
            raise ValueError(
                f"rotary embeddings turn pairs: qk_rope_head_dim {cfg.qk_rope_head_dim} must be even"
            )
    elif cfg.q_lora_rank or cfg.qk_nope_head_dim or cfg.qk_rope_head_dim or cfg.v_head_dim:
        raise ValueError(
            "q_lora_rank, qk_nope_head_dim, qk_rope_head_dim and v_head_dim shape multi-head latent attention: "
            "give a kv_lora_rank > 0 with them, or leave them 0 for grouped-query attention"
        )


class LatentAttention(nn.Module):
    """DeepSeek-V2/V3's multi-head latent attention (MLA), trained with one fused causal
    ``scaled_dot_product_attention``.

    Keys and values come from a small latent: ``wkv_a`` projects each token to ``kv_lora_rank`` values (RMS-normed)
    plus one ``qk_rope_head_dim`` rotary key shared by every head; ``wkv_b`` expands the latent into each head's
    non-rotary key (``qk_nope_head_dim``) and value (``v_head_dim``). Queries likewise, through a ``q_lora_rank``
    latent when it is > 0 (``wq_a``, ``q_norm``, ``wq_b``), else directly (``wq``); each head's query is its
    non-rotary part then its rotary part. Rotary embeddings are decoupled: only the rotary parts are turned, so the
    latent itself carries no position (what lets an inference cache keep the latent alone). The scores are scaled
    by 1/sqrt(qk_nope_head_dim + qk_rope_head_dim), the query's width."""

    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.n_heads, self.rope_theta = cfg.n_heads, cfg.rope_theta
        self.nope, self.rope, self.v_dim = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.kv_lora_rank = cfg.kv_lora_rank
        qk = self.nope + self.rope
        self.wq: nn.Linear | None = None
        if cfg.q_lora_rank:
            self.wq_a = nn.Linear(cfg.dim, cfg.q_lora_rank, bias=False)
            self.q_norm = nn.RMSNorm(cfg.q_lora_rank, eps=cfg.norm_eps)
            self.wq_b = nn.Linear(cfg.q_lora_rank, cfg.n_heads * qk, bias=False)
        else:
            self.wq = nn.Linear(cfg.dim, cfg.n_heads * qk, bias=False)
        self.wkv_a = nn.Linear(cfg.dim, cfg.kv_lora_rank + self.rope, bias=False)
        self.kv_norm = nn.RMSNorm(cfg.kv_lora_rank, eps=cfg.norm_eps)
        self.wkv_b = nn.Linear(cfg.kv_lora_rank, cfg.n_heads * (self.nope + self.v_dim), bias=False)
        self.wo = nn.Linear(cfg.n_heads * self.v_dim, cfg.dim, bias=False)

    def query(self, x: torch.Tensor) -> torch.Tensor:
        """Every head's query, (batch, time, heads * (nope + rope))."""
        return self.wq(x) if self.wq is not None else self.wq_b(self.q_norm(self.wq_a(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # the heads this module computes: all, or its share when tensor parallelism shards wq/wq_b and wkv_b by
        # heads (column-parallel) and wo by its input (row-parallel)
        qk = self.nope + self.rope
        q_nope, q_rope = self.query(x).view(b, t, -1, qk).split([self.nope, self.rope], dim=-1)
        h = q_nope.shape[2]
        latent, k_rope = self.wkv_a(x).split([self.kv_lora_rank, self.rope], dim=-1)
        k_nope, v = self.wkv_b(self.kv_norm(latent)).view(b, t, h, -1).split([self.nope, self.v_dim], dim=-1)
        group = tensor_parallel_group(self.wkv_b.weight)
        if group is not None:
            # the rotary key is shared by every head, the heads are split: its gradient is the sum of the ranks'
            k_rope = CopyToTensorParallel.apply(k_rope, group)
        cos, sin = rope_angles(t, self.rope, self.rope_theta, x.device)
        q_rope = rotate(q_rope, cos, sin)
        # one rotary key for every head: a broadcast view, no copies until the concatenation
        k_rope = rotate(k_rope.unsqueeze(2), cos, sin).expand(b, t, h, self.rope)
        q = torch.cat((q_nope, q_rope), dim=-1).transpose(1, 2)  # (batch, heads, time, nope + rope)
        k = torch.cat((k_nope, k_rope), dim=-1).transpose(1, 2)
        # one fused causal kernel. The values are narrower than the queries and keys (v_head_dim): PyTorch's flash
        # kernel needs all three widths equal, so on CUDA SDPA picks another fused one (memory-efficient or cuDNN)
        y = F.scaled_dot_product_attention(q, k, v.transpose(1, 2), is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, h * self.v_dim))


def tensor_parallel_group(weight: torch.Tensor) -> Any:
    """The process group a tensor-parallel (DTensor) ``weight`` is sharded over; None for a plain tensor."""
    from torch.distributed.tensor import DTensor

    if not isinstance(weight, DTensor) or "tp" not in (weight.device_mesh.mesh_dim_names or ()):
        return None
    return weight.device_mesh.get_group("tp")


class CopyToTensorParallel(torch.autograd.Function):
    """Megatron's ``f``: the identity forward, the gradient summed over the tensor-parallel group backward. Where
    every rank feeds the same tensor to its share of a split computation (its heads, its slice of each expert), each
    rank's gradient of it is partial; their sum is one device's."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        import torch.distributed as dist

        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class SumOverTensorParallel(torch.autograd.Function):
    """Megatron's ``g``: the ranks' partial results summed forward (an all-reduce), the gradient passed through
    backward (every rank's partial result entered the sum once)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        import torch.distributed as dist

        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class BalanceLossInBackward(torch.autograd.Function):
    """The identity on a layer's output that, backward, also gives ``loss`` (the layer's weighted balance loss) the
    gradient 1: the loss's gradient joins the model's without the loss being added to the model's output (Megatron's
    ``MoEAuxLossAutoScaler``). A pipeline stage hands on hidden states only, so its layers' balance losses cannot
    reach the last stage's loss; this way each adds its own gradient, exactly as if it had."""

    @staticmethod
    def forward(ctx: Any, output: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(loss)
        return output.view_as(output)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        (loss,) = ctx.saved_tensors
        return grad, torch.ones_like(loss)


def swiglu(x: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """One expert's SwiGLU on rows ``x``: ``(silu(x w1) * (x w3)) w2``, weights stored (in, out)."""
    return (F.silu(x @ w1) * (x @ w3)) @ w2


EXPERTS_KERNELS = ("auto", "grouped", "loop")


def grouped_mm_support(device: torch.device, dtype: torch.dtype, widths: tuple[int, ...]) -> str | None:
    """Why ``torch._grouped_mm`` cannot run the experts' matmuls on ``device`` in ``dtype`` with rows of these
    ``widths`` (the model's and the experts' hidden width), or None where it can.

    The op's rules in torch 2.13: on CUDA, compute capability 9.0 or above and bfloat16 only (its meta
    registration and its CUTLASS kernel); on CPU, float32, bfloat16 or float16; each operand's rows a multiple of
    16 bytes (each width a multiple of 4 float32 or 8 bfloat16 elements); int32 group offsets. Anywhere else
    (ROCm, the other accelerators) the experts run as the loop."""
    if not hasattr(torch, "_grouped_mm"):
        return f"torch {torch.__version__} has no torch._grouped_mm"
    if device.type == "cuda":
        if torch.version.hip is not None:
            return "torch._grouped_mm is not used on ROCm (its kernel here is CUDA's CUTLASS one)"
        major, minor = torch.cuda.get_device_capability(device)
        if major < 9:
            return f"torch._grouped_mm needs CUDA compute capability 9.0 or above, the device has {major}.{minor}"
        if dtype != torch.bfloat16:
            return f"torch._grouped_mm on CUDA computes in bfloat16 only, not {dtype} (bf16 precision would)"
    elif device.type == "cpu":
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            return f"torch._grouped_mm on CPU computes in float32, bfloat16 or float16, not {dtype}"
    else:
        return (
            f"torch._grouped_mm has no kernel for device type {device.type!r} (it runs on CUDA sm90+ and CPU)"
        )
    size = torch.empty((), dtype=dtype).element_size()
    unaligned = [str(w) for w in widths if (w * size) % 16]
    if unaligned:
        return (
            f"torch._grouped_mm needs rows of a multiple of 16 bytes: width {', '.join(unaligned)} is not a "
            f"multiple of {16 // size} {dtype} elements"
        )
    return None


def padded_groups(counts: torch.Tensor, rows: int, align: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Each expert's ``counts[e]`` rows (``rows`` in all) laid out with every group padded to a multiple of
    ``align`` rows, as torchtitan pads its token groups (16 bytes' worth), so that each group of the grouped
    matmul and of its backward (whose weight gradients are grouped along the rows) starts aligned.

    Returns (the position of each row in the padded buffer, the int32 cumulative group ends that
    ``torch._grouped_mm`` takes as ``offs``, the buffer's length). Computed on the device without a host sync:
    the buffer has the worst case's length, ``rows + experts * (align - 1)``; its rows past the last group's end
    belong to no group and are never read back."""
    experts = counts.shape[0]
    padded = (counts + align - 1) // align * align
    ends = padded.cumsum(0)
    shift = (ends - padded) - (counts.cumsum(0) - counts)  # padded start - packed start, per expert
    expert_of_row = torch.repeat_interleave(
        torch.arange(experts, device=counts.device), counts, output_size=rows
    )
    positions = torch.arange(rows, device=counts.device) + shift[expert_of_row]
    return positions, ends.to(torch.int32), rows + experts * (align - 1)


class GroupedExperts(nn.Module):
    """The routed experts' SwiGLU weights, stacked (``w1``, ``w3``: (experts, dim, hidden); ``w2``: (experts,
    hidden, dim)): a module of their own, so a strategy can shard them apart from the rest (FSDP over the data
    axis when expert parallelism holds a slice of them).

    ``kernel`` picks how they run: ``grouped``, three ``torch._grouped_mm`` calls over every expert at once (what
    torchtitan and Megatron train with); ``loop``, one SwiGLU per expert; ``auto``, grouped where
    :func:`grouped_mm_support` says the op runs (decided once per device and compute dtype), else the loop. What
    ran is :attr:`ran` (and why not grouped, :attr:`not_grouped`), for the record."""

    def __init__(self, n_experts: int, dim: int, hidden: int, kernel: str = "auto") -> None:
        super().__init__()
        if kernel not in EXPERTS_KERNELS:
            raise ValueError(f"experts kernel {kernel!r}: choose one of {', '.join(EXPERTS_KERNELS)}")
        self.w1 = nn.Parameter(torch.empty(n_experts, dim, hidden))
        self.w3 = nn.Parameter(torch.empty(n_experts, dim, hidden))
        self.w2 = nn.Parameter(torch.empty(n_experts, hidden, dim))
        self.kernel = kernel
        # expert tensor parallelism (tensor_parallel): the group whose ranks hold a slice of every expert's hidden
        # width, and this rank's place in it
        self.tp_group: Any = None
        self.tp_rank = 0
        self.ran: str | None = None
        self.not_grouped: str | None = None
        self._decided: dict[tuple[torch.device, torch.dtype], str | None] = {}

    def tensor_parallel(self, mesh: Any) -> None:
        """Megatron's expert tensor parallelism over ``mesh`` (the tp axis): every expert's ``w1`` and ``w3`` split
        by their output (the hidden width, column-parallel), ``w2`` by its input (row-parallel), each rank keeping
        its slice of the weights the one-device model was initialised with, as DTensors (so the gradient norm and
        the optimizer see the whole). A rank computes its slice of every expert's hidden units for every routed
        row; the partial outputs are summed over the group (:class:`SumOverTensorParallel`), and the rows'
        gradients likewise (:class:`CopyToTensorParallel`). The router is not split: every rank routes alike."""
        from torch.distributed.tensor import DTensor, Shard

        rank, size = mesh.get_local_rank(), mesh.size()
        hidden = self.w1.shape[2]
        if hidden % size:
            raise ValueError(
                f"experts of hidden width {hidden} do not divide over {size} tensor-parallel ranks"
            )
        for name, dim in (("w1", 2), ("w3", 2), ("w2", 1)):
            local = getattr(self, name).detach().chunk(size, dim=dim)[rank].contiguous()
            shard = DTensor.from_local(local, mesh, [Shard(dim)], run_check=False)
            setattr(self, name, nn.Parameter(shard))
        self.tp_group, self.tp_rank = mesh.get_group(), rank

    def _weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``w1``, ``w3``, ``w2`` as this rank computes with them: whole, or its tensor-parallel slice."""
        from torch.distributed.tensor import DTensor

        return tuple(  # type: ignore[return-value]
            w.to_local() if isinstance(w, DTensor) else w for w in (self.w1, self.w3, self.w2)
        )

    def forward(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """The experts on ``rows``, grouped by expert in order, ``counts[e]`` rows each."""
        if self.tp_group is None:
            return self._compute(rows, counts)
        rows = CopyToTensorParallel.apply(rows, self.tp_group)
        return SumOverTensorParallel.apply(self._compute(rows, counts), self.tp_group)

    def _compute(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        w1 = self._weights()[0]
        device = w1.device
        dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else w1.dtype
        if self.kernel == "loop":
            reason: str | None = "--experts-kernel loop"
        else:
            key = (device, dtype)
            if key not in self._decided:
                self._decided[key] = grouped_mm_support(device, dtype, (w1.shape[1], w1.shape[2]))
            reason = self._decided[key]
            if reason is not None and self.kernel == "grouped":
                from accelbench.errors import ConfigError

                raise ConfigError(
                    f"--experts-kernel grouped cannot run here: {reason}; use --experts-kernel auto (grouped where "
                    "it can run, else the loop) or loop"
                )
        self.ran, self.not_grouped = ("loop", reason) if reason is not None else ("grouped", None)
        if reason is None:
            return self._grouped(rows, counts, dtype)
        return self._loop(rows, counts)

    def _loop(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        parts = rows.split(counts.tolist())
        # unbind, not w[e]: its backward stacks the experts' gradients once, where indexing would fill a zero
        # gradient of the whole stack for every expert
        w1, w3, w2 = (w.unbind(0) for w in self._weights())
        outs = [swiglu(part, w1[e], w3[e], w2[e]) for e, part in enumerate(parts)]
        return torch.cat(outs) if outs else rows

    def _grouped(self, rows: torch.Tensor, counts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The SwiGLU of every expert in three grouped matmuls over the rows padded per expert (zeros, so the
        padding adds nothing to the weights' gradients); inputs cast to ``dtype`` as autocast casts a matmul's."""
        align = 16 // torch.empty((), dtype=dtype).element_size()
        positions, offs, length = padded_groups(counts, rows.shape[0], align)
        x = rows.to(dtype)
        x = x.new_zeros(length, x.shape[1]).index_copy(0, positions, x)
        w1, w3, w2 = (w.to(dtype) for w in self._weights())
        hidden = F.silu(torch._grouped_mm(x, w1, offs=offs)) * torch._grouped_mm(x, w3, offs=offs)
        return torch._grouped_mm(hidden, w2, offs=offs).index_select(0, positions)


class MoEFeedForward(nn.Module):
    """Top-k routed SwiGLU experts (:class:`GroupedExperts`), an optional shared expert, the balance loss (:attr:`aux_loss`, set by each forward) and the
    tokens each expert got (:attr:`routed`)."""

    def __init__(self, cfg: MoEConfig, layer: int = 0) -> None:
        super().__init__()
        self.n_experts, self.top_k = cfg.n_experts, cfg.top_k
        self.layer = layer  # the block's index in the whole model: its row in update_expert_biases' exchange
        self.router = nn.Linear(cfg.dim, cfg.n_experts, bias=False)
        self.experts = GroupedExperts(cfg.n_experts, cfg.dim, cfg.ffn_dim, cfg.experts_kernel)
        self.shared_expert = (
            FeedForward(LlamaConfig(**{**_llama_fields(cfg), "ffn_dim": cfg.ffn_dim * cfg.shared_experts}))
            if cfg.shared_experts
            else None
        )
        # expert parallelism: the group exchanging tokens, and the first expert this rank holds
        self.ep_group: Any = None
        self.ep_size, self.first_expert = 1, 0
        # under ep with tp: take the tp group's first rank's routing (set by the pipeline executor for a stage's
        # shape inference, which runs on uninitialised inputs that differ between the tp ranks)
        self.agree_routing = False
        self.aux_loss: torch.Tensor | None = None
        # tokens routed to each expert by training forwards since the last reset: a plain attribute, not a
        # buffer, so that DDP's buffer broadcast leaves each rank's own count
        self.routed: torch.Tensor | None = None
        # auxiliary-loss-free balancing: the per-expert bias on the scores the top-k is chosen by (a buffer: it
        # moves with the model, gets no gradient and is kept float32 by _apply), and the tokens routed to each
        # expert since the last update (a plain attribute, as routed)
        self.expert_bias: torch.Tensor | None
        self.register_buffer("expert_bias", torch.zeros(cfg.n_experts) if cfg.expert_biases else None)
        self.load: torch.Tensor | None = None

    def _apply(self, fn: Any, recurse: bool = True) -> MoEFeedForward:
        """Module._apply, but the expert bias keeps float32 when the model is cast (to bf16, say): its steps of
        0.001 would round away in bf16 beside a bias of 0.25."""
        bias = self.expert_bias
        super()._apply(fn, recurse)
        moved = self.expert_bias
        if bias is not None and moved is not None and moved.dtype != bias.dtype and not bias.is_meta:
            self.expert_bias = bias.to(moved.device)
        return self

    def affinities(self, scores: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        """The scores the expert bias is added to for the choice: the softmax probabilities here."""
        return probs

    @property
    def local_experts(self) -> int:
        return self.experts.w1.shape[0]

    def expert_parameters(self) -> list[nn.Parameter]:
        """The routed experts' weights: sharded over the ep axis, the rest of the model is replicated."""
        return list(self.experts.parameters())

    def shard_experts(self, group: Any, rank: int, size: int) -> None:
        """Keep experts ``rank * E/size`` to ``(rank + 1) * E/size - 1`` (slices of the weights initialised for
        all of them, so the model is the one-device model's) and exchange tokens over ``group``."""
        if self.n_experts % size:
            raise ValueError(f"{self.n_experts} experts do not divide over {size} expert-parallel ranks")
        per = self.n_experts // size
        self.first_expert, self.ep_size, self.ep_group = rank * per, size, group
        for name in ("w1", "w3", "w2"):
            whole = getattr(self.experts, name)
            setattr(self.experts, name, nn.Parameter(whole.detach()[rank * per : (rank + 1) * per].clone()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        tokens = x.reshape(-1, d)
        scores = self.router(tokens).float()
        probs = scores.softmax(dim=-1)  # (tokens, experts)
        if self.expert_bias is None:
            gates, chosen = probs.topk(self.top_k, dim=-1)  # (tokens, k)
        else:  # chosen by the biased scores, gated by the unbiased ones
            chosen = (self.affinities(scores, probs) + self.expert_bias).topk(self.top_k, dim=-1).indices
            gates = probs.gather(-1, chosen)
        if self.agree_routing and self.experts.tp_group is not None:
            chosen = first_ranks_routing(chosen, self.experts.tp_group)
        gates = (gates / gates.sum(dim=-1, keepdim=True)).type_as(x)
        # the top-k choices sorted by expert: rows of the same expert are contiguous
        choices = chosen.flatten()
        order = choices.argsort(stable=True)
        # each expert's rows: a scatter rather than bincount, whose output length depends on the data (the step
        # traces under fake tensors for the prediction)
        counts = torch.zeros(self.n_experts, dtype=torch.long, device=choices.device).scatter_add_(
            0, choices, torch.ones_like(choices)
        )
        source = order // self.top_k  # the token of each sorted choice
        rows = tokens[source]
        if self.ep_group is None:
            out = self.experts(rows, counts)
        else:
            out = self._exchange_and_compute(rows, counts)
        y = torch.zeros_like(tokens).index_add_(0, source, out * gates.flatten()[order, None])
        if self.shared_expert is not None:
            y = y + self.shared_expert(tokens)
        self.aux_loss = self._balance_loss(
            probs.view(b, t, -1), counts_per_sequence(chosen.view(b, -1), self.n_experts)
        )
        if self.training and torch.is_grad_enabled():
            done = counts.detach()
            self.routed = done if self.routed is None else self.routed + done
            if self.expert_bias is not None:
                self.load = done if self.load is None else self.load + done
        return y.view(b, t, d)

    def _exchange_and_compute(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Send each row to the rank holding its expert, compute, and bring the outputs back (same order)."""
        import torch.distributed as dist
        from torch.distributed._functional_collectives import all_to_all_single_autograd

        p, local = self.ep_size, self.local_experts
        # how many rows of each of my local experts every rank sends me: (source rank, local expert)
        received = torch.empty_like(counts)
        dist.all_to_all_single(received, counts, group=self.ep_group)
        received = received.view(p, local)
        send_splits = counts.view(p, local).sum(dim=1).tolist()
        recv_splits = received.sum(dim=1).tolist()
        arrived = all_to_all_single_autograd(rows, recv_splits, send_splits, self.ep_group)
        # arrived rows are grouped by source rank, then by expert: regroup them by expert
        expert_of = torch.arange(local, device=rows.device).repeat(p).repeat_interleave(received.flatten())
        regroup = expert_of.argsort(stable=True)
        computed = self.experts(arrived[regroup], received.sum(dim=0))
        back = torch.empty_like(computed).index_copy(0, regroup, computed)  # the arrival order again
        return all_to_all_single_autograd(back, send_splits, recv_splits, self.ep_group)

    def _balance_loss(self, probs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Switch's balance loss per sequence, averaged: ``E * sum_i f_i P_i`` with ``f_i`` = the sequence's
        choices of expert i / (k * tokens) and ``P_i`` its mean probability of i; 1 when perfectly balanced."""
        t = probs.shape[1]
        share = counts.float() / (self.top_k * t)  # (batch, experts)
        return (self.n_experts * (share * probs.mean(dim=1)).sum(dim=-1)).mean()


def first_ranks_routing(chosen: torch.Tensor, group: Any) -> torch.Tensor:
    """``chosen`` (each token's top-k experts) as the first rank of ``group`` chose them: its broadcast."""
    import torch.distributed as dist

    chosen = chosen.contiguous()
    dist.broadcast(chosen, src=dist.get_global_rank(group, 0), group=group)
    return chosen


def counts_per_sequence(chosen: torch.Tensor, n_experts: int) -> torch.Tensor:
    """(batch, experts) counts of each expert among each row's choices (``chosen``: (batch, choices))."""
    counts = torch.zeros(chosen.shape[0], n_experts, device=chosen.device, dtype=torch.long)
    return counts.scatter_add_(1, chosen, torch.ones_like(chosen))


def _llama_fields(cfg: MoEConfig) -> dict[str, Any]:
    return {f: getattr(cfg, f) for f in LlamaConfig.__dataclass_fields__}


class SigmoidRouter(nn.Linear):
    """DeepSeek-V3's router scores on :class:`MoEFeedForward`'s softmax: returns ``logsigmoid(x W)``, so the
    feed-forward's softmax over them is ``sigmoid(s_i) / sum_j sigmoid(s_j)``. Its top-k are the top-k sigmoid
    scores (the normalisation keeps the order), and their gates, renormalised over the chosen, are DeepSeek-V3's
    ``sigmoid(s_i) / sum_chosen sigmoid(s_j)``; the balance loss's mean probabilities are then the sigmoid scores
    normalised over all experts, as DeepSeek-V3's sequence-wise balance loss has them."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.logsigmoid(super().forward(x).float())


class DeepSeekFeedForward(MoEFeedForward):
    """:class:`MoEFeedForward` routed by sigmoid scores (:class:`SigmoidRouter`), DeepSeek-V3's."""

    def __init__(self, cfg: MoEConfig, layer: int = 0) -> None:
        super().__init__(cfg, layer)
        self.router = SigmoidRouter(cfg.dim, cfg.n_experts, bias=False)

    def affinities(self, scores: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        """DeepSeek-V3's expert bias is added to the sigmoid affinities: exp of the router's logsigmoid."""
        return scores.exp()


class MoEBlock(nn.Module):
    """The Llama's pre-norm block, Meta's names, with the routed feed-forward; block ``layer`` of the model, whose
    attention is latent (:class:`LatentAttention`) where ``kv_lora_rank`` > 0 and whose feed-forward is dense
    among the first ``first_k_dense`` blocks."""

    def __init__(self, cfg: MoEConfig, layer: int = 0) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.attention: nn.Module = LatentAttention(cfg) if cfg.latent_attention else Attention(cfg)
        self.ffn_norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.feed_forward: nn.Module
        if layer < cfg.first_k_dense:
            self.feed_forward = FeedForward(
                LlamaConfig(**{**_llama_fields(cfg), "ffn_dim": cfg.dense_ffn_dim})
            )
        elif cfg.router_scores == "sigmoid":
            self.feed_forward = DeepSeekFeedForward(cfg, layer)
        else:
            self.feed_forward = MoEFeedForward(cfg, layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class MoE(DecoderPieces, nn.Module):
    """forward(tokens, targets) -> cross-entropy + ``aux_loss_coef`` x the layers' summed balance losses.
    Submodules as the Llama's: ``tok_embeddings``, ``layers``, ``norm``, ``output`` (untied)."""

    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        check_config(cfg)
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(MoEBlock(cfg, i) for i in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
        # the Llama's (GPT-2's) scaled init of the residual projections
        residual = 0.02 / math.sqrt(2 * cfg.n_layers)
        for name, p in self.named_parameters():
            if name.endswith(("wo.weight", "w2.weight", ".w2")):
                nn.init.normal_(p, mean=0.0, std=residual)
            elif name.endswith((".w1", ".w3")):
                nn.init.normal_(p, mean=0.0, std=0.02)

    def moe_layers(self) -> list[MoEFeedForward]:
        return [m for m in self.modules() if isinstance(m, MoEFeedForward)]

    # A pipeline runs embed, the blocks, head, then loss (DecoderPieces: the cross-entropy alone); the blocks'
    # balance losses reach backward by themselves (add_balance_loss_in_backward) and the reported loss by
    # take_balance_loss.

    def add_balance_loss_in_backward(self) -> None:
        """Make every MoE layer add the gradient of its weighted balance loss (``aux_loss_coef`` x its loss) in
        backward itself (:class:`BalanceLossInBackward`, by a forward hook), and keep the loss's value for
        :meth:`take_balance_loss`: what a pipeline runs the blocks with, since its stages hand on hidden states only.
        The model's own ``forward`` must not then be used for training (it would count the losses twice)."""
        coef = self.cfg.aux_loss_coef
        self._balance_taken: torch.Tensor | None = None
        # the tokens each layer counted since the last take, which a take may take back: in its routing counts
        # (MoEFeedForward.routed) and in the loads its expert bias is next updated by (MoEFeedForward.load)
        self._routed_since: list[tuple[MoEFeedForward, torch.Tensor, torch.Tensor | None]] = []

        # each layer's routing count and load as its running forward found them
        counts_before: dict[nn.Module, tuple[torch.Tensor | None, torch.Tensor | None]] = {}

        def before(layer: nn.Module, inputs: Any) -> None:
            assert isinstance(layer, MoEFeedForward)
            counts_before[layer] = (layer.routed, layer.load)

        def after(layer: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
            assert isinstance(layer, MoEFeedForward) and layer.aux_loss is not None
            routed_before, load_before = counts_before.get(layer, (None, None))
            if layer.routed is not None and layer.routed is not routed_before:
                routed = layer.routed if routed_before is None else layer.routed - routed_before
                load = None
                if layer.load is not None and layer.load is not load_before:
                    load = layer.load if load_before is None else layer.load - load_before
                self._routed_since.append((layer, routed, load))
            weighted = coef * layer.aux_loss
            done = weighted.detach()
            self._balance_taken = done if self._balance_taken is None else self._balance_taken + done
            if not torch.is_grad_enabled():
                return output
            return BalanceLossInBackward.apply(output, weighted)

        for layer in self.moe_layers():
            layer.register_forward_pre_hook(before)
            layer.register_forward_hook(after)

    def take_balance_loss(self, keep: bool = True) -> torch.Tensor | None:
        """The weighted balance losses of the MoE layers this process ran since the last call, summed over layers
        and forwards, and forgotten; None where none ran (after :meth:`add_balance_loss_in_backward`). ``keep``
        False: those forwards did not happen, their tokens are taken back from the routing counts and from the loads
        the expert biases are updated by too (a pipeline's metadata inference runs each stage once, with gradients
        on, on empty tensors or the first stage's real inputs, outside the schedule's forwards: counted, its tokens
        would move the biases otherwise than one device's step)."""
        taken, self._balance_taken = getattr(self, "_balance_taken", None), None
        since, self._routed_since = getattr(self, "_routed_since", []), []
        if keep:
            return taken
        for layer, routed, load in since:
            if layer.routed is not None:
                layer.routed = layer.routed - routed
            if load is not None and layer.load is not None:
                layer.load = layer.load - load
        return None

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        logits = self.output(self.norm(x))
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))
        aux = [m.aux_loss for m in self.moe_layers() if m.aux_loss is not None]
        if self.cfg.aux_loss_coef and aux:
            loss = loss + self.cfg.aux_loss_coef * torch.stack(aux).sum()
        return loss

    def num_parameters(self, non_embedding: bool = False) -> int:
        """Parameters held by this process (all experts' on one device, its share under expert parallelism)."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.tok_embeddings.weight.numel() if non_embedding else n


@torch.no_grad()
def update_expert_biases(
    model: nn.Module, n_layers: int, n_experts: int, speed: float, whole: nn.Module | None = None
) -> None:
    """DeepSeek-V3's bias update, after an optimizer step: each MoE layer's expert bias moves by ``-speed *
    sign(load_i - mean load)``, the load being the tokens routed to each expert since the last update; the
    overloaded experts' scores go down, the underloaded's up. The loads are summed over every rank first (one
    all-reduce of an (n_layers, n_experts) table, each layer in its own row: under pipeline parallelism a rank holds
    only some layers), so that every rank, each routing its own tokens, keeps the same biases: those one device
    would have on the whole batch. ``model`` may be wrapped (DDP, FSDP); every rank must call this at each step.
    ``whole``: the whole model, where ``model`` holds only some of its layers (a pipeline rank's stages): its other
    layers take the same update from the summed loads, so every rank's copy keeps every layer's biases (the record's
    ``expert_bias_by_layer`` is rank 0's)."""
    import torch.distributed as dist

    layers = [m for m in model.modules() if isinstance(m, MoEFeedForward) and m.expert_bias is not None]
    distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    if not layers and not distributed:
        return
    device = layers[0].expert_bias.device if layers else _device_of(model)  # type: ignore[union-attr]
    load = torch.zeros(n_layers, n_experts, device=device)
    for layer in layers:
        if layer.load is not None:
            load[layer.layer] = layer.load.float()
    if distributed:
        dist.all_reduce(load)
    held = {id(layer) for layer in layers}
    others = [
        m
        for m in (whole.modules() if whole is not None else ())
        if isinstance(m, MoEFeedForward) and m.expert_bias is not None and id(m) not in held
    ]
    for layer in [*layers, *others]:
        row = load[layer.layer]
        assert layer.expert_bias is not None
        if not layer.expert_bias.is_meta:
            layer.expert_bias.sub_((speed * torch.sign(row - row.mean())).to(layer.expert_bias.device))
        layer.load = None


def _device_of(model: nn.Module) -> torch.device:
    for tensor in model.parameters():
        return tensor.device
    return torch.device("cpu")


def balance_by_expert_biases(
    optimizer: torch.optim.Optimizer, model: nn.Module, cfg: MoEConfig, whole: nn.Module | None = None
) -> None:
    """Make ``optimizer`` (the workload's optimizer recipe calls this, so every executor's optimizer does it) run
    :func:`update_expert_biases` on ``model`` after each of its steps, and forget the loads counted when it clears
    the gradients: the forwards a step never follows (the gradient-norm probe between epochs, a compile warm-up,
    each ending in ``zero_grad``) must not move the biases, or a run with probes would train otherwise than one
    without. A training step clears its gradients after its step, once the loads are spent. ``whole``: the whole
    model, where ``model`` is a pipeline rank's stages (see :func:`update_expert_biases`)."""

    def update(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        update_expert_biases(model, cfg.n_layers, cfg.n_experts, cfg.bias_update_speed, whole)

    optimizer.register_step_post_hook(update)
    zero_grad = optimizer.zero_grad

    def zero_grad_and_forget_loads(set_to_none: bool = True) -> None:
        for layer in model.modules():
            if isinstance(layer, MoEFeedForward):
                layer.load = None
        zero_grad(set_to_none)

    optimizer.zero_grad = zero_grad_and_forget_loads  # type: ignore[method-assign]
