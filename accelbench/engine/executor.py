"""Executors: the one object the runner trains through.

A strategy mapping (the ``accelbench_executor`` hook) returns an :class:`Executor`. It owns model wrapping,
the optimizer step and any compile step, so devices that compile a whole graph before running (IPUs) or
replicate by themselves fit the same runner as eager GPUs and CPUs.
"""

from __future__ import annotations

import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch

from accelbench.config import RunConfig
from accelbench.precision import PrecisionPlan
from accelbench.workloads import ModelUnits, TrainingJob

if TYPE_CHECKING:
    from accelbench.engine.metrics import RankLog


@dataclass(frozen=True)
class World:
    """Where this process sits in a (possibly single-process) job."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1


@dataclass(frozen=True)
class ExecutorRequest:
    """What a strategy mapping needs to build an executor."""

    config: RunConfig  # the whole run: devices, batch size, backend_options, ...
    device: torch.device
    precision: PrecisionPlan
    world: World
    synchronize: Callable[[torch.device], None]  # the backend's device synchronisation (timing hook)
    units: ModelUnits | None = (
        None  # the workload's model parts for this config, known before the model is built
    )

    @property
    def strategy(self) -> str:
        return self.config.strategy


@dataclass(frozen=True)
class DataShard:
    """Which share of each epoch's batches a process trains on (``index`` of ``count``), and whether its samples
    count toward the run's throughput. Data parallelism gives every rank its own share; the ranks that together
    hold one copy of the model (tensor- or pipeline-parallel) train on the same share, and one of them counts it."""

    index: int
    count: int
    counts_samples: bool = True


class Executor(ABC):
    """Trains a :class:`TrainingJob` one step at a time.

    The runner calls ``setup`` once, ``compile`` once on a sample batch (timed apart from training), then
    ``train_step`` for every batch, and ``close`` at the end, also after a failure.
    """

    @abstractmethod
    def setup(self, job: TrainingJob) -> None:
        """Wrap the model, place it on the device, build the optimizer."""

    def compile(self, inputs: torch.Tensor, targets: torch.Tensor) -> float | None:
        """Compile ahead of training if this executor compiles; return seconds spent, or None if it does not.

        Must leave the model's weights as they were (a compile may run a step, but not apply it).
        """
        return None

    @abstractmethod
    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """One optimizer step on a batch already on the device. Returns the loss as a detached device tensor.

        Must not synchronise the device (no ``.item()``): the runner synchronises once per epoch.
        """

    def describe(self) -> dict[str, Any]:
        """What really ran (compiled or not, fused optimizer, ...), for the result record."""
        return {}

    @property
    def replays_graphs(self) -> bool:
        """True when steps replay captured device graphs (CUDA graphs). Their memory comes from a private pool that
        replays never allocate from, so the allocator's allocated-bytes peak does not see it (on an H200 it read
        0.5 GiB for a step that holds 19 GiB); the runner then records the reserved peak instead."""
        return False

    def effective_precision(self, requested: PrecisionPlan) -> PrecisionPlan:
        """The precision that really runs, recorded in place of the request (an engine with its own mixed
        precision, such as DeepSpeed's bf16 mode, keeps bf16 parameters with fp32 master weights)."""
        return requested

    def close(self) -> None:
        """Release the device (detach IPUs, destroy process groups the executor created)."""

    def data_shard(self, world: World) -> DataShard:
        """This process's share of the data (see :class:`DataShard`); every rank its own by default."""
        return DataShard(world.rank, world.world_size)

    def rank_facts(self) -> dict[str, Any]:
        """What this rank measured that the record needs from every rank (a pipeline rank's idle time), as plain
        data. The runner sends it to rank 0 with the rank's log, after training."""
        return {}

    def add_rank_logs(self, logs: list[RankLog]) -> None:
        """On rank 0, before :meth:`describe`: every rank's log (its measurements and ``executor_facts``, what
        :meth:`rank_facts` returned there), or rank 0's alone when another rank failed."""


# torch.compile modes that capture CUDA graphs (inductor's cudagraph trees)
CUDA_GRAPH_MODES = frozenset({"reduce-overhead", "max-autotune"})


class TorchExecutor(Executor):
    """Single-device eager (optionally torch.compile'd) training: the reference tuned loop.

    Exactly what a hand-written loop does: autocast when the plan says so, a GradScaler for fp16,
    gradient clipping, a fused optimizer, ``zero_grad(set_to_none=True)``.
    """

    def __init__(self, request: ExecutorRequest) -> None:
        self.request = request
        self.device = request.device
        plan = request.precision
        self._autocast: Any = (
            torch.autocast(self.device.type, dtype=plan.torch_autocast_dtype)
            if plan.torch_autocast_dtype is not None
            else contextlib.nullcontext()
        )
        self._scaler = torch.amp.GradScaler(self.device.type) if plan.loss_scaling == "dynamic" else None
        self._clip: float | None = None
        self.model: torch.nn.Module
        self.optimizer: torch.optim.Optimizer

    def setup(self, job: TrainingJob) -> None:
        model = job.model.to(device=self.device, dtype=self.request.precision.torch_param_dtype)
        self.model = self.wrap(model.train(), job.units)
        self.optimizer = job.make_optimizer(
            self.model, self.device
        )  # after wrapping: sharding replaces params
        self._clip = job.grad_clip_norm
        config = self.request.config
        self._step_model: torch.nn.Module = self.model
        self._cuda_graphs = False
        if config.compile:
            # static shapes: an epoch's smaller last batch gets its own graph (compiled in the warm-up epoch)
            # instead of turning every later step into a dynamic-shape graph
            mode = None if config.compile_mode == "default" else config.compile_mode
            self._step_model = cast(torch.nn.Module, torch.compile(self.model, mode=mode, dynamic=False))
            self._cuda_graphs = config.compile_mode in CUDA_GRAPH_MODES and self.device.type == "cuda"

    @property
    def replays_graphs(self) -> bool:
        return getattr(self, "_cuda_graphs", False)

    def wrap(self, model: torch.nn.Module, units: ModelUnits) -> torch.nn.Module:
        """The distribution strategy: DDP, FSDP, ... subclasses wrap or shard the placed model here, finding its
        parts through ``units`` (the workload's description), never through the model's attributes."""
        return model

    def compile(self, inputs: torch.Tensor, targets: torch.Tensor) -> float | None:
        if not self.request.config.compile:
            return None
        start = time.perf_counter()
        parts = self.request.config.grad_accum  # training runs micro-batches: compile for their shape
        inputs, targets = inputs.tensor_split(parts)[0], targets.tensor_split(parts)[0]
        if self._cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with self._autocast:
            loss = self._step_model(inputs, targets)
        loss.backward()
        self.optimizer.zero_grad(set_to_none=True)
        self.request.synchronize(self.device)
        return time.perf_counter() - start

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss = self._backward(inputs, targets)
        if self._scaler is not None:
            if self._clip is not None:
                self._scaler.unscale_(self.optimizer)
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self._clip, foreach=True)
            self._scaler.step(self.optimizer)
            self._scaler.update()
        else:
            if self._clip is not None:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self._clip, foreach=True)
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        # a CUDA graph's output lives in memory the next replay overwrites: the runner keeps every step's loss
        return loss.clone() if self._cuda_graphs else loss

    def _backward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Forward and backward of one batch, as ``--grad-accum`` micro-batches whose gradients add up in
        ``.grad``; returns the batch's loss (detached). Each micro-batch's loss is weighted by its share of the
        batch, so the summed gradient and the returned loss are those of the whole batch (a mean loss)."""
        parts = min(self.request.config.grad_accum, inputs.shape[0])  # an epoch's last batch may be smaller
        pieces = (
            zip(inputs.tensor_split(parts), targets.tensor_split(parts), strict=True)
            if parts > 1
            else [(inputs, targets)]
        )
        total: torch.Tensor | None = None
        for index, (x, y) in enumerate(pieces):
            with self.gradient_sync(last=index == parts - 1):
                if self._cuda_graphs:  # a new replay: the graphs' outputs of the last one may be overwritten
                    torch.compiler.cudagraph_mark_step_begin()
                with self._autocast:
                    loss = self._step_model(x, y)
                if parts > 1:
                    loss = loss * (x.shape[0] / inputs.shape[0])
                (self._scaler.scale(loss) if self._scaler is not None else loss).backward()
            total = loss.detach() if total is None else total + loss.detach()
        assert total is not None
        return total

    def gradient_sync(self, last: bool) -> contextlib.AbstractContextManager[None]:
        """Where gradients are reduced across ranks: strategies that reduce during backward (DDP, FSDP) skip it
        for every micro-batch but the ``last`` of a batch. A single device has nothing to reduce."""
        return contextlib.nullcontext()

    def describe(self) -> dict[str, Any]:
        optimizer = getattr(self, "optimizer", None)  # absent when setup failed
        defaults = getattr(optimizer, "defaults", {})
        return {
            "executor": type(self).__name__,
            "torch_compile": self.request.config.compile,
            "compile_mode": self.request.config.compile_mode if self.request.config.compile else None,
            "cuda_graphs": getattr(self, "_cuda_graphs", False),
            "optimizer": type(optimizer).__name__ if optimizer else None,
            "fused_optimizer": bool(defaults.get("fused")),
            "grad_clip_norm": self._clip,
            "loss_scaler": "GradScaler" if self._scaler is not None else None,
            "grad_accum": self.request.config.grad_accum,
            "micro_batch": self.request.config.batch_size // self.request.config.grad_accum,
        }
