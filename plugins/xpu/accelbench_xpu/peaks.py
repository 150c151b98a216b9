"""Dense peak FLOP/s and bandwidth of Intel Data Center GPUs, per card or per tile as the device unit says.

Max 1550 (two stacks, 1.6 GHz): bf16/fp16 ~839 TFLOP/s per card, fp32 ~52, 3.28 TB/s; a tile (stack) is half.
Measured figures on real systems are lower (one site measured bf16 273 TFLOP/s): MFU against these peaks says so.
Source: Intel Data Center GPU Max Series product brief (https://www.intel.com/content/www/us/en/products/docs/
processors/max-series/overview.html). The Max Series' XMX engines run no FP8 or FP4 (INT8 at most): those maths have
no figure (None), never a neighbour's; the XMX figures have no sparsity mode.
"""

from __future__ import annotations

from accelbench.contract import DeviceInfo, PeakFigures, PrecisionPlan

T = 1e12
# Bumped whenever a figure changes, and recorded with every peak read from the table (PeakFigures.table_version)
TABLE_VERSION = "2026.11-1"
MAX_1550_CARD: dict[str, float | None] = {
    "bf16": 839 * T,
    "fp16": 839 * T,
    "fp32": 52 * T,
    "fp8": None,  # no FP8 math on the Max Series
    "fp4": None,
    "bandwidth": 3.28e12,
}


GIB = 2**30
MAX_1550 = "Intel(R) Data Center GPU Max 1550"


def known_devices() -> list[DeviceInfo]:
    """What `accelbench estimate --device NAME` offers (``accelbench_known_devices``): a Max 1550 as a whole card
    (COMPOSITE mode, 128 GiB) and as one tile (FLAT mode, the default: 64 GiB), as detection reports them."""
    rows = (
        (
            "card (both stacks of a Max 1550)",
            128,
            "Max 1550, whole card (two stacks)",
            "Max 1550,Max 1550 card,PVC",
        ),
        ("tile (one stack of a Max 1550)", 64, "Max 1550, one tile (stack)", "Max 1550 tile,PVC tile"),
    )
    return [
        DeviceInfo(
            index=index,
            name=MAX_1550,
            memory_bytes=gib * GIB,
            details={
                "device_unit": unit,
                "label": label,
                "aliases": aliases,
                "memory_source": "Intel datasheet",
            },
        )
        for index, (unit, gib, label, aliases) in enumerate(rows)
    ]


def _share(device: DeviceInfo) -> tuple[float, str] | None:
    """A Max 1550 card's share that ``device`` is (a whole card or one tile) and its label; None otherwise."""
    if " ".join(device.name.lower().split()) != "intel(r) data center gpu max 1550":
        return None
    unit = device.details.get("device_unit", "")
    if unit.startswith("tile"):
        return 0.5, "Max 1550, one tile (stack)"
    if unit.startswith("card"):
        return 1.0, "Max 1550, whole card (two stacks)"
    return None  # card or tile unknown: no figure rather than one off by two


def peaks_by_math(device: DeviceInfo) -> dict[str, float]:
    """Every dense peak the table has for ``device``, by math (fp32, bf16, fp16; no fp8 or fp4: the Max Series has
    neither): what a run mixing maths weighs by its FLOPs. Empty for a device the table does not know."""
    known = _share(device)
    if known is None:
        return {}
    share = known[0]
    return {
        math: flops * share
        for math, flops in MAX_1550_CARD.items()
        if math != "bandwidth" and flops is not None
    }


def peak_for(device: DeviceInfo, plan: PrecisionPlan) -> PeakFigures | None:
    """The peak for the math ``plan`` uses on ``device`` (card or tile from ``details["device_unit"]``); None for
    an FP8 plan (no FP8 math on the Max Series)."""
    known = _share(device)
    if known is None or plan.fp8_recipe is not None:
        return None
    share, label = known
    sixteen = plan.autocast_dtype or (plan.param_dtype if plan.param_dtype != "float32" else None)
    kind = {"bfloat16": "bf16", "float16": "fp16"}.get(sixteen or "", "fp32")
    if kind == "fp32" and plan.matmul_math != "ieee-fp32":
        return None  # TF32/BF32 matmul peaks are not in the table
    math = f"dense {kind} XMX" if kind != "fp32" else "fp32"
    flops, bandwidth = MAX_1550_CARD[kind], MAX_1550_CARD["bandwidth"]
    if flops is None or bandwidth is None:
        return None
    return PeakFigures(
        flops_per_s=flops * share,
        memory_bandwidth_bytes_per_s=bandwidth * share,
        source=f"accelbench-xpu table: {label}, {math}",
        table_version=TABLE_VERSION,
    )
