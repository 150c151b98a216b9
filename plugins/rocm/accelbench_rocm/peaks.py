"""Dense peak FLOP/s and bandwidth of AMD Instinct GPUs, per device as HIP counts them (per GCD on an MI250X).

Matched on the gfx architecture and the compute-unit count, which tell an MI250X GCD (110 CUs) from an MI250 GCD
(104) where the reported name ("AMD Instinct MI250X/MI250") cannot, and which a partitioned MI300X (38 CUs per
XCD) does not match, so a partition gets no whole-GPU figure. When the name carries a model number it must agree,
so an MI325X (also gfx942 with 304 CUs, but more bandwidth) is not taken for an MI300X; a name without one is
told apart by its memory (192 against 256 GiB), and an MI355X must be named (an MI350X has its architecture, CUs
and memory at a lower clock). fp32 figures are the
matrix-core figures, which is what fp32 matmuls use. FP8 and FP4 are the dense matrix figures (AMD's "with
structured sparsity" figures are twice these) where the GPU has that math (FP8 from CDNA 3, FP4 from CDNA 4). An FP8
run's peak weighs the FP8 and BF16 figures by the FLOPs each math did (the converted linears' share), as the CUDA
plugin's does. The FP8 figure is the same for the FNUZ formats CDNA 3 runs and the OCP formats of CDNA 4.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from accelbench.contract import DeviceInfo, PeakFigures, PrecisionPlan
from accelbench_rocm.precision import base_arch

T = 1e12
# Bumped whenever a figure changes, and recorded with every peak read from the table (PeakFigures.table_version)
TABLE_VERSION = "2026.11-1"
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
    fp8: float | None = None  # dense FP8 matrix FLOP/s (CDNA 3 on); None where the GPU has no FP8 math
    fp4: float | None = None  # dense MXFP4 matrix FLOP/s (CDNA 4 on); None where the GPU has no FP4 math
    memory_gib: int | None = (
        None  # datasheet memory, which tells apart unnamed parts of one architecture and CUs
    )
    name_required: bool = False  # a sibling outside the table shares architecture, CUs and memory


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
    # AMD Instinct MI300X data sheet (https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/data-sheets/
    # amd-instinct-mi300x-data-sheet.pdf): FP16/BF16 1307.4, FP8 2614.9 TFLOPS dense (2614.9 / 5229.8 with sparsity)
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
        fp8=2614.9 * T,
        memory_gib=192,
    ),
    # AMD Instinct MI325X data sheet (https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/data-sheets/
    # amd-instinct-mi325x-datasheet.pdf): the MI300X's compute (304 CUs, 2100 MHz), HBM3E at 6 TB/s
    GpuPeaks(
        "MI325X (SPX: the whole GPU)",
        "gfx942",
        304,
        ("mi325x",),
        1307.4 * T,
        1307.4 * T,
        163.4 * T,
        6.0e12,
        "GPU (MI325X in SPX mode)",
        fp8=2614.9 * T,
        memory_gib=256,
    ),
    # AMD Instinct MI355X data sheet and the CDNA 4 white paper (https://www.amd.com/content/dam/amd/en/documents/
    # instinct-tech-docs/white-papers/amd-cdna-4-architecture-whitepaper.pdf): 256 CUs at 2400 MHz; per CU and clock
    # 4096 FP16/BF16, 8192 FP8 and 16384 MXFP4 dense matrix FLOPs, 256 FP32: 2516.6, 5033.2, 10066.3 and 157.3 TFLOPS
    # (the "with sparsity" FP16/FP8 figures are twice these); HBM3E 8 TB/s
    GpuPeaks(
        "MI355X (SPX: the whole GPU)",
        "gfx950",
        256,
        ("mi355x",),
        2516.6 * T,
        2516.6 * T,
        157.3 * T,
        8.0e12,
        "GPU (MI355X in SPX mode)",
        fp8=5033.2 * T,
        fp4=10066.3 * T,
        memory_gib=288,
        name_required=True,
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
    ("AMD Instinct MI325X", "gfx942", 304, 256, ("MI325X",)),
    ("AMD Instinct MI355X", "gfx950", 256, 288, ("MI355X",)),
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


def lookup(
    name: str, arch: str, compute_units: int | None, memory_bytes: int | None = None
) -> GpuPeaks | None:
    """The table entry for a device, or None when the table does not know it for certain."""
    if compute_units is None:
        return None
    lowered = name.lower()
    named = _MODEL.search(lowered) is not None
    candidates = [
        entry
        for entry in TABLE
        if entry.arch == base_arch(arch)
        and entry.compute_units == compute_units
        and (not named or any(model in lowered for model in entry.models))
        and (named or not entry.name_required)
    ]
    if named or len(candidates) <= 1:
        return candidates[0] if candidates else None
    if memory_bytes is None:  # an unnamed device several products match: no figure rather than a sibling's
        return None
    gib = memory_bytes / 2**30
    fits = [
        e for e in candidates if e.memory_gib is not None and abs(gib - e.memory_gib) <= 0.05 * e.memory_gib
    ]
    return fits[0] if len(fits) == 1 else None


def lookup_device(device: DeviceInfo) -> GpuPeaks | None:
    units = device.details.get("compute_units")
    return lookup(
        device.name, device.arch or "", int(units) if units and units.isdigit() else None, device.memory_bytes
    )


def peaks_by_math(device: DeviceInfo) -> dict[str, float]:
    """Every dense peak the table has for a device, by math (fp32, bf16, fp16, fp8, fp4): what a run mixing maths
    weighs by its FLOPs (:func:`accelbench.engine.metrics.flop_weighted_peak`). Empty for a device the table does
    not know for certain: never a neighbour's figures."""
    entry = lookup_device(device)
    if entry is None:
        return {}
    maths = {"fp32": entry.fp32, "bf16": entry.bf16, "fp16": entry.fp16, "fp8": entry.fp8, "fp4": entry.fp4}
    return {math: flops for math, flops in maths.items() if flops is not None}


def peak_for(device: DeviceInfo, plan: PrecisionPlan) -> PeakFigures | None:
    """The dense peak of the math ``plan`` runs; None for a device the table does not know. An FP8 plan's peak is
    the FP8 and BF16 peaks weighed by the FLOPs each ran (:func:`_fp8_weighted`): None before the model's linears
    are converted, and where the table lacks FP8 (never the BF16 figure alone, under which MFU would read high)."""
    entry = lookup_device(device)
    if entry is None:
        return None
    if plan.fp8_recipe is not None:
        weighted, math = _fp8_weighted(entry, plan)
        if weighted is None:
            return None
        return PeakFigures(
            flops_per_s=weighted,
            memory_bandwidth_bytes_per_s=entry.bandwidth,
            source=f"accelbench-rocm table: {entry.label}, {math}",
            table_version=TABLE_VERSION,
        )
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
        table_version=TABLE_VERSION,
    )


def _fp8_weighted(entry: GpuPeaks, plan: PrecisionPlan) -> tuple[float | None, str]:
    """An FP8 run's peak, 1 / (s / P_fp8 + (1 - s) / P_bf16) with s the converted linears' FLOP share (recorded in
    the plan once the model is converted), and how it was made."""
    from accelbench.engine.metrics import flop_weighted_peak

    if plan.fp8_layers is None or entry.fp8 is None:
        return None, "fp8 before conversion" if plan.fp8_layers is None else "no fp8 peak"
    share = plan.fp8_layers.fp8_flop_share
    flops = flop_weighted_peak({"fp8": share, "bf16": 1.0 - share}, {"fp8": entry.fp8, "bf16": entry.bf16})
    parts = [f"{share:.1%} of FLOPs in dense fp8 matrix at {entry.fp8 / T:.1f} TFLOP/s"]
    if share < 1.0:
        parts.append(f"{1.0 - share:.1%} in dense bf16 matrix at {entry.bf16 / T:.1f} TFLOP/s")
    return flops, "FLOP-weighted " + ", ".join(parts)
