"""accelbench hooks for Intel GPUs. Registered as entry point ``xpu`` in the ``accelbench`` group.

Implements what differs from the core defaults: detection (in a subprocess, card or tile recorded), the software
path (stock torch.xpu + xccl, or IPEX + oneCCL's ccl) chosen and recorded, one device per local rank through
ZE_AFFINITY_MASK, precisions from the device's bf16 support, allocator and Level Zero memory figures, temperature,
the Max 1550 peak table, and versions. Synchronisation and memory go through ``torch.xpu`` directly, which works
on both paths.

Telemetry: torch.xpu's power and utilisation readings measure the 100 ms after the call, and the runner reads
telemetry after the epoch's closing synchronisation, when the GPU is idle; so they are sampled through the epoch by
:class:`~accelbench_xpu.sampler.EpochSampler`, started when the runner resets peak memory, and averaged.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import os
from typing import Any

import torch

from accelbench import hookimpl
from accelbench.devices import BackendInfo, DeviceInfo, MemoryStats, PeakFigures
from accelbench.errors import BackendError, ConfigError
from accelbench.precision import PrecisionPlan, standard_plan
from accelbench_xpu import __version__, detect, level_zero, paths, peaks
from accelbench_xpu.sampler import EpochSampler

TF32_ENV = "ACCELBENCH_TF32"
_pinning: str | None = None  # what setup_device did about ZE_AFFINITY_MASK, for the record
_samplers: dict[int, EpochSampler] = {}  # device index -> the running epoch's power/utilisation sampler


@hookimpl
def accelbench_backend() -> BackendInfo:
    return BackendInfo(
        name="xpu",
        device_type="xpu",
        device_unit="tile (stack) in FLAT mode, card in COMPOSITE mode (ZE_FLAT_DEVICE_HIERARCHY): see each device",
        priority=100,
        description="Intel GPUs: stock torch.xpu + xccl, or Intel Extension for PyTorch + oneCCL (ccl).",
    )


@hookimpl
def accelbench_detect_devices() -> list[DeviceInfo]:
    return detect.detect_devices()


@hookimpl
def accelbench_runtime_versions() -> dict[str, str]:
    path = paths.resolve()
    versions = {"torch": torch.__version__, "xpu_path": path.describe(), "accelbench_xpu": __version__}
    for dist in ("intel-extension-for-pytorch", "oneccl_bind_pt"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[dist] = importlib.metadata.version(dist)
    versions[level_zero.HIERARCHY_ENV] = level_zero.hierarchy(os.environ)
    versions[level_zero.AFFINITY_ENV] = os.environ.get(level_zero.AFFINITY_ENV, "unset")
    if _pinning:
        versions["device_pinning"] = _pinning
    if hasattr(torch, "xpu") and torch.xpu.is_initialized():  # driver version without starting the runtime
        versions["gpu_driver"] = str(getattr(torch.xpu.get_device_properties(), "driver_version", ""))
    return versions


@hookimpl
def accelbench_setup_device(device_type: str, local_rank: int) -> torch.device:
    global _pinning
    path = paths.resolve()
    if path.device is None:
        raise BackendError(
            f"torch {torch.__version__} cannot drive Intel GPUs: install an XPU build of torch "
            "(https://pytorch.org/get-started/locally/) or, on older stacks, intel_extension_for_pytorch"
        )
    started = hasattr(torch, "xpu") and torch.xpu.is_initialized()
    index, _pinning = level_zero.pin_local_rank(os.environ, local_rank, started)  # before the runtime starts
    if path.device == "ipex":
        importlib.import_module(paths.IPEX)  # the legacy path: IPEX provides torch.xpu
    count = torch.xpu.device_count()
    if index >= count:
        raise BackendError(
            f"local rank {local_rank} needs XPU device {index} but this process sees {count} "
            f"({level_zero.AFFINITY_ENV}={os.environ.get(level_zero.AFFINITY_ENV)!r}); start fewer processes per node"
        )
    torch.xpu.set_device(index)
    return torch.device("xpu", index)


@hookimpl
def accelbench_collective_backend(device: torch.device) -> str | None:
    path = paths.resolve()
    if path.collective == "ccl":
        importlib.import_module(paths.ONECCL)  # registers the "ccl" backend with torch.distributed
    # None (neither xccl nor the oneCCL bindings): the core's default answers, and a multi-device run then fails
    # with torch's own message when it creates the process group.
    return path.collective


@hookimpl
def accelbench_supported_precisions(device: torch.device) -> list[str]:
    fp16, bf16 = _half_support(device)
    return ["fp32"] + (["fp16-mixed"] if fp16 else []) + (["bf16-mixed", "bf16-true"] if bf16 else [])


@hookimpl
def accelbench_precision_plan(precision: str, device: torch.device) -> PrecisionPlan:
    if os.environ.get(TF32_ENV, "off").strip().lower() != "off":
        raise ConfigError(
            f"{TF32_ENV}={os.environ[TF32_ENV]!r}: the XPU plugin runs fp32 matmuls in IEEE fp32 only; unset {TF32_ENV}"
        )
    torch.backends.mkldnn.matmul.fp32_precision = "ieee"  # oneDNN's fp32 math, explicit and recorded
    plan = standard_plan(precision, matmul_math="ieee-fp32")
    notes = [plan.notes] if plan.notes else []
    notes.append(f"oneDNN fp32 matmuls in IEEE fp32; {paths.resolve().describe()}")
    return plan.model_copy(update={"notes": "; ".join(notes)})


@hookimpl
def accelbench_synchronize(device: torch.device) -> bool:
    torch.xpu.synchronize(device)
    return True


@hookimpl
def accelbench_reset_peak_memory(device: torch.device) -> bool:
    torch.xpu.reset_peak_memory_stats(device)
    index = _index(device)
    previous = _samplers.pop(index, None)
    if previous is not None:  # an epoch that ended without a telemetry reading
        previous.stop()
    readings = {
        "power_w": lambda: torch.xpu.power_draw(device),
        "utilization_pct": lambda: torch.xpu.utilization(device),
    }
    _samplers[index] = EpochSampler(readings).start()  # the epoch starts now
    return True


@hookimpl
def accelbench_memory_stats(device: torch.device) -> MemoryStats:
    used: int | None = None
    with contextlib.suppress(Exception):  # Level Zero Sysman (pyzes) absent, or no permission: unknown
        used = int(torch.xpu.device_memory_used(device))
    return MemoryStats(
        peak_bytes=int(torch.xpu.max_memory_allocated(device)),
        source="torch XPU caching allocator peak (torch.xpu.max_memory_allocated)",
        peak_reserved_bytes=int(torch.xpu.max_memory_reserved(device)),
        device_used_bytes=used,
        total_bytes=int(torch.xpu.get_device_properties(device).total_memory),
    )


@hookimpl
def accelbench_device_telemetry(device: torch.device) -> dict[str, float] | None:
    sampler = _samplers.pop(_index(device), None)
    readings = sampler.stop() if sampler is not None else {}
    with contextlib.suppress(Exception):  # needs Level Zero Sysman (pyzes), sometimes elevated privileges
        readings["temperature_c"] = float(torch.xpu.temperature(device))
    return readings or None


@hookimpl
def accelbench_peak_figures(device: DeviceInfo, precision: PrecisionPlan) -> PeakFigures | None:
    return peaks.peak_for(device, precision)


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.xpu.current_device()


def _half_support(device: torch.device) -> tuple[bool, bool]:
    """(fp16, native bf16) of ``device``. Asked with an index-less device before the runtime starts (the
    launcher's preflight), it comes from detection, so the launcher starts no Level Zero runtime of its own."""
    if device.index is not None or (hasattr(torch, "xpu") and torch.xpu.is_initialized()):
        props: Any = torch.xpu.get_device_properties(device)
        return bool(getattr(props, "has_fp16", True)), bool(getattr(props, "has_bfloat16_conversions", False))
    devices = detect.detect_devices()
    if not devices:
        raise BackendError("no Intel GPU is visible to ask what it supports (see `accelbench info`)")
    return (
        all(d.details.get("fp16") == "true" for d in devices),
        all(d.details.get("bf16") == "true" for d in devices),
    )
