"""How much slower a rank's operators run while a collective runs beside them on the same cores.

Why: on this project's 2-core VM, gpt-micro's ZeRO-3 step is predicted 12-17% short (docs/estimate.md, "Where
those 48 ms go"). A profile put the growth in the operators themselves: the same matrix products take longer while
each process's gloo threads move ZeRO-3's prefetched parameters beside them. The model prices every collective as
exposed on a CPU but has no rate for operators slowed by one, so this measures that rate before anything models it.

How: start with torch's launcher, two processes, one torch thread each::

    python -m torch.distributed.run --nproc-per-node 2 benchmarks/comm_interference.py [--rounds 6] [--json F]

Each rank builds gpt-micro (batch 16) and times forward and backward passes (no optimizer step) in alternating
rounds: ``quiet`` (nothing else runs) and ``busy`` (a second thread in each rank runs gloo all-gathers of one
transformer block's parameters back to back, as ZeRO-3's prefetch does). Per pass it reads the wall time and the
main thread's CPU time (``time.thread_time``), so a slowdown splits into waiting for a core (wall less CPU) and
the work itself taking more CPU. Rounds alternate so a host that drifts moves both conditions alike; the medians
over rounds are reported, with every round's figure. Nothing here is a test: the figures depend on the host.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from accelbench.config import RunConfig
from accelbench.plugins import get_host


def passes(step: Callable[[], None], count: int) -> tuple[float, float]:
    """Median wall and main-thread CPU seconds of ``count`` calls of ``step``."""
    walls, cpus = [], []
    for _ in range(count):
        wall, cpu = time.perf_counter(), time.thread_time()
        step()
        cpus.append(time.thread_time() - cpu)
        walls.append(time.perf_counter() - wall)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6, help="quiet/busy round pairs (default 6)")
    parser.add_argument("--passes", type=int, default=5, help="forward+backward passes a round (default 5)")
    parser.add_argument("--json", type=Path, help="write the figures here (rank 0)")
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    host = get_host()
    host.select_backend("cpu")
    torch.manual_seed(0)
    job = host.workload("gpt").build(host.resolve(RunConfig(model="gpt-micro", batch_size=16)))
    model = job.model.train()
    vocab = int(getattr(model, "vocab_size", 65))
    x = torch.randint(0, vocab, (16, 128))
    y = torch.randint(0, vocab, (16, 128))

    def step() -> None:
        out = model(x, y)
        loss = out[1] if isinstance(out, tuple) else out
        loss.backward()
        model.zero_grad(set_to_none=True)

    # one transformer block's parameters, flattened and split across ranks as ZeRO-3 partitions them; each shard's last
    # element is its rank's "done" flag, so every rank's side thread stops after the same gather (a rank that stopped
    # alone would leave the other's all-gather waiting forever)
    block = sum(p.numel() for p in model.parameters()) // 4
    shard = torch.randn(block // world + 1)
    gathered = torch.empty(shard.numel() * world)
    done = threading.Event()
    gathers = [0]

    def gather_loop(group: dist.ProcessGroup) -> None:
        while True:
            shard[-1] = 1.0 if done.is_set() else 0.0
            dist.all_gather_into_tensor(gathered, shard, group=group)
            gathers[0] += 1
            if all(gathered[(r + 1) * shard.numel() - 1] == 1.0 for r in range(world)):
                return

    # the side thread's own communicator, as ZeRO-3 prefetches on its own
    side = dist.new_group(backend="gloo")
    for _ in range(3):
        step()
    rows: list[dict[str, float | str]] = []
    for round_ in range(args.rounds):
        for condition in ("quiet", "busy"):
            dist.barrier()
            thread = None
            if condition == "busy":
                done.clear()
                gathers[0] = 0
                thread = threading.Thread(target=gather_loop, args=(side,), daemon=True)
                thread.start()
                time.sleep(0.05)
            wall, cpu = passes(step, args.passes)
            if thread is not None:
                done.set()
                thread.join()
            rows.append(
                {"round": round_, "condition": condition, "wall_s": wall, "cpu_s": cpu, "gathers": gathers[0]}
            )
    everyone: list[list[dict[str, float | str]]] = [[] for _ in range(world)]
    dist.all_gather_object(everyone, rows)
    if rank == 0:
        summary = {}
        for condition in ("quiet", "busy"):
            mine = [r for ranks in everyone for r in ranks if r["condition"] == condition]
            summary[condition] = {
                "wall_ms": round(1e3 * statistics.median(float(r["wall_s"]) for r in mine), 1),
                "cpu_ms": round(1e3 * statistics.median(float(r["cpu_s"]) for r in mine), 1),
            }
        quiet, busy = summary["quiet"], summary["busy"]
        result = {
            "model": "gpt-micro",
            "batch": 16,
            "processes": world,
            "gathered_bytes": gathered.numel() * 4,
            "summary": summary,
            "slowdown_wall": round(busy["wall_ms"] / quiet["wall_ms"], 3),
            "slowdown_cpu": round(busy["cpu_ms"] / quiet["cpu_ms"], 3),
            "rounds": everyone,
        }
        print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=1))
        if args.json:
            args.json.write_text(json.dumps(result, indent=1) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
