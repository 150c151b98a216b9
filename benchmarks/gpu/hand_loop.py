"""accelbench's runner against a hand-written training loop on one GPU: same workload, model, batches, precision.

    python benchmarks/gpu/hand_loop.py OUT.json SPEC [SPEC ...]      SPEC: workload:model:precision:batch[:steps][:option=value...]

e.g. ``gpt:gpt2:bf16-mixed:64 resnet50:resnet50:bf16-mixed:128:15:synthetic=device``.

The hand-written loop is what a tuned script does with the same pieces: the workload's own model on the device
(the image models go channels-last, as accelbench's do by default), its batches copied to the device before the
clock starts, ``torch.autocast`` for the mixed precisions (bf16-true: the model cast to bfloat16), fused AdamW,
gradient clipping at the workload's norm, ``zero_grad(set_to_none=True)``. Both are timed the same way: an epoch of
``steps`` steps between two ``torch.cuda.synchronize()``, the first epoch discarded as the warm-up, the median of
the rest. The runner and the hand loop alternate (runner, hand, hand, runner), so a drifting clock hits both alike.
Writes each pair's steady epoch times, samples/s and the ratio runner / hand (<= 1.05 is the target).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from accelbench.config import RunConfig
from accelbench.engine.runner import run
from accelbench.plugins import get_host

EPOCHS = 4
BACKEND = os.environ.get("HAND_LOOP_BACKEND", "cuda")  # cpu: a smoke test of this script off the GPU


def sync() -> None:
    if BACKEND == "cuda":
        torch.cuda.synchronize()


def config_of(spec: str, out: Path) -> RunConfig:
    workload, model, precision, batch, *rest = spec.split(":")
    options = dict(
        item.split("=", 1) for item in rest if "=" in item
    )  # workload options, e.g. synthetic=device
    plain = [item for item in rest if "=" not in item]
    steps = int(plain[0]) if plain else 30
    host = get_host()
    return host.resolve(
        RunConfig(
            backend=BACKEND,
            workload=workload,
            model=model,
            precision=precision,
            batch_size=int(batch),
            epochs=EPOCHS,
            steps_per_epoch=steps,
            output_dir=out,
            no_tensor_peak=True,
            no_calibration=True,
            idle_baseline_s=0.0,
            workload_options=options,
        )
    )


def runner_epochs(config: RunConfig) -> list[float]:
    record, _, _ = run(config, get_host())
    assert record.outcome.status == "ok", record.outcome
    return [e.wall_s for e in record.metrics.epochs]


def hand_epochs(config: RunConfig) -> list[float]:
    torch.manual_seed(config.seed)
    device = torch.device(BACKEND)
    job = get_host().workload(config.workload).build(config)
    model = job.model.to(device).train()
    if config.precision == "bf16-true":
        model = model.to(torch.bfloat16)
    optimizer = job.make_optimizer(model, device, "fused")
    autocast = torch.autocast(BACKEND, dtype=torch.bfloat16, enabled=config.precision == "bf16-mixed")
    epochs = []
    for epoch in range(config.epochs):
        batches = [(x.to(device), y.to(device)) for x, y in job.data.batches(epoch, 0, 1)]
        sync()
        start = time.perf_counter()
        for inputs, targets in batches:
            with autocast:
                loss = model(inputs, targets)
            loss.backward()
            if job.grad_clip_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), job.grad_clip_norm, foreach=True)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        sync()
        epochs.append(time.perf_counter() - start)
    del model, optimizer, batches
    if BACKEND == "cuda":
        torch.cuda.empty_cache()
    return epochs


def main() -> None:
    out_json, specs = Path(sys.argv[1]), sys.argv[2:]
    results = []
    with tempfile.TemporaryDirectory() as out:
        for spec in specs:
            config = config_of(spec, Path(out))
            runner, hand = [], []
            for order in ("runner", "hand", "hand", "runner"):
                epochs = (runner_epochs if order == "runner" else hand_epochs)(config)[1:]
                (runner if order == "runner" else hand).extend(epochs)
            r, h = statistics.median(runner), statistics.median(hand)
            steps = config.steps_per_epoch or 0
            row = {
                "spec": spec,
                "steps_per_epoch": steps,
                "runner_epochs_s": runner,
                "hand_epochs_s": hand,
                "runner_samples_per_s": steps * config.batch_size / r,
                "hand_samples_per_s": steps * config.batch_size / h,
                "ratio_runner_over_hand": r / h,
                "device": torch.cuda.get_device_name() if BACKEND == "cuda" else "cpu",
                "torch": torch.__version__,
            }
            results.append(row)
            print(
                f"{spec}: runner {row['runner_samples_per_s']:.1f} samples/s, hand {row['hand_samples_per_s']:.1f},"
                f" ratio {row['ratio_runner_over_hand']:.3f}",
                flush=True,
            )
            out_json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
