"""Gaudi devices through HLML (Habana's management library, ``pyhlml`` from habana-pyhlml), or ``hl-smi``.

HLML mirrors NVML: ``hlmlInit``/``hlmlShutdown``, a handle per device index, and per-handle queries for the name,
memory (``total``/``used``/``free`` bytes), power (mW), the cumulative energy counter (mJ), temperature, utilisation
and clocks. Asking it starts no device runtime, so detection uses it first; ``hl-smi`` (a subprocess) is the
fallback. ``HABANA_VISIBLE_MODULES`` (comma-separated module ids) restricts what a run sees, as the runtime does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from accelbench.contract import DeviceInfo

VISIBLE_ENV = "HABANA_VISIBLE_MODULES"
HL_SMI_FIELDS = "index,module_id,name,memory.total,uuid,bus_id,driver_version"


def visible_modules(env: dict[str, str] | None = None) -> set[int] | None:
    """The module ids ``HABANA_VISIBLE_MODULES`` allows, or None when it is unset (every module)."""
    value = (os.environ if env is None else env).get(VISIBLE_ENV, "").strip()
    if not value:
        return None
    return {int(part) for part in value.split(",") if part.strip().isdigit()}


def session() -> Any | None:
    """``pyhlml``, initialised, or None where the bindings or the driver are absent."""
    try:
        import pyhlml
    except ImportError:
        return None
    try:
        pyhlml.hlmlInit()
    except Exception:  # no driver: HLML raises its own error type
        return None
    return pyhlml


def detect_devices() -> list[DeviceInfo]:
    """The visible Gaudi devices from HLML, else ``hl-smi``; [] when neither finds one."""
    hlml = session()
    if hlml is not None:
        return _from_hlml(hlml)
    return _from_hl_smi()


def _from_hlml(hlml: Any) -> list[DeviceInfo]:
    visible = visible_modules()
    out: list[DeviceInfo] = []
    for index in range(int(hlml.hlmlDeviceGetCount())):
        handle = hlml.hlmlDeviceGetHandleByIndex(index)
        module = int(hlml.hlmlDeviceGetModuleID(handle))
        if visible is not None and module not in visible:
            continue
        memory = hlml.hlmlDeviceGetMemoryInfo(handle)
        details = {"module_id": str(module), "uuid": str(hlml.hlmlDeviceGetUUID(handle)), "source": "hlml"}
        out.append(
            DeviceInfo(
                index=len(out),
                name=_text(hlml.hlmlDeviceGetName(handle)),
                arch=None,
                memory_bytes=int(memory.total),
                details=details,
            )
        )
    return out


def _from_hl_smi() -> list[DeviceInfo]:
    tool = shutil.which("hl-smi")
    if tool is None:
        return []
    proc = subprocess.run(
        [tool, "-Q", HL_SMI_FIELDS, "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if proc.returncode != 0:
        return []
    visible = visible_modules()
    out: list[DeviceInfo] = []
    for line in proc.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 7 or not parts[1].isdigit():
            continue
        module = int(parts[1])
        if visible is not None and module not in visible:
            continue
        total = parts[3].split()[0]
        details = {"module_id": str(module), "uuid": parts[4], "bus_id": parts[5], "driver": parts[6],
                   "source": "hl-smi"}  # fmt: skip
        out.append(
            DeviceInfo(
                index=len(out),
                name=parts[2],
                memory_bytes=int(float(total) * 2**20) if total.replace(".", "").isdigit() else None,
                details=details,
            )
        )
    return out


def driver_version(hlml: Any) -> dict[str, str]:
    try:
        return {"habana_driver": _text(hlml.hlmlGetDriverVersion())}
    except Exception:  # an older HLML without it
        return {}


def handle_for_index(hlml: Any, index: int) -> Any | None:
    """The HLML handle of the ``index``-th visible device (the order detection reports)."""
    visible = visible_modules()
    seen = -1
    for i in range(int(hlml.hlmlDeviceGetCount())):
        handle = hlml.hlmlDeviceGetHandleByIndex(i)
        if visible is not None and int(hlml.hlmlDeviceGetModuleID(handle)) not in visible:
            continue
        seen += 1
        if seen == index:
            return handle
    return None


@dataclass
class EpochWindow:
    """A device's counters at an epoch's start, and power/utilisation samples taken at its end: the energy
    counter (mJ) differenced over the epoch gives joules and the mean power; the rest is read at the end."""

    uuid: str
    energy_mj: int | None
    started: float
    extras: dict[str, float] = field(default_factory=dict)

    @classmethod
    def open(cls, hlml: Any, handle: Any) -> EpochWindow:
        try:
            energy = int(hlml.hlmlDeviceGetTotalEnergyConsumption(handle))
        except Exception:  # a device or driver without the counter
            energy = None
        return cls(str(hlml.hlmlDeviceGetUUID(handle)), energy, time.perf_counter())

    def close(self, hlml: Any, handle: Any) -> dict[str, float]:
        """The epoch's telemetry: ``energy_j`` and mean ``power_w`` from the counter, ``temperature_c``,
        ``utilization_pct`` and ``memory_used_bytes`` read now; what cannot be read is left out."""
        out: dict[str, float] = {}
        elapsed = time.perf_counter() - self.started
        if self.energy_mj is not None:
            try:
                end = int(hlml.hlmlDeviceGetTotalEnergyConsumption(handle))
            except Exception:
                end = None
            if end is not None and end >= self.energy_mj:
                out["energy_j"] = (end - self.energy_mj) / 1000.0
                if elapsed > 0:
                    out["power_w"] = out["energy_j"] / elapsed
        for key, read in (
            ("temperature_c", lambda: hlml.hlmlDeviceGetTemperature(handle, hlml.HLML_TEMPERATURE_ON_AIP)),
            ("utilization_pct", lambda: hlml.hlmlDeviceGetUtilizationRates(handle).aip),
        ):
            try:
                out[key] = float(read())
            except Exception:
                continue
        return out


def memory_used(hlml: Any, handle: Any) -> int | None:
    try:
        return int(hlml.hlmlDeviceGetMemoryInfo(handle).used)
    except Exception:
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
