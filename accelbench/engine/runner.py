"""The runner: turns a validated config into a timed training run and one result record.

Everything that can be checked is checked before the first step (backend, strategy, precision, workload and its
options, data), so a bad request costs nothing and writes nothing. Once measuring starts, any ending (success,
out-of-memory, error, Ctrl-C, SIGTERM from a scheduler) produces a record that keeps every completed epoch.
The aggregation of what was measured is in :mod:`accelbench.engine.metrics`, the meeting of ranks in
:mod:`accelbench.engine.ranks`, SIGTERM in :mod:`accelbench.engine.signals`.
"""

from __future__ import annotations

import gc
import itertools
import os
import statistics
import time
import traceback
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

import torch
import torch.distributed as dist

from accelbench.config import RunConfig
from accelbench.contract import (
    Backend,
    DataShard,
    DeviceInfo,
    Executor,
    ExecutorRequest,
    MemoryStats,
    PeakFigures,
    Scalar,
    World,
)
from accelbench.engine.distributed import executor_for
from accelbench.engine.metrics import EpochPlan, RankLog, WorkCounts, build_metrics, epoch_metrics
from accelbench.engine.prediction import load_comm_records, peak_for, predict_run
from accelbench.engine.profile import PROFILE_WARMUP_STEPS, profile_steps
from accelbench.engine.ranks import (
    destroy_process_group,
    exchange,
    init_process_group,
    publish_progress,
    release_peers,
)
from accelbench.engine.signals import TERMINATION, RunInterrupted
from accelbench.errors import BackendError, ConfigError
from accelbench.estimate.model import WorkloadFacts
from accelbench.hostinfo import cpu_usage, usable_cores
from accelbench.launch import RUN_ID_ENV, LaunchEnv
from accelbench.plugins import PluginHost
from accelbench.results import (
    BackendRecord,
    EpochMetrics,
    Outcome,
    ResultRecord,
    Status,
    StepProfile,
    check_writable,
    record_name,
    write_record,
)
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
    warnings: tuple[str, ...] = ()  # what the user should know before it runs (the command line prints them)


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
    kind = torch.device(backend.info.device_type)
    backend.check_strategy(config.strategy, kind)
    config = host.check_backend_options(config, backend)
    if config.compile and backend.compile_backend() is None:
        raise ConfigError(
            f"backend {backend.name!r} cannot compile (it names no torch.compile backend); drop --compile"
        )
    if config.strategy.startswith("deepspeed-"):
        from accelbench.engine.deepspeed import require_deepspeed

        require_deepspeed()
    if config.engine == "lightning":
        from accelbench.engine.lightning import require_lightning

        require_lightning()
        if backend.lightning_accelerator() is None:
            raise ConfigError(
                f"backend {backend.name!r} names no Lightning accelerator for its devices; use --engine native"
            )
    collective = backend.collective(kind)
    world = config.devices * config.nnodes
    if world > 1 and config.strategy == "single" and collective is not None:
        raise ConfigError(
            f"strategy 'single' trains on one device, but {world} were asked for; choose a multi-device strategy: "
            f"{', '.join(s for s in backend.supported_strategies(kind) if s != 'single')}"
        )
    # A CPU "device" is a process sharing the host's cores, so any count runs (with a warning where they would
    # contend for cores); accelerators are counted.
    warnings: list[str] = []
    if backend.info.device_type != "cpu" and config.devices > len(devices):
        raise ConfigError(
            f"--devices {config.devices}, but backend {backend.name!r} detected {len(devices)} on this node: "
            + ", ".join(f"{d.index}: {d.name}" for d in devices)
        )
    if backend.info.device_type == "cpu":
        cores = usable_cores()
        threads = config.threads or 1
        if config.devices * threads > cores:
            warnings.append(
                f"{config.devices} worker process(es) x {threads} thread(s) on {cores} usable core(s): they will "
                f"contend for cores, and the record will say the host was contended; use --devices {max(1, cores // threads)} "
                "or fewer for figures that mean something"
            )
    backend.check_precision(config.precision, kind)
    config = host.resolve(config)
    backend.check_run(config)
    if config.mesh is not None:  # tensor/pipeline parallelism: can the model be split so?
        from accelbench.engine.parallel.mesh import check_model_split

        check_model_split(config, host.workload(config.workload).units(config), config.workload)
    if config.data is not None and not config.data.exists():
        raise ConfigError(f"--data {config.data}: no such file or directory; omit --data for generated data")
    load_comm_records(config)  # unreadable --comm-records are refused now, not found wanting after the run
    check_writable(config.output_dir)  # before anything is measured, not after
    return Preflight(config, backend, devices, host.workload(config.workload), collective, tuple(warnings))


def prepare(config: RunConfig, host: PluginHost, launch: LaunchEnv | None = None) -> PreparedRun:
    """Resolve and check everything, bind the device and join the process group; nothing is measured yet."""
    launch = launch or LaunchEnv("none")
    checked = preflight(config, host)
    config, backend = checked.config, checked.backend
    world = World(
        rank=launch.rank,
        local_rank=launch.local_rank,
        world_size=launch.world_size,
        local_world_size=launch.local_world_size,
        nnodes=config.nnodes,
    )
    if config.threads:
        torch.set_num_threads(config.threads)
    elif backend.info.device_type == "cpu" and launch.local_world_size > 1:
        # processes on one host share its cores; one thread pool each over all cores would oversubscribe them
        torch.set_num_threads(max(1, usable_cores() // launch.local_world_size))
    device = backend.setup_device(world, config.backend_options)
    if not isinstance(device, torch.device):
        raise BackendError(
            f"backend {backend.name!r}: setup_device returned {type(device).__name__}, not torch.device"
        )
    plan = backend.precision_plan(config.precision, device, config.backend_options)
    collective = None
    if config.strategy != "single" and checked.collective is not None:
        collective = backend.collective(device)
        assert collective is not None  # the same backend answered for the device type
        init_process_group(launch, collective, device, config.collective_timeout)
    request = ExecutorRequest(
        config=config,
        device=device,
        precision=plan,
        world=world,
        backend=backend,
        units=checked.workload.units(config),
        default_executor=executor_for,
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
    else:  # the peak of the math that really runs (an executor may refine the plan); measured where no table
        peak = peak_for(backend, device, checked.devices[0], executor.effective_precision(plan))
    record = host.distribution_of(backend)
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
    profile: StepProfile | None = None  # --profile: where a step's time goes (rank 0's)
    facts: WorkloadFacts | None = None  # what the analytical model needs, read off the built model
    runtime_bytes: int | None = None  # what the backend's memory reading counted before the model existed
    plan: EpochPlan = field(default_factory=lambda: EpochPlan(1))
    walls: list[float] = field(
        default_factory=list
    )  # epoch times the plan decides on (slowest rank's in auto)


def measure(run: PreparedRun, progress: Progress, host_name: str) -> Measurement:
    """Build the job, train and time it. Any failure after the build starts becomes the outcome, not an
    exception, so an out-of-memory while building a model too large is recorded like one while training.
    A ``ConfigError`` from the workload (bad data file, bad size) is still raised: nothing was measured.
    """
    config, backend, device, executor = run.config, run.backend, run.device, run.executor
    world = run.request.world
    result = Measurement(
        job=None,
        log=RankLog(rank=world.rank, host=host_name),
        outcome=Outcome(status="ok"),
        plan=EpochPlan.of(config.epochs),
    )
    log = result.log
    epoch, steps_done = 0, 0
    try:
        with TERMINATION.measuring():
            result.runtime_bytes = memory_before_model(backend, device)
            start = time.perf_counter()
            job = result.job = run.workload.build(config)
            facts_start = time.perf_counter()
            result.facts = facts_or_none(job, config)  # before an executor wraps or shards the model
            facts_s = time.perf_counter() - facts_start
            executor.setup(job)
            job.data = place_data(job.data, device, config.data_placement)
            backend.synchronize(device)
            result.setup_s = time.perf_counter() - start - facts_s

            # ranks holding one copy of the model (tensor/pipeline parallelism) share a data shard
            shard = executor.data_shard(world)
            inputs, targets = next(job.data.batches(0, shard.index, shard.count))
            result.compile_s = executor.compile(inputs.to(device), targets.to(device))

            steps = job.data.steps(shard.index, shard.count)
            plan, walls = result.plan, result.walls
            for epoch in range(plan.limit):
                progress.start_epoch(epoch + 1, plan.expected(epoch), steps, config.batch_size)
                backend.epoch_start(device)
                losses: list[torch.Tensor] = []
                samples = 0
                steps_done = 0
                backend.synchronize(device)
                usage = cpu_usage()
                start = time.perf_counter()
                for inputs, targets in job.data.batches(epoch, shard.index, shard.count):
                    losses.append(
                        executor.train_step(
                            inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
                        )
                    )
                    backend.end_of_step(device)
                    samples += inputs.shape[0] if shard.counts_samples else 0
                    steps_done += 1
                    progress.step()
                backend.synchronize(device)
                wall = time.perf_counter() - start
                after = cpu_usage()
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
                log.epoch_cpu_s.append(after.cpu_s - usage.cpu_s)
                log.epoch_cpu_wait_s.append(
                    max(0.0, after.wait_s - usage.wait_s)
                    if after.wait_s is not None and usage.wait_s is not None
                    else None
                )
                log.epoch_load.append(after.load_1m)
                progress.end_epoch(epoch_metrics(epoch, [log], job.tokens_per_sample))
                if world.world_size > 1:
                    publish_progress(
                        world.rank, log
                    )  # kept by rank 0 even if this rank never reports an ending
                walls.append(slowest_rank(wall, device, backend) if plan.fixed is None else wall)
                if plan.stop_after(walls):
                    break
            if config.profile:  # after the timed epochs: profiling never changes a measured epoch
                progress.close()
                result.profile = profile_window(run, job, shard, steps, log.epoch_wall_s)
            log.executor_facts = executor.rank_facts()
    except ConfigError:
        raise
    except (KeyboardInterrupt, RunInterrupted) as exc:
        what = "Ctrl-C" if isinstance(exc, KeyboardInterrupt) else "SIGTERM"
        result.outcome = Outcome(
            status="interrupted",
            message=f"{what} during epoch {epoch + 1} after {steps_done} steps; "
            f"{len(log.epoch_wall_s)} completed epoch(s) kept",
        )
    except Exception as exc:
        if TERMINATION.signalled and world.world_size > 1:  # a peer stopped on the same SIGTERM and left the
            result.outcome = Outcome(  # collective this rank was in: the job was interrupted, not broken
                status="interrupted",
                message=f"SIGTERM during epoch {epoch + 1} after {steps_done} steps (a collective ended as the "
                f"peers stopped: {type(exc).__name__}); {len(log.epoch_wall_s)} completed epoch(s) kept",
            )
        else:
            result.outcome = Outcome(
                status="oom" if is_out_of_memory(exc) else "error",
                message=f"{type(exc).__name__}: {exc}".strip()[:2000],
                traceback=traceback.format_exc(limit=8),
            )
    finally:
        progress.close()
        executor.close()
    return result


def profile_window(
    run: PreparedRun, job: TrainingJob, shard: DataShard, steps_per_epoch: int, walls: list[float]
) -> StepProfile:
    """``--profile``: steady-state steps after the timed epochs under torch.profiler, on every rank (their
    collectives must meet); rank 0 keeps the breakdown and writes the trace (a temporary name until the record
    is written, then beside it)."""
    config, device = run.config, run.device
    timed = statistics.median(walls[1:] or walls) / steps_per_epoch if walls and steps_per_epoch else None
    batches = itertools.chain.from_iterable(
        job.data.batches(epoch, shard.index, shard.count) for epoch in itertools.count(len(walls))
    )
    trace = config.output_dir / f".trace-{uuid.uuid4().hex[:8]}.json.gz" if run.launch.rank == 0 else None

    def step(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss = run.executor.train_step(inputs, targets)
        run.backend.end_of_step(device)
        return loss

    return profile_steps(
        step,
        batches,
        lambda t: t.to(device, non_blocking=True),
        lambda: run.backend.synchronize(device),
        device.type,
        config.profile_steps,
        trace,
        timed,
        f"{config.profile_steps} steady-state steps after the {len(walls)} timed epoch(s), once "
        f"{PROFILE_WARMUP_STEPS} steps had run under the profiler",
    )


def slowest_rank(wall: float, device: torch.device, backend: Backend) -> float:
    """The epoch time of the slowest rank, on every rank (one tiny all-reduce; the epoch time itself where there is
    no process group), so that ranks deciding when to stop from it all decide alike. In float64 where the backend's
    collective reduces it, else float32 (HCCL has no float64)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return wall
    dtype = torch.float64 if "float64" in backend.collective_dtypes(device) else torch.float32
    value = torch.tensor([wall], dtype=dtype, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value.item())


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
            if m.outcome.status != "ok":
                release_peers()  # a peer blocked in a collective this rank left fails now, and reports
            logs, outcome = exchange(
                m.log, m.outcome, launch.rank, launch.world_size, config.collective_timeout
            )
    finally:
        destroy_process_group()
    if not rank0:
        return None, None, m.outcome.status
    job = m.job
    if job:
        run_.executor.add_rank_logs(logs)
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
        workload_identity=identity_of(run_.workload, config),
        data=job.data.describe() if job else {},
        executor=run_.executor.describe() if job else {},
        plugins=run_.plugins,
        world_size=launch.world_size,
        nodes=launch.nnodes,
        launcher=launch.launcher,
        metrics=build_metrics(
            logs,
            WorkCounts(
                job.flops_per_sample, job.flops_formula, job.tokens_per_sample, job.megatron_flops_per_sample
            ),
            run_.peak,
            run_.backend_record.devices_used,
            m.setup_s,
            m.compile_s,
            m.memory if m.log.epoch_wall_s else None,
            cores=usable_cores(),
            epochs_decision=m.plan.decision(m.walls, ended_early=outcome.status != "ok"),
        )
        if job
        else None,
    )
    trace = None
    if m.profile is not None:
        trace = config.output_dir / m.profile.trace if m.profile.trace else None
        final = record_name(record).removesuffix(".json") + ".trace.json.gz"
        profile = m.profile.model_copy(update={"trace": final if trace and trace.exists() else None})
        record = record.model_copy(update={"profile": profile})
    if job:
        prediction = predict_run(
            config,
            m.facts,
            device_type=run_.backend.info.device_type,
            device=run_.backend_record.devices[0] if run_.backend_record.devices else None,
            peak=run_.peak,
            runtime_bytes=m.runtime_bytes,
        )
        record = record.model_copy(update={"prediction": prediction})
    path = write_record(record, config.output_dir)
    if trace is not None and trace.exists() and record.profile and record.profile.trace:
        os.replace(trace, path.parent / record.profile.trace)  # beside the record, named after it
    return record, path, record.outcome.status


def memory_before_model(backend: Backend, device: torch.device) -> int | None:
    """What the backend's peak-memory reading will count besides the model: on a CPU (whose reading is the
    process's resident set) the resident set before the model is built (interpreter, torch, the process group); an
    accelerator's allocator holds nothing yet (0). None where it cannot be read. The prediction adds it to the
    model's memory, as the measured peak includes it. Read from the OS, not through the epoch hooks, which a
    plugin may count on being called around epochs only."""
    if backend.info.device_type != "cpu":
        return 0 if device.type == backend.info.device_type else None
    import psutil

    try:
        return int(psutil.Process().memory_info().rss)
    except (psutil.Error, OSError):
        return None


def facts_or_none(job: TrainingJob, config: RunConfig) -> WorkloadFacts | None:
    """The built model's facts for the prediction, or None where they cannot be read (the run goes on)."""
    from accelbench.estimate.facts import facts_of

    try:
        return facts_of(job, config)
    except Exception:
        return None


def identity_of(workload: Workload, config: RunConfig) -> dict[str, Scalar | None]:
    """What ``compare`` groups by: the workload's identity, with ``grad_accum`` where it is not 1 (fewer, larger
    optimizer steps are other work; left out at 1 so records from before the option compare with new ones)."""
    identity: dict[str, Scalar | None] = dict(workload.identity(config))
    if config.grad_accum > 1:
        identity["grad_accum"] = config.grad_accum
    return identity


def is_out_of_memory(exc: BaseException) -> bool:
    oom_type = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError  # torch < 2.5
    if isinstance(exc, (oom_type, MemoryError)):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)
