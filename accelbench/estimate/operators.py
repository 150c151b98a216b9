"""The operators of one training step, as the device runs them: what the calibrated step time sums over.

:func:`step_operators` builds the workload the way :func:`accelbench.estimate.facts.meta_facts` does, but under
torch's ``FakeTensorMode`` on the run's device type (tensors with shapes, dtypes and a device, and no storage, so the
same kernels are chosen as in a run, e.g. the CPU's fused attention), and runs one step as the reference executor
does (:class:`accelbench.engine.executor.TorchExecutor`): forward and loss under the precision plan's autocast,
backward, gradient clipping and the optimizer step with the backend's optimizer kernels, ``zero_grad``. A
``TorchDispatchMode`` under autograd records every aten operator: its FLOPs (``torch.utils.flop_counter``'s
registry of formulas), the bytes it reads and writes (its tensor inputs' and outputs' sizes; a view moves none),
its dtype, its matmul shape and the phase of the step. Nothing is computed, so gpt2-xl's step is traced in seconds.
torch is imported inside the functions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from functools import lru_cache, partial
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch

    from accelbench.config import RunConfig
    from accelbench.contract import PrecisionPlan
    from accelbench.workloads import Workload

Phase = Literal["forward", "backward", "optimizer"]
PHASES: tuple[Phase, ...] = ("forward", "backward", "optimizer")


@dataclass(frozen=True)
class MatmulShape:
    """A matrix multiply's problem size: ``batch`` products of (m x k) @ (k x n)."""

    m: int
    n: int
    k: int
    batch: int = 1


@dataclass(frozen=True)
class Operator:
    """One aten operator call of a step. ``flops`` by torch's flop counter (0 for what it does not count:
    elementwise and normalisation work, which is bound by memory); ``bytes_moved`` its tensor inputs' and outputs'
    sizes (0 for a view); ``autograd`` whether autograd records it (a forward operator on tensors that need a
    gradient: it costs more to dispatch)."""

    name: str
    phase: Phase
    dtype: str
    flops: float
    bytes_moved: float
    matmul: MatmulShape | None = None
    autograd: bool = False
    # of its largest tensor, input or output: what the elementwise work the calibration times by the element
    # (random numbers, exp, norms, a reduction over a row) costs by
    elements: int = 0
    strided: bool = False  # an input is not contiguous (a copy of it gathers across rows)


@dataclass(frozen=True)
class StepOperators:
    """The operators of one step of one micro-batch's forward and backward (``micro_batches`` of them run per
    step) and of the optimizer step, for the workload as this process holds it."""

    operators: tuple[Operator, ...]
    micro_batch: int
    micro_batches: int
    device_type: str
    optimizer_kernels: str
    # --from-profile: seconds per step a profiled run of the same configuration measured for operators by name
    # (forward and backward, all calls together), and where from; they replace the calibrated times of those
    measured_s: tuple[tuple[str, float], ...] = ()
    measured_source: str = ""
    # where the operators were traced on another device type than ``device_type`` (the one they are priced for)
    traced_elsewhere: str = ""

    def refined(self, measured_s: dict[str, float], source: str) -> StepOperators:
        """The same operators with measured times for those ``measured_s`` names (aten names, no namespace)."""
        return replace(self, measured_s=tuple(sorted(measured_s.items())), measured_source=source)

    def on_device(self, device_type: str, why: str) -> StepOperators:
        """The same operators, traced elsewhere (``why`` says where and why), priced as ``device_type`` runs them."""
        return replace(self, device_type=device_type, traced_elsewhere=why)

    def phase(self, phase: Phase) -> list[Operator]:
        return [op for op in self.operators if op.phase == phase]

    def flops_per_step(self) -> float:
        """FLOPs of one whole step: each micro-batch's forward and backward, and the optimizer."""
        per_micro = sum(op.flops for op in self.operators if op.phase != "optimizer")
        return per_micro * self.micro_batches + sum(op.flops for op in self.phase("optimizer"))


def profiled_operator_times(top_operators: Iterable[tuple[str, str, float]]) -> dict[str, float]:
    """Seconds per step of each aten operator a profile measured as arithmetic, from its top operators
    (``(name, category, seconds)``: ``run --profile``'s ``top_operators``, accelbench/engine/profile): the
    ``kernel`` entries named ``aten::NAME``, by NAME. The optimizer's operators are in its own category."""
    times: dict[str, float] = {}
    for name, category, seconds in top_operators:
        if category == "kernel" and name.startswith("aten::"):
            bare = name.removeprefix("aten::")
            times[bare] = times.get(bare, 0.0) + seconds
    return times


def step_operators(
    workload: Workload,
    config: RunConfig,
    plan: PrecisionPlan,
    device_type: str,
    optimizer_kernels: str = "foreach",
) -> StepOperators:
    """The operators of one training step of ``workload`` for ``config`` (resolved) on a device of
    ``device_type``, in ``plan``'s precision, with the optimizer's ``optimizer_kernels`` ('fused', 'foreach',
    'plain': the backend's ``optimizer_implementation``). The per-device micro-batch is ``batch_size /
    grad_accum``; tensor, pipeline and mesh layouts are traced as the whole replica (the caller divides).
    Cached per (workload, configuration, precision, device type, kernels) within the process."""
    key = (workload.name, config.model_dump_json(), plan.model_dump_json(), device_type, optimizer_kernels)
    if key not in _TRACED:
        if len(_TRACED) >= MAX_TRACED:
            _TRACED.pop(next(iter(_TRACED)))
        _TRACED[key] = _trace(workload, config, plan, device_type, optimizer_kernels)
    return _TRACED[key]


# The steps traced in this process, by (workload, configuration, plan, device type, kernels), oldest first.
_TRACED: dict[tuple[str, ...], StepOperators] = {}
MAX_TRACED = 32


def _trace(
    workload: Workload, config: RunConfig, plan: PrecisionPlan, device_type: str, kernels: str
) -> StepOperators:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    micro = max(1, config.batch_size // config.grad_accum)
    traced = config.model_copy(update={"batch_size": micro, "grad_accum": 1})
    device = torch.device(device_type)
    recorder = _Recorder()
    with FakeTensorMode(allow_non_fake_inputs=True):
        with torch.device(device):
            job = workload.build(traced)
        if traced.activation_checkpointing:  # as the run: each layer's forward runs again in backward
            from accelbench.engine.checkpointing import apply_activation_checkpointing

            apply_activation_checkpointing(job.model, job.units)
        model = job.model.train()
        # as the executor's ``model.to(dtype)``, tensor by tensor: a fake tensor cannot be swapped in place of a tied one
        for tensor in (*model.parameters(), *model.buffers()):
            if tensor.is_floating_point() and tensor.dtype != plan.torch_param_dtype:
                tensor.data = tensor.data.to(plan.torch_param_dtype)
        optimizer = job.make_optimizer(model, device, kernels)
        inputs, targets = next(iter(job.data.batches(0, 0, 1)))
        inputs, targets = inputs.to(device), targets.to(device)
        autocast = plan.torch_autocast_dtype
        with recorder:
            recorder.phase = "forward"
            if autocast is not None:
                with torch.autocast(device.type, dtype=autocast):
                    loss = model(inputs, targets)
            else:
                loss = model(inputs, targets)
            recorder.phase = "backward"
            loss.backward()
            recorder.phase = "optimizer"
            with recorder.paused():  # the first step creates the optimizer's state; a step in a run finds it
                optimizer.step()
            if job.grad_clip_norm is not None:
                torch.nn.utils.clip_grad_norm_(
                    model.parameters(), job.grad_clip_norm, foreach=kernels != "plain"
                )
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return StepOperators(tuple(recorder.operators), micro, config.grad_accum, device_type, kernels)


def count_operators(step: Callable[[], object]) -> int:
    """How many aten operators one call of ``step`` dispatches, as :func:`step_operators` counts them (below
    autograd: forward, backward and what ``step`` runs besides). ``step`` runs once, for real."""
    recorder = _Recorder()
    with recorder:
        step()
    return len(recorder.operators)


# Operators whose time is the caller's, not the device's: shape queries, and what only moves a tensor's metadata.
_FREE = frozenset({"detach", "alias", "lift_fresh", "empty", "empty_strided", "empty_like", "_unsafe_view"})


def _recorder_class() -> type[Any]:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        """Records each aten operator that reaches it (under autograd: forward, backward and optimizer alike)."""

        def __init__(self) -> None:
            super().__init__()
            self.phase: Phase = "forward"
            self.operators: list[Operator] = []
            self.recording = True

        @contextlib.contextmanager
        def paused(self) -> Iterator[None]:
            self.recording = False
            try:
                yield
            finally:
                self.recording = True

        def __torch_dispatch__(
            self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
        ) -> Any:
            kwargs = kwargs or {}
            if self.recording and func.overloadpacket.__name__ in _COMPOSITE:
                return _COMPOSITE[func.overloadpacket.__name__](self, args, kwargs)
            out = func(*args, **kwargs)
            if self.recording and func.namespace == "aten":  # not prim::device, the profiler's markers
                self.operators.append(_operator(func, args, kwargs, out, self.phase))
            return out

        def run(self, func: Any, *args: Any, **kwargs: Any) -> Any:
            """``func`` on ``args``, recorded as an operator of its own (a part of a composite kernel)."""
            out = func(*args, **kwargs)
            self.operators.append(_operator(func, args, kwargs, out, self.phase))
            return out

    return Recorder


def _safe_softmax(recorder: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``_safe_softmax`` (attention's softmax that gives 0, not NaN, to a row masked whole) as a CPU runs it: four
    passes over the scores (softmax, isneginf, all over the row, where), which reach a dispatch mode as one."""
    import torch

    aten = torch.ops.aten
    x, dim = args[0], args[1]
    dtype = args[2] if len(args) > 2 else kwargs.get("dtype")
    if dtype is not None:
        x = recorder.run(aten._to_copy.default, x, dtype=dtype)
    out = recorder.run(aten._softmax.default, x, dim, False)
    masked = recorder.run(aten.isneginf.default, x)
    whole = recorder.run(aten.all.dim, masked, dim, True)
    return recorder.run(aten.where.self, whole, torch.zeros((), dtype=out.dtype, device=out.device), out)


def _grouped_mm(recorder: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``torch._grouped_mm`` (the MoE experts' products), recorded as it runs. Its fake kernel enforces CUDA's rule
    (bfloat16 inputs) on every device, where the CPU's kernel also multiplies float32 and float16: in those, the
    output's shape comes from the same product in bfloat16, returned in the dtype the kernel returns."""
    import torch

    grouped = torch.ops.aten._grouped_mm.default
    a, b, *rest = args
    if a.dtype == torch.bfloat16:
        out = grouped(*args, **kwargs)
    else:
        dtype = kwargs.get("out_dtype") or a.dtype
        as_bf16 = {**kwargs, "out_dtype": None}
        out = grouped(a.to(torch.bfloat16), b.to(torch.bfloat16), *rest, **as_bf16).to(dtype)
    recorder.operators.append(_operator(grouped, args, kwargs, out, recorder.phase))
    return out


# Kernels that reach a dispatch mode whole but run as several passes, recorded as those passes, or whose fake
# kernel refuses what the device runs.
_COMPOSITE: dict[str, Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]] = {
    "_safe_softmax": _safe_softmax,
    "_grouped_mm": _grouped_mm,
}


def _Recorder() -> Any:  # noqa: N802 - a class made on first use, so that torch is imported lazily
    return _recorder_class()()


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    import torch
    from torch.utils._pytree import tree_leaves

    for leaf in tree_leaves(value):
        if isinstance(leaf, torch.Tensor):
            yield leaf


def _operator(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, phase: Phase) -> Operator:
    inputs = list(_tensors((args, kwargs)))
    outputs = list(_tensors(out))
    name = func.overloadpacket.__name__
    view = bool(getattr(func, "is_view", False)) or name in _FREE
    moved = 0.0 if view else float(sum(t.numel() * t.element_size() for t in (*inputs, *outputs)))
    counter = _flop_formula(func)
    flops = float(counter(*args, **kwargs, out_val=out)) if counter is not None else 0.0
    first = inputs[0] if inputs else (outputs[0] if outputs else None)
    dtype = str(first.dtype).removeprefix("torch.") if first is not None else "none"
    return Operator(
        name=name,
        phase=phase,
        dtype=dtype,
        flops=flops,
        bytes_moved=moved,
        matmul=_matmul_shape(name, args, out) if flops else None,
        elements=max((t.numel() for t in (*inputs, *outputs)), default=0),
        autograd=phase == "forward" and any(t.requires_grad for t in inputs),
        strided=not view and any(not t.is_contiguous() for t in inputs),
    )


@lru_cache(maxsize=1)
def _registry() -> dict[Any, Callable[..., int]]:
    """torch's FLOP formulas by aten operator, with the CPU's fused attention (forward and backward) counted by
    the formula torch has for the same attention on GPUs (its arguments come in the same order)."""
    import torch
    from torch.utils.flop_counter import flop_registry

    aten = torch.ops.aten
    registry: dict[Any, Callable[..., int]] = dict(flop_registry)
    cpu_attention = {
        "_scaled_dot_product_flash_attention_for_cpu": aten._scaled_dot_product_flash_attention,
        "_scaled_dot_product_flash_attention_for_cpu_backward": aten._scaled_dot_product_flash_attention_backward,
    }
    for name, same in cpu_attention.items():
        packet = getattr(aten, name, None)
        if packet is not None and same in flop_registry:
            registry[packet] = flop_registry[same]
    grouped = getattr(aten, "_grouped_mm", None)  # the MoE experts' kernel, which torch's registry lacks
    if grouped is not None and grouped not in registry:
        registry[grouped] = _grouped_mm_flops
    for packet, formula in list(registry.items()):
        if "attention" in packet.__name__:
            registry[packet] = partial(_grouped_query_flops, formula, packet.__name__)
    return registry


def _grouped_query_flops(formula: Callable[..., int], name: str, *args: Any, **kwargs: Any) -> int:
    """An attention kernel's FLOPs by torch's ``formula``, with grouped-query attention's keys and values (fewer
    heads than the queries, llama's and moe's) counted at the query's heads, as the kernel broadcasts them: torch
    before 2.13 refuses such shapes (``sdpa_flop_count: query/key/value shapes are incompatible``), which stopped
    llama's and moe's traces on the H200's torch 2.11. The formulas take shapes where they take tensors."""
    import torch

    first = 1 if name.endswith("backward") else 0  # the backward's first argument is the output's gradient
    heads = 1 if name.startswith("_scaled_dot_product") else 2  # (b, h, s, d), else the kernels' (b, s, h, d)
    query = args[first] if len(args) > first + 2 else None
    if isinstance(query, torch.Tensor) and query.dim() == 4:
        shaped = list(args)
        for index in (first + 1, first + 2):  # the keys, the values
            kv = args[index]
            if isinstance(kv, torch.Tensor) and kv.dim() == 4 and kv.shape[heads] != query.shape[heads]:
                shape = list(kv.shape)
                shape[heads] = query.shape[heads]
                shaped[index] = torch.Size(shape)
        args = tuple(shaped)
    return formula(*args, **kwargs)


def _grouped_mm_shape(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> MatmulShape:
    """``torch._grouped_mm(a, b, offs)`` (output ``out``) as ``groups`` products of (m, n, k), what is grouped
    shared out evenly (as a balanced router shares the rows): 2-D x 3-D groups the rows of ``a`` (the experts'
    forward), 2-D x 2-D the contracted dimension (their weight gradients; ``out`` has a matrix per group), 3-D x
    2-D the columns of ``b``, and 3-D x 3-D is a batch."""
    if a.dim() == 2 and b.dim() == 2:
        groups = int(out.shape[0])
        return MatmulShape(int(a.shape[0]), int(b.shape[1]), max(1, int(a.shape[1]) // groups), groups)
    if a.dim() == 2:
        groups = int(b.shape[0])
        return MatmulShape(max(1, int(a.shape[0]) // groups), int(b.shape[2]), int(a.shape[1]), groups)
    if b.dim() == 2:
        groups = int(a.shape[0])
        return MatmulShape(int(a.shape[1]), max(1, int(b.shape[1]) // groups), int(a.shape[2]), groups)
    return MatmulShape(int(a.shape[1]), int(b.shape[2]), int(a.shape[2]), int(a.shape[0]))


def _grouped_mm_flops(
    a: torch.Tensor, b: torch.Tensor, *args: Any, out_val: Any = None, **kwargs: Any
) -> int:
    """2 x the multiply-adds of ``torch._grouped_mm``: every row of every group against its group's matrix."""
    if a.dim() == 2 and b.dim() == 2:  # the contracted dimension is the one split into groups
        return 2 * int(a.shape[0]) * int(a.shape[1]) * int(b.shape[1])
    if a.dim() == 2:
        return 2 * int(a.shape[0]) * int(a.shape[1]) * int(b.shape[2])
    if b.dim() == 2:
        return 2 * int(a.shape[1]) * int(a.shape[2]) * int(b.shape[1])
    return 2 * int(a.shape[0]) * int(a.shape[1]) * int(a.shape[2]) * int(b.shape[2])


def _flop_formula(func: Any) -> Callable[..., int] | None:
    return _registry().get(func.overloadpacket)


def _matmul_shape(name: str, args: tuple[Any, ...], out: Any) -> MatmulShape | None:
    """(m, n, k, batch) of a matrix multiply; attention as the product of its scores (queries x keys over the
    head width, one per batch and head); None for a convolution."""
    import torch

    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if name in ("mm", "addmm"):
        a, b = (tensors[1], tensors[2]) if name == "addmm" else (tensors[0], tensors[1])
        return MatmulShape(int(a.shape[0]), int(b.shape[1]), int(a.shape[1]))
    if name in ("bmm", "baddbmm"):
        a, b = (tensors[1], tensors[2]) if name == "baddbmm" else (tensors[0], tensors[1])
        return MatmulShape(int(a.shape[1]), int(b.shape[2]), int(a.shape[2]), int(a.shape[0]))
    if name == "_grouped_mm" and isinstance(out, torch.Tensor):
        return _grouped_mm_shape(tensors[0], tensors[1], out)
    if "attention" in name:
        offset = (
            1 if name.endswith("backward") else 0
        )  # the backward's first argument is the output's gradient
        q, k = tensors[offset], tensors[offset + 1]
        batch = int(q.shape[0] * q.shape[1]) if q.dim() == 4 else int(q.shape[0])
        return MatmulShape(int(q.shape[-2]), int(k.shape[-2]), int(q.shape[-1]), batch)
    return None
