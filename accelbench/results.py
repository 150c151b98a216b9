"""Result records: one self-describing JSON file per run, with a versioned schema, validated on read.

JSON (never pickle) because result files come from other machines; one file per run because that suits shared
HPC file systems (no locking). Files are written atomically: a reader never sees half a record.
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from accelbench.config import RunConfig
from accelbench.devices import BackendInfo, DeviceInfo, MemoryStats, PeakFigures
from accelbench.errors import ResultFileError
from accelbench.precision import PrecisionPlan
from accelbench.system import SystemInfo

SCHEMA_NAME = "accelbench.result"
SCHEMA_VERSION = 2  # 2: workload options and identity, energy; v1 records are migrated on read (migrate)

Status = Literal["ok", "oom", "error", "interrupted"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Outcome(_Model):
    status: Status
    message: str | None = None
    traceback: str | None = None


class EpochMetrics(_Model):
    """One epoch, aggregated over ranks: wall time of the slowest rank, samples of all ranks."""

    epoch: int = Field(description="0-based; epoch 0 is the warm-up.")
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


class RankMetrics(_Model):
    rank: int
    host: str
    epoch_wall_s: list[float]
    epoch_samples: list[int]
    peak_memory_bytes: int | None


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
        description="achieved FLOP/s / (peak FLOP/s x devices); None when the peak is unknown."
    )
    joules_per_sample: float | None = Field(default=None, description="Median over the steady epochs.")
    samples_per_joule: float | None = None


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
    stragglers: list[int] = Field(default_factory=list, description="Ranks >10% slower than the median rank.")
    flops_per_sample: float
    flops_formula: str
    peak: PeakFigures | None
    energy_source: str | None = Field(default=None, description="The energy counter, or None when unknown.")


class BackendRecord(_Model):
    info: BackendInfo
    distribution: str | None
    version: str | None
    devices: list[DeviceInfo]
    devices_used: int
    collective_backend: str | None
    runtime_versions: dict[str, str]


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

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2)


def write_record(record: ResultRecord, directory: Path, path: Path | None = None) -> Path:
    """Write ``record`` atomically (temporary file in the same directory, fsync, rename) and return its path.

    The file is named after the run (time, host, backend, model, precision, run id) unless ``path`` is given.
    """
    directory.mkdir(parents=True, exist_ok=True)
    if path is None:
        c = record.config
        stamp = record.created_at.strftime("%Y%m%dT%H%M%S")
        parts = (stamp, record.system.host, record.backend.info.name, c.model, c.precision, record.run_id[:8])
        path = directory / _safe_name("_".join(parts) + ".json")
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(record.to_json())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_record(path: Path) -> ResultRecord:
    """Read and validate a result file; raise :class:`ResultFileError` saying what is wrong with it."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ResultFileError(f"{path}: cannot read: {exc}") from exc
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ResultFileError(f"{path}: not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from exc
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


# v1 kept the GPT's options as core config fields
_V1_GPT_FIELDS = ("n_layer", "n_head", "n_embd", "block_size", "dropout", "vocab_multiple")
_V1_GPT_DEFAULTS = {"block_size": 128, "dropout": 0.1}


def migrate(raw: dict[str, Any]) -> dict[str, Any]:
    """A parsed record brought to the current schema version (a copy; current records come back as they are).

    v1 -> v2: the GPT's ``n_layer``/``n_head``/``n_embd``/``block_size``/``dropout``/``vocab_multiple`` config fields
    move into ``config.workload_options``; ``workload_identity`` is rebuilt from them (v1 runs had no vocabulary
    padding unless recorded).
    """
    if raw.get("schema_version") != 1:
        return raw
    raw = dict(raw)
    config = dict(raw.get("config") or {})
    options = dict(config.get("workload_options") or {})
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
    workload = raw.get("workload") or {}
    dims = [workload.get(k, options.get(k)) for k in ("n_layer", "n_head", "n_embd")]
    model = config.get("model", "gpt-nano")
    raw["workload_identity"] = {
        "model": f"custom {dims[0]}L/{dims[1]}H/{dims[2]}E" if model == "custom" else model,
        "block_size": options["block_size"],
        "dropout": options["dropout"],
        "vocab_multiple": options["vocab_multiple"],
    }
    raw["schema_version"] = SCHEMA_VERSION
    return raw


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a result record (``accelbench schema`` prints it)."""
    return ResultRecord.model_json_schema(by_alias=True)


def _safe_name(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in name)
