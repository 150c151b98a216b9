"""The core's executors: the reference tuned loop on one device; DDP, FSDP, DeepSpeed, tensor/pipeline parallelism
and Lightning build on it or beside it (:mod:`accelbench.engine.distributed`).

The executor interface itself is the contract's (:class:`accelbench.contract.Executor`): a backend that replicates
or compiles by itself (IPUs) returns its own executor. Every core executor routes the device-specific parts of a
step through the backend: step boundaries, gradient clipping, the compile backend and the optimizer kernels.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from accelbench.contract import Executor, ExecutorRequest, Float8Layers, PrecisionPlan
from accelbench.workloads import ModelUnits, TrainingJob

# torch.compile modes that capture CUDA graphs (inductor's cudagraph trees)
CUDA_GRAPH_MODES = frozenset({"reduce-overhead", "max-autotune"})


class TorchExecutor(Executor):
    """Single-device eager (optionally torch.compile'd) training: the reference tuned loop.

    Exactly what a hand-written loop does: autocast when the plan says so, a GradScaler for fp16,
    gradient clipping, a fused optimizer, ``zero_grad(set_to_none=True)``.
    """

    def __init__(self, request: ExecutorRequest) -> None:
        self.request = request
        self.backend = request.backend
        self.device = request.device
        plan = request.precision
        self._autocast: Any = (
            torch.autocast(self.device.type, dtype=plan.torch_autocast_dtype)
            if plan.torch_autocast_dtype is not None
            else contextlib.nullcontext()
        )
        self._scaler = torch.amp.GradScaler(self.device.type) if plan.loss_scaling == "dynamic" else None
        self._clip: float | None = None
        self._fp8_layers: Float8Layers | None = None  # what ran in FP8, once an FP8 run's model is converted
        self.model: torch.nn.Module
        self.optimizer: torch.optim.Optimizer

    def setup(self, job: TrainingJob) -> None:
        plan = self.request.precision
        model = job.model.to(device=self.device, dtype=plan.torch_param_dtype)
        if plan.fp8_recipe is not None:  # torchao's Float8Linear in place of the linears, before any wrapping
            from accelbench.engine.float8 import convert_to_fp8

            self._fp8_layers = convert_to_fp8(
                model,
                plan.fp8_recipe,
                job.units,
                job.flops_per_sample,
                job.tokens_per_sample,
                expected_e4m3=plan.fp8_e4m3_dtype,
                micro_batch=self.request.config.batch_size // self.request.config.grad_accum,
            )
        self.model = self.wrap(model.train(), job.units)
        # after wrapping: sharding replaces params; the backend says which optimizer kernels its device has
        self.optimizer = job.make_optimizer(
            self.model, self.device, self.backend.optimizer_implementation(self.device)
        )
        self._clip = job.grad_clip_norm
        config = self.request.config
        self._step_model: torch.nn.Module = self.model
        self._cuda_graphs = False
        if config.compile:  # the backend's compiler (inductor, hpu_backend, openxla) with its options
            self._step_model = self.backend.compile_model(self.model, config.compile_mode)
            self._cuda_graphs = (
                config.compile_mode in CUDA_GRAPH_MODES
                and self.device.type == "cuda"
                and self.backend.compile_backend() == "inductor"
            )

    @property
    def replays_graphs(self) -> bool:
        return getattr(self, "_cuda_graphs", False)

    def effective_precision(self, requested: PrecisionPlan) -> PrecisionPlan:
        """The plan, with which linears ran in FP8 once an FP8 run's model is converted."""
        layers = self._fp8_layers
        return requested if layers is None else requested.model_copy(update={"fp8_layers": layers})

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
        self.backend.after_backward(self.device)
        self.optimizer.zero_grad(set_to_none=True)
        self.backend.end_of_step(self.device)
        self.backend.synchronize(self.device)
        return time.perf_counter() - start

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss = self._backward(inputs, targets)
        if self._scaler is not None:
            if self._clip is not None:
                self._scaler.unscale_(self.optimizer)
                self.backend.clip_grad_norm(self.model.parameters(), self._clip)
            self._scaler.step(self.optimizer)
            self._scaler.update()
        else:
            if self._clip is not None:
                self.backend.clip_grad_norm(self.model.parameters(), self._clip)
            self.optimizer.step()
        self.backend.after_optimizer_step(self.device)
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
                self.backend.after_backward(self.device)
            total = loss.detach() if total is None else total + loss.detach()
        assert total is not None
        return total

    def evaluate(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """The held-out loss: the wrapped model (not its compiled form, whose graphs are captured for training) in
        eval mode under ``torch.no_grad`` and the run's autocast; train mode is restored after."""
        self.model.eval()
        try:
            with torch.no_grad(), self._autocast:
                return self.model(inputs, targets).detach().float()
        finally:
            self.model.train()

    @contextlib.contextmanager
    def norm_statistics_recomputed(
        self, batches: Iterable[tuple[torch.Tensor, torch.Tensor]]
    ) -> Iterator[int | None]:
        """Precise batch norm: every batch-norm layer's running statistics reset and recomputed as the plain
        average over ``batches`` (momentum None; forward only, no gradients, the run's autocast; the rest of the
        model in eval mode, as evaluation runs it, so that dropout and stochastic depth do not shift the statistics),
        through the bare module: DDP's wrapper would broadcast rank 0's buffers before each forward, while here each
        rank averages its own shard; FSDP2's hooks are on the module itself. Inside the context the model is in
        the mode training left it, with the new statistics frozen (momentum 0: a forward in train mode, such as the
        gradient probe's, leaves them as they are). The training's statistics and momenta are put back on
        leaving, so evaluating this way or not trains the same model."""
        module: torch.nn.Module = getattr(self.model, "module", self.model)
        norms = batch_norms(module)
        if not norms:
            yield 0
            return
        kept = [
            (m.momentum, {name: buffer.clone() for name, buffer in m.named_buffers(recurse=False)})
            for m in norms
        ]
        training = module.training
        try:
            # the forward evaluation runs (dropout and stochastic depth off), but with the batch-norm layers
            # normalising by, and averaging, each batch's own statistics
            module.eval()
            for m in norms:
                m.train()
                m.reset_running_stats()
                m.momentum = None  # a cumulative average over the batches
            used = 0
            with torch.no_grad(), self._autocast:
                for x, y in batches:
                    module(x, y)
                    used += 1
            # inside the context the model is as training left it, its new statistics frozen (momentum 0): the
            # gradient probe's forward in train mode on a held-out batch must not move them
            module.train(training)
            for m in norms:
                m.momentum = 0.0
            yield used
        finally:
            module.train(training)
            for m, (momentum, buffers) in zip(norms, kept, strict=True):
                m.momentum = momentum
                for name, value in buffers.items():
                    getattr(m, name).copy_(value)

    def gradient_norm(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """One forward and backward as a training step makes them (train mode, autocast, the backend's step
        boundaries, every hook on the parameters), no loss scaling (the norm is of the true gradients), then the
        total L2 norm by the backend's ``clip_grad_norm`` with an infinite limit (so nothing is clipped; across
        ranks as the strategy's gradients are: all-reduced by DDP, sharded DTensors under FSDP2) and the gradients
        cleared: the optimizer never sees them."""
        self.optimizer.zero_grad(set_to_none=True)
        with self._autocast:
            loss = self.model(inputs, targets)
        loss.backward()
        self.backend.after_backward(self.device)
        norm = self.backend.clip_grad_norm(self.model.parameters(), math.inf)
        full_tensor = getattr(norm, "full_tensor", None)  # a DTensor (FSDP2's sharded gradients)
        norm = (full_tensor() if full_tensor is not None else norm).detach().float()
        self.optimizer.zero_grad(set_to_none=True)
        self.backend.end_of_step(self.device)
        return norm

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
            "compile_backend": self.backend.compile_backend() if self.request.config.compile else None,
            "cuda_graphs": getattr(self, "_cuda_graphs", False),
            "optimizer": type(optimizer).__name__ if optimizer else None,
            "fused_optimizer": bool(defaults.get("fused")),
            "optimizer_implementation": _implementation(defaults),
            "grad_clip_norm": self._clip,
            "loss_scaler": "GradScaler" if self._scaler is not None else None,
            "grad_accum": self.request.config.grad_accum,
            "micro_batch": self.request.config.batch_size // self.request.config.grad_accum,
        }


def batch_norms(module: torch.nn.Module) -> list[torch.nn.modules.batchnorm._BatchNorm]:
    """The batch-norm layers of ``module`` (every dimension), whose running statistics evaluation reads."""
    return [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]


def _implementation(defaults: dict[str, Any]) -> str:
    """Which kernels an optimizer's parameter groups run: 'fused', 'foreach' or 'plain'."""
    if defaults.get("fused"):
        return "fused"
    return "foreach" if defaults.get("foreach") else "plain"
