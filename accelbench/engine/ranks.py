"""How the ranks of a multi-process run meet and part: the process group, and how each rank's ending and
measurements reach rank 0 without any rank ever waiting forever.

Ranks leave how they ended and their per-rank logs in the process group's key-value store, which outlives a broken
collective and needs none; rank 0 reads them, waiting at most the collective timeout. A rank that sent nothing in
that time is named as dead or hung."""

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
_PROGRESS = "accelbench/progress/"


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
    global _kept_store
    _kept_store = None
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def release_peers() -> None:
    """This rank stopped training (interrupted, failed): let go of its side of the process group, so that a peer
    blocked in a collective this rank will never join can fail before the collective timeout (where nothing else,
    e.g. a DDP module, still holds the group open) and report how it ended; its completed epochs reach rank 0 in any
    case (:func:`publish_progress`). The key-value store the ranks report through is kept."""
    global _kept_store
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return
    with contextlib.suppress(Exception):  # best effort: the peers' timeout still bounds their wait
        _kept_store = dist.distributed_c10d._get_default_store()
        if dist.get_backend() == "gloo":
            dist.destroy_process_group()  # gloo closes its connections: a peer's pending collective fails
        else:
            dist.distributed_c10d._abort_process_group()  # nccl/xccl: abort the communicators


def report_status(rank: int, status: str, message: str | None, log: RankLog | None = None) -> None:
    """Leave how this rank ended and what it measured for rank 0 (best effort: the store may be gone if rank 0
    died)."""
    payload = {"status": status, "message": message, "log": dataclasses.asdict(log) if log else None}
    with contextlib.suppress(Exception):  # nothing more this rank can do
        _store().set(f"{_PREFIX}{rank}", json.dumps(payload))


def publish_progress(rank: int, log: RankLog) -> None:
    """After each epoch: leave this rank's log so far in the store, so that rank 0 keeps its completed epochs even
    if it never reports an ending (blocked in a collective a stopped peer left, killed). Best effort, between
    epochs: never inside a timed one."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return
    with contextlib.suppress(Exception):
        _store().set(f"{_PROGRESS}{rank}", json.dumps(dataclasses.asdict(log)))


def published_progress(rank: int) -> RankLog | None:
    """The last log ``rank`` published with :func:`publish_progress`, or None."""
    with contextlib.suppress(Exception):
        store, key = _store(), f"{_PROGRESS}{rank}"
        if store.check([key]):
            return RankLog(**json.loads(store.get(key)))
    return None


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


_kept_store: dist.Store | None = None  # the store, kept when release_peers closed the group


def _store() -> dist.Store:
    return _kept_store if _kept_store is not None else dist.distributed_c10d._get_default_store()


def exchange(
    log: RankLog, outcome: Outcome, rank: int, world_size: int, timeout_s: float
) -> tuple[list[RankLog], Outcome]:
    """Bring every rank's log and ending to rank 0: its logs, and the outcome of the whole run.

    Ranks leave both in the process group's key-value store, which needs no collective: a rank that failed or was
    interrupted may have collectives in flight that its peers never joined, and a collective now would hang or
    mismatch. The metrics cover every rank over the epochs all of them completed (so an interrupted or failed run
    keeps those), with the log a rank published after its last epoch where it sent no ending (it died, or hangs in
    a collective); rank 0's alone where some rank left neither, saying so.
    """
    report_status(rank, outcome.status, outcome.message, log if rank != 0 else None)
    if rank != 0:
        return [], outcome
    # a healthy rank 0 waits as long as a collective would; a failed one only briefly for the others' reasons
    wait_s = timeout_s if outcome.status == "ok" else min(timeout_s, 10.0)
    statuses = collect_statuses(world_size, wait_s)
    others = {r: s for r, s in statuses.items() if r != 0}
    # a rank that sent no ending (blocked in a collective, killed) still left its log after each epoch it completed
    theirs = {
        r: RankLog(**status["log"]) if status is not None and status.get("log") else published_progress(r)
        for r, status in others.items()
    }
    complete = all(other is not None for other in theirs.values())
    logs = [log] + [other for _, other in sorted(theirs.items()) if other is not None] if complete else [log]
    failed = {r: s for r, s in others.items() if s is None or s["status"] != "ok"}
    if not failed and outcome.status == "ok":
        return logs, outcome
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
        else "diverged"
        if "diverged" in statuses_seen and statuses_seen <= {"ok", "diverged", "interrupted"}
        else "interrupted"
        if statuses_seen <= {"ok", "interrupted"}
        else "error"
    )
    coverage = (
        " (metrics below: the epochs every rank completed)"
        if complete
        else " (metrics below are rank 0's only)"
    )
    return logs, Outcome(status=status, message="; ".join(reasons) + coverage, traceback=outcome.traceback)
