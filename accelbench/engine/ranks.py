"""How the ranks of a multi-process run meet and part: the process group, and how each rank's ending and
measurements reach rank 0 without any rank ever waiting forever.

Ranks report how they ended through the process group's key-value store, which outlives a broken collective; rank 0
gathers the per-rank logs only when every rank reported "ok", so no rank waits on a collective a dead rank will
never join. A rank that sent nothing within the collective timeout is named as dead or hung.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from accelbench.engine.metrics import RankLog
from accelbench.launch import LaunchEnv, free_port
from accelbench.results import Outcome, Status

if TYPE_CHECKING:
    import torch

_PREFIX = "accelbench/status/"
_DECISION = "accelbench/decision"


def init_process_group(launch: LaunchEnv, collective: str, device: torch.device, timeout_s: float) -> None:
    """Join the job's process group. A single process (DDP on one device) gets a private group on a free port."""
    os.environ.update(launch.torch_env())
    if launch.world_size == 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    dist.init_process_group(
        backend=collective,
        rank=launch.rank,
        world_size=launch.world_size,
        timeout=timedelta(seconds=timeout_s),
        device_id=device if device.type != "cpu" else None,
    )


def destroy_process_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def report_status(rank: int, status: str, message: str | None) -> None:
    """Tell rank 0 how this rank ended (best effort: the store may be gone if rank 0 died)."""
    with contextlib.suppress(Exception):  # nothing more this rank can do
        _store().set(f"{_PREFIX}{rank}", json.dumps({"status": status, "message": message}))


def collect_statuses(world_size: int, wait_s: float) -> dict[int, dict[str, Any] | None]:
    """Every rank's reported ending; None for ranks that sent none within ``wait_s`` (dead or hung)."""
    store = _store()
    keys = [f"{_PREFIX}{r}" for r in range(world_size)]
    with contextlib.suppress(Exception):  # some rank never reported: found out below
        store.wait(keys, timedelta(seconds=wait_s))
    out: dict[int, dict[str, Any] | None] = {}
    for rank, key in enumerate(keys):
        out[rank] = json.loads(store.get(key)) if store.check([key]) else None
    return out


def announce_decision(decision: str) -> None:
    """Rank 0 tells the others whether it will gather their logs ("gather") or not ("abort")."""
    _store().set(_DECISION, decision)


def await_decision(timeout_s: float) -> str | None:
    try:
        _store().wait([_DECISION], timedelta(seconds=timeout_s))
        return _store().get(_DECISION).decode()
    except Exception:  # noqa: BLE001 - rank 0 is gone: nothing to gather into
        return None


def gather_logs(log: RankLog) -> list[RankLog]:
    """Every rank's log on rank 0 (an empty list elsewhere); logs travel as plain dicts."""
    rank, world = dist.get_rank(), dist.get_world_size()
    received: list[Any] = [None] * world if rank == 0 else []
    dist.gather_object(dataclasses.asdict(log), received if rank == 0 else None, dst=0)
    return [RankLog(**item) for item in received] if rank == 0 else []


def _store() -> dist.Store:
    return dist.distributed_c10d._get_default_store()


def exchange(
    log: RankLog, outcome: Outcome, rank: int, world_size: int, timeout_s: float
) -> tuple[list[RankLog], Outcome]:
    """Bring every rank's log to rank 0, or, when some rank failed, the names and reasons of the failed ranks.

    Ranks report how they ended through the process group's store (which survives a broken collective); rank 0
    gathers logs only when all reported "ok", so no rank waits on a collective that a dead rank will never join.
    """
    report_status(rank, outcome.status, outcome.message)
    if rank != 0:
        if outcome.status == "ok" and await_decision(timeout_s) == "gather":
            gather_logs(log)
        return [], outcome
    # a healthy rank 0 waits as long as a collective would; a failed one only briefly for the others' reasons
    wait_s = timeout_s if outcome.status == "ok" else min(timeout_s, 10.0)
    statuses = collect_statuses(world_size, wait_s)
    failed = {r: s for r, s in statuses.items() if r != 0 and (s is None or s["status"] != "ok")}
    if not failed and outcome.status == "ok":
        announce_decision("gather")
        try:
            return gather_logs(log), outcome
        except Exception as exc:
            return [log], Outcome(status="error", message=f"gathering per-rank metrics failed: {exc}")
    announce_decision("abort")
    reasons = [
        f"rank {r}: " + (f"sent no status within {wait_s:.0f} s (it died or hangs)" if s is None
                         else f"{s['status']}: {s['message']}")
        for r, s in sorted(failed.items())
    ]  # fmt: skip
    if outcome.status != "ok":
        reasons.insert(0, f"rank 0: {outcome.status}: {outcome.message}")
    statuses_seen = {s["status"] for s in failed.values() if s} | {outcome.status}
    status: Status = (
        "oom"
        if "oom" in statuses_seen
        else "interrupted"
        if statuses_seen <= {"ok", "interrupted"}
        else "error"
    )
    return [log], Outcome(
        status=status,
        message="; ".join(reasons) + " (metrics below are rank 0's only)",
        traceback=outcome.traceback,
    )
