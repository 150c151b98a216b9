"""The step analysis of ``accelbench run --profile``: a profiled step's events split the way seed 001 splits an
iteration.

Definitions (each instant of a profiled step belongs to exactly one category, so the categories sum to the step):

- **data**: fetching the batch and moving it to the device (the runner's ``accelbench::data`` region);
- **optimizer**: the optimizer's step and zero_grad (torch's ``Optimizer.step#...`` regions), all of it;
- **communication (exposed)**: time the training thread spends in collective operations (``c10d::``, gloo, NCCL
  and friends), i.e. communication not hidden behind computation; on accelerators, communication kernels running
  while no compute kernel runs;
- **kernel**: time in the operators that do the arithmetic: on a CPU, the leaf operators' own time (the operator
  *is* the kernel); on an accelerator, the device's compute kernels;
- **intra-op dispatch**: time inside operators that is not a kernel: the dispatcher, autograd bookkeeping (a
  backward node's own time), and metadata-only operators (view, reshape, permute, empty...), seed 001's "model
  parameter sharding, data transformation, reshaping, permuting";
- **inter-op dispatch**: everything between operators: Python, module hooks, the framework's own code.

On an accelerator, an instant where no device kernel runs is classified by what the host thread was doing then
(data, optimizer, inside an operator: intra-op, between operators: inter-op). *Overlapped* communication (running
while compute runs) is reported apart and is not part of the sum. Operator names follow the profiler's.

On CUDA and ROCm the device's own timeline is also read by Holistic Trace Analysis: :mod:`accelbench.engine.profile.hta`.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from accelbench.results import OperatorTime

CATEGORIES = ("data", "optimizer", "communication", "kernel", "intra-op dispatch", "inter-op dispatch")
DATA_REGION = "accelbench::data"
_COMM_MARKERS = (
    "c10d::",
    "gloo:",
    "nccl",
    "rccl",
    "xccl",
    "oneccl",
    "record_param_comms",
    "allreduce",
    "all_reduce",
    "allgather",
    "all_gather",
    "reduce_scatter",
    "reducescatter",
    "alltoall",
    "all_to_all",
    "broadcast",
)
# leaf operators that move no data: their time is dispatch, not arithmetic
_METADATA_OPS = frozenset(
    "aten::" + name
    for name in (
        "view", "reshape", "_reshape_alias", "permute", "transpose", "t", "expand", "expand_as", "as_strided",
        "unsqueeze", "squeeze", "select", "slice", "split", "split_with_sizes", "chunk", "unbind", "narrow",
        "detach", "detach_", "alias", "lift_fresh", "empty", "empty_like", "empty_strided", "resize_", "_unsafe_view",
        "flatten", "unflatten", "view_as", "contiguous", "set_", "result_type", "is_nonzero", "item",
        "_local_scalar_dense", "to", "size", "stride", "numel", "dim", "is_same_size", "zero_", "fill_",
    )
)  # fmt: skip


class Event(Protocol):
    """What the analysis reads of a profiler event (``torch.autograd.profiler_util.FunctionEvent``)."""

    name: str
    thread: int
    cpu_children: list[Any]
    time_range: Any  # .start, .end in microseconds


@dataclass
class Segment:
    start: float
    end: float
    category: str


@dataclass
class StepAnalysis:
    """One profiled step: seconds per category (they sum to the step), overlapped communication, operators."""

    wall_s: float
    seconds: dict[str, float]
    overlapped_s: float | None
    operators: dict[tuple[str, str], float] = field(default_factory=dict)  # (name, category) -> seconds


def is_communication(name: str) -> bool:
    lowered = name.lower()
    return any(marker in lowered for marker in _COMM_MARKERS)


def _region(name: str, data_regions: tuple[str, ...] = (DATA_REGION,)) -> str | None:
    """A category that covers an event and everything under it (``data_regions``: the name prefixes of regions
    that fetch data, e.g. a DataLoader's ``enumerate(DataLoader)#...`` region for a loop that is not ours)."""
    if name.startswith(data_regions):
        return "data"
    if name.startswith("Optimizer."):
        return "optimizer"
    if is_communication(name):
        return "communication"
    return None


def _own_category(event: Event, is_step: bool) -> str:
    """The category of an event's own time (outside its children), where no enclosing region decides: an
    operator that computes is a kernel; a composite operator (one that only calls others: ``aten::linear``,
    ``aten::matmul``), a metadata-only one, or autograd's own bookkeeping is intra-op dispatch; everything else
    (the step itself, user annotations, module hooks) is inter-op dispatch."""
    if is_step or getattr(event, "is_user_annotation", False):
        return "inter-op dispatch"
    if event.name.startswith(("aten::", "prim::", "torchvision::")):
        if event.name in _METADATA_OPS or _is_composite(event.name, getattr(event, "overload_name", "")):
            return "intra-op dispatch"
        return "kernel"
    return "intra-op dispatch" if event.cpu_children else "inter-op dispatch"


@functools.cache
def _is_composite(name: str, overload: str) -> bool:
    """Whether the operator is implemented by calling other operators (PyTorch's CompositeImplicitAutograd key):
    its own time is dispatch, never arithmetic."""
    import torch

    for qualified in (f"{name}.{overload}" if overload else name, name):
        try:
            return bool(
                torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "CompositeImplicitAutograd")
            )
        except RuntimeError:  # no such schema under this name
            continue
    return False


def _segments(
    event: Event,
    inherited: str | None,
    is_step: bool,
    out: list[Segment],
    ops: dict,
    data_regions: tuple[str, ...] = (DATA_REGION,),
) -> None:
    start, end = event.time_range.start, event.time_range.end
    category = inherited or _region(event.name, data_regions)
    children = sorted(event.cpu_children, key=lambda c: c.time_range.start)
    own = category or _own_category(event, is_step)
    cursor = start
    for child in children:
        c_start, c_end = max(child.time_range.start, start), min(child.time_range.end, end)
        if c_start > cursor:
            out.append(Segment(cursor, c_start, own))
        if c_end > c_start:
            _segments(child, category, False, out, ops, data_regions)
        cursor = max(cursor, c_end)
    if end > cursor:
        out.append(Segment(cursor, end, own))
    if not is_step:  # the operator's own time, for the top-operators table
        own_s = (
            end - start - sum(min(c.time_range.end, end) - max(c.time_range.start, start) for c in children)
        ) / 1e6
        if own_s > 0:
            key = (event.name, own)
            ops[key] = ops.get(key, 0.0) + own_s


def _union(intervals: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _length(intervals: Sequence[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def _intersect(
    a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]
) -> list[tuple[float, float]]:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def analyse_step(
    step: Event,
    device_kernels: Sequence[tuple[float, float, str]] = (),
    other_threads: Sequence[Event] = (),
    data_regions: tuple[str, ...] = (DATA_REGION,),
) -> StepAnalysis:
    """Split one profiled step (its ``ProfilerStep`` event on the training thread) into :data:`CATEGORIES`.

    ``device_kernels``: (start, end, name) of the accelerator's kernels in the step (empty on a CPU); an instant
    with a compute kernel running is ``kernel``, with only a communication kernel ``communication``, and with none
    is classified by the host thread's state. ``other_threads``: events of other host threads (a collective
    library's worker threads on a CPU), whose communication overlapping the step is reported as overlapped.
    ``data_regions``: name prefixes of the regions that count as data (default: the runner's).
    """
    segments: list[Segment] = []
    ops: dict[tuple[str, str], float] = {}
    _segments(step, None, True, segments, ops, data_regions)
    start, end = step.time_range.start, step.time_range.end
    wall = (end - start) / 1e6
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    overlapped: float | None = None
    if not device_kernels:
        # a collective library's own threads (gloo's) carry the communication: while they do, a training thread
        # that is not computing is waiting for it (exposed); while it computes, the communication is overlapped
        busy = _union(list(_comm_intervals(other_threads, start, end)))
        overlapped = 0.0 if busy else None
        for s in segments:
            length = s.end - s.start
            shared = _length(_intersect(busy, [(s.start, s.end)])) if busy else 0.0
            if shared and s.category in ("inter-op dispatch", "intra-op dispatch"):
                seconds["communication"] += shared / 1e6
                seconds[s.category] += (length - shared) / 1e6
            else:
                seconds[s.category] += length / 1e6
                if shared and s.category != "communication" and overlapped is not None:
                    overlapped += shared / 1e6
        return StepAnalysis(wall, seconds, overlapped, ops)
    compute = _union([(a, b) for a, b, name in device_kernels if not is_communication(name)])
    comm = _union([(a, b) for a, b, name in device_kernels if is_communication(name)])
    overlapped = _length(_intersect(compute, comm)) / 1e6
    boundaries = sorted({start, end, *(x for iv in (*compute, *comm) for x in iv if start <= x <= end)})
    host = sorted(segments, key=lambda s: s.start)
    for left, right in zip(boundaries, boundaries[1:], strict=False):
        middle, length = (left + right) / 2, (right - left) / 1e6
        if _covers(compute, middle):
            seconds["kernel"] += length
        elif _covers(comm, middle):
            seconds["communication"] += length
        else:
            _split_host(host, left, right, seconds)
    return StepAnalysis(wall, seconds, overlapped, ops)


def _covers(intervals: Sequence[tuple[float, float]], t: float) -> bool:
    return any(a <= t < b for a, b in intervals)


def _split_host(host: Sequence[Segment], left: float, right: float, seconds: dict[str, float]) -> None:
    """The device was idle from ``left`` to ``right``: charge it to what the host thread was doing meanwhile (a
    host "kernel" while the device idles is the launch of one: intra-op dispatch)."""
    covered = 0.0
    for s in host:
        a, b = max(s.start, left), min(s.end, right)
        if a < b:
            category = "intra-op dispatch" if s.category == "kernel" else s.category
            seconds[category] += (b - a) / 1e6
            covered += b - a
    seconds["inter-op dispatch"] += max(0.0, (right - left) - covered) / 1e6


def _comm_intervals(events: Sequence[Event], start: float, end: float) -> Iterator[tuple[float, float]]:
    for e in events:
        if is_communication(e.name):
            a, b = max(e.time_range.start, start), min(e.time_range.end, end)
            if a < b:
                yield (a, b)


def summarise(
    steps: Sequence[StepAnalysis], top: int = 12
) -> tuple[dict[str, float], float | None, list[OperatorTime]]:
    """Mean seconds per category over the steps, mean overlapped communication, and the top operators by time
    (seed 001's table 6: the operators behind the kernel and intra-op shares)."""
    seconds = {c: statistics.fmean(s.seconds[c] for s in steps) for c in CATEGORIES}
    overlaps = [s.overlapped_s for s in steps if s.overlapped_s is not None]
    overlapped = statistics.fmean(overlaps) if overlaps else None
    totals: dict[tuple[str, str], float] = {}
    for s in steps:
        for key, value in s.operators.items():
            totals[key] = totals.get(key, 0.0) + value / len(steps)
    step_s = statistics.fmean(s.wall_s for s in steps)
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])[:top]
    operators = [
        OperatorTime(name=name, category=category, seconds=value, share=value / step_s if step_s else 0.0)
        for (name, category), value in ranked
    ]
    return seconds, overlapped, operators


def _on_device(event: Any) -> bool:
    """Whether a profiler event is an accelerator's activity (a kernel, a copy), not a host thread's."""
    return str(getattr(event, "device_type", "")).rsplit(".", 1)[-1] in ("CUDA", "XPU", "PrivateUse1", "MTIA")


def analyse_events(
    events: Sequence[Any], device_type: str, data_regions: tuple[str, ...] = (DATA_REGION,)
) -> list[StepAnalysis]:
    """Analyse every ``ProfilerStep`` of a profiler's events (``prof.events()``), for any loop that calls
    ``prof.step()`` once per training step: the split of each (:func:`analyse_step`). ``data_regions``: the name
    prefixes of the regions that fetch the batch (default: the runner's ``accelbench::data``)."""
    # the training thread's steps (the device's projections of them are not steps: the H100's record counted 6
    # steps in a 3-step window)
    steps = [e for e in events if e.name.startswith("ProfilerStep") and not _on_device(e)]
    if not steps:
        return []
    thread = steps[0].thread
    # The device's timeline also carries each host annotation's projection (kineto's gpu_user_annotation: a
    # ProfilerStep#N, an Optimizer.step#..., accelbench::data spanning the kernels launched inside it). They are no
    # work of the device's: taken for kernels, a step's projection made the whole step "kernel" (on an H100, 52.5 of
    # a 52.7 ms gpt2 step, where its kernels ran 18.1 ms).
    annotations = {e.name for e in events if getattr(e, "is_user_annotation", False) and not _on_device(e)}
    on_device = [
        e
        for e in events
        if _on_device(e)
        and not getattr(e, "is_user_annotation", False)
        and e.name not in annotations
        and not e.name.startswith("ProfilerStep")
    ]
    others = [e for e in events if e.thread != thread and not _on_device(e)]
    kernels = [(e.time_range.start, e.time_range.end, e.name) for e in on_device]
    out = []
    for step in steps:
        start, end = step.time_range.start, step.time_range.end
        mine = [(max(a, start), min(b, end), n) for a, b, n in kernels if a < end and b > start]
        out.append(analyse_step(step, mine, [e for e in others if e.time_range.start < end], data_regions))
    return out
