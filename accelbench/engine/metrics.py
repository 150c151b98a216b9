"""What a run measured, aggregated over epochs and ranks: pure functions from per-rank logs to record metrics.

The honest-numbers rules live here, in one place: an epoch's time is the slowest rank's; throughput is all ranks'
samples over that time (never an average of per-rank rates); peak memory is kept per rank with its max and mean;
energy is summed over distinct counters (ranks sharing one CPU package are counted once); the steady state is the
median of the epochs after the first; ranks more than 10% slower than the median rank are stragglers.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

from accelbench.devices import MemoryStats, PeakFigures
from accelbench.results import EpochMetrics, Metrics, RankMetrics, SteadyState

STRAGGLER_THRESHOLD = 1.10  # a rank whose steady epoch time exceeds the median rank's by 10%


@dataclass
class RankLog:
    """What one rank measured; gathered to rank 0 in multi-process runs (as a plain dict)."""

    rank: int
    host: str
    epoch_wall_s: list[float] = field(default_factory=list)
    epoch_samples: list[int] = field(default_factory=list)
    epoch_steps: list[int] = field(default_factory=list)
    epoch_peak_bytes: list[int | None] = field(default_factory=list)
    epoch_loss: list[float] = field(default_factory=list)
    epoch_telemetry: list[dict[str, float]] = field(default_factory=list)
    epoch_energy_j: list[float | None] = field(default_factory=list)
    energy_domain: str | None = None  # the counter the joules come from (shared counters are summed once)
    energy_source: str | None = None


@dataclass(frozen=True)
class WorkCounts:
    """What one sample costs: the workload's FLOPs and tokens (from its TrainingJob)."""

    flops_per_sample: float
    flops_formula: str
    tokens_per_sample: int


def epoch_metrics(epoch: int, logs: list[RankLog], tokens_per_sample: int) -> EpochMetrics:
    """One epoch over all ranks."""
    wall = max(log.epoch_wall_s[epoch] for log in logs)
    samples = sum(log.epoch_samples[epoch] for log in logs)
    energy = epoch_energy(epoch, logs)
    return EpochMetrics(
        epoch=epoch,
        wall_s=wall,
        steps=max(log.epoch_steps[epoch] for log in logs),
        samples=samples,
        tokens=samples * tokens_per_sample,
        samples_per_s=samples / wall,
        tokens_per_s=samples * tokens_per_sample / wall,
        loss=logs[0].epoch_loss[epoch],
        peak_memory_bytes=max_known(log.epoch_peak_bytes[epoch] for log in logs),
        telemetry=logs[0].epoch_telemetry[epoch],
        energy_j=energy,
        joules_per_sample=energy / samples if energy is not None and samples else None,
        samples_per_joule=samples / energy if energy else None,
    )


def epoch_energy(epoch: int, logs: list[RankLog]) -> float | None:
    """Joules of one epoch: each distinct counter once; unknown if any rank's counter is unreadable."""
    by_domain: dict[str, float] = {}
    for log in logs:
        joules = log.epoch_energy_j[epoch] if epoch < len(log.epoch_energy_j) else None
        if joules is None or log.energy_domain is None:
            return None
        by_domain[log.energy_domain] = max(by_domain.get(log.energy_domain, 0.0), joules)
    return sum(by_domain.values()) if by_domain else None


def build_metrics(
    logs: list[RankLog],
    work: WorkCounts,
    peak: PeakFigures | None,
    devices: int,
    setup_s: float,
    compile_s: float | None,
    memory: MemoryStats | None,
) -> Metrics:
    """Aggregate per-rank logs into the record's metrics."""
    n_epochs = min(len(log.epoch_wall_s) for log in logs)
    epochs = [epoch_metrics(e, logs, work.tokens_per_sample) for e in range(n_epochs)]
    steady = None
    if n_epochs >= 2:
        later = epochs[1:]
        walls = [e.wall_s for e in later]
        samples_per_s = statistics.median(e.samples_per_s for e in later)
        achieved = samples_per_s * work.flops_per_sample
        per_sample = [e.joules_per_sample for e in later if e.joules_per_sample is not None]
        joules = statistics.median(per_sample) if len(per_sample) == len(later) else None  # unknown if any is
        steady = SteadyState(
            epochs=len(later),
            epoch_s_median=statistics.median(walls),
            epoch_s_min=min(walls),
            epoch_s_max=max(walls),
            samples_per_s=samples_per_s,
            tokens_per_s=samples_per_s * work.tokens_per_sample,
            achieved_flops_per_s=achieved,
            mfu=achieved / (peak.flops_per_s * devices) if peak else None,
            joules_per_sample=joules,
            samples_per_joule=1.0 / joules if joules else None,
        )
    steady_range = slice(1, n_epochs) if n_epochs >= 2 else slice(0, n_epochs)
    rank_peaks = [max_known(log.epoch_peak_bytes[steady_range]) for log in logs]
    known = [p for p in rank_peaks if p is not None]
    return Metrics(
        compile_s=compile_s,
        setup_s=setup_s,
        epochs=epochs,
        warmup=epochs[0] if epochs else None,
        steady=steady,
        ranks=[
            RankMetrics(
                rank=log.rank,
                host=log.host,
                epoch_wall_s=log.epoch_wall_s,
                epoch_samples=log.epoch_samples,
                peak_memory_bytes=peak_bytes,
            )
            for log, peak_bytes in zip(logs, rank_peaks, strict=True)
        ],
        memory=memory,
        peak_memory_max_bytes=max(known) if known else None,
        peak_memory_mean_bytes=statistics.fmean(known) if known else None,
        stragglers=find_stragglers(logs),
        flops_per_sample=work.flops_per_sample,
        flops_formula=work.flops_formula,
        peak=peak,
        energy_source=next((log.energy_source for log in logs if log.energy_source), None),
    )


def find_stragglers(logs: list[RankLog]) -> list[int]:
    """Ranks whose median epoch time (after the warm-up) is >10% above the median over ranks."""
    if len(logs) < 2:
        return []
    per_rank = {
        log.rank: statistics.median(log.epoch_wall_s[1:] or log.epoch_wall_s)
        for log in logs
        if log.epoch_wall_s
    }
    if len(per_rank) < 2:
        return []
    typical = statistics.median(per_rank.values())
    return sorted(r for r, t in per_rank.items() if t > STRAGGLER_THRESHOLD * typical)


def max_known(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None
