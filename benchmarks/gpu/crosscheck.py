"""Check accelbench's figures on a GPU against independent readings taken by hand in the same process.

    python benchmarks/gpu/crosscheck.py detect  OUT.json   # NVML detection leaves CUDA uninitialised; versions
    python benchmarks/gpu/crosscheck.py ceilings OUT.json  # measured bf16/tf32/fp32 matmul rate and copy bandwidth
    python benchmarks/gpu/crosscheck.py runs OUT.json RESULTS_DIR [--ceilings CEILINGS.json]
    python benchmarks/gpu/crosscheck.py oom OUT.json RESULTS_DIR   # an out-of-memory, then a run that must work

`runs` trains through accelbench's own runner (``accelbench.engine.runner.run``) with a progress object that reads,
beside the runner, what the record will claim: CUDA events around each epoch's device work (the runner times with
host clocks between two synchronisations), ``torch.cuda.max_memory_allocated`` and NVML's used memory after the
run, and NVML's energy counter at each epoch's start and end. Each check prints the record's figure, the
independent one and their difference; the summary JSON holds all of them. Nothing here changes what the runner
measures: the probe only records events and reads counters between the runner's own steps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

H200_BF16_DENSE = 989e12  # NVIDIA's datasheet, dense bf16 tensor FLOP/s (H100 SXM5 and H200 SXM alike)


def nvml_handle() -> Any:
    import pynvml

    pynvml.nvmlInit()
    uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
    return pynvml, pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else "GPU-" + uuid)


# ----------------------------------------------------------------------------------------------------------------
def cmd_detect(out: Path) -> dict[str, Any]:
    """Detection through the plugin host must not initialise CUDA in this (the parent) process."""
    from accelbench.plugins import get_host

    host = get_host()
    start = time.perf_counter()
    backend = host.select_backend("cuda")
    devices = backend.detect()
    detect_s = time.perf_counter() - start
    initialised = torch.cuda.is_initialized()
    versions = backend.runtime_versions()
    initialised_after_versions = torch.cuda.is_initialized()
    from accelbench.contract import standard_plan

    peak = backend.peak_figures(devices[0], standard_plan("bf16-mixed", "ieee-fp32")) if devices else None
    props = torch.cuda.get_device_properties(0)  # only now: an independent reading from CUDA itself
    result = {
        "devices": [d.model_dump() for d in devices],
        "detect_s": detect_s,
        "cuda_initialised_by_detection": initialised,
        "cuda_initialised_by_runtime_versions": initialised_after_versions,
        "versions": versions,
        "peak_bf16": peak.model_dump() if peak else None,
        "cuda_says": {
            "name": props.name,
            "total_memory": props.total_memory,
            "sm": f"{props.major}.{props.minor}",
            "multiprocessors": props.multi_processor_count,
        },
        "memory_matches_cuda": bool(devices) and devices[0].memory_bytes == props.total_memory,
    }
    print(
        f"detect: {len(devices)} device(s) in {detect_s:.3f} s; CUDA initialised by detection: {initialised}"
    )
    print(f"        NVML memory {devices[0].memory_bytes if devices else None} vs CUDA {props.total_memory}")
    print(f"        peak row: {peak.source if peak else None}")
    return result


# ----------------------------------------------------------------------------------------------------------------
def _rate(fn, flops: float, repeats: int = 20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return flops / statistics.median(times)


def cmd_ceilings(out: Path) -> dict[str, Any]:
    """The two ceilings, measured (METHOD.md): a large matmul per math mode, and a device-to-device copy."""
    n = 8192
    result: dict[str, Any] = {"n": n}
    for name, dtype, tf32 in (
        ("bf16", torch.bfloat16, False),
        ("fp16", torch.float16, False),
        ("tf32", torch.float32, True),
        ("fp32", torch.float32, False),
    ):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a = torch.randn(n, n, device="cuda", dtype=dtype)
        b = torch.randn(n, n, device="cuda", dtype=dtype)
        result[f"matmul_{name}_flops_per_s"] = _rate(
            lambda a=a, b=b: a @ b, 2.0 * n**3, 10 if name == "fp32" else 20
        )
        del a, b
    torch.backends.cuda.matmul.allow_tf32 = False
    src = torch.randn(2 * 2**30 // 4, device="cuda")  # 2 GiB, far past the L2
    dst = torch.empty_like(src)
    copy = lambda dst=dst, src=src: dst.copy_(src)  # noqa: E731
    result["copy_bytes_per_s"] = _rate(copy, 2.0 * src.numel() * 4)  # bytes read + written
    del src, dst
    for key, value in result.items():
        if key != "n":
            print(f"ceiling: {key} = {value / 1e12:.1f} T")
    return result


# ----------------------------------------------------------------------------------------------------------------
class Probe:
    """A runner Progress that reads CUDA events and NVML's energy counter beside the runner's own timing."""

    def __init__(self) -> None:
        self.pynvml, self.handle = nvml_handle()
        self.epochs: list[dict[str, Any]] = []

    def _energy_mj(self) -> int:
        return int(self.pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))

    def start_epoch(self, epoch: int, epochs: int, steps: int, samples_per_step: int) -> None:
        self.steps, self.done = steps, 0
        self.start = torch.cuda.Event(enable_timing=True)
        self.last = torch.cuda.Event(enable_timing=True)
        self.energy0, self.t0 = self._energy_mj(), time.monotonic()
        self.start.record()  # the device is idle here (the runner synchronised after the last epoch)

    def step(self) -> None:
        self.done += 1
        if self.done == self.steps:
            self.last.record()  # after the epoch's last step is queued: completes when its work does

    def end_epoch(self, metrics: Any) -> None:
        energy1, t1 = self._energy_mj(), time.monotonic()
        self.last.synchronize()
        self.epochs.append(
            {
                "epoch": metrics.epoch,
                "runner_wall_s": metrics.wall_s,
                "cuda_event_s": self.start.elapsed_time(self.last) / 1e3,
                "hand_energy_j": (energy1 - self.energy0) / 1e3,
                "hand_window_s": t1 - self.t0,
                "record_telemetry": dict(metrics.telemetry or {}),
            }
        )

    def close(self) -> None:
        pass


RUNS = [  # (label, RunConfig values): a 16-bit run that fills the GPU, fp32 with TF32 on, one compiled
    ("gpt2 bf16-mixed b256", dict(model="gpt2", precision="bf16-mixed", batch_size=256)),
    (
        "gpt2-medium fp32 tf32 b64",
        dict(model="gpt2-medium", precision="fp32", batch_size=64, backend_options={"tf32": "on"}),
    ),
    ("gpt2 bf16-true compiled b256", dict(model="gpt2", precision="bf16-true", batch_size=256, compile=True)),
]


def cmd_runs(out: Path, results: Path, ceilings: dict[str, Any] | None, steps: int) -> dict[str, Any]:
    from accelbench.config import RunConfig
    from accelbench.engine.runner import run
    from accelbench.plugins import get_host

    host = get_host()
    checks = []
    for label, values in RUNS:
        config = RunConfig(backend="cuda", epochs=3, steps_per_epoch=steps, output_dir=results, **values)
        probe = Probe()
        record, path, status = run(config, host, probe)
        pynvml, handle = probe.pynvml, probe.handle
        hand_max_allocated = torch.cuda.max_memory_allocated()
        hand_reserved = torch.cuda.memory_reserved()
        hand_nvml_used = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        m = record.metrics
        check: dict[str, Any] = {"label": label, "record": str(path), "status": status, "epochs": []}
        if m is None or not m.epochs:
            print(f"[{label}] {status}: {record.outcome.message}")
            checks.append(check)
            continue
        last = m.epochs[-1]
        for e, p in zip(m.epochs, probe.epochs, strict=True):
            telemetry = p["record_telemetry"]
            row = {
                "epoch": e.epoch,
                "wall_s": e.wall_s,
                "cuda_event_s": p["cuda_event_s"],
                "wall_minus_event_ms": (e.wall_s - p["cuda_event_s"]) * 1e3,
                "record_energy_j": telemetry.get("energy_j"),
                "hand_energy_j": p["hand_energy_j"],
                "record_power_w": telemetry.get("power_w"),
                "hand_power_w": p["hand_energy_j"] / p["hand_window_s"],
                "utilization_pct": telemetry.get("utilization_pct"),
                "clock_sm_mhz": telemetry.get("clock_sm_mhz"),
            }
            check["epochs"].append(row)
            print(
                f"[{label}] epoch {e.epoch}: wall {e.wall_s:.4f} s, CUDA events {p['cuda_event_s']:.4f} s "
                f"(wall - events {row['wall_minus_event_ms']:+.2f} ms); energy record "
                f"{row['record_energy_j']} J vs by hand {row['hand_energy_j']:.1f} J; power record "
                f"{row['record_power_w']} W vs by hand {row['hand_power_w']:.1f} W"
            )
        check["memory"] = {
            "record_last_epoch_peak_bytes": last.peak_memory_bytes,
            "hand_max_memory_allocated": hand_max_allocated,
            "record_device_used_bytes": m.memory.device_used_bytes if m.memory else None,
            "hand_nvml_used_bytes": hand_nvml_used,
            "hand_reserved_bytes": hand_reserved,
            "nvml_used_minus_reserved_bytes": hand_nvml_used - hand_reserved,
        }
        print(
            f"[{label}] peak: record {last.peak_memory_bytes} vs torch.cuda.max_memory_allocated "
            f"{hand_max_allocated}; NVML used: record {check['memory']['record_device_used_bytes']} vs by hand "
            f"{hand_nvml_used} (reserved {hand_reserved})"
        )
        if m.steady:
            achieved = m.steady.achieved_flops_per_s
            mfu_table = achieved / H200_BF16_DENSE
            check["mfu"] = {
                "record_mfu": m.steady.mfu,
                "record_peak_source": m.peak.source if m.peak else None,
                "achieved_flops_per_s": achieved,
                "hand_mfu_vs_989T": mfu_table,
                "hand_fraction_of_measured_bf16_matmul": achieved / ceilings["matmul_bf16_flops_per_s"]
                if ceilings
                else None,
                "hand_achieved_from_events": m.flops_per_sample
                * statistics.median(
                    e.samples / p["cuda_event_s"] for e, p in zip(m.epochs[1:], probe.epochs[1:], strict=True)
                ),
            }
            print(
                f"[{label}] achieved {achieved / 1e12:.1f} TFLOP/s; record MFU {m.steady.mfu} "
                f"({check['mfu']['record_peak_source']}); vs 989 T: {mfu_table:.4f}; vs measured matmul: "
                f"{check['mfu']['hand_fraction_of_measured_bf16_matmul']}"
            )
        checks.append(check)
        torch.cuda.empty_cache()
    return {"runs": checks}


# ----------------------------------------------------------------------------------------------------------------
def cmd_oom(out: Path, results: Path) -> dict[str, Any]:
    """An out-of-memory ends as an `oom` record and the next run in the same process still trains."""
    from accelbench.config import RunConfig
    from accelbench.engine.runner import NoProgress, run
    from accelbench.plugins import get_host

    host = get_host()
    steps: list[dict[str, Any]] = []
    for label, values in (
        (
            "gpt2-xl fp32 batch 1024 (needs far more than the GPU has)",
            dict(model="gpt2-xl", precision="fp32", batch_size=1024),
        ),
        (
            "gpt-mini bf16-mixed batch 64, same process, after the OOM",
            dict(model="gpt-mini", precision="bf16-mixed", batch_size=64),
        ),
    ):
        config = RunConfig(backend="cuda", epochs=2, steps_per_epoch=5, output_dir=results, **values)
        start = time.perf_counter()
        record, path, status = run(config, host, NoProgress())
        row = {
            "label": label,
            "status": status,
            "record": str(path),
            "seconds": time.perf_counter() - start,
            "message": record.outcome.message,
            "allocated_after": torch.cuda.memory_allocated(),
            "reserved_after": torch.cuda.memory_reserved(),
        }
        steps.append(row)
        print(
            f"oom check: {label}: {status} ({(record.outcome.message or '')[:160]}); allocated after "
            f"{row['allocated_after']} bytes"
        )
    return {"oom": steps}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("what", choices=["detect", "ceilings", "runs", "oom"])
    parser.add_argument("out", type=Path)
    parser.add_argument("results", type=Path, nargs="?", default=Path("results"))
    parser.add_argument(
        "--ceilings", type=Path, help="ceilings JSON from `ceilings`, for MFU vs measured rate"
    )
    parser.add_argument("--steps", type=int, default=30, help="steps per epoch of the `runs` checks")
    args = parser.parse_args(argv)
    if args.what == "detect":
        result = cmd_detect(args.out)
    elif args.what == "ceilings":
        result = cmd_ceilings(args.out)
    elif args.what == "runs":
        ceilings = json.loads(args.ceilings.read_text()) if args.ceilings and args.ceilings.exists() else None
        result = cmd_runs(args.out, args.results, ceilings, args.steps)
    else:
        result = cmd_oom(args.out, args.results)
    args.out.write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
