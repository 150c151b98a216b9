"""Result records: one self-describing JSON file per run, with a versioned schema, validated on read.

JSON (never pickle) because result files come from other machines; one file per run because that suits shared
HPC file systems (no locking). Files are written atomically: a reader never sees half a record.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from accelbench.config import RunConfig
from accelbench.contract import BackendInfo, DeviceInfo, MemoryStats, PeakFigures, PrecisionPlan
from accelbench.errors import AccelbenchError, ConfigError, ResultFileError
from accelbench.system import SystemInfo

if TYPE_CHECKING:
    from accelbench.estimate.schema import Prediction

SCHEMA_NAME = "accelbench.result"
SCHEMA_VERSION = 2  # 2: workload options and identity, energy, host load, epochs from 1; v1 records are migrated on read (migrate)

# diverged: a loss that is not finite, a gradient norm exploding or a loss not decreasing (accelbench.engine.quality)
Status = Literal["ok", "oom", "error", "interrupted", "diverged"]

# a diverged run's sentence (accelbench.engine.quality) is DIVERGED + what was found + STOPPED + why its speed does not
# count: diverged_cause reads what was found back
DIVERGED = "training diverged: "
STOPPED = "; the run stopped at the end of that epoch"


def diverged_cause(message: str) -> str:
    """What a numerics check found, from the sentence it recorded (``quality.problem``, ``outcome.message``): the
    NaN/inf loss and its step, the gradient norm and the limit, or the stalled loss and its epochs, without the
    part every diverged run shares. A sentence of another form is returned whole."""
    cause = message.removeprefix(DIVERGED)
    return cause.split(STOPPED, 1)[0] if STOPPED in cause else cause


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Outcome(_Model):
    status: Status
    message: str | None = None
    traceback: str | None = None


class EpochMetrics(_Model):
    """One epoch, aggregated over ranks: wall time of the slowest rank, samples of all ranks."""

    epoch: int = Field(description="Counted from 1, as everywhere in accelbench; epoch 1 is the warm-up.")
    wall_s: float
    steps: int
    samples: int
    tokens: int
    samples_per_s: float
    tokens_per_s: float
    loss: float | None = Field(description="Mean training loss over the epoch's steps (rank 0).")
    peak_memory_bytes: int | None = Field(description="Max over ranks of the backend's peak for this epoch.")
    telemetry: dict[str, float] = Field(
        default_factory=dict,
        description="Rank 0's device readings after the epoch (power, utilisation, PCIe).",
    )
    energy_j: float | None = Field(
        default=None,
        description="Joules over the epoch from the devices' own energy counters, each counter once (summed over "
        "ranks); None when any rank had no readable counter.",
    )
    joules_per_sample: float | None = None
    samples_per_joule: float | None = None
    energy_above_idle_j: float | None = Field(
        default=None,
        description="energy_j less what the counters draw idle over the epoch (Metrics.idle.watts x wall_s): the "
        "training's own energy; None without an idle baseline for every counter (or an older record).",
    )
    joules_per_sample_above_idle: float | None = None
    cpu_s: float | None = Field(
        default=None, description="CPU seconds the ranks' processes used over the epoch (summed over ranks)."
    )
    cpu_wait_s: float | None = Field(
        default=None,
        description="Seconds the ranks' threads were ready to run but waited for a core (the kernel's schedstat "
        "run delay, summed over ranks); None where the kernel keeps no schedstat.",
    )
    load_avg: float | None = Field(
        default=None, description="The 1-minute load average at the epoch's end (max over hosts)."
    )
    steal: float | None = Field(
        default=None,
        description="Of the ranks' usable cores' time, the share a virtual machine's hypervisor gave to other guests "
        "(Linux's /proc/stat steal; max over ranks; 0 on bare metal); None where unknown.",
    )


class HostContention(_Model):
    """How busy the host was while the run measured, and whether that makes its figures suspect."""

    waiting: float | None = Field(
        description="Of the time the run's threads were ready to run, the fraction they waited for a core "
        "(median over the steady epochs, or over all epochs without steady ones); None where unknown."
    )
    load_avg: float | None = Field(description="Highest 1-minute load average seen at an epoch's end.")
    steal: float | None = Field(
        default=None,
        description="Of the run's cores' time, the share a virtual machine's hypervisor gave to other guests (median "
        "over the epochs as for waiting); None where unknown.",
    )
    cores: int = Field(description="Cores the run's processes may use (affinity), on rank 0's host.")
    contended: bool = Field(description="True when the figures are suspect: waiting or steal >= threshold.")
    contended_epochs: list[int] = Field(
        default_factory=list, description="Epochs whose own waiting or steal fraction reached the threshold."
    )
    threshold: float = Field(
        description="The waiting (or steal) fraction from which a host counts as contended."
    )
    note: str = Field(description="The finding in words.")


class OperatorTime(_Model):
    """One operator's share of a profiled step (seed 001's table 6)."""

    name: str
    category: str = Field(description="kernel or intra-op dispatch (see StepProfile).")
    seconds: float = Field(description="Seconds per step.")
    share: float = Field(description="Fraction of the profiled step.")


class StepProfile(_Model):
    """Where a step's time goes (``run --profile``): a window of steps profiled after the timed epochs, split into
    categories that sum to the step (definitions: accelbench/engine/profile/analysis.py and docs/profile.md)."""

    steps: int = Field(description="Steps analysed (after the profiler's own warm-up steps).")
    window: str = Field(description="Which steps were profiled, in words.")
    step_s: float = Field(description="Mean wall time of a profiled step (with the profiler's overhead).")
    timed_step_s: float | None = Field(
        description="Mean step time of the timed steady epochs, for the profiler's overhead."
    )
    seconds: dict[str, float] = Field(
        description="Mean seconds per step: data, optimizer, communication (exposed), kernel, intra-op dispatch, "
        "inter-op dispatch. They sum to step_s."
    )
    overlapped_communication_s: float | None = Field(
        description="Communication hidden behind computation, per step (not part of the sum); None where unseen."
    )
    top_operators: list[OperatorTime]
    trace: str | None = Field(description="The gzipped Chrome trace beside the record (opens in Perfetto).")
    source: str
    device_timeline: dict[str, float] | None = Field(
        default=None,
        description="CUDA/ROCm only: Holistic Trace Analysis's reading of the trace: span_s, idle_s, compute_s, "
        "non_compute_s (per step) with their fractions of span_s, comm_comp_overlap_pct, steps (docs/profile.md).",
    )
    device_timeline_source: str | None = Field(
        default=None, description="Who computed device_timeline (HTA and its version), or why it is absent."
    )


class RunPrediction(_Model):
    """The analytical model's prediction for the run's own configuration (``accelbench estimate``'s, made from the
    built model, the device's peak and, with ``--comm-records``, the collectives' measured bus bandwidth), stored
    beside what was measured. Figures are per device and step; None where the model lacks what it needs (the
    ``note`` says what)."""

    step_time_s: float | None = Field(description="compute + optimizer + exposed communication.")
    compute_s: float | None = Field(description="FLOPs / (peak x efficiency), with the pipeline bubble.")
    optimizer_s: float | None = None
    comm_s: float | None = Field(description="The collectives' time at their bus bandwidth.")
    comm_exposed_s: float | None = Field(description="The part of comm_s not hidden behind compute.")
    engine_s: float | None = Field(
        default=None,
        description="DeepSpeed ZeRO-3 on a CPU, calibrated: its engine's hooks and bookkeeping, in the step time.",
    )
    samples_per_s: float | None = Field(description="Samples per second of the whole job.")
    peak_memory_bytes: float | None = Field(
        description="Peak memory of one device: the largest phase of a step (forward, backward, optimizer) plus "
        "the runtime."
    )
    memory_bytes: dict[str, float | None] = Field(
        default_factory=dict,
        description="The memory by kind: weights, gradients, optimizer, activations, transients, buffers, ...; the "
        "peak is the largest phase's, not their sum.",
    )
    peak_phase: str | None = Field(
        default=None, description="The phase of a step whose high point is the peak."
    )
    comm_bytes_per_step: float | None = Field(
        description="Bus bytes one device moves per step (nccl-tests' convention)."
    )
    flops_per_step: float | None = None
    peak_flops_per_s: float | None = None
    peak_source: str | None = None
    efficiency: float | None = Field(default=None, description="Assumed fraction of the peak a step reaches.")
    time_model: str | None = Field(
        default=None,
        description="How compute_s and optimizer_s were made: at the efficiency, or calibrated (this device's "
        "cached calibration over the step's traced operators).",
    )
    overlap: str | None = None
    bandwidth_source: str | None = None
    rates_source: str | None = Field(
        default=None,
        description="Where the step's rates came from: 'measured here' (this device's calibration) or 'efficiency' "
        "(FLOPs at a fraction of the peak); None in older records.",
    )
    error_band: str | None = Field(
        default=None, description="The step-time error measured for predictions from that source, in words."
    )
    note: str | None = Field(default=None, description="What the prediction lacks, or why there is none.")

    @classmethod
    def from_prediction(cls, p: Prediction, bandwidth_source: str | None = None) -> RunPrediction:
        """The record's part of ``accelbench estimate``'s :class:`~accelbench.estimate.schema.Prediction` ``p``,
        its memory breakdown by kind, with a ``note`` naming what it could not predict (and what to give for it).
        ``bandwidth_source`` says where the collectives' bus bandwidth came from, if anywhere."""
        missing = []
        if p.peak_flops_per_s is None:
            missing.append("no peak FLOP/s for this device (give --peak-tflops)")
        if p.comm and p.comm_s is None:
            missing.append(
                "communication time unknown: give --comm-records (from `accelbench comm` on this system)"
            )
        if p.peak_memory_bytes is None:
            missing.append("no activation-memory formula for this workload")
        breakdown = p.memory
        memory: dict[str, float | None] = {
            "weights": breakdown.weights_bytes,
            "master weights": breakdown.master_weights_bytes,
            "gradients": breakdown.gradients_bytes,
            "optimizer": breakdown.optimizer_bytes,
            "activations": breakdown.activations_bytes,
            "transient": breakdown.transient_bytes,
            "buffers": breakdown.buffer_bytes,
            "start of backward": breakdown.backward_transient_bytes,
            "optimizer step": breakdown.optimizer_transient_bytes,
            "runtime": breakdown.runtime_bytes,
        }
        return cls(
            step_time_s=p.step_time_s,
            compute_s=p.compute_s,
            optimizer_s=p.optimizer_s,
            comm_s=p.comm_s,
            comm_exposed_s=p.comm_exposed_s,
            engine_s=p.engine_s,
            samples_per_s=p.samples_per_s,
            peak_memory_bytes=p.peak_memory_bytes,
            memory_bytes=memory,
            peak_phase=p.peak_phase,
            comm_bytes_per_step=p.comm_bytes_per_step,
            flops_per_step=p.flops_per_step,
            peak_flops_per_s=p.peak_flops_per_s,
            peak_source=p.peak_source,
            efficiency=p.efficiency,
            time_model=p.time_model,
            overlap=p.overlap,
            bandwidth_source=bandwidth_source,
            rates_source=p.rates_source,
            error_band=p.error_band,
            note="; ".join(missing) or None,
        )

    @classmethod
    def absent(cls, why: str) -> RunPrediction:
        """No prediction, and why: every figure unknown."""
        unknown: dict[str, Any] = dict.fromkeys(
            ("step_time_s", "compute_s", "comm_s", "comm_exposed_s", "samples_per_s", "peak_memory_bytes",
             "comm_bytes_per_step")
        )  # fmt: skip
        return cls(**unknown, note=f"no prediction: {why}")


class TensorPeak(_Model):
    """The live tensor peak of one untimed training step after the timed epochs (``MemTracker``; see
    :mod:`accelbench.engine.tensor_peak`): the tensors alone, which is what the analytical model predicts, beside
    the backend's reading (on a CPU the process's resident set, which holds the interpreter and libraries too)."""

    peak_bytes: int = Field(description="The largest rank's peak of live tensor bytes on its device.")
    mean_bytes: float = Field(description="The mean over the ranks that measured one.")
    ranks: list[int | None] = Field(description="Each rank's peak, by rank (None: that rank measured none).")
    by_kind: dict[str, int] = Field(
        default_factory=dict,
        description="The largest rank's peak by kind (parameters, buffers, gradients, activations, temporaries, "
        "optimizer, other), at the moment of its peak: they add up to peak_bytes.",
    )
    rank: int = Field(default=0, description="The rank whose peak is peak_bytes (and whose by_kind this is).")
    source: str = Field(description="How it was measured, and what it does not see.")


class IdleCounter(_Model):
    """One energy counter over the idle window (each counter once, as for the epochs' energy)."""

    domain: str = Field(
        description="The counter, as the epochs' energy names it (e.g. rapl:host:intel-rapl:0)."
    )
    joules: float = Field(description="What it counted over the window.")
    watts: float | None = Field(
        description="joules / window; None when the counter did not advance (its idle draw is unknown, not 0)."
    )


class IdleBaseline(_Model):
    """The energy counters read over a short window before training with nothing running (--idle-baseline-s):
    what the node draws anyway, so that the epochs' energy can be split into idle and training."""

    window_s: float = Field(description="The window's length, seconds (the longest over ranks).")
    watts: float | None = Field(
        description="Summed over the counters; None when one of them has no idle figure (did not advance, or a "
        "counter of the epochs was not read in the window)."
    )
    counters: list[IdleCounter] = Field(default_factory=list)
    problems: list[str] = Field(
        default_factory=list, description="Why a counter has no idle figure, in words."
    )


class RankMetrics(_Model):
    rank: int
    host: str
    epoch_wall_s: list[float]
    epoch_samples: list[int]
    peak_memory_bytes: int | None
    epoch_steps: list[int] = Field(default_factory=list, description="Steps per epoch on this rank.")
    data_wait_s: list[float] = Field(
        default_factory=list,
        description="Per epoch: seconds this rank spent getting its batches (the loader and the copy to the device).",
    )
    first_collective_s: list[float | None] = Field(
        default_factory=list,
        description="Per epoch: the median step's seconds from its start to this rank's first gradient all-reduce "
        "(DDP; None: no collective was timed).",
    )
    collective_wait_s: list[float | None] = Field(
        default_factory=list,
        description="Per epoch: seconds this rank sat in gradient all-reduces after its own backward was done, "
        "mostly waiting for slower ranks (DDP; None: not timed for this strategy).",
    )
    energy_j: list[float | None] = Field(
        default_factory=list,
        description="Per epoch: this rank's share of the energy. A counter of its own device is its own; a node's "
        "counter (RAPL), read once per node, is shared over the node's ranks by their CPU seconds (equally where "
        "those are unknown). None: no readable counter.",
    )


class SlowestRank(_Model):
    """The rank that held the others up, from each rank's data wait and collective wait per step."""

    rank: int
    host: str
    cause: Literal["data loading", "compute"]
    excess_s_per_step: float = Field(description="Its own work per step above the other ranks' median.")
    note: str = Field(description="What each part took on it and on the others, in words.")


class SteadyState(_Model):
    """Epochs after the first. Throughput is the median of the per-epoch figures."""

    epochs: int
    epoch_s_median: float
    epoch_s_min: float
    epoch_s_max: float
    samples_per_s: float
    tokens_per_s: float
    achieved_flops_per_s: float
    mfu: float | None = Field(
        description="achieved FLOP/s / (peak FLOP/s x devices); None when the peak is unknown, or when the ratio "
        "came out above 1 (mfu_error says so: a peak below what was achieved is the wrong peak, not a figure).",
    )
    mfu_error: str | None = Field(
        default=None,
        description="Why mfu is None although a peak was known: the ratio exceeded 100%, so the peak cannot be this "
        "device's for the math that ran (e.g. a sparse or another device's figure, or FLOPs overcounted).",
    )
    joules_per_sample: float | None = Field(default=None, description="Median over the steady epochs.")
    samples_per_joule: float | None = None
    joules_per_sample_above_idle: float | None = Field(
        default=None,
        description="Median over the steady epochs of the energy above the idle baseline per sample.",
    )
    megatron_tflops_per_device: float | None = Field(
        default=None,
        description="Achieved TFLOP/s per device by Megatron-LM's FLOPs count (Metrics.megatron_flops_per_sample x "
        "samples/s / devices / 1e12), as Megatron papers report it; None for workloads without that count.",
    )


class Metrics(_Model):
    compile_s: float | None = Field(
        description="Seconds in the executor's compile step; None if it has none."
    )
    setup_s: float = Field(description="Model build, placement and optimizer set-up, seconds.")
    epochs: list[EpochMetrics]
    warmup: EpochMetrics | None = Field(description="The first epoch (includes lazy initialisation).")
    steady: SteadyState | None = Field(description="None with fewer than 2 completed epochs.")
    ranks: list[RankMetrics]
    memory: MemoryStats | None = Field(description="Rank 0's reading for the last epoch: source and total.")
    peak_memory_max_bytes: int | None
    peak_memory_mean_bytes: float | None
    tensor_peak: TensorPeak | None = Field(
        default=None,
        description="The live tensor peak of one untimed step after the timed epochs, beside the backend's reading "
        "(None: not measured, e.g. --no-tensor-peak, or a record from before it existed).",
    )
    stragglers: list[int] = Field(default_factory=list, description="Ranks >10% slower than the median rank.")
    slowest_rank: SlowestRank | None = Field(
        default=None,
        description="The rank whose own work (step time less collective wait) exceeded the others' by more than 10% "
        "of a step, and what made it slow; None when no rank stands out or with one rank.",
    )
    flops_per_sample: float
    flops_formula: str
    flop_convention: str | None = Field(
        default=None,
        description="What the FLOPs count (model FLOPs, not hardware FLOPs: what a recomputation or padding adds is "
        "left out); MFU and achieved FLOP/s are in this convention.",
    )
    megatron_flops_per_sample: float | None = Field(
        default=None,
        description="One sample's training FLOPs by Megatron-LM's count, 72 s l h^2 (1 + s/6h + V/12lh) for a "
        "transformer without activation recomputation (seed 002); None for other workloads.",
    )
    peak: PeakFigures | None
    energy_source: str | None = Field(default=None, description="The energy counter, or None when unknown.")
    idle: IdleBaseline | None = Field(
        default=None,
        description="Idle power before training (None: skipped with --idle-baseline-s 0, no energy counter, or a "
        "record from before it existed).",
    )
    energy_problems: list[str] = Field(
        default_factory=list,
        description="Energy counters that misbehaved: one that did not advance over an epoch of 0.5 s or more, or "
        "one that jumped (more than 5 kW implied); those epochs' energy is unknown (null).",
    )
    epochs_decision: str | None = Field(
        default=None,
        description="How the number of epochs was decided: fixed by --epochs, or (--epochs auto) when the steady "
        "epoch time was stable within the tolerance, or the limit was reached.",
    )
    host: HostContention | None = Field(default=None, description="How busy the host was during the run.")


class BackendRecord(_Model):
    info: BackendInfo
    distribution: str | None
    version: str | None
    devices: list[DeviceInfo]
    devices_used: int
    collective_backend: str | None
    runtime_versions: dict[str, str]


class EpochQuality(_Model):
    """What was checked after one timed epoch, outside its time (:mod:`accelbench.engine.quality`)."""

    epoch: int = Field(description="Counted from 1, as in metrics.epochs.")
    val_loss: float | None = Field(
        default=None,
        description="Mean loss over the held-out batches, weighted by samples over every rank (None: not measured).",
    )
    val_accuracy: float | None = Field(
        default=None, description="Share of held-out predictions right, where the workload defines one."
    )
    val_samples: int = Field(default=0, description="Held-out samples evaluated, all ranks together.")
    eval_s: float = Field(
        default=0.0,
        description="Seconds the evaluation and gradient probe took on rank 0: never part of the epoch's time.",
    )
    grad_norm: float | None = Field(
        default=None,
        description="Total L2 norm of the gradients of one probe batch after the epoch (before any clipping).",
    )


class TargetResult(_Model):
    """--target-loss or --target: when the validation loss first reached the target, or that it did not."""

    loss: float = Field(description="The target: a validation loss at or below it counts as reached.")
    name: str | None = Field(
        default=None, description="--target NAME, where the target was named (e.g. ref-epoch4); else null."
    )
    reached: bool
    epoch: int | None = Field(default=None, description="The epoch it was reached in (counted from 1).")
    time_to_target_s: float | None = Field(
        default=None,
        description="Sum of the timed epoch times (rank 0's) up to and including that epoch, evaluation excluded.",
    )
    steps: int | None = Field(default=None, description="Optimizer steps to it (rank 0's).")
    samples: int | None = Field(default=None, description="Samples trained on to it, all ranks together.")
    energy_j: float | None = Field(
        default=None, description="Device energy to it, where the counter gave every epoch's (rank 0's)."
    )
    message: str = Field(description="A sentence saying when it was reached, or that it was not in N epochs.")


class QualityRecord(_Model):
    """Is it training right: held-out loss per epoch, the target, and what the numerics checks found."""

    eval_batches: int = Field(description="Held-out batches per rank per epoch (0: validation off).")
    validation: str | None = Field(
        default=None, description="How the held-out split was chosen, or why there is no validation loss."
    )
    epochs: list[EpochQuality] = Field(default_factory=list)
    target: TargetResult | None = None
    problem: str | None = Field(
        default=None,
        description="What the numerics checks found (a loss not finite, a gradient norm exploding, a loss not "
        "decreasing), with the epoch and step; the run's status is then 'diverged'.",
    )


class ResultRecord(_Model):
    schema_name: Literal["accelbench.result"] = Field(default="accelbench.result", alias="schema")
    schema_version: int = SCHEMA_VERSION
    run_id: str
    created_at: datetime
    engine: str = Field(default="native", description="'native' (accelbench's loop) or 'lightning' (Fabric).")
    outcome: Outcome
    config: RunConfig
    system: SystemInfo
    backend: BackendRecord
    precision: PrecisionPlan | None
    workload: dict[str, Any]
    workload_identity: dict[str, str | int | float | bool | None] = Field(
        default_factory=dict,
        description="What, beside the core's batch size, precision, strategy and data, makes two runs the same work "
        "(the workload's identity: compare groups by it).",
    )
    data: dict[str, Any]
    executor: dict[str, Any]
    plugins: dict[str, str]
    world_size: int = Field(
        default=1, description="Processes in the job (one per device, or one for an IPU host)."
    )
    nodes: int = 1
    launcher: str = Field(default="none", description="none, torchrun, slurm, openmpi, mpich.")
    metrics: Metrics | None
    profile: StepProfile | None = Field(default=None, description="run --profile: where a step's time goes.")
    quality: QualityRecord | None = Field(
        default=None, description="Held-out loss, --target-loss and the numerics checks (docs/results.md)."
    )
    prediction: RunPrediction | None = Field(
        default=None,
        description="The analytical model's prediction for this configuration (accelbench estimate).",
    )

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2)


MAX_RECORD_BYTES = 64 * 2**20  # a record is kilobytes; a file far larger is not one, and is not read whole
# a sweep's own folder in its output folder: each point's RunConfig (JSON, not a record), which compare passes over
POINTS_FOLDER = ".accelbench-points"
FALLBACK_ENV = "ACCELBENCH_FALLBACK_DIR"  # where a record goes when its output folder cannot take it


class PredictionCheck(BaseModel):
    """A record's prediction against what it measured: per-device step time and peak memory, and the relative
    error of each (predicted / measured - 1); a figure is None where either side is unknown."""

    model_config = ConfigDict(frozen=True)

    predicted_step_s: float | None
    measured_step_s: float | None
    step_error: float | None
    predicted_peak_bytes: float | None
    measured_peak_bytes: float | None
    memory_error: float | None
    note: str | None = None
    memory_basis: Literal["tensors", "reading"] = (
        "reading"  # what the peak pair compares (see check_prediction)
    )
    error_band: str | None = None  # the step's band for its rates' source, in words


def check_prediction(record: ResultRecord) -> PredictionCheck | None:
    """Predicted against measured for ``record``, or None where it has no prediction. The measured step is the
    steady epochs' median time over the steps of an epoch (the last epoch's count); the measured peak the largest
    rank's. Where the record has a measured tensor peak, the peaks compared are tensors against tensors (the
    prediction less its ``runtime`` share, which stands for what a CPU's resident set holds besides tensors, against
    :class:`TensorPeak`; ``memory_basis`` 'tensors'); else the whole prediction against the backend's reading."""
    p, m = record.prediction, record.metrics
    if p is None or m is None:
        return None
    measured_step = None
    if m.steady is not None and m.epochs and m.epochs[-1].steps:
        measured_step = m.steady.epoch_s_median / m.epochs[-1].steps
    measured_peak: float | None = m.peak_memory_max_bytes
    predicted_peak = p.peak_memory_bytes
    basis: Literal["tensors", "reading"] = "reading"
    if m.tensor_peak is not None:
        basis, measured_peak = "tensors", m.tensor_peak.peak_bytes
        predicted_peak = predicted_tensor_bytes(p)

    def error(predicted: float | None, measured: float | None) -> float | None:
        return predicted / measured - 1.0 if predicted is not None and measured else None

    return PredictionCheck(
        predicted_step_s=p.step_time_s,
        measured_step_s=measured_step,
        step_error=error(p.step_time_s, measured_step),
        predicted_peak_bytes=predicted_peak,
        measured_peak_bytes=measured_peak,
        memory_error=error(predicted_peak, measured_peak),
        note=p.note,
        memory_basis=basis,
        error_band=p.error_band if p.step_time_s is not None else None,
    )


def predicted_tensor_bytes(p: RunPrediction) -> float | None:
    """The tensors of a prediction's peak: the peak less its ``runtime`` share (what the backend's reading counted
    before the model existed), the figure a measured tensor peak compares with."""
    if p.peak_memory_bytes is None:
        return None
    return p.peak_memory_bytes - (p.memory_bytes.get("runtime") or 0.0)


class RecordNotSaved(AccelbenchError):
    """The record could not be written where asked (a full disk, a vanished folder). Nothing measured is lost:
    ``text`` is the whole record, and ``saved`` is where a copy was kept instead, if anywhere."""

    def __init__(self, message: str, text: str, saved: Path | None) -> None:
        super().__init__(message)
        self.text = text
        self.saved = saved


def record_name(record: ResultRecord) -> str:
    """The file name of a record: time, host, backend, model, precision and run id."""
    c = record.config
    stamp = record.created_at.strftime("%Y%m%dT%H%M%S")
    parts = (stamp, record.system.host, record.backend.info.name, c.model, c.precision, record.run_id[:8])
    return _safe_name("_".join(parts) + ".json")


def write_record(record: ResultRecord, directory: Path, path: Path | None = None) -> Path:
    """Write ``record`` atomically (temporary file in the same directory, fsync, rename) and return its path.

    The file is named by :func:`record_name` unless ``path`` is given. If the folder cannot take it (a full disk),
    no partial file is left; the record is written to the fallback folder instead (``$ACCELBENCH_FALLBACK_DIR``, else
    ``<tmp>/accelbench-unsaved``) and :class:`RecordNotSaved` says where, carrying the record's text.
    """
    return save_record_text(record.to_json(), path or directory / record_name(record))


def write_draft(record: ResultRecord, directory: Path) -> Path | None:
    """Write ``record`` atomically where :func:`write_record` will write its final form (the same name), before an
    optional step that could end the process; that write replaces it. Nothing is kept elsewhere when the folder
    cannot take it (None): the final write finds that again and keeps its copy in the fallback folder."""
    try:
        path = directory / record_name(record)
        _write_atomically(record.to_json(), path)
    except OSError:
        return None
    return path


def save_record_text(text: str, target: Path) -> Path:
    """Write a record's JSON ``text`` to ``target`` atomically, or to the fallback folder raising
    :class:`RecordNotSaved` (how :func:`write_record` writes; ``accelbench comm`` records are written so too)."""
    try:
        _write_atomically(text, target)
    except OSError as exc:
        saved: Path | None = fallback_dir() / target.name
        try:
            _write_atomically(text, fallback_dir() / target.name)
        except OSError:
            saved = None
        where = f"a copy is in {saved}" if saved else "and no fallback folder could take it either"
        raise RecordNotSaved(
            f"the result record could not be written to {target} ({exc.strerror or exc}); {where}; the record "
            "is also printed on stdout",
            text,
            saved,
        ) from exc
    return target


def fallback_dir() -> Path:
    """Where a record goes when its output folder cannot take it: ``$ACCELBENCH_FALLBACK_DIR``, else
    ``<tmp>/accelbench-unsaved``."""
    return Path(os.environ.get(FALLBACK_ENV) or Path(tempfile.gettempdir()) / "accelbench-unsaved")


def _write_atomically(text: str, path: Path) -> None:
    """Temporary file beside ``path``, fsync, rename: a reader never sees half a record, and a failed write
    leaves nothing behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_output(data: bytes, path: Path) -> None:
    """Write a file the user named (a report, a comparison): atomically where it is a regular file or new (a reader
    never sees half of it, and a failed write leaves the old one), straight into it where it is a device or pipe
    (/dev/null, /dev/stdout), which a rename would replace with a file. Raises OSError."""
    try:
        special = not stat.S_ISREG(os.stat(path).st_mode)
    except FileNotFoundError:
        special = False
    if special:
        with open(path, "wb") as fh:
            fh.write(data)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_writable(directory: Path, flag: str = "--output-dir") -> None:
    """Refuse, before anything is measured or drawn, a folder that cannot take files (a file, no permission, /proc)."""
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"{flag} {directory}: is a file, not a folder; give a folder")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".accelbench-write-test-", dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(
            f"{flag} {directory}: files cannot be written there ({exc.strerror or exc}); choose a writable folder"
        ) from None


def read_record(path: Path) -> ResultRecord:
    """Read and validate a result file; raise :class:`ResultFileError` saying what is wrong with it."""
    raw = load_record_json(path)
    if not isinstance(raw, dict) or raw.get("schema") != SCHEMA_NAME:
        raise ResultFileError(f'{path}: not an accelbench result record (no "schema": "{SCHEMA_NAME}")')
    version = raw.get("schema_version")
    if not isinstance(version, int):
        raise ResultFileError(f"{path}: schema_version missing or not an integer")
    if version > SCHEMA_VERSION:
        raise ResultFileError(
            f"{path}: written with result schema v{version}, newer than this accelbench reads "
            f"(v{SCHEMA_VERSION}); upgrade accelbench"
        )
    try:
        return ResultRecord.model_validate(migrate(raw))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in exc.errors()[:5]
        )
        more = f" (and {exc.error_count() - 5} more)" if exc.error_count() > 5 else ""
        raise ResultFileError(f"{path}: invalid result record: {problems}{more}") from exc


def read_record_bytes(path: Path | str, what: str = "result record") -> bytes:
    """The bytes of a record file, read the careful way (files come from other machines): only a regular file is
    opened (a pipe, a device such as /dev/zero, a folder or a loop of links is not a record, and reading some could
    block or never end), and at most :data:`MAX_RECORD_BYTES` of it; anything else is a :class:`ResultFileError`."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            kind = (
                "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file (a device, pipe or socket)"
            )
            raise ResultFileError(f"{path}: {kind}, not a {what}; give a record file")
        with open(path, "rb") as fh:
            data = fh.read(MAX_RECORD_BYTES + 1)
    except OSError as exc:
        raise ResultFileError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if len(data) > MAX_RECORD_BYTES:
        size = max(len(data), info.st_size)
        raise ResultFileError(f"{path}: {size} bytes or more, far too large to be a {what}")
    return data


def load_record_json(path: Path, what: str = "result record") -> Any:
    """The parsed JSON of a record file (:func:`read_record_bytes`): unreadable, non-JSON or too deeply nested text,
    or a number too long for Python to convert, is a :class:`ResultFileError`."""
    data = read_record_bytes(path, what)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ResultFileError(
            f"{path}: not JSON (not UTF-8 text: {exc.reason} at byte {exc.start})"
        ) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ResultFileError(f"{path}: not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from exc
    except RecursionError:
        raise ResultFileError(f"{path}: not a {what}: its JSON is nested too deeply to read") from None
    except ValueError as exc:  # a number of more digits than Python converts (int_max_str_digits)
        raise ResultFileError(f"{path}: not a {what}: {str(exc).split(';')[0]}") from None


# v1 kept the GPT's options as core config fields
_V1_GPT_FIELDS = ("n_layer", "n_head", "n_embd", "block_size", "dropout", "vocab_multiple")
_V1_GPT_DEFAULTS = {"block_size": 128, "dropout": 0.1}


def migrate(raw: dict[str, Any]) -> dict[str, Any]:
    """A parsed record brought to the current schema version (a copy; current records come back as they are).

    v1 -> v2: epochs are numbered from 1 (v1 counted from 0); the GPT's ``n_layer``/``n_head``/``n_embd``/``block_size``/``dropout``/``vocab_multiple`` config fields
    move into ``config.workload_options``; ``workload_identity`` is rebuilt from them (v1 runs had no vocabulary
    padding unless recorded).
    """
    if raw.get("schema_version") != 1:
        return raw
    raw = dict(raw)
    if not isinstance(
        raw.get("config"), dict
    ):  # not a v1 record's shape: left for validation to say what is wrong
        return raw
    config = dict(raw["config"])
    given = config.get("workload_options")
    options = dict(given) if isinstance(given, dict) else {}
    for name in _V1_GPT_FIELDS:
        if name in config:
            value = config.pop(name)
            if value is not None:
                options[name] = value
    for name, default in _V1_GPT_DEFAULTS.items():
        options.setdefault(name, default)
    options.setdefault("vocab_multiple", 1)
    config["workload_options"] = options
    raw["config"] = config
    given_workload = raw.get("workload")
    workload: dict[str, Any] = given_workload if isinstance(given_workload, dict) else {}
    dims = [workload.get(k, options.get(k)) for k in ("n_layer", "n_head", "n_embd")]
    model = config.get("model", "gpt-nano")
    raw["workload_identity"] = {
        "model": f"custom {dims[0]}L/{dims[1]}H/{dims[2]}E" if model == "custom" else model,
        "block_size": options["block_size"],
        "dropout": options["dropout"],
        "vocab_multiple": options["vocab_multiple"],
    }
    metrics = raw.get("metrics")
    if isinstance(metrics, dict):
        metrics = raw["metrics"] = dict(metrics)
        for key in ("epochs", "warmup"):
            entries = metrics.get(key)
            if isinstance(entries, list):
                metrics[key] = [_renumbered(e) for e in entries]
            elif isinstance(entries, dict):
                metrics[key] = _renumbered(entries)
    raw["schema_version"] = SCHEMA_VERSION
    return raw


def _renumbered(epoch: Any) -> Any:
    if isinstance(epoch, dict) and isinstance(epoch.get("epoch"), int):
        return {**epoch, "epoch": epoch["epoch"] + 1}
    return epoch


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a result record (``accelbench schema`` prints it)."""
    return ResultRecord.model_json_schema(by_alias=True)


def _safe_name(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in name)
