"""The device's timeline by Holistic Trace Analysis (HTA; CUDA and ROCm, the ``hta`` extra): HTA's reading of the
Chrome trace ``accelbench run --profile`` writes, with HTA's own definitions (:func:`hta_device_timeline`)."""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


@contextlib.contextmanager
def _without_whole_microsecond_rounding() -> Iterator[None]:
    """HTA 0.5.0 rounds each event of a trace with fractional timestamps to whole microseconds inward (start up,
    end down), so an event under a microsecond long that spans no whole one (a memset, a small fill) gets a
    duration of -1. Merged with the others, those made its busy time exceed the step's span on an H100 trace of
    gpt2 (81 such events in 3 steps), and its temporal breakdown failed its own assertion (non-compute >= 0). HTA's
    own switch turns the rounding off while it reads the trace."""
    name = "HTA_DISABLE_NS_ROUNDING"
    before = os.environ.get(name)
    os.environ[name] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


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
            with warnings.catch_warnings(), _without_whole_microsecond_rounding():
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
