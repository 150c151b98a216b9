"""The Llama model: a Llama-3-style decoder, nanoGPT-readable (imported when a run builds the model).

Meta's architecture (Touvron et al. 2023; Llama 3, Grattafiori et al. 2024) with Meta's module names, so a reader
of ``llama/model.py`` or torchtitan finds the same parts:

- pre-norm blocks with RMSNorm (``torch.nn.RMSNorm``, one fused kernel where the device has one), no biases;
- rotary position embeddings on q and k (interleaved pairs, as Meta's complex-number form; base ``rope_theta``);
- grouped-query attention: ``n_kv_heads`` key/value heads shared by ``n_heads / n_kv_heads`` query heads each,
  computed by one fused ``scaled_dot_product_attention`` (causal; ``enable_gqa`` broadcasts k and v, no copies);
- a SwiGLU feed-forward, ``w2(silu(w1 x) * w3 x)``;
- an output head untied from the token embedding.

Not modelled: Llama 3.1's RoPE frequency scaling for 128K contexts, and KV caches (this trains, it does not serve).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from accelbench.workloads.gpt.model import configure_adamw

__all__ = ["Llama", "LlamaConfig", "apply_rope", "configure_adamw"]


@dataclass(frozen=True)
class LlamaConfig:
    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    vocab_size: int
    seq_len: int
    rope_theta: float = 500_000.0
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


def rope_angles(
    t: int, head_dim: int, theta: float, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the angles t * theta^(-2i / head_dim), fp32, shaped (time, 1, head_dim / 2) to broadcast over
    batch rows and heads."""
    freqs = theta ** -(torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(t, device=device, dtype=torch.float32), freqs)[:, None, :]
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Each pair (x[2i], x[2i+1]) of ``x`` (batch, time, heads, head_dim) turned by its angle, in fp32."""
    x1, x2 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2).type_as(x)


def apply_rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding of ``x`` (batch, time, heads, head_dim): each pair (x[2i], x[2i+1]) at position
    t turned by the angle t * theta^(-2i / head_dim), computed in fp32. Relative: <rope(q)_m, rope(k)_n> depends
    on m - n only."""
    return rotate(x, *rope_angles(x.shape[1], x.shape[-1], theta, x.device))


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        self.rope_theta = cfg.rope_theta
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # the heads this module computes: all, or its share when tensor parallelism shards wq/wk/wv by heads
        q = self.wq(x).view(b, t, -1, self.head_dim)
        k = self.wk(x).view(b, t, -1, self.head_dim)
        v = self.wv(x).view(b, t, -1, self.head_dim)
        cos, sin = rope_angles(t, self.head_dim, self.rope_theta, x.device)  # once for q and k
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))  # (batch, heads, time, head_dim)
        # one fused causal kernel; each k/v head serves n_heads / n_kv_heads query heads (grouped-query attention)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)  # gate
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)  # down
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)  # up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))  # SwiGLU


class TransformerBlock(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class DecoderPieces:
    """The pieces of a decoder's forward, named in its workload's ModelUnits so a pipeline can run them on different
    stages: embed (the stem), head, loss. For a module with ``tok_embeddings``, ``norm`` and ``output`` (untied):
    the Llama and the mixture of experts."""

    tok_embeddings: nn.Embedding
    norm: nn.RMSNorm
    output: nn.Linear

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The token embedding: the stem (positions enter in each attention, as rotations)."""
        return self.tok_embeddings(tokens)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Final RMSNorm and the output projection: the logits."""
        return self.output(self.norm(x))

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of the logits against the targets (a mixture's balance losses are not in it)."""
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))


class Llama(DecoderPieces, nn.Module):
    """forward(tokens, targets) -> mean cross-entropy loss. Submodules: ``tok_embeddings``, ``layers``, ``norm``,
    ``output`` (untied), so strategies that split the model (pipelines, FSDP units) can find them."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        if cfg.dim % cfg.n_heads or cfg.n_heads % cfg.n_kv_heads:
            raise ValueError(
                f"dim {cfg.dim}, heads {cfg.n_heads} and kv heads {cfg.n_kv_heads} do not divide"
            )
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith(("wo.weight", "w2.weight")):  # GPT-2's scaled init of the residual projections
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.loss(self.head(x), targets)

    def num_parameters(self, non_embedding: bool = False) -> int:
        """Parameters; ``non_embedding``: without the token embedding (a lookup, no FLOPs; the untied output
        head is a matmul and counts)."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.tok_embeddings.weight.numel() if non_embedding else n
