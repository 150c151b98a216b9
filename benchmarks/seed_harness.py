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

``--profile`` adds one epoch after the timed ones (never itself timed) in which ``--profile-steps`` steps, after two
the profiler starts up with, run under torch.profiler, and splits them with accelbench's own analysis
(:mod:`accelbench.engine.profile`: data, optimizer, communication, kernel, intra-op, inter-op dispatch, and the top
operators), the DataLoader's ``enumerate(DataLoader)#...`` region counting as data, so that this loop and
``accelbench run --profile`` are broken down the same way (docs/profile.md). Under Lightning the optimizer's step
runs the forward/backward closure and the gradient clipping inside torch's ``Optimizer.step`` region; the harness
marks both (``seed::closure``, ``seed::clip_gradients``) and the analysis counts them as the computation they are,
not as optimizer time.

    python benchmarks/seed_harness.py --model gpt2 --batch-size 64 --precision bf16-mixed --steps-per-epoch 100
    python benchmarks/seed_harness.py --engine plain ...    # the same model and data in a hand-written loop
    python benchmarks/seed_harness.py --model gpt-micro --precision 32-true --threads 2 --profile ...
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
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
    from accelbench.workloads.gpt.data import generate_corpus  # the same text accelbench trains on

    return generate_corpus().tobytes().decode("ascii")


# ------------------------------------------------------------------------------------------------------ profiling
DATA_REGIONS = ("enumerate(DataLoader)",)  # torch's DataLoader iterator marks each fetch with this region
LIFTED = "seed::"  # regions marked inside Lightning's Optimizer.step that are not the optimizer's own work


@dataclass
class _Span:
    start: float
    end: float


@dataclass
class _Event:
    """A profiler event as accelbench.engine.profile reads one, for a re-arranged tree."""

    name: str
    thread: int
    time_range: Any
    cpu_children: list[Any] = field(default_factory=list)
    is_user_annotation: bool = False
    overload_name: str = ""
    device_type: Any = None


def _lift(event: Any) -> Any:
    """A copy of ``event``'s tree in which an ``Optimizer.step`` region that contains ``seed::`` regions (Lightning
    runs the forward/backward closure and the clipping inside it) keeps as optimizer only the time outside them."""
    kids = [_lift(c) for c in event.cpu_children]
    lifted = [k for k in kids if k.name.startswith(LIFTED)]
    if not (event.name.startswith("Optimizer.step") and lifted):
        return _Event(
            event.name,
            event.thread,
            event.time_range,
            kids,
            bool(getattr(event, "is_user_annotation", False)),
            getattr(event, "overload_name", ""),
            getattr(event, "device_type", None),
        )
    start, end = event.time_range.start, event.time_range.end
    out: list[Any] = []
    cursor = start
    for region in sorted(lifted, key=lambda k: k.time_range.start):
        out.append(_optimizer_part(event, kids, cursor, region.time_range.start))
        out.append(region)
        cursor = region.time_range.end
    out.append(_optimizer_part(event, kids, cursor, end))
    return _Event("seed::optimizer_step", event.thread, event.time_range, out, is_user_annotation=True)


def _optimizer_part(event: Any, kids: list[Any], start: float, end: float) -> _Event:
    inside = [k for k in kids if not k.name.startswith(LIFTED) and start <= k.time_range.start < end]
    return _Event(event.name, event.thread, _Span(start, end), inside, is_user_annotation=True)


class StepProfiler:
    """torch.profiler over one epoch's first steps: ``start()`` at the epoch's start, ``step()`` after each step;
    ``result()`` is accelbench's analysis of them (the record's ``profile``)."""

    def __init__(self, steps: int, device: torch.device) -> None:
        from torch.profiler import ProfilerActivity, profile, schedule

        from accelbench.engine.profile import PROFILE_WARMUP_STEPS

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        plan = schedule(wait=0, warmup=PROFILE_WARMUP_STEPS, active=steps, repeat=1)
        self.prof = profile(activities=activities, schedule=plan, on_trace_ready=self._ready)
        self.total, self.done, self.device, self.steps = PROFILE_WARMUP_STEPS + steps, 0, device, steps
        self.events: list[Any] = []
        self.active = False

    def _ready(self, prof: Any) -> None:
        self.events = list(prof.events())

    def start(self) -> None:
        self.prof.start()
        self.active = True

    def step(self) -> None:
        if not self.active:
            return
        sync(self.device)
        self.prof.step()
        self.done += 1
        if self.done == self.total:
            self.prof.stop()
            self.active = False

    def result(self, timed_step_s: float | None, engine: str) -> Any:
        from accelbench.engine.profile import analyse_events, step_profile

        events = [_lift(e) if e.name.startswith("ProfilerStep") else e for e in self.events]
        return step_profile(
            analyse_events(events, self.device.type, DATA_REGIONS),
            window=f"{self.steps} steps of an extra epoch after the timed ones ({engine})",
            timed_step_s=timed_step_s,
            trace=None,
            source="torch.profiler, host thread"
            + (" and device kernels" if self.device.type == "cuda" else ""),
        )


def format_profile(profile: Any, title: str) -> str:
    """A profile (accelbench's ``StepProfile``, or its JSON) as a markdown table: ms and share per category, then
    the top operators."""
    p = profile if isinstance(profile, dict) else profile.model_dump(mode="json")
    step_ms = p["step_s"] * 1e3
    timed = f", timed step {p['timed_step_s'] * 1e3:.1f} ms" if p.get("timed_step_s") else ""
    lines = [
        f"{title}: profiled step {step_ms:.1f} ms over {p['steps']} steps{timed}",
        "",
        "| category | ms/step | share |",
        "|---|---:|---:|",
    ]
    for name, s in p["seconds"].items():
        lines.append(f"| {name} | {s * 1e3:.1f} | {100 * s / p['step_s']:.1f}% |")
    lines += ["", "| top operator | category | ms/step | share |", "|---|---|---:|---:|"]
    for o in p["top_operators"]:
        lines.append(
            f"| {o['name']} | {o['category']} | {o['seconds'] * 1e3:.1f} | {100 * o['share']:.1f}% |"
        )
    return "\n".join(lines)


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
    args: argparse.Namespace,
    model: MinGPT,
    loader: DataLoader,
    device: torch.device,
    profiler: StepProfiler | None = None,
) -> list[dict]:
    import importlib.util

    # Lightning's metrics import torchvision: load it as accelbench does, so a build for another torch works too
    if importlib.util.find_spec("torchvision") is not None:
        from accelbench.workloads.vision.library import load_torchvision

        load_torchvision()
    import lightning as L
    from torch.profiler import record_function

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

    class ProfiledModule(Module):
        """Lightning's defaults, with the closure and the clipping marked (they run inside Optimizer.step)."""

        def optimizer_step(
            self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None
        ) -> None:
            def closure() -> Any:
                with record_function(LIFTED + "closure"):
                    return optimizer_closure()

            optimizer.step(closure=closure)

        def configure_gradient_clipping(
            self, optimizer: Any, gradient_clip_val: Any = None, gradient_clip_algorithm: Any = None
        ) -> None:
            with record_function(LIFTED + "clip_gradients"):
                self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    class EpochTimer(L.Callback):
        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            if profiler is not None and trainer.current_epoch == args.epochs:
                profiler.start()  # the extra, untimed epoch
                return
            sync(device)
            reset_peak(device)
            self.start = time.perf_counter()

        def on_train_batch_end(self, trainer: Any, *_: Any) -> None:
            if profiler is not None:
                profiler.step()

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            if trainer.current_epoch == args.epochs:
                return
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
        max_epochs=args.epochs + (profiler is not None),
        limit_train_batches=args.steps_per_epoch or 1.0,
        gradient_clip_val=1.0,
        callbacks=[EpochTimer()],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=L.pytorch.loggers.CSVLogger(args.log_dir) if args.log_dir else False,
        default_root_dir=args.log_dir,
    )
    trainer.fit(ProfiledModule() if profiler is not None else Module(), loader)
    return epochs


AUTOCAST = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def run_plain(
    args: argparse.Namespace,
    model: MinGPT,
    loader: DataLoader,
    device: torch.device,
    profiler: StepProfiler | None = None,
) -> list[dict]:
    """The same model, data and recipe in a hand-written loop: what Lightning itself costs."""
    if args.precision not in ("32-true", *AUTOCAST):
        raise SystemExit(f"--engine plain supports 32-true, 16-mixed, bf16-mixed, not {args.precision}")
    model = model.to(device).train()
    optimizer = model.optimizer(args.lr)
    scaler = torch.amp.GradScaler(device.type) if args.precision == "16-mixed" else None
    dtype = AUTOCAST.get(args.precision)
    epochs = []
    for epoch in range(args.epochs + (profiler is not None)):
        if epoch == args.epochs and profiler is not None:
            profiler.start()  # the extra, untimed epoch
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
            if profiler is not None:
                profiler.step()
        if epoch == args.epochs:
            break
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
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after the timed epochs, profile an extra epoch's steps and split them as `accelbench run --profile` does",
    )
    parser.add_argument(
        "--profile-steps", type=int, default=8, help="steps analysed with --profile (default: 8)"
    )
    args = parser.parse_args(argv)
    if args.profile and args.steps_per_epoch and args.steps_per_epoch < args.profile_steps + 2:
        parser.error(
            "--profile needs --steps-per-epoch of at least --profile-steps + 2 (the profiler's warm-up)"
        )
    if args.threads:
        torch.set_num_threads(args.threads)

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
    profiler = StepProfiler(args.profile_steps, device) if args.profile else None
    epochs = runner(args, model, loader, device, profiler)

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
        "threads": torch.get_num_threads(),
    }
    if profiler is not None:
        profile = profiler.result(steady / steps if steady else None, args.engine)
        result["profile"] = profile.model_dump(mode="json")
    print(json.dumps({k: result[k] for k in ("harness", "device", "steady_epoch_s", "steady_samples_per_s")}))
    for i, e in enumerate(epochs, 1):
        print(
            f"epoch {i}: {e['wall_s']:.3f} s, {e['samples_per_s']:.1f} samples/s, loss {e['loss']:.4f}, "
            f"peak {e['peak_bytes']}"
        )
    if profiler is not None:
        print(format_profile(result["profile"], f"seed harness ({args.engine})"))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
