"""Records that describe a backend, its devices and what they can do.

These are what detection, memory and peak-figure hooks return; they end up verbatim in result records,
so they are pydantic models (validated, JSON-serialisable) rather than free-form dicts.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BackendInfo(_Record):
    """What a backend plugin is. Returned by ``accelbench_backend``."""

    name: str = Field(description="Name users pass to --backend, e.g. 'cpu', 'cuda', 'rocm', 'xpu', 'ipu'.")
    device_type: str = Field(description="torch device type its tensors live on ('cpu', 'cuda', 'xpu', ...).")
    device_unit: str = Field(
        description="What one device is, in words: 'CPU (the cores this process may use)', 'GPU', "
        "'GCD (half an MI250X)', 'tile (stack) of a Max 1550', 'IPU'."
    )
    priority: int = Field(
        default=100,
        description="Detection order when --backend is absent: highest priority with a device wins. CPU is 0.",
    )
    description: str = ""


class DeviceInfo(_Record):
    """One device as detection sees it, without initialising a runtime in the calling process."""

    index: int
    name: str
    arch: str | None = Field(default=None, description="e.g. 'sm_90', 'gfx90a', 'x86_64 avx512'.")
    memory_bytes: int | None = None
    details: dict[str, str] = Field(default_factory=dict, description="Vendor extras: driver, UUID, ...")


class MemoryStats(_Record):
    """A memory reading since the last reset. Unknown figures are None, never guessed."""

    peak_bytes: int | None = Field(
        description="The headline peak: allocator peak on GPUs, RSS high-water on CPU."
    )
    source: str = Field(description="What peak_bytes measures, e.g. 'torch allocator max_memory_allocated'.")
    peak_reserved_bytes: int | None = None
    device_used_bytes: int | None = Field(
        default=None, description="Device-level use from the vendor's management library (NVML, amdsmi)."
    )
    total_bytes: int | None = None


class PeakFigures(_Record):
    """Vendor peak figures for one device, used for MFU and roofline ratios."""

    flops_per_s: float = Field(description="Dense (no sparsity) peak FLOP/s for the math mode in use.")
    memory_bandwidth_bytes_per_s: float | None = None
    source: str = Field(
        description="Where the figure comes from: 'vendor table: H100 SXM', 'user (--peak-tflops)'."
    )
