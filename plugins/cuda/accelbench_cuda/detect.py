"""Which NVIDIA GPUs this process may use, without initialising CUDA in it.

Order of questions: is this torch build a CUDA build at all; NVML (fast, no CUDA context) with
CUDA_VISIBLE_DEVICES applied here; otherwise, when the NVIDIA driver is present, CUDA itself in a probe subprocess.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from accelbench.contract import DeviceInfo
from accelbench.devices import refuse_torch_build, torch_build
from accelbench_cuda import nvml, probe
from accelbench_cuda.visible import ENV, PhysicalGpu, visible_gpus

# Paths whose presence means an NVIDIA driver is loaded (Linux; /dev/dxg is WSL's GPU bridge).
DRIVER_PATHS = (Path("/proc/driver/nvidia"), Path("/dev/nvidiactl"), Path("/dev/dxg"))


def detect_devices(environ: Mapping[str, str] = os.environ) -> list[DeviceInfo]:
    """The GPUs a run would see, in CUDA ordinal order; [] when there are none or no NVIDIA stack at all."""
    # Should anything in this process ask torch.cuda whether CUDA is available, let torch ask NVML, not the driver.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    pynvml = nvml.session()
    built = torch_build()  # read without importing torch: detection stays cheap
    if built is None or built.cuda is None:
        gpus = nvml.physical_gpus(pynvml) if pynvml is not None else []
        if gpus:  # the hardware is there but torch cannot drive it: say why rather than "no device"
            refuse_torch_build(built, f"NVML sees {len(gpus)} NVIDIA GPU(s)", "CUDA")
        return []
    if pynvml is not None:
        visible = visible_gpus(environ.get(ENV), nvml.physical_gpus(pynvml))
        if visible is not None:
            return [_from_nvml(ordinal, gpu) for ordinal, gpu in enumerate(visible)]
    if not driver_present():
        return []
    return [_from_probe(ordinal, row) for ordinal, row in enumerate(probe.run_probe())]


def driver_present() -> bool:
    """Whether an NVIDIA driver is loaded (always assumed off Linux, where there is no cheap test)."""
    if not sys.platform.startswith("linux"):
        return True
    return any(path.exists() for path in DRIVER_PATHS)


def _from_nvml(ordinal: int, gpu: PhysicalGpu) -> DeviceInfo:
    details = {"uuid": gpu.uuid, "nvml_index": str(gpu.index), "detected_by": "NVML"}
    if gpu.capability:
        details["compute_capability"] = f"{gpu.capability[0]}.{gpu.capability[1]}"
    if gpu.pci_bus_id:
        details["pci_bus_id"] = gpu.pci_bus_id
    if gpu.power_limit_w is not None:
        details["power_limit_w"] = f"{gpu.power_limit_w:g}"
    if gpu.max_sm_clock_mhz is not None:
        details["max_sm_clock_mhz"] = f"{gpu.max_sm_clock_mhz:g}"
    details.update(gpu.links)  # nvlink_links, nvlink_version, pcie_generation, pcie_width
    return DeviceInfo(
        index=ordinal,
        name=gpu.name,
        arch=f"sm_{gpu.capability[0]}{gpu.capability[1]}" if gpu.capability else None,
        memory_bytes=gpu.memory_bytes,
        details=details,
    )


def _from_probe(ordinal: int, row: dict) -> DeviceInfo:
    details = {
        "compute_capability": f"{row['major']}.{row['minor']}",
        "multiprocessors": str(row.get("multi_processor_count", "")),
        "detected_by": "CUDA in a probe subprocess (NVML unavailable)",
    }
    if row.get("uuid"):
        details["uuid"] = str(row["uuid"])
    return DeviceInfo(
        index=ordinal,
        name=str(row["name"]),
        arch=f"sm_{row['major']}{row['minor']}",
        memory_bytes=int(row["total_memory"]),
        details=details,
    )
