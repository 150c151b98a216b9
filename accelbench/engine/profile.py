"""Where a step's time goes (``accelbench run --profile``): a profiled window of steady-state steps, run after the
timed epochs so that profiling never changes a measured epoch, split the way seed 001 splits an iteration.

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

On CUDA and ROCm (torch's device type "cuda" for both), the device's own timeline is also read from the written
trace by Holistic Trace Analysis (the ``hta`` extra), with HTA's definitions: :func:`hta_device_timeline`.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
import logging
import math
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from accelbench.results import OperatorTime, StepProfile

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


# --------------------------------------------------------------------------------------------------------------
# Running the profiled window
# --------------------------------------------------------------------------------------------------------------

PROFILE_WARMUP_STEPS = 2  # steps run under the profiler before those analysed (its own start-up)

# What a profiled window may cost. Every operator a step dispatches is a profiler event, held by the profiler (C++),
# then as a Python FunctionEvent for the analysis, then as JSON text while the Chrome trace is exported: measured on
# the 1-layer test GPT (torch 2.13, CPU; 821 events a step), 300 profiled steps raised the peak resident set by
# 1.1 GiB over a 5-step window's, 3.9 MB a step: about 4.8 KB an event. 6 KiB an event keeps a margin. A window
# may take half the memory available when it starts (the run's own model, data and the export's copies need the
# rest).
PROFILE_BYTES_PER_EVENT = 6 * 2**10
PROFILE_MEMORY_SHARE = 0.5
# Any training step (forward, backward and optimizer of even one layer) dispatches hundreds of operators: the
# 1-layer test GPT 821. 400 is the fewest assumed when the window is checked before the run, knowing no model yet.
MIN_EVENTS_PER_STEP = 400
# The most steps a window analyses, whatever the memory: the breakdown is a mean over steady steps, which stops
# changing after a few dozen; 1000 steps of even the smallest model make a trace of ~800,000 events (tens of MB
# gzipped, several GB while exported), more than a trace viewer opens comfortably.
MAX_PROFILE_STEPS = 1000


def profile_steps_that_fit(events_per_step: int, available_bytes: int) -> int:
    """How many profiled steps of ``events_per_step`` events the memory available can hold (0: not even one)."""
    per_step = max(1, events_per_step) * PROFILE_BYTES_PER_EVENT
    return int(available_bytes * PROFILE_MEMORY_SHARE // per_step)


def _step_events(
    train_step: Callable[[Any, Any], Any],
    batches: Iterator[tuple[Any, Any]],
    to_device: Callable[[Any], Any],
    synchronize: Callable[[], None],
    activities: list[Any],
) -> int:
    """The profiler events one training step makes (one step profiled on its own, not analysed): what the window's
    memory is reckoned from."""
    from torch.profiler import profile, record_function

    with _without_profiler_chatter(), profile(activities=activities) as prof:
        with record_function(DATA_REGION):
            inputs, targets = next(batches)
            inputs, targets = to_device(inputs), to_device(targets)
        train_step(inputs, targets)
        synchronize()
    try:
        return len(prof.profiler.kineto_results.events())
    except Exception:  # noqa: BLE001 - another torch's internals: count the parsed events instead
        return len(prof.events())


def profile_steps(
    train_step: Callable[[Any, Any], Any],
    batches: Iterator[tuple[Any, Any]],
    to_device: Callable[[Any], Any],
    synchronize: Callable[[], None],
    device_type: str,
    steps: int,
    trace_path: Path | None,
    timed_step_s: float | None,
    window: str,
    available_bytes: int | None = None,
    bounded: Callable[[str], None] | None = None,
    agree: Callable[[int], int] | None = None,
) -> StepProfile:
    """Run ``PROFILE_WARMUP_STEPS + steps`` training steps under torch.profiler and analyse the last ``steps``;
    write the Chrome trace gzipped to ``trace_path`` (opens in Perfetto).

    With ``available_bytes`` (the memory available now), one step is profiled first to count its events, and the
    window is cut to the steps that memory can hold (:func:`profile_steps_that_fit`; ``agree``: the count every
    rank of a job will use, the least of theirs); ``bounded`` is told why, in words, when it is cut. A window of
    which not even one step fits raises :class:`MemoryError`, saying so."""
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    activities = [ProfilerActivity.CPU]
    device_activity = {"cuda": "CUDA", "xpu": "XPU"}.get(device_type)
    if device_activity and hasattr(ProfilerActivity, device_activity):
        activities.append(getattr(ProfilerActivity, device_activity))
    if available_bytes is not None:
        events = _step_events(train_step, batches, to_device, synchronize, activities)
        fit = min(steps, profile_steps_that_fit(events, available_bytes))
        if agree is not None:
            fit = agree(fit)
        if fit < 1:
            raise MemoryError(
                f"a profiled step makes {events} profiler events (~{events * PROFILE_BYTES_PER_EVENT / 2**20:.0f} MiB "
                f"to hold), and {available_bytes / 2**20:.0f} MiB are available: not even one step fits"
            )
        if fit < steps:
            why = (
                f"--profile-steps {steps} cut to {fit}: a step makes {events} profiler events (~"
                f"{PROFILE_BYTES_PER_EVENT // 2**10} KiB each to hold and export), and "
                f"{available_bytes / 2**30:.1f} GiB were available (half of it for the window)"
            )
            window = f"{window}; {why}"
            steps = fit
            if bounded is not None:
                bounded(why)
    captured: dict[str, Any] = {}

    def ready(prof: Any) -> None:
        captured["events"] = prof.events()
        if trace_path is not None:
            _write_trace(prof, trace_path)

    plan = schedule(wait=0, warmup=PROFILE_WARMUP_STEPS, active=steps, repeat=1)
    with (
        _without_profiler_chatter(),
        profile(activities=activities, schedule=plan, on_trace_ready=ready) as prof,
    ):
        for _ in range(PROFILE_WARMUP_STEPS + steps):
            with record_function(DATA_REGION):
                inputs, targets = next(batches)
                inputs, targets = to_device(inputs), to_device(targets)
            train_step(inputs, targets)
            synchronize()
            prof.step()
    timeline: dict[str, float] | None = None
    timeline_source: str | None = None
    if device_type == "cuda":  # NVIDIA's and ROCm's builds of torch both
        if trace_path is not None and trace_path.exists():
            timeline, timeline_source = hta_device_timeline(trace_path)
        else:
            timeline_source = "Holistic Trace Analysis not run: no trace was written on this rank"
    return step_profile(
        analyse_events(captured.get("events") or [], device_type),
        window=window,
        timed_step_s=timed_step_s,
        trace=trace_path.name if trace_path is not None else None,
        source="torch.profiler, host thread" + (" and device kernels" if device_activity else ""),
        device_timeline=timeline,
        device_timeline_source=timeline_source,
    )


def step_profile(
    analyses: Sequence[StepAnalysis],
    window: str,
    timed_step_s: float | None,
    trace: str | None,
    source: str,
    device_timeline: dict[str, float] | None = None,
    device_timeline_source: str | None = None,
) -> StepProfile:
    """The record's ``profile`` from analysed steps (:func:`analyse_events`): the mean split and top operators;
    ``device_timeline``: HTA's figures (:func:`hta_device_timeline`), on CUDA/ROCm only."""
    if not analyses:
        raise RuntimeError("the profiler recorded no step")
    seconds, overlapped, operators = summarise(analyses)
    step_s = statistics.fmean(a.wall_s for a in analyses)
    return StepProfile(
        steps=len(analyses),
        window=window,
        step_s=step_s,
        timed_step_s=timed_step_s,
        seconds=seconds,
        overlapped_communication_s=overlapped,
        top_operators=operators,
        trace=trace,
        source=source,
        device_timeline=device_timeline,
        device_timeline_source=device_timeline_source,
    )


def _on_device(event: Any) -> bool:
    """Whether a profiler event is an accelerator's activity (a kernel, a copy), not a host thread's."""
    return str(getattr(event, "device_type", "")).rsplit(".", 1)[-1] in ("CUDA", "XPU", "PrivateUse1", "MTIA")


@contextlib.contextmanager
def _without_profiler_chatter() -> Iterator[None]:
    """Kineto logs its start and stop ("USDT: ... profiler_start") on stderr from C++: keep those two lines out of
    the user's output, and pass on anything else written meanwhile."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            for line in caught.read().decode(errors="replace").splitlines(keepends=True):
                if not line.startswith("USDT:"):
                    sys.stderr.write(line)


def analyse_events(
    events: Sequence[Any], device_type: str, data_regions: tuple[str, ...] = (DATA_REGION,)
) -> list[StepAnalysis]:
    """Analyse every ``ProfilerStep`` of a profiler's events (``prof.events()``), for any loop that calls
    ``prof.step()`` once per training step: the split of each (:func:`analyse_step`). ``data_regions``: the name
    prefixes of the regions that fetch the batch (default: the runner's ``accelbench::data``)."""
    steps = [e for e in events if e.name.startswith("ProfilerStep")]
    if not steps:
        return []
    thread = steps[0].thread
    on_device = [e for e in events if _on_device(e)]
    others = [e for e in events if e.thread != thread and not _on_device(e)]
    kernels = [(e.time_range.start, e.time_range.end, e.name) for e in on_device]
    out = []
    for step in steps:
        start, end = step.time_range.start, step.time_range.end
        mine = [(max(a, start), min(b, end), n) for a, b, n in kernels if a < end and b > start]
        out.append(analyse_step(step, mine, [e for e in others if e.time_range.start < end], data_regions))
    return out


def _write_trace(prof: Any, path: Path) -> None:
    """The Chrome trace, gzipped, written atomically beside the record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, raw = tempfile.mkstemp(prefix=".trace-", suffix=".json", dir=path.parent)
    os.close(fd)
    fd, packed = tempfile.mkstemp(prefix=".trace-", suffix=".json.gz", dir=path.parent)
    try:
        prof.export_chrome_trace(raw)
        with os.fdopen(fd, "wb") as out, open(raw, "rb") as src, gzip.GzipFile(fileobj=out, mode="wb") as gz:
            shutil.copyfileobj(src, gz)
        os.replace(packed, path)
    finally:
        Path(raw).unlink(missing_ok=True)
        Path(packed).unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------------------------
# The device's timeline by Holistic Trace Analysis (CUDA and ROCm; the ``hta`` extra)
# --------------------------------------------------------------------------------------------------------------

HTA_HINT = "pip install 'accelbench[hta]'"


def _import_hta() -> Any:
    """HTA's ``TraceAnalysis``, imported without letting HTA reconfigure the process's logging: importing it runs
    ``logging.config.fileConfig``, which sets the root logger to INFO on stdout and disables every logger that
    exists already. Raises ImportError where HTA is not installed."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    disabled = {
        name: lg.disabled
        for name, lg in logging.Logger.manager.loggerDict.items()
        if isinstance(lg, logging.Logger)
    }
    try:
        from hta.trace_analysis import TraceAnalysis
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        for name, was in disabled.items():
            logging.getLogger(name).disabled = was
        quiet = logging.getLogger(
            "hta"
        )  # its progress lines ("Parsed ... in 0.01 seconds") stay out of our output
        quiet.handlers[:] = [logging.NullHandler()]
        quiet.propagate = False
    return TraceAnalysis


def _hta_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("holistictraceanalysis")
    except PackageNotFoundError:
        return "unknown version"


def _trace_for_hta(trace_file: Path, out: Path) -> Path:
    """The trace as HTA is given it: a copy without the ``gpu_user_annotation`` spans (the device-side projections
    of host annotations such as ``ProfilerStep#N``: no device work of their own). HTA 0.5.0 counts every event
    that carries a CUDA stream as a kernel, so a span that carries one would fill the idle time it spans."""
    opener: Any = gzip.open if trace_file.name.endswith(".gz") else open
    with opener(trace_file, "rt", encoding="utf-8") as src:
        trace = json.load(src)
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if isinstance(events, list):
        trace["traceEvents"] = [
            e for e in events if not (isinstance(e, dict) and e.get("cat") == "gpu_user_annotation")
        ]
    with open(out, "w", encoding="utf-8") as dst:
        json.dump(trace, dst, indent=0)  # one key per line, as kineto writes: HTA finds "rank": N by line
    return out


def hta_device_timeline(trace_file: Path, rank: int = 0) -> tuple[dict[str, float] | None, str]:
    """HTA's reading of a CUDA/ROCm Chrome trace (the one :func:`profile_steps` writes): its temporal breakdown
    and communication/computation overlap, as ``(figures, source)``. Never raises: without HTA, or when HTA
    fails on the trace, the figures are None and ``source`` says why.

    HTA's definitions (``hta.analyzers.breakdown_analysis`` and ``communication_analysis``, 0.5.0), over the
    GPU events (those with a stream) of all the trace's profiled steps, in microseconds rounded to whole ones:

    - *kernel time* (``span_s``): from the start of the first GPU event to the end of the last;
    - *idle*: the part of that span in which no GPU event runs on any stream;
    - *compute*: the union of computation kernels (every kernel but NCCL/RCCL ones, ``^nccl.*Kernel``, memcpy,
      memset and syncs);
    - *non-compute*: the rest, span - idle - compute: communication kernels not under a compute kernel, copies,
      memsets;
    - *comm_comp_overlap_pct*: the time communication kernels run while a computation kernel runs, as a percentage
      of the communication kernels' (merged) time; absent where the trace has no communication kernel.

    Seconds are per profiled step (HTA's totals / the steps HTA found), fractions are of HTA's kernel time. HTA
    reads a copy of the trace without its ``gpu_user_annotation`` spans (:func:`_trace_for_hta`), with every
    profiled step included (the profiler keeps only complete steps).
    """
    try:
        TraceAnalysis = _import_hta()
    except ImportError:
        return (
            None,
            f"Holistic Trace Analysis not installed: {HTA_HINT} for the device's idle/compute breakdown",
        )
    label = f"Holistic Trace Analysis {_hta_version()}"
    try:
        import warnings

        with tempfile.TemporaryDirectory(prefix="accelbench-hta-") as folder:
            trace = _trace_for_hta(Path(trace_file), Path(folder) / f"rank-{rank}.json")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # pandas' deprecation notices about HTA's own calls
                analysis = TraceAnalysis(
                    trace_files={rank: str(trace)},
                    trace_dir=folder,
                    include_last_profiler_step=True,  # every step the profiler kept is complete: analyse them all
                )
                temporal = analysis.get_temporal_breakdown(visualize=False)
                overlap = analysis.get_comm_comp_overlap(visualize=False)
                steps = len(analysis.get_profiler_steps()) or 1
        row = temporal[temporal["rank"] == rank].iloc[0]
        span_us = float(row["kernel_time(us)"])
        if not span_us > 0:
            raise ValueError("the trace has no GPU kernel time")
        figures: dict[str, float] = {"steps": float(steps), "span_s": span_us / 1e6 / steps}
        for key, column in (("idle", "idle_time(us)"), ("compute", "compute_time(us)"),
                            ("non_compute", "non_compute_time(us)")):  # fmt: skip
            figures[f"{key}_s"] = float(row[column]) / 1e6 / steps
            figures[f"{key}_fraction"] = float(row[column]) / span_us
        pct = overlap.loc[overlap["rank"] == rank, "comp_comm_overlap_pctg"]
        if len(pct) and math.isfinite(float(pct.iloc[0])):
            figures["comm_comp_overlap_pct"] = float(pct.iloc[0])
        return (
            figures,
            f"{label}: temporal breakdown and communication/computation overlap of rank {rank}'s trace",
        )
    except Exception as exc:  # HTA's failure is never the run's
        return None, f"{label} failed on the trace: {type(exc).__name__}: {exc}"[:500]
