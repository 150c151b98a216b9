"""`accelbench compare` at scale: wall time and peak memory over 10,000 and 100,000 result records.

    python benchmarks/compare_scale.py [--record RECORD.json] [--counts 10000 100000] [--dir DIR] [--format table]
                                       [--fleet]

An HPC centre gathers many records in one place; compare must stay quick and small there. This makes N copies of
one real record (made with a tiny CPU run when ``--record`` is not given), spread over 20 hosts, 5 models and
5 batch sizes, each with its own run id, then times ``accelbench compare`` over them in a fresh process, twice
(the spread between the two is the machine's noise). Wall time is the child's; peak RSS is
``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss`` taken in a separate measuring process per run, so one
measurement's peak never hides in another's. The files were just written, so they are in the page cache: this
measures compare, not the disk. ``--fleet`` times ``compare --fleet`` instead (the 20 hosts are each benchmark's
nodes; every 20th copy of a benchmark is made 30% slower, so the fleet has outliers to flag).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

HOSTS = 20
MODELS = ("custom 1L/2H/16E", "gpt-nano", "gpt-micro", "gpt-mini", "gpt2")
BATCH_SIZES = (8, 16, 32, 64, 128)
TINY_RUN = "run --model custom --layers 1 --heads 2 --embd 16 --block-size 16 --batch-size 8 --dropout 0"
TINY_RUN_TAIL = "--epochs 2 --steps-per-epoch 2 -q"


def make_record(directory: Path) -> Path:
    """One real record from a tiny CPU run (a few seconds), or the one an earlier call made in ``directory``."""
    out = directory / "seed-record"
    made = sorted(out.glob("*.json"))
    if not made:
        cmd = [
            sys.executable,
            "-m",
            "accelbench.cli",
            *shlex.split(f"{TINY_RUN} {TINY_RUN_TAIL}"),
            "--output-dir",
            str(out),
        ]
        subprocess.run(cmd, check=True)
        made = sorted(out.glob("*.json"))
    return made[0]


def write_copies(record: dict, count: int, folder: Path) -> None:
    """``count`` copies of ``record``: host i % 20, model and batch size cycling, a new run id each."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        host = f"node{i % HOSTS:02d}"
        model = MODELS[(i // HOSTS) % len(MODELS)]
        batch = BATCH_SIZES[(i // (HOSTS * len(MODELS))) % len(BATCH_SIZES)]
        run_id = uuid.UUID(int=i + 1).hex
        copy = dict(record, run_id=run_id)
        if i % HOSTS == 7:  # one slow node per benchmark: compare --fleet has an outlier to flag
            metrics = dict(record["metrics"])
            metrics["epochs"] = [dict(e, wall_s=e["wall_s"] * 1.3) for e in metrics["epochs"]]
            copy["metrics"] = metrics
        copy["system"] = dict(record["system"], host=host)
        copy["config"] = dict(record["config"], model=model.split()[0], batch_size=batch)
        copy["workload_identity"] = dict(record["workload_identity"], model=model)
        host_dir = folder / host
        host_dir.mkdir(exist_ok=True)
        (host_dir / f"{run_id}.json").write_text(json.dumps(copy, indent=2), encoding="utf-8")


def measure(folder: Path, fmt: str, extra: tuple[str, ...] = ()) -> dict[str, float]:
    """Run compare over ``folder`` in a fresh measuring process; its child's wall time and peak RSS."""
    probe = (
        "import resource, subprocess, sys, time\n"
        "start = time.perf_counter()\n"
        "proc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)\n"
        "wall = time.perf_counter() - start\n"
        "assert proc.returncode == 0, proc.stderr\n"
        "print(wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    compare = [sys.executable, "-m", "accelbench.cli", "compare", str(folder), "--format", fmt, *extra]
    out = subprocess.run([sys.executable, "-c", probe, *compare], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"compare failed:\n{out.stderr}")
    wall, rss_kib = out.stdout.split()
    return {"wall_s": float(wall), "peak_rss_mib": int(rss_kib) / 1024}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--record", type=Path, help="the record to copy (default: make one with a tiny CPU run)"
    )
    parser.add_argument("--counts", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--dir", type=Path, help="where the copies go (default: a temporary folder, removed)")
    parser.add_argument("--format", default="table", choices=("table", "markdown", "csv", "json"))
    parser.add_argument("--fleet", action="store_true", help="time compare --fleet")
    args = parser.parse_args()

    work = args.dir or Path(tempfile.mkdtemp(prefix="accelbench-compare-scale-"))
    try:
        record_path = args.record or make_record(work)
        record = json.loads(record_path.read_text(encoding="utf-8"))
        print(f"machine: {os.cpu_count()} CPU(s), Python {sys.version.split()[0]}; record {record_path.name}")
        for count in args.counts:
            folder = work / f"n{count}"
            if not folder.exists():
                start = time.perf_counter()
                write_copies(record, count, folder)
                print(f"{count:>7} records written in {time.perf_counter() - start:.1f} s")
            for run in (1, 2):
                m = measure(folder, args.format, ("--fleet",) if args.fleet else ())
                fleet = " --fleet" if args.fleet else ""
                print(
                    f"{count:>7} records, compare{fleet} --format {args.format} (run {run}): {m['wall_s']:.2f} s, "
                    f"peak RSS {m['peak_rss_mib']:.0f} MiB",
                    flush=True,
                )
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
