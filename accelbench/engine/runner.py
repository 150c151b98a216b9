"""The runner: turns a validated config into a timed training run and one result record.

Everything that can be checked is checked before the first step (backend, strategy, precision, workload and its
options, data), so a bad request costs nothing and writes nothing. Once measuring starts, any ending (success,
out-of-memory, error, Ctrl-C, SIGTERM from a scheduler) produces a record that keeps every completed epoch.
The aggregation of what was measured is in :mod:`accelbench.engine.metrics`, the meeting of ranks in
:mod:`accelbench.engine.ranks`, SIGTERM in :mod:`accelbench.engine.signals`.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import signal
import statistics
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

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
from accelbench.contract.strategies import ZERO_STRATEGIES, Strategy
from accelbench.engine.distributed import executor_for
from accelbench.engine.float8 import check_fp8_run
from accelbench.engine.idle import read_idle_power
from accelbench.engine.metrics import EpochPlan, RankLog, WorkCounts, build_metrics, epoch_metrics, peak_for
from accelbench.engine.prediction import CalibratedRun, load_comm_records, predict_run
from accelbench.engine.profile import (
    MAX_PROFILE_STEPS,
    MIN_EVENTS_PER_STEP,
    PROFILE_BYTES_PER_EVENT,
    PROFILE_WARMUP_STEPS,
    profile_steps,
    profile_steps_that_fit,
)
from accelbench.engine.quality import QualityChecks, TrainingDiverged, target_label
from accelbench.engine.ranks import (
    destroy_process_group,
    exchange,
    init_process_group,
    publish_progress,
    published_progress,
    release_peers,
)
from accelbench.engine.signals import TERMINATION, RunInterrupted
from accelbench.engine.stragglers import CollectiveClock, slow_data_delay
from accelbench.engine.trackers import epoch_trackers
from accelbench.errors import BackendError, ConfigError
from accelbench.estimate.facts import WorkloadFacts
from accelbench.hostinfo import usable_cores
from accelbench.launch import RUN_ID_ENV, LaunchEnv
from accelbench.plugins import PluginHost
from accelbench.results import (
    BackendRecord,
    EpochMetrics,
    Outcome,
    QualityRecord,
    ResultRecord,
    RunPrediction,
    Status,
    StepProfile,
    check_writable,
    record_name,
    write_draft,
    write_record,
)
from accelbench.system import SystemInfo, collect_system_info
from accelbench.workloads import BatchSource, TrainingJob, Workload


class Progress(Protocol):
    def start_epoch(self, epoch: int, epochs: int, steps: int, samples_per_step: int) -> None: ...
    def step(self) -> None: ...
    def end_epoch(self, metrics: EpochMetrics) -> None: ...
    def close(self) -> None: ...
    def note(self, text: str) -> None:
        """A line on what the run does after its epochs (a calibration measured for the prediction)."""


class NoProgress:
    def start_epoch(self, epoch: int, epochs: int, steps: int, samples_per_step: int) -> None:
        pass

    def step(self) -> None:
        pass

    def end_epoch(self, metrics: EpochMetrics) -> None:
        pass

    def close(self) -> None:
        pass

    def note(self, text: str) -> None:
        pass


def _fewer(devices: int, threads: int, cores: int) -> str:
    """What makes ``devices`` CPU processes of ``threads`` threads each fit ``cores``: fewer processes where one
    process's threads fit, fewer threads where a thread each does, else both."""
    options = [f"--devices {cores // threads} or fewer"] if threads <= cores else []
    options += [f"--threads {cores // devices} or fewer"] if devices <= cores else []
    return ", or ".join(options) or f"--devices {cores} or fewer with --threads 1"


@dataclass(frozen=True)
class Preflight:
    """What a run needs that can be checked without touching a device (the launcher checks it before launching)."""

    config: RunConfig  # with the workload's options resolved and the backend's options checked
    asked: RunConfig  # the configuration as given, before it was resolved (what the check was of)
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
    asked = config
    backend = host.select_backend(config.backend)
    devices = backend.detect()
    if not devices:
        reason = f" (detection failed: {backend.detect_error})" if backend.detect_error else ""
        about = f"; {backend.info.description}" if backend.info.description else ""
        raise BackendError(f"backend {backend.name!r} found no device on this host{reason}{about}")
    kind = backend.device_kind()
    backend.check_strategy(config.strategy, kind)
    config = host.check_backend_options(config, backend)
    if config.compile and backend.compile_backend() is None:
        raise ConfigError(
            f"backend {backend.name!r} cannot compile (it names no torch.compile backend); drop --compile"
        )
    if config.strategy in ZERO_STRATEGIES:
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
    if world > 1 and config.strategy == Strategy.SINGLE and collective is not None:
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
                "contend for cores, and the record will say the host was contended; use "
                f"{_fewer(config.devices, threads, cores)} for figures that mean something"
            )
    backend.check_precision(config.precision, kind)
    check_fp8_run(config)
    config = host.resolve(config)
    backend.check_run(config)
    run_needs = getattr(host.workload(config.workload), "check_run", None)
    if run_needs is not None:  # what training needs beyond what estimating does (the llama's tokenizer)
        run_needs(config)
    if config.mesh is not None:  # tensor/pipeline parallelism: can the model be split so?
        from accelbench.engine.parallel.mesh import check_model_split

        check_model_split(config, host.workload(config.workload).units(config), config.workload)
    if config.activation_checkpointing:
        from accelbench.engine.checkpointing import check_activation_checkpointing

        check_activation_checkpointing(config, host.workload(config.workload).units(config))
    if config.data is not None and not config.data.exists():
        raise ConfigError(f"--data {config.data}: no such file or directory; omit --data for generated data")
    check_profile_window(config)
    load_comm_records(config)  # unreadable --comm-records are refused now, not found wanting after the run
    check_writable(config.output_dir)  # before anything is measured, not after
    return Preflight(
        config, asked, backend, devices, host.workload(config.workload), collective, tuple(warnings)
    )


# What one host can be asked to run, checked in the process the user started before any worker starts (a worker's own
# check would see the memory its peers already hold). A worker process that has imported torch holds ~220 MiB
# resident before it builds anything (measured: torch 2.13, CPU build, Linux); 256 MiB each is reckoned, and the
# workers may take at most 80% of the memory available. Runnable threads (worker processes x intra-op threads,
# DataLoader workers) beyond the cores are allowed with a warning (the record says the host was contended); beyond
# 64 a core each gets a 64th of one, which no measurement survives, and 10^5 of them exhaust the kernel's thread
# and process limits: refused.
PROCESS_BASELINE_BYTES = 256 * 2**20
HOST_PROCESS_MEMORY_SHARE = 0.8
MAX_THREADS_PER_CORE = 64


def check_host_capacity(
    processes: int, threads: int | None, data_workers: int | None = None, flag: str = "--devices"
) -> None:
    """Refuse, before anything starts, more worker processes or threads than this host can run: ``processes``
    training processes on this node (``flag`` names the option that asked for them), each with ``threads`` intra-op
    threads (None: the cores shared out, at least 1) and ``data_workers`` DataLoader worker processes."""
    import psutil

    cores = usable_cores()
    limit = MAX_THREADS_PER_CORE * cores
    per_process = 1 + (data_workers or 0)
    spawned = processes * per_process
    if threads is not None and processes * threads > limit:
        raise ConfigError(
            f"{flag} {processes} x --threads {threads} = {processes * threads} threads on {cores} usable core(s): "
            f"more than {MAX_THREADS_PER_CORE} a core, which measures nothing; give --threads "
            f"{max(1, cores // processes)} (the cores shared out) or leave it out"
        )
    if spawned > limit:
        given = f"{flag} {processes}" + (f" x (1 + --data-workers {data_workers})" if data_workers else "")
        fewest = f"--data-workers {max(0, cores // processes - 1)}" if data_workers else f"{flag} {cores}"
        raise ConfigError(
            f"{given} = {spawned} processes on {cores} usable core(s): more than {MAX_THREADS_PER_CORE} a core, "
            f"which measures nothing and can exhaust the host; give {fewest} or fewer"
        )
    available = int(psutil.virtual_memory().available * HOST_PROCESS_MEMORY_SHARE)
    if processes > 1 and processes * PROCESS_BASELINE_BYTES > available:
        fits = max(1, available // PROCESS_BASELINE_BYTES)
        raise ConfigError(
            f"{flag} {processes}: each worker process holds ~{PROCESS_BASELINE_BYTES // 2**20} MiB before its model, "
            f"{processes * PROCESS_BASELINE_BYTES / 2**30:.1f} GiB in all, and this host has "
            f"{available / 2**30:.1f} GiB of its available memory to give; give {flag} {fits} or fewer"
        )


def check_profile_window(config: RunConfig, available_bytes: int | None = None) -> None:
    """Refuse a --profile window no trace can hold: more than :data:`MAX_PROFILE_STEPS` steps, or (given the memory
    available) more steps than it holds even at the fewest events a training step makes; the window is cut again,
    with the reason recorded, once a step's events are counted (:func:`accelbench.engine.profile.profile_steps`)."""
    steps = config.profile_steps
    if steps > MAX_PROFILE_STEPS:
        raise ConfigError(
            f"--profile-steps {steps}: at most {MAX_PROFILE_STEPS} steps are profiled (a trace of more holds millions "
            "of events, more than memory and a trace viewer take, and the breakdown, a mean over steady steps, "
            "no longer changes); give --profile-steps 8 to 100"
        )
    if not config.profile or available_bytes is None:
        return
    fit = profile_steps_that_fit(MIN_EVENTS_PER_STEP, available_bytes)
    if steps > fit:
        raise ConfigError(
            f"--profile-steps {steps}: a profiled step makes {MIN_EVENTS_PER_STEP} profiler events or more (~"
            f"{MIN_EVENTS_PER_STEP * PROFILE_BYTES_PER_EVENT / 2**20:.1f} MiB to hold), and this host has "
            f"{available_bytes / 2**30:.1f} GiB available; give --profile-steps {max(1, fit)} or fewer"
        )


def check_run_on_host(config: RunConfig, spawning: bool = True, workload: Workload | None = None) -> None:
    """What `accelbench run` asks of this host, checked once by the process the user started, before any worker
    starts: worker processes and threads against its cores and memory (``spawning``: accelbench starts them; under
    torchrun, srun or mpirun they run already), the --profile window against its memory and, given the resolved
    config's ``workload``, its model's weights against the memory (:func:`check_model_fits_host`)."""
    import psutil

    if spawning:
        workers = config.workload_options.get(
            "data_workers"
        )  # the core workloads' DataLoader workers, if given
        given = workers if isinstance(workers, int) and not isinstance(workers, bool) else None
        check_host_capacity(config.devices, config.threads, given)
    available = int(psutil.virtual_memory().available)
    check_profile_window(config, available)
    if workload is not None:
        check_model_fits_host(config, workload, available)


def check_model_fits_host(config: RunConfig, workload: Workload, available_bytes: int) -> None:
    """Every rank builds its whole model in fp32 in host memory before an executor places, shards or casts it:
    refuse a model whose weights alone, on every worker process of this node, exceed the memory available, before
    anything is built (a build that exhausts the host is ended by the kernel's out-of-memory killer, with nothing
    said). The count is the workload's own ``parameters(config)``, from the model's shape; a workload without
    one is left to its real build."""
    count: Callable[[RunConfig], int] | None = getattr(workload, "parameters", None)
    if count is None:
        return
    parameters = count(config)
    weights = parameters * 4
    if weights * config.devices > available_bytes:
        per = f" on each of {config.devices} worker processes" if config.devices > 1 else ""
        raise ConfigError(
            f"{config.workload} {config.model}: {parameters:,} parameters or more, {weights / 2**30:.1f} GiB of fp32 "
            f"weights built in host memory{per} before the run places them, and this host has "
            f"{available_bytes / 2**30:.1f} GiB available; choose a smaller model (or fewer --devices per node)"
        )


def prepare(
    config: RunConfig, host: PluginHost, launch: LaunchEnv | None = None, checked: Preflight | None = None
) -> PreparedRun:
    """Resolve and check everything, bind the device and join the process group; nothing is measured yet.
    ``checked``: the preflight of ``config`` this process already made (the command line's, before it decided
    to train here), so the checks run once per process."""
    launch = launch or LaunchEnv("none")
    if checked is None or checked.asked != config:
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
    if config.strategy != Strategy.SINGLE and checked.collective is not None:
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
    elif plan.fp8_recipe is not None:  # FLOP-weighted over FP8 and BF16: known once the model is converted
        peak = None
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


def fp8_peak(run: PreparedRun) -> PeakFigures | None:
    """The peak of an FP8 run, once its model is converted: the backend's table weighs its FP8 and BF16 peaks by
    the FLOPs each math does (the plan records the converted linears' share). None where the table lacks either
    peak: a measured BF16 matmul rate would not be the peak of FP8 linears, so MFU is then unknown."""
    plan = run.executor.effective_precision(run.request.precision)
    if plan.fp8_layers is None:
        return None
    return run.backend.peak_figures(run.backend_record.devices[0], plan)


PROFILE_WINDOW = "the --profile window"  # the optional steps after the timed epochs, as messages name them
TENSOR_PEAK_STEP = "the tensor-peak step"


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
    notes: list[str] = field(default_factory=list)  # what the steps after the epochs say (a failed profile)
    epochs_complete: bool = False  # every epoch the plan asked for was timed (what follows is optional)
    checks: QualityChecks | None = None  # held-out loss, target and numerics, checked after each timed epoch
    quality: QualityRecord | None = None  # what they found, for the record


def measure(
    run: PreparedRun,
    progress: Progress,
    host_name: str,
    checkpoint: Callable[[Measurement], None] | None = None,
) -> Measurement:
    """Build the job, train and time it. Any failure after the build starts becomes the outcome, not an
    exception, so an out-of-memory while building a model too large is recorded like one while training.
    A ``ConfigError`` from the workload (bad data file, bad size) is still raised: nothing was measured.

    With ``--profile``, ``checkpoint`` (rank 0's) is called once the timed epochs are done and before the profiled
    window, to write their record: a window that fails leaves a note (the epochs stand), and one that ends the process
    (the kernel's out-of-memory killer) leaves that record. The tensor-peak step (one untimed step under MemTracker,
    unless ``--no-tensor-peak``) follows, with a checkpoint before it where no window ran.
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
    slow_data = slow_data_delay(world.rank)  # 0 unless a test slows this rank's data on purpose
    clock: CollectiveClock | None = None  # DDP's all-reduce timings, where it has them (once it has wrapped)
    following: str | None = None  # the optional step after the timed epochs under way, if any
    try:
        with TERMINATION.measuring():
            result.runtime_bytes = memory_before_model(backend, device)
            start = time.perf_counter()
            job = result.job = run.workload.build(config)
            facts_start = time.perf_counter()
            result.facts = facts_or_none(job, config)  # before an executor wraps or shards the model
            facts_s = time.perf_counter() - facts_start
            if config.activation_checkpointing:  # before an executor wraps, shards or compiles the model
                from accelbench.engine.checkpointing import apply_activation_checkpointing

                apply_activation_checkpointing(job.model, job.units)
            executor.setup(job)
            found = getattr(executor, "collective_clock", None)
            clock = found if isinstance(found, CollectiveClock) else None
            if run.request.precision.fp8_recipe is not None and not config.peak_tflops:
                run.peak = fp8_peak(run)
            job.data = place_data(job.data, device, config.data_placement)
            backend.synchronize(device)
            result.setup_s = time.perf_counter() - start - facts_s

            # ranks holding one copy of the model (tensor/pipeline parallelism) share a data shard
            shard = executor.data_shard(world)
            inputs, targets = next(job.data.batches(0, shard.index, shard.count))
            result.compile_s = executor.compile(inputs.to(device), targets.to(device))
            # untimed, outside setup and compile: the counters' idle power, with every rank still
            read_idle_power(backend, device, config.idle_baseline_s, log)

            steps = job.data.steps(shard.index, shard.count)
            plan, walls = result.plan, result.walls
            trackers = epoch_trackers(backend, device, executor, world.rank)
            readings = trackers[0]
            checks = result.checks = QualityChecks(config, job, executor, backend, device, shard)
            for epoch in range(plan.limit):
                progress.start_epoch(epoch + 1, plan.expected(epoch), steps, config.batch_size)
                losses: list[torch.Tensor] = []
                samples = 0
                steps_done = 0
                for tracker in trackers:
                    tracker.start()
                if job.step_counts is not None:
                    job.step_counts.reset()
                backend.synchronize(device)
                start = time.perf_counter()
                data_s = 0.0  # this rank's wait for its batches (what names a straggler's cause)
                batches = iter(job.data.batches(epoch, shard.index, shard.count))
                while True:
                    if clock is not None:
                        clock.start_step()
                    fetch = time.perf_counter()
                    batch = next(batches, None)
                    if batch is None:
                        break
                    if slow_data:
                        time.sleep(slow_data)  # ACCELBENCH_SLOW_DATA: this rank made slow on purpose
                    inputs, targets = (
                        batch[0].to(device, non_blocking=True),
                        batch[1].to(device, non_blocking=True),
                    )
                    data_s += time.perf_counter() - fetch
                    losses.append(executor.train_step(inputs, targets))
                    backend.end_of_step(device)
                    if clock is not None:
                        clock.end_step()
                    samples += inputs.shape[0] if shard.counts_samples else 0
                    steps_done += 1
                    progress.step()
                backend.synchronize(device)
                wall = time.perf_counter() - start
                first_collective, collective_wait = clock.end_epoch() if clock is not None else (None, None)
                log.epoch_data_wait_s.append(data_s)
                log.epoch_first_collective_s.append(first_collective)
                log.epoch_collective_wait_s.append(collective_wait)
                for tracker in reversed(trackers):
                    tracker.stop(log)
                result.memory = readings.memory
                if job.step_counts is not None:
                    log.step_counts = add_counts(log.step_counts, job.step_counts.read())
                log.epoch_wall_s.append(wall)
                log.epoch_samples.append(samples)
                log.epoch_steps.append(steps_done)
                step_losses = torch.stack(losses).float()
                log.epoch_loss.append(step_losses.mean().item())
                progress.end_epoch(epoch_metrics(epoch, [log], job.tokens_per_sample))
                # untimed: held-out loss, gradient norm, --target-loss (raises TrainingDiverged on every rank)
                reached = checks.after_epoch(epoch, log, step_losses, steps)
                if world.world_size > 1:
                    publish_progress(
                        world.rank, log
                    )  # kept by rank 0 even if this rank never reports an ending
                walls.append(slowest_rank(wall, device, backend) if plan.fixed is None else wall)
                if reached or plan.stop_after(walls):
                    break
            log.executor_facts = executor.rank_facts()
            result.epochs_complete = True
            result.quality = checks.record(len(log.epoch_wall_s))  # in the draft written before what follows
            if config.profile:  # after the timed epochs: profiling never changes a measured epoch
                progress.close()
                following = PROFILE_WINDOW
                if checkpoint is not None:
                    checkpoint(result)
                result.profile = profile_or_note(run, job, shard, steps, log.epoch_wall_s, result.notes)
                following = None
            if not config.no_tensor_peak:  # one untimed step after them (and the profile), under MemTracker
                progress.close()
                following = TENSOR_PEAK_STEP
                if checkpoint is not None and not config.profile:
                    checkpoint(result)
                log.tensor_peak = tensor_peak_or_note(run, job, shard, len(log.epoch_wall_s), result.notes)
                following = None
    except ConfigError:
        raise
    except TrainingDiverged as exc:
        result.outcome = Outcome(status="diverged", message=str(exc))
    except (KeyboardInterrupt, RunInterrupted) as exc:
        what = "Ctrl-C" if isinstance(exc, KeyboardInterrupt) else "SIGTERM"
        where = (
            f"during {following}, after the {len(log.epoch_wall_s)} timed epoch(s), which are all kept (no "
            f"{'profile' if following == PROFILE_WINDOW else 'tensor peak'})"
            if following
            else f"during epoch {epoch + 1} after {steps_done} steps; {len(log.epoch_wall_s)} completed epoch(s) kept"
        )
        result.outcome = Outcome(status="interrupted", message=f"{what} {where}")
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
        if result.checks is not None:
            result.quality = result.checks.record(len(log.epoch_wall_s))
    return result


def profile_or_note(
    run: PreparedRun,
    job: TrainingJob,
    shard: DataShard,
    steps_per_epoch: int,
    walls: list[float],
    notes: list[str],
) -> StepProfile | None:
    """The ``--profile`` window, or None with a note in ``notes`` saying why it failed: the profiler is an optional
    step after the timed epochs, and its failure (an error, memory it could not have) never costs them. A peer
    still in the window's collectives is let go (it fails there too, and says so)."""
    try:
        return profile_window(run, job, shard, steps_per_epoch, walls, notes)
    except Exception as exc:  # noqa: BLE001 - recorded as a note; the measured epochs stand
        text = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
        kind = "ran out of memory" if is_out_of_memory(exc) else "failed"
        notes.append(
            f"the --profile window {kind} ({text}); the {len(walls)} timed epoch(s) before it are complete and "
            "unaffected, and the record has no profile"
        )
        if run.launch.world_size > 1:
            release_peers()
        return None


def tensor_peak_or_note(
    run: PreparedRun, job: TrainingJob, shard: DataShard, epochs: int, notes: list[str]
) -> dict[str, int] | None:
    """The live tensor peak of one untimed training step on this rank (:mod:`accelbench.engine.tensor_peak`), or
    None with a note saying why there is none: like the --profile window, an optional step whose failure never costs
    the timed epochs (a peer still in its collectives is let go). Every rank runs it (its collectives must meet)."""
    from accelbench.engine.tensor_peak import alive_before_step, measure_step_with, why_not_measurable

    executor, device, backend = run.executor, run.device, run.backend
    why = why_not_measurable(executor, run.config.compile)
    if why is not None:
        if run.launch.rank == 0:
            notes.append(f"no tensor peak: {why}")
        return None
    try:
        inputs, targets = next(job.data.batches(epochs, shard.index, shard.count))
        inputs, targets = inputs.to(device), targets.to(device)

        def step() -> (
            None
        ):  # as a timed step: the step's boundary after it (a lazy device runs its graph there)
            executor.train_step(inputs, targets)
            backend.end_of_step(device)

        alive = alive_before_step(executor)
        assert alive is not None  # checked by why_not_measurable
        peak = measure_step_with(step, [*alive, inputs, targets], device)
        backend.synchronize(device)
        caveat = executor.tensor_peak_caveat()
        if caveat is not None and run.launch.rank == 0:
            notes.append(f"tensor peak: {caveat}")
        return peak
    except Exception as exc:  # noqa: BLE001 - recorded as a note; the measured epochs stand
        text = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
        notes.append(
            f"the tensor-peak step failed ({text}); the timed epochs before it are complete and unaffected"
        )
        if run.launch.world_size > 1:
            release_peers()
        return None


def profile_window(
    run: PreparedRun,
    job: TrainingJob,
    shard: DataShard,
    steps_per_epoch: int,
    walls: list[float],
    notes: list[str] | None = None,
) -> StepProfile:
    """``--profile``: steady-state steps after the timed epochs under torch.profiler, on every rank (their
    collectives must meet); rank 0 keeps the breakdown and writes the trace (a temporary name until the record
    is written, then beside it). The window is cut to the steps the memory available can hold (every rank cuts
    it alike: rank 0's count, agreed where there is a process group), saying so in ``notes``."""
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
        available_bytes=_available_memory(),
        agree=lambda steps: fewest_over_ranks(steps, device, run.backend),
        bounded=notes.append if notes is not None and run.launch.rank == 0 else None,
    )


def _available_memory() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


def fewest_over_ranks(count: int, device: torch.device, backend: Backend) -> int:
    """The least of every rank's ``count`` (one tiny all-reduce where there is a process group; ``count`` itself
    where there is none), so that ranks deciding from it decide alike: a profiled window cut to the same steps
    everywhere, whose collectives still meet."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return count
    dtype = torch.float64 if "float64" in backend.collective_dtypes(device) else torch.float32
    value = torch.tensor([float(count)], dtype=dtype, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return int(value.item())


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
    config: RunConfig,
    host: PluginHost,
    progress: Progress | None = None,
    launch: LaunchEnv | None = None,
    checked: Preflight | None = None,
) -> tuple[ResultRecord | None, Path | None, Status]:
    """Prepare, measure and, on rank 0, write the result record (``checked``: this process's preflight of
    ``config``, when it made one already).

    Returns the record and its path on rank 0 (None, None on other ranks) and this process's outcome status.
    """
    TERMINATION.reset()
    run_ = prepare(config, host, launch, checked)
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
    """Measure, then (rank 0) write the record: the timed epochs are in a file before each optional step after them
    (the --profile window, the prediction) and the file is completed after it, each write atomic, so a step that
    fails leaves a note and one that ends the process (killed by the kernel's out-of-memory killer) leaves the
    epochs, with an outcome saying which step it ended in."""
    config, launch = run_.config, run_.launch
    system = collect_system_info(host.recorded_environment())
    created = datetime.now(timezone.utc)
    rank0 = launch.rank == 0
    records = _Records(run_, system, created, os.environ.get(RUN_ID_ENV) or uuid.uuid4().hex)
    shown: Progress = (progress or NoProgress()) if rank0 else NoProgress()
    try:
        m = measure(
            run_,
            shown,
            system.host,
            records.before_profile if rank0 else None,
        )
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
    with _record_owed():
        return _write_records(run_, records, m, logs, outcome, shown)


@contextlib.contextmanager
def _record_owed() -> Iterator[None]:
    """While the record is written (and the prediction made), Ctrl-C waits: a record is owed, and a
    KeyboardInterrupt half-way would lose it (SIGTERM is held off likewise, by :data:`TERMINATION`'s phase)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _write_records(
    run_: PreparedRun,
    records: _Records,
    m: Measurement,
    logs: list[RankLog],
    outcome: Outcome,
    progress: Progress,
) -> tuple[ResultRecord | None, Path | None, Status]:
    config = run_.config
    if m.notes:
        notes = "; ".join(m.notes)
        outcome = outcome.model_copy(
            update={"message": f"{outcome.message}; {notes}" if outcome.message else notes}
        )
    record = records.build(m, logs, outcome)
    if record.metrics is not None:  # the untimed step's live tensor peak, beside the backend's reading
        from accelbench.engine.tensor_peak import tensor_peak_of

        metrics = record.metrics.model_copy(update={"tensor_peak": tensor_peak_of(logs)})
        record = record.model_copy(update={"metrics": metrics})
    trace = None
    if m.profile is not None:
        trace = config.output_dir / m.profile.trace if m.profile.trace else None
        final = record_name(record).removesuffix(".json") + ".trace.json.gz"
        profile = m.profile.model_copy(update={"trace": final if trace and trace.exists() else None})
        record = record.model_copy(update={"profile": profile})
    if trace is not None and trace.exists() and record.profile and record.profile.trace:
        os.replace(trace, config.output_dir / record.profile.trace)  # beside the record, named after it
    if m.job:  # the prediction follows: the epochs (and the profile) are in the file first
        records.draft(record, "while the prediction of this configuration was being made")
        record = record.model_copy(
            update={"prediction": _prediction_or_note(run_, m, progress, record.outcome)}
        )
    path = write_record(record, config.output_dir)
    return record, path, record.outcome.status


def add_counts(total: list[list[int]] | None, more: list[list[int]]) -> list[list[int]]:
    """Step counts added element by element (epochs of a rank, or ranks of a job)."""
    if total is None:
        return [list(row) for row in more]
    return [[a + b for a, b in zip(x, y, strict=True)] for x, y in zip(total, more, strict=True)]


def workload_summary(job: TrainingJob, logs: list[RankLog]) -> dict[str, Any]:
    """The workload's summary for the record, with what its step counts say, summed over every rank that reported
    them (the moe's routing balance)."""
    if job.step_counts is None:
        return job.summary
    total: list[list[int]] | None = None
    for log in logs:
        if log.step_counts is not None:
            total = add_counts(total, log.step_counts)
    if total is None:
        return job.summary
    return {**job.summary, **job.step_counts.summarise(total)}


class _Records:
    """Rank 0's record of a run, built from what was measured, and its drafts: written before each optional step
    after the timed epochs, completed (replaced, atomically) after it."""

    def __init__(self, run_: PreparedRun, system: SystemInfo, created: datetime, run_id: str) -> None:
        self.run_, self.system, self.created, self.run_id = run_, system, created, run_id

    def build(self, m: Measurement, logs: list[RankLog], outcome: Outcome) -> ResultRecord:
        run_, config, launch = self.run_, self.run_.config, self.run_.launch
        job = m.job
        if job:
            run_.executor.add_rank_logs(logs)
        return ResultRecord(
            run_id=self.run_id,
            created_at=self.created,
            engine=config.engine,
            outcome=outcome,
            config=config,
            system=self.system,
            backend=run_.backend_record,
            precision=run_.executor.effective_precision(run_.request.precision),
            workload=workload_summary(job, logs) if job else {},
            workload_identity=identity_of(run_.workload, config),
            data=job.data.describe() if job else {},
            executor=run_.executor.describe() if job else {},
            plugins=run_.plugins,
            quality=m.quality,
            world_size=launch.world_size,
            nodes=launch.nnodes,
            launcher=launch.launcher,
            metrics=build_metrics(
                logs,
                WorkCounts(
                    job.flops_per_sample,
                    job.flops_formula,
                    job.tokens_per_sample,
                    job.megatron_flops_per_sample,
                ),
                run_.peak,
                run_.backend_record.devices_used,
                m.setup_s,
                m.compile_s,
                m.memory if m.log.epoch_wall_s else None,
                cores=usable_cores(),
                epochs_decision=m.plan.decision(
                    m.walls, ended_early=outcome.status != "ok" and not m.epochs_complete
                )
                if not (m.quality and m.quality.target and m.quality.target.reached)
                else f"{target_label(config)}: stopped when it was reached, after {len(m.walls)} epoch(s)",
            )
            if job
            else None,
        )

    def draft(self, record: ResultRecord, during: str) -> None:
        """Write ``record`` as it stands before an optional step, its outcome saying the process ended ``during``
        it: what the file says if nothing completes it. Best effort: a folder that cannot take it now is found
        again, and a copy kept elsewhere, by the final write."""
        held = len(record.metrics.epochs) if record.metrics is not None else 0
        ended = (
            f"the process ended {during}, after the timed epochs (killed, e.g. by the kernel's out-of-memory "
            "killer, or crashed): "
            + (f"the {held} epoch(s) here are complete" if held else "no epoch was completed")
            + "; this record was written before that step, to be completed after it"
        )
        given = record.outcome
        outcome = Outcome(
            status="error" if given.status == "ok" else given.status,
            message=f"{ended}; {given.message}" if given.message else ended,
            traceback=given.traceback,
        )
        write_draft(record.model_copy(update={"outcome": outcome}), self.run_.config.output_dir)

    def before_profile(self, m: Measurement) -> None:
        """``measure``'s checkpoint: the record of the timed epochs (every rank's as each published it after its
        last epoch), before the --profile window (or, without one, the tensor-peak step) runs."""
        world = self.run_.launch.world_size
        logs = [m.log]
        outcome = Outcome(status="ok")
        if world > 1:
            theirs = _published_logs(
                world, len(m.log.epoch_wall_s), min(self.run_.config.collective_timeout, 10.0)
            )
            if theirs is not None:
                logs += theirs
            else:
                outcome = Outcome(status="ok", message="metrics below are rank 0's only (a rank's epochs were not "
                                  "published in time)")  # fmt: skip
        during = PROFILE_WINDOW if self.run_.config.profile else TENSOR_PEAK_STEP
        self.draft(self.build(m, logs, outcome), f"during {during}")


def _published_logs(world_size: int, epochs: int, wait_s: float) -> list[RankLog] | None:
    """The other ranks' logs as each published it after its epochs (:func:`publish_progress`), once each has as
    many epochs as rank 0; None if some rank's have not arrived within ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        logs = [published_progress(r) for r in range(1, world_size)]
        if all(log is not None and len(log.epoch_wall_s) >= epochs for log in logs):
            return [log for log in logs if log is not None]
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def _prediction_or_note(
    run_: PreparedRun, m: Measurement, progress: Progress, outcome: Outcome
) -> RunPrediction:
    """The prediction stored in the record, or a note saying why there is none: it never costs the record, whatever
    it meets (an error in the model, Ctrl-C while it is made). What it measures for it (a calibration) is said
    through ``progress``, so ``--quiet`` keeps it quiet; after a run that did not end ok (interrupted, diverged,
    out of memory) nothing is measured: a cached calibration prices it, or none."""
    try:
        return predict_run(
            run_.config,
            m.facts,
            device_type=run_.backend.info.device_type,
            device=run_.backend_record.devices[0] if run_.backend_record.devices else None,
            peak=run_.peak,
            runtime_bytes=m.runtime_bytes,
            calibrated=CalibratedRun(
                run_.workload,
                run_.executor.effective_precision(run_.request.precision),
                run_.backend,
                run_.device,
                progress.note,
                no_measuring=None if outcome.status == "ok" else f"a run that ended {outcome.status}",
            ),
        )
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - the prediction is optional; the record is owed
        why = "interrupted (Ctrl-C)" if isinstance(exc, KeyboardInterrupt) else f"{type(exc).__name__}: {exc}"
        return RunPrediction.absent(f"it failed ({why[:300]})")


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
    """Whether ``exc`` is the device (or host) running out of memory: torch's OutOfMemoryError, or a library that
    could not allocate its own workspace on a full device. On an H100, gpt2-large one batch past the largest that
    fits ended with ``CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)``: the backward pass's
    first matmul on autograd's thread creates a cuBLAS handle, and its workspace no longer fits (cuDNN and
    hipBLAS say ``..._STATUS_ALLOC_FAILED`` likewise)."""
    oom_type = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError  # torch < 2.5
    if isinstance(exc, (oom_type, MemoryError)):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and (
        "out of memory" in text or "can't allocate memory" in text or "_status_alloc_failed" in text
    )
