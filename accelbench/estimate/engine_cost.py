"""What an engine costs a step on this host beyond the model's operators and its collectives, measured once per host
and cached in ``engine_cost.json`` beside the calibration, each by a probe in a process of its own
(:mod:`accelbench.estimate.engine_probe`).

**DeepSpeed ZeRO-3.** What its engine costs beyond the model's operators and its collectives: the
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

**DTensor's dispatch** (tensor parallelism). Each operator on DTensors goes through DTensor's own dispatch (sharding
propagation, cached after a first step; wrapping and unwrapping the local tensors; the parallel styles' hooks and
redistributions around it) before the local operators it runs. The probe times stacks of column- and row-parallel
linear pairs 8 wide (2 to 16 pairs, over a fake process group of 2 ranks, this process rank 0: the collectives
move nothing) against plain layers of the rank's own sizes, and counts the DTensor operators of a step as the
traced step records them (:mod:`accelbench.estimate.operators`); the differences give a cost per DTensor operator
and one per step (least squares, none below 0). On this project's VM some 60 us an operator: gpt-micro's tp rank
dispatches 274 a step, about 16 ms of its 190.

**FSDP2's hooks.** ``fully_shard`` puts hooks on each unit (all-gather before its forward and its backward, reshard
after, the gradients' reduce-scatter after its backward) and makes every parameter a DTensor, which the optimizer
and the clipping then dispatch through. The probe times, on one rank of a gloo group, units of tiny linear layers
sharded as the executor shards a model (each unit and the root) against the same stacks plain, with AdamW's kernels
as the run's, each step after a read of memory twice the last-level cache; the differences give a cost per unit
(the root counted), one per parameter tensor and one per step (least squares, none below 0). On one rank the
collectives move nothing; at several they are priced apart, from ``accelbench comm`` records. On the Xeon VM
(2026-12-01): some 0.28 ms a unit and 0.05 ms a tensor, 5 ms of gpt-micro's step (a run on one process took 7 ms
more with FSDP than without).
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
DTENSOR_PREFIX = "dtensor: "  # a DTensor dispatch cost's cache key starts so (ZeRO-3's keys came first, bare)
FSDP_PREFIX = "fsdp: "


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


def fit(
    probes: list[dict[str, Any]], modules: str = "modules", engine: str = "zero3_s"
) -> tuple[float, float, float]:
    """(per module, per tensor, per step) seconds: least squares of each probe's ``engine - plain_s`` (ZeRO-3's
    step, or FSDP2's) over its ``modules`` (ZeRO-3's hooked modules, or FSDP's units) and tensors, a cost that comes
    out below 0 set to 0 and the others fitted again without it."""
    costs = _non_negative_fit(
        [[p[modules], p["tensors"], 1.0] for p in probes], [p[engine] - p["plain_s"] for p in probes]
    )
    return costs[0], costs[1], costs[2]


def _non_negative_fit(rows: list[list[float]], extra: list[float]) -> list[float]:
    """Least squares of ``extra`` (each floored at 0) over ``rows``' columns, a cost that comes out below 0 set to
    0 and the others fitted again without it."""
    import numpy as np

    matrix = np.array(rows, dtype=float)
    target = np.array([max(0.0, e) for e in extra], dtype=float)
    kept = list(range(matrix.shape[1]))
    costs = [0.0] * matrix.shape[1]
    while kept:
        solution, *_ = np.linalg.lstsq(matrix[:, kept], target, rcond=None)
        if (solution >= 0).all():
            for i, value in zip(kept, solution, strict=True):
                costs[i] = float(value)
            return costs
        kept.remove(kept[int(np.argmin(solution))])
    return costs


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

    def measured(probes: list[dict[str, Any]], key: str, seconds: float) -> Zero3Hooks:
        per_module, per_tensor, per_step = fit(probes)
        return Zero3Hooks(key=key, per_module_s=per_module, per_tensor_s=per_tensor, per_step_s=per_step,
                          probes=probes, measured_at=_now(), seconds=seconds)  # fmt: skip

    return _cached_probe(
        "zero3", zero3_key(threads), threads, Zero3Hooks, measured, "ZeRO-3's engine",
        refresh=refresh, fresh_since=fresh_since, cached_only=cached_only, directory=directory,
    )  # fmt: skip


class FsdpHooks(Zero3Hooks):
    """FSDP2's cost per step on this host (seconds): per FSDP unit (``per_module_s``: each unit ``fully_shard``
    wraps, the root among them), per parameter tensor, and per step, measured at ``threads`` intra-op threads with
    AdamW's ``kernels`` (:func:`fsdp_hooks`)."""

    kernels: str

    def describe(self) -> str:
        return (
            f"{self.per_module_s * 1e3:.3g} ms an FSDP unit, {self.per_tensor_s * 1e3:.3g} ms a parameter tensor and "
            f"{self.per_step_s * 1e3:.3g} ms a step (FSDP2 against a plain loop on one rank, {self.kernels} AdamW, "
            f"measured {self.measured_at})"
        )


def fsdp_key(threads: int, kernels: str) -> str:
    import torch

    return f"{FSDP_PREFIX}{platform.node()}, torch {torch.__version__}, {kernels} AdamW, {threads} thread(s)"


def fsdp_hooks(
    threads: int,
    kernels: str,
    *,
    refresh: bool = False,
    fresh_since: datetime | None = None,
    cached_only: bool = False,
    directory: Path | None = None,
) -> tuple[FsdpHooks | None, str | None]:
    """This host's FSDP2 cost at ``threads`` intra-op threads with AdamW's ``kernels`` and a note, cached or
    measured as :func:`zero3_hooks` (seconds, in a subprocess). (None, why) where the probe fails."""

    def measured(probes: list[dict[str, Any]], key: str, seconds: float) -> FsdpHooks:
        per_unit, per_tensor, per_step = fit(probes, modules="units", engine="fsdp_s")
        return FsdpHooks(key=key, per_module_s=per_unit, per_tensor_s=per_tensor, per_step_s=per_step,
                         kernels=kernels, probes=probes, measured_at=_now(), seconds=seconds)  # fmt: skip

    return _cached_probe(
        "fsdp", fsdp_key(threads, kernels), threads, FsdpHooks, measured, "FSDP2's hooks",
        refresh=refresh, fresh_since=fresh_since, cached_only=cached_only, directory=directory,
        arguments=(kernels,),
    )  # fmt: skip


class DTensorDispatch(BaseModel):
    """DTensor's dispatch cost on this host (seconds): per operator on DTensors and per step, measured at
    ``threads`` intra-op threads (:func:`dtensor_dispatch`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = VERSION
    key: str
    per_operator_s: float
    per_step_s: float
    probes: list[dict[str, Any]]
    measured_at: str
    seconds: float

    def describe(self) -> str:
        return (
            f"{self.per_operator_s * 1e6:.3g} us a DTensor operator and {self.per_step_s * 1e3:.3g} ms a step "
            f"(tensor-parallel linear pairs against plain ones of a rank's sizes, measured {self.measured_at})"
        )


def dtensor_key(threads: int) -> str:
    import torch

    return f"{DTENSOR_PREFIX}{platform.node()}, torch {torch.__version__}, {threads} thread(s)"


def dtensor_dispatch(
    threads: int,
    *,
    refresh: bool = False,
    fresh_since: datetime | None = None,
    cached_only: bool = False,
    directory: Path | None = None,
) -> tuple[DTensorDispatch | None, str | None]:
    """This host's DTensor dispatch cost at ``threads`` intra-op threads and a note, cached or measured as
    :func:`zero3_hooks` (seconds, in a subprocess). (None, why) where the probe fails."""

    def measured(probes: list[dict[str, Any]], key: str, seconds: float) -> DTensorDispatch:
        per_operator, per_step = _non_negative_fit(
            [[p["dtensor_operators"], 1.0] for p in probes], [p["tp_s"] - p["plain_s"] for p in probes]
        )
        return DTensorDispatch(key=key, per_operator_s=per_operator, per_step_s=per_step, probes=probes,
                               measured_at=_now(), seconds=seconds)  # fmt: skip

    return _cached_probe(
        "dtensor", dtensor_key(threads), threads, DTensorDispatch, measured, "DTensor's dispatch",
        refresh=refresh, fresh_since=fresh_since, cached_only=cached_only, directory=directory,
    )  # fmt: skip


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _cached_probe(
    probe: str,
    key: str,
    threads: int,
    model: type[Any],
    measured: Any,
    what: str,
    *,
    refresh: bool,
    fresh_since: datetime | None,
    cached_only: bool,
    directory: Path | None,
    arguments: tuple[str, ...] = (),
) -> tuple[Any, str | None]:
    """The cost under ``key`` in the cache (validated as ``model``), else ``measured(probes, key, seconds)`` of
    ``engine_probe THREADS PROBE ARGUMENTS`` run now in a process of its own, stored; (None, why) where it cannot be
    had."""
    path = (directory or cache_dir()) / CACHE_FILE
    entries = read_cache(path)
    if key in entries and (not refresh or measured_since(entries[key], fresh_since)):
        try:
            return model.model_validate(entries[key]), None
        except ValidationError:
            pass  # measured again below
    if cached_only:
        return None, f"{what} cost was never measured on this host (--no-calibration): not priced"
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
            [sys.executable, "-m", "accelbench.estimate.engine_probe", str(threads), probe, *arguments],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return None, f"{what} probe took over {PROBE_TIMEOUT_S:g} s: its cost is not priced"
    lines = done.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1]) if done.returncode == 0 and lines else None
        probes = list(result["probes"]) if result else []
    except (json.JSONDecodeError, KeyError, TypeError):
        probes = []
    if not probes:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        return None, f"{what} probe failed (exit {done.returncode}: {last}): its cost is not priced"
    cost = measured(probes, key, time.perf_counter() - started)
    entries = read_cache(path)  # re-read: another process may have stored meanwhile
    entries[key] = cost.model_dump()
    _write_atomically(json.dumps(entries, indent=2, sort_keys=True), path)
    return cost, None


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
    found = zero3_hooks(threads, cached_only=cached_only, refresh=refresh, fresh_since=fresh_since)
    return _attached(calibration, "zero3_hooks", found)


def with_fsdp_hooks(
    calibration: Calibration,
    threads: int,
    kernels: str,
    *,
    cached_only: bool = False,
    refresh: bool = False,
    fresh_since: datetime | None = None,
) -> Calibration:
    """``calibration`` with this host's FSDP2 cost attached (:func:`fsdp_hooks`), or with a note saying why it has
    none."""
    found = fsdp_hooks(threads, kernels, cached_only=cached_only, refresh=refresh, fresh_since=fresh_since)
    return _attached(calibration, "fsdp_hooks", found)


def with_dtensor_dispatch(
    calibration: Calibration,
    threads: int,
    *,
    cached_only: bool = False,
    refresh: bool = False,
    fresh_since: datetime | None = None,
) -> Calibration:
    """``calibration`` with this host's DTensor dispatch cost attached (:func:`dtensor_dispatch`), or with a note
    saying why it has none."""
    found = dtensor_dispatch(threads, cached_only=cached_only, refresh=refresh, fresh_since=fresh_since)
    return _attached(calibration, "dtensor_dispatch", found)


def _attached(calibration: Calibration, field: str, found: tuple[Any, str | None]) -> Calibration:
    """``calibration`` with an engine cost ``found`` (the cost, or None and why) set as ``field``, its note added."""
    cost, why = found
    notes = [*calibration.notes, *([why] if why else [])]
    return calibration.model_copy(update={field: cost, "notes": notes})
