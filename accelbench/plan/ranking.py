"""Each candidate priced by ``estimate``'s :func:`~accelbench.estimate.predict` (the same path ``accelbench
estimate`` and every run's stored prediction take), then split: ranked (predicted to fit, or fit unknown), dropped
(predicted not to fit) and unpriced (no step time: the predictor lacks a peak or a bus bandwidth). Ranked by
predicted samples/s, or by the time to a token budget; ties go to fewer accumulation steps, then to the smaller
peak memory."""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from accelbench.config import RunConfig, cli_fields, flag_of
from accelbench.plan.schema import PlannedRun

if TYPE_CHECKING:
    from accelbench.estimate.schema import Prediction
    from accelbench.plan.candidates import Layout

# fields a plan never sets: where records go is the user's (a sweep's --output-dir)
_NOT_PLANNED = {"output_dir"}
# fields a plan always states, defaults or not: what was chosen, so the command line reads as the table's row
_CHOSEN = ("workload", "model", "strategy", "devices", "batch_size", "precision")


def run_options(config: RunConfig) -> dict[str, Any]:
    """The `accelbench run` options of ``config`` that differ from their defaults (field name -> value)."""
    default = RunConfig()
    return {name: getattr(config, name) for name in _CHOSEN} | {
        name: getattr(config, name)
        for name in cli_fields()
        if name not in _NOT_PLANNED and getattr(config, name) != getattr(default, name)
    }


def run_command(config: RunConfig) -> str:
    """``config`` as the `accelbench run` command a user types (accelbench's own parser reads it back into the same
    RunConfig)."""
    words = ["accelbench", "run"]
    for name, value in run_options(config).items():
        flag = "--" + flag_of(name)
        if isinstance(value, bool):
            if value:
                words.append(flag)
        elif value is not None:
            words += [flag, str(value)]
    return shlex.join(words)


def price(
    config: RunConfig,
    layout: Layout,
    predict: Callable[[RunConfig], Prediction],
    tokens_per_sample: int,
    token_budget: float | None,
) -> PlannedRun:
    """One candidate with its prediction, and the reason it cannot be ranked if it cannot."""
    p = predict(config)
    reason = None
    if p.samples_per_s is None or p.step_time_s is None:
        if p.peak_flops_per_s is None:
            reason = "no peak FLOP/s for this device: give --measure-peak, or --device NAME from a peak table"
        elif p.comm and any(op.time_s is None for op in p.comm):
            reason = "no bus bandwidth for its collectives: give --comm RECORDS or --bus-bandwidth GB/s"
        else:
            reason = "the predictor cannot price its step time"
    elif p.fits is False:
        reason = f"predicted peak {_mib(p.peak_memory_bytes)} > {_mib(p.device_memory_bytes)} per device"
    budget_s = None
    if token_budget is not None and p.samples_per_s:
        budget_s = token_budget / (p.samples_per_s * max(tokens_per_sample, 1))
    pipeline = f"/{config.microbatches}mb/{config.pp_schedule}" if config.microbatches else ""
    checkpointed = " +ac" if config.activation_checkpointing else ""
    return PlannedRun(
        label=f"{config.strategy} {layout.text()} b{config.batch_size}x{config.grad_accum}{pipeline} "
        f"{config.precision}{checkpointed}",
        strategy=config.strategy,
        layout=layout.text(),
        mesh=config.mesh,
        batch_size=config.batch_size,
        grad_accum=config.grad_accum,
        microbatches=config.microbatches,
        pp_schedule=config.pp_schedule if config.microbatches else None,
        activation_checkpointing=config.activation_checkpointing,
        precision=config.precision,
        global_batch=config.batch_size * layout.replicas,
        options=run_options(config),
        command=run_command(config),
        step_time_s=p.step_time_s,
        samples_per_s=p.samples_per_s,
        time_to_budget_s=budget_s,
        peak_memory_bytes=p.peak_memory_bytes,
        device_memory_bytes=p.device_memory_bytes,
        fits=p.fits,
        reason=reason,
    )


def split(runs: Sequence[PlannedRun]) -> tuple[list[PlannedRun], list[PlannedRun], list[PlannedRun]]:
    """(ranked best first, dropped for memory, unpriced)."""
    unpriced = [r for r in runs if r.samples_per_s is None]
    dropped = [r for r in runs if r.samples_per_s is not None and r.fits is False]
    ranked = [r for r in runs if r.samples_per_s is not None and r.fits is not False]
    # ties (the model prices accumulation at nothing: equal FLOPs per step) go to fewer accumulation steps, whose
    # larger micro-batches use a device better than the model says, then to the smaller peak memory
    ranked.sort(
        key=lambda r: (-(r.samples_per_s or 0.0), r.grad_accum, r.peak_memory_bytes or math.inf, r.label)
    )
    return ranked, dropped, unpriced


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks of ``values``, largest first, ties given their mean rank (as Spearman's coefficient needs)."""
    order = sorted(range(len(values)), key=lambda i: -values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman's rank correlation of two equally long series: Pearson's correlation of their ranks (ties
    averaged). None for fewer than two pairs or a series whose values are all equal."""
    if len(a) != len(b) or len(a) < 2:
        return None
    ra, rb = ranks(a), ranks(b)
    mean_a, mean_b = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - mean_a) * (y - mean_b) for x, y in zip(ra, rb, strict=True))
    var_a = sum((x - mean_a) ** 2 for x in ra)
    var_b = sum((y - mean_b) ** 2 for y in rb)
    if var_a == 0 or var_b == 0:
        return None
    return cov / math.sqrt(var_a * var_b)


def _mib(value: float | None) -> str:
    return "unknown" if value is None else f"{value / 2**20:,.1f} MiB"
