"""What DeepSpeed ZeRO-3's engine costs a step on this host beyond the model's operators and its collectives: the
hooks it puts on every module (fetching and releasing parameters around each module's forward and backward), its
per-tensor gradient partitioning and bookkeeping, its flat optimizer partition. None of that is an operator of the
traced step, and on a small model it is a large share of it (on this project's VM, gpt-micro's 4 layers: some
20 ms of a 240 ms step; the collectives are priced apart, from ``accelbench comm`` records).

Measured once per host, torch, DeepSpeed and thread count, and cached in ``engine_cost.json`` beside the
calibration: :mod:`accelbench.estimate.engine_probe` runs, in a process of its own on one rank, ZeRO-3 and a plain
loop on three stacks of tiny linear layers whose modules and parameter tensors vary apart (16 and 64 layers with
biases, 64 without); the differences give a cost per module, one per parameter tensor and one per step (least
squares, none below 0). A step of a model with M modules and T parameter tensors is priced
``per_step + M per_module + T per_tensor``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, ValidationError

from accelbench.estimate.peak import cache_dir, measured_since, read_cache
from accelbench.results import _write_atomically

if TYPE_CHECKING:
    from accelbench.estimate.calibration import Calibration

CACHE_FILE = "engine_cost.json"
VERSION = 1
PROBE_TIMEOUT_S = 600.0


class Zero3Hooks(BaseModel):
    """ZeRO-3's cost per step on this host (seconds): per module, per parameter tensor, and per step whatever the
    model, measured at ``threads`` intra-op threads (:func:`zero3_hooks`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = VERSION
    key: str
    per_module_s: float
    per_tensor_s: float
    per_step_s: float
    probes: list[dict[str, Any]]
    measured_at: str
    seconds: float

    def step_seconds(self, modules: int, tensors: int) -> float:
        return self.per_step_s + modules * self.per_module_s + tensors * self.per_tensor_s

    def describe(self) -> str:
        return (
            f"{self.per_module_s * 1e3:.3g} ms a module, {self.per_tensor_s * 1e3:.3g} ms a parameter tensor and "
            f"{self.per_step_s * 1e3:.3g} ms a step (DeepSpeed ZeRO-3 against a plain loop on one rank, measured "
            f"{self.measured_at})"
        )


def fit(probes: list[dict[str, Any]]) -> tuple[float, float, float]:
    """(per module, per tensor, per step) seconds: least squares of each probe's ``zero3_s - plain_s`` over its
    modules and tensors, a cost that comes out below 0 set to 0 and the others fitted again without it."""
    import numpy as np

    rows = np.array([[p["modules"], p["tensors"], 1.0] for p in probes], dtype=float)
    extra = np.array([max(0.0, p["zero3_s"] - p["plain_s"]) for p in probes], dtype=float)
    kept = [0, 1, 2]
    while kept:
        solution, *_ = np.linalg.lstsq(rows[:, kept], extra, rcond=None)
        if (solution >= 0).all():
            costs = [0.0, 0.0, 0.0]
            for i, value in zip(kept, solution, strict=True):
                costs[i] = float(value)
            return costs[0], costs[1], costs[2]
        kept.remove(kept[int(np.argmin(solution))])
    return 0.0, 0.0, 0.0


def zero3_key(threads: int) -> str:
    import torch

    deepspeed = importlib.metadata.version("deepspeed")
    return f"{platform.node()}, torch {torch.__version__}, deepspeed {deepspeed}, {threads} thread(s)"


def zero3_hooks(
    threads: int,
    *,
    refresh: bool = False,
    fresh_since: datetime | None = None,
    cached_only: bool = False,
    directory: Path | None = None,
) -> tuple[Zero3Hooks | None, str | None]:
    """This host's ZeRO-3 cost at ``threads`` intra-op threads and a note: cached, else measured now (seconds, in
    a subprocess) unless ``cached_only``; ``refresh`` measures again, unless the cached cost was measured at or
    after ``fresh_since`` (the same command measured it already). (None, why) without DeepSpeed, or where the probe
    fails."""
    if importlib.util.find_spec("deepspeed") is None:
        return None, "DeepSpeed is not installed here: ZeRO-3's engine cost is not priced"
    key = zero3_key(threads)
    path = (directory or cache_dir()) / CACHE_FILE
    entries = read_cache(path)
    if key in entries and (not refresh or measured_since(entries[key], fresh_since)):
        try:
            return Zero3Hooks.model_validate(entries[key]), None
        except ValidationError:
            pass  # measured again below
    if cached_only:
        return None, "ZeRO-3's engine cost was never measured on this host (--no-calibration): not priced"
    started = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    for name in (
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
    ):
        env.pop(name, None)  # a worker of a distributed run asks: the probe is a one-rank job of its own
    try:
        done = subprocess.run(
            [sys.executable, "-m", "accelbench.estimate.engine_probe", str(threads)],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return None, f"ZeRO-3's engine probe took over {PROBE_TIMEOUT_S:g} s: its cost is not priced"
    lines = done.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1]) if done.returncode == 0 and lines else None
        probes = list(result["probes"]) if result else []
    except (json.JSONDecodeError, KeyError, TypeError):
        probes = []
    if not probes:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        return None, f"ZeRO-3's engine probe failed (exit {done.returncode}: {last}): its cost is not priced"
    per_module, per_tensor, per_step = fit(probes)
    hooks = Zero3Hooks(
        key=key,
        per_module_s=per_module,
        per_tensor_s=per_tensor,
        per_step_s=per_step,
        probes=probes,
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        seconds=time.perf_counter() - started,
    )
    entries = read_cache(path)  # re-read: another process may have stored meanwhile
    entries[key] = hooks.model_dump()
    _write_atomically(json.dumps(entries, indent=2, sort_keys=True), path)
    return hooks, None


def with_zero3_hooks(
    calibration: Calibration,
    threads: int,
    *,
    cached_only: bool = False,
    refresh: bool = False,
    fresh_since: datetime | None = None,
) -> Calibration:
    """``calibration`` with this host's ZeRO-3 engine cost attached (:func:`zero3_hooks`), or with a note saying
    why it has none."""
    hooks, why = zero3_hooks(threads, cached_only=cached_only, refresh=refresh, fresh_since=fresh_since)
    notes = [*calibration.notes, *([why] if why else [])]
    return calibration.model_copy(update={"zero3_hooks": hooks, "notes": notes})
