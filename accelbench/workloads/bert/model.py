"""The BERT encoder and its masked-language-model head, and its optimizer recipe (imported when a run builds it).

Written as the GPT workload's model is: fused ``scaled_dot_product_attention`` (bidirectional, no mask: sequences
are full windows), PyTorch's exact GELU, the MLM decoder tied to the word embedding, a fused AdamW. Layers are
post-LayerNorm, as in the original BERT. Submodules are named for the strategies that split models
(:func:`accelbench.workloads.bert.bert_units`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from accelbench.config import RunConfig
from accelbench.workloads import ModelUnits, TrainingJob
from accelbench.workloads.bert import (
    FLOPS_FORMULA,
    MAX_POSITIONS,
    MODEL_SIZES,
    SYNTHETIC_SEQUENCES,
    predicted_positions,
)
from accelbench.workloads.dataoptions import data_label

LAYER_NORM_EPS = 1e-12  # BERT's


@dataclass(frozen=True)
class BertConfig:
    n_layer: int
    n_head: int
    n_embd: int
    vocab_size: int
    dropout: float = 0.1
    vocab_multiple: int = 1
    max_positions: int = MAX_POSITIONS
    type_vocab_size: int = 2

    @property
    def padded_vocab_size(self) -> int:
        return math.ceil(self.vocab_size / self.vocab_multiple) * self.vocab_multiple


class Embeddings(nn.Module):
    """Word + learned position + token type (all type 0: single-segment sequences), LayerNorm, dropout."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.word = nn.Embedding(cfg.padded_vocab_size, cfg.n_embd)
        self.position = nn.Embedding(cfg.max_positions, cfg.n_embd)
        self.token_type = nn.Embedding(cfg.type_vocab_size, cfg.n_embd)
        self.norm = nn.LayerNorm(cfg.n_embd, eps=LAYER_NORM_EPS)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.word(ids) + self.position(positions) + self.token_type.weight[0]
        return self.drop(self.norm(x))


class SelfAttention(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        qkv = self.qkv(x)
        # the width of q (and k, v) computed here: c, or c / tp when tensor parallelism shards qkv by heads
        width = qkv.shape[-1] // 3
        head_size = c // self.n_head
        q, k, v = (
            z.view(b, t, width // head_size, head_size).transpose(1, 2) for z in qkv.split(width, dim=2)
        )
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)
        return self.resid_dropout(self.proj(y.transpose(1, 2).contiguous().view(b, t, width)))


class FeedForward(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.gelu = nn.GELU()
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(self.gelu(self.fc(x))))


class EncoderLayer(nn.Module):
    """Post-LayerNorm, as BERT: x = norm(x + attention(x)); x = norm(x + feed_forward(x))."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.attn = SelfAttention(cfg)
        self.attn_norm = nn.LayerNorm(cfg.n_embd, eps=LAYER_NORM_EPS)
        self.mlp = FeedForward(cfg)
        self.mlp_norm = nn.LayerNorm(cfg.n_embd, eps=LAYER_NORM_EPS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attn_norm(x + self.attn(x))
        return self.mlp_norm(x + self.mlp(x))


class MLMHead(nn.Module):
    """Transform (dense, GELU, LayerNorm) and the decoder to vocabulary logits, tied to the word embedding."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.gelu = nn.GELU()
        self.norm = nn.LayerNorm(cfg.n_embd, eps=LAYER_NORM_EPS)
        self.decoder = nn.Linear(cfg.n_embd, cfg.padded_vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.norm(self.gelu(self.dense(x))))


class BertMLM(nn.Module):
    """``forward(input_ids, targets) -> mean cross-entropy over the predicted positions``.

    ``input_ids``: (N, S) token ids, masked. ``targets``: (N, 2, P) long, ``targets[:, 0]`` the positions to
    predict and ``targets[:, 1]`` their original tokens. Submodules: ``embeddings``, ``layers``, ``mlm_head``.
    """

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embeddings = Embeddings(cfg)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_layer))
        self.mlm_head = MLMHead(cfg)
        self.apply(self._init_weights)
        self.mlm_head.decoder.weight = self.embeddings.word.weight

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        """BERT's initialisation: normal(0, 0.02) weights, zero biases."""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, input_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.loss(self.head(x), targets)

    # The pieces of forward, named as the GPT's are, so a pipeline can run them on different stages.

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The embeddings: the stem."""
        return self.embeddings(input_ids)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """The encoder's output as the MLM head takes it (the head itself runs in :meth:`loss`, on the predicted
        positions only, which the targets name)."""
        return x

    def loss(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The MLM head on the predicted positions and the mean cross-entropy against their original tokens."""
        positions, labels = targets[:, 0], targets[:, 1]
        picked = x.gather(1, positions.unsqueeze(-1).expand(-1, -1, x.shape[-1]))  # (N, P, d)
        logits = self.mlm_head(picked)
        vocab = self.cfg.vocab_size
        if logits.size(-1) != vocab:  # padded rows are never labels: drop their logits (zero gradient)
            logits = logits[..., :vocab]
        return F.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1))

    def num_parameters(self) -> int:
        """Parameters of the model as defined (the padding rows of the vocabulary excluded)."""
        padding = self.cfg.padded_vocab_size - self.cfg.vocab_size
        return sum(p.numel() for p in self.parameters()) - padding * (self.cfg.n_embd + 1)

    def encoder_parameters(self) -> int:
        return sum(p.numel() for p in self.layers.parameters())

    def flops_per_sequence(self, seq_len: int, predicted: int) -> float:
        """Training FLOPs of one sequence (:data:`accelbench.workloads.bert.FLOPS_FORMULA`)."""
        c = self.cfg
        encoder = 6.0 * self.encoder_parameters() * seq_len + 12.0 * c.n_layer * c.n_embd * seq_len**2
        head = 6.0 * predicted * (c.n_embd**2 + c.n_embd * c.vocab_size)
        return encoder + head


def configure_adamw(model: nn.Module, implementation: str, lr: float) -> torch.optim.Optimizer:
    """BERT's AdamW: betas (0.9, 0.999), eps 1e-6, weight decay 0.01 except on biases and LayerNorm; the kernels
    (fused, foreach, plain) are the backend's choice."""
    params = list(model.parameters())  # the tied decoder/embedding weight once
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}]
    from accelbench.workloads import optimizer_kernels

    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-6, **optimizer_kernels(implementation))


def masked_accuracy(
    logits: torch.Tensor, targets: torch.Tensor, vocab: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked-token accuracy's counts: the MLM head's logits at the predicted positions (N, P, padded vocabulary)
    whose largest real token is the original one, and N x P."""
    labels = targets[:, 1]
    return (logits[..., :vocab].argmax(-1) == labels).sum(), torch.tensor(labels.numel())


def build_job(config: RunConfig, units: ModelUnits) -> TrainingJob:
    from accelbench.workloads.bert import vocab_size
    from accelbench.workloads.bert.data import MaskedSequences, open_text, random_masked
    from accelbench.workloads.pipeline import (
        GeneratedBatches,
        HeldOutGenerated,
        LoaderSource,
        held_out_loader,
        split_held_out,
    )

    options = config.workload_options
    seq_len, mask_ratio = int(options["seq_len"]), float(options["mask_ratio"])
    predicted = predicted_positions(seq_len, mask_ratio)
    n_layer, n_head, n_embd = MODEL_SIZES[config.model]
    vocab = vocab_size(config)
    samples = options.get("synthetic_samples")
    data: Any
    if data_label(config) == "synthetic-device":
        data = GeneratedBatches(
            random_masked(seq_len, predicted, vocab),
            int(samples or SYNTHETIC_SEQUENCES),
            config.batch_size,
            config.seed,
            config.steps_per_epoch,
            f"random token ids, {seq_len} per sequence, {predicted} masked",
        )
        validation: Any = HeldOutGenerated(data)
    else:
        text = open_text(config.data, options.get("tokenizer"), seq_len) if config.data else None
        dataset, held_out = split_held_out(
            MaskedSequences(text, vocab, seq_len, predicted, config.seed, int(samples or SYNTHETIC_SEQUENCES))
        )
        validation = held_out_loader(held_out, config.batch_size, config.seed) if held_out else None
        given = options.get("data_workers")
        workers = int(given) if given is not None else None
        data = LoaderSource(
            dataset, config.batch_size, config.seed, config.steps_per_epoch, workers, config.devices
        )
    torch.manual_seed(config.seed)
    cfg = BertConfig(
        n_layer, n_head, n_embd, vocab, float(options["dropout"]), int(options["vocab_multiple"])
    )
    model = BertMLM(cfg)
    lr = config.learning_rate
    flops = model.flops_per_sequence(seq_len, predicted)
    return TrainingJob(
        model=model,
        data=data,
        validation=validation,
        accuracy=functools.partial(masked_accuracy, vocab=cfg.vocab_size),
        make_optimizer=lambda m, device, kernels: configure_adamw(m, kernels, lr),
        flops_per_sample=flops,
        flops_formula=FLOPS_FORMULA,
        tokens_per_sample=seq_len,
        units=units,
        grad_clip_norm=1.0,
        summary={
            "name": config.model,
            "n_layer": n_layer,
            "n_head": n_head,
            "n_embd": n_embd,
            "seq_len": seq_len,
            "predicted_per_sequence": predicted,
            "vocab_size": vocab,
            "vocab_padded_to": cfg.padded_vocab_size,
            "dropout": cfg.dropout,
            "parameters": model.num_parameters(),
            "encoder_parameters": model.encoder_parameters(),
            "flops_per_sequence": flops,
            "attention": "torch scaled_dot_product_attention (bidirectional, no mask: full windows)",
            "objective": "masked language model (80% [MASK], 10% random, 10% kept); no next-sentence prediction",
            "optimizer": "AdamW, betas 0.9/0.999, eps 1e-6, weight decay 0.01 (not on biases and LayerNorm), "
            "clip 1.0, constant --lr",
            "source": "accelbench's own encoder (post-LayerNorm, BERT's configuration), from initialisation",
        },
    )
