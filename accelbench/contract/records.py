"""Records a backend returns: what it is, its devices, an epoch's readings, its peak figures.

They end up verbatim in result records, so they are pydantic models (validated, JSON-serialisable) rather than
free-form dicts.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BackendInfo(_Record):
    """What a backend is: ``Backend.info``."""

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


class EnergyReading(_Record):
    """Energy one device's own cumulative counter saw over an epoch. Never estimated: no counter, no reading."""

    joules: float = Field(ge=0.0)
    domain: str = Field(
        description="What the counter covers, unique per physical domain ('nvml:GPU-<uuid>', "
        "'rapl:intel-rapl:0+intel-rapl:1'): ranks sharing a domain are counted once when ranks are summed."
    )
    source: str = Field(description="The counter, e.g. 'NVML total energy consumption (mJ)'.")


class EpochReadings(_Record):
    """What ``Backend.epoch_end`` returns: the epoch's memory, energy and telemetry on one device."""

    memory: MemoryStats
    energy: EnergyReading | None = None
    telemetry: dict[str, float] = Field(default_factory=dict)


class NoCollective:
    """The answer of ``Backend.collective_backend`` for devices that replicate without torch.distributed."""

    _instance: NoCollective | None = None

    def __new__(cls) -> NoCollective:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NO_COLLECTIVE"


NO_COLLECTIVE = NoCollective()


class PeakFigures(_Record):
    """Vendor peak figures for one device, used for MFU and roofline ratios."""

    flops_per_s: float = Field(description="Dense (no sparsity) peak FLOP/s for the math mode in use.")
    memory_bandwidth_bytes_per_s: float | None = None
    source: str = Field(
        description="Where the figure comes from: 'vendor table: H100 SXM', 'user (--peak-tflops)'."
    )
    table_version: str | None = Field(
        default=None, description="The version of the plugin's peak table the figure was read from."
    )
    conditions: dict[str, str] = Field(
        default_factory=dict,
        description="What the device ran under beside the peak, where its plugin reads them (e.g. the enforced "
        "power limit and the maximum SM clock): a capped or down-clocked part cannot reach a datasheet peak.",
    )


def allocator_memory(
    api: Any, device: Any, allocator: str, device_used: int | None = None, total: int | None = None
) -> MemoryStats:
    """The peak of a torch caching allocator since its last reset, for the ``torch.cuda`` / ``torch.xpu`` /
    ``torch.accelerator.memory`` family (the same API): ``allocator`` names it in the reading's source."""
    name = getattr(api, "__name__", "torch.accelerator.memory")
    return MemoryStats(
        peak_bytes=int(api.max_memory_allocated(device)),
        source=f"{allocator} peak ({name}.max_memory_allocated)",
        peak_reserved_bytes=int(api.max_memory_reserved(device)),
        device_used_bytes=device_used,
        total_bytes=total,
    )
