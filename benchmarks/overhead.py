"""Engine overhead: accelbench's runner against a hand-written PyTorch loop, same model, same data, one process.

    python benchmarks/overhead.py [--model gpt-nano] [--batch-size 16] [--steps 200] [--rounds 5]

Both train the same GPT with the same optimizer, precision and batches. The hand-written loop is what a tuned
script does (fused AdamW, clipping, zero_grad(set_to_none=True)), timed like the runner (an epoch between two
synchronisations, the first epoch discarded as warm-up). Rounds alternate engine and hand loop so drift in the
machine's speed hits both alike. Prints the median steady epoch time of each and their ratio (engine / hand), then the runner's own per-step
cost measured with a null executor (no training), which this machine's timing noise cannot hide.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

import torch

from accelbench.config import RunConfig
from accelbench.contract import Executor
from accelbench.engine.runner import NoProgress, measure, prepare, run
from accelbench.plugins import get_host


def hand_written_epochs(config: RunConfig) -> list[float]:
    """The reference: a plain loop over the workload's own model and batches, with the host allocator the CPU
    backend sets up (glibc keeping freed memory, as a tuned CPU script preloads jemalloc or TCMalloc for)."""
    from accelbench.backends.host_malloc import keep_freed_memory

    keep_freed_memory()
    torch.set_num_threads(config.threads or torch.get_num_threads())
    host = get_host()
    job = host.workload(config.workload).build(config)
    model, device = job.model.train(), torch.device("cpu")
    optimizer = job.make_optimizer(model, device, "fused")
    times = []
    for epoch in range(config.epochs):
        losses = []
        start = time.perf_counter()
        for inputs, targets in job.data.batches(epoch, 0, 1):
            loss = model(inputs, targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.detach())
        times.append(time.perf_counter() - start)
    return times


def engine_epochs(config: RunConfig) -> list[float]:
    record, _, _ = run(config, get_host())
    assert record.outcome.status == "ok", record.outcome
    return [e.wall_s for e in record.metrics.epochs]


class NullExecutor(Executor):
    """Does no training at all: what remains of a step's time is the runner's own bookkeeping and the data."""

    def setup(self, job) -> None:  # type: ignore[no-untyped-def]
        self.loss = torch.zeros(())

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.loss


def bookkeeping_per_step(config: RunConfig, repeats: int = 5) -> tuple[float, float]:
    """Seconds per step of the runner's loop with a null executor, and of a bare loop over the same batches."""
    prepared = dataclasses.replace(prepare(config, get_host()), executor=NullExecutor())
    job = get_host().workload(config.workload).build(config)
    steps = job.data.steps(0, 1) * config.epochs
    runner, bare = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        measure(prepared, NoProgress(), "local")
        runner.append((time.perf_counter() - start) / steps)
        start = time.perf_counter()
        losses = []
        for epoch in range(config.epochs):
            for _batch in job.data.batches(epoch, 0, 1):
                losses.append(torch.zeros(()))
        bare.append((time.perf_counter() - start) / steps)
    return min(runner), min(bare)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    # small steps are the hard case: a fixed per-step cost in the engine weighs most there
    parser.add_argument("--model", default="gpt-nano")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--steps", type=int, default=100, help="steps per epoch")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per round (the first is warm-up)")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1 leaves a core for the OS: less noise)"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as out:
        config = RunConfig(
            model=args.model,
            batch_size=args.batch_size,
            dropout=args.dropout,
            threads=args.threads,
            epochs=args.epochs,
            steps_per_epoch=args.steps,
            output_dir=Path(out),
        )
        engine, hand, ratios = [], [], []
        for r in range(args.rounds):
            # alternate which goes first, so warming caches or clocks favour neither
            if r % 2 == 0:
                e = engine_epochs(config)[1:]
                h = hand_written_epochs(config)[1:]
            else:
                h = hand_written_epochs(config)[1:]
                e = engine_epochs(config)[1:]
            engine += e
            hand += h
            ratios.append(statistics.median(e) / statistics.median(h))
            print(
                f"round {r + 1}: engine {statistics.median(e):.4f} s/epoch, hand-written "
                f"{statistics.median(h):.4f}, ratio {ratios[-1]:.3f}"
            )
    print(
        f"\n{args.model}, batch {args.batch_size}, dropout {args.dropout}, {args.steps} steps/epoch, "
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)"
    )
    print(f"engine      median steady epoch: {statistics.median(engine):.4f} s")
    print(f"hand loop   median steady epoch: {statistics.median(hand):.4f} s")
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    print(
        f"ratio engine / hand-written: {statistics.median(ratios):.3f} (median of {len(ratios)} paired rounds; "
        f"quartiles {q[0]:.3f}..{q[2]:.3f})"
    )
    # The ratio carries this machine's noise; the runner's own per-step cost, measured without training, does not.
    with tempfile.TemporaryDirectory() as out:
        quick = config.model_copy(update={"steps_per_epoch": 500, "output_dir": Path(out)})
        runner_s, bare_s = bookkeeping_per_step(quick)
    extra = runner_s - bare_s
    step = statistics.median(hand) / args.steps
    print(
        f"runner bookkeeping: {extra * 1e6:.1f} us/step over a bare loop on the same batches "
        f"= {extra / step:.3%} of a {step * 1e3:.1f} ms training step"
    )


if __name__ == "__main__":
    main()
