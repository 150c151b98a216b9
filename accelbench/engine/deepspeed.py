"""DeepSpeed ZeRO stages 1-3 as an executor (optional: ``pip install 'accelbench[deepspeed]'``)."""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from accelbench.contract import Executor, ExecutorRequest, PrecisionPlan
from accelbench.contract.strategies import ZERO_STRATEGIES, Strategy
from accelbench.errors import ConfigError
from accelbench.workloads import TrainingJob

STAGES = {s: Strategy(s).zero_stage for s in ZERO_STRATEGIES}


def require_deepspeed() -> None:
    if importlib.util.find_spec("deepspeed") is None:
        raise ConfigError(
            "the deepspeed-zero strategies need DeepSpeed: pip install 'accelbench[deepspeed]' "
            "(on a CPU-only machine: pip install --no-build-isolation deepspeed)"
        )


class DeepSpeedExecutor(Executor):
    """``deepspeed.initialize`` with ZeRO stage 1, 2 or 3, the workload's AdamW as the client optimizer,
    DeepSpeed's own gradient clipping and mixed precision (bf16, or fp16 with dynamic loss scaling)."""

    def __init__(self, request: ExecutorRequest) -> None:
        require_deepspeed()
        if request.strategy not in STAGES:
            raise ConfigError(f"unknown DeepSpeed strategy {request.strategy!r}; known: {', '.join(STAGES)}")
        if request.precision.name == "bf16-true":
            raise ConfigError(
                "DeepSpeed keeps fp32 master weights: use bf16-mixed, not bf16-true, with deepspeed"
            )
        if request.config.compile:
            raise ConfigError("--compile is not supported with the deepspeed strategies; drop --compile")
        self.request = request
        self.stage = STAGES[request.strategy]
        self.engine: Any = None

    def ds_config(self, job: TrainingJob) -> dict[str, Any]:
        name = self.request.precision.name
        parts = self.request.config.grad_accum
        config: dict[str, Any] = {
            "train_micro_batch_size_per_gpu": self.request.config.batch_size // parts,
            "gradient_accumulation_steps": parts,
            "zero_optimization": {"stage": self.stage},
            "steps_per_print": 2**31 - 1,  # no logging inside timed epochs
            "wall_clock_breakdown": False,
        }
        if job.grad_clip_norm is not None:
            config["gradient_clipping"] = job.grad_clip_norm
        if name == "bf16-mixed":
            config["bf16"] = {"enabled": True}
        elif name == "fp16-mixed":
            config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}  # 0 = dynamic
        return config

    def setup(self, job: TrainingJob) -> None:
        import deepspeed

        model = job.model.to(self.request.device).train()
        optimizer = job.make_optimizer(
            model, self.request.device, self.request.backend.optimizer_implementation(self.request.device)
        )
        self.config = self.ds_config(job)
        if not isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
            # ZeRO shards any torch optimizer's state, but asks to be told for those outside its tested list (the
            # image workloads' SGD and RMSprop)
            self.config["zero_allow_untested_optimizer"] = True
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=self.config)

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """One batch as ``gradient_accumulation_steps`` micro-batches: DeepSpeed divides each micro-batch's loss
        by that count in ``backward`` and applies the optimizer step only at the boundary (the last ``step``)."""
        parts = min(self.request.config.grad_accum, inputs.shape[0])
        total: torch.Tensor | None = None
        for x, y in zip(inputs.tensor_split(parts), targets.tensor_split(parts), strict=True):
            loss = self.engine(x, y)
            self.engine.backward(loss)
            self.request.backend.after_backward(self.request.device)
            self.engine.step()
            share = loss.detach() * (x.shape[0] / inputs.shape[0])
            total = share if total is None else total + share
        self.request.backend.after_optimizer_step(self.request.device)  # the boundary step applied the update
        assert total is not None
        return total

    def evaluate(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """The held-out loss through the engine (its ZeRO stage gathers the sharded parameters as in training) in
        eval mode under ``torch.no_grad``, in DeepSpeed's precision; train mode restored after. No gradient probe:
        the engine's gradients live in ZeRO's partitioned buffers, which only its own step reads and clears."""
        self.engine.eval()
        try:
            with torch.no_grad():
                return self.engine(inputs, targets).detach().float()
        finally:
            self.engine.train()

    def effective_precision(self, requested: PrecisionPlan) -> PrecisionPlan:
        if requested.name == "fp32":
            return requested
        dtype = "bfloat16" if requested.name == "bf16-mixed" else "float16"
        return requested.model_copy(
            update={
                "param_dtype": dtype,
                "autocast_dtype": None,
                "notes": f"DeepSpeed {dtype} mode: {dtype} parameters and activations, fp32 master weights "
                "in the optimizer" + (", dynamic loss scaling" if dtype == "float16" else ""),
            }
        )

    def describe(self) -> dict[str, Any]:
        import deepspeed

        return {
            "executor": type(self).__name__,
            "strategy": self.request.strategy,
            "zero_stage": self.stage,
            "deepspeed_version": deepspeed.__version__,
            "deepspeed_config": getattr(self, "config", None),
            "optimizer": "the workload's optimizer (client optimizer, wrapped by ZeRO)",
            "grad_accum": self.request.config.grad_accum,
        }

    def close(self) -> None:
        self.engine = None
