"""accelbench's training loop against the seed study's, side by side: samples/s of each, interleaved, and the ratio.

Runs ``benchmarks/seed_harness.py`` (minGPT through the Lightning Trainer, the seed study's loop re-created) and
``accelbench run`` (its own loop) on the same model size, batch, context, precision and thread count, alternately
(seed, accelbench, seed, accelbench, ...; the order flips every round so that neither always runs first), each a
fresh process, ``--repeats`` times. Each run's figure is its steady samples/s (median steady epoch; the first epoch
is the warm-up in both). Prints one row per round and the medians, and the ratio median(accelbench) /
median(seed harness). On a shared machine, read ``load`` (1-minute load average at each run's start) beside the
figures: both loops are measured under the same conditions only on average, hence the interleaving and medians.

    python benchmarks/seed_vs_accelbench.py                      # gpt-micro, batch 64, block 128, fp32, 2 threads
    python benchmarks/seed_vs_accelbench.py --repeats 5 --steps-per-epoch 30 --epochs 3 --out /tmp/seed_vs.json
    python benchmarks/seed_vs_accelbench.py --seed-engine plain  # minGPT in a hand-written loop instead of Lightning

Both sides use dropout 0.1 (the seed harness's fixed value). Extra ``accelbench run`` options go after ``--``.
``--before DIR`` adds a third side to every round: ``accelbench run`` from another checkout of the repository (e.g.
``git worktree add /tmp/before COMMIT``), imported from DIR ahead of the installed package, to measure a change's
effect under the same conditions.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
LIGHTNING_PRECISION = {"fp32": "32-true", "bf16-mixed": "bf16-mixed", "fp16-mixed": "16-mixed"}


def run_seed(args: argparse.Namespace, work: Path, index: int) -> float:
    out = work / f"seed-{index}.json"
    command = [
        sys.executable,
        str(HERE / "seed_harness.py"),
        "--engine",
        args.seed_engine,
        "--model",
        args.model,
        "--batch-size",
        str(args.batch_size),
        "--block-size",
        str(args.block_size),
        "--precision",
        LIGHTNING_PRECISION[args.precision],
        "--epochs",
        str(args.epochs),
        "--steps-per-epoch",
        str(args.steps_per_epoch),
        "--threads",
        str(args.threads),
        "--num-workers",
        str(args.num_workers),
        "--out",
        str(out),
    ]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return float(json.loads(out.read_text())["steady_samples_per_s"])


def run_accelbench(
    args: argparse.Namespace, extra: list[str], work: Path, index: int, checkout: Path | None = None
) -> float:
    out = work / f"accelbench-{index}{'-before' if checkout else ''}"
    env = dict(os.environ, PYTHONPATH=str(checkout)) if checkout else None
    command = [
        sys.executable,
        "-c",
        "import sys; from accelbench.cli import main; sys.exit(main())",
        "run",
        "--model",
        args.model,
        "--batch-size",
        str(args.batch_size),
        "--block-size",
        str(args.block_size),
        "--precision",
        args.precision,
        "--dropout",
        "0.1",
        "--epochs",
        str(args.epochs),
        "--steps-per-epoch",
        str(args.steps_per_epoch),
        "--threads",
        str(args.threads),
        "--quiet",
        "--output-dir",
        str(out),
        *extra,
    ]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    (record,) = out.glob("*.json")
    return float(json.loads(record.read_text())["metrics"]["steady"]["samples_per_s"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3, help="rounds, each one run of both (default: 3)")
    parser.add_argument("--model", default="gpt-micro")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--precision", choices=LIGHTNING_PRECISION, default="fp32")
    parser.add_argument(
        "--epochs", type=int, default=3, help="per run, the first being the warm-up (default: 3)"
    )
    parser.add_argument("--steps-per-epoch", type=int, default=20)
    parser.add_argument(
        "--threads", type=int, default=2, help="torch intra-op threads, both sides (default: 2)"
    )
    parser.add_argument("--seed-engine", choices=["lightning", "plain"], default="lightning")
    parser.add_argument(
        "--num-workers", type=int, default=4, help="the seed harness's DataLoader workers (4)"
    )
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    parser.add_argument(
        "--before", type=Path, metavar="DIR", help="also run accelbench from this checkout each round"
    )
    args, extra = parser.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]

    rows = []
    with tempfile.TemporaryDirectory(prefix="seed-vs-accelbench-") as tmp:
        work = Path(tmp)
        for i in range(args.repeats):
            sides = ["seed", "accelbench"] + (["before"] if args.before else [])
            order = sides if i % 2 == 0 else sides[::-1]
            row: dict[str, float] = {}
            for side in order:
                row[f"{side}_load"] = os.getloadavg()[0]
                if side == "seed":
                    row[side] = run_seed(args, work, i)
                else:
                    row[side] = run_accelbench(
                        args, extra, work, i, args.before if side == "before" else None
                    )
            row["ratio"] = row["accelbench"] / row["seed"]
            if args.before:
                row["ratio_before"] = row["before"] / row["seed"]
            rows.append(row)
            print(
                f"round {i + 1}/{args.repeats} ({order[0]} first): seed {row['seed']:.1f} samples/s "
                f"(load {row['seed_load']:.1f}), accelbench {row['accelbench']:.1f} samples/s "
                f"(load {row['accelbench_load']:.1f}), ratio {row['ratio']:.2f}"
                + (
                    f"; before {row['before']:.1f} samples/s, ratio {row['ratio_before']:.2f}"
                    if args.before
                    else ""
                ),
                flush=True,
            )
    seed = statistics.median(r["seed"] for r in rows)
    ours = statistics.median(r["accelbench"] for r in rows)
    print()
    print("| round | seed harness samples/s | accelbench samples/s | ratio | load (seed, accelbench) |")
    print("|---|---:|---:|---:|---|")
    for i, r in enumerate(rows, 1):
        print(
            f"| {i} | {r['seed']:.1f} | {r['accelbench']:.1f} | {r['ratio']:.2f} | "
            f"{r['seed_load']:.1f}, {r['accelbench_load']:.1f} |"
        )
    print(f"| median | {seed:.1f} | {ours:.1f} | **{ours / seed:.2f}** | |")
    before = statistics.median(r["before"] for r in rows) if args.before else None
    if before is not None:
        print(
            f"\nbefore ({args.before}): median {before:.1f} samples/s, ratio to the seed harness {before / seed:.2f}"
        )
    if args.out:
        config = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "out"}
        summary = {"config": config, "accelbench_args": extra, "rounds": rows}
        summary |= {"median_seed": seed, "median_accelbench": ours, "ratio": ours / seed}
        if before is not None:
            summary |= {"median_before": before, "ratio_before": before / seed, "before": str(args.before)}
        args.out.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
