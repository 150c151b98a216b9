"""The same workload through PyTorch Lightning (Fabric), as the seed study trained it (``--engine lightning``).

Lightning owns the strategy wrapping, precision and gradient clipping here; the runner times it exactly as it times
the native engine, so the difference between the two records is the framework's overhead.
(optional: ``pip install 'accelbench[lightning]'``)
"""

from __future__ import annotations

import importlib.util
import math
from contextlib import nullcontext
from typing import Any

import torch

from accelbench.contract import Executor, ExecutorRequest
from accelbench.contract.strategies import ZERO_STRATEGIES, Strategy
from accelbench.errors import ConfigError
from accelbench.workloads import TrainingJob

PRECISION: dict[str, Any] = {
    "fp32": "32-true",
    "fp16-mixed": "16-mixed",
    "bf16-mixed": "bf16-mixed",
    "bf16-true": "bf16-true",
}
STRATEGY: dict[str, str] = {  # accelbench strategy -> Lightning Fabric strategy
    Strategy.SINGLE: "auto",
    Strategy.DDP: "ddp",
    Strategy.FSDP: "fsdp",
    Strategy.ZERO1: "deepspeed_stage_1",
    Strategy.ZERO2: "deepspeed_stage_2",
    Strategy.ZERO3: "deepspeed_stage_3",
}


def require_lightning() -> None:
    if importlib.util.find_spec("lightning") is None:
        raise ConfigError("--engine lightning needs PyTorch Lightning: pip install 'accelbench[lightning]'")


class LightningExecutor(Executor):
    """Trains through ``lightning.Fabric`` with the matching Lightning strategy and precision."""

    def __init__(self, request: ExecutorRequest) -> None:
        require_lightning()
        device_type = request.device.type
        self.accelerator = (
            request.backend.lightning_accelerator()
        )  # a name Lightning knows, or an Accelerator
        if self.accelerator is None:
            raise ConfigError(
                f"backend {request.backend.name!r} names no Lightning accelerator for device type {device_type!r}; "
                "use --engine native"
            )
        if request.strategy not in STRATEGY:
            raise ConfigError(
                f"strategy {request.strategy!r} has no Lightning equivalent; with --engine lightning use one of: "
                f"{', '.join(STRATEGY)}"
            )
        if request.strategy == Strategy.FSDP and device_type == "cpu":
            raise ConfigError("Lightning's FSDP strategy refuses CPU; use --engine native for fsdp on CPU")
        if request.strategy in ZERO_STRATEGIES and request.config.grad_accum > 1:
            raise ConfigError(
                "--grad-accum with --engine lightning and a deepspeed strategy: Fabric leaves DeepSpeed's own "
                "accumulation unconfigured; use --engine native (which sets gradient_accumulation_steps)"
            )
        self.request = request
        self.fabric: Any = None

    def setup(self, job: TrainingJob) -> None:
        if importlib.util.find_spec("torchvision") is not None:
            from accelbench.workloads.vision.library import load_torchvision

            load_torchvision()  # Lightning's metrics import torchvision: a build for another torch must not break it
        from lightning.fabric import Fabric

        request = self.request
        world = request.world
        self.fabric = Fabric(
            accelerator=self.accelerator,
            devices=max(1, world.world_size // request.config.nnodes),
            num_nodes=request.config.nnodes,
            strategy=STRATEGY[request.strategy],
            precision=PRECISION[request.precision.name],
        )
        self.fabric.launch()  # joins the process group the launcher's environment describes; starts nothing
        model = job.model.train()
        optimizer = job.make_optimizer(
            model.to(request.device), request.device, request.backend.optimizer_implementation(request.device)
        )
        self.model, self.optimizer = self.fabric.setup(model, optimizer)
        self._clip = job.grad_clip_norm

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """With ``--grad-accum``, micro-batches weighted by their share of the batch, gradient reduction skipped
        for all but the last (Fabric's ``no_backward_sync``), one optimizer step."""
        parts = min(self.request.config.grad_accum, inputs.shape[0])
        total: torch.Tensor | None = None
        for index, (x, y) in enumerate(
            zip(inputs.tensor_split(parts), targets.tensor_split(parts), strict=True)
        ):
            last = index == parts - 1
            sync = self.fabric.no_backward_sync(self.model, enabled=not last) if parts > 1 else nullcontext()
            with sync:
                loss = self.model(x, y) * (x.shape[0] / inputs.shape[0]) if parts > 1 else self.model(x, y)
                self.fabric.backward(loss)
                self.request.backend.after_backward(self.request.device)
            total = loss.detach() if total is None else total + loss.detach()
        assert total is not None
        if self._clip is not None:
            self.fabric.clip_gradients(self.model, self.optimizer, max_norm=self._clip)
        self.optimizer.step()
        self.request.backend.after_optimizer_step(self.request.device)
        self.optimizer.zero_grad(set_to_none=True)
        return total

    def evaluate(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """The held-out loss through Fabric's wrapped model (its precision plugin applies the run's precision to
        the forward, its strategy the sharding) in eval mode under ``torch.no_grad``; train mode restored after."""
        self.model.eval()
        try:
            with torch.no_grad():
                return self.model(inputs, targets).detach().float()
        finally:
            self.model.train()

    def gradient_norm(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """One forward through Fabric's wrapped model (its precision, its strategy's hooks: DDP all-reduces the
        gradients during backward, so every rank's are the global batch's) and a backward with no loss scaling (the
        norm is of the true gradients), the total L2 norm with an infinite limit (nothing clipped: FSDP's own
        ``clip_grad_norm_`` over its shards, else the backend's), and the gradients cleared; the optimizer never
        sees them (Fabric's ``clip_gradients`` is not used: under fp16 it would unscale the optimizer's gradients for
        a step that never comes). The DeepSpeed strategies probe their engine as the native DeepSpeed executor
        does (:func:`accelbench.engine.deepspeed.engine_gradient_norm`)."""
        request = self.request
        # what Fabric's strategy made of the model: a DDP or FSDP module, a DeepSpeed engine, or the model itself
        wrapped = getattr(self.model, "_forward_module", self.model)
        if request.strategy in ZERO_STRATEGIES:
            from accelbench.engine.deepspeed import engine_gradient_norm

            norm = engine_gradient_norm(wrapped, inputs, targets)
            request.backend.end_of_step(request.device)
            return norm
        self.optimizer.zero_grad(set_to_none=True)
        self.model(inputs, targets).backward()
        request.backend.after_backward(request.device)
        own = getattr(wrapped, "clip_grad_norm_", None)  # FSDP's: the norm over every rank's shards
        parameters = self.model.parameters()
        norm = own(math.inf) if own is not None else request.backend.clip_grad_norm(parameters, math.inf)
        self.optimizer.zero_grad(set_to_none=True)
        request.backend.end_of_step(request.device)
        return norm.detach().float()

    def describe(self) -> dict[str, Any]:
        import lightning

        return {
            "executor": type(self).__name__,
            "engine": "lightning",
            "lightning_version": lightning.__version__,
            "lightning_accelerator": str(self.accelerator),
            "lightning_strategy": STRATEGY[self.request.strategy],
            "lightning_precision": PRECISION[self.request.precision.name],
            "strategy": self.request.strategy,
            "grad_accum": self.request.config.grad_accum,
        }
