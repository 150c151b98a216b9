"""Records that describe a backend, its devices and what they can do.

These are what detection, memory and peak-figure hooks return; they end up verbatim in result records,
so they are pydantic models (validated, JSON-serialisable) rather than free-form dicts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from accelbench.errors import BackendError


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


def probe_in_subprocess(
    script: str, *, label: str, hang_hint: str, args: tuple[str, ...] = (), timeout: float = 60.0
) -> list[dict[str, Any]]:
    """Run a device-query ``script`` in a child interpreter and return the JSON list it prints last.

    For detection hooks: asking a vendor runtime for device properties initialises it, and a process that has done so
    cannot fork workers that use the device. The child inherits the visible-device variables, so it sees what a run
    would. ``label`` names the vendor in errors ("CUDA"); ``hang_hint`` says what to check if the child hangs.
    """
    try:
        proc = subprocess.run(
            [sys.executable, "-c", script, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise BackendError(
            f"the {label} device probe gave no answer within {timeout:.0f} s: {hang_hint}"
        ) from exc
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise BackendError(f"the {label} device probe failed (exit status {proc.returncode}): {last}")
    try:
        devices = json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise BackendError(f"the {label} device probe printed no device list: {lines[-1][:200]!r}") from exc
    if not isinstance(devices, list):
        raise BackendError(f"the {label} device probe printed {type(devices).__name__}, not a device list")
    return devices
