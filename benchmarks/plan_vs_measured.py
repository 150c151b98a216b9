"""`accelbench plan` against real runs: a plan of at least 12 configurations on 2 processes, every one measured.

    python benchmarks/plan_vs_measured.py [--model gpt-nano] [--batch-sizes 4,8,16]
        [--strategies ddp,fsdp,deepspeed-zero1,deepspeed-zero2,deepspeed-zero3] [--precisions fp32]
        [--bus-bandwidth GB/s | --comm DIR] [--steps 4] [--epochs 3] [--repeats R] [--out DIR] [--json FILE]

It runs `accelbench plan --devices 2 --measure-peak ... --measure K` with K the number of ranked configurations (all
of them), so every candidate runs for real as a short 2-process gloo job through `accelbench sweep` (resumable: run
it again with the same --out and finished points are reused), then prints the plan's comparison: predicted against
measured samples/s and rank per configuration, Spearman's rank correlation over all of them, and how far the
predicted top pick is below the best measured. The predictions use this host's measured dense-matmul peak
(cached), the default efficiency and the bus bandwidth given (or comm records), never the runs themselves.

The default grid is 5 strategies x 3 batch sizes = 15 configurations of gpt-nano (with DeepSpeed installed; 6
without), each about 15-20 s on a 2-core machine: some 5 minutes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

MIN_CONFIGURATIONS = 12


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="gpt-nano")
    parser.add_argument("--batch-sizes", default="4,8,16")
    parser.add_argument("--strategies", default="ddp,fsdp,deepspeed-zero1,deepspeed-zero2,deepspeed-zero3")
    parser.add_argument("--precisions", default="fp32")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--bus-bandwidth", type=float, help="GB/s (default: 1, about gloo's on this VM)")
    group.add_argument("--comm", type=Path, help="accelbench comm records of 2 gloo processes here")
    parser.add_argument("--steps", type=int, default=4, help="steps per epoch of each measured run")
    parser.add_argument(
        "--epochs", type=int, default=3, help="epochs of each measured run (the first a warm-up)"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs per configuration, in passes over all of them (plan --measure-repeats): each is compared by "
        "its median",
    )
    parser.add_argument("--out", type=Path, default=Path("results/plan-vs-measured"))
    parser.add_argument("--json", type=Path, help="write the plan (with its comparison) here")
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help="price with this host's calibration over each configuration's traced operators (plan --calibrate)",
    )
    args = parser.parse_args()

    common = ["plan", "--model", args.model, "--devices", "2", "--measure-peak", "--strategies", args.strategies,
              "--precisions", args.precisions, "--batch-sizes", args.batch_sizes]  # fmt: skip
    common += ["--comm", str(args.comm)] if args.comm else ["--bus-bandwidth", str(args.bus_bandwidth or 1.0)]
    common += ["--calibrate"] if args.calibrate else []
    listed = _accelbench(*common, "--json")
    plan = json.loads(listed.stdout)
    ranked = len(plan["ranked"])
    if ranked < MIN_CONFIGURATIONS:
        print(f"only {ranked} configurations ranked (want {MIN_CONFIGURATIONS}): add --batch-sizes or --strategies "
              "(DeepSpeed's ZeRO needs deepspeed installed)", file=sys.stderr)  # fmt: skip
    measuring = ["--top", str(ranked), "--measure", str(ranked), "--measure-steps", str(args.steps),
                 "--measure-epochs", str(args.epochs), "--measure-repeats", str(args.repeats), "--out", str(args.out)]  # fmt: skip
    measured = _accelbench(*common, *measuring)
    print(measured.stdout)
    if args.json:
        done = _accelbench(*common, *measuring, "--json")
        args.json.write_text(done.stdout, encoding="utf-8")  # every point is recorded: nothing runs again
    return 0


def _accelbench(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "accelbench.cli", *args], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"accelbench {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
    return done


if __name__ == "__main__":
    sys.exit(main())
