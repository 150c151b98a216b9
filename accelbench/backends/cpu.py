"""The built-in CPU backend. Registered through the ``accelbench`` entry-point group like any vendor plugin.

One device = the CPU cores this process may run on (its affinity mask), with torch's intra-op threads.
Peak memory is the process's resident-set high-water mark (VmHWM), reset before each epoch through
``/proc/self/clear_refs``; CPU tensors have no allocator peak counter in torch.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

import psutil
import torch

from accelbench import hookimpl
from accelbench.devices import BackendInfo, DeviceInfo, MemoryStats
from accelbench.precision import PrecisionPlan, standard_plan

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")
_peak_resettable = False  # set by the last reset: whether VmHWM now measures since that reset


@hookimpl
def accelbench_backend() -> BackendInfo:
    return BackendInfo(
        name="cpu",
        device_type="cpu",
        device_unit="CPU (the cores this process may use)",
        priority=0,
        description="Built-in: trains on the host CPU with torch's intra-op threads.",
    )


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@hookimpl
def accelbench_detect_devices() -> list[DeviceInfo]:
    details = {
        "logical_cores": str(os.cpu_count()),
        "physical_cores": str(psutil.cpu_count(logical=False)),
        "usable_cores": str(usable_cores()),
        "torch_threads": str(torch.get_num_threads()),
    }
    return [
        DeviceInfo(
            index=0,
            name=cpu_model(),
            arch=f"{platform.machine()} {_cpu_capability()}",
            memory_bytes=psutil.virtual_memory().total,
            details=details,
        )
    ]


def _cpu_capability() -> str:
    get = getattr(torch.backends.cpu, "get_cpu_capability", None)  # torch >= 2.1
    return get() if get else "unknown vector ISA"


@hookimpl
def accelbench_runtime_versions() -> dict[str, str]:
    versions = {"python": sys.version.split()[0], "torch": torch.__version__}
    versions["mkldnn"] = str(torch.backends.mkldnn.is_available())
    versions["openmp"] = str(torch.backends.openmp.is_available())
    return versions


@hookimpl
def accelbench_supported_precisions(device: torch.device) -> list[str]:
    # torch's CPU autocast runs bf16 and fp16 regions; fp16 is emulated on most CPUs and slow, but it runs.
    return ["fp32", "bf16-mixed", "bf16-true", "fp16-mixed"]


@hookimpl
def accelbench_precision_plan(precision: str, device: torch.device) -> PrecisionPlan:
    # oneDNN may run fp32 matmuls in bf16 when asked; record the setting that is really in force.
    fp32_mode = getattr(
        getattr(torch.backends.mkldnn, "matmul", None), "fp32_precision", "none"
    )  # torch >= 2.9
    math = "ieee-fp32" if fp32_mode in ("none", "ieee") else f"oneDNN fp32 matmuls as {fp32_mode}"
    return standard_plan(precision, matmul_math=math)


@hookimpl
def accelbench_setup_device(device_type: str, local_rank: int) -> torch.device:
    return torch.device("cpu")


@hookimpl
def accelbench_synchronize(device: torch.device) -> bool:
    return True  # CPU kernels run synchronously with the Python thread


@hookimpl
def accelbench_reset_peak_memory(device: torch.device) -> bool:
    global _peak_resettable
    try:
        _CLEAR_REFS.write_text("5")  # "5" resets the peak RSS (VmHWM) of this process (Linux >= 4.0)
        _peak_resettable = True
    except OSError:  # not Linux, or /proc is read-only: memory_stats then reports the lifetime peak
        _peak_resettable = False
    return True


@hookimpl
def accelbench_memory_stats(device: torch.device) -> MemoryStats:
    total = psutil.virtual_memory().total
    hwm = _read_vmhwm()
    if hwm is not None and _peak_resettable:
        return MemoryStats(
            peak_bytes=hwm, source="host RSS high-water mark (VmHWM, reset per epoch)", total_bytes=total
        )
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
    return MemoryStats(
        peak_bytes=peak * scale,
        source="host RSS peak over the process lifetime (ru_maxrss)",
        total_bytes=total,
    )


def _read_vmhwm() -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
