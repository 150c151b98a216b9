"""Times an engine against a plain training loop on stacks of tiny linear layers, in a process of its own (the CPU at
the given intra-op threads), and prints the seconds per step as JSON. :mod:`accelbench.estimate.engine_cost` runs it
and fits the cost.

    python -m accelbench.estimate.engine_probe THREADS [zero3|dtensor|fsdp [KERNELS]]

``zero3`` (the default): DeepSpeed ZeRO-3 on a one-rank gloo group, ``{"deepspeed": version, "torch": version,
"threads": n, "probes": [{"layers", "bias", "modules", "tensors", "plain_s", "zero3_s"}, ...]}``.

The layers are 8 wide and the batch 4 samples, so their work is nil and what ZeRO-3 adds per step is its own:
the hooks it puts on every module (fetch and release around each module's forward and backward), its gradient
partitioning per tensor, its flat optimizer partition and its clipping. On one rank nothing is gathered or
reduced; the collectives are priced apart, from ``accelbench comm`` records.

``dtensor``: stacks of Megatron pairs (a column-parallel linear 8 -> 32, GELU, a row-parallel linear 32 -> 8, torch's
parallel styles) over a fake process group of 2 ranks, this process rank 0, against the same stacks of plain layers
at the rank's sizes (8 -> 16 -> 8), both with AdamW; ``{"torch": version, "threads": n, "probes": [{"pairs",
"dtensor_operators", "plain_s", "tp_s"}, ...]}``, the DTensor operators of a step counted as the traced step counts
them.

``fsdp``: FSDP2 (``fully_shard`` on each unit and on the root, as the executor wraps a model) on a one-rank gloo group
against the same stacks plain, units of 8-wide linear layers, AdamW with ``KERNELS`` (fused, foreach or plain: the
backend's choice; default fused) and the executor's clipping; ``{"torch": version, "threads": n, "kernels": k,
"probes": [{"units", "layers", "bias", "tensors", "plain_s", "fsdp_s"}, ...]}``, ``units`` counting the root. Each
step is timed after a read of memory twice the last-level cache (accelbench.estimate.calibration's cold memory), as
a run's hooks find their state out of the cache that the step's activations went through: with caches warm the
hooks cost gpt-micro's shape 3.6 ms, cold 4.9, and a run on one process 7 ms more than a plain one."""

from __future__ import annotations

import json
import logging
import os
import statistics
import sys
import time
from typing import Any

# stacks of (layers, bias): modules and tensors vary apart, so a cost per module and one per tensor can be told apart
PROBES = ((16, True), (64, True), (64, False))
WIDTH, BATCH = 8, 4
WARMUP, STEPS, REPEATS = 3, 10, 3


def _median_step(step: Any) -> float:
    """The median over repeats of the mean seconds per step of ``STEPS`` steps, after ``WARMUP``."""
    for _ in range(WARMUP):
        step()
    times = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        for _ in range(STEPS):
            step()
        times.append((time.perf_counter() - started) / STEPS)
    return statistics.median(times)


def main(threads: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    import torch.distributed as dist

    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ[name] = value
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    import deepspeed

    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    config = {
        "train_micro_batch_size_per_gpu": BATCH,
        "zero_optimization": {"stage": 3},
        "gradient_clipping": 1.0,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    inputs = torch.randn(BATCH, WIDTH)

    def stack(layers: int, bias: bool) -> torch.nn.Module:
        return torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH, bias=bias) for _ in range(layers)))

    # every plain loop first: ZeRO-3's engine replaces torch.nn.functional.linear with its own autograd function
    # for the rest of the process
    probes: list[dict[str, Any]] = []
    for layers, bias in PROBES:
        model = stack(layers, bias)
        optimizer = torch.optim.AdamW(model.parameters(), foreach=True)

        def plain(model: torch.nn.Module = model, optimizer: torch.optim.Optimizer = optimizer) -> None:
            model(inputs).square().mean().backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        probes.append(
            {
                "layers": layers,
                "bias": bias,
                "modules": sum(1 for _ in model.modules()),
                "tensors": sum(1 for _ in model.parameters()),
                "plain_s": _median_step(plain),
            }
        )
    for probe in probes:
        model = stack(probe["layers"], probe["bias"])
        engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=torch.optim.AdamW(model.parameters(), foreach=True), config=config
        )

        def zero3(engine: Any = engine) -> None:
            engine.backward(engine(inputs).square().mean())
            engine.step()

        probe["zero3_s"] = _median_step(zero3)
        engine.destroy()
    dist.destroy_process_group()
    return {
        "deepspeed": deepspeed.__version__,
        "torch": torch.__version__,
        "threads": threads,
        "probes": probes,
    }


PAIRS = (2, 8, 16)
TP = 2
# FSDP units of (units, layers a unit, bias): units and tensors vary apart
FSDP_PROBES = ((4, 4, True), (8, 2, True), (16, 4, True), (16, 2, False))
COLD_STEPS = 8


def _median_cold_step(step: Any, sweep: Any) -> float:
    """The median seconds of ``COLD_STEPS`` steps, each timed alone after ``sweep()`` (untimed), after ``WARMUP``."""
    for _ in range(WARMUP):
        step()
    times = []
    for _ in range(COLD_STEPS):
        sweep()
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def fsdp(threads: int, kernels: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from accelbench.estimate.calibration import cold_memory_bytes
    from accelbench.workloads import optimizer_kernels

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ[name] = value
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    inputs = torch.randn(BATCH, WIDTH)
    cold = torch.ones(cold_memory_bytes(torch.device("cpu")) // 4)

    def stack(units: int, layers: int, bias: bool) -> torch.nn.Sequential:
        return torch.nn.Sequential(
            *(torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH, bias=bias) for _ in range(layers)))
              for _ in range(units))
        )  # fmt: skip

    def stepper(model: torch.nn.Module) -> Any:
        params = list(model.parameters())
        optimizer = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.95), **optimizer_kernels(kernels))

        def step() -> None:
            model(inputs).square().mean().backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=kernels != "plain")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return step

    probes: list[dict[str, Any]] = []
    for units, layers, bias in FSDP_PROBES:
        plain = stack(units, layers, bias)
        sharded = stack(units, layers, bias)
        for unit in sharded:
            fully_shard(unit)
        fully_shard(sharded)
        probes.append(
            {
                "units": units + 1,
                "layers": layers,
                "bias": bias,
                "tensors": sum(1 for _ in plain.parameters()),
                "plain_s": _median_cold_step(stepper(plain), cold.sum),
                "fsdp_s": _median_cold_step(stepper(sharded), cold.sum),
            }
        )
    dist.destroy_process_group()
    return {"torch": torch.__version__, "threads": threads, "kernels": kernels, "probes": probes}


def dtensor(threads: int) -> dict[str, Any]:
    import torch
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        ParallelStyle,
        RowwiseParallel,
        parallelize_module,
    )

    from accelbench.engine.parallel.executor import unmixed
    from accelbench.estimate.operators import fake_tensor_parallel_mesh, record_operators

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    inputs = torch.randn(BATCH, WIDTH)

    def pairs(count: int, hidden: int) -> torch.nn.Sequential:
        layers: list[torch.nn.Module] = []
        for _ in range(count):
            layers += [torch.nn.Linear(WIDTH, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, WIDTH)]
        return torch.nn.Sequential(*layers)

    def stepper(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Any:
        def step() -> None:
            model(inputs).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return step

    probes: list[dict[str, Any]] = []
    with fake_tensor_parallel_mesh(TP, "cpu") as mesh:
        for count in PAIRS:
            plain = pairs(count, 4 * WIDTH // TP)
            split = pairs(count, 4 * WIDTH)
            styles: dict[str, ParallelStyle] = {}
            for i in range(count):
                styles[str(3 * i)], styles[str(3 * i + 2)] = ColwiseParallel(), RowwiseParallel()
            parallelize_module(split, mesh, styles)
            tp_step = stepper(split, unmixed(torch.optim.AdamW(split.parameters(), foreach=True)))
            tp_step()  # DTensor's sharding propagation cached, the optimizer's state made, as in a run
            operators = record_operators(tp_step)
            probes.append(
                {
                    "pairs": count,
                    "dtensor_operators": sum(op.distributed for op in operators),
                    "plain_s": _median_step(
                        stepper(plain, torch.optim.AdamW(plain.parameters(), foreach=True))
                    ),
                    "tp_s": _median_step(tp_step),
                }
            )
    return {"torch": torch.__version__, "threads": threads, "probes": probes}


if __name__ == "__main__":
    probe = sys.argv[2] if len(sys.argv) > 2 else "zero3"
    if probe not in ("zero3", "dtensor", "fsdp"):
        sys.exit(f"unknown probe {probe!r}: zero3, dtensor or fsdp")
    threads = int(sys.argv[1])
    if probe == "fsdp":
        result = fsdp(threads, sys.argv[3] if len(sys.argv) > 3 else "fused")
    else:
        result = (main if probe == "zero3" else dtensor)(threads)
    sys.stdout.flush()
    print(json.dumps(result))
