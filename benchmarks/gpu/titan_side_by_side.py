"""accelbench against torchtitan on one GPU: the same Llama-3-class model, batch, sequence length and precision.

    python benchmarks/gpu/titan_side_by_side.py shape                  # the two models are the same (CPU is enough)
    python benchmarks/gpu/titan_side_by_side.py assets DIR             # torchtitan's tokenizer and text folders
    python benchmarks/gpu/titan_side_by_side.py run OUT.json [--compile] [--batch-size 4] [--steps 80] [--pairs 1]

Issue 23's performance point: a llama3-1b-class model in BF16 trained by accelbench within 10% of the same model
in torchtitan, measured side by side on the same machine. The model is Llama 3.2 1B's shape (16 layers, width
2048, 32 query and 8 key/value heads, SwiGLU width 8192, RoPE base 500,000, vocabulary 128,256) with its output head
untied, as both torchtitan's and accelbench's Llama keep it: 1.50 B parameters. `shape` builds both on the meta
device and checks they have the same parameter count and the same FLOPs per token (torchtitan's
``get_nparams_and_flops`` against accelbench's ``flops_per_token``), so the throughputs compare like with like.

Both train from the same text and tokenizer: accelbench's generated corpus and the byte-level BPE it trains on it,
written where torchtitan reads them (``tokenizer/tokenizer.json`` and a JSON-lines ``text/`` folder loaded as its
``c4_test`` dataset). Both run on one GPU in the same way: parameters in fp32 under ``torch.autocast(bfloat16)``
(torchtitan's single-device mixed precision, accelbench's ``bf16-mixed``), fused AdamW, gradient clipping at 1.0,
PyTorch's scaled-dot-product attention, no activation checkpointing; ``--compile`` compiles both (torchtitan's
model and loss, accelbench's training step). torchtitan runs under ``torch.distributed.run`` (one process), as its
own launch script does, with the 1B shape registered as a flavor ("ab1B") before its trainer starts.

Timing: torchtitan's own ``tps`` (tokens per second per device over each 10-step logging interval, as it logs it),
the median of the intervals after the first two (compilation and warm-up); accelbench's steady tokens/s (the
median epoch after the warm-up epoch). Runs alternate (torchtitan, accelbench, accelbench, torchtitan per pair), so
a drifting clock hits both. Writes both runs' figures, torchtitan's logged MFU, and the ratio accelbench /
torchtitan (>= 0.90 is the target).

torchtitan is not a dependency of accelbench: on the GPU machine it is carried as a wheel with the packages it
needs that the image lacks (benchmarks/gpu/prepare.sh, ``TITAN=1``). torchtitan 0.2.2 is the release for the GPU
image's torch 2.11; torchtitan cannot train on a CPU (its device is CUDA whenever no accelerator is found), so off
the GPU only ``shape`` and ``assets`` run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

# TITAN_SMOKE_CPU=1: a plumbing check of this script off the GPU (a 2-layer model, both sides on the CPU; torchtitan
# given stand-ins for the torch.cuda memory queries its metrics call). Its figures are not measurements.
SMOKE = os.environ.get("TITAN_SMOKE_CPU") == "1"
# Llama 3.2 1B's shape (Meta's config.json for Llama-3.2-1B), head untied; torchtitan's FFN width rule gives 8192
# from its multiplier: 2/3 * 4 * 2048 * 1.5, rounded up to 256
LAYERS, DIM, HEADS, KV_HEADS, FFN, VOCAB, ROPE = 16, 2048, 32, 8, 8192, 128_256, 500_000.0
FFN_MULTIPLIER: float | None = 1.5
if SMOKE:  # 2/3 * 4 * 128 = 341, rounded up to 256: 512
    LAYERS, DIM, HEADS, KV_HEADS, FFN, VOCAB, FFN_MULTIPLIER = 2, 128, 4, 2, 512, 8192, None
BACKEND = "cpu" if SMOKE else "cuda"
FLAVOR = "ab1B"
TARGET = 0.90
LOG_FREQ = 10


def titan_args() -> Any:
    """The shape as torchtitan's model arguments."""
    from torchtitan.models.llama3 import TransformerModelArgs

    return TransformerModelArgs(
        dim=DIM,
        n_layers=LAYERS,
        n_heads=HEADS,
        n_kv_heads=KV_HEADS,
        ffn_dim_multiplier=FFN_MULTIPLIER,
        multiple_of=256,
        rope_theta=ROPE,
        vocab_size=VOCAB,
    )


def _cpu_stand_ins() -> None:
    """For TITAN_SMOKE_CPU only: torchtitan takes CUDA when no accelerator is found, and its memory monitor calls
    torch.cuda's queries; point it at the CPU and give torch.cpu inert versions of those queries."""
    import collections
    import types

    import torch
    import torch._utils

    torch._utils._get_available_device_type = lambda: "cpu"
    cpu: Any = torch.cpu
    cpu.get_device_name = lambda *a: "cpu"
    cpu.get_device_properties = lambda *a: types.SimpleNamespace(total_memory=2**30)
    cpu.reset_peak_memory_stats = lambda *a: None
    cpu.empty_cache = lambda *a: None
    cpu.memory_stats = lambda *a: collections.defaultdict(int)
    cpu.set_device = lambda *a: None
    cpu.current_device = lambda: 0


def shape(seq_len: int) -> dict[str, Any]:
    """Both models built on the meta device: their parameter counts and FLOPs per token, which must agree."""
    import torch
    from torchtitan.models.llama3 import Transformer

    from accelbench.workloads.llama import LlamaShape
    from accelbench.workloads.llama.model import Llama, LlamaConfig

    args = titan_args()
    args.max_seq_len = seq_len
    with torch.device("meta"):
        titan = Transformer(args)
        ours = Llama(LlamaConfig(LAYERS, DIM, HEADS, KV_HEADS, FFN, VOCAB, seq_len, ROPE))
    titan_params, titan_flops = args.get_nparams_and_flops(titan, seq_len)
    ours_params = sum(p.numel() for p in ours.parameters())
    ours_flops = LlamaShape(LAYERS, DIM, HEADS, KV_HEADS, FFN, VOCAB, seq_len, ROPE).flops_per_token(
        VOCAB, seq_len
    )
    ffn = [m.w1.out_features for m in titan.modules() if hasattr(m, "w1") and hasattr(m, "w3")]
    return {
        "seq_len": seq_len,
        "torchtitan": {"parameters": titan_params, "flops_per_token": titan_flops, "ffn_dim": ffn[0]},
        "accelbench": {"parameters": ours_params, "flops_per_token": ours_flops, "ffn_dim": FFN},
        "same": titan_params == ours_params
        and abs(titan_flops - ours_flops) <= 1e-9 * ours_flops
        and ffn[0] == FFN,
    }


def assets(folder: Path) -> Path:
    """accelbench's corpus and tokenizer where torchtitan reads them; returns ``folder``."""
    from accelbench.workloads.gpt.data import generate_corpus
    from accelbench.workloads.llama.data import load_corpus
    from accelbench.workloads.llama.tokenizer import SPECIAL_TOKENS, pieces

    corpus = load_corpus(None, VOCAB)
    tok = folder / "tokenizer"
    tok.mkdir(parents=True, exist_ok=True)
    (tok / "tokenizer.json").write_bytes(corpus.tokenizer_file.read_bytes())
    bos, eos = SPECIAL_TOKENS
    config = {"bos_token": bos, "eos_token": eos, "add_bos_token": True, "add_eos_token": False}
    (tok / "tokenizer_config.json").write_text(json.dumps(config))
    text = generate_corpus().tobytes().decode("ascii")
    # documents of about 16 KiB, cut at line ends, as torchtitan's dataset reads one sample per document
    docs = pieces(text, 16384)
    data = folder / "text"
    data.mkdir(parents=True, exist_ok=True)
    with open(data / "train.jsonl", "w") as fh:
        for doc in docs:
            fh.write(json.dumps({"text": doc}) + "\n")
    return folder


def titan_train(argv: list[str]) -> None:
    """Inside torch.distributed.run: register the 1B flavor, then torchtitan's own entry point."""
    # before torchtitan is imported: its ConfigManager.parse_args takes sys.argv[1:] as a default argument
    sys.argv = [sys.argv[0], *argv]
    if SMOKE:
        _cpu_stand_ins()
    import torchtitan.models.llama3 as llama3
    from torchtitan.train import Trainer, main

    llama3.llama3_args[FLAVOR] = titan_args()
    main(Trainer)


def titan_command(
    folder: Path, dump: Path, batch: int, seq_len: int, steps: int, compile_: bool
) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
           __file__, "titan-train",
           "--model.name", "llama3", "--model.flavor", FLAVOR, "--model.hf_assets_path", str(folder / "tokenizer"),
           "--training.dataset", "c4_test", "--training.dataset_path", str(folder / "text"),
           "--training.local_batch_size", str(batch), "--training.seq_len", str(seq_len),
           "--training.steps", str(steps), "--training.mixed_precision_param", "bfloat16",
           "--lr_scheduler.warmup_steps", "10", "--activation_checkpoint.mode", "none",
           "--metrics.log_freq", str(LOG_FREQ), "--metrics.disable_color_printing",
           "--job.dump_folder", str(dump)]  # fmt: skip
    return cmd + (["--compile.enable"] if compile_ else [])


LINE = re.compile(r"step:\s*(\d+).*?tps:\s*([\d,]+).*?tflops:\s*([\d.,]+).*?mfu:\s*([\d.]+)%")


def titan_figures(log: str) -> dict[str, Any]:
    """torchtitan's logged intervals; the steady figure is the median after the first two (warm-up, compile)."""
    rows = [
        (int(s), float(t.replace(",", "")), float(f.replace(",", "")), float(m))
        for s, t, f, m in LINE.findall(log)
    ]
    steady = [r for r in rows if r[0] > 2 * LOG_FREQ]
    if not steady:
        raise RuntimeError(f"torchtitan logged no steady interval (rows: {rows})")
    return {
        "intervals": [{"step": s, "tps": t, "tflops": f, "mfu_pct": m} for s, t, f, m in rows],
        "tokens_per_s": statistics.median(r[1] for r in steady),
        "mfu_pct": statistics.median(r[3] for r in steady),
    }


def accelbench_command(out: Path, batch: int, seq_len: int, steps: int, compile_: bool) -> list[str]:
    epochs = 4
    per_epoch = max(LOG_FREQ, steps // epochs)
    cmd = [sys.executable, "-m", "accelbench.cli", "run", "--backend", BACKEND, "--workload", "llama",
           "--model", "custom", "--layers", str(LAYERS), "--embd", str(DIM), "--heads", str(HEADS),
           "--kv-heads", str(KV_HEADS), "--ffn-dim", str(FFN), "--vocab-size", str(VOCAB),
           "--rope-theta", str(ROPE), "--seq-len", str(seq_len), "--batch-size", str(batch),
           "--precision", "bf16-mixed", "--epochs", str(epochs), "--steps-per-epoch", str(per_epoch),
           "--no-calibration", "--idle-baseline-s", "0", "--output-dir", str(out), "--quiet"]  # fmt: skip
    return cmd + (["--compile"] if compile_ else [])


def accelbench_figures(out: Path) -> dict[str, Any]:
    records = sorted(out.glob("*.json"))  # <time>_<host>_<backend>_custom_bf16-mixed_<id>.json
    if not records:
        raise RuntimeError(f"accelbench wrote no record under {out}")
    record = records[-1]
    data = json.loads(record.read_text())
    steady = data["metrics"]["steady"]
    return {
        "record": record.name,
        "tokens_per_s": steady["tokens_per_s"],
        "mfu": steady.get("mfu"),
        "epoch_s_median": steady["epoch_s_median"],
    }


def run(out_json: Path, batch: int, seq_len: int, steps: int, pairs: int, compile_: bool) -> dict[str, Any]:
    result: dict[str, Any] = {
        "shape": shape(seq_len),
        "batch_size": batch,
        "seq_len": seq_len,
        "compile": compile_,
    }
    work = Path(tempfile.mkdtemp(prefix="titan-", dir=out_json.parent))
    folder = assets(work / "assets")
    titan, ours, logs = [], [], work / "logs"
    logs.mkdir()
    order = ["titan", "accelbench", "accelbench", "titan"] * pairs
    for i, who in enumerate(order):
        log = logs / f"{i:02d}-{who}.log"
        if who == "titan":
            cmd = titan_command(folder, work / f"titan-{i}", batch, seq_len, steps, compile_)
        else:
            cmd = accelbench_command(work / f"accelbench-{i}", batch, seq_len, steps, compile_)
        with open(log, "w") as fh:
            rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=os.environ.copy()).returncode
        text = log.read_text()
        if rc != 0:
            result.setdefault("failures", []).append({"run": i, "who": who, "rc": rc, "tail": text[-3000:]})
            continue
        try:
            if who == "titan":
                titan.append(titan_figures(text))
            else:
                ours.append(accelbench_figures(work / f"accelbench-{i}"))
        except (
            RuntimeError,
            KeyError,
            ValueError,
        ) as exc:  # a run that left no figure: said, and the pairs go on
            result.setdefault("failures", []).append(
                {"run": i, "who": who, "error": str(exc), "tail": text[-3000:]}
            )
    shutil.rmtree(folder / "text", ignore_errors=True)  # 5 MB of generated text: not worth carrying back
    result["torchtitan"], result["accelbench"] = titan, ours
    if titan and ours:
        t = statistics.median(r["tokens_per_s"] for r in titan)
        a = statistics.median(r["tokens_per_s"] for r in ours)
        result["ratio"] = a / t
        # a plumbing check on a CPU, torchtitan under stand-ins: no verdict on a figure that means nothing
        if SMOKE:
            result["smoke_cpu"] = "TITAN_SMOKE_CPU=1: a plumbing check, not a measurement"
        else:
            result["within_target"] = a / t >= TARGET
    out_json.write_text(json.dumps(result, indent=2))
    return result


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "titan-train":
        titan_train(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_shape = sub.add_parser("shape")
    p_shape.add_argument("--seq-len", type=int, default=2048)
    p_assets = sub.add_parser("assets")
    p_assets.add_argument("folder", type=Path)
    p_run = sub.add_parser("run")
    p_run.add_argument("out", type=Path)
    p_run.add_argument("--batch-size", type=int, default=4)
    p_run.add_argument("--seq-len", type=int, default=2048)
    p_run.add_argument("--steps", type=int, default=80)
    p_run.add_argument("--pairs", type=int, default=1)
    p_run.add_argument("--compile", action="store_true")
    args = parser.parse_args()
    if args.command == "shape":
        report = shape(args.seq_len)
        print(json.dumps(report, indent=2))
        sys.exit(0 if report["same"] else 1)
    if args.command == "assets":
        print(assets(args.folder))
        return
    report = run(args.out, args.batch_size, args.seq_len, args.steps, args.pairs, args.compile)
    print(json.dumps({k: v for k, v in report.items() if k not in ("torchtitan", "accelbench")}, indent=2))
    for who in ("torchtitan", "accelbench"):
        print(who, [round(r["tokens_per_s"]) for r in report[who]])


if __name__ == "__main__":
    main()
