"""What a run measured, aggregated over epochs and ranks: pure functions from per-rank logs to record metrics.

The honest-numbers rules live here, in one place: an epoch's time is the slowest rank's; throughput is all ranks'
samples over that time (never an average of per-rank rates); peak memory is kept per rank with its max and mean;
energy is summed over distinct counters (ranks sharing one CPU package are counted once); the steady state is the
median of the epochs after the first; ranks more than 10% slower than the median rank are stragglers.

One function here is not pure: :func:`peak_for`, MFU's denominator: the backend's table peak for the math that
runs; where the table has none (a CPU), dense matrix multiplies measured once per host
(:func:`accelbench.estimate.peak.measured_peak`, cached) before anything is timed, so MFU and the predicted compute
time are against the achievable matmul rate, labelled ``measured: ...``.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from accelbench.config import AUTO_MAX_EPOCHS, AUTO_TOLERANCE, MIN_STEADY_EPOCHS
from accelbench.contract import MemoryStats, PeakFigures
from accelbench.engine.stragglers import name_slowest_rank
from accelbench.errors import AccelbenchError
from accelbench.results import (
    EpochMetrics,
    HostContention,
    IdleBaseline,
    IdleCounter,
    Metrics,
    RankMetrics,
    SteadyState,
)

if TYPE_CHECKING:
    import torch

    from accelbench.contract import Backend, DeviceInfo, PrecisionPlan

STRAGGLER_THRESHOLD = 1.10  # a rank whose steady epoch time exceeds the median rank's by 10%
# a run whose threads waited for a core 10% of their runnable time shared its host; one whose cores' time was 10%
# stolen by its virtual machine's hypervisor shared the machine under it
CONTENTION_THRESHOLD = 0.10
STEAL_WORTH_SAYING = 0.01  # less steal than this is not said in the note (the record keeps it)


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
    idle_window_s: float | None = None  # the idle baseline's window (accelbench.engine.idle), before training
    idle_energy_j: float | None = None  # what this rank's counter saw over it (0 on a node's other ranks)
    idle_domain: str | None = None
    epoch_cpu_s: list[float] = field(default_factory=list)  # CPU seconds of this rank's process
    epoch_cpu_wait_s: list[float | None] = field(default_factory=list)  # its threads' waits for a core
    epoch_load: list[float | None] = field(
        default_factory=list
    )  # the host's 1-minute load at the epoch's end
    # of its usable cores' time, the share a virtual machine's hypervisor gave to other guests (steal)
    epoch_steal: list[float | None] = field(default_factory=list)
    executor_facts: dict[str, Any] = field(
        default_factory=dict
    )  # Executor.rank_facts(): e.g. a pipeline's idle time
    # TrainingJob.step_counts read after each timed epoch, summed over the epochs (the moe's tokens per expert)
    step_counts: list[list[int]] | None = None
    tensor_peak: dict[str, int] | None = None  # one untimed step's live tensor peak by kind, with its "total"
    # what names the slowest rank (accelbench.engine.stragglers): per epoch
    epoch_data_wait_s: list[float] = field(default_factory=list)  # getting its batches
    epoch_first_collective_s: list[float | None] = field(
        default_factory=list
    )  # median step: to its first all-reduce
    epoch_collective_wait_s: list[float | None] = field(
        default_factory=list
    )  # in all-reduces after its backward


MIN_STEADY = MIN_STEADY_EPOCHS


@dataclass(frozen=True)
class EpochPlan:
    """How many epochs a run trains: ``fixed`` (``--epochs N``), or, with ``fixed=None`` (``--epochs auto``), a
    warm-up and then steady epochs until the last :data:`MIN_STEADY` agree within :data:`AUTO_TOLERANCE`, at most
    :data:`AUTO_MAX_EPOCHS`. Every rank decides from the same epoch times (the slowest rank's), so all stop together.
    """

    fixed: int | None

    @classmethod
    def of(cls, epochs: int | str) -> EpochPlan:
        return cls(None if epochs == "auto" else int(epochs))

    @property
    def limit(self) -> int:
        return self.fixed if self.fixed is not None else AUTO_MAX_EPOCHS

    def expected(self, done: int) -> int:
        """The epochs to expect once ``done`` have completed (for progress and ETA)."""
        return self.fixed if self.fixed is not None else max(1 + MIN_STEADY, done + 1)

    def stop_after(self, walls: list[float]) -> bool:
        """Whether the run has its epochs, given the epoch times so far (slowest rank's)."""
        if self.fixed is not None or len(walls) >= self.limit:
            return len(walls) >= self.limit
        return len(walls) >= 1 + MIN_STEADY and spread(walls[-MIN_STEADY:]) <= AUTO_TOLERANCE

    def decision(self, walls: list[float], ended_early: bool) -> str:
        """How the number of epochs was decided, in words, for the record."""
        steady = max(0, len(walls) - 1)
        if ended_early:
            return f"ended early after {len(walls)} epoch(s) ({steady} steady)"
        if self.fixed is not None:
            text = f"fixed: --epochs {self.fixed}"
            if steady < MIN_STEADY:
                text += (
                    f"; {steady} steady epoch(s) are too few for compare's noise test, which needs {MIN_STEADY} "
                    "per run (or repeats) to tell two runs apart"
                )
            return text
        last = spread(walls[-MIN_STEADY:])
        if last <= AUTO_TOLERANCE:
            return (
                f"auto: the last {MIN_STEADY} steady epochs agreed within +-{last:.1%} (tolerance "
                f"+-{AUTO_TOLERANCE:.0%}) after {len(walls)} epochs"
            )
        return (
            f"auto: stopped at the limit of {self.limit} epochs; the last {MIN_STEADY} steady epochs spread "
            f"+-{last:.1%} (tolerance +-{AUTO_TOLERANCE:.0%}): the timing is noisy"
        )


def spread(values: list[float]) -> float:
    """Half the range over the median (the +- compare shows)."""
    middle = statistics.median(values)
    return (max(values) - min(values)) / 2 / middle if middle else 0.0


@dataclass(frozen=True)
class WorkCounts:
    """What one sample costs: the workload's FLOPs and tokens (from its TrainingJob)."""

    flops_per_sample: float
    flops_formula: str
    tokens_per_sample: int
    megatron_flops_per_sample: float | None = None  # transformer workloads: Megatron-LM's count (seed 002)


def epoch_metrics(epoch: int, logs: list[RankLog], tokens_per_sample: int) -> EpochMetrics:
    """One epoch over all ranks; ``epoch`` indexes the logs (from 0), the record counts epochs from 1."""
    wall = max(log.epoch_wall_s[epoch] for log in logs)
    samples = sum(log.epoch_samples[epoch] for log in logs)
    energy = epoch_energy(epoch, logs)
    cpu = [log.epoch_cpu_s[epoch] for log in logs if epoch < len(log.epoch_cpu_s)]
    waits = [log.epoch_cpu_wait_s[epoch] for log in logs if epoch < len(log.epoch_cpu_wait_s)]
    loads = [log.epoch_load[epoch] for log in logs if epoch < len(log.epoch_load)]
    steals = [log.epoch_steal[epoch] for log in logs if epoch < len(log.epoch_steal)]
    return EpochMetrics(
        epoch=epoch + 1,
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
        cpu_s=sum(cpu) if len(cpu) == len(logs) else None,
        cpu_wait_s=sum(w for w in waits if w is not None) if waits and None not in waits else None,
        load_avg=max_known_float(loads),
        steal=max_known_float(steals),
    )


MAX_COUNTER_WATTS = 5000.0  # no package or accelerator draws 5 kW: a counter implying more jumped
STILL_COUNTER_S = (
    0.5  # a live package or device spends energy every moment: a counter still this long is stuck
)


def check_energy_counters(logs: list[RankLog], epochs: int) -> tuple[list[str], set[int]]:
    """Counters that misbehaved, in words, and the epochs whose energy they make unknown: a counter (domain) that
    did not advance over an epoch of :data:`STILL_COUNTER_S` or more, or that advanced faster than
    :data:`MAX_COUNTER_WATTS` (a wrap miscounted, a reset, a counter of another unit)."""
    problems: list[str] = []
    bad: set[int] = set()
    for epoch in range(epochs):
        by_domain: dict[
            str, tuple[float, float]
        ] = {}  # joules (the reading rank's), that rank's epoch seconds
        for log in logs:
            joules = log.epoch_energy_j[epoch] if epoch < len(log.epoch_energy_j) else None
            if joules is None or log.energy_domain is None or epoch >= len(log.epoch_wall_s):
                continue
            seen = by_domain.get(log.energy_domain, (0.0, log.epoch_wall_s[epoch]))
            by_domain[log.energy_domain] = (max(seen[0], joules), max(seen[1], log.epoch_wall_s[epoch]))
        for domain, (joules, seconds) in by_domain.items():
            if joules == 0 and seconds >= STILL_COUNTER_S:
                problems.append(f"epoch {epoch + 1}: counter {domain} did not advance in {seconds:.2f} s")
                bad.add(epoch)
            elif seconds > 0 and joules / seconds > MAX_COUNTER_WATTS:
                problems.append(
                    f"epoch {epoch + 1}: counter {domain} jumped by {joules:.4g} J in {seconds:.2f} s "
                    f"({joules / seconds:.4g} W, above {MAX_COUNTER_WATTS:g} W)"
                )
                bad.add(epoch)
    return problems, bad


def idle_baseline(logs: list[RankLog]) -> IdleBaseline | None:
    """The counters' idle power from the ranks' idle windows, each counter once (a node's RAPL packages, read by
    its local rank 0, whose other ranks report the same counter with 0 J: the node counts once, as in
    :func:`epoch_energy`). A counter that did not advance over the window has no idle figure: unknown, not 0 W,
    which would call all its energy the training's. None where no rank read a window."""
    read = [log for log in logs if log.idle_window_s and log.idle_domain and log.idle_energy_j is not None]
    if not read:
        return None
    by_domain: dict[str, float] = {}
    for log in read:
        assert log.idle_domain is not None and log.idle_energy_j is not None
        by_domain[log.idle_domain] = max(by_domain.get(log.idle_domain, 0.0), log.idle_energy_j)
    window = max(log.idle_window_s or 0.0 for log in read)
    counters, problems = [], []
    for domain, joules in by_domain.items():
        watts = joules / window if joules > 0 else None
        if watts is None:
            problems.append(f"idle baseline: counter {domain} did not advance in {window:.2f} s")
        counters.append(IdleCounter(domain=domain, joules=joules, watts=watts))
    unread = sorted({log.energy_domain for log in logs if log.energy_domain} - set(by_domain))
    problems += [f"idle baseline: counter {domain} was not read in the window" for domain in unread]
    known = [c.watts for c in counters if c.watts is not None]
    watts = sum(known) if len(known) == len(counters) and not unread else None
    return IdleBaseline(window_s=window, watts=watts, counters=counters, problems=problems)


def above_idle(epoch: EpochMetrics, idle_watts: float | None) -> EpochMetrics:
    """``epoch`` with its energy above the idle draw over its wall time (None where either is unknown). It may
    come out negative: a run that drew less than idle says so rather than being rounded to 0."""
    if epoch.energy_j is None or idle_watts is None:
        return epoch
    joules = epoch.energy_j - idle_watts * epoch.wall_s
    return epoch.model_copy(
        update={
            "energy_above_idle_j": joules,
            "joules_per_sample_above_idle": joules / epoch.samples if epoch.samples else None,
        }
    )


def apportion_energy(epoch: int, logs: list[RankLog]) -> list[float | None]:
    """Each rank's share of one epoch's energy, in ``logs`` order. Ranks reporting the same counter (a node's
    RAPL packages, read once per node by its local rank 0) share its joules by their CPU seconds in the epoch
    (equally where a rank's are unknown or all are zero); a counter of a rank's own is all its own."""
    shares: list[float | None] = [None] * len(logs)
    by_domain: dict[str, list[int]] = {}
    for i, log in enumerate(logs):
        joules = log.epoch_energy_j[epoch] if epoch < len(log.epoch_energy_j) else None
        if joules is not None and log.energy_domain is not None:
            by_domain.setdefault(log.energy_domain, []).append(i)
    for members in by_domain.values():
        total = max(logs[i].epoch_energy_j[epoch] or 0.0 for i in members)
        cpu = [logs[i].epoch_cpu_s[epoch] if epoch < len(logs[i].epoch_cpu_s) else 0.0 for i in members]
        weights = cpu if all(c > 0 for c in cpu) else [1.0] * len(members)
        for i, weight in zip(members, weights, strict=True):
            shares[i] = total * weight / sum(weights)
    return shares


def epoch_energy(epoch: int, logs: list[RankLog]) -> float | None:
    """Joules of one epoch: each distinct counter once; unknown if any rank's counter is unreadable."""
    by_domain: dict[str, float] = {}
    for log in logs:
        joules = log.epoch_energy_j[epoch] if epoch < len(log.epoch_energy_j) else None
        if joules is None or log.energy_domain is None:
            return None
        by_domain[log.energy_domain] = max(by_domain.get(log.energy_domain, 0.0), joules)
    return sum(by_domain.values()) if by_domain else None


# What every record's FLOPs are (Metrics.flop_convention): the workload's formula gives the rest (its flops_formula)
FLOP_CONVENTION = (
    "model FLOPs per sample, training = forward + backward (3x the forward), 2 FLOPs a multiply-add, matmuls and "
    "attention only (norms, activations and the optimizer not counted), whatever the run recomputes or pads left out; "
    "MFU = achieved / (dense peak of the math that ran x devices)"
)


def model_flops_utilisation(
    achieved: float, peak: PeakFigures | None, devices: int
) -> tuple[float | None, str | None]:
    """MFU and, where it cannot be a figure, why: above 100% the peak is not this device's for the math that ran
    (a sparse figure, another device's, or the FLOPs overcounted), so it is an error in the record, never a value."""
    if peak is None or peak.flops_per_s <= 0:
        return None, None
    mfu = achieved / (peak.flops_per_s * devices)
    if mfu > 1.0:
        return None, (
            f"MFU came out at {mfu:.0%}, above 100%: {achieved / devices / 1e12:.4g} TFLOP/s achieved per device "
            f"against a peak of {peak.flops_per_s / 1e12:.4g} TFLOP/s ({peak.source}); that peak cannot be this "
            "device's for the math that ran. Give the right one with --peak-tflops, or check the workload's FLOPs"
        )
    return mfu, None


def flop_weighted_peak(flops_by_math: dict[str, float], peaks: dict[str, float]) -> float:
    """The peak of a step whose operators run in several maths (e.g. FP8 linears beside BF16 attention): the rate
    at which the step's FLOPs would run if each math ran at its own peak, sum(F) / sum(F_m / P_m). A math with FLOPs
    and no peak has no answer: KeyError naming it (MFU is then unknown, never against another math's peak)."""
    total = sum(flops_by_math.values())
    if total <= 0:
        raise ValueError("no FLOPs to weigh")
    missing = [math for math, flops in flops_by_math.items() if flops > 0 and not peaks.get(math)]
    if missing:
        raise KeyError(f"no peak for math {', '.join(missing)}")
    return total / sum(flops / peaks[math] for math, flops in flops_by_math.items() if flops > 0)


def build_metrics(
    logs: list[RankLog],
    work: WorkCounts,
    peak: PeakFigures | None,
    devices: int,
    setup_s: float,
    compile_s: float | None,
    memory: MemoryStats | None,
    cores: int = 1,
    epochs_decision: str | None = None,
) -> Metrics:
    """Aggregate per-rank logs into the record's metrics (``cores``: what rank 0's process may use)."""
    n_epochs = min(len(log.epoch_wall_s) for log in logs)
    energy_problems, bad_energy = check_energy_counters(logs, n_epochs)
    idle = idle_baseline(logs)
    idle_watts = idle.watts if idle is not None else None
    epochs = [above_idle(epoch_metrics(e, logs, work.tokens_per_sample), idle_watts) for e in range(n_epochs)]
    for e in bad_energy:  # a stuck or jumping counter's figure is no measurement
        epochs[e] = epochs[e].model_copy(
            update={
                "energy_j": None,
                "joules_per_sample": None,
                "samples_per_joule": None,
                "energy_above_idle_j": None,
                "joules_per_sample_above_idle": None,
            }
        )
    steady = None
    if n_epochs >= 2:
        later = epochs[1:]
        walls = [e.wall_s for e in later]
        samples_per_s = statistics.median(e.samples_per_s for e in later)
        achieved = samples_per_s * work.flops_per_sample
        mfu, mfu_error = model_flops_utilisation(achieved, peak, devices)
        per_sample = [e.joules_per_sample for e in later if e.joules_per_sample is not None]
        joules = statistics.median(per_sample) if len(per_sample) == len(later) else None  # unknown if any is
        per_sample_above = [e.joules_per_sample_above_idle for e in later]
        above = [j for j in per_sample_above if j is not None]
        joules_above = statistics.median(above) if len(above) == len(later) else None
        steady = SteadyState(
            epochs=len(later),
            epoch_s_median=statistics.median(walls),
            epoch_s_min=min(walls),
            epoch_s_max=max(walls),
            samples_per_s=samples_per_s,
            tokens_per_s=samples_per_s * work.tokens_per_sample,
            achieved_flops_per_s=achieved,
            mfu=mfu,
            mfu_error=mfu_error,
            joules_per_sample=joules,
            samples_per_joule=1.0 / joules if joules else None,
            joules_per_sample_above_idle=joules_above,
            megatron_tflops_per_device=samples_per_s * work.megatron_flops_per_sample / devices / 1e12
            if work.megatron_flops_per_sample
            else None,
        )
    steady_range = slice(1, n_epochs) if n_epochs >= 2 else slice(0, n_epochs)
    rank_peaks = [max_known(log.epoch_peak_bytes[steady_range]) for log in logs]
    known = [p for p in rank_peaks if p is not None]
    shares = [
        apportion_energy(e, logs) if e not in bad_energy else [None] * len(logs) for e in range(n_epochs)
    ]
    ranks = [
        RankMetrics(
            rank=log.rank,
            host=log.host,
            epoch_wall_s=log.epoch_wall_s,
            epoch_samples=log.epoch_samples,
            peak_memory_bytes=peak_bytes,
            epoch_steps=log.epoch_steps,
            data_wait_s=log.epoch_data_wait_s,
            first_collective_s=log.epoch_first_collective_s,
            collective_wait_s=log.epoch_collective_wait_s,
            energy_j=[shares[e][i] for e in range(n_epochs)],
        )
        for i, (log, peak_bytes) in enumerate(zip(logs, rank_peaks, strict=True))
    ]
    return Metrics(
        compile_s=compile_s,
        setup_s=setup_s,
        epochs=epochs,
        warmup=epochs[0] if epochs else None,
        steady=steady,
        ranks=ranks,
        memory=memory,
        peak_memory_max_bytes=max(known) if known else None,
        peak_memory_mean_bytes=statistics.fmean(known) if known else None,
        stragglers=find_stragglers(logs),
        slowest_rank=name_slowest_rank(ranks, [log.epoch_steps for log in logs]),
        flops_per_sample=work.flops_per_sample,
        flops_formula=work.flops_formula,
        flop_convention=FLOP_CONVENTION,
        megatron_flops_per_sample=work.megatron_flops_per_sample,
        peak=peak,
        energy_source=next((log.energy_source for log in logs if log.energy_source), None),
        energy_problems=energy_problems,
        idle=idle,
        epochs_decision=epochs_decision,
        host=host_contention(epochs, cores),
    )


def peak_for(
    backend: Backend, device: torch.device, device_info: DeviceInfo, plan: PrecisionPlan
) -> PeakFigures | None:
    """The backend's table peak for the math that runs, else (no table figure: a CPU) the measured dense-matmul
    rate of this device, from the per-host cache or measured now (a few seconds, once); None if neither."""
    peak = backend.peak_figures(device_info, plan)
    if peak is not None or device.type != backend.info.device_type:
        return (
            peak  # a device fed from host tensors (an IPU) computes elsewhere: timing the host says nothing
        )
    from accelbench.estimate.peak import measured_peak

    try:
        return measured_peak(backend, device, plan, device_name=device_info.name)
    except (OSError, RuntimeError, AccelbenchError):  # an unwritable cache, a device that cannot multiply
        return None


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


def host_contention(epochs: list[EpochMetrics], cores: int) -> HostContention | None:
    """How busy the host was: of the time the run's threads were ready to run, the fraction they waited for a core,
    and of its cores' time, the fraction a virtual machine's hypervisor stole, over the steady epochs (all epochs
    without steady ones). Waiting is what a busy shared node costs a run; steal what a busy host under its virtual
    machine costs it, which the guest's scheduler never sees (its threads ran, on a core that was not there)."""
    if not epochs:
        return None
    measured = epochs[1:] or epochs
    # an epoch shorter than the CPU clock's tick (10 ms) may read no CPU time at all: it waited for nothing
    fraction = {
        e.epoch: e.cpu_wait_s / (e.cpu_s + e.cpu_wait_s) if e.cpu_s + e.cpu_wait_s > 0 else 0.0
        for e in measured
        if e.cpu_s is not None and e.cpu_wait_s is not None
    }
    stolen = {e.epoch: e.steal for e in measured if e.steal is not None}
    waiting = statistics.median(fraction.values()) if len(fraction) == len(measured) else None
    steal = statistics.median(stolen.values()) if len(stolen) == len(measured) else None
    spikes = sorted(
        epoch
        for epoch in {*fraction, *stolen}
        if max(fraction.get(epoch, 0.0), stolen.get(epoch, 0.0)) >= CONTENTION_THRESHOLD
    )
    load = max_known_float(e.load_avg for e in epochs)
    stolen_much = steal is not None and steal >= CONTENTION_THRESHOLD
    contended = (waiting is not None and waiting >= CONTENTION_THRESHOLD) or stolen_much
    load_text = (
        f"load average up to {load:.1f} on {cores} usable cores" if load is not None else f"{cores} cores"
    )
    # steal is said where there is some: on bare metal, and on most virtual machines most of the time, it is 0
    steal_text = (
        f"; the hypervisor gave {steal:.0%} of the cores' time to other guests (steal)"
        if steal is not None and steal >= STEAL_WORTH_SAYING
        else ""
    )
    if waiting is None and not stolen_much:
        note = f"unknown how long the run waited for a core (no schedstat); {load_text}{steal_text}"
    elif contended:
        note = (
            "contended: "
            + (
                f"the run's threads waited for a core {waiting:.0%} of the time they were ready to run"
                if waiting is not None
                else "unknown how long the run's threads waited for a core (no schedstat)"
            )
            + f" ({load_text}){steal_text}; "
            + (
                "another job (or more processes than cores) shared the host"
                if not stolen_much
                else "the virtual machine's host ran other guests on its cores"
            )
            + ", so these figures understate it: rerun on an idle node"
        )
    else:
        note = (
            f"quiet: the run's threads waited for a core {waiting:.0%} of the time ({load_text}){steal_text}"
        )
        if spikes:
            waited = max(fraction.get(e, 0.0) for e in spikes)
            lost = max(stolen.get(e, 0.0) for e in spikes)
            how = [f"waited up to {waited:.0%}"] if waited >= CONTENTION_THRESHOLD else []
            how += [f"had up to {lost:.0%} of the cores' time stolen"] if lost >= CONTENTION_THRESHOLD else []
            note += (
                f"; but epoch(s) {', '.join(map(str, spikes))} {' and '.join(how)} (something else ran meanwhile): "
                "the median discounts them"
            )
    return HostContention(
        waiting=waiting,
        load_avg=load,
        steal=steal,
        cores=cores,
        contended=contended,
        contended_epochs=spikes,
        threshold=CONTENTION_THRESHOLD,
        note=note,
    )


def max_known_float(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def max_known(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None
