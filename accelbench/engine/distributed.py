"""Data-parallel executors over torch.distributed: DDP and FSDP2, and the core's executor for each strategy name.

Strategies that split the model find its parts in the workload's ``ModelUnits`` (``TrainingJob.units``), never in
the model's attributes.
"""

from __future__ import annotations

import contextlib
from typing import Any, cast

import torch

from accelbench.contract import Executor, ExecutorRequest
from accelbench.contract.strategies import Strategy, strategy_of
from accelbench.engine.executor import TorchExecutor
from accelbench.engine.stragglers import CollectiveClock, timed_allreduce_hook
from accelbench.errors import BackendError
from accelbench.workloads import ModelUnits


class DDPExecutor(TorchExecutor):
    """torch DistributedDataParallel: every rank holds the model; gradients are all-reduced during backward."""

    def wrap(self, model: torch.nn.Module, units: ModelUnits) -> torch.nn.Module:
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type != "cpu" and self.device.index is not None else None
        ddp = DistributedDataParallel(model, device_ids=ids, gradient_as_bucket_view=True)
        # DDP's own all-reduce, timed: what tells the rank that waits from the rank it waits for
        self.collective_clock = CollectiveClock()
        ddp.register_comm_hook(None, timed_allreduce_hook(self.collective_clock))
        return ddp

    def gradient_sync(self, last: bool) -> contextlib.AbstractContextManager[None]:
        """DDP all-reduces during backward: every micro-batch but the last accumulates locally (``no_sync``)."""
        return contextlib.nullcontext() if last else cast(Any, self.model).no_sync()

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "strategy": str(Strategy.DDP)}


class FSDPExecutor(TorchExecutor):
    """torch FSDP2 (``fully_shard``): parameters, gradients and optimizer state sharded over ranks; each of the
    workload's units (the GPT's transformer blocks) is its own FSDP unit, so only one unit's full parameters exist
    at a time."""

    def wrap(self, model: torch.nn.Module, units: ModelUnits) -> torch.nn.Module:
        from torch.distributed.fsdp import fully_shard

        for unit in units.modules(model):
            fully_shard(unit)
        fully_shard(model)  # the rest (the stem, the head and parameters tied between them) as the root unit
        return model

    def gradient_sync(self, last: bool) -> contextlib.AbstractContextManager[None]:
        """FSDP2 reduce-scatters during backward: with ``--grad-accum``, only the last micro-batch of a batch does
        (the others accumulate unsharded gradients, FSDP2's ``set_requires_gradient_sync``)."""
        if self.request.config.grad_accum > 1:
            cast(Any, self.model).set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "strategy": str(Strategy.FSDP),
            "fsdp": "fully_shard (FSDP2), one unit per workload unit + root",
        }


def executor_for(request: ExecutorRequest) -> Executor:
    """The core's torch executor for the request's strategy (``ExecutorRequest.default_executor``); a name the core
    does not build is the backend's to build in its own ``executor``."""
    strategy = request.strategy
    if request.config.engine == "lightning":
        from accelbench.engine.lightning import LightningExecutor

        return LightningExecutor(request)
    kind = strategy_of(strategy)
    if kind == Strategy.SINGLE:
        return TorchExecutor(request)
    if kind == Strategy.DDP:
        return DDPExecutor(request)
    if kind == Strategy.FSDP:
        return FSDPExecutor(request)
    if kind is not None and kind.model_parallel:
        from accelbench.engine.parallel.executor import ParallelExecutor
        from accelbench.parallel_dims import ParallelDims

        layout = ParallelDims.of(request.config)
        if layout.ep > 1 and not layout.pipelined and layout.tp == 1:
            # ep with pp or tp: the mesh executor shards the experts (over ep, then each over tp)
            from accelbench.engine.parallel.ep import ExpertParallelExecutor

            return ExpertParallelExecutor(request)

        return ParallelExecutor(request)
    if kind is not None and kind.zero_stage is not None:
        from accelbench.engine.deepspeed import DeepSpeedExecutor

        return DeepSpeedExecutor(request)
    raise BackendError(
        f"backend {request.backend.name!r} declared strategy {strategy!r}, which the core does not build, but its "
        "executor() asked the core for it (super().executor): build it in the backend's own executor()"
    )
