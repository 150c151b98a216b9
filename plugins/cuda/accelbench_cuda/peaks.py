"""Dense peak FLOP/s and memory bandwidth of NVIDIA data-centre GPUs, from NVIDIA's datasheets.

Keyed by the exact name NVML and torch report, so a variant the table does not know (a MIG slice, an NVL or
power-capped part) gets no figure rather than a neighbour's: MFU is then "unknown" unless the user passes
``--peak-tflops``. Figures are dense: NVIDIA's headline "with sparsity" numbers are twice these.
"""

from __future__ import annotations

from dataclasses import dataclass

from accelbench.contract import DeviceInfo, PeakFigures, PrecisionPlan

T = 1e12
# Bumped whenever a figure changes, and recorded with every peak read from the table (PeakFigures.table_version)
TABLE_VERSION = "2026.11-1"


@dataclass(frozen=True)
class GpuPeaks:
    """One product's dense peaks in FLOP/s (None where the GPU has no such math) and bandwidth in bytes/s."""

    label: str
    names: frozenset[str]
    bf16: float | None
    fp16: float | None
    tf32: float | None
    fp32: float
    bandwidth: float
    fp8: float | None = None  # dense FP8 tensor-core FLOP/s (Hopper on); None where the GPU has no FP8 math


def _key(name: str) -> str:
    return " ".join(name.casefold().split())


def _names(*names: str) -> frozenset[str]:
    return frozenset(_key(name) for name in names)


TABLE: tuple[GpuPeaks, ...] = (
    GpuPeaks(
        "V100 SXM2",
        _names("Tesla V100-SXM2-16GB", "Tesla V100-SXM2-32GB"),
        None,
        125 * T,
        None,
        15.7 * T,
        900e9,
    ),
    GpuPeaks("A100 SXM4 40GB", _names("NVIDIA A100-SXM4-40GB"), 312 * T, 312 * T, 156 * T, 19.5 * T, 1555e9),
    GpuPeaks("A100 SXM4 80GB", _names("NVIDIA A100-SXM4-80GB"), 312 * T, 312 * T, 156 * T, 19.5 * T, 2039e9),
    GpuPeaks("A100 PCIe 40GB", _names("NVIDIA A100-PCIE-40GB"), 312 * T, 312 * T, 156 * T, 19.5 * T, 1555e9),
    GpuPeaks("A100 PCIe 80GB", _names("NVIDIA A100 80GB PCIe"), 312 * T, 312 * T, 156 * T, 19.5 * T, 1935e9),
    GpuPeaks(
        "H100 SXM5", _names("NVIDIA H100 80GB HBM3"), 989 * T, 989 * T, 495 * T, 67 * T, 3.35e12, 1979 * T
    ),
    GpuPeaks("H100 PCIe", _names("NVIDIA H100 PCIe"), 756 * T, 756 * T, 378 * T, 51 * T, 2.0e12, 1513 * T),
    GpuPeaks("H200 SXM", _names("NVIDIA H200"), 989 * T, 989 * T, 495 * T, 67 * T, 4.8e12, 1979 * T),
)


GIB = 2**30

# What `accelbench estimate --device NAME` offers: each name as NVML reports it, its datasheet memory (NVIDIA's "80GB"
# is 80 GiB of HBM; the runtime reports ~1% less, the driver's reserve), its architecture and the short names accepted.
CATALOG: tuple[tuple[str, int, str, tuple[str, ...]], ...] = (
    ("Tesla V100-SXM2-16GB", 16, "sm_70", ("V100-16GB", "V100 SXM2 16GB")),
    ("Tesla V100-SXM2-32GB", 32, "sm_70", ("V100", "V100-32GB", "V100 SXM2")),
    ("NVIDIA A100-SXM4-40GB", 40, "sm_80", ("A100-40GB", "A100 SXM4 40GB")),
    ("NVIDIA A100-SXM4-80GB", 80, "sm_80", ("A100", "A100-80GB", "A100 SXM4", "A100 SXM")),
    ("NVIDIA A100-PCIE-40GB", 40, "sm_80", ("A100 PCIe 40GB",)),
    ("NVIDIA A100 80GB PCIe", 80, "sm_80", ("A100 PCIe", "A100 PCIe 80GB")),
    ("NVIDIA H100 80GB HBM3", 80, "sm_90", ("H100", "H100 SXM", "H100 SXM5")),
    ("NVIDIA H100 PCIe", 80, "sm_90", ("H100 PCIe",)),
    ("NVIDIA H200", 141, "sm_90", ("H200", "H200 SXM")),
)


def known_devices() -> list[DeviceInfo]:
    """The catalogue as detection would report each GPU (``accelbench_known_devices``)."""
    out = []
    for index, (name, gib, arch, aliases) in enumerate(CATALOG):
        entry = lookup(name)
        label = entry.label if entry is not None else name
        details = {"label": label, "aliases": ",".join(aliases), "memory_source": "NVIDIA datasheet"}
        out.append(DeviceInfo(index=index, name=name, arch=arch, memory_bytes=gib * GIB, details=details))
    return out


def lookup(device_name: str) -> GpuPeaks | None:
    """The table entry for a device name as NVML or torch reports it, or None."""
    key = _key(device_name)
    return next((entry for entry in TABLE if key in entry.names), None)


def peaks_by_math(device_name: str) -> dict[str, float]:
    """Every dense peak the table has for a device, by math (fp32, tf32, bf16, fp16, fp8): what a run mixing maths
    weighs by its FLOPs (:func:`accelbench.engine.metrics.flop_weighted_peak`). Empty for an unknown device."""
    entry = lookup(device_name)
    if entry is None:
        return {}
    maths = {"fp32": entry.fp32, "tf32": entry.tf32, "bf16": entry.bf16, "fp16": entry.fp16, "fp8": entry.fp8}
    return {math: flops for math, flops in maths.items() if flops is not None}


def peak_for(
    device_name: str, plan: PrecisionPlan, details: dict[str, str] | None = None
) -> PeakFigures | None:
    """The peak for the math ``plan`` really uses: bf16 or fp16 tensor cores for 16-bit plans, TF32 when the plan
    records TF32 matmuls, IEEE fp32 otherwise. None when the device or that math is not in the table: never another
    device's figure. ``details`` (detection's) give the conditions recorded beside it: the enforced power limit and
    the maximum SM clock NVML reports."""
    entry = lookup(device_name)
    if entry is None:
        return None
    sixteen = plan.autocast_dtype or (plan.param_dtype if plan.param_dtype != "float32" else None)
    if sixteen == "bfloat16":
        flops, math = entry.bf16, "dense bf16 tensor"
    elif sixteen == "float16":
        flops, math = entry.fp16, "dense fp16 tensor"
    elif plan.matmul_math == "tf32":
        flops, math = entry.tf32, "dense tf32 tensor"
    else:
        flops, math = entry.fp32, "fp32"
    if flops is None:
        return None
    return PeakFigures(
        flops_per_s=flops,
        memory_bandwidth_bytes_per_s=entry.bandwidth,
        source=f"accelbench-cuda table: {entry.label}, {math}",
        table_version=TABLE_VERSION,
        conditions={
            key: value
            for key, value in (details or {}).items()
            if key in ("power_limit_w", "max_sm_clock_mhz")
        },
    )
