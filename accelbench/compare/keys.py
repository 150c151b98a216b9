"""Who ran and what ran: system labels, the workload key, and the axes a comparison can run along.

- a *system* is a label made from each record (by default host, backend, device model, and the thread, compile,
  activation checkpointing and engine settings when they are not the defaults); ``--label-by`` chooses the fields, e.g. ``dir`` for results
  copied into one folder per system.
- a *workload* is everything that defines the work of a run (:class:`WorkloadKey`). The device count is not part
  of it: the same workload at several device counts is a scaling series.
- an *axis* is one field of the workload key (``precision``, ``batch_size``, an identity entry such as
  ``block_size``); ``--vs AXIS`` puts the values of that field side by side instead of in separate groups.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from accelbench.contract import PRECISIONS, STRATEGIES
from accelbench.errors import AccelbenchError

if TYPE_CHECKING:
    from accelbench.compare.summary import RunSummary

# --------------------------------------------------------------------------------------------------------------
# Systems
# --------------------------------------------------------------------------------------------------------------


def _folder(r: RunSummary) -> str:
    parent = os.path.dirname(r.file) or "."
    return os.path.basename(parent) or parent


# field name -> its part of a system label (None: the field adds nothing for this record)
SYSTEM_FIELDS: dict[str, Callable[[RunSummary], str | None]] = {
    "host": lambda r: r.system.host,
    "backend": lambda r: r.system.backend,
    "device": lambda r: r.system.device,
    "threads": lambda r: f"threads={r.system.threads}" if r.system.threads else None,
    "compile": lambda r: "compile" if r.system.compile else None,
    "checkpointing": lambda r: "activation checkpointing" if r.system.activation_checkpointing else None,
    "engine": lambda r: f"engine={r.system.engine}" if r.system.engine != "native" else None,
    "options": lambda r: " ".join(f"{k}={v}" for k, v in r.system.backend_options) or None,
    "devices": lambda r: f"x{r.devices}",
    "dir": _folder,
    "job": lambda r: f"job {r.system.job_id}" if r.system.job_id else None,
    "cpu": lambda r: r.system.cpu,
    "torch": lambda r: f"torch {r.system.torch}",
    "accelbench": lambda r: f"accelbench {r.system.accelbench}",
}
DEFAULT_LABEL_BY = ("host", "backend", "device", "threads", "compile", "checkpointing", "engine")


def parse_label_by(text: str) -> tuple[str, ...]:
    """``host,backend,device`` -> the field names, each checked against :data:`SYSTEM_FIELDS`."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in SYSTEM_FIELDS]
    if unknown or not names:
        raise AccelbenchError(
            f"--label-by {text!r}: unknown field(s) {', '.join(map(repr, unknown)) or '(none given)'}; "
            f"choose from: {', '.join(SYSTEM_FIELDS)}"
        )
    return names


def system_label(r: RunSummary, label_by: Sequence[str] = DEFAULT_LABEL_BY) -> str:
    """The system a record belongs to: the chosen fields' values joined with `` · ``."""
    parts = [SYSTEM_FIELDS[name](r) for name in label_by]
    return " · ".join(p for p in parts if p) or "unlabelled"


class SystemLabeller:
    """:func:`system_label` for many records: records of one system share their facts (and folder), so each
    distinct combination is labelled once, which matters at 100,000 records."""

    def __init__(self, label_by: Sequence[str] = DEFAULT_LABEL_BY) -> None:
        self.label_by = tuple(label_by)
        self._by_dir = "dir" in self.label_by
        self._labels: dict[tuple[Any, ...], str] = {}

    def __call__(self, r: RunSummary) -> str:
        memo = (r.system, r.devices, os.path.dirname(r.file) if self._by_dir else None)
        label = self._labels.get(memo)
        if label is None:
            label = self._labels[memo] = system_label(r, self.label_by)
        return label


# --------------------------------------------------------------------------------------------------------------
# Workloads
# --------------------------------------------------------------------------------------------------------------

Value = str | int | float | bool | None


@dataclass(frozen=True)
class WorkloadKey:
    """What makes two runs the same work, so they are comparable across systems: the core's part (workload, size
    name, batch, precision, strategy, data, step cap, learning rate) and the workload's own identity (recorded in
    ``workload_identity``: the GPT's layers, width, context length, dropout, ...)."""

    workload: str
    model: str
    batch_size: int
    precision: str
    strategy: str
    data: str
    steps_per_epoch: int | None
    learning_rate: float
    identity: tuple[tuple[str, Value], ...]
    # tensor/pipeline parallelism (accelbench.engine.parallel), None without: the mesh (sequence parallelism and a
    # given placement marked), the pipeline's schedule (stages per rank marked) and microbatches
    mesh: str | None = None
    pp_schedule: str | None = None
    microbatches: int | None = None

    @classmethod
    def of(cls, record: Any) -> WorkloadKey:
        """The key of a validated record (a :class:`~accelbench.results.ResultRecord`)."""
        return cls.from_fields(vars(record.config), record.workload_identity)

    @classmethod
    def from_fields(cls, config: Mapping[str, Any], workload_identity: Mapping[str, Value]) -> WorkloadKey:
        """The key from a record's ``config`` fields and its ``workload_identity``."""
        data = config.get("data")
        identity = dict(workload_identity)
        return cls(
            workload=config["workload"],
            model=str(identity.pop("model", config["model"])),
            batch_size=config["batch_size"],
            precision=config["precision"],
            strategy=config["strategy"],
            # by file name, not path: the same corpus sits under different paths on different systems
            data=str(data).rstrip("/").rsplit("/", 1)[-1] if data else "generated",
            steps_per_epoch=config.get("steps_per_epoch"),
            learning_rate=config["learning_rate"],
            identity=tuple(sorted(identity.items())),
            **parallel_layout(config),
        )

    def value(self, axis: str) -> Value:
        """This key's value on ``axis`` (a core field, or an identity entry: None when the workload has none)."""
        if axis in CORE_AXES:
            return getattr(self, axis)
        return dict(self.identity).get(axis)

    def without(self, axis: str) -> tuple[Any, ...]:
        """Everything but ``axis``: what runs compared along that axis share (hashable, for grouping)."""
        core = tuple((name, getattr(self, name)) for name in CORE_AXES if name != axis)
        return (*core, tuple((k, v) for k, v in self.identity if k != axis))

    def describe(self, axis: str | None = None) -> str:
        """One line naming the workload; with ``axis``, that field is left out (it varies within the group)."""
        parts = {
            "model": f"{self.workload} {self.model}",
            "batch_size": f"batch {self.batch_size}",
            "precision": self.precision,
            "strategy": self.strategy,
            "data": f"data {self.data}",
            "steps_per_epoch": f"{self.steps_per_epoch} steps/epoch"
            if self.steps_per_epoch
            else "full epochs",
            "learning_rate": f"lr {self.learning_rate:g}",
        }
        parts.update({k: f"{k} {format_value(v)}" for k, v in self.identity})
        if self.mesh is not None:
            parts["mesh"] = f"mesh {self.mesh}"
        if self.pp_schedule is not None:
            parts["pp_schedule"] = f"{self.pp_schedule} schedule"
        if self.microbatches is not None:
            parts["microbatches"] = f"{self.microbatches} microbatches"
        if axis == "model":
            parts["model"] = self.workload
        elif axis == "workload":
            parts["model"] = self.model
        elif axis is not None:
            parts.pop(axis, None)
        text = " · ".join(parts.values())
        return f"{text} · by {axis}" if axis else text

    def as_dict(self, axis: str | None = None) -> dict[str, Any]:
        """Flat fields (CSV columns): the workload's own identity as one ``identity`` text, ``k=v`` pairs. With
        ``axis``, that field is left out (it varies within a group compared along it)."""
        out = {name: getattr(self, name) for name in CORE_AXES if name != axis}
        out["identity"] = " ".join(f"{k}={v}" for k, v in self.identity if k != axis)
        return out


def parallel_layout(config: Mapping[str, Any]) -> dict[str, Any]:
    """The key's tensor/pipeline-parallel fields from a record's config (nothing for runs without a mesh): the
    mesh, marked ``sp`` with sequence parallelism and ``@order`` with a placement given; for a pipeline, its
    schedule (``v2``: stages per rank, where the schedule lets it vary) and microbatches."""
    mesh = config.get("mesh")
    if not mesh:
        return {}
    placement = config.get("placement") or "auto"
    text = (
        mesh
        + (" sp" if config.get("sequence_parallel") else "")
        + (f" @{placement}" if placement != "auto" else "")
    )
    if "pp=" not in mesh:
        return {"mesh": text}
    schedule = str(config.get("pp_schedule"))
    virtual = config.get("virtual_stages") or 1
    looped = schedule in ("interleaved-1f1b", "looped-bfs", "interleaved-zb")
    return {
        "mesh": text,
        "pp_schedule": f"{schedule} v{virtual}" if looped else schedule,
        "microbatches": config.get("microbatches"),
    }


CORE_AXES: tuple[str, ...] = tuple(f.name for f in fields(WorkloadKey) if f.name != "identity")
_AXIS_ALIASES = {"lr": "learning_rate", "batch": "batch_size", "steps": "steps_per_epoch"}
# the order a reader expects the values of an axis in, where it is not the natural (numeric, alphabetical) one
_KNOWN_ORDER: dict[str, tuple[str, ...]] = {
    "precision": PRECISIONS,
    "strategy": STRATEGIES,  # the core's, as contract.strategies lists them: single, data, model parallel
}


def parse_axis(text: str, identity_names: Iterable[str]) -> str:
    """``--vs`` text -> an axis name: a core field of :class:`WorkloadKey` (``batch-size`` and ``lr`` accepted) or
    an identity entry some record has; anything else is refused, naming the choices."""
    name = text.strip().replace("-", "_")
    name = _AXIS_ALIASES.get(name, name)
    known = dict.fromkeys([*CORE_AXES, *sorted(identity_names)])
    if name not in known:
        raise AccelbenchError(
            f"--vs {text!r}: not a workload field of these records; choose from: {', '.join(known)}"
        )
    return name


def format_value(value: Value, axis: str | None = None) -> str:
    """An axis value as shown: ``0.0003`` for floats (``g``), ``full epochs`` for no step cap, ``-`` for none."""
    if value is None:
        return "full epochs" if axis == "steps_per_epoch" else "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _natural(text: str) -> tuple[Any, ...]:
    """Sort key that orders the numbers inside names by value: gpt2 < gpt2-medium, 2L < 12L."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p.lower()) for p in re.split(r"(\d+)", text) if p)


def axis_order(axis: str, values: Iterable[Value], sizes: Mapping[Value, float] | None = None) -> list[Value]:
    """The values of ``axis`` in the order a reader expects: precisions and strategies in their usual order,
    models by size (``sizes``: parameters, where recorded), numbers ascending, text naturally; none last."""
    known = _KNOWN_ORDER.get(axis, ())
    sizes = sizes or {}

    def key(v: Value) -> tuple[Any, ...]:
        if v is None:
            return (3,)
        if isinstance(v, str) and v in known:
            return (0, known.index(v))
        if axis == "model" and v in sizes:
            return (1, sizes[v], _natural(str(v)))
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return (1, v, ())
        return (2, _natural(str(v)))

    return sorted(dict.fromkeys(values), key=key)


def match_value(axis: str, values: Sequence[Value], wanted: str) -> Value:
    """The value ``--vs-baseline`` names: equal as shown (``bf16-mixed``, ``16``, ``0.0003``) or as a number
    (``3e-4``); refused with the values there are when none matches."""
    for v in values:
        if wanted in (format_value(v, axis), str(v)):
            return v
    try:
        number = float(wanted)
    except ValueError:
        number = None
    for v in values:
        if number is not None and isinstance(v, (int, float)) and not isinstance(v, bool) and v == number:
            return v
    shown = ", ".join(format_value(v, axis) for v in values)
    raise AccelbenchError(f"--vs-baseline {wanted!r}: no run has {axis} {wanted}; the values are: {shown}")
