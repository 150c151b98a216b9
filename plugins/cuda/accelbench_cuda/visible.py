"""CUDA_VISIBLE_DEVICES, read the way the CUDA driver reads it.

The variable is a comma-separated list of device indices or UUIDs (``GPU-…``, or any unique prefix of one). The
driver stops at the first entry that names no device: only the devices before it are visible. A device named twice
hides every device, and so does an empty value. Entries naming MIG instances (``MIG-…``) are not resolved here:
:func:`visible_gpus` returns None for them and detection asks CUDA itself, in a subprocess.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ENV = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class PhysicalGpu:
    """One GPU as NVML enumerates it (PCI bus order), before CUDA_VISIBLE_DEVICES is applied."""

    index: int
    uuid: str
    name: str
    memory_bytes: int | None = None
    capability: tuple[int, int] | None = None
    pci_bus_id: str | None = None
    power_limit_w: float | None = (
        None  # the enforced power cap (NVML), which bounds the clocks a peak assumes
    )
    max_sm_clock_mhz: float | None = None
    links: tuple[
        tuple[str, str], ...
    ] = ()  # what it talks over: NVLink count and version, PCIe generation and width


def visible_gpus(value: str | None, gpus: Sequence[PhysicalGpu]) -> list[PhysicalGpu] | None:
    """The GPUs CUDA enumerates under ``CUDA_VISIBLE_DEVICES=value``, in CUDA ordinal order.

    ``value`` None (unset) means every GPU. Returns None when the value names MIG instances, which only CUDA can
    resolve.
    """
    if value is None:
        return list(gpus)
    entries = [entry.strip() for entry in value.split(",")]
    if any(entry.upper().startswith("MIG-") for entry in entries):
        return None
    chosen: list[PhysicalGpu] = []
    for entry in entries:
        gpu = _resolve(entry, gpus)
        if gpu is None:  # the driver stops at the first entry that names no device
            break
        if gpu in chosen:  # a repeated device makes CUDA see none at all
            return []
        chosen.append(gpu)
    return chosen


def _resolve(entry: str, gpus: Sequence[PhysicalGpu]) -> PhysicalGpu | None:
    if entry.isdigit():
        index = int(entry)
        return gpus[index] if index < len(gpus) else None
    if entry.upper().startswith("GPU-"):
        prefix = entry.lower()
        matches = [gpu for gpu in gpus if gpu.uuid.lower().startswith(prefix)]
        return matches[0] if len(matches) == 1 else None  # an ambiguous prefix names no device
    return None
