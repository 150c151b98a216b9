"""What compare keeps of a result record: the fields it uses, validated, in a small summary per run.

Validating a whole record (every epoch, rank, device and option) costs far more than reading it, and keeping whole
records makes memory grow with the number of files; at 100,000 records both matter. :class:`RecordView` is the
part of the result schema (:mod:`accelbench.results`) that compare and report read, with the same types, so a file
whose fields compare uses are missing or of the wrong type is still refused; fields it does not use are not
looked at. :class:`RunSummary` is what is kept of each run: the workload key, system facts and environment are
shared between runs that have the same (interned), so compare holds about 1 KB per run (142 MiB at 100,000 runs,
benchmarks/compare_scale.py).
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from accelbench.compare.environment import Environment, environment_of
from accelbench.compare.keys import WorkloadKey
from accelbench.config import RunConfig
from accelbench.references import Reference, reference_for
from accelbench.references import load as load_references
from accelbench.results import SCHEMA_NAME, SCHEMA_VERSION, Status

# What no measurement gives: a record with figures beyond these was made or edited by hand, and is skipped with the
# field named rather than ranked. Far above any real figure: an epoch, a compile or a step of ~4 months (10^7 s), a
# million times the fastest training throughput seen (10^15 samples or tokens a second), an exbibyte of memory.
MAX_MEASURED_S = 1e7
MAX_RATE_PER_S = 1e15
MAX_BYTES = 2**60
MAX_JOULES_PER_SAMPLE = 1e9

Scalar = str | int | float | bool


class _View(BaseModel):
    # the fields compare reads are checked; anything else in the record is not its business. No figure accelbench
    # writes is infinite or NaN (they are written as null), so a file holding one was made or edited by hand.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class _Outcome(_View):
    status: Status
    message: str | None = None


def _as_in_run_config(name: str) -> Any:
    """A configuration field as :class:`RunConfig` declares it: the same default and bounds."""
    return RunConfig.model_fields[name]


class _ConfigView(_View):
    """The configuration fields compare reads, with RunConfig's own defaults and bounds."""

    workload: str = _as_in_run_config("workload")
    model: str = _as_in_run_config("model")
    batch_size: int = _as_in_run_config("batch_size")
    precision: str = _as_in_run_config("precision")
    strategy: str = _as_in_run_config("strategy")
    data: str | None = None  # a path; only its file name is compared
    steps_per_epoch: int | None = _as_in_run_config("steps_per_epoch")
    learning_rate: float = _as_in_run_config("learning_rate")
    compile: bool = _as_in_run_config("compile")
    activation_checkpointing: bool = _as_in_run_config("activation_checkpointing")
    threads: int | None = _as_in_run_config("threads")
    backend_options: dict[str, Scalar] = _as_in_run_config("backend_options")
    mesh: str | None = _as_in_run_config("mesh")
    placement: str = _as_in_run_config("placement")
    pp_schedule: str = _as_in_run_config("pp_schedule")
    microbatches: int | None = _as_in_run_config("microbatches")
    virtual_stages: int | None = _as_in_run_config("virtual_stages")
    sequence_parallel: bool = _as_in_run_config("sequence_parallel")
    eval_batches: int = _as_in_run_config("eval_batches")


class _System(_View):
    host: str
    os: str
    python: str
    cpu_model: str
    torch_version: str
    torch_cuda: str | None
    torch_hip: str | None
    torch_threads: int
    accelbench_version: str
    scheduler: str | None
    job_id: str | None
    environment: dict[str, str]
    numa_nodes: dict[str, str] = Field(default_factory=dict)


class _BackendInfo(_View):
    name: str
    device_unit: str


class _Device(_View):
    name: str
    details: dict[str, str] = Field(default_factory=dict)  # vendor extras: driver, clocks, power limit, ...


class _Backend(_View):
    info: _BackendInfo
    distribution: str | None
    version: str | None
    devices: list[_Device]
    devices_used: int = Field(gt=0)
    collective_backend: str | None
    runtime_versions: dict[str, str]


class _Precision(_View):
    name: str
    param_dtype: str
    autocast_dtype: str | None
    loss_scaling: Literal["dynamic", "none"] = "none"
    matmul_math: str


class _Epoch(_View):
    wall_s: float = Field(gt=0, le=MAX_MEASURED_S)  # a measured epoch takes time
    steps: int = Field(default=0, ge=0)
    samples_per_s: float = Field(ge=0, le=MAX_RATE_PER_S)
    tokens_per_s: float = Field(ge=0, le=MAX_RATE_PER_S)
    joules_per_sample: float | None = Field(default=None, ge=0, le=MAX_JOULES_PER_SAMPLE)


class _Steady(_View):
    mfu: float | None
    mfu_error: str | None = None
    megatron_tflops_per_device: float | None = None


class _Source(_View):
    source: str


class _Host(_View):
    contended: bool
    waiting: float | None = None
    steal: float | None = None
    threshold: float = 0.10


class _Peak(_View):
    source: str
    conditions: dict[str, str] = Field(default_factory=dict)  # e.g. the enforced power limit and max SM clock


class _TensorPeak(_View):
    peak_bytes: int = Field(ge=0, le=MAX_BYTES)


class _Slowest(_View):
    rank: int
    host: str
    cause: str
    excess_s_per_step: float = Field(ge=0, le=MAX_MEASURED_S)


class _Metrics(_View):
    compile_s: float | None = Field(ge=0, le=MAX_MEASURED_S)
    epochs: list[_Epoch]
    warmup: _Epoch | None
    steady: _Steady | None
    memory: _Source | None
    peak_memory_max_bytes: int | None = Field(ge=0, le=MAX_BYTES)
    peak: _Peak | None
    host: _Host | None = None
    tensor_peak: _TensorPeak | None = None  # absent in records from before it was measured
    slowest_rank: _Slowest | None = None  # absent in records from before stragglers were named


class _Profile(_View):
    step_s: float = Field(gt=0, le=MAX_MEASURED_S)
    seconds: dict[str, float]


class _Prediction(_View):
    step_time_s: float | None = None
    comm_exposed_s: float | None = None
    peak_memory_bytes: float | None = None
    memory_bytes: dict[str, float | None] = Field(default_factory=dict)


class _EpochQuality(_View):
    val_loss: float | None = None


class _Target(_View):
    loss: float = Field(gt=0)
    name: str | None = None
    reached: bool
    epoch: int | None = Field(default=None, gt=0)
    time_to_target_s: float | None = Field(default=None, ge=0, le=MAX_MEASURED_S)
    steps: int | None = Field(default=None, ge=0)
    samples: int | None = Field(default=None, ge=0)
    energy_j: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    message: str = ""


class _Quality(_View):
    epochs: list[_EpochQuality] = Field(default_factory=list)
    target: _Target | None = None


def _quality(view: RecordView) -> dict[str, Any]:
    """The held-out loss, the target and, where a shipped reference has the run's recipe, its parity with it."""
    quality = view.quality
    if quality is None:
        return {}
    measured = [q.val_loss for q in quality.epochs if q.val_loss is not None]
    target = quality.target
    reached = target if target and target.reached else None
    figures: dict[str, float | None] = {
        "val_loss": measured[-1] if measured else None,
        "target_loss": target.loss if target else None,
        "time_to_target_s": reached.time_to_target_s if reached else None,
        "target_epoch": reached.epoch if reached else None,
        "target_steps": reached.steps if reached else None,
        "target_samples": reached.samples if reached else None,
        "target_energy_j": reached.energy_j if reached else None,
    }
    reference = reference_for(
        view.config.model_dump(), dict(view.workload_identity), view.world_size, shipped_references()
    )
    losses = [q.val_loss for q in quality.epochs]
    loss = reference.verdict(losses) if reference else None
    outside = reference.outside_epochs(losses) if reference else None
    if reference is not None and loss is not None and outside is not None:
        low, high = reference.band()
        figures.update(
            reference_val_loss=loss,
            reference_low=low,
            reference_high=high,
            outside_reference=1.0 if outside else 0.0,  # the trajectory test: any epoch outside its band
            reference_first_outside=float(outside[0]) if outside else None,
        )
    return figures


def _reference_model(view: RecordView) -> str | None:
    """The model whose shipped reference the run is tested against, where it is (its trajectory measured)."""
    if view.quality is None:
        return None
    reference = reference_for(
        view.config.model_dump(), dict(view.workload_identity), view.world_size, shipped_references()
    )
    if reference is None or reference.outside_epochs([q.val_loss for q in view.quality.epochs]) is None:
        return None
    return reference.model


@functools.cache
def shipped_references() -> dict[str, Reference]:
    """The shipped references by model name, read once."""
    return load_references()


class RecordView(_View):
    """The fields of a current-version result record that compare and report use."""

    schema_name: Literal[SCHEMA_NAME] = Field(alias="schema")  # type: ignore[valid-type]
    schema_version: Literal[SCHEMA_VERSION]  # type: ignore[valid-type]  # older versions are migrated first
    run_id: str
    created_at: datetime
    engine: str = "native"
    outcome: _Outcome
    config: _ConfigView
    system: _System
    backend: _Backend
    precision: _Precision | None
    workload: dict[str, Any]
    workload_identity: dict[str, str | int | float | bool | None] = Field(default_factory=dict)
    executor: dict[str, Any]
    plugins: dict[str, str]
    world_size: int = Field(default=1, gt=0)
    nodes: int = Field(default=1, gt=0)
    launcher: str = "none"
    metrics: _Metrics | None
    profile: _Profile | None = None
    prediction: _Prediction | None = None
    quality: _Quality | None = None


@dataclass(frozen=True, slots=True)
class SystemFacts:
    """What a system label can be made of (see :data:`accelbench.compare.keys.SYSTEM_FIELDS`); shared by the runs
    of one system."""

    host: str
    backend: str
    device: str
    device_unit: str
    threads: int | None
    compile: bool
    activation_checkpointing: bool
    engine: str
    backend_options: tuple[tuple[str, Scalar], ...]
    job_id: str | None
    cpu: str
    torch: str
    accelbench: str


def _mfu(steady: _Steady | None) -> float | None:
    """A record's MFU as a figure: above 100% (a record written before accelbench refused such values) it is the
    wrong peak, not a measurement, and is left out like an error."""
    if steady is None or steady.mfu is None or steady.mfu > 1.0:
        return None
    return steady.mfu


@dataclass(frozen=True, slots=True)
class RunFigures:
    """A run's measurements, as compare pools them: every steady epoch (after the warm-up) is one measurement."""

    epoch_s: tuple[float, ...]
    samples_per_s: tuple[float, ...]
    tokens_per_s: tuple[float, ...]
    joules_per_sample: tuple[float | None, ...]
    peak_memory_bytes: int | None
    mfu: float | None
    compile_s: float | None
    warmup_s: float | None
    mfu_error: bool = False  # MFU above 100%: the record's peak was wrong; never shown as a figure
    contended: bool = False  # the host was busy while it ran: its figures understate the system
    megatron_tflops_per_device: float | None = None  # achieved TFLOP/s per device, Megatron's count
    routing_imbalance: float | None = (
        None  # a mixture of experts: tokens of the busiest expert / the mean (1 = even)
    )
    bubble: float | None = None  # a pipeline's measured idle fraction (executor.pipeline.bubble)
    bubble_analytical: float | None = None  # ... and the schedule's analytical bubble
    step_split: tuple[tuple[str, float], ...] | None = None  # run --profile: seconds per category of a step
    step_s: float | None = None  # measured: the steady epochs' median over an epoch's steps
    predicted_step_s: float | None = (
        None  # the analytical model's, stored in the record (accelbench estimate)
    )
    predicted_comm_s: float | None = None  # ... its exposed communication per step
    predicted_peak_bytes: float | None = None  # ... its peak memory per device
    tensor_peak_bytes: int | None = None  # measured: one untimed step's live tensor peak (largest rank's)
    predicted_tensor_bytes: float | None = None  # the prediction's tensors (its peak less its runtime share)
    val_loss: float | None = None  # the held-out loss after the last epoch (quality.epochs)
    target_loss: float | None = None  # --target-loss, where one was asked
    time_to_target_s: float | None = None  # ... the training time until it was reached (None: not reached)
    target_name: str | None = None  # ... its name (--target NAME)
    target_message: str | None = None  # ... the record's sentence: when it was reached, or that it was not
    target_epoch: float | None = (
        None  # ... where reached: the epoch, optimizer steps, samples (all ranks) and
    )
    target_steps: float | None = None  # device energy (where the counter read every epoch) it took
    target_samples: float | None = None
    target_energy_j: float | None = None
    # parity with the shipped reference trajectory of the same recipe (accelbench.references), where there is one:
    reference_val_loss: float | None = None  # the run's held-out loss after the reference's last epoch
    reference_low: float | None = None  # ... and the reference's band for it
    reference_high: float | None = None
    outside_reference: float | None = None  # 1.0 when some epoch's loss is outside its band, 0.0 when none is
    reference_first_outside: float | None = None  # ... the first epoch outside
    reference_model: str | None = None  # ... the reference tested against (for the test over several seeds)
    # the rank that held the others up and why (metrics.slowest_rank), in words
    slowest_rank: str | None = None
    usd_per_mtok: tuple[float | None, ...] = ()  # --prices: $ per million tokens, per steady epoch
    usd_per_run: float | None = None  # --prices: $ for the run's timed epochs


@dataclass(frozen=True, slots=True)
class RunSummary:
    """One run as compare sees it: where it came from, what ran where, how it ended, and its figures."""

    file: str
    run_id: str
    created_at: datetime
    status: str
    message: str | None
    model_name: str  # the size name asked for (``custom``, ``gpt2``); ``key.model`` is the display name
    key: WorkloadKey
    devices: int
    system: SystemFacts
    environment: Environment
    parameters: float | None
    figures: RunFigures | None  # None when the run measured nothing (e.g. out of memory while building)
    node_facts: Environment = ()  # what else sets a node apart (compare --fleet): driver, clocks, contention

    @property
    def path(self) -> Path:
        return Path(self.file)

    @property
    def ok(self) -> bool:
        """Succeeded with measurements: the runs whose figures count."""
        return self.status == "ok" and self.figures is not None


class Interner:
    """One shared copy of each equal value (workload keys, system facts, environments) across the runs read."""

    def __init__(self) -> None:
        self._pool: dict[Any, Any] = {}

    def __call__(self, value: Any) -> Any:
        return self._pool.setdefault(value, value)


def _bubble(executor: dict[str, Any]) -> dict[str, Any]:
    """A pipeline's measured and analytical bubble from the record's executor facts (none for other runs)."""
    pipeline = executor.get("pipeline")
    bubble = pipeline.get("bubble") if isinstance(pipeline, dict) else None
    bubble = bubble if isinstance(bubble, dict) else {}
    measured, analytical = bubble.get("measured"), bubble.get("analytical")
    return {
        "bubble": _fraction(measured),
        "bubble_analytical": _fraction(analytical),
    }


def _fraction(value: Any) -> float | None:
    """A share read from free-form facts: a finite number, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _routing_imbalance(workload: dict[str, Any]) -> float | None:
    """A mixture of experts' routing balance (``workload.routing.imbalance``: max / mean tokens over the experts),
    or None: none recorded, or not a figure a count gives (below 1, not finite)."""
    routing = workload.get("routing")
    value = _fraction(routing.get("imbalance")) if isinstance(routing, dict) else None
    return value if value is not None and value >= 1 else None


def _predicted(prediction: _Prediction | None) -> dict[str, Any]:
    if prediction is None:
        return {}
    peak = prediction.peak_memory_bytes
    return {
        "predicted_step_s": prediction.step_time_s,
        "predicted_comm_s": prediction.comm_exposed_s,
        "predicted_peak_bytes": peak,
        "predicted_tensor_bytes": peak - (prediction.memory_bytes.get("runtime") or 0.0)
        if peak is not None
        else None,
    }


def _slowest(slowest: _Slowest | None) -> str | None:
    """``rank 1 (node7): data loading, +201.7 ms a step``."""
    if slowest is None:
        return None
    return f"rank {slowest.rank} ({slowest.host}): {slowest.cause}, +{slowest.excess_s_per_step * 1e3:.1f} ms a step"


# device details that name one device, not how it is set up: they differ on every node by design
_IDENTITY_DETAILS = ("uuid", "serial", "pci", "bus", "index", "minor")


def node_facts(view: RecordView) -> Environment:
    """What a node's record says beyond :func:`environment_of` that can make one node slower than its peers: the
    device's driver, clocks and power limit (its vendor details and the peak's conditions), the NUMA layout and
    how busy the host was (its contention)."""
    facts: dict[str, str] = {}
    devices = view.backend.devices
    if devices:
        for name, value in devices[0].details.items():
            if not any(part in name.lower() for part in _IDENTITY_DETAILS):
                facts[f"device {name}"] = value
    metrics = view.metrics
    if metrics is not None and metrics.peak is not None:
        for name, value in metrics.peak.conditions.items():
            facts[f"device {name}"] = value
    if view.system.numa_nodes:
        facts["NUMA nodes"] = str(len(view.system.numa_nodes))
    if metrics is not None and metrics.host is not None:
        waiting = metrics.host.waiting  # a quiet host's few percent vary by node: only contention is a fact
        steal = metrics.host.steal or 0.0
        said = [f"threads waited for a core {waiting:.0%} of the time"] if waiting is not None else []
        said += (
            [f"the hypervisor stole {steal:.0%} of the cores' time"]
            if steal >= metrics.host.threshold
            else []
        )
        share = f" ({'; '.join(said)})" if said else ""
        facts["host contention"] = "contended" + share if metrics.host.contended else "quiet"
    return tuple(sorted(facts.items()))


def summarize(view: RecordView, file: str, intern: Interner) -> RunSummary:
    """The summary of one validated record."""
    c, s, b = view.config, view.system, view.backend
    metrics = view.metrics
    figures = None
    if metrics is not None:
        steady = metrics.epochs[1:]  # the first epoch is the warm-up
        figures = RunFigures(
            epoch_s=tuple(e.wall_s for e in steady),
            samples_per_s=tuple(e.samples_per_s for e in steady),
            tokens_per_s=tuple(e.tokens_per_s for e in steady),
            joules_per_sample=tuple(e.joules_per_sample for e in steady),
            peak_memory_bytes=metrics.peak_memory_max_bytes,
            mfu=_mfu(metrics.steady),
            mfu_error=_mfu(metrics.steady) is None
            and metrics.steady is not None
            and (metrics.steady.mfu_error is not None or (metrics.steady.mfu or 0) > 1),
            compile_s=metrics.compile_s,
            warmup_s=metrics.warmup.wall_s if metrics.warmup else None,
            contended=bool(metrics.host and metrics.host.contended),
            megatron_tflops_per_device=metrics.steady.megatron_tflops_per_device if metrics.steady else None,
            routing_imbalance=_routing_imbalance(view.workload),
            **_bubble(view.executor),
            step_split=tuple(view.profile.seconds.items()) if view.profile else None,
            step_s=statistics.median(e.wall_s for e in steady) / metrics.epochs[-1].steps
            if steady and metrics.epochs[-1].steps
            else None,
            tensor_peak_bytes=metrics.tensor_peak.peak_bytes if metrics.tensor_peak else None,
            slowest_rank=_slowest(metrics.slowest_rank),
            **_predicted(view.prediction),
            **_quality(view),
            reference_model=_reference_model(view),
            target_name=view.quality.target.name if view.quality and view.quality.target else None,
            target_message=view.quality.target.message if view.quality and view.quality.target else None,
        )
    system = SystemFacts(
        host=s.host,
        backend=b.info.name,
        device=b.devices[0].name if b.devices else "no device",
        device_unit=b.info.device_unit,
        threads=c.threads,
        compile=c.compile,
        activation_checkpointing=c.activation_checkpointing,
        engine=view.engine,
        backend_options=tuple(sorted(c.backend_options.items())),
        job_id=s.job_id,
        cpu=s.cpu_model,
        torch=s.torch_version,
        accelbench=s.accelbench_version,
    )
    parameters = view.workload.get("parameters")
    parameters = parameters if _fraction(parameters) is not None else None
    return RunSummary(
        file=file,
        run_id=view.run_id,
        created_at=view.created_at,
        status=view.outcome.status,
        message=view.outcome.message,
        model_name=intern(c.model),
        key=intern(WorkloadKey.from_fields(vars(c), view.workload_identity)),
        devices=b.devices_used,
        system=intern(system),
        environment=intern(environment_of(view)),
        parameters=float(parameters) if isinstance(parameters, (int, float)) and parameters else None,
        figures=figures,
        node_facts=intern(node_facts(view)),
    )
