"""Dense peak FLOP/s and bandwidth of AMD Instinct GPUs, per device as HIP counts them (per GCD on an MI250X).

Matched on the gfx architecture and the compute-unit count, which tell an MI250X GCD (110 CUs) from an MI250 GCD
(104) where the reported name ("AMD Instinct MI250X/MI250") cannot, and which a partitioned MI300X (38 CUs per
XCD) does not match, so a partition gets no whole-GPU figure. When the name carries a model number it must agree,
so an MI325X (also gfx942 with 304 CUs, but more bandwidth) is not taken for an MI300X. fp32 figures are the
matrix-core figures, which is what fp32 matmuls use.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from accelbench.contract import DeviceInfo, PeakFigures, PrecisionPlan
from accelbench_rocm.precision import base_arch

T = 1e12
_MODEL = re.compile(r"\bmi\d{3}")


@dataclass(frozen=True)
class GpuPeaks:
    label: str
    arch: str
    compute_units: int
    models: tuple[str, ...]  # model numbers a reported name may carry
    fp16: float
    bf16: float
    fp32: float
    bandwidth: float
    unit: str  # what one device is, for the record


TABLE: tuple[GpuPeaks, ...] = (
    GpuPeaks("MI100", "gfx908", 120, ("mi100",), 184.6 * T, 92.3 * T, 46.1 * T, 1.23e12, "GPU"),
    GpuPeaks(
        "MI210, or one GCD of an MI250 (the same per-GCD figures)",
        "gfx90a",
        104,
        ("mi210", "mi250"),
        181.0 * T,
        181.0 * T,
        45.3 * T,
        1.6e12,
        "GPU (MI210) or GCD (half an MI250)",
    ),
    GpuPeaks(
        "one GCD of an MI250X",
        "gfx90a",
        110,
        ("mi250x", "mi250"),
        191.5 * T,
        191.5 * T,
        47.9 * T,
        1.6e12,
        "GCD (half an MI250X)",
    ),
    GpuPeaks(
        "MI300X (SPX: the whole GPU)",
        "gfx942",
        304,
        ("mi300x",),
        1307.4 * T,
        1307.4 * T,
        163.4 * T,
        5.3e12,
        "GPU (MI300X in SPX mode)",
    ),
)


GIB = 2**30

# What `accelbench estimate --device NAME` offers, one device as HIP counts it (a GCD of an MI250/MI250X): the name
# and architecture detection reports, compute units, datasheet memory of that device, and the short names accepted.
CATALOG: tuple[tuple[str, str, int, int, tuple[str, ...]], ...] = (
    ("AMD Instinct MI100", "gfx908", 120, 32, ("MI100",)),
    ("AMD Instinct MI210", "gfx90a", 104, 64, ("MI210",)),
    ("AMD Instinct MI250", "gfx90a", 104, 64, ("MI250", "MI250 GCD")),
    ("AMD Instinct MI250X", "gfx90a", 110, 64, ("MI250X", "MI250X GCD")),
    ("AMD Instinct MI300X", "gfx942", 304, 192, ("MI300X",)),
)


def known_devices() -> list[DeviceInfo]:
    """The catalogue as detection would report each device (``accelbench_known_devices``)."""
    out = []
    for index, (name, arch, units, gib, aliases) in enumerate(CATALOG):
        entry = lookup(name, arch, units)
        details = {
            "compute_units": str(units),
            "label": f"{aliases[0]}: {entry.unit}" if entry is not None else name,
            "aliases": ",".join(aliases),
            "memory_source": "AMD datasheet (per device as HIP counts them)",
        }
        out.append(DeviceInfo(index=index, name=name, arch=arch, memory_bytes=gib * GIB, details=details))
    return out


def lookup(name: str, arch: str, compute_units: int | None) -> GpuPeaks | None:
    """The table entry for a device, or None when the table does not know it for certain."""
    if compute_units is None:
        return None
    lowered = name.lower()
    for entry in TABLE:
        if entry.arch != base_arch(arch) or entry.compute_units != compute_units:
            continue
        if _MODEL.search(lowered) and not any(model in lowered for model in entry.models):
            continue
        return entry
    return None


def lookup_device(device: DeviceInfo) -> GpuPeaks | None:
    units = device.details.get("compute_units")
    return lookup(device.name, device.arch or "", int(units) if units and units.isdigit() else None)


def peak_for(device: DeviceInfo, plan: PrecisionPlan) -> PeakFigures | None:
    entry = lookup_device(device)
    if entry is None:
        return None
    sixteen = plan.autocast_dtype or (plan.param_dtype if plan.param_dtype != "float32" else None)
    if sixteen == "bfloat16":
        flops, math = entry.bf16, "dense bf16 matrix"
    elif sixteen == "float16":
        flops, math = entry.fp16, "dense fp16 matrix"
    else:
        flops, math = entry.fp32, "fp32 matrix"
    return PeakFigures(
        flops_per_s=flops,
        memory_bandwidth_bytes_per_s=entry.bandwidth,
        source=f"accelbench-rocm table: {entry.label}, {math}",
    )
