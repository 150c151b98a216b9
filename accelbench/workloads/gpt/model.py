"""The GPT model: a GPT-2 family transformer, and its optimizer recipe (imported when a run builds the model).

Configuration-compatible with minGPT's model table, written for speed the way a tuned loop is: fused
scaled-dot-product attention (flash / memory-efficient kernels where the device has them), PyTorch's
exact GELU kernel, pre-norm blocks, the LM head tied to the token embedding, a fused AdamW, and optional
``torch.compile`` (``--compile``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int
    n_head: int
    n_embd: int
    block_size: int
    vocab_size: int
    dropout: float = 0.1
    vocab_multiple: int = 1  # pad the embedding/head rows to a multiple of this (tensor-core friendly shapes)

    @property
    def padded_vocab_size(self) -> int:
        return math.ceil(self.vocab_size / self.vocab_multiple) * self.vocab_multiple


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        qkv = self.qkv(x)
        # the width of q (and k, v) this module computes: c, or c / tp when tensor parallelism shards qkv by heads
        width = qkv.shape[-1] // 3
        q, k, v = qkv.split(width, dim=2)
        head_size = c // self.n_head
        heads = width // head_size
        q, k, v = (z.view(b, t, heads, head_size).transpose(1, 2) for z in (q, k, v))
        # one fused kernel instead of minGPT's masked softmax(QK^T)V
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        return self.resid_dropout(self.proj(y.transpose(1, 2).contiguous().view(b, t, width)))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.gelu = nn.GELU()  # exact GELU: one kernel, unlike minGPT's hand-written tanh formula
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(self.gelu(self.fc(x))))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """forward(inputs, targets) -> mean cross-entropy loss. Submodules: ``wte``, ``wpe``, ``blocks``, ``ln_f``,
    ``lm_head`` (tied to ``wte``), so strategies that split the model (pipelines, FSDP units) can find them.
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.padded_vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.padded_vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):  # GPT-2's scaled init of residual projections
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.loss(self.head(x), targets)

    # The pieces of forward, named in the workload's ModelUnits, so a pipeline can run them on different stages.

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        """Token and position embeddings: the stem."""
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.drop(self.wte(idx) + self.wpe(pos))

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm and the LM head: the logits (padded vocabulary)."""
        return self.lm_head(self.ln_f(x))

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of the logits against the targets."""
        vocab = self.cfg.vocab_size
        if logits.size(-1) != vocab:  # padded rows are never targets: drop their logits, so the loss is the
            logits = logits[..., :vocab]  # unpadded model's exactly (their gradient is zero)
        return F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))

    def num_parameters(self, non_embedding: bool = False) -> int:
        """Parameters of the model as defined (vocabulary padding rows excluded: they compute nothing useful)."""
        n = sum(p.numel() for p in self.parameters())  # the tied head/embedding counts once
        n -= (self.cfg.padded_vocab_size - self.cfg.vocab_size) * self.cfg.n_embd
        return n - self.wpe.weight.numel() if non_embedding else n

    def flops_per_token(self) -> float:
        c = self.cfg
        return 6.0 * self.num_parameters(non_embedding=True) + 12.0 * c.n_layer * c.n_embd * c.block_size

    def megatron_flops_per_sample(self) -> float:
        """One sequence's training FLOPs by Megatron-LM's count (no activation recomputation), unpadded vocabulary."""
        from accelbench.estimate.parallel import megatron_flops_per_iteration

        c = self.cfg
        return megatron_flops_per_iteration(1, c.block_size, c.n_layer, c.n_embd, c.vocab_size)


def configure_adamw(model: nn.Module, implementation: str, lr: float) -> torch.optim.Optimizer:
    """minGPT's AdamW: decay on matmul weights only, betas (0.9, 0.95), weight decay 0.1; the kernels
    (``implementation``: fused, foreach or plain) are the backend's choice for its device."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    params = list(model.parameters())  # shared (tied) parameters appear once
    decay = [p for p in params if p.dim() >= 2 and id(p) not in embeddings]
    no_decay = [p for p in params if p.dim() < 2 or id(p) in embeddings]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    from accelbench.workloads import optimizer_kernels

    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), **optimizer_kernels(implementation))
