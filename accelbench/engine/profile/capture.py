"""Running the profiled window of ``accelbench run --profile``: steady-state steps under torch.profiler, after the
timed epochs so that profiling never changes a measured epoch; the window cut to the memory that can hold it, the
Chrome trace written beside the record, and the record's ``profile`` made from the analysed steps
(:mod:`accelbench.engine.profile.analysis`) and, on CUDA/ROCm, HTA's device timeline
(:mod:`accelbench.engine.profile.hta`)."""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from accelbench.engine.profile.analysis import DATA_REGION, StepAnalysis, analyse_events, summarise
from accelbench.engine.profile.hta import hta_device_timeline
from accelbench.results import StepProfile

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
