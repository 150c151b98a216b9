"""Which AMD GPUs this process may use, without initialising HIP in it.

Order of questions: is this torch a ROCm build (``torch.version.hip``); amdsmi (no HIP context) with the
visible-device variables applied here; otherwise, when the amdgpu kernel driver is present (``/dev/kfd``), HIP
itself in a probe subprocess. One MI250X is two devices (one per GCD), as HIP enumerates it; each device says
what it is in ``details["device_unit"]``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from accelbench.contract import DeviceInfo
from accelbench.devices import refuse_torch_build, torch_build
from accelbench_rocm import peaks, probe, smi
from accelbench_rocm.precision import base_arch
from accelbench_rocm.visible import visible_gpus

KFD = Path("/dev/kfd")  # the ROCm compute driver's device node


def detect_devices(environ: Mapping[str, str] = os.environ) -> list[DeviceInfo]:
    """The GPUs (GCDs) a run would see, in HIP ordinal order; [] when there are none or no ROCm stack."""
    amdsmi = smi.session()
    built = torch_build()  # read without importing torch: detection stays cheap
    if built is None or built.hip is None:
        gpus = smi.physical_gpus(amdsmi) if amdsmi is not None else []
        if gpus:  # the hardware is there but torch cannot drive it: say why rather than "no device"
            refuse_torch_build(built, f"amdsmi sees {len(gpus)} AMD GPU(s)", "ROCm")
        return []
    if amdsmi is not None:
        visible = visible_gpus(environ, smi.physical_gpus(amdsmi))
        if visible is not None:
            links = smi.xgmi_links(amdsmi, visible)
            return [_from_smi(ordinal, gpu, links[ordinal]) for ordinal, gpu in enumerate(visible)]
    if not driver_present():
        return []
    return [_from_probe(ordinal, row) for ordinal, row in enumerate(probe.run_probe())]


def driver_present() -> bool:
    return not sys.platform.startswith("linux") or KFD.exists()


def _device(
    ordinal: int, name: str, arch: str, units: int | None, memory: int | None, details: dict[str, str]
) -> DeviceInfo:
    if units is not None:
        details["compute_units"] = str(units)
    entry = peaks.lookup(name, arch, units, memory)
    details["device_unit"] = entry.unit if entry else "GPU as HIP enumerates it"
    return DeviceInfo(
        index=ordinal, name=name, arch=base_arch(arch) or None, memory_bytes=memory, details=details
    )


def _from_smi(ordinal: int, gpu: smi.PhysicalGpu, xgmi: dict[int, int]) -> DeviceInfo:
    details = {"bdf": gpu.bdf, "amdsmi_index": str(gpu.index), "detected_by": "amdsmi"}
    if gpu.uuid:
        details["uuid"] = gpu.uuid
    if xgmi:  # its direct xGMI links to the other visible GPUs: `accelbench comm` grades against them
        details["xgmi_links"] = str(sum(xgmi.values()))
        details["xgmi_peers"] = ",".join(f"{peer}:{links}" for peer, links in sorted(xgmi.items()))
    return _device(ordinal, gpu.name, gpu.arch, gpu.compute_units, gpu.memory_bytes, details)


def _from_probe(ordinal: int, row: dict) -> DeviceInfo:
    details = {
        "gcn_arch_name": str(row.get("gcnArchName", "")),
        "detected_by": "HIP in a probe subprocess (amdsmi unavailable)",
    }
    units = row.get("multi_processor_count")
    return _device(
        ordinal, str(row.get("name", "")), str(row.get("gcnArchName", "")), int(units) if units else None,
        int(row["total_memory"]), details,
    )  # fmt: skip
