"""`run --profile` on CUDA/ROCm: the device's timeline by Holistic Trace Analysis (the ``hta`` extra).

The trace is built by hand in the shape torch.profiler (kineto) writes for a CUDA run: ``ProfilerStep#N`` host
annotations, ``cuda_runtime`` launches linked to ``kernel``/``gpu_memcpy`` events on CUDA streams by correlation
id, an NCCL all-reduce kernel on its own stream overlapping a GEMM, ``gpu_user_annotation`` projections of the
steps, flow events, metadata events, ``deviceProperties`` and ``distributedInfo`` (rank 0). The figures HTA must
give are worked out below from the kernels' times.
"""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from accelbench.engine.profile import HTA_HINT, hta_device_timeline

HOST_PID, HOST_TID, DEVICE_PID = 4242, 4242, 0
COMPUTE_STREAM, NCCL_STREAM = 7, 20
BASE = 1_700_000_000_000  # kineto's timestamps: microseconds, large, with a fractional part on host events

# (category, name, stream, start, end) of each step's device work, in microseconds from the step's start
DEVICE_WORK = [
    ("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", COMPUTE_STREAM, 50, 60),
    ("kernel", "ampere_sgemm_128x64_tn", COMPUTE_STREAM, 100, 400),
    ("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", NCCL_STREAM, 300, 600),
    ("kernel", "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>()", COMPUTE_STREAM,
     700, 800),
]  # fmt: skip
STEP_US, STEPS = 1000, 2

# Worked out by hand, over both steps (HTA's span: first device event's start to the last one's end):
#   span      = (1000 + 800) - 50                        = 1750 us
#   busy      = per step 10 (copy) + 500 (gemm U nccl: 100..600) + 100 (add) = 610, x2 = 1220 us
#   idle      = span - busy                               = 530 us
#   compute   = per step 300 (gemm) + 100 (add) = 400, x2 = 800 us (NCCL kernels and copies are not compute)
#   non-comp. = span - idle - compute                     = 420 us (copies 2x10, NCCL outside the gemm 2x200)
#   overlap   = NCCL under the gemm 2x100 / NCCL 2x300     = 33.33 %
SPAN, IDLE, COMPUTE, NON_COMPUTE, OVERLAP_PCT = 1750, 530, 800, 420, 33.33


def kineto_trace(steps: int = STEPS, annotation_args: dict[str, Any] | None = None) -> dict[str, Any]:
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "ts": BASE, "pid": HOST_PID, "tid": 0, "args": {"name": "python"}},
        {"name": "process_name", "ph": "M", "ts": BASE, "pid": DEVICE_PID, "tid": 0, "args": {"name": "python"}},
        {"name": "thread_name", "ph": "M", "ts": BASE, "pid": DEVICE_PID, "tid": COMPUTE_STREAM,
         "args": {"name": f"stream {COMPUTE_STREAM} "}},
        {"ph": "X", "cat": "Trace", "ts": BASE - 10, "dur": steps * STEP_US + 20, "pid": "Spans",
         "tid": "PyTorch Profiler", "name": "PyTorch Profiler (0)", "args": {"Op count": 0}},
    ]  # fmt: skip
    correlation, external = 100, 1
    for step in range(steps):
        t0 = BASE + step * STEP_US
        number = step + 2  # the schedule's first active step after two warm-up steps
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{number}", "pid": HOST_PID,
                       "tid": HOST_TID, "ts": t0 + 0.125, "dur": STEP_US - 0.25,
                       "args": {"External id": external, "Record function id": 0, "Ev Idx": external - 1}})  # fmt: skip
        events.append({"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{number}",
                       "pid": DEVICE_PID, "tid": COMPUTE_STREAM, "ts": t0 + 50, "dur": 750,
                       "args": {"External id": external, **(annotation_args or {})}})  # fmt: skip
        external += 1
        for i, (cat, name, stream, start, end) in enumerate(DEVICE_WORK):
            correlation += 1
            launch = t0 + 5 + 10 * i + 0.5
            op = "aten::copy_" if cat == "gpu_memcpy" else "aten::mm"
            api = "cudaMemcpyAsync" if cat == "gpu_memcpy" else "cudaLaunchKernel"
            events += [
                {"ph": "X", "cat": "cpu_op", "name": op, "pid": HOST_PID, "tid": HOST_TID, "ts": launch - 0.25,
                 "dur": 8.5, "args": {"External id": external, "Record function id": 0, "Sequence number": 7,
                                      "Fwd thread id": 0, "Ev Idx": external - 1}},
                {"ph": "X", "cat": "cuda_runtime", "name": api, "pid": HOST_PID, "tid": HOST_TID, "ts": launch,
                 "dur": 4.25, "args": {"External id": external, "cbid": 211, "correlation": correlation}},
                {"ph": "X", "cat": cat, "name": name, "pid": DEVICE_PID, "tid": stream, "ts": t0 + start,
                 "dur": end - start, "args": {"External id": external, "queued": 0, "device": 0, "context": 1,
                                              "stream": stream, "correlation": correlation,
                                              "registers per thread": 64, "shared memory": 0,
                                              "blocks per SM": 0.5, "warps per SM": 2.0, "grid": [64, 1, 1],
                                              "block": [128, 1, 1], "est. achieved occupancy %": 0}},
                {"ph": "s", "id": correlation, "pid": HOST_PID, "tid": HOST_TID, "ts": launch, "cat": "ac2g",
                 "name": "ac2g"},
                {"ph": "f", "id": correlation, "pid": DEVICE_PID, "tid": stream, "ts": t0 + start, "cat": "ac2g",
                 "name": "ac2g", "bp": "e"},
            ]  # fmt: skip
            external += 1
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85029158912,
                              "computeMajor": 9, "computeMinor": 0, "maxThreadsPerBlock": 1024,
                              "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536, "warpSize": 32,
                              "sharedMemPerBlock": 49152, "numSms": 132, "regsPerMultiprocessor": 65536,
                              "sharedMemPerBlockOptin": 232448, "sharedMemPerMultiprocessor": 233472}],
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1, "pg_count": 1, "pg_config": [],
                            "nccl_version": "2.21.5"},
        "cuda_runtime_version": 12040,
        "cuda_driver_version": 12040,
        "with_flops": False,
        "record_shapes": False,
        "trace_id": "0123456789ABCDEF",
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": 1700000000000000000,
        "traceEvents": events,
        "traceName": "run.trace.json",
    }  # fmt: skip


def write_gz(path: Path, trace: dict[str, Any]) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as out:
        json.dump(trace, out, indent=1)  # kineto writes one key per line, "rank": 0 with a space
    return path


# the device-side projection of ``ProfilerStep#N``: with its ``External id`` only, or also with a device and a
# stream (which HTA 0.5.0 would count as a kernel spanning the step, were it not left out of HTA's copy)
ANNOTATIONS = [None, {"device": 0, "stream": COMPUTE_STREAM}]


@pytest.mark.parametrize(
    "annotation_args", ANNOTATIONS, ids=["annotation-without-stream", "annotation-on-stream"]
)
def test_hta_reads_a_cuda_trace_with_the_hand_worked_figures(
    tmp_path: Path, annotation_args: dict[str, Any] | None
) -> None:
    hta = pytest.importorskip("hta", reason="Holistic Trace Analysis is not installed (the [hta] extra)")
    assert hta  # imported above only to skip; the function under test imports it itself
    trace = write_gz(tmp_path / ".trace-0a1b2c3d.json.gz", kineto_trace(annotation_args=annotation_args))
    figures, source = hta_device_timeline(trace)
    assert figures is not None, source
    assert source.startswith("Holistic Trace Analysis 0.") and "rank 0" in source
    assert figures["steps"] == STEPS
    per_step = {key: value / STEPS / 1e6 for key, value in
                {"span_s": SPAN, "idle_s": IDLE, "compute_s": COMPUTE, "non_compute_s": NON_COMPUTE}.items()}  # fmt: skip
    for key, expected in per_step.items():
        assert figures[key] == pytest.approx(expected, abs=1e-12), key
    assert figures["idle_s"] + figures["compute_s"] + figures["non_compute_s"] == pytest.approx(
        figures["span_s"]
    )
    assert figures["idle_fraction"] == pytest.approx(IDLE / SPAN)
    assert figures["compute_fraction"] == pytest.approx(COMPUTE / SPAN)
    assert figures["non_compute_fraction"] == pytest.approx(NON_COMPUTE / SPAN)
    assert figures["comm_comp_overlap_pct"] == pytest.approx(OVERLAP_PCT)


def test_hta_without_communication_kernels_leaves_the_overlap_out(tmp_path: Path) -> None:
    pytest.importorskip("hta", reason="Holistic Trace Analysis is not installed (the [hta] extra)")
    trace = kineto_trace()
    trace["traceEvents"] = [e for e in trace["traceEvents"] if not str(e.get("name", "")).startswith("nccl")]
    figures, source = hta_device_timeline(write_gz(tmp_path / "t.json.gz", trace))
    assert figures is not None, source
    assert "comm_comp_overlap_pct" not in figures
    # without the NCCL kernels: per step busy 10 + 300 + 100, so idle = 1750 - 820, non-compute = the copies only
    assert figures["idle_s"] == pytest.approx((SPAN - 820) / STEPS / 1e6)
    assert figures["non_compute_s"] == pytest.approx(20 / STEPS / 1e6)


def test_hta_reads_a_trace_with_sub_microsecond_events_at_real_timestamps(tmp_path: Path) -> None:
    """A real CUDA trace: device timestamps with fractions of a microsecond, about 4.9e12 us since boot, and
    memsets shorter than a microsecond. HTA 0.5.0's rounding to whole microseconds gave such memsets a duration
    of -1, and on an H100's gpt2 trace its breakdown failed its own assertion (docs/gpu/h100-2026-11-27). Here:
    the hand-worked trace moved to such timestamps, every device event 0.3 us later, and a 0.4 us memset (inside
    no whole microsecond) in each step's idle time."""
    pytest.importorskip("hta", reason="Holistic Trace Analysis is not installed (the [hta] extra)")
    trace = kineto_trace()
    shift = 4_884_746_534_070 - BASE
    memsets = []
    for e in trace["traceEvents"]:
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] += shift
        if "stream" in e.get("args", {}) and e.get("ph") == "X":
            e["ts"] += 0.3
            if e["name"].startswith("ampere_sgemm"):
                memset = dict(e, cat="gpu_memset", name="Memset (Device)", dur=0.4)
                memset["ts"] = e["ts"] + 310.0  # 410.3..410.7 from the step's start: the device is idle then
                memset["args"] = dict(e["args"], correlation=e["args"]["correlation"] + 10_000)
                memsets.append(memset)
    trace["traceEvents"] += memsets
    figures, source = hta_device_timeline(write_gz(tmp_path / "t.json.gz", trace))
    assert figures is not None, source
    # HTA gives whole microseconds: the memsets' 0.8 us move idle and non-compute by at most one
    whole_us = 1e-6 / STEPS
    assert figures["span_s"] == pytest.approx(SPAN / STEPS / 1e6, abs=whole_us)
    assert figures["compute_s"] == pytest.approx(COMPUTE / STEPS / 1e6, abs=whole_us)
    assert figures["idle_s"] == pytest.approx(IDLE / STEPS / 1e6, abs=whole_us)
    assert figures["non_compute_s"] == pytest.approx(NON_COMPUTE / STEPS / 1e6, abs=whole_us)
    assert figures["idle_s"] + figures["compute_s"] + figures["non_compute_s"] == pytest.approx(
        figures["span_s"]
    )


def test_an_hta_failure_is_recorded_not_raised(tmp_path: Path) -> None:
    pytest.importorskip("hta", reason="Holistic Trace Analysis is not installed (the [hta] extra)")
    broken = tmp_path / ".trace-broken.json.gz"
    broken.write_bytes(b"this is not gzip")
    figures, source = hta_device_timeline(broken)
    assert figures is None
    assert "failed on the trace" in source and "Holistic Trace Analysis" in source
    empty = write_gz(tmp_path / "empty.json.gz", {"distributedInfo": {"rank": 0}, "traceEvents": []})
    figures, source = hta_device_timeline(empty)
    assert figures is None and "failed on the trace" in source
    missing_figures, missing_source = hta_device_timeline(tmp_path / "absent.json.gz")
    assert missing_figures is None and "failed on the trace" in missing_source


def test_importing_hta_leaves_the_process_logging_alone(tmp_path: Path) -> None:
    pytest.importorskip("hta", reason="Holistic Trace Analysis is not installed (the [hta] extra)")
    mine = logging.getLogger("accelbench.test-hta")
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    hta_device_timeline(write_gz(tmp_path / "t.json.gz", kineto_trace()))
    assert not mine.disabled
    assert root.handlers == handlers and root.level == level


def test_without_hta_the_hint_is_recorded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import accelbench.engine.profile.hta as profile_hta

    def absent() -> None:
        raise ImportError("No module named 'hta'")

    monkeypatch.setattr(profile_hta, "_import_hta", absent)
    figures, source = hta_device_timeline(tmp_path / "t.json.gz")
    assert figures is None and HTA_HINT in source and "not installed" in source


def test_the_figures_go_into_the_record_and_back() -> None:
    from accelbench.engine.profile import CATEGORIES, StepAnalysis, step_profile
    from accelbench.results import StepProfile

    analysis = StepAnalysis(
        wall_s=0.001, seconds=dict.fromkeys(CATEGORIES, 0.001 / len(CATEGORIES)), overlapped_s=0
    )
    figures = {"steps": 2.0, "span_s": 875e-6, "idle_s": 265e-6, "idle_fraction": 530 / 1750}
    profile = step_profile(
        [analysis], "2 steps", None, "t.json.gz", "torch.profiler", figures, "HTA 0.5.0: ..."
    )
    again = StepProfile.model_validate_json(profile.model_dump_json())
    assert again.device_timeline == figures and again.device_timeline_source == "HTA 0.5.0: ..."
    bare = step_profile([analysis], "2 steps", None, None, "torch.profiler")  # a CPU run: nothing extra
    assert bare.device_timeline is None and bare.device_timeline_source is None
    old = StepProfile.model_validate(
        {k: v for k, v in bare.model_dump().items() if not k.startswith("device_")}
    )
    assert old.device_timeline is None  # records written before the field still read
