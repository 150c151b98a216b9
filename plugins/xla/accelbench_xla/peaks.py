"""Dense peak figures per TPU chip (Google Cloud's TPU documentation). XLA's CPU device has none: its MFU is then
against the measured matmul rate, as for any CPU, or unknown.

The listed generations (v4 to v6e) run bf16 (and int8) on their MXUs, no FP8 or FP4: those maths have no figure.
Google's figures carry no sparsity mode. (Ironwood, TPU v7, adds FP8; it is not in the table until its per-chip
dense figures are confirmed.)"""

from __future__ import annotations

from accelbench.contract import DeviceInfo, PeakFigures, PrecisionPlan

TB = 1e12
# Bumped whenever a figure changes, and recorded with every peak read from the table (PeakFigures.table_version)
TABLE_VERSION = "2026.11-1"
# chip generation -> (bf16 dense FLOP/s, HBM bytes/s, HBM bytes, label, aliases)
TPUS: dict[str, tuple[float, float, int, str, tuple[str, ...]]] = {
    "v4": (275 * TB, 1.2 * TB, 32 * 2**30, "TPU v4", ("v4", "TPU v4")),
    "v5e": (197 * TB, 0.819 * TB, 16 * 2**30, "TPU v5e", ("v5e", "v5litepod", "TPU v5e")),
    "v5p": (459 * TB, 2.765 * TB, 95 * 2**30, "TPU v5p", ("v5p", "TPU v5p")),
    "v6e": (918 * TB, 1.64 * TB, 32 * 2**30, "TPU v6e (Trillium)", ("v6e", "Trillium", "TPU v6e")),
}
SOURCE = "Google Cloud TPU documentation (system architecture: peak bf16 compute and HBM bandwidth per chip)"


def generation_of(name: str) -> str | None:
    lowered = name.lower()
    return next((g for g, (*_, aliases) in TPUS.items() if any(a.lower() in lowered for a in aliases)), None)


def peaks_by_math(name: str) -> dict[str, float]:
    """Every dense peak the table has for a chip called ``name``, by math: bf16 only (no FP8 or FP4 on v4-v6e).
    Empty for a device the table does not list."""
    generation = generation_of(name)
    return {} if generation is None else {"bf16": TPUS[generation][0]}


def peak_for(name: str, precision: PrecisionPlan) -> PeakFigures | None:
    """bf16 matmuls' dense peak for a TPU chip; None for fp32 (TPUs run it as multi-pass bf16: no datasheet rate)
    and for any device the table does not list (XLA's CPU device)."""
    generation = generation_of(name)
    if generation is None or "bfloat16" not in (precision.autocast_dtype, precision.param_dtype):
        return None
    if precision.fp8_recipe is not None:  # no FP8 math on these chips
        return None
    flops, bandwidth, *_ = TPUS[generation]
    return PeakFigures(
        flops_per_s=flops,
        memory_bandwidth_bytes_per_s=bandwidth,
        source=f"vendor table: {SOURCE}",
        table_version=TABLE_VERSION,
    )


def known_devices() -> list[DeviceInfo]:
    return [
        DeviceInfo(
            index=0,
            name=label,
            arch=generation,
            memory_bytes=memory,
            details={"label": label, "aliases": ",".join(aliases)},
        )  # fmt: skip
        for generation, (_, _, memory, label, aliases) in TPUS.items()
    ]
