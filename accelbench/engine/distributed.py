"""Multi-process training over torch.distributed: process groups, DDP and FSDP executors, and how ranks
report to rank 0 (metrics gathered, failures named) without ever hanging forever.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from accelbench.engine.executor import Executor, ExecutorRequest, TorchExecutor
from accelbench.launch import LaunchEnv, free_port

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


class DDPExecutor(TorchExecutor):
    """torch DistributedDataParallel: every rank holds the model; gradients are all-reduced during backward."""

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type != "cpu" and self.device.index is not None else None
        return DistributedDataParallel(model, device_ids=ids, gradient_as_bucket_view=True)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "strategy": "ddp"}


class FSDPExecutor(TorchExecutor):
    """torch FSDP2 (``fully_shard``): parameters, gradients and optimizer state sharded over ranks; each
    transformer block is its own unit, so only one block's full parameters exist at a time."""

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        from torch.distributed.fsdp import fully_shard

        for block in getattr(model, "blocks", []):
            fully_shard(block)
        fully_shard(model)  # the rest (embeddings, tied head, final norm) as the root unit
        return model

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "strategy": "fsdp",
            "fsdp": "fully_shard (FSDP2), one unit per block + root",
        }


def executor_for(request: ExecutorRequest) -> Executor | None:
    """The core's torch executors by strategy name; None for names the core does not build."""
    strategy = request.strategy
    if request.config.engine == "lightning":
        from accelbench.engine.lightning import LightningExecutor

        return LightningExecutor(request)
    if strategy == "single":
        return TorchExecutor(request)
    if strategy == "ddp":
        return DDPExecutor(request)
    if strategy == "fsdp":
        return FSDPExecutor(request)
    if strategy.startswith("deepspeed-zero"):
        from accelbench.engine.deepspeed import DeepSpeedExecutor

        return DeepSpeedExecutor(request)
    return None


# ------------------------------------------------------------------------------------------------------------
# Ranks report to rank 0 through the process group's key-value store, which outlives a broken collective.
# ------------------------------------------------------------------------------------------------------------


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


def gather_logs(log: Any) -> list[Any]:
    """Every rank's log on rank 0 (an empty list elsewhere); logs travel as plain dicts."""
    rank, world = dist.get_rank(), dist.get_world_size()
    received: list[Any] = [None] * world if rank == 0 else []
    dist.gather_object(dataclasses.asdict(log), received if rank == 0 else None, dst=0)
    return [type(log)(**item) for item in received] if rank == 0 else []


def _store() -> dist.Store:
    return dist.distributed_c10d._get_default_store()
