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

A layout with tensor parallelism is traced as one tensor-parallel rank runs it: the executor's own DTensor styles
(:func:`accelbench.engine.parallel.tp.parallelize_units`) are applied over a fake process group of the tp size
(torch's ``FakeProcessGroup``: collectives that move nothing), so the rank's smaller matmuls, its whole stem and
head, and what DTensor runs around them are the operators recorded. An operator on DTensors is recorded twice over:
as a marker of DTensor's own dispatch (sharding propagation, its Python and C++ wrapping: a host cost priced apart,
:mod:`accelbench.estimate.engine_cost`), then as the local operators DTensor runs for it (the recorder enters its
dispatch again, so these reach it too). A first step is run unrecorded, as a run's first: it fills DTensor's sharding
propagation cache, whose misses infer each operator's output shapes by running it at the whole, unsharded sizes.
The functional collectives' copies into their output buffers are recorded as memory passes; their communication is
priced apart, from ``accelbench comm`` records.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import cache, lru_cache, partial
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
    # a marker of DTensor's dispatch of an operator on DTensors (no work of its own: the local operators it runs
    # follow it as operators of their own); priced at the host's DTensor dispatch cost
    distributed: bool = False


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
    # the tensor-parallel size the step was traced at as one rank runs it (1: the whole replica)
    tensor_parallel: int = 1
    # why a layout with tensor parallelism was traced as the whole replica ("": it was not, or has none)
    whole_replica: str = ""
    # the parameter tensors the optimizer updates (tied ones once), whose host cost its phase pays per tensor
    parameter_tensors: int = 0

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
    accelerator_kernels: bool = False,
    by_batch: bool = False,
) -> StepOperators:
    """The operators of one training step of ``workload`` for ``config`` (resolved) on a device of
    ``device_type``, in ``plan``'s precision, with the optimizer's ``optimizer_kernels`` ('fused', 'foreach',
    'plain': the backend's ``optimizer_implementation``). The per-device micro-batch is ``batch_size /
    grad_accum``; a layout with tensor parallelism is traced as one tensor-parallel rank runs it (where a fake
    process group can be made here: not in a process that holds a process group of its own), pipeline stages as the
    whole replica (the caller divides; :attr:`StepOperators.tensor_parallel` says which).
    Cached per (workload, configuration, precision, device type, kernels, tensor-parallel size traced at) within
    the process. With ``accelerator_kernels`` (a CPU trace standing in for an accelerator's, :func:`operators_for`)
    attention and dropout run the fused kernels an accelerator runs (:func:`accelerator_kernels_on_the_cpu`).
    With ``by_batch`` (``plan``, which prices many shapes at many batch sizes) the step is traced at micro-batches
    of :data:`BATCH_PROBES` samples and, where those are one line (:func:`_by_batch`), read off it at the config's;
    and a layout with tensor parallelism as the whole replica (the caller divides it over the model-parallel ranks,
    as a pipeline's), since a rank's trace through DTensor costs seconds a layout."""
    if by_batch:
        scaled = _by_batch(workload, config, plan, device_type, optimizer_kernels, accelerator_kernels)
        if scaled is not None:
            return scaled
    tp, sequence_parallel = (1, False) if by_batch else _tensor_parallel(config)
    if tp == 1:  # a replica's step, whatever spreads the replicas (or pipelines them: the caller divides)
        config = replica_of(config)
        deep = _by_layers(workload, config, plan, device_type, optimizer_kernels, accelerator_kernels)
        if deep is not None:
            return deep
    key = (
        workload.name,
        config.model_dump_json(),
        plan.model_dump_json(),
        device_type,
        optimizer_kernels,
        tp,
        accelerator_kernels,
    )
    if key not in _TRACED:
        if len(_TRACED) >= MAX_TRACED:
            _TRACED.pop(next(iter(_TRACED)))
        with accelerator_kernels_on_the_cpu() if accelerator_kernels else contextlib.nullcontext():
            _TRACED[key] = _trace(
                workload, config, plan, device_type, optimizer_kernels, tp, sequence_parallel
            )
    return _TRACED[key]


# The micro-batches a step is traced at to read any larger one off the line through them (the last checks the line;
# a batch of 1 is left out: its views are laid out apart, a copy fewer and an embedding's gather contiguous)
BATCH_PROBES = (2, 4, 8)


def _by_batch(
    workload: Workload,
    config: RunConfig,
    plan: PrecisionPlan,
    device_type: str,
    kernels: str,
    accelerator_kernels: bool,
) -> StepOperators | None:
    """The step at the config's micro-batch read off its traces at :data:`BATCH_PROBES` samples: where the three
    traces hold the same operators and every operator's FLOPs, bytes, elements and product dimensions at the third
    are on the line through the first two (a transformer's and a CNN's are: each activation grows with the batch, each
    weight does not), each figure at the config's micro-batch is that line's. None where they are not one line (a
    mixture of experts' capacity, a shape that cannot be traced at these batches): the caller traces the config."""
    micro = max(1, config.batch_size // config.grad_accum)
    low, high, check = BATCH_PROBES
    if micro < low:
        return None
    replica = replica_of(config)
    try:
        traces = [
            step_operators(
                workload,
                replica.model_copy(update={"batch_size": b, "grad_accum": 1}),
                plan,
                device_type,
                kernels,
                accelerator_kernels,
            )
            for b in BATCH_PROBES
        ]
    except Exception:  # noqa: BLE001 - a shape these batches cannot have: the config is traced itself
        return None
    first, second, third = traces
    if not len(first.operators) == len(second.operators) == len(third.operators):
        return None
    operators = []
    for a, b, c in zip(first.operators, second.operators, third.operators, strict=True):
        if not (_same_kind(a, b) and _same_kind(a, c)):
            return None
        elements = _largest_tensor(a.elements, b.elements, c.elements, micro)
        if elements is None:
            return None
        lines = [(a.flops, b.flops, c.flops), (a.bytes_moved, b.bytes_moved, c.bytes_moved)]
        shapes = [op.matmul for op in (a, b, c) if op.matmul is not None]
        if len(shapes) == 3:
            lines += [tuple(float(getattr(shape, d)) for shape in shapes) for d in ("m", "n", "k", "batch")]  # type: ignore[misc]
        slope = [(f2 - f1) / (high - low) for f1, f2, _ in lines]
        if any(
            not math.isclose(f3, f1 + s * (check - low), rel_tol=1e-9, abs_tol=1e-6)
            for (f1, _, f3), s in zip(lines, slope, strict=True)
        ):
            return None
        at = [f1 + s * (micro - low) for (f1, _, _), s in zip(lines, slope, strict=True)]
        shape = None
        if a.matmul is not None:
            m, n, k, batch = (round(v) for v in at[2:6])
            shape = MatmulShape(m, n, k, batch)
        operators.append(replace(a, flops=at[0], bytes_moved=at[1], elements=elements, matmul=shape))
    return replace(first, operators=tuple(operators), micro_batch=micro, micro_batches=config.grad_accum)


# A model of more layers than this is traced at LAYER_PROBES layers and its step extrapolated (:func:`_by_layers`)
DEEP = 6
LAYER_PROBES = (1, 2, 3)


def _by_layers(
    workload: Workload,
    config: RunConfig,
    plan: PrecisionPlan,
    device_type: str,
    kernels: str,
    accelerator_kernels: bool,
) -> StepOperators | None:
    """The step of a deep model (more than :data:`DEEP` layers, all of one shape) from its traces at
    :data:`LAYER_PROBES` layers: tracing costs a fake-tensor dispatch an operator, seconds for an 80-layer model,
    where three shallow traces cost a fraction of one. In each phase either each added layer inserts the same runs
    of operators at the same places (forward and backward: a layer's; the clipping's and a plain optimizer's: its
    tensors'), repeated as often as the model has layers, or the phase keeps its operators and their sizes grow by a
    constant a layer (a fused optimizer's lists), read off that line. The rule is checked first: the one- and two-layer traces must
    give the three-layer trace exactly. None where the workload cannot change its depth, the model is shallow, or
    the check fails: the caller traces the whole model."""
    layers_of, with_layers = getattr(workload, "layers", None), getattr(workload, "with_layers", None)
    if layers_of is None or with_layers is None:
        return None
    layers = int(layers_of(config))
    if layers <= DEEP:
        return None
    try:
        traces = [
            step_operators(workload, with_layers(config, n), plan, device_type, kernels, accelerator_kernels)
            for n in LAYER_PROBES
        ]
    except Exception:  # noqa: BLE001 - a shape this depth cannot have: the whole model is traced
        return None
    one, two, three = traces
    phases: list[Operator] = []
    for phase in PHASES:
        a, b, c = (tuple(t.phase(phase)) for t in traces)
        by_kind = next((k for k in (False, True) if _extended(a, b, 2, k) == c), None)
        extended = None if by_kind is None else _extended(b, c, layers - 2, by_kind)
        if extended is None:
            return None
        phases += extended
    tensors = one.parameter_tensors + (two.parameter_tensors - one.parameter_tensors) * (layers - 1)
    return replace(three, operators=tuple(phases), parameter_tensors=tensors)


def _extended(
    shallow: tuple[Operator, ...], deeper: tuple[Operator, ...], more: int, by_kind: bool = False
) -> tuple[Operator, ...] | None:
    """A phase's operators at ``more`` layers more than ``shallow`` has, from ``shallow`` and ``deeper`` (one layer
    more): the block a layer adds repeated (see :func:`_by_layers`), or its operators' sizes on the line through
    the two; None where the two are neither. The two are aligned operator by operator, or with ``by_kind`` by
    their kinds alone (where a foreach list's sizes grow, no operator of one equals its counterpart)."""
    from difflib import SequenceMatcher

    def same_kinds(lows: Sequence[Operator], highs: Sequence[Operator]) -> bool:
        return len(lows) == len(highs) and all(_same_kind(a, b) for a, b in zip(lows, highs, strict=True))

    keys: tuple[Sequence[Hashable], Sequence[Hashable]] = (
        ([_kind(op) for op in shallow], [_kind(op) for op in deeper]) if by_kind else (shallow, deeper)
    )
    out: list[Operator] = []
    for _, i1, i2, j1, j2 in SequenceMatcher(None, *keys, autojunk=False).get_opcodes():
        lows, highs = shallow[i1:i2], deeper[j1:j2]
        inserted = len(highs) - len(lows)
        # a run a layer inserts (its forward, its norms in the clipping, ...) beside operators that stay or grow
        # (the stack of those norms): the first split that leaves the same operators either side of the run
        split = next(
            (k for k in range(len(lows) + 1) if same_kinds(lows, highs[:k] + highs[k + inserted :])),
            None,
        )
        if inserted < 0 or split is None:
            return None
        kept = highs[:split] + highs[split + inserted :]
        grown = [_grown(low, high, more) for low, high in zip(lows, kept, strict=True)]
        out += [*grown[:split], *(highs[split : split + inserted] * more), *grown[split:]]
    return tuple(out)


def _grown(low: Operator, high: Operator, more: int) -> Operator:
    """An operator ``more`` layers past ``low``, its sizes growing ``high - low`` a layer (a foreach optimizer's
    lists); ``high`` where nothing grows."""
    if low == high:
        return high
    shape = None
    if low.matmul is not None and high.matmul is not None:
        dims = [
            _on_line(getattr(low.matmul, d), getattr(high.matmul, d), more) for d in ("m", "n", "k", "batch")
        ]
        shape = MatmulShape(*(round(d) for d in dims))
    return replace(
        high,
        flops=_on_line(low.flops, high.flops, more),
        bytes_moved=_on_line(low.bytes_moved, high.bytes_moved, more),
        elements=round(_on_line(low.elements, high.elements, more)),
        matmul=shape,
    )


def _on_line(low: float, high: float, more: int) -> float:
    """A size ``more`` layers past ``low``'s, growing ``high - low`` a layer."""
    return low + (high - low) * more


# What a replica's traced step does not depend on: how the replicas are spread, pipelined and launched, how long the
# run is and what it records (the trace is of one replica's forward, backward and optimizer step)
_LAYOUT_FIELDS = ("strategy", "devices", "nnodes", "node_rank", "rdzv_endpoint", "mesh", "placement", "pp_schedule",
                  "microbatches", "virtual_stages", "pp_split", "sequence_parallel", "epochs", "steps_per_epoch",
                  "output_dir", "profile", "profile_steps", "comm_records", "no_tensor_peak", "no_calibration",
                  "target", "target_loss", "eval_batches", "stall_epochs", "grad_norm_limit", "collective_timeout",
                  "idle_baseline_s", "peak_tflops", "threads", "data_placement", "engine")  # fmt: skip


def replica_of(config: RunConfig) -> RunConfig:
    """``config`` as one replica on one device, every layout and run-length field at its default: the key a
    replica's trace is cached by, whatever spreads the replicas."""
    from accelbench.config import RunConfig

    defaults = {
        name: RunConfig.model_fields[name].get_default(call_default_factory=True) for name in _LAYOUT_FIELDS
    }
    return config.model_copy(update=defaults)


def _largest_tensor(first: int, second: int, third: int, micro: int) -> int | None:
    """An operator's largest tensor at ``micro`` samples from its sizes at :data:`BATCH_PROBES`: the larger of a
    tensor that does not grow with the batch (a weight: the first probe's size) and one that grows in proportion
    (an activation: the last probe's per sample); None where the three sizes are not such a pair's."""
    if first == second == third:  # nothing of it grows with the batch
        return first
    probes = dict(zip(BATCH_PROBES, (first, second, third), strict=True))
    fixed, per_sample = first, third / BATCH_PROBES[-1]
    if any(max(fixed, per_sample * b) != size for b, size in probes.items()):
        fixed = 0  # all of it grows with the batch
        if any(per_sample * b != size for b, size in probes.items()):
            return None
    return round(max(fixed, per_sample * micro))


def _kind(op: Operator) -> tuple[object, ...]:
    """What two traces' operators must share to be one operator at two sizes."""
    return (op.name, op.phase, op.dtype, op.autograd, op.strided, op.distributed, op.matmul is None)


def _same_kind(a: Operator, b: Operator) -> bool:
    return _kind(a) == _kind(b)


@contextlib.contextmanager
def accelerator_kernels_on_the_cpu() -> Iterator[None]:
    """Within it, a CPU trace runs attention and dropout as an accelerator's step does: attention through the fused
    kernel whatever its dropout (a GPU's flash and memory-efficient kernels apply dropout inside the kernel, where
    the CPU's has none and falls back to an explicit softmax with its a*s^2 scores: traced here with the dropout
    off, in the kernel on the device), and dropout as one fused ``native_dropout`` (CUDA's and XPU's; the CPU
    draws, scales and multiplies in three passes). The products and every other operator are the CPU's."""
    import torch
    from torch.overrides import TorchFunctionMode

    sdpa, dropout = torch.nn.functional.scaled_dot_product_attention, torch.nn.functional.dropout

    class AcceleratorKernels(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is sdpa:
                kwargs = {**kwargs, "dropout_p": 0.0}
                if len(args) > 4:  # dropout_p given by position
                    args = (*args[:4], 0.0, *args[5:])
            elif func is dropout:
                p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
                training = kwargs.get("training", args[2] if len(args) > 2 else True)
                if training and p > 0:
                    return torch.native_dropout(args[0], p, True)[0]
            return func(*args, **kwargs)

    with AcceleratorKernels():
        yield


def operators_for(
    workload: Workload,
    config: RunConfig,
    plan: PrecisionPlan,
    device_type: str,
    optimizer_kernels: str = "foreach",
    by_batch: bool = False,
) -> StepOperators:
    """:func:`step_operators` on ``device_type`` (``by_batch``: read off the line through small batches), or where this torch cannot trace on it (a CPU build predicting
    for a GPU; an operator with no fake-tensor kernel for the device) the same step traced on the CPU, which has
    the same products and elementwise passes, priced as ``device_type`` runs them and said so. A step the CPU
    cannot trace either is an :class:`UntraceableStep` naming both errors."""
    failure = _untraceable_here(device_type)
    if failure is None:
        try:
            return step_operators(workload, config, plan, device_type, optimizer_kernels, by_batch=by_batch)
        except Exception as exc:  # noqa: BLE001 - traced on the CPU instead, and said why
            failure = _failure(exc)
            if device_type == "cpu":
                raise UntraceableStep(f"the step could not be traced ({failure})") from exc
    try:
        operators = step_operators(
            workload, config, plan, "cpu", optimizer_kernels, accelerator_kernels=True, by_batch=by_batch
        )
    except Exception as exc:  # noqa: BLE001 - said, with the device's own error
        raise UntraceableStep(
            f"the step could not be traced on the {device_type} ({failure}) nor on the CPU ({_failure(exc)})"
        ) from exc
    return operators.on_device(
        device_type,
        f"traced on the CPU with an accelerator's fused attention and dropout, as the {device_type} trace failed "
        f"({failure})",
    )


@cache
def _untraceable_here(device_type: str) -> str | None:
    """Why this torch cannot trace a step on ``device_type`` at all (a CPU build asked for a GPU: its random
    initialisation needs the device's generator), or None."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    built = getattr(getattr(torch.backends, device_type, None), "is_built", None)
    if (
        callable(built) and not built()
    ):  # a CPU build asked for a GPU: said without trying (seconds of imports)
        return f"RuntimeError: this torch ({torch.__version__}) is not built with {device_type}"
    try:
        with FakeTensorMode(), torch.device(device_type):  # a layer built and stepped, as a trace does
            torch.nn.Linear(2, 2)(torch.randn(1, 2)).sum().backward()
    except Exception as exc:  # noqa: BLE001 - the reason, said where the CPU traces instead
        return _failure(exc)
    return None


class UntraceableStep(Exception):
    """A step fake tensors cannot trace, on the device or on the CPU: the message says why."""


def _failure(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"


# The steps traced in this process, by (workload, configuration, plan, device type, kernels, tp size traced at),
# oldest first.
_TRACED: dict[tuple[str | int, ...], StepOperators] = {}
MAX_TRACED = 512


def _trace(
    workload: Workload,
    config: RunConfig,
    plan: PrecisionPlan,
    device_type: str,
    kernels: str,
    tp: int,
    sequence_parallel: bool,
) -> StepOperators:
    """The step as one rank of ``tp`` tensor-parallel ranks runs it (1: the whole replica)."""
    import torch

    micro = max(1, config.batch_size // config.grad_accum)
    traced = config.model_copy(update={"batch_size": micro, "grad_accum": 1})
    device = torch.device(device_type)
    why = ""
    if tp > 1:
        try:
            with fake_tensor_parallel_mesh(tp, device_type) as mesh, warnings.catch_warnings():
                # dropout on a DTensor-parallel CPU mesh: torch warns its random streams may differ from a real
                # run's; the trace draws no numbers
                warnings.filterwarnings("ignore", message="DTensor random operators")
                return _trace_step(
                    workload, traced, plan, device, kernels, mesh, sequence_parallel, config.grad_accum
                )
        except Exception as exc:  # noqa: BLE001 - the replica then, divided evenly, and said why
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            why = f"a tensor-parallel rank could not be traced ({type(exc).__name__}: {first})"
    whole = _trace_step(workload, traced, plan, device, kernels, None, False, config.grad_accum)
    return replace(whole, whole_replica=why) if why else whole


def has_tensor_parallelism(config: RunConfig) -> bool:
    """Whether the (canonical) configuration's layout has a tp axis."""
    if config.mesh is None:
        return False
    from accelbench.parallel_dims import ParallelDims

    return ParallelDims.of(config).tp > 1


def _tensor_parallel(config: RunConfig) -> tuple[int, bool]:
    """(tp size, sequence parallelism) of the layout a rank is traced at: its tp axis where it has one and no
    expert-parallel axis (the experts' own sharding needs their process groups), else (1, False)."""
    if config.mesh is None:
        return 1, False
    from accelbench.parallel_dims import ParallelDims

    dims = ParallelDims.of(config)
    if dims.tp == 1 or dims.ep > 1 or not _can_fake_process_group():
        return 1, False
    return dims.tp, dims.sequence_parallel


def _can_fake_process_group() -> bool:
    """Whether a fake process group can be made in this process: torch has distributed, and this process holds no
    process group (a worker of a run, or a program that made its own)."""
    import torch.distributed as dist

    return dist.is_available() and not dist.is_initialized() and _register_fake_backend()


@lru_cache(maxsize=1)
def _register_fake_backend() -> bool:
    """torch's fake process group (``FakeProcessGroup``: collectives that move nothing) registered as backend
    ``fake``, as torch's own tools register it; False where this torch has none."""
    try:
        import torch.testing._internal.distributed.fake_pg  # noqa: F401 - registers the backend on import
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def fake_tensor_parallel_mesh(size: int, device_type: str) -> Iterator[Any]:
    """A one-axis ("tp") device mesh of ``size`` ranks over a fake process group, this process as rank 0; the
    group is destroyed on exit."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not _register_fake_backend():
        raise RuntimeError(
            "this torch has no fake process group (torch.testing._internal.distributed.fake_pg)"
        )
    dist.init_process_group("fake", store=dist.HashStore(), rank=0, world_size=size)
    try:
        yield init_device_mesh(device_type, (size,), mesh_dim_names=("tp",))
    finally:
        dist.destroy_process_group()


def _trace_step(
    workload: Workload,
    traced: RunConfig,
    plan: PrecisionPlan,
    device: torch.device,
    kernels: str,
    mesh: Any,
    sequence_parallel: bool,
    micro_batches: int,
) -> StepOperators:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    recorder = _Recorder()
    from accelbench.workloads import shapes_only

    with FakeTensorMode(allow_non_fake_inputs=True):
        with torch.device(device), shapes_only():
            job = workload.build(traced)
        if traced.activation_checkpointing:  # as the run: each layer's forward runs again in backward
            from accelbench.engine.checkpointing import apply_activation_checkpointing

            apply_activation_checkpointing(job.model, job.units)
        model = job.model.train()
        # as the executor's ``model.to(dtype)``, tensor by tensor: a fake tensor cannot be swapped in place of a tied one
        for tensor in (*model.parameters(), *model.buffers()):
            if tensor.is_floating_point() and tensor.dtype != plan.torch_param_dtype:
                tensor.data = tensor.data.to(plan.torch_param_dtype)
        if mesh is not None:  # as the executor splits the units, and groups the optimizer's tensors by kind
            from accelbench.engine.parallel.executor import unmixed
            from accelbench.engine.parallel.tp import parallelize_units

            parallelize_units(job.units.modules(model), job.units.tp_plan, mesh, sequence_parallel)
            optimizer = unmixed(job.make_optimizer(model, device, kernels))
        else:
            optimizer = job.make_optimizer(model, device, kernels)
        inputs, targets = next(iter(job.data.batches(0, 0, 1)))
        inputs, targets = inputs.to(device), targets.to(device)
        autocast = plan.torch_autocast_dtype

        def loss_of_batch() -> torch.Tensor:
            if autocast is not None:
                with torch.autocast(device.type, dtype=autocast):
                    return model(inputs, targets)
            return model(inputs, targets)

        def update() -> None:
            if job.grad_clip_norm is not None and mesh is not None:  # as the executor clips DTensor gradients
                from accelbench.engine.parallel.executor import gradient_squares, scale_gradients

                params = [p for p in model.parameters() if p.grad is not None]
                grads = [g for p in params if (g := p.grad) is not None]
                squares = gradient_squares(grads, kernels != "plain", device)
                scale_gradients(params, squares.sqrt(), job.grad_clip_norm)
            elif job.grad_clip_norm is not None:
                torch.nn.utils.clip_grad_norm_(
                    model.parameters(), job.grad_clip_norm, foreach=kernels != "plain"
                )
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        with recorder:
            if mesh is not None:
                # a first step, not recorded, as a run's first: it creates the optimizer's state and fills DTensor's
                # sharding propagation cache, which a run's later steps find (on a miss, DTensor infers each
                # operator's output shapes by running it on the whole, unsharded sizes)
                with recorder.paused():
                    loss_of_batch().backward()
                    update()
            recorder.phase = "forward"
            loss = loss_of_batch()
            recorder.phase = "backward"
            loss.backward()
            recorder.phase = "optimizer"
            if mesh is None:
                with (
                    recorder.paused()
                ):  # the first step creates the optimizer's state; a step in a run finds it
                    optimizer.step()
            update()
    return StepOperators(
        tuple(recorder.operators),
        traced.batch_size,
        micro_batches,
        device.type,
        kernels,
        tensor_parallel=mesh.size() if mesh is not None else 1,
        parameter_tensors=len(list(model.parameters())),
    )


def count_operators(step: Callable[[], object]) -> int:
    """How many aten operators one call of ``step`` dispatches, as :func:`step_operators` counts them (below
    autograd: forward, backward and what ``step`` runs besides). ``step`` runs once, for real."""
    return len(record_operators(step))


def record_operators(step: Callable[[], object]) -> list[Operator]:
    """The operators one call of ``step`` dispatches, recorded as :func:`step_operators` records them (DTensor's
    markers among them). ``step`` runs once, for real."""
    recorder = _Recorder()
    with recorder:
        step()
    return list(recorder.operators)


# Operators whose time is the caller's, not the device's: shape queries, and what only moves a tensor's metadata.
# The functional collectives' waits and autograd wrapping are bookkeeping of a buffer already written.
_FREE = frozenset({"detach", "alias", "lift_fresh", "empty", "empty_strided", "empty_like", "_unsafe_view",
                   "wait_tensor", "_wrap_tensor_autograd"})  # fmt: skip


def _recorder_class() -> type[Any]:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        """Records each aten operator that reaches it (under autograd: forward, backward and optimizer alike)."""

        def __init__(self) -> None:
            super().__init__()
            self.phase: Phase = "forward"
            self.operators: list[Operator] = []
            self.recording = True
            self.in_dtensor = False  # within DTensor's dispatch of an operator (entered again by this mode)

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
            if _has_dtensor((args, kwargs)):
                if self.in_dtensor:  # entered again below: DTensor's own dispatch takes it, under this mode
                    return NotImplemented
                if self.recording and func.namespace == "aten":
                    self.operators.append(_dtensor_marker(func, self.phase))
                self.in_dtensor = True
                try:
                    with self:  # the local operators DTensor runs for it are recorded as they run
                        return func(*args, **kwargs)
                finally:
                    self.in_dtensor = False
            if func.overloadpacket.__name__ in _COMPOSITE:  # run as the device runs them, recorded or not
                return _COMPOSITE[func.overloadpacket.__name__](self, args, kwargs)
            out = func(*args, **kwargs)
            if (
                self.recording and func.namespace in _RECORDED_NAMESPACES
            ):  # not prim::device, profiler markers
                self.operators.append(_operator(func, args, kwargs, out, self.phase))
            return out

        def run(self, func: Any, *args: Any, **kwargs: Any) -> Any:
            """``func`` on ``args``, recorded as an operator of its own (a part of a composite kernel)."""
            out = func(*args, **kwargs)
            if self.recording:
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
    if recorder.recording:
        recorder.operators.append(_operator(grouped, args, kwargs, out, recorder.phase))
    return out


# Kernels that reach a dispatch mode whole but run as several passes, recorded as those passes, or whose fake
# kernel refuses what the device runs.
_COMPOSITE: dict[str, Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]] = {
    "_safe_softmax": _safe_softmax,
    "_grouped_mm": _grouped_mm,
}


# aten's operators, and the functional collectives (DTensor's redistributions): their copy into the output buffer
_RECORDED_NAMESPACES = frozenset({"aten", "_c10d_functional"})


def _has_dtensor(value: Any) -> bool:
    from torch.utils._pytree import tree_leaves

    dtensor = _dtensor_class()
    return dtensor is not None and any(isinstance(leaf, dtensor) for leaf in tree_leaves(value))


@lru_cache(maxsize=1)
def _dtensor_class() -> type[Any] | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without distributed
        return None
    return DTensor


def _dtensor_marker(func: Any, phase: Phase) -> Operator:
    """DTensor's dispatch of ``func``: no work of its own (the local operators it runs are recorded apart)."""
    return Operator(name=func.overloadpacket.__name__, phase=phase, dtype="none", flops=0.0, bytes_moved=0.0,
                    distributed=True)  # fmt: skip


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
