"""Where a training step's device time goes: accelbench's own loop under torch.profiler, kernels by category.

    python benchmarks/profile_step.py --backend cuda --model gpt2 --precision bf16-mixed --batch-size 512 --compile

Builds the run exactly as `accelbench run` does (same backend hooks, executor, data placement, compile), trains
warm-up steps, then profiles a window of steps. Prints, per step: the wall time (CUDA events), the device time
by kernel category (matrix multiplies, attention, fused/elementwise, optimizer, copies), the time the device sat
idle between kernels (launch- or host-bound), the number of kernels launched, and the top kernels. The matmul
FLOPs of the step over the time its matmul kernels took gives their achieved rate, to set beside the measured
ceiling.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

CATEGORIES = (  # first match wins; names as cuBLAS, cuDNN, flash-attention, inductor and ATen give them
    ("attention", ("flash", "fmha", "attention", "attn")),
    ("matmul", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "matmul", "_mm_", "sm90_", "sm80_")),
    ("optimizer", ("adam", "multi_tensor", "foreach", "lpnorm", "l2norm")),
    ("copy", ("memcpy", "memset", "copy_kernel", "cat_", "direct_copy")),
    ("fused (inductor)", ("triton",)),
    (
        "elementwise/reduction (eager)",
        (
            "elementwise",
            "reduce",
            "vectorized",
            "norm",
            "softmax",
            "gelu",
            "dropout",
            "index",
            "embedding",
            "nll",
            "cross_entropy",
            "fill",
        ),
    ),
)


def category(name: str) -> str:
    low = name.lower()
    return next((cat for cat, keys in CATEGORIES if any(k in low for k in keys)), "other")


def device_kernels(prof: Any) -> list[tuple[str, float, float]]:
    """(name, start_us, duration_us) of every device kernel/copy the profiler saw."""
    out = []
    for evt in prof.events():
        if evt.device_type != torch.autograd.DeviceType.CUDA:
            continue
        out.append((evt.name, float(evt.time_range.start), float(evt.time_range.elapsed_us())))
    return out


def busy_us(kernels: list[tuple[str, float, float]]) -> float:
    """Union of kernel intervals (kernels on several streams may overlap)."""
    spans = sorted((start, start + dur) for _, start, dur in kernels)
    total, cur_s, cur_e = 0.0, None, None
    for s, e in spans:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def main(argv: list[str] | None = None) -> int:
    from accelbench.cli import build_parser, config_from_args
    from accelbench.engine.runner import place_data, prepare
    from accelbench.plugins import get_host

    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Every `accelbench run` option is accepted too (--backend, --model, --batch-size, --compile, ...).",
    )
    parser.add_argument("--warmup", type=int, default=15)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument(
        "--matmul-ceiling", type=float, help="measured bf16 matmul FLOP/s, for the matmul rate"
    )
    parser.add_argument("--out", type=Path)
    args, run_args = parser.parse_known_args(argv)
    # the run itself: exactly `accelbench run`'s options, parsed by its own (generated) parser
    host = get_host()
    run_parser = build_parser(host.run_options(), host.workload_run_options())
    given = config_from_args(run_parser.parse_args(["run", "--backend", "cuda", *run_args]))
    config = given.model_copy(update={"steps_per_epoch": args.warmup + args.steps, "epochs": 1})
    run = prepare(config, host)
    config = run.config  # resolved: the workload's options completed
    if run.device.type != "cuda":
        parser.error(
            f"this script profiles CUDA kernels; backend {run.backend.name!r} runs on {run.device.type}"
        )
    device, executor = run.device, run.executor
    job = run.workload.build(config)
    executor.setup(job)
    job.data = place_data(job.data, device, config.data_placement)
    batches = [(x.to(device), y.to(device)) for x, y in job.data.batches(0)]
    executor.compile(*batches[0])
    for x, y in batches[: args.warmup]:
        executor.train_step(x, y)
    run.backend.synchronize(device)

    timed = batches[args.warmup :]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=activities) as prof:
        start.record()
        for x, y in timed:
            executor.train_step(x, y)
        end.record()
        end.synchronize()
    wall_us = start.elapsed_time(end) * 1e3 / len(timed)

    # unprofiled, for the profiler's own overhead
    run.backend.synchronize(device)
    t0 = time.perf_counter()
    for x, y in timed:
        executor.train_step(x, y)
    run.backend.synchronize(device)
    unprofiled_us = (time.perf_counter() - t0) * 1e6 / len(timed)

    kernels = device_kernels(prof)
    by_cat: dict[str, float] = defaultdict(float)
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for name, _, dur in kernels:
        by_cat[category(name)] += dur / len(timed)
        by_name[name][0] += dur / len(timed)
        by_name[name][1] += 1
    busy = busy_us(kernels) / len(timed)
    tokens = config.batch_size * job.tokens_per_sample
    matmul_flops = 6.0 * job.summary["parameters"] * tokens  # ~ all of 6N is matmul work
    result: dict[str, Any] = {
        "config": config.model_dump(mode="json"),
        "executor": executor.describe(),
        "step_wall_us": wall_us,
        "step_wall_unprofiled_us": unprofiled_us,
        "device_busy_us": busy,
        "device_idle_us": wall_us - busy,
        "kernels_per_step": len(kernels) / len(timed),
        "by_category_us": dict(sorted(by_cat.items(), key=lambda kv: -kv[1])),
        "top_kernels": [
            {"name": n[:120], "us_per_step": t, "calls_per_step": c / len(timed), "category": category(n)}
            for n, (t, c) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:20]
        ],
        "model_flops_per_step": job.flops_per_sample * config.batch_size,
        "achieved_flops_per_s": job.flops_per_sample * config.batch_size / (unprofiled_us / 1e6),
        "matmul_flops_per_s_in_matmul_kernels": matmul_flops / (by_cat.get("matmul", 0) / 1e6)
        if by_cat.get("matmul")
        else None,
    }
    if args.matmul_ceiling and result["matmul_flops_per_s_in_matmul_kernels"]:
        result["matmul_fraction_of_ceiling"] = (
            result["matmul_flops_per_s_in_matmul_kernels"] / args.matmul_ceiling
        )
    print(
        f"step: {wall_us / 1e3:.3f} ms under the profiler, {unprofiled_us / 1e3:.3f} ms without; device busy "
        f"{busy / 1e3:.3f} ms, idle {(wall_us - busy) / 1e3:.3f} ms; {result['kernels_per_step']:.0f} kernels/step; "
        f"{result['achieved_flops_per_s'] / 1e12:.1f} TFLOP/s achieved"
    )
    for cat, us in result["by_category_us"].items():
        print(f"  {cat:<32} {us / 1e3:8.3f} ms  {100 * us / wall_us:5.1f}%")
    for row in result["top_kernels"][:12]:
        print(
            f"  {row['us_per_step'] / 1e3:8.3f} ms x{row['calls_per_step']:.0f}  [{row['category']}] {row['name']}"
        )
    if args.out:
        args.out.write_text(json.dumps(result, indent=2, default=str))
    executor.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
