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
from typing import Any, cast

import torch

from accelbench.config import RunConfig
from accelbench.precision import PrecisionPlan
from accelbench.workloads import ModelUnits, TrainingJob


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
        if self._cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with self._autocast:
            loss = self._step_model(inputs, targets)
        loss.backward()
        self.optimizer.zero_grad(set_to_none=True)
        self.request.synchronize(self.device)
        return time.perf_counter() - start

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self._cuda_graphs:  # a new step: the graphs' outputs of the last one may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        with self._autocast:
            loss = self._step_model(inputs, targets)
        if self._scaler is not None:
            self._scaler.scale(loss).backward()
            if self._clip is not None:
                self._scaler.unscale_(self.optimizer)
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self._clip, foreach=True)
            self._scaler.step(self.optimizer)
            self._scaler.update()
        else:
            loss.backward()
            if self._clip is not None:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self._clip, foreach=True)
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        # a CUDA graph's output lives in memory the next replay overwrites: the runner keeps every step's loss
        return loss.detach().clone() if self._cuda_graphs else loss.detach()

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
        }
