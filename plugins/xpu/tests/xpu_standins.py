"""Faithful stand-ins for what the XPU plugin calls without Intel hardware: ``torch.xpu`` on an XPU build, and
the legacy packages (Intel Extension for PyTorch, oneCCL bindings) as importable modules.

``torch.xpu`` follows its documented behaviour: indices beyond the visible devices fail, properties carry the
fields torch 2.13 exposes (name, total_memory, has_fp16, has_bfloat16_conversions, ...), the runtime counts as
initialised once a device is set, and the Level Zero Sysman readings (``device_memory_used``, ``temperature``)
raise when pyzes is missing, as they do without the package.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

GIB = 2**30
SAMPLE_S = 0.005  # the real readings take ~100 ms; the stand-in keeps tests fast


@dataclass
class FakeXpuDevice:
    name: str = "Intel(R) Data Center GPU Max 1550"
    total_memory: int = 64 * GIB  # FLAT mode: one tile
    has_fp16: bool = True
    has_bfloat16_conversions: bool = True
    max_compute_units: int = 512
    gpu_eu_count: int = 512
    driver_version: str = "1.6.31294+21"
    platform_name: str = "Intel(R) oneAPI Unified Runtime over Level-Zero"
    sysman: bool = True  # pyzes installed and permitted
    temperature_c: float = 38.0
    memory_used: int = 3 * GIB
    power_w: float = 400.0
    utilization_pct: float = 97.0
    power_permitted: bool = True  # reading the energy counter may need elevated privileges


class FakeXpu:
    """torch.xpu over a list of visible :class:`FakeXpuDevice`."""

    def __init__(self, devices: list[FakeXpuDevice]) -> None:
        self.devices = devices
        self.current: int | None = None
        self.synchronized = 0

    def index(self, device: torch.device | int | None) -> int:
        if isinstance(device, torch.device):
            device = device.index
        if device is None:
            device = self.current or 0
        if not 0 <= device < len(self.devices):
            raise RuntimeError(f"The device index is out of range. It must be in [0, {len(self.devices)})")
        return device

    def sysman(self, device: torch.device | int | None) -> FakeXpuDevice:
        found = self.devices[self.index(device)]
        if not found.sysman:
            raise ModuleNotFoundError("No module named 'pyzes'")
        return found

    def set_device(self, device: int) -> None:
        self.current = self.index(device)

    def power_draw(self, device: torch.device | int | None = None) -> float:
        found = self.sysman(device)
        time.sleep(SAMPLE_S)  # the real call reads the energy counter twice, 100 ms apart
        if not found.power_permitted:
            raise RuntimeError(
                "GPU power draw querying is not available. Try running with elevated privileges (e.g. sudo)."
            )
        return found.power_w

    def utilization(self, device: torch.device | int | None = None) -> float:
        found = self.sysman(device)
        time.sleep(SAMPLE_S)
        return found.utilization_pct

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        xpu = torch.xpu
        monkeypatch.setattr(torch._C, "_has_xpu", True, raising=False)
        monkeypatch.setattr(xpu, "is_available", lambda: bool(self.devices))
        monkeypatch.setattr(xpu, "device_count", lambda: len(self.devices))
        monkeypatch.setattr(xpu, "is_initialized", lambda: self.current is not None)
        monkeypatch.setattr(xpu, "set_device", self.set_device)
        monkeypatch.setattr(xpu, "get_device_properties", lambda d=None: self.devices[self.index(d)])
        monkeypatch.setattr(
            xpu, "synchronize", lambda d=None: setattr(self, "synchronized", self.synchronized + 1)
        )
        monkeypatch.setattr(xpu, "reset_peak_memory_stats", lambda d=None: None)
        monkeypatch.setattr(xpu, "max_memory_allocated", lambda d=None: 42 * 2**20)
        monkeypatch.setattr(xpu, "max_memory_reserved", lambda d=None: 64 * 2**20)
        monkeypatch.setattr(xpu, "device_memory_used", lambda d=None: self.sysman(d).memory_used)
        monkeypatch.setattr(xpu, "temperature", lambda d=None: self.sysman(d).temperature_c)
        monkeypatch.setattr(xpu, "power_draw", self.power_draw)
        monkeypatch.setattr(xpu, "utilization", self.utilization)
        monkeypatch.setattr(xpu, "current_device", lambda: self.index(None))


def install_xpus(monkeypatch: pytest.MonkeyPatch, devices: list[FakeXpuDevice], xccl: bool = True) -> FakeXpu:
    """An XPU build of torch (torch >= 2.8 has xccl) on a machine with ``devices``."""
    import torch.distributed as dist
    from accelbench_xpu import detect, probe

    for name in ("ZE_AFFINITY_MASK", "ZE_FLAT_DEVICE_HIERARCHY", "ACCELBENCH_XPU_PATH"):
        monkeypatch.delenv(name, raising=False)
    fake = FakeXpu(devices)
    fake.install(monkeypatch)
    monkeypatch.setattr(dist, "is_xccl_available", lambda: xccl, raising=False)
    monkeypatch.setattr(detect, "gpu_node_present", lambda: True)
    monkeypatch.setattr(probe, "run_probe", lambda path: [_row(d) for d in devices])
    return fake  # the plugin object's state (pinning, samplers) is new with each plugin host


def _row(device: FakeXpuDevice) -> dict:
    """What the probe subprocess prints for a device (the real probe is tested on its own)."""
    fields = ("name", "total_memory", "max_compute_units", "gpu_eu_count", "driver_version", "platform_name",
              "has_fp16", "has_bfloat16_conversions")  # fmt: skip
    return {key: getattr(device, key) for key in fields}


def install_legacy_packages(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, oneccl: bool = True) -> Path:
    """Importable intel_extension_for_pytorch / oneccl_bindings_for_pytorch whose import is recorded."""
    site = tmp_path / "legacy_site"
    site.mkdir()
    (site / "intel_extension_for_pytorch.py").write_text(
        "IMPORTED = True  # the real import registers torch.xpu\n"
    )
    if oneccl:
        (site / "oneccl_bindings_for_pytorch.py").write_text(
            "IMPORTED = True  # the real import registers 'ccl'\n"
        )
    monkeypatch.syspath_prepend(str(site))
    for name in ("intel_extension_for_pytorch", "oneccl_bindings_for_pytorch"):
        # recorded first, so the import a test makes is undone after it
        monkeypatch.setitem(sys.modules, name, None)
        monkeypatch.delitem(sys.modules, name)
    return site
