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
        eval mode under ``torch.no_grad``, in DeepSpeed's precision; train mode restored after."""
        self.engine.eval()
        try:
            with torch.no_grad():
                return self.engine(inputs, targets).detach().float()
        finally:
            self.engine.train()

    def gradient_norm(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """The global gradient norm of one forward and backward (:func:`engine_gradient_norm`); no optimizer step."""
        norm = engine_gradient_norm(self.engine, inputs, targets)
        self.request.backend.end_of_step(self.request.device)
        return norm

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

    def tensors_before_step(self) -> list[torch.nn.Module | torch.optim.Optimizer | torch.Tensor] | None:
        """ZeRO's own tensors first (the flat buffers and partitions its optimizer keeps as attributes, counted as
        'other'), then the engine's module (parameters: under ZeRO-1/2 views of its flat buffer, which then counts
        as parameters) and the client optimizer (the fp32 master partitions' moments), so each storage lands under
        the most specific kind (MemTracker keeps a storage's last registration)."""
        if self.engine is None:
            return None
        zero = self.engine.optimizer
        client = getattr(zero, "optimizer", None)
        kept = [t for t in _tensors_in(vars(zero).values()) if t.numel()] if zero is not None else []
        return [
            *kept,
            self.engine,
            *([client] if isinstance(client, torch.optim.Optimizer) else []),
        ]

    def tensor_peak_caveat(self) -> str | None:
        return (
            f"DeepSpeed ZeRO-{self.stage}: the flat buffers and partitions its optimizer holds between steps are "
            "counted (as 'other' where they are not a parameter's storage or the client optimizer's state); "
            "buffers DeepSpeed's C++ ops or its communication backend allocate for themselves are not seen"
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


def engine_gradient_norm(engine: Any, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The L2 norm of the gradient a DeepSpeed ``engine``'s step would apply for this batch (before clipping), as
    one device computes it for the ranks' batches together, without touching the engine's own gradients.

    ZeRO keeps the gradients of ``engine.backward`` in partitioned, accumulating buffers that only its ``step`` reads
    and clears, and its norm is computed inside that step: a probe through them would have to step or reach into
    private state. Instead the probe runs the engine's module forward (its parameters in DeepSpeed's precision;
    under ZeRO-3 its hooks gather each layer's parameters for the forward and again for the backward) and asks
    ``torch.autograd.grad`` for the parameters' gradients, which leaves ``.grad``, ZeRO's reduction hooks (on
    gradient accumulation) and its buffers untouched. Each gradient is averaged over the data-parallel ranks, as
    ZeRO averages them, and the squares summed; every rank gets the same norm. No loss scaling: the norm is of the
    true gradients. Under ZeRO-3 each gradient is whole on every rank until it is reduced, one at a time."""
    import torch.distributed as dist

    module = engine.module
    params = [p for p in module.parameters() if p.requires_grad]
    loss = module(inputs, targets)
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    squares = torch.zeros((), device=loss.device, dtype=torch.float32)
    for grad in grads:
        if grad is None:
            continue
        grad = grad.float()
        if world > 1:
            dist.all_reduce(grad)
            grad /= world
        squares += grad.square().sum()
    return squares.sqrt().detach()


def _tensors_in(values: Any) -> list[torch.Tensor]:
    """The tensors among ``values`` and within their lists, tuples and dicts (two levels: ZeRO keeps a list of
    flat buffers per parameter group, and dicts of lists of gradient partitions)."""
    found: list[torch.Tensor] = []

    def walk(value: Any, depth: int) -> None:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif depth and isinstance(value, (list, tuple)):
            for item in value:
                walk(item, depth - 1)
        elif depth and isinstance(value, dict):
            for item in value.values():
                walk(item, depth - 1)

    for value in values:
        walk(value, 3)
    return found
