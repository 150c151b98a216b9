"""The live tensor peak of one training step, measured with PyTorch's own ``MemTracker``.

Why: a CPU backend's memory reading is the process's resident-set high-water mark (the interpreter, its libraries,
allocator slack and every tensor), while the analytical model predicts tensors. So that predicted and measured
compare like with like, the runner measures, after the timed epochs, one more (untimed) training step under
:class:`torch.distributed._tools.mem_tracker.MemTracker`: a ``TorchDispatchMode`` that sees every tensor an
operator creates and frees, and, through ``track_external``, the model's parameters and buffers, the optimizer's
state and the step's batch, which existed before. Its peak is the most bytes of tensor storage alive at once, by
kind (parameters, buffers, gradients, activations, temporaries, optimizer state), on this rank's device.

Why MemTracker and not ``torch.profiler.profile(profile_memory=True)``: the profiler's CPU allocator reports count
only what is allocated (net of frees) while it profiles, so the tensors alive before the step (weights, moments)
are missing from its total and there is no breakdown by kind; MemTracker's ``track_external`` counts them.

What it does not see: memory that never becomes a tensor through the dispatcher: buffers a C++ collective or
library allocates for itself (gloo's and NCCL's scratch), allocator rounding and caching, and the interpreter's own
memory. DDP's gradient buckets, which its reducer allocates once when it wraps the model, are counted from the
first operator in the step that touches them (as temporaries or activations, not as gradients), not before: a DDP
peak in the forward pass leaves them out. Measured after the timed
epochs, so it never changes them; skipped (with a reason) where the step cannot run under a dispatch mode as it
ran timed (``--compile``, CUDA graphs) or the executor cannot say what holds tensors before its step
(:meth:`~accelbench.contract.Executor.tensors_before_step` returns None).

Every core executor says: the native engine and Lightning their model and optimizer (Fabric's wrappers are torch's
own types), the tensor/pipeline/mesh executor its stages' modules and its optimizer (DTensor parameters count their
local shard: MemTracker reads a DTensor's storage), DeepSpeed its engine, its client optimizer (the fp32 master
partitions and their moments) and ZeRO's flat buffers; what a tracker of the dispatcher still cannot attribute
there is said in a note beside the peak (:meth:`~accelbench.contract.Executor.tensor_peak_caveat`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from accelbench.results import TensorPeak

if TYPE_CHECKING:
    from accelbench.engine.metrics import RankLog

SOURCE = (
    "torch.distributed._tools.mem_tracker.MemTracker: live tensor storage over one untimed training step after the "
    "timed epochs (model, optimizer state and batch registered with track_external); excludes buffers allocated "
    "outside the dispatcher (collectives' scratch), allocator slack and the interpreter, and counts DDP's gradient "
    "buckets only once an operator of the step touches them"
)

# MemTracker's kinds (its _MemRefType values) under the names the analytical model's breakdown uses
KINDS = {
    "Parameter": "parameters",
    "Buffer": "buffers",
    "Gradient": "gradients",
    "Activation": "activations",
    "Temp": "temporaries",
    "Optstate": "optimizer",
    "Other": "other",
}
TOTAL = "total"


def why_not_measurable(executor: Any, compiled: bool) -> str | None:
    """Why the tensor peak cannot be measured for this run (None: it can): a step compiled or replayed as CUDA
    graphs would run otherwise under a dispatch mode (re-traced or not replayed), and where the executor cannot say
    what holds tensors before its step (:meth:`~accelbench.contract.Executor.tensors_before_step`) the weights and
    optimizer state alive when it starts are not known."""
    if compiled:
        return (
            "--compile: a compiled step is re-traced under a dispatch mode, so it would not be the step timed"
        )
    if getattr(executor, "replays_graphs", False):
        return "the steps replay CUDA graphs, whose memory no dispatch mode sees"
    said = getattr(executor, "why_no_tensor_peak", None)
    why = said() if callable(said) else None
    if why is not None:
        return str(why)
    if alive_before_step(executor) is None:
        return f"executor {type(executor).__name__} exposes no torch model and optimizer to register"
    return None


def alive_before_step(executor: Any) -> list[torch.nn.Module | torch.optim.Optimizer | torch.Tensor] | None:
    """What the executor says holds tensors before its step (None where it cannot say, or is no Executor)."""
    said = getattr(executor, "tensors_before_step", None)
    return said() if callable(said) else None


def measure_step(
    step: Callable[[], object],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    device: torch.device,
    existing: Sequence[torch.Tensor] = (),
) -> dict[str, int]:
    """Run ``step`` (one training step, already bound to its batch) under MemTracker, with ``model``, ``optimizer``
    and the ``existing`` tensors (the batch) registered as alive before it; return the peak on ``device`` by kind,
    with its ``total`` (:func:`measure_step_with`)."""
    return measure_step_with(step, [model, optimizer, *existing], device)


def measure_step_with(
    step: Callable[[], object],
    alive: Sequence[torch.nn.Module | torch.optim.Optimizer | torch.Tensor],
    device: torch.device,
) -> dict[str, int]:
    """Run ``step`` under MemTracker with everything in ``alive`` (modules, optimizers, tensors such as the batch)
    registered as existing before it; return the peak on ``device`` by kind, with its ``total``. The peak is taken
    at the moment the total is largest, so the kinds add up to it."""
    tracker = _device_peak_tracker()
    tracker.track_external(*alive)
    with _grad_hooks_removed_after(), tracker:
        step()
    snapshot = tracker.get_tracker_snapshot("peak")
    seen = snapshot.get(device)
    if seen is None:  # e.g. torch.device("cuda") asked, "cuda:0" recorded
        seen = next((v for k, v in snapshot.items() if k.type == device.type), {})
    peak = {KINDS.get(_name(kind), _name(kind)): int(size) for kind, size in seen.items()}
    return {kind: size for kind, size in peak.items() if size or kind == TOTAL}


@contextmanager
def _grad_hooks_removed_after() -> Iterator[None]:
    """Remove, once the measured step is over, every multi-grad hook MemTracker's ModTracker registered in it.

    Why: ModTracker hooks each module's inputs with ``register_multi_grad_hook`` (mode "all"), whose closure keeps
    the inputs' ``grad_fn`` nodes, and hangs that closure on those same nodes: a cycle through C++ that Python's
    collector cannot see (PyTorch PR 82776 describes the kind), so the step's autograd graph, and through its
    AccumulateGrad nodes the model's parameters, outlive the run. Every run in one process (a reference
    regeneration's seeds, a test session) then kept its model: gpt2's 146 tensors, 320 MiB, a seed. A removed hook
    leaves the node an empty hook table, so the graph is freed with its last Python reference."""
    from torch.distributed._tools import mod_tracker

    registered: list[Any] = []
    stock = mod_tracker.register_multi_grad_hook

    def recorded(*args: Any, **kwargs: Any) -> Any:
        handle = stock(*args, **kwargs)
        registered.append(handle)
        return handle

    mod_tracker.register_multi_grad_hook = recorded
    try:
        yield
    finally:
        mod_tracker.register_multi_grad_hook = stock
        for handle in registered:
            handle.remove()


def _device_peak_tracker() -> Any:
    """A MemTracker that keeps the device's peak only. Stock MemTracker also keeps each module's own peak, walking
    every module it has seen on every operator (most of its time: 10 of 16 s for a GPT-2 124M step); the device's
    peak, the one figure read here, is the same. And stock MemTracker takes a root module's second forward for a
    second iteration and refuses it, while a pipeline stage's module runs once per microbatch within one step: here
    that module's own statistics (never read) start again. Where this torch's MemTracker lacks the internals the
    overrides rely on, the stock tracker is used (slower, same figure, no pipeline)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class DevicePeakTracker(MemTracker):
        def _update_peak_stats(self, peak_state: Any) -> None:
            for device, snapshot in self._curr_mem_snap.items():
                if self._peak_mem.get(device, 0) < snapshot["Total"]:
                    self._peak_mem[device] = snapshot["Total"]
                    self._peak_mem_snap[device] = dict(snapshot)

        def _pre_fw_hook(self, module: torch.nn.Module, inputs: Any) -> None:
            if module in self.memory_tracking and not self._mod_tracker.is_bw:
                name = self._mod_tracker.get_known_fqn(module)
                if set(self._mod_tracker.parents) - {name} <= {"Global"}:  # a root again: a microbatch
                    del self.memory_tracking[module]
            super()._pre_fw_hook(module, inputs)

    stock = MemTracker()
    needed = ("_curr_mem_snap", "_peak_mem", "_peak_mem_snap", "_update_peak_stats", "_pre_fw_hook")
    if all(hasattr(stock, name) for name in (*needed, "memory_tracking", "_mod_tracker")):
        return DevicePeakTracker()
    return stock


def _name(kind: object) -> str:
    """MemTracker's key for a kind (an enum whose value is its name) or its total ('Total')."""
    value = getattr(kind, "value", kind)
    return TOTAL if value == "Total" else str(value)


def tensor_peak_of(logs: Sequence[RankLog]) -> TensorPeak | None:
    """The record's tensor peak from every rank's log: the largest rank's peak (and its breakdown), the mean, and
    each rank's; None where no rank measured one."""
    totals = [log.tensor_peak.get(TOTAL) if log.tensor_peak else None for log in logs]
    known = [t for t in totals if t is not None]
    if not known:
        return None
    largest = max(range(len(logs)), key=lambda i: totals[i] or -1)
    by_kind = dict(logs[largest].tensor_peak or {})
    by_kind.pop(TOTAL, None)
    return TensorPeak(
        peak_bytes=max(known),
        mean_bytes=statistics.fmean(known),
        ranks=totals,
        by_kind=by_kind,
        rank=logs[largest].rank,
        source=SOURCE,
    )
