"""The runner: turns a validated config into a timed training run and one result record.

Everything that can be checked is checked before the first step (backend, strategy, precision, workload, data),
so a bad request costs nothing and writes nothing. Once measuring starts, any ending (success, out-of-memory,
error, Ctrl-C, SIGTERM from a scheduler) produces a record that keeps every completed epoch.
"""

from __future__ import annotations

import gc
import os
import signal
import statistics
import time
import traceback
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

import torch

from accelbench.backends.cpu import usable_cores
from accelbench.config import RunConfig
from accelbench.devices import DeviceInfo, MemoryStats, PeakFigures
from accelbench.engine.distributed import (
    announce_decision,
    await_decision,
    collect_statuses,
    destroy_process_group,
    gather_logs,
    init_process_group,
    report_status,
)
from accelbench.engine.executor import Executor, ExecutorRequest, World
from accelbench.errors import BackendError, ConfigError
from accelbench.launch import RUN_ID_ENV, LaunchEnv
from accelbench.plugins import Backend, PluginHost
from accelbench.results import (
    BackendRecord,
    EpochMetrics,
    Metrics,
    Outcome,
    RankMetrics,
    ResultRecord,
    Status,
    SteadyState,
    write_record,
)
from accelbench.system import collect_system_info
from accelbench.workloads import BatchSource, TrainingJob, Workload

STRAGGLER_THRESHOLD = 1.10  # a rank whose steady epoch time exceeds the median rank's by 10%


class RunInterrupted(BaseException):  # noqa: N818 - an interruption, not an error
    """Raised by the SIGTERM handler (schedulers send SIGTERM at a time limit); handled like Ctrl-C."""


_measuring = False  # SIGTERM interrupts training; once measuring is over, the record is written regardless
_record_due = (
    False  # set once measuring starts: from then on a record is owed, so SIGTERM cannot cut it short
)


def install_sigterm_handler() -> None:
    """SIGTERM (a scheduler's time limit, a sweep's point timeout, torchrun stopping the survivors of a failed rank):
    before training it ends the process at once (exit 130, nothing measured, no record); while training it raises
    ``RunInterrupted`` so the epochs measured so far are written; while the record is written it is ignored."""

    def on_sigterm(signum: int, frame: object) -> None:
        if _measuring:
            raise RunInterrupted()
        if not _record_due:
            raise SystemExit(130)

    signal.signal(signal.SIGTERM, on_sigterm)


class Progress(Protocol):
    def start_epoch(self, epoch: int, epochs: int, steps: int, samples_per_step: int) -> None: ...
    def step(self) -> None: ...
    def end_epoch(self, metrics: EpochMetrics) -> None: ...
    def close(self) -> None: ...


class NoProgress:
    def start_epoch(self, epoch: int, epochs: int, steps: int, samples_per_step: int) -> None:
        pass

    def step(self) -> None:
        pass

    def end_epoch(self, metrics: EpochMetrics) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass
class RankLog:
    """What one rank measured; gathered to rank 0 in multi-process runs."""

    rank: int
    host: str
    epoch_wall_s: list[float] = field(default_factory=list)
    epoch_samples: list[int] = field(default_factory=list)
    epoch_steps: list[int] = field(default_factory=list)
    epoch_peak_bytes: list[int | None] = field(default_factory=list)
    epoch_loss: list[float] = field(default_factory=list)
    epoch_telemetry: list[dict[str, float]] = field(default_factory=list)


@dataclass
class PreparedRun:
    """Everything resolved before measuring starts."""

    config: RunConfig
    backend: Backend
    device: torch.device
    workload: Workload
    executor: Executor
    request: ExecutorRequest
    peak: PeakFigures | None
    backend_record: BackendRecord
    plugins: dict[str, str]
    launch: LaunchEnv


@dataclass(frozen=True)
class Preflight:
    """What a run needs that can be checked without touching a device (the launcher checks it before launching)."""

    backend: Backend
    devices: list[DeviceInfo]
    workload: Workload
    collective: str  # "none" where the backend replicates without torch.distributed


def preflight(config: RunConfig, host: PluginHost) -> Preflight:
    """Check the request against the installed backends and workloads; raise ConfigError/BackendError."""
    backend = host.select_backend(config.backend)
    devices = backend.detect()
    if not devices:
        reason = f" (detection failed: {backend.detect_error})" if backend.detect_error else ""
        about = f"; {backend.info.description}" if backend.info.description else ""
        raise BackendError(f"backend {backend.name!r} found no device on this host{reason}{about}")
    backend.check_strategy(config.strategy)
    owners = {option.name.replace("-", "_"): option.backend for option in host.run_options()}
    for name in config.backend_options:
        if owners.get(name, backend.name) != backend.name:
            raise ConfigError(
                f"--{name.replace('_', '-')} is an option of backend {owners[name]!r}, not of {backend.name!r}; "
                f"drop it or add --backend {owners[name]}"
            )
    if config.strategy.startswith("deepspeed-"):
        from accelbench.engine.deepspeed import require_deepspeed

        require_deepspeed()
    if config.engine == "lightning":
        from accelbench.engine.lightning import require_lightning

        require_lightning()
    kind = torch.device(backend.info.device_type)
    collective = backend.collective_backend(kind)
    world = config.devices * config.nnodes
    if world > 1 and config.strategy == "single" and collective != "none":
        raise ConfigError(
            f"strategy 'single' trains on one device, but {world} were asked for; choose a multi-device strategy: "
            f"{', '.join(s for s in backend.supported_strategies() if s != 'single')}"
        )
    # A CPU "device" is a process sharing the host's cores, so any count works; accelerators are counted.
    if backend.info.device_type != "cpu" and config.devices > len(devices):
        raise ConfigError(
            f"--devices {config.devices}, but backend {backend.name!r} detected {len(devices)} on this node"
        )
    backend.check_precision(config.precision, kind)
    workload = host.workload(config.workload)
    if hasattr(workload, "model_names") and config.model not in workload.model_names():
        raise ConfigError(
            f"unknown model {config.model!r} for workload {workload.name!r}; "
            f"choose one of: {', '.join(workload.model_names())}"
        )
    if config.data is not None and not config.data.is_file():
        raise ConfigError(
            f"--data {config.data}: no such file; give a text file, or omit --data for the generated corpus"
        )
    return Preflight(backend, devices, workload, collective)


def prepare(config: RunConfig, host: PluginHost, launch: LaunchEnv | None = None) -> PreparedRun:
    """Resolve and check everything, bind the device and join the process group; nothing is measured yet."""
    launch = launch or LaunchEnv("none")
    checked = preflight(config, host)
    backend = checked.backend
    world = World(rank=launch.rank, local_rank=launch.local_rank, world_size=launch.world_size)
    if config.threads:
        torch.set_num_threads(config.threads)
    elif backend.info.device_type == "cpu" and launch.local_world_size > 1:
        # processes on one host share its cores; one thread pool each over all cores would oversubscribe them
        torch.set_num_threads(max(1, usable_cores() // launch.local_world_size))
    device = backend.setup_device(world.local_rank)
    plan = backend.precision_plan(config.precision, device, config.backend_options)
    collective = None
    if config.strategy != "single" and checked.collective != "none":
        collective = backend.collective_backend(device)
        init_process_group(launch, collective, device, config.collective_timeout)
    request = ExecutorRequest(
        config=config, device=device, precision=plan, world=world, synchronize=backend.synchronize
    )
    try:
        executor = backend.executor(request)
    except BaseException:
        destroy_process_group()
        raise
    if config.peak_tflops:
        peak: PeakFigures | None = PeakFigures(
            flops_per_s=config.peak_tflops * 1e12, source="user (--peak-tflops)"
        )
    else:  # the peak of the math that really runs (an executor may refine the plan)
        peak = backend.peak_figures(checked.devices[0], executor.effective_precision(plan))
    record = next(r for r in host.records if r.backend is not None and r.backend.name == backend.name)
    backend_record = BackendRecord(
        info=backend.info,
        distribution=record.distribution,
        version=record.version,
        devices=checked.devices,
        devices_used=config.devices * config.nnodes,
        collective_backend=collective,
        runtime_versions=backend.runtime_versions(),
    )
    return PreparedRun(
        config,
        backend,
        device,
        checked.workload,
        executor,
        request,
        peak,
        backend_record,
        host.versions(),
        launch,
    )


@dataclass
class Measurement:
    """What ``measure`` returns: the job it built (None if building failed), this rank's log and the outcome."""

    job: TrainingJob | None
    log: RankLog
    outcome: Outcome
    setup_s: float = 0.0
    compile_s: float | None = None


def measure(run: PreparedRun, progress: Progress, host_name: str) -> Measurement:
    """Build the job, train and time it. Any failure after the build starts becomes the outcome, not an
    exception, so an out-of-memory while building a model too large is recorded like one while training.
    A ``ConfigError`` from the workload (bad data file, bad size) is still raised: nothing was measured.
    """
    config, backend, device, executor = run.config, run.backend, run.device, run.executor
    world = run.request.world
    result = Measurement(job=None, log=RankLog(rank=world.rank, host=host_name), outcome=Outcome(status="ok"))
    log = result.log
    epoch, steps_done = 0, 0
    global _measuring, _record_due
    try:
        _measuring = _record_due = True
        start = time.perf_counter()
        job = result.job = run.workload.build(config)
        executor.setup(job)
        job.data = place_data(job.data, device, config.data_placement)
        backend.synchronize(device)
        result.setup_s = time.perf_counter() - start

        inputs, targets = next(job.data.batches(0, world.rank, world.world_size))
        result.compile_s = executor.compile(inputs.to(device), targets.to(device))

        steps = job.data.steps(world.rank, world.world_size)
        for epoch in range(config.epochs):
            progress.start_epoch(epoch, config.epochs, steps, config.batch_size)
            backend.reset_peak_memory(device)
            losses: list[torch.Tensor] = []
            samples = 0
            steps_done = 0
            backend.synchronize(device)
            start = time.perf_counter()
            for inputs, targets in job.data.batches(epoch, world.rank, world.world_size):
                losses.append(
                    executor.train_step(
                        inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
                    )
                )
                samples += inputs.shape[0]
                steps_done += 1
                progress.step()
            backend.synchronize(device)
            wall = time.perf_counter() - start
            memory = memory_seen(backend.memory_stats(device), executor)
            log.epoch_wall_s.append(wall)
            log.epoch_samples.append(samples)
            log.epoch_steps.append(steps_done)
            log.epoch_peak_bytes.append(memory.peak_bytes)
            log.epoch_loss.append(torch.stack(losses).float().mean().item())
            log.epoch_telemetry.append(backend.telemetry(device))
            progress.end_epoch(_epoch_metrics(epoch, [log], job.tokens_per_sample))
    except ConfigError:
        raise
    except (KeyboardInterrupt, RunInterrupted) as exc:
        _measuring = False
        what = "Ctrl-C" if isinstance(exc, KeyboardInterrupt) else "SIGTERM"
        result.outcome = Outcome(
            status="interrupted",
            message=f"{what} during epoch {epoch} after {steps_done} steps; "
            f"{len(log.epoch_wall_s)} completed epoch(s) kept",
        )
    except Exception as exc:
        _measuring = False
        result.outcome = Outcome(
            status="oom" if is_out_of_memory(exc) else "error",
            message=f"{type(exc).__name__}: {exc}".strip()[:2000],
            traceback=traceback.format_exc(limit=8),
        )
    finally:
        _measuring = False
        progress.close()
        executor.close()
    return result


def memory_seen(memory: MemoryStats, executor: Executor) -> MemoryStats:
    """The backend's memory reading, with the reserved peak as the headline when the executor replays graphs
    (their private pool is invisible to the allocated-bytes peak); said so in ``source``."""
    if not executor.replays_graphs or memory.peak_reserved_bytes is None:
        return memory
    return memory.model_copy(
        update={
            "peak_bytes": max(memory.peak_reserved_bytes, memory.peak_bytes or 0),
            "source": f"reserved peak: steps replay CUDA graphs from a private memory pool that the allocated "
            f"peak does not see (allocated peak {memory.peak_bytes} bytes; {memory.source})",
        }
    )


def place_data(data: BatchSource, device: torch.device, placement: str) -> BatchSource:
    """The batch source a run uses on ``device``: the workload's own (host batches, copied each step), or its
    device-resident form where it has one and ``placement`` asks for it ('auto': on accelerators, if it fits)."""
    if placement == "host" or device.type == "cpu":
        return data
    to_device = getattr(data, "to_device", None)
    if to_device is None:
        if placement == "device":
            raise ConfigError(
                f"--data-placement device: this workload's data ({type(data).__name__}) has no device-resident "
                "form; use --data-placement host or auto"
            )
        return data
    return to_device(device, placement) or data


def run(
    config: RunConfig, host: PluginHost, progress: Progress | None = None, launch: LaunchEnv | None = None
) -> tuple[ResultRecord | None, Path | None, Status]:
    """Prepare, measure and, on rank 0, write the result record.

    Returns the record and its path on rank 0 (None, None on other ranks) and this process's outcome status.
    """
    run_ = prepare(config, host, launch)
    backend, device = run_.backend, run_.device
    try:
        return _run_prepared(run_, config, progress)
    finally:
        # Hand the allocator's cache back once nothing of the run holds device memory (model, optimizer state,
        # a failed step's activations): after an out-of-memory the cache holds the whole device, and the next
        # run in this process would record it as its own.
        del run_
        gc.collect()
        backend.release_memory(device)


def _run_prepared(
    run_: PreparedRun, config: RunConfig, progress: Progress | None
) -> tuple[ResultRecord | None, Path | None, Status]:
    launch = run_.launch
    system = collect_system_info()
    created = datetime.now(timezone.utc)
    rank0 = launch.rank == 0
    try:
        m = measure(run_, (progress or NoProgress()) if rank0 else NoProgress(), system.host)
        memory = (
            memory_seen(run_.backend.memory_stats(run_.device), run_.executor) if m.log.epoch_wall_s else None
        )
        logs, outcome = [m.log], m.outcome
        if run_.backend_record.collective_backend is not None and launch.world_size > 1:
            logs, outcome = exchange(m, launch.rank, launch.world_size, config.collective_timeout)
    finally:
        destroy_process_group()
    if not rank0:
        return None, None, m.outcome.status
    record = ResultRecord(
        run_id=os.environ.get(RUN_ID_ENV) or uuid.uuid4().hex,
        created_at=created,
        engine=config.engine,
        outcome=outcome,
        config=config,
        system=system,
        backend=run_.backend_record,
        precision=run_.executor.effective_precision(run_.request.precision),
        workload=m.job.summary if m.job else {},
        data=m.job.data.describe() if m.job else {},
        executor=run_.executor.describe() if m.job else {},
        plugins=run_.plugins,
        world_size=launch.world_size,
        nodes=launch.nnodes,
        launcher=launch.launcher,
        metrics=build_metrics(
            logs, m.job, run_.peak, run_.backend_record.devices_used, m.setup_s, m.compile_s, memory
        )
        if m.job
        else None,
    )
    return record, write_record(record, config.output_dir), record.outcome.status


def exchange(m: Measurement, rank: int, world_size: int, timeout_s: float) -> tuple[list[RankLog], Outcome]:
    """Bring every rank's log to rank 0, or, when some rank failed, the names and reasons of the failed ranks.

    Ranks report how they ended through the process group's store (which survives a broken collective); rank 0
    gathers logs only when all reported "ok", so no rank waits on a collective that a dead rank will never join.
    """
    report_status(rank, m.outcome.status, m.outcome.message)
    if rank != 0:
        if m.outcome.status == "ok" and await_decision(timeout_s) == "gather":
            gather_logs(m.log)
        return [], m.outcome
    # a healthy rank 0 waits as long as a collective would; a failed one only briefly for the others' reasons
    wait_s = timeout_s if m.outcome.status == "ok" else min(timeout_s, 10.0)
    statuses = collect_statuses(world_size, wait_s)
    failed = {r: s for r, s in statuses.items() if r != 0 and (s is None or s["status"] != "ok")}
    if not failed and m.outcome.status == "ok":
        announce_decision("gather")
        try:
            return gather_logs(m.log), m.outcome
        except Exception as exc:
            return [m.log], Outcome(status="error", message=f"gathering per-rank metrics failed: {exc}")
    announce_decision("abort")
    reasons = [
        f"rank {r}: " + (f"sent no status within {wait_s:.0f} s (it died or hangs)" if s is None
                         else f"{s['status']}: {s['message']}")
        for r, s in sorted(failed.items())
    ]  # fmt: skip
    if m.outcome.status != "ok":
        reasons.insert(0, f"rank 0: {m.outcome.status}: {m.outcome.message}")
    statuses_seen = {s["status"] for s in failed.values() if s} | {m.outcome.status}
    status: Status = (
        "oom"
        if "oom" in statuses_seen
        else "interrupted"
        if statuses_seen <= {"ok", "interrupted"}
        else "error"
    )
    return [m.log], Outcome(
        status=status,
        message="; ".join(reasons) + " (metrics below are rank 0's only)",
        traceback=m.outcome.traceback,
    )


def build_metrics(
    logs: list[RankLog],
    job: TrainingJob,
    peak: PeakFigures | None,
    devices: int,
    setup_s: float,
    compile_s: float | None,
    memory: MemoryStats | None,
) -> Metrics:
    """Aggregate per-rank logs: epoch time = slowest rank; samples = sum over ranks; memory max and mean."""
    n_epochs = min(len(log.epoch_wall_s) for log in logs)
    epochs = [_epoch_metrics(e, logs, job.tokens_per_sample) for e in range(n_epochs)]
    steady = None
    if n_epochs >= 2:
        later = epochs[1:]
        walls = [e.wall_s for e in later]
        samples_per_s = statistics.median(e.samples_per_s for e in later)
        achieved = samples_per_s * job.flops_per_sample
        steady = SteadyState(
            epochs=len(later),
            epoch_s_median=statistics.median(walls),
            epoch_s_min=min(walls),
            epoch_s_max=max(walls),
            samples_per_s=samples_per_s,
            tokens_per_s=samples_per_s * job.tokens_per_sample,
            achieved_flops_per_s=achieved,
            mfu=achieved / (peak.flops_per_s * devices) if peak else None,
        )
    steady_range = slice(1, n_epochs) if n_epochs >= 2 else slice(0, n_epochs)
    rank_peaks = [_max_known(log.epoch_peak_bytes[steady_range]) for log in logs]
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
        flops_per_sample=job.flops_per_sample,
        flops_formula=job.flops_formula,
        peak=peak,
    )


def _epoch_metrics(epoch: int, logs: list[RankLog], tokens_per_sample: int) -> EpochMetrics:
    wall = max(log.epoch_wall_s[epoch] for log in logs)
    samples = sum(log.epoch_samples[epoch] for log in logs)
    return EpochMetrics(
        epoch=epoch,
        wall_s=wall,
        steps=max(log.epoch_steps[epoch] for log in logs),
        samples=samples,
        tokens=samples * tokens_per_sample,
        samples_per_s=samples / wall,
        tokens_per_s=samples * tokens_per_sample / wall,
        loss=logs[0].epoch_loss[epoch],
        peak_memory_bytes=_max_known(log.epoch_peak_bytes[epoch] for log in logs),
        telemetry=logs[0].epoch_telemetry[epoch],
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


def is_out_of_memory(exc: BaseException) -> bool:
    oom_type = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError  # torch < 2.5
    if isinstance(exc, (oom_type, MemoryError)):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def _max_known(values) -> int | None:  # type: ignore[no-untyped-def]
    known = [v for v in values if v is not None]
    return max(known) if known else None
