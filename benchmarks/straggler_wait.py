"""What a synchronising collective costs in a step beyond its own time: the wait for the slower rank.

    python benchmarks/straggler_wait.py                 # 2 gloo processes, one thread each
    python benchmarks/straggler_wait.py --chunk-mm 20 --syncs 14 --json straggler.json

A step here is `--syncs` chunks of identical compute (`--chunk-mm` 384x384 matrix products each). It runs three ways
on every rank, interleaved (`--passes` times each): no collective at all; one all_reduce of the gradients' size at
the end of the step (as DDP's buckets, ZeRO-1 and ZeRO-2 synchronise once); and an all_gather after every chunk (as
FSDP's and ZeRO-3's per-unit gathers synchronise many times). It also times each collective alone, after a barrier
(both ranks arrive together, as `accelbench comm` measures them).

A synchronous collective cannot finish before the slower rank reaches it, so each one adds, on average, how much
later the slower rank arrives: for two ranks whose segments before it take independent times of standard deviation
sigma, E[max(X, Y)] - E[X] = sigma / sqrt(pi). The script prints, per way, the collective time a step measured,
the isolated collectives' time, and that straggler estimate from the measured spread of the chunks, so the three can
be set side by side. accelbench's step model (`estimate --calibrate`) counts the isolated time only; docs/estimate.md
says what this measured on the project's CPU VM.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

WAYS = ("none", "one all_reduce", "all_gather after each chunk")


def _worker(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    a, b = torch.randn(384, 384), torch.randn(384, 384)
    shard = torch.randn(args.gather_bytes // 4 // world)
    gathered = torch.empty(shard.numel() * world)
    gradients = torch.randn(args.reduce_bytes // 4)

    def chunk() -> None:
        for _ in range(args.chunk_mm):
            torch.mm(a, b)

    def step(way: str) -> tuple[list[float], float]:
        chunks, comm = [], 0.0
        for _ in range(args.syncs):
            start = time.perf_counter()
            chunk()
            chunks.append(time.perf_counter() - start)
            if way == WAYS[2]:
                start = time.perf_counter()
                dist.all_gather_into_tensor(gathered, shard)
                comm += time.perf_counter() - start
        if way == WAYS[1]:
            start = time.perf_counter()
            dist.all_reduce(gradients)
            comm += time.perf_counter() - start
        return chunks, comm

    def alone(op: str, repeats: int) -> float:
        times = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            if op == "all_gather":
                dist.all_gather_into_tensor(gathered, shard)
            else:
                dist.all_reduce(gradients)
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    measured: dict[str, dict[str, list[float]]] = {way: {"step": [], "chunk": [], "comm": []} for way in WAYS}
    for _ in range(args.passes):
        for way in WAYS:
            step(way)  # warm-up
            dist.barrier()
            for _ in range(args.steps):
                start = time.perf_counter()
                chunks, comm = step(way)
                measured[way]["step"].append(time.perf_counter() - start)
                measured[way]["chunk"] += chunks
                measured[way]["comm"].append(comm)
            dist.barrier()
    gather_alone, reduce_alone = alone("all_gather", 30), alone("all_reduce", 10)
    rows = []
    for way in WAYS:
        m = measured[way]
        sigma = statistics.stdev(m["chunk"])
        syncs = {WAYS[0]: 0, WAYS[1]: 1, WAYS[2]: args.syncs}[way]
        isolated = {WAYS[0]: 0.0, WAYS[1]: reduce_alone, WAYS[2]: args.syncs * gather_alone}[way]
        # one sync after all the chunks waits for the spread of their sum; one after each, for the spread of one
        spread = sigma * math.sqrt(args.syncs) if syncs == 1 else sigma
        rows.append(
            {
                "way": way,
                "step_s": statistics.median(m["step"]),
                "compute_s": sum(m["chunk"]) / len(m["step"]),
                "chunk_mean_s": statistics.fmean(m["chunk"]),
                "chunk_sd_s": sigma,
                "comm_s": statistics.median(m["comm"]),
                "isolated_comm_s": isolated,
                "straggler_estimate_s": syncs * spread / math.sqrt(math.pi),
            }
        )
    if rank == 0:
        print(
            f"{world} gloo processes, 1 thread each; a step: {args.syncs} chunks of {args.chunk_mm} 384^3 products; "
            f"{args.passes} interleaved passes of {args.steps} steps; all_gather of {args.gather_bytes / 2**10:.0f} "
            f"KiB alone {gather_alone * 1e3:.2f} ms, all_reduce of {args.reduce_bytes / 2**20:.1f} MiB alone "
            f"{reduce_alone * 1e3:.2f} ms"
        )
        print(
            f"{'collectives':30s} {'step ms':>8s} {'compute':>8s} {'chunk sd':>8s} {'comm ms':>8s} {'alone':>8s} "
            f"{'+ wait est.':>11s} {'unexplained':>11s}"
        )
        for r in rows:
            estimate = r["isolated_comm_s"] + r["straggler_estimate_s"]
            print(
                f"{r['way']:30s} {r['step_s'] * 1e3:8.1f} {r['compute_s'] * 1e3:8.1f} {r['chunk_sd_s'] * 1e3:8.2f} "
                f"{r['comm_s'] * 1e3:8.1f} {r['isolated_comm_s'] * 1e3:8.1f} {estimate * 1e3:11.1f} "
                f"{(r['comm_s'] - estimate) * 1e3:11.1f}"
            )
        if args.json:
            Path(args.json).write_text(json.dumps({"arguments": vars(args), "rows": rows}, indent=2) + "\n")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2, help="gloo processes (default 2)")
    parser.add_argument(
        "--syncs", type=int, default=14, help="chunks a step, and all_gathers in the third way"
    )
    parser.add_argument("--chunk-mm", type=int, default=20, help="384x384 products in a chunk (default 20)")
    parser.add_argument(
        "--gather-bytes", type=int, default=720_000, help="all_gather's whole array (FSDP's unit)"
    )
    parser.add_argument(
        "--reduce-bytes", type=int, default=3_300_000, help="all_reduce's array (the gradients)"
    )
    parser.add_argument("--steps", type=int, default=12, help="timed steps a pass and way")
    parser.add_argument("--passes", type=int, default=2, help="interleaved passes over the three ways")
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args()
    if os.environ.get("LOCAL_RANK") is not None:
        _worker(args)
        return
    from torch.distributed.run import main as torchrun

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torchrun(["--standalone", f"--nproc-per-node={args.processes}", __file__, *sys.argv[1:]])


if __name__ == "__main__":
    main()
