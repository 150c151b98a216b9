"""The runner: turns a validated config into a timed training run and one result record.

Everything that can be checked is checked before the first step (backend, strategy, precision, workload and its
options, data), so a bad request costs nothing and writes nothing. Once measuring starts, any ending (success,
out-of-memory, error, Ctrl-C, SIGTERM from a scheduler) produces a record that keeps every completed epoch.
The aggregation of what was measured is in :mod:`accelbench.engine.metrics`, the meeting of ranks in
:mod:`accelbench.engine.ranks`, SIGTERM in :mod:`accelbench.engine.signals`.
"""

from __future__ import annotations

import gc
import os
import time
import traceback
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

import torch

from accelbench.config import RunConfig
from accelbench.devices import DeviceInfo, MemoryStats, PeakFigures
from accelbench.engine.executor import Executor, ExecutorRequest, World
from accelbench.engine.metrics import RankLog, WorkCounts, build_metrics, epoch_metrics
from accelbench.engine.ranks import destroy_process_group, exchange, init_process_group
from accelbench.engine.signals import TERMINATION, RunInterrupted
from accelbench.errors import BackendError, ConfigError
from accelbench.hostinfo import usable_cores
from accelbench.launch import RUN_ID_ENV, LaunchEnv
from accelbench.plugins import Backend, PluginHost
from accelbench.results import BackendRecord, EpochMetrics, Outcome, ResultRecord, Status, write_record
from accelbench.system import collect_system_info
from accelbench.workloads import BatchSource, TrainingJob, Workload


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


@dataclass(frozen=True)
class Preflight:
    """What a run needs that can be checked without touching a device (the launcher checks it before launching)."""

    config: RunConfig  # with the workload's options resolved and the backend's options checked
    backend: Backend
    devices: list[DeviceInfo]
    workload: Workload
    collective: str | None  # None where the backend replicates without torch.distributed (IPUs)


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


def preflight(config: RunConfig, host: PluginHost) -> Preflight:
    """Check the request against the installed backends and workloads; raise ConfigError/BackendError."""
    backend = host.select_backend(config.backend)
    devices = backend.detect()
    if not devices:
        reason = f" (detection failed: {backend.detect_error})" if backend.detect_error else ""
        about = f"; {backend.info.description}" if backend.info.description else ""
        raise BackendError(f"backend {backend.name!r} found no device on this host{reason}{about}")
    backend.check_strategy(config.strategy)
    config = host.check_backend_options(config, backend)
    if config.strategy.startswith("deepspeed-"):
        from accelbench.engine.deepspeed import require_deepspeed

        require_deepspeed()
    if config.engine == "lightning":
        from accelbench.engine.lightning import require_lightning

        require_lightning()
    kind = torch.device(backend.info.device_type)
    collective = backend.collective_backend(kind)
    world = config.devices * config.nnodes
    if world > 1 and config.strategy == "single" and collective is not None:
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
    config = host.resolve(config)
    if config.data is not None and not config.data.exists():
        raise ConfigError(f"--data {config.data}: no such file or directory; omit --data for generated data")
    return Preflight(config, backend, devices, host.workload(config.workload), collective)


def prepare(config: RunConfig, host: PluginHost, launch: LaunchEnv | None = None) -> PreparedRun:
    """Resolve and check everything, bind the device and join the process group; nothing is measured yet."""
    launch = launch or LaunchEnv("none")
    checked = preflight(config, host)
    config, backend = checked.config, checked.backend
    world = World(rank=launch.rank, local_rank=launch.local_rank, world_size=launch.world_size)
    if config.threads:
        torch.set_num_threads(config.threads)
    elif backend.info.device_type == "cpu" and launch.local_world_size > 1:
        # processes on one host share its cores; one thread pool each over all cores would oversubscribe them
        torch.set_num_threads(max(1, usable_cores() // launch.local_world_size))
    device = backend.setup_device(world.local_rank)
    plan = backend.precision_plan(config.precision, device, config.backend_options)
    collective = None
    if config.strategy != "single" and checked.collective is not None:
        collective = backend.collective_backend(device)
        assert collective is not None  # the same backend answered for the device type
        init_process_group(launch, collective, device, config.collective_timeout)
    request = ExecutorRequest(
        config=config,
        device=device,
        precision=plan,
        world=world,
        synchronize=backend.synchronize,
        units=checked.workload.units(config),
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
    memory: MemoryStats | None = None  # the last epoch's reading


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
    try:
        with TERMINATION.measuring():
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
                backend.epoch_start(device)
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
                readings = backend.epoch_end(device)
                result.memory = memory_seen(readings.memory, executor)
                log.epoch_wall_s.append(wall)
                log.epoch_samples.append(samples)
                log.epoch_steps.append(steps_done)
                log.epoch_peak_bytes.append(result.memory.peak_bytes)
                log.epoch_loss.append(torch.stack(losses).float().mean().item())
                log.epoch_telemetry.append(dict(readings.telemetry))
                log.epoch_energy_j.append(readings.energy.joules if readings.energy else None)
                if readings.energy:
                    log.energy_domain, log.energy_source = readings.energy.domain, readings.energy.source
                progress.end_epoch(epoch_metrics(epoch, [log], job.tokens_per_sample))
    except ConfigError:
        raise
    except (KeyboardInterrupt, RunInterrupted) as exc:
        what = "Ctrl-C" if isinstance(exc, KeyboardInterrupt) else "SIGTERM"
        result.outcome = Outcome(
            status="interrupted",
            message=f"{what} during epoch {epoch} after {steps_done} steps; "
            f"{len(log.epoch_wall_s)} completed epoch(s) kept",
        )
    except Exception as exc:
        result.outcome = Outcome(
            status="oom" if is_out_of_memory(exc) else "error",
            message=f"{type(exc).__name__}: {exc}".strip()[:2000],
            traceback=traceback.format_exc(limit=8),
        )
    finally:
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
    placed: BatchSource | None = to_device(device, placement)
    return placed or data


def run(
    config: RunConfig, host: PluginHost, progress: Progress | None = None, launch: LaunchEnv | None = None
) -> tuple[ResultRecord | None, Path | None, Status]:
    """Prepare, measure and, on rank 0, write the result record.

    Returns the record and its path on rank 0 (None, None on other ranks) and this process's outcome status.
    """
    TERMINATION.reset()
    run_ = prepare(config, host, launch)
    backend, device = run_.backend, run_.device
    try:
        return _run_prepared(run_, host, progress)
    finally:
        # Hand the allocator's cache back once nothing of the run holds device memory (model, optimizer state,
        # a failed step's activations): after an out-of-memory the cache holds the whole device, and the next
        # run in this process would record it as its own.
        del run_
        gc.collect()
        backend.release_memory(device)


def _run_prepared(
    run_: PreparedRun, host: PluginHost, progress: Progress | None
) -> tuple[ResultRecord | None, Path | None, Status]:
    config, launch = run_.config, run_.launch
    system = collect_system_info(host.recorded_environment())
    created = datetime.now(timezone.utc)
    rank0 = launch.rank == 0
    try:
        m = measure(run_, (progress or NoProgress()) if rank0 else NoProgress(), system.host)
        logs, outcome = [m.log], m.outcome
        if run_.backend_record.collective_backend is not None and launch.world_size > 1:
            logs, outcome = exchange(
                m.log, m.outcome, launch.rank, launch.world_size, config.collective_timeout
            )
    finally:
        destroy_process_group()
    if not rank0:
        return None, None, m.outcome.status
    job = m.job
    record = ResultRecord(
        run_id=os.environ.get(RUN_ID_ENV) or uuid.uuid4().hex,
        created_at=created,
        engine=config.engine,
        outcome=outcome,
        config=config,
        system=system,
        backend=run_.backend_record,
        precision=run_.executor.effective_precision(run_.request.precision),
        workload=job.summary if job else {},
        workload_identity=dict(run_.workload.identity(config)),
        data=job.data.describe() if job else {},
        executor=run_.executor.describe() if job else {},
        plugins=run_.plugins,
        world_size=launch.world_size,
        nodes=launch.nnodes,
        launcher=launch.launcher,
        metrics=build_metrics(
            logs,
            WorkCounts(job.flops_per_sample, job.flops_formula, job.tokens_per_sample),
            run_.peak,
            run_.backend_record.devices_used,
            m.setup_s,
            m.compile_s,
            m.memory if m.log.epoch_wall_s else None,
        )
        if job
        else None,
    )
    return record, write_record(record, config.output_dir), record.outcome.status


def is_out_of_memory(exc: BaseException) -> bool:
    oom_type = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError  # torch < 2.5
    if isinstance(exc, (oom_type, MemoryError)):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)
