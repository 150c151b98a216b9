"""accelbench hooks for NVIDIA GPUs. Registered as entry point ``cuda`` in the ``accelbench`` group.

Implements what differs from the core's stock-PyTorch defaults: detection (NVML, no CUDA context in the caller),
device binding per local rank with CUDA_VISIBLE_DEVICES respected, NCCL, precisions by compute capability with an
explicit TF32 policy, allocator and NVML memory figures, per-epoch NVML telemetry, peak tables and versions.
Timing uses the core default (``torch.accelerator.synchronize``), which is exactly ``torch.cuda.synchronize``.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch

from accelbench import hookimpl
from accelbench.config import RunOption
from accelbench.devices import BackendInfo, DeviceInfo, MemoryStats, PeakFigures
from accelbench.errors import BackendError
from accelbench.precision import PrecisionPlan
from accelbench_cuda import __version__, detect, nvml, peaks
from accelbench_cuda import precision as precision_rules
from accelbench_cuda.visible import ENV

_windows: dict[int, nvml.EpochWindow] = {}  # device index -> telemetry window of the running epoch


@hookimpl
def accelbench_backend() -> BackendInfo:
    return BackendInfo(
        name="cuda",
        device_type="cuda",
        device_unit="GPU (or the MIG instance CUDA_VISIBLE_DEVICES names)",
        priority=100,
        description="NVIDIA GPUs through CUDA; NVML (extra 'nvml') for detection, device memory and telemetry.",
    )


@hookimpl
def accelbench_detect_devices() -> list[DeviceInfo]:
    return detect.detect_devices()


@hookimpl
def accelbench_runtime_versions() -> dict[str, str]:
    versions = {
        "torch": torch.__version__,
        "cuda_runtime": str(torch.version.cuda),
        "accelbench_cuda": __version__,
    }
    if torch.backends.cudnn.is_available():
        if torch.cuda.is_initialized():
            versions["cudnn"] = str(torch.backends.cudnn.version())
        else:  # asking torch would initialise CUDA here (seen with torch 2.11 on an H200): read the wheel instead
            wheel = _cudnn_wheel_version()
            if wheel:
                versions["cudnn_wheel"] = wheel
    with contextlib.suppress(Exception):  # a build without NCCL: nothing to record
        versions["nccl"] = ".".join(str(part) for part in torch.cuda.nccl.version())
    pynvml = nvml.session()
    if pynvml is not None:
        versions.update(nvml.driver_version(pynvml))
    return versions


@hookimpl
def accelbench_setup_device(device_type: str, local_rank: int) -> torch.device:
    if not torch.cuda.is_available():
        raise BackendError(
            f"CUDA is not available in this process (torch {torch.__version__}, {ENV}="
            f"{os.environ.get(ENV)!r}); check `nvidia-smi` and that torch is a CUDA build"
        )
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise BackendError(
            f"local rank {local_rank} needs GPU {local_rank} but this process sees {count} "
            f"({ENV}={os.environ.get(ENV)!r}); start at most {count} processes per node or widen {ENV}"
        )
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


@hookimpl
def accelbench_collective_backend(device: torch.device) -> str:
    import torch.distributed as dist

    # A CUDA build without NCCL (Windows) still trains over gloo, which carries CUDA tensors: slower, and recorded.
    return "nccl" if dist.is_available() and dist.is_nccl_available() else "gloo"


@hookimpl
def accelbench_supported_precisions(device: torch.device) -> list[str]:
    return precision_rules.supported_precisions(_capability(device))


@hookimpl
def accelbench_run_options() -> list[RunOption]:
    return [
        RunOption(
            name="tf32",
            type="str",
            default="off",
            help="TF32 policy for fp32 matmuls and convolutions on Ampere and newer: on|off "
            f"(overrides {precision_rules.TF32_ENV})",
            backend="cuda",
        )
    ]


@hookimpl
def accelbench_precision_plan(
    precision: str, device: torch.device, options: dict[str, str | int | float | bool]
) -> PrecisionPlan:
    # --tf32 wins over the environment variable; neither given means off
    given = {precision_rules.TF32_ENV: str(options["tf32"])} if "tf32" in options else os.environ
    tf32 = precision_rules.tf32_policy(given)
    precision_rules.apply_tf32(tf32)  # what the plan records is what runs
    return precision_rules.make_plan(precision, _capability(device), tf32)


@hookimpl
def accelbench_reset_peak_memory(device: torch.device) -> bool:
    torch.cuda.reset_peak_memory_stats(device)
    pynvml = nvml.session()
    handle = _nvml_handle(pynvml, device)
    if handle is not None:  # the epoch starts now: snapshot the counters telemetry will difference
        _windows[_index(device)] = nvml.EpochWindow.open(pynvml, handle)
    return True


@hookimpl
def accelbench_memory_stats(device: torch.device) -> MemoryStats:
    pynvml = nvml.session()
    handle = _nvml_handle(pynvml, device)
    return MemoryStats(
        peak_bytes=int(torch.cuda.max_memory_allocated(device)),
        source="torch CUDA caching allocator peak (torch.cuda.max_memory_allocated)",
        peak_reserved_bytes=int(torch.cuda.max_memory_reserved(device)),
        device_used_bytes=nvml.memory_used(pynvml, handle) if handle is not None else None,
        total_bytes=int(torch.cuda.get_device_properties(device).total_memory),
    )


@hookimpl
def accelbench_device_telemetry(device: torch.device) -> dict[str, float] | None:
    pynvml = nvml.session()
    window = _windows.pop(_index(device), None)
    if pynvml is None or window is None:
        return None
    return window.close(pynvml)


@hookimpl
def accelbench_peak_figures(device: DeviceInfo, precision: PrecisionPlan) -> PeakFigures | None:
    return peaks.peak_for(device.name, precision)


def _cudnn_wheel_version() -> str | None:
    """The version of the nvidia-cudnn-cuXX wheel torch loads cuDNN from, or None (a system cuDNN)."""
    from importlib.metadata import distributions

    for dist in distributions():
        if (dist.metadata["Name"] or "").lower().startswith("nvidia-cudnn-cu"):
            return dist.version
    return None


def _capability(device: torch.device) -> tuple[int, int]:
    """The compute capability of ``device``. Asked with an index-less device before CUDA is initialised (the
    launcher checks precisions before starting workers), it is the lowest over the visible GPUs, read through
    detection so that the launcher creates no CUDA context of its own."""
    if device.index is not None or torch.cuda.is_initialized():
        return tuple(torch.cuda.get_device_capability(device))  # type: ignore[return-value]
    known = [
        d.details["compute_capability"] for d in detect.detect_devices() if "compute_capability" in d.details
    ]
    if not known:
        raise BackendError(
            "no CUDA device is visible to ask for its compute capability (see `accelbench info`)"
        )
    return min(tuple(int(part) for part in value.split(".")) for value in known)  # type: ignore[return-value]


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _nvml_handle(pynvml: Any, device: torch.device) -> Any | None:
    if pynvml is None:
        return None
    uuid = str(getattr(torch.cuda.get_device_properties(device), "uuid", "") or "")
    return nvml.handle_for_uuid(pynvml, uuid) if uuid else None
