"""`accelbench estimate` against seed 000's published peak memory (its Table 5: the largest fp16 model DDP trains on
one A100-80, batch 1), as a user from those centres would check it.

    python benchmarks/seed000_vs_estimate.py [--block-size 128] [--json FILE]

Each model is predicted twice: for accelbench's own stack (fused AdamW, DDP's gradient buckets as views, fused
attention) and for the seed's (lightning-GPT over minGPT, as `benchmarks/seed_harness.py` re-implements it: torch's
default AdamW, foreach kernels on CUDA; DDP without gradient_as_bucket_view, torch's default; minGPT's explicit
softmax attention, which keeps its scores). The seed's context length is not published; minGPT's char-level
Shakespeare set-up, which the study used (vocabulary 65), defaults to 128, and --block-size changes it. The seed's
"MB" are read as MiB (torch.cuda.max_memory_allocated / 2^20, what its Lightning callback reports).
Nothing is run: the prediction is arithmetic on the model's shapes (built on the meta device).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

# Seed 000, Table 5: peak memory (MB) of gpt2 ... gpt2-xxl, fp16, DDP, batch 1, one B-A100-80; gpt2-xxxl ran out
SEED_PEAK_MB = {
    "gpt2": 2298.80,
    "gpt2-medium": 8093.53,
    "gpt2-large": 19424.99,
    "gpt2-xl": 32586.84,
    "gpt2-xxl": 57239.73,
    "gpt2-xxxl": None,  # out of memory
}
SEED_STACK = ["--ddp-bucket-view", "off", "--optimizer-kernels", "foreach", "--attention", "keeps-scores"]
A100_80_BYTES = 80 * 2**30


def predict(model: str, block_size: int, stack: list[str]) -> dict[str, object]:
    argv = [sys.executable, "-m", "accelbench", "estimate", "--model", model, "--batch-size", "1",
            "--precision", "fp16-mixed", "--strategy", "ddp", "--devices", "1", "--device", "A100",
            "--block-size", str(block_size), "--json", *stack]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    result: dict[str, object] = json.loads(done.stdout)
    return result


def relative_error(predicted_mib: float, seed_mib: float | None) -> str:
    return f"{predicted_mib / seed_mib - 1:+.0%}" if seed_mib else "-"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    print(f"seed 000 Table 5 (fp16, DDP, batch 1, A100-80), context {args.block_size}")
    print(f"{'model':12} {'params':>8} {'seed MiB':>9} {'accelbench stack':>17} {'err':>6} {'seed stack':>11} "
          f"{'err':>6} {'phase':>9} {'fits 80 GiB (seed)':>19}")  # fmt: skip
    for model, seed in SEED_PEAK_MB.items():
        ours, theirs = (predict(model, args.block_size, stack) for stack in ([], SEED_STACK))
        ours_mib = float(ours["peak_memory_bytes"]) / 2**20  # type: ignore[arg-type]
        theirs_mib = float(theirs["peak_memory_bytes"]) / 2**20  # type: ignore[arg-type]
        fits = theirs_mib * 2**20 <= A100_80_BYTES
        verdict = f"{'yes' if fits else 'no'} ({'yes' if seed else 'no'})"
        seed_text = f"{seed:9.0f}" if seed else "      OOM"
        print(
            f"{model:12} {int(theirs['stored_parameters']) / 1e9:7.2f}B {seed_text} {ours_mib:17.0f} "  # type: ignore[call-overload]
            f"{relative_error(ours_mib, seed):>6} {theirs_mib:11.0f} {relative_error(theirs_mib, seed):>6} {theirs['peak_phase']!s:>9} {verdict:>19}"
        )
        rows.append({"model": model, "seed_mib": seed, "accelbench_stack_mib": ours_mib,
                     "seed_stack_mib": theirs_mib, "seed_stack_phase": theirs["peak_phase"], "fits": fits})  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"block_size": args.block_size, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
