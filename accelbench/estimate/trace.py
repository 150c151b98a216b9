"""``accelbench estimate --trace``: a second opinion on "fits", from one training step traced without memory.

The formulas (:mod:`accelbench.estimate.predictor`) add up weights, gradients, optimizer state and activations by
kind; the trace runs the step itself. It builds the workload under torch's ``FakeTensorMode`` (tensors with shapes,
dtypes and storage sizes, and no storage), sets it up with the engine's own single-device executor
(:class:`~accelbench.engine.executor.TorchExecutor`: the precision plan's autocast and parameter dtype, the
optimizer and its kernels, gradient clipping, ``zero_grad(set_to_none=True)``), gives the optimizer its state
with one optimizer step, then runs one whole training step (forward, backward, optimizer step) under the same
MemTracker a run's tensor peak is measured with (:mod:`accelbench.engine.tensor_peak`). Its peak is the live
tensor bytes of that step, what a run's measured tensor peak is: gpt2-xl costs seconds and no memory.

What it traces: the strategies whose device runs the whole model's step alone, ``single`` and ``ddp`` (traced as its
single-device step, which frees the gradients after each step where DDP keeps them in its buckets: a peak in the
forward pass is understated by up to one gradient-sized buffer). Strategies that shard or split the model (FSDP, DeepSpeed ZeRO, tensor and pipeline parallelism) need a
process group to build: refused, and the formula still answers for them. The fake tensors live on a fake CPU: the
CPU's autocast op lists and optimizer kernels, and no allocator rounding (a CUDA allocator rounds each block up to
512 bytes). Attention is held as the device predicted for holds it: where that device's fused kernel keeps no
scores (a GPU's, with dropout too), the fake CPU's attention runs without its dropout, so that it takes its flash
kernel rather than the math path that keeps them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from accelbench.contract.strategies import Strategy
from accelbench.errors import ConfigError

if TYPE_CHECKING:
    from accelbench.config import RunConfig
    from accelbench.contract import PrecisionPlan
    from accelbench.plugins import PluginHost
    from accelbench.workloads import Workload

TRACEABLE = (Strategy.SINGLE, Strategy.DDP)

SOURCE = (
    "one training step of the model built under torch FakeTensorMode (no storage), set up by the engine's "
    "single-device executor and traced with torch.distributed._tools.mem_tracker.MemTracker (live tensor bytes)"
)


@dataclass(frozen=True)
class TracedStep:
    """The traced step's peak of live tensor bytes on one device, by kind (adding up to ``peak_bytes``)."""

    peak_bytes: int
    by_kind: dict[str, int]
    source: str
    notes: tuple[str, ...] = ()


def check_traceable(config: RunConfig) -> None:
    """Refuse, before anything is built, a configuration ``--trace`` cannot trace, saying which can and that the
    formula answers without it."""
    why = None
    if config.engine != "native":
        why = f"--engine {config.engine} runs its own loop; --trace traces the native engine's step"
    elif config.strategy not in TRACEABLE:
        why = (
            f"--strategy {config.strategy} shards or splits the model over a process group, which a trace without "
            f"devices cannot build; --trace traces {' and '.join(map(str, TRACEABLE))}"
        )
    if why is not None:
        raise ConfigError(
            f"--trace: {why}. Drop --trace: the formula's prediction answers for this configuration"
        )


def trace_step(
    host: PluginHost, workload: Workload, config: RunConfig, plan: PrecisionPlan, keeps_scores: bool = True
) -> TracedStep:
    """Trace one training step of ``config``'s single-device equivalent under ``plan`` (the precision plan of the
    device predicted for) without storage; a ConfigError saying why where this workload cannot be traced.

    ``keeps_scores``: whether the device predicted for keeps attention's ``b a s^2`` scores for backward. The fake
    CPU does where the model has dropout (its flash kernel takes none, so torch runs the math path). A GPU's flash
    and memory-efficient kernels take dropout and keep only the output and its log-sum-exp (the mask is drawn again
    from the saved random state in backward). With False the trace's attention runs without dropout, which on the
    CPU is its flash kernel, holding what a GPU's does. On an H100, gpt2-large in bf16-mixed trained at batch 320
    (77.1 GiB), where a trace keeping the scores said batch 256 needed 116 GB."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from accelbench.contract import ExecutorRequest, World
    from accelbench.engine.distributed import executor_for
    from accelbench.engine.executor import TorchExecutor
    from accelbench.engine.tensor_peak import TOTAL, measure_step
    from accelbench.workloads import shapes_only

    check_traceable(config)
    single = config.model_copy(update={"strategy": str(Strategy.SINGLE), "devices": 1, "nnodes": 1})
    device = torch.device("cpu")
    notes = []
    if config.strategy != Strategy.SINGLE:
        notes.append(
            f"{config.strategy} traced as its single-device step (DDP's gradient buckets, held across steps, are "
            "not: a peak in the forward pass is understated by up to the gradients' size)"
        )
    if config.compile:
        notes.append("traced eagerly: --compile's fused kernels may hold fewer temporaries")
    if not keeps_scores:
        notes.append(
            "attention traced without its dropout, as the device's fused kernel holds it: no scores kept for backward"
        )
    try:
        with FakeTensorMode(allow_non_fake_inputs=True), _attention_keeping_scores(keeps_scores):
            with shapes_only():
                job = workload.build(single)
            if single.activation_checkpointing:  # as the run: each layer's forward again in backward
                from accelbench.engine.checkpointing import apply_activation_checkpointing

                apply_activation_checkpointing(job.model, job.units)
            request = ExecutorRequest(
                config=single,
                device=device,
                precision=plan,
                world=World(),
                backend=host.select_backend("cpu"),
                units=workload.units(single),
                default_executor=executor_for,
            )
            executor = TorchExecutor(request)
            _cast_in_place(job.model, plan.torch_param_dtype)
            executor.setup(job)
            inputs, targets = next(job.data.batches(0, 0, 1))
            _give_optimizer_state(executor.model, executor.optimizer)
            peak = measure_step(
                lambda: executor.train_step(inputs, targets),
                executor.model,
                executor.optimizer,
                device,
                (inputs, targets),
            )
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - a workload whose build or step fake tensors cannot run
        text = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        raise ConfigError(
            f"--trace: the {config.workload} workload's step cannot be traced without storage ({text}); drop "
            "--trace: the formula's prediction answers for this configuration"
        ) from None
    total = peak.pop(TOTAL)
    return TracedStep(peak_bytes=total, by_kind=peak, source=SOURCE, notes=tuple(notes))


@contextmanager
def _attention_keeping_scores(keeps: bool) -> Iterator[None]:
    """Within it, where ``keeps`` is False, ``torch.nn.functional.scaled_dot_product_attention`` runs without
    dropout (the workloads call it through the module, so each call sees this): the memory of a fused kernel."""
    import torch.nn.functional as F

    if keeps:
        yield
        return
    fused = F.scaled_dot_product_attention

    def without_dropout(
        query: Any,
        key: Any,
        value: Any,
        attn_mask: Any = None,
        dropout_p: float = 0.0,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        return fused(query, key, value, attn_mask, 0.0, *args, **kwargs)

    F.scaled_dot_product_attention = without_dropout
    try:
        yield
    finally:
        F.scaled_dot_product_attention = fused


def _cast_in_place(model: Any, dtype: Any) -> None:
    """The executor's ``model.to(dtype=...)``, done here: torch cannot ``.to()`` a module of fake tensors (it swaps
    each parameter, and refuses one the fake mode holds a weak reference to), so the floating-point parameters and
    buffers are cast in place and the executor's ``.to`` left with nothing to do."""
    for tensor in [*model.parameters(), *model.buffers()]:
        if tensor.is_floating_point() and tensor.dtype != dtype:
            tensor.data = tensor.data.to(dtype)
    model.to = lambda *args, **kwargs: model


def _give_optimizer_state(model: Any, optimizer: Any) -> None:
    """The optimizer's state as a run's steps after the first hold it (AdamW's moments), from one optimizer step on
    zero gradients: a whole training step would cost as much again, and the state is all it leaves."""
    import torch

    for parameter in model.parameters():
        if parameter.requires_grad:
            parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
