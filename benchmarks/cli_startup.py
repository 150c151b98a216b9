"""How long `accelbench` commands take to start, and whether they import torch.

    python benchmarks/cli_startup.py [--repeats 7]

Each command runs in a fresh interpreter (as a user types it) `--repeats` times; the median wall time is reported,
with whether torch was imported (from ``python -X importtime``). Commands that need no device should not import
torch: `--help`, `plugins`, `schema`, `sweep --dry-run`, `compare` and `report` (the last two over the records made
here). `run --help` and `info` load what the backends need.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TINY = ["--model", "custom", "--layers", "1", "--heads", "2", "--embd", "16", "--block-size", "16",
        "--batch-size", "8", "--dropout", "0", "--epochs", "2", "--steps-per-epoch", "2"]  # fmt: skip


def accelbench(*args: str) -> list[str]:
    return [sys.executable, "-m", "accelbench.cli", *args]


def timed(command: list[str], repeats: int) -> tuple[float, bool]:
    """Median seconds of ``command`` over ``repeats`` runs, and whether it imported torch."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(command, capture_output=True, check=False)
        times.append(time.perf_counter() - start)
    trace = subprocess.run([sys.executable, "-X", "importtime", *command[1:]], capture_output=True, text=True)
    imported = any(line.rstrip().endswith("| torch") for line in trace.stderr.splitlines())
    return statistics.median(times), imported


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "results"
        for precision in ("fp32", "bf16-mixed"):
            subprocess.run(
                accelbench("run", *TINY, "--precision", precision, "--output-dir", str(results), "-q"),
                check=True,
            )
        sweep = Path(tmp) / "sweep.toml"
        sweep.write_text('[run]\nmodel = "gpt-nano"\n[[grid]]\nbatch_size = [8, 16]\n')
        commands = {
            "accelbench --help": accelbench("--help"),
            "accelbench plugins": accelbench("plugins"),
            "accelbench schema": accelbench("schema"),
            "accelbench sweep FILE --dry-run": accelbench(
                "sweep", str(sweep), "--dry-run", "--output-dir", tmp
            ),
            "accelbench compare DIR": accelbench("compare", str(results)),
            "accelbench report DIR": accelbench("report", str(results), "-o", str(Path(tmp) / "r.html")),
            "accelbench run --help": accelbench("run", "--help"),
            "accelbench info": accelbench("info"),
        }
        print(f"{'command':<34} {'median s':>9}  imports torch")
        for label, command in commands.items():
            seconds, torch = timed(command, args.repeats)
            print(f"{label:<34} {seconds:>9.3f}  {'yes' if torch else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
