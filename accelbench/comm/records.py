"""Collective bandwidth records: what one `accelbench comm` job measured, one self-describing JSON file per job.

The same family as the training result records (:mod:`accelbench.results`): a schema name and version of their
own (``"schema": "accelbench.comm"``, ``schema_version``), the same system, backend and launcher facts, written
atomically, validated on read, never pickled. A record holds one :class:`CommMeasurement` per collective x type
x variant x message size, including those that could not be measured (out of memory, unsupported, wrong result),
so a gap in a curve always says why.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any, Literal, TypeGuard

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from accelbench.comm.collectives import DtypeName, OpName, Variant, size_label
from accelbench.errors import ResultFileError
from accelbench.results import (
    BackendRecord,
    Outcome,
    _safe_name,
    load_record_json,
    save_record_text,
)
from accelbench.system import SystemInfo

COMM_SCHEMA_NAME = "accelbench.comm"
COMM_SCHEMA_VERSION = 1

MeasurementStatus = Literal["ok", "wrong", "oom", "unsupported", "error"]

TIMING = (
    "Per iteration: every rank joins a one-element all_reduce (aligning the ranks) and synchronises its device, "
    "reads the clock, runs the collective, synchronises its device and reads the clock again. An iteration's time "
    "is the slowest rank's; time_us is the median over the timed iterations (min and max beside it), after "
    "warm-up iterations that are not timed. algbw = size / time; busbw = algbw x bus_factor (nccl-tests)."
)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CommConfig(_Model):
    """What was asked of `accelbench comm` (the launch fields are checked as `accelbench run` checks them)."""

    backend: str | None = Field(default=None, description="Backend asked for (None: detection chose).")
    ops: list[OpName] = Field(min_length=1, description="Collectives measured, in the order measured.")
    dtypes: list[DtypeName] = Field(min_length=1, description="Element types measured.")
    sizes: list[int] = Field(
        min_length=1,
        description="Message sizes asked for, in bytes, ascending (see CommMeasurement.size_bytes).",
    )
    warmup: int = Field(ge=0, description="Untimed iterations before the timed ones, per size.")
    iters: int = Field(gt=0, description="Timed iterations per size.")
    check: bool = Field(description="Whether every result was checked against the expected values.")
    devices: int = Field(gt=0, description="Ranks (one device each) per node.")
    nnodes: int = Field(gt=0)
    collective_timeout: float = Field(gt=0, description="Seconds a rank waits for its peers.")
    threads: int | None = Field(default=None, description="torch intra-op threads per rank (CPU).")
    in_step_ms: list[float] = Field(
        default_factory=list,
        description="--in-step: the compute, in milliseconds, each rank runs before every in-step call (empty: "
        "the collectives were timed alone only).",
    )
    burst: int = Field(
        default=0,
        ge=0,
        description="--burst: calls issued back to back, none waited for until the last is issued (0: not "
        "measured); burst_us is a call's share of such a burst.",
    )
    output_dir: Path = Path("results")


IN_STEP_TIMING = (
    "In a step (--in-step): every rank joins the aligning all_reduce, then runs a fixed number of matrix products "
    "(about the compute asked for, the same count on every rank), synchronises, reads the clock, runs the "
    "collective, synchronises and reads the clock again; time_us is the mean over ranks and iterations of that "
    "call's time, which holds the wait for the slower rank, as a step's synchronous collective does."
)


class InStepTime(_Model):
    """A collective's time when it follows compute on every rank, as in a training step (``--in-step``)."""

    compute_ms: float = Field(gt=0, description="The compute before each call, measured: mean over ranks.")
    time_us: float = Field(ge=0, description="A call's time after it: mean over ranks and iterations.")
    alone_us: float | None = Field(
        default=None,
        description="The same call timed alone in this measurement (time_us of the measurement).",
    )


class CommMeasurement(_Model):
    """One collective at one message size, type and variant, over all ranks."""

    op: OpName
    dtype: DtypeName
    variant: Variant = Field(description="out-of-place (separate input and output) or in-place.")
    size_bytes: int = Field(
        description="The array's bytes as nccl-tests counts them (the whole array: all_gather's output, "
        "reduce_scatter's input), after rounding the size asked for to whole elements per rank."
    )
    count: int = Field(description="Elements of that array (size_bytes / type size).")
    requested_bytes: int = Field(description="The size asked for (--sizes, or --min-bytes..--max-bytes).")
    status: MeasurementStatus = Field(
        description="ok; wrong (the result differed from the expected values: no bandwidth is given); oom (the "
        "buffers did not fit); unsupported (the collective backend refused the collective or type); error."
    )
    message: str | None = None
    iters: int = 0
    time_us: float | None = Field(
        default=None, description="Median over iterations of the slowest rank's time."
    )
    time_us_min: float | None = None
    time_us_max: float | None = None
    algbw_gbps: float | None = Field(
        default=None, description="size_bytes / time_us, in GB/s (10^9 bytes/s)."
    )
    busbw_gbps: float | None = Field(default=None, description="algbw_gbps x bus_factor.")
    bus_factor: float = Field(description="nccl-tests' factor for this collective and rank count.")
    wrong: int | None = Field(
        default=None,
        description="Elements that differed from the expected result, summed over ranks; None: not checked.",
    )
    in_step: list[InStepTime] = Field(
        default_factory=list,
        description="The call's time after each --in-step compute (the out-of-place variant where both are "
        "offered; none where it was not asked for or the call failed).",
    )
    burst_us: float | None = Field(
        default=None,
        description="--burst N: a call's time within N calls issued back to back (async) and then waited for, as "
        "ZeRO-3 gathers its persistent tensors: the median over iterations of the slowest rank's burst, over N "
        "(the variant in_step is timed for; None where not asked for).",
    )


class CommRecord(_Model):
    """One `accelbench comm` job: what ran where, and every measurement."""

    schema_name: Literal["accelbench.comm"] = Field(default="accelbench.comm", alias="schema")
    schema_version: int = COMM_SCHEMA_VERSION
    run_id: str
    created_at: datetime
    outcome: Outcome = Field(
        description="ok; error (a wrong result, or a rank failed); interrupted (SIGTERM or Ctrl-C: the "
        "measurements completed before it are kept)."
    )
    config: CommConfig
    system: SystemInfo
    backend: BackendRecord
    plugins: dict[str, str]
    world_size: int = Field(description="Ranks in the job (one per device).")
    nodes: int = 1
    launcher: str = Field(default="none", description="torchrun (also --devices N), slurm, openmpi, mpich.")
    timing: str = Field(default=TIMING, description="How a time was measured, in words.")
    in_step_timing: str | None = Field(
        default=None, description="How an in-step time was measured (--in-step), in words."
    )
    measurements: list[CommMeasurement]

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2)


def summarise(measurements: list[CommMeasurement]) -> str | None:
    """What went wrong across ``measurements``, in one line (None when nothing did): wrong results first."""
    parts = []
    for status, what in (("wrong", "wrong results"), ("error", "errors"), ("oom", "out of memory"),
                         ("unsupported", "unsupported")):  # fmt: skip
        hit = [m for m in measurements if m.status == status]
        if hit:
            shown = ", ".join(
                f"{m.op} {m.dtype} {size_label(m.size_bytes)} {m.variant}"
                + (f" ({m.wrong} elements)" if status == "wrong" and m.wrong else "")
                for m in hit[:4]
            )
            parts.append(f"{what}: {shown}" + (f" and {len(hit) - 4} more" if len(hit) > 4 else ""))
    return "; ".join(parts) or None


def comm_record_name(record: CommRecord) -> str:
    """The file name of a comm record: time, host, backend, ``comm``, ranks and run id (the run id's first 8
    characters end it, as every record's name does, so a launcher finds its workers' record)."""
    stamp = record.created_at.strftime("%Y%m%dT%H%M%S")
    parts = (stamp, record.system.host, record.backend.info.name, "comm", f"{record.world_size}ranks",
             record.run_id[:8])  # fmt: skip
    return _safe_name("_".join(parts) + ".json")


def write_comm_record(record: CommRecord, directory: Path, path: Path | None = None) -> Path:
    """Write ``record`` atomically, as result records are written (a full disk: the fallback folder and
    :class:`~accelbench.results.RecordNotSaved`)."""
    return save_record_text(record.to_json(), path or directory / comm_record_name(record))


def is_comm_record(raw: object) -> TypeGuard[dict[str, Any]]:
    """Whether parsed JSON claims to be a comm record (its schema name), whatever else is wrong with it."""
    return isinstance(raw, dict) and raw.get("schema") == COMM_SCHEMA_NAME


def read_comm_record(path: Path) -> CommRecord:
    """Read and validate a comm record; raise :class:`ResultFileError` saying what is wrong with the file (too
    large, not JSON, nested too deeply, another schema, a newer version, invalid fields)."""
    raw = load_record_json(path, "comm record")
    if not is_comm_record(raw):
        raise ResultFileError(
            f'{path}: not an accelbench comm record (no "schema": "{COMM_SCHEMA_NAME}"); '
            "`accelbench comm` writes those"
        )
    return _validated(raw, path)


def comm_record_in(path: Path) -> CommRecord | None:
    """The comm record in ``path``, for a reader of many kinds of files (``compare``): None when the file does not
    claim to be one (another record, other JSON, or a file that cannot be read or parsed: the reader that tried it
    first says why); a :class:`ResultFileError` when it claims to be one and is not."""
    try:
        raw = load_record_json(path, "comm record")
    except ResultFileError:
        return None
    return _validated(raw, path) if is_comm_record(raw) else None


def _validated(raw: dict[str, Any], path: Path) -> CommRecord:
    version = raw.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ResultFileError(f"{path}: schema_version missing or not an integer")
    if version > COMM_SCHEMA_VERSION:
        raise ResultFileError(
            f"{path}: written with comm schema v{version}, newer than this accelbench reads "
            f"(v{COMM_SCHEMA_VERSION}); upgrade accelbench"
        )
    try:
        return CommRecord.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in exc.errors()[:5]
        )
        more = f" (and {exc.error_count() - 5} more)" if exc.error_count() > 5 else ""
        raise ResultFileError(f"{path}: invalid comm record: {problems}{more}") from exc


__all__ = [
    "COMM_SCHEMA_NAME",
    "COMM_SCHEMA_VERSION",
    "TIMING",
    "CommConfig",
    "CommMeasurement",
    "CommRecord",
    "IN_STEP_TIMING",
    "InStepTime",
    "comm_record_in",
    "comm_record_name",
    "is_comm_record",
    "read_comm_record",
    "summarise",
    "write_comm_record",
]
