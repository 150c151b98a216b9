"""Dense peak figures per Gaudi generation, from Intel's datasheets and white papers.

The matrix engines (MME) give the headline rates, dense (Gaudi has no structured-sparsity mode, so no figure here is
a sparse one). A figure the sources do not state (FP32 and FP16 on every generation, anything for the first
generation) is absent: MFU is then unknown for that math, never another generation's or another math's. No
generation has FP4 math. The plugin offers no FP8 precision yet: the FP8 figures serve ``peaks_by_math``.
"""

from __future__ import annotations

from dataclasses import dataclass

from accelbench.contract import DeviceInfo, PeakFigures, PrecisionPlan

TB = 1e12
# Bumped whenever a figure changes, and recorded with every peak read from the table (PeakFigures.table_version)
TABLE_VERSION = "2026.11-1"
# What the table's dtype keys are called where maths are named across plugins (peaks_by_math)
_MATH_NAMES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float8": "fp8"}


@dataclass(frozen=True)
class Generation:
    label: str
    aliases: tuple[str, ...]
    match: tuple[str, ...]  # substrings of the name hlml reports ("HL-225", "HL-325L")
    memory_bytes: int
    bandwidth: float  # bytes/s
    flops: dict[str, float]  # math -> dense FLOP/s
    source: str
    fp16: bool  # runs fp16 natively


GENERATIONS = (
    Generation(
        label="Gaudi 3 (HL-325L OAM)",
        aliases=("Gaudi3", "Gaudi 3", "HL-325L", "HL-325"),
        match=("HL-325", "HL-338", "GAUDI3", "GAUDI 3"),
        memory_bytes=128 * 10**9,
        bandwidth=3.67 * TB,
        flops={"bfloat16": 1835 * TB, "float8": 1835 * TB},
        # Intel Gaudi 3 AI Accelerator white paper (https://www.intel.com/content/www/us/en/content-details/817486/
        # intel-gaudi-3-ai-accelerator-white-paper.html) and Hot Chips 2024: MME BF16 and FP8 1835 TFLOP/s each
        source="Intel, Gaudi 3 (Hot Chips 2024): MME dense BF16 and FP8 1835 TFLOP/s, HBM2e 3.67 TB/s",
        fp16=True,
    ),
    Generation(
        label="Gaudi 2 (HL-225)",
        aliases=("Gaudi2", "Gaudi 2", "HL-225"),
        match=("HL-225", "GAUDI2", "GAUDI 2"),
        memory_bytes=96 * 10**9,
        bandwidth=2.46 * TB,
        # The same white paper's Gaudi 2 column: MME BF16 432, FP8 865 TFLOP/s (FP8 runs at twice BF16 on Gaudi 2)
        flops={"bfloat16": 432 * TB, "float8": 865 * TB},
        source="Intel, Gaudi 2 (Gaudi 3 white paper comparison, Hot Chips 2024): MME dense BF16 432, FP8 865 "
        "TFLOP/s, HBM2e 2.46 TB/s",
        fp16=True,
    ),
    Generation(
        label="Gaudi (HL-205)",
        aliases=("Gaudi", "Gaudi 1", "HL-205"),
        match=("HL-205", "GAUDI1", "GAUDI 1"),
        memory_bytes=32 * 10**9,
        bandwidth=1.0 * TB,
        flops={},  # the first generation's sources state no dense MME rate per math: unknown
        source="Habana Gaudi (HL-205) datasheet",
        fp16=False,
    ),
)


def generation_of(name: str) -> Generation | None:
    """The generation a device name (as hlml or hl-smi reports it) belongs to, or None."""
    upper = name.upper()
    return next((g for g in GENERATIONS if any(m in upper for m in g.match)), None)


def _math(precision: PrecisionPlan) -> str:
    return precision.autocast_dtype or precision.param_dtype


def peaks_by_math(name: str) -> dict[str, float]:
    """Every dense peak the table has for a device called ``name``, by math (bf16, fp8): what a run mixing maths
    weighs by its FLOPs (:func:`accelbench.engine.metrics.flop_weighted_peak`). Empty for an unknown device."""
    generation = generation_of(name)
    if generation is None:
        return {}
    return {_MATH_NAMES[dtype]: flops for dtype, flops in generation.flops.items()}


def peak_for(name: str, precision: PrecisionPlan) -> PeakFigures | None:
    """Dense peak FLOP/s of the math ``precision`` runs on a device called ``name``; None where unknown, and for
    an FP8 plan (this plugin converts no linear to FP8: a bf16 figure would not be the math that ran)."""
    generation = generation_of(name)
    if generation is None or precision.fp8_recipe is not None:
        return None
    flops = generation.flops.get(_math(precision))
    if flops is None:
        return None
    return PeakFigures(
        flops_per_s=flops,
        memory_bandwidth_bytes_per_s=generation.bandwidth,
        source=f"vendor table: {generation.label}, {_math(precision)}; {generation.source}",
        table_version=TABLE_VERSION,
    )


def known_devices() -> list[DeviceInfo]:
    """Each generation as detection would report it, for ``accelbench estimate --device NAME``."""
    return [
        DeviceInfo(
            index=0,
            name=g.match[0],
            arch=g.label.split(" (")[0],
            memory_bytes=g.memory_bytes,
            details={"label": g.label, "aliases": ",".join(g.aliases)},
        )
        for g in GENERATIONS
    ]
