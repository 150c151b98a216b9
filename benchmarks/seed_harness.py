"""The seed study's own harness, re-implemented: minGPT trained through PyTorch Lightning (lightning-GPT).

This is the reference accelbench's tuned loop is measured against (benchmarks/gpu/README.md). It is written from the
published descriptions of minGPT and lightning-GPT, keeping every choice that costs time:

- minGPT's model: attention as masked ``softmax(QK^T / sqrt(d)) V`` written out in PyTorch operations with a
  registered lower-triangular mask, attention and residual dropout 0.1, the tanh-approximation GELU written as a
  formula (several elementwise kernels), a separate (untied) LM head, minGPT's initialisation;
- minGPT's optimizer recipe: AdamW (torch's default implementation), decay on Linear weights only, betas
  (0.9, 0.95), weight decay 0.1, learning rate 3e-4; gradient clipping at 1.0 by the Lightning Trainer;
- lightning-GPT's data: a ``Dataset`` whose ``__getitem__`` draws a random offset and maps block + 1 characters
  through a Python dict, ``len = ceil(N / (block + 1))``, a ``DataLoader`` with 4 workers;
- lightning-GPT's training: a ``LightningModule`` that logs the loss every step, ``Trainer(precision=...,
  gradient_clip_val=1.0)``, ``torch.set_float32_matmul_precision("high")`` on CUDA.

Two departures, both in the reference's favour: no progress bar and no checkpointing (the study's Trainer had both).
Epochs are timed as the study's callback did: device synchronisation at each epoch's start and end.

    python benchmarks/seed_harness.py --model gpt2 --batch-size 64 --precision bf16-mixed --steps-per-epoch 100
    python benchmarks/seed_harness.py --engine plain ...    # the same model and data in a hand-written loop
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from accelbench.workloads.gpt import MODEL_SIZES as SIZES  # layers, heads, embedding (minGPT's table)


# ---------------------------------------------------------------------------------------------------------- model
class TanhGELU(nn.Module):
    """GELU by the tanh approximation, as a formula of elementwise operations (minGPT's NewGELU)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class MaskedSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, block_size: int, pdrop: float) -> None:
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.attn_dropout = nn.Dropout(pdrop)
        self.resid_dropout = nn.Dropout(pdrop)
        mask = torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size)
        self.register_buffer("bias", mask)
        self.n_head = n_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(c, dim=2)
        heads = [z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v)]
        q, k, v = heads
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_dropout(self.c_proj(y))


class MinGPTBlock(nn.Module):
    def __init__(self, n_embd: int, n_head: int, block_size: int, pdrop: float) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = MaskedSelfAttention(n_embd, n_head, block_size, pdrop)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)
        self.act = TanhGELU()
        self.dropout = nn.Dropout(pdrop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.dropout(self.c_proj(self.act(self.c_fc(self.ln_2(x)))))


class MinGPT(nn.Module):
    def __init__(
        self, vocab: int, block_size: int, n_layer: int, n_head: int, n_embd: int, pdrop: float
    ) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(pdrop)
        self.h = nn.ModuleList(MinGPTBlock(n_embd, n_head, block_size, pdrop) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)  # untied, as in minGPT
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device).unsqueeze(0)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)

    def optimizer(self, lr: float) -> torch.optim.Optimizer:
        """Decay on Linear weights; none on biases, LayerNorm and Embedding weights (minGPT's groups)."""
        decay, no_decay = [], []
        for module in self.modules():
            for name, p in module.named_parameters(recurse=False):
                (decay if isinstance(module, nn.Linear) and name == "weight" else no_decay).append(p)
        groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


# ----------------------------------------------------------------------------------------------------------- data
class CharWindows(Dataset):
    """lightning-GPT's character dataset: a random window per item, characters mapped through a dict."""

    def __init__(self, text: str, block_size: int) -> None:
        chars = sorted(set(text))
        self.stoi = {ch: i for i, ch in enumerate(chars)}
        self.vocab_size = len(chars)
        self.block_size = block_size
        self.text = text

    def __len__(self) -> int:
        return math.ceil(len(self.text) / (self.block_size + 1))

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        i = np.random.randint(0, len(self.text) - (self.block_size + 1))
        ids = [self.stoi[ch] for ch in self.text[i : i + self.block_size + 1]]
        return torch.tensor(ids[:-1], dtype=torch.long), torch.tensor(ids[1:], dtype=torch.long)


def load_text(path: Path | None) -> str:
    if path is not None:
        return path.read_text(encoding="latin-1")
    from accelbench.workloads.chardata import generate_corpus  # the same text accelbench trains on

    return generate_corpus().tobytes().decode("ascii")


# -------------------------------------------------------------------------------------------------------- engines
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak(device: torch.device) -> int | None:
    return int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None


def run_lightning(
    args: argparse.Namespace, model: MinGPT, loader: DataLoader, device: torch.device
) -> list[dict]:
    import lightning as L

    epochs: list[dict[str, Any]] = []

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.gpt = model

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            idx, targets = batch
            loss = self.gpt(idx, targets)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return self.gpt.optimizer(args.lr)

    class EpochTimer(L.Callback):
        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            sync(device)
            reset_peak(device)
            self.start = time.perf_counter()

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            sync(device)
            epochs.append(
                {
                    "wall_s": time.perf_counter() - self.start,
                    "peak_bytes": peak(device),
                    "loss": float(trainer.callback_metrics.get("train_loss", float("nan"))),
                }
            )

    trainer = L.Trainer(
        accelerator="gpu" if device.type == "cuda" else "cpu",
        devices=1,
        precision=args.precision,
        max_epochs=args.epochs,
        limit_train_batches=args.steps_per_epoch or 1.0,
        gradient_clip_val=1.0,
        callbacks=[EpochTimer()],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=L.pytorch.loggers.CSVLogger(args.log_dir) if args.log_dir else False,
        default_root_dir=args.log_dir,
    )
    trainer.fit(Module(), loader)
    return epochs


AUTOCAST = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def run_plain(
    args: argparse.Namespace, model: MinGPT, loader: DataLoader, device: torch.device
) -> list[dict]:
    """The same model, data and recipe in a hand-written loop: what Lightning itself costs."""
    if args.precision not in ("32-true", *AUTOCAST):
        raise SystemExit(f"--engine plain supports 32-true, 16-mixed, bf16-mixed, not {args.precision}")
    model = model.to(device).train()
    optimizer = model.optimizer(args.lr)
    scaler = torch.amp.GradScaler(device.type) if args.precision == "16-mixed" else None
    dtype = AUTOCAST.get(args.precision)
    epochs = []
    for _ in range(args.epochs):
        sync(device)
        reset_peak(device)
        start = time.perf_counter()
        losses = []
        for step, (idx, targets) in enumerate(loader):
            if args.steps_per_epoch and step >= args.steps_per_epoch:
                break
            idx, targets = idx.to(device), targets.to(device)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                loss = model(idx, targets)
            if scaler:
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
            else:
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            (scaler.step(optimizer), scaler.update()) if scaler else optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.detach())
        sync(device)
        epochs.append(
            {
                "wall_s": time.perf_counter() - start,
                "peak_bytes": peak(device),
                "loss": torch.stack(losses).float().mean().item(),
            }
        )
    return epochs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine", choices=["lightning", "plain"], default="lightning")
    parser.add_argument("--model", choices=SIZES, default="gpt2")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument(
        "--precision",
        default="bf16-mixed",
        help="Lightning precision: 32-true, 16-mixed, bf16-mixed (default: bf16-mixed)",
    )
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument(
        "--steps-per-epoch", type=int, help="cap on steps per epoch (default: the full epoch)"
    )
    parser.add_argument("--num-workers", type=int, default=4, help="DataLoader workers (lightning-GPT: 4)")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--data", type=Path, help="text file (default: accelbench's generated corpus)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--log-dir", help="Lightning's CSV logs here (default: no logger)")
    parser.add_argument("--out", type=Path, help="write the result as JSON here")
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # as lightning-GPT's train.py does on CUDA
    torch.manual_seed(0)
    np.random.seed(0)
    data = CharWindows(load_text(args.data), args.block_size)
    loader = DataLoader(data, batch_size=args.batch_size, num_workers=args.num_workers)
    n_layer, n_head, n_embd = SIZES[args.model]
    model = MinGPT(data.vocab_size, args.block_size, n_layer, n_head, n_embd, 0.1)
    runner = run_lightning if args.engine == "lightning" else run_plain
    epochs = runner(args, model, loader, device)

    steps = min(len(loader), args.steps_per_epoch or len(loader))
    samples = min(len(data), steps * args.batch_size)
    for e in epochs:
        e["samples"] = samples
        e["samples_per_s"] = samples / e["wall_s"]
        e["tokens_per_s"] = samples * args.block_size / e["wall_s"]
    steady = statistics.median(e["wall_s"] for e in epochs[1:]) if len(epochs) > 1 else None
    result = {
        "harness": f"seed study re-implementation (minGPT + {'Lightning Trainer' if args.engine == 'lightning' else 'plain loop'})",
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": data.vocab_size,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
        "torch": torch.__version__,
        "epochs": epochs,
        "steady_epoch_s": steady,
        "steady_samples_per_s": samples / steady if steady else None,
    }
    print(json.dumps({k: result[k] for k in ("harness", "device", "steady_epoch_s", "steady_samples_per_s")}))
    for i, e in enumerate(epochs, 1):
        print(
            f"epoch {i}: {e['wall_s']:.3f} s, {e['samples_per_s']:.1f} samples/s, loss {e['loss']:.4f}, "
            f"peak {e['peak_bytes']}"
        )
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
