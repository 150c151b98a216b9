"""What an IPU is, and its vendor peak figures (per IPU, dense).

GC200 (Colossus Mk2, IPU-M2000 / IPU-POD16): 1472 tiles of 624 KiB In-Processor-Memory (~900 MB), 250 TFLOP/s
FP16.16 and 62.5 TFLOP/s FP32 (an M2000's 1 PFLOP/s FP16.16 and 250 TFLOP/s FP32 over its four IPUs),
47.5 TB/s In-Processor-Memory bandwidth. Bow IPU (Bow-2000): the same die with a higher clock, 350 TFLOP/s
FP16.16 and 87.5 FP32 (a Bow-2000's 1.4 PFLOP/s and 350 TFLOP/s over four IPUs), 65 TB/s.
Graphcore publishes no separate FP16.32 figure, so FP16.32 runs get no table peak (MFU unknown unless
``--peak-tflops`` is given): an unknown figure stays unknown. The Mk2 IPUs have no FP8 or FP4 arithmetic
(Graphcore's FP8 came with the C600 card, not in this table): those maths have no figure, and no figure is sparse.
"""

from __future__ import annotations

from dataclasses import dataclass

from accelbench.contract import DeviceInfo, PeakFigures, PrecisionPlan
from accelbench_ipu.precision import amp_mode

TILES_MK2 = 1472
BYTES_PER_TILE_MK2 = 624 * 1024
IN_PROCESSOR_MEMORY_MK2 = TILES_MK2 * BYTES_PER_TILE_MK2  # 940,572,672 bytes ("900 MB")
# Bumped whenever a figure changes, and recorded with every peak read from the table (PeakFigures.table_version)
TABLE_VERSION = "2026.11-1"
# AMP modes by the math names used across plugins (peaks_by_math)
_MATH_NAMES = {"FP16.16": "fp16", "FP32.32": "fp32"}


@dataclass(frozen=True)
class IpuPart:
    key: str
    name: str
    flops: dict[str, float]  # AMP mode -> dense FLOP/s per IPU
    bandwidth: float  # In-Processor-Memory bytes/s per IPU
    source: str


PARTS: dict[str, IpuPart] = {
    "gc200": IpuPart(
        "gc200",
        "Graphcore GC200 IPU (Mk2)",
        {"FP16.16": 250e12, "FP32.32": 62.5e12},
        47.5e12,
        "vendor table: GC200 per IPU (IPU-M2000: 1 PFLOP/s FP16.16, 250 TFLOP/s FP32 over 4 IPUs)",
    ),
    "bow": IpuPart(
        "bow",
        "Graphcore Bow IPU",
        {"FP16.16": 350e12, "FP32.32": 87.5e12},
        65e12,
        "vendor table: Bow IPU (Bow-2000: 1.4 PFLOP/s FP16.16, 350 TFLOP/s FP32 over 4 IPUs)",
    ),
}


def known_devices() -> list[DeviceInfo]:
    """What `accelbench estimate --device NAME` offers (``accelbench_known_devices``): one IPU of each Mk2 part, as
    detection reports it, with its In-Processor-Memory (the memory a model must fit, streaming memory aside)."""
    aliases = {"gc200": "GC200,IPU-M2000,Mk2", "bow": "Bow,Bow-2000,Bow IPU"}
    return [
        DeviceInfo(
            index=index,
            name=part.name,
            arch="ipu2",
            memory_bytes=IN_PROCESSOR_MEMORY_MK2,
            details={
                "part": key,
                "label": part.name,
                "aliases": aliases[key],
                "memory_source": "In-Processor-Memory: 1472 tiles x 624 KiB",
            },
        )
        for index, (key, part) in enumerate(PARTS.items())
    ]


def peaks_by_math(device: DeviceInfo) -> dict[str, float]:
    """Every dense peak the table has for this IPU, by math (fp16 for FP16.16, fp32; no fp8 or fp4 on Mk2). Empty
    for an unknown part."""
    part = PARTS.get(device.details.get("part", ""))
    return {} if part is None else {_MATH_NAMES[amp]: flops for amp, flops in part.flops.items()}


def peak_figures(device: DeviceInfo, plan: PrecisionPlan) -> PeakFigures | None:
    """The table's peak for this IPU and AMP mode, or None (unknown part, FP16.32, emulator)."""
    part = PARTS.get(device.details.get("part", ""))
    amp = amp_mode(plan)
    if part is None or amp is None or amp not in part.flops:
        return None
    return PeakFigures(
        flops_per_s=part.flops[amp],
        memory_bandwidth_bytes_per_s=part.bandwidth,
        source=f"{part.source}; {amp}",
        table_version=TABLE_VERSION,
    )
