"""How many all-gathers a DeepSpeed ZeRO-3 step issues, with and without activation checkpointing.

Run under torchrun, two gloo processes on a CPU::

    OMP_NUM_THREADS=1 python -m torch.distributed.run --nproc-per-node 2 benchmarks/zero3_gathers.py gpt-mini
    OMP_NUM_THREADS=1 python -m torch.distributed.run --nproc-per-node 2 benchmarks/zero3_gathers.py gpt-mini --ac

``torch.distributed``'s gather functions are wrapped to count their calls; the model and optimizer are accelbench's
own (``--activation-checkpointing`` as the run applies it), ZeRO-3 at DeepSpeed's defaults. Rank 0 prints each step's counts: the
figure `accelbench estimate` counts for ZeRO-3 (docs/estimate.md, "With activation checkpointing").
"""

from __future__ import annotations

import argparse
import collections
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

GATHERS = ("all_gather_into_tensor", "_all_gather_base", "all_gather")
calls: collections.Counter[str] = collections.Counter()


def counted(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return real(*args, **kwargs)

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default="gpt-micro")
    parser.add_argument("--ac", action="store_true", help="with activation checkpointing")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for name in GATHERS:  # before DeepSpeed looks them up
        if hasattr(dist, name):
            setattr(dist, name, counted(name, getattr(dist, name)))

    import deepspeed

    from accelbench.config import RunConfig
    from accelbench.engine.checkpointing import apply_activation_checkpointing
    from accelbench.plugins import get_host

    deepspeed.init_distributed(dist_backend="gloo")
    host = get_host()
    config = host.resolve(RunConfig(model=args.model, batch_size=args.batch_size))
    torch.manual_seed(0)
    job = host.workload("gpt").build(config)
    if args.ac:
        apply_activation_checkpointing(job.model, job.units)
    optimizer = job.make_optimizer(job.model, torch.device("cpu"), "foreach")
    ds_config = {"train_micro_batch_size_per_gpu": args.batch_size, "zero_optimization": {"stage": 3},
                 "steps_per_print": 2**31 - 1}  # fmt: skip
    engine, *_ = deepspeed.initialize(model=job.model, optimizer=optimizer, config=ds_config)
    inputs, targets = next(iter(job.data.batches(0, dist.get_rank(), dist.get_world_size())))
    for step in range(args.steps):
        calls.clear()
        loss = engine(inputs, targets)
        engine.backward(loss)
        engine.step()
        if dist.get_rank() == 0:
            print(
                f"{args.model} {'with' if args.ac else 'without'} checkpointing, step {step}: {dict(calls)}"
            )


if __name__ == "__main__":
    main()
