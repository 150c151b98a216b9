"""The data every view is drawn from: the comparison's cells, each with its workload, and ways to group them."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from accelbench.compare import Cell, Comparison, WorkloadKey
from accelbench.contract.strategies import Strategy

_GIB = 2**30
SINGLE_DEVICE_STRATEGIES = (
    Strategy.SINGLE,
    Strategy.DDP,
)  # the seed study's single-accelerator runs used DDP on one GPU


@dataclass(frozen=True)
class Entry:
    """A cell with its workload key."""

    key: WorkloadKey
    cell: Cell

    @property
    def epoch_s(self) -> float | None:
        return self.cell.epoch_s.median if self.cell.epoch_s else None

    @property
    def memory_gib(self) -> float | None:
        m = self.cell.peak_memory_bytes
        return m.median / _GIB if m else None

    @property
    def joules_per_sample(self) -> float | None:
        return self.cell.joules_per_sample.median if self.cell.joules_per_sample else None

    @property
    def out_of_memory(self) -> bool:
        return self.cell.epoch_s is None and any(r.status == "oom" for r in self.cell.runs)

    @property
    def model_size(self) -> float:
        """Parameters as recorded, for ordering models only. A model that ran out of memory while being built has
        none recorded: it is larger than every model that fit (inf), after them in the order they were tried."""
        for r in self.cell.runs:
            if r.parameters:
                return r.parameters
        return math.inf

    @property
    def first_run(self) -> datetime:
        return min(r.created_at for r in self.cell.runs)


def entries(comparison: Comparison) -> list[Entry]:
    """Every cell with the full workload key of its runs (compared along an axis, too: each value is a cell)."""
    return [Entry(cell.key or group.key, cell) for group in comparison.groups for cell in group.cells]


def group_by(items: Iterable[Entry], key: Callable[[Entry], Any]) -> dict[Any, list[Entry]]:
    out: dict[Any, list[Entry]] = {}
    for item in items:
        out.setdefault(key(item), []).append(item)
    return out


def without(key: WorkloadKey, *names: str) -> tuple[Any, ...]:
    """The key's fields except ``names``: what the entries of one figure share."""
    return tuple(v for k, v in key.as_dict().items() if k not in names)


def caption(key: WorkloadKey, *names: str) -> str:
    """The workload fields shared by a figure (those not on its axes), as a subtitle."""
    d = key.as_dict()
    parts = {
        "workload": f"{d['workload']} {d['model']}",
        "batch_size": f"batch {d['batch_size']}",
        "precision": d["precision"],
        "strategy": d["strategy"],
        "data": f"data {d['data']}",
        "steps_per_epoch": f"{d['steps_per_epoch']} steps/epoch" if d["steps_per_epoch"] else "full epochs",
    }
    if "model" in names:
        parts["workload"] = d["workload"]
    return " · ".join(v for k, v in parts.items() if k not in names)


def models_in_order(group: Sequence[Entry]) -> list[str]:
    """The models of ``group`` from the smallest (recorded parameters) up; those never built last."""
    sizes: dict[str, tuple[float, datetime]] = {}
    for e in group:
        known = sizes.get(e.key.model)
        sizes[e.key.model] = min(known, (e.model_size, e.first_run)) if known else (e.model_size, e.first_run)
    return sorted(sizes, key=lambda m: sizes[m])
