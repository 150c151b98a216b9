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
TABLE_VERSION = "2026.11-2"  # -2: FP4 column, B200 and GB200 rows


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
    fp4: float | None = (
        None  # dense FP4 tensor-core FLOP/s (Blackwell on); None where the GPU has no FP4 math
    )


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
    # NVIDIA Blackwell datasheet (HGX B200 at 1,000 W; GB200 NVL72 at 1,200 W), per GPU, the dense column (the
    # sparse figures are twice these): https://resources.nvidia.com/en-us-blackwell-architecture/datasheet
    # B300 (Blackwell Ultra) is left out until its NVML name and dense per-GPU figures are confirmed.
    GpuPeaks(
        "B200 (HGX, 1000 W)",
        _names("NVIDIA B200"),
        2250 * T,
        2250 * T,
        1100 * T,
        80 * T,
        8.0e12,
        4500 * T,
        9000 * T,
    ),
    GpuPeaks(
        "GB200 (NVL72, 1200 W)",
        _names("NVIDIA GB200"),
        2500 * T,
        2500 * T,
        1250 * T,
        90 * T,
        8.0e12,
        5000 * T,
        10000 * T,
    ),
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
    ("NVIDIA B200", 180, "sm_100", ("B200", "HGX B200")),
    ("NVIDIA GB200", 186, "sm_100", ("GB200",)),
)


# Streaming multiprocessors of each, from NVIDIA's architecture whitepapers (V100: 80; A100: 108; H100 SXM5 and H200:
# 132; H100 PCIe: 114; B200: 148 per GPU): what a datasheet profile spreads a product's tiles over in waves
STREAMING_MULTIPROCESSORS = {
    "Tesla V100-SXM2-16GB": 80,
    "Tesla V100-SXM2-32GB": 80,
    "NVIDIA A100-SXM4-40GB": 108,
    "NVIDIA A100-SXM4-80GB": 108,
    "NVIDIA A100-PCIE-40GB": 108,
    "NVIDIA A100 80GB PCIe": 108,
    "NVIDIA H100 80GB HBM3": 132,
    "NVIDIA H100 PCIe": 114,
    "NVIDIA H200": 132,
    "NVIDIA B200": 148,
    "NVIDIA GB200": 148,
}


# What each talks over (accelbench.estimate.links prices collectives from it where no comm record was given): the
# link inside a node, one way, a GPU (NVLink 2: 6 x 25 GB/s; NVLink 3: 12 x 25; NVLink 4: 18 x 25; NVLink 5: 18 x 50;
# a PCIe card's x16 slot, PCIe 4.0: 32 GB/s, 5.0: 64), and the network a GPU has in NVIDIA's DGX reference system
# (DGX-1: 4 x 100 Gb/s EDR for 8 GPUs; DGX A100: a 200 Gb/s HDR NIC a GPU; DGX H100, H200 and B200: a 400 Gb/s
# NDR NIC a GPU; 8 GPUs a node). A PCIe card or a GB200 has no reference system: its network is not assumed.
LINKS: dict[str, dict[str, str]] = {
    "Tesla V100-SXM2-16GB": {"link": "nvlink", "link_gbps": "150", "link_name": "NVLink 2", "network_gbps": "6.25",
                             "network_name": "EDR InfiniBand (DGX-1: 4 x 100 Gb/s for 8 GPUs)", "node_devices": "8"},
    "Tesla V100-SXM2-32GB": {"link": "nvlink", "link_gbps": "150", "link_name": "NVLink 2", "network_gbps": "6.25",
                             "network_name": "EDR InfiniBand (DGX-1: 4 x 100 Gb/s for 8 GPUs)", "node_devices": "8"},
    "NVIDIA A100-SXM4-40GB": {"link": "nvlink", "link_gbps": "300", "link_name": "NVLink 3", "network_gbps": "25",
                              "network_name": "HDR InfiniBand (DGX A100: 200 Gb/s a GPU)", "node_devices": "8"},
    "NVIDIA A100-SXM4-80GB": {"link": "nvlink", "link_gbps": "300", "link_name": "NVLink 3", "network_gbps": "25",
                              "network_name": "HDR InfiniBand (DGX A100: 200 Gb/s a GPU)", "node_devices": "8"},
    "NVIDIA A100-PCIE-40GB": {"link": "pcie", "link_gbps": "32", "link_name": "PCIe 4.0 x16"},
    "NVIDIA A100 80GB PCIe": {"link": "pcie", "link_gbps": "32", "link_name": "PCIe 4.0 x16"},
    "NVIDIA H100 80GB HBM3": {"link": "nvlink", "link_gbps": "450", "link_name": "NVLink 4", "network_gbps": "50",
                              "network_name": "NDR InfiniBand (DGX H100: 400 Gb/s a GPU)", "node_devices": "8"},
    "NVIDIA H100 PCIe": {"link": "pcie", "link_gbps": "64", "link_name": "PCIe 5.0 x16"},
    "NVIDIA H200": {"link": "nvlink", "link_gbps": "450", "link_name": "NVLink 4", "network_gbps": "50",
                    "network_name": "NDR InfiniBand (DGX H200: 400 Gb/s a GPU)", "node_devices": "8"},
    "NVIDIA B200": {"link": "nvlink", "link_gbps": "900", "link_name": "NVLink 5", "network_gbps": "50",
                    "network_name": "NDR InfiniBand (DGX B200: 400 Gb/s a GPU)", "node_devices": "8"},
    "NVIDIA GB200": {"link": "nvlink", "link_gbps": "900", "link_name": "NVLink 5"},
}  # fmt: skip


def known_devices() -> list[DeviceInfo]:
    """The catalogue as detection would report each GPU (``accelbench_known_devices``), with its streaming
    multiprocessors as ``compute_units``."""
    out = []
    for index, (name, gib, arch, aliases) in enumerate(CATALOG):
        entry = lookup(name)
        label = entry.label if entry is not None else name
        details = {"label": label, "aliases": ",".join(aliases), "memory_source": "NVIDIA datasheet"}
        if name in STREAMING_MULTIPROCESSORS:
            details["compute_units"] = str(STREAMING_MULTIPROCESSORS[name])
        details |= LINKS.get(name, {})
        out.append(DeviceInfo(index=index, name=name, arch=arch, memory_bytes=gib * GIB, details=details))
    return out


def lookup(device_name: str) -> GpuPeaks | None:
    """The table entry for a device name as NVML or torch reports it, or None."""
    key = _key(device_name)
    return next((entry for entry in TABLE if key in entry.names), None)


def peaks_by_math(device_name: str) -> dict[str, float]:
    """Every dense peak the table has for a device, by math (fp32, tf32, bf16, fp16, fp8, fp4): what a run mixing maths
    weighs by its FLOPs (:func:`accelbench.engine.metrics.flop_weighted_peak`). Empty for an unknown device."""
    entry = lookup(device_name)
    if entry is None:
        return {}
    maths = {
        "fp32": entry.fp32,
        "tf32": entry.tf32,
        "bf16": entry.bf16,
        "fp16": entry.fp16,
        "fp8": entry.fp8,
        "fp4": entry.fp4,
    }
    return {math: flops for math, flops in maths.items() if flops is not None}


def peak_for(
    device_name: str, plan: PrecisionPlan, details: dict[str, str] | None = None
) -> PeakFigures | None:
    """The peak for the math ``plan`` really uses: bf16 or fp16 tensor cores for 16-bit plans, TF32 when the plan
    records TF32 matmuls, IEEE fp32 otherwise. None when the device or that math is not in the table: never another
    device's figure. An FP8 or MXFP8 plan's peak is FLOP-weighted over fp8 and bf16 (:func:`_fp8_weighted`). ``details`` (detection's) give the conditions recorded beside it: the enforced power limit and
    the maximum SM clock NVML reports."""
    entry = lookup(device_name)
    if entry is None:
        return None
    if plan.fp8_recipe is not None:
        flops, math = _fp8_weighted(device_name, plan)
    else:
        flops, math = _single_math(entry, plan)
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


def _fp8_weighted(device_name: str, plan: PrecisionPlan) -> tuple[float | None, str]:
    """An FP8 run's peak: the FP8 and BF16 dense peaks weighed by the FLOPs each math does (the converted linears'
    share, recorded in the plan once the model is converted). None before then, or where either peak is missing."""
    from accelbench.engine.metrics import flop_weighted_peak

    if plan.fp8_layers is None:
        return None, "fp8 before conversion"
    share = plan.fp8_layers.fp8_flop_share
    by_math = peaks_by_math(device_name)
    try:
        flops = flop_weighted_peak({"fp8": share, "bf16": 1.0 - share}, by_math)
    except KeyError:
        return None, "fp8 without a peak"
    # MXFP8 runs at the FP8 rate: NVIDIA's Blackwell datasheet gives one "FP8/FP6" tensor-core figure, and MX
    # block scaling is applied by those tensor cores themselves
    math = "mxfp8 (the fp8 rate)" if plan.mx is not None else "fp8"
    parts = [f"{share:.1%} of FLOPs in dense {math} tensor at {by_math['fp8'] / T:.0f} TFLOP/s"]
    if share < 1.0:
        parts.append(f"{1.0 - share:.1%} in dense bf16 tensor at {by_math['bf16'] / T:.0f} TFLOP/s")
    return flops, "FLOP-weighted " + ", ".join(parts)


def _single_math(entry: GpuPeaks, plan: PrecisionPlan) -> tuple[float | None, str]:
    sixteen = plan.autocast_dtype or (plan.param_dtype if plan.param_dtype != "float32" else None)
    if sixteen == "bfloat16":
        flops, math = entry.bf16, "dense bf16 tensor"
    elif sixteen == "float16":
        flops, math = entry.fp16, "dense fp16 tensor"
    elif plan.matmul_math == "tf32":
        flops, math = entry.tf32, "dense tf32 tensor"
    else:
        flops, math = entry.fp32, "fp32"
    return flops, math
