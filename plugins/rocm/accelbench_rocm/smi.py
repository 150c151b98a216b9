"""AMD SMI through the ``amdsmi`` Python package: detection, device-level memory, per-epoch energy.

amdsmi talks to the amdgpu driver without initialising HIP, so it is safe in the parent process. It is optional:
the package needs the ROCm install's ``libamd_smi.so``, and when either is missing :func:`session` returns None and
the plugin falls back (detection: the probe subprocess; device memory and energy: not recorded). Importing amdsmi
without its library prints to stdout and then fails; the print is swallowed so ``accelbench plugins --json``
stays valid JSON.

Telemetry is measured over the epoch: the energy accumulator is read when the epoch starts and when it ends
(the runner reads telemetry after the closing synchronisation, on an idle GPU, so an instantaneous power or
activity reading then would describe idleness). On an MI250X the two GCDs of a package share one power sensor,
which amdsmi reports on one of them.
"""

from __future__ import annotations

import contextlib
import io
import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from accelbench.errors import BackendError

_session: ModuleType | None = None  # amdsmi, once amdsmi_init succeeded in this process


@dataclass(frozen=True)
class PhysicalGpu:
    """One GPU (on an MI250X: one GCD) as amdsmi enumerates it, before the visible-device variables apply."""

    index: int
    name: str
    arch: str
    compute_units: int | None
    memory_bytes: int | None
    uuid: str
    bdf: str


def session() -> ModuleType | None:
    """``amdsmi`` with the library initialised, or None when the package, its library or the driver is missing."""
    global _session
    if _session is not None:
        return _session
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # amdsmi prints when libamd_smi.so is missing
            import amdsmi
    except Exception:  # ImportError, or KeyError/OSError from the missing shared library
        return None
    try:
        amdsmi.amdsmi_init()
    except amdsmi.AmdSmiException:
        return None
    _session = amdsmi
    return amdsmi


def physical_gpus(amdsmi: ModuleType) -> list[PhysicalGpu]:
    """Every AMD GPU (GCD) amdsmi sees, in its enumeration order."""
    try:
        gpus = []
        for index, handle in enumerate(amdsmi.amdsmi_get_processor_handles()):
            asic = amdsmi.amdsmi_get_gpu_asic_info(handle)
            name = asic.get("market_name", "")
            units = asic.get("num_compute_units")
            gpus.append(
                PhysicalGpu(
                    index=index,
                    name="" if name == "N/A" else str(name),
                    arch=str(asic.get("target_graphics_version", "")),
                    compute_units=units if isinstance(units, int) else None,
                    memory_bytes=_optional(
                        lambda h=handle: int(
                            amdsmi.amdsmi_get_gpu_memory_total(h, amdsmi.AmdSmiMemoryType.VRAM)
                        ),
                        amdsmi,
                    ),
                    uuid=str(_optional(lambda h=handle: amdsmi.amdsmi_get_gpu_device_uuid(h), amdsmi) or ""),
                    bdf=str(amdsmi.amdsmi_get_gpu_device_bdf(handle)),
                )
            )
        return gpus
    except amdsmi.AmdSmiException as exc:  # GPUs are there but amdsmi cannot read them: say so
        raise BackendError(f"amdsmi failed while listing GPUs: {exc} (check `amd-smi list`)") from exc


def handle_for_bdf(amdsmi: ModuleType, bdf: str) -> Any | None:
    """The amdsmi handle of the GPU at PCI address ``bdf`` (``0000:c1:00.0``), or None."""
    for handle in _optional(amdsmi.amdsmi_get_processor_handles, amdsmi) or []:
        if (
            str(_optional(lambda h=handle: amdsmi.amdsmi_get_gpu_device_bdf(h), amdsmi)).lower()
            == bdf.lower()
        ):
            return handle
    return None


# amdsmi_topo_get_link_type's "type" is the KFD io-link type (AMDSMI_IOLINK_TYPE_*, as the amd-smi CLI reads it), not
# AmdSmiLinkType: 1 is PCIe, 2 is xGMI.
IOLINK_TYPE_XGMI = 2


def xgmi_links(amdsmi: ModuleType, gpus: list[PhysicalGpu]) -> list[dict[int, int]]:
    """For each of ``gpus`` (in order), its direct xGMI links to each other one: {position in ``gpus``: links}.

    A peer is direct when amdsmi reports an xGMI link one hop away. The number of links to it is what the kernel
    puts in the io link's bandwidth: the maximum is links x one link's rate and the minimum one link's
    (``amdgpu_amdkfd_get_xgmi_bandwidth_mbytes``), so their ratio counts the links (4 between the two GCDs of an
    MI250X, 1 between two MI300X). Where the driver reports no bandwidth, a direct peer counts as one link.
    ``accelbench comm`` grades bus bandwidth against these links (docs/comm.md).
    """
    handles = _optional(amdsmi.amdsmi_get_processor_handles, amdsmi) or []
    out: list[dict[int, int]] = []
    for gpu in gpus:
        peers: dict[int, int] = {}
        for position, peer in enumerate(gpus):
            if peer.index == gpu.index or max(gpu.index, peer.index) >= len(handles):
                continue
            src, dst = handles[gpu.index], handles[peer.index]
            link = _optional(lambda s=src, d=dst: amdsmi.amdsmi_topo_get_link_type(s, d), amdsmi)
            if not link or link.get("type") != IOLINK_TYPE_XGMI or link.get("hops") != 1:
                continue
            bandwidth = _optional(
                lambda s=src, d=dst: amdsmi.amdsmi_get_minmax_bandwidth_between_processors(s, d), amdsmi
            )
            low = int(bandwidth["min_bandwidth"]) if bandwidth else 0
            high = int(bandwidth["max_bandwidth"]) if bandwidth else 0
            peers[position] = max(1, high // low) if low > 0 and high > 0 else 1
        out.append(peers)
    return out


def memory_used(amdsmi: ModuleType, handle: Any) -> int | None:
    """VRAM in use by every process on the GPU, bytes."""
    used = _optional(lambda: amdsmi.amdsmi_get_gpu_memory_usage(handle, amdsmi.AmdSmiMemoryType.VRAM), amdsmi)
    return int(used) if used is not None else None


def versions(amdsmi: ModuleType) -> dict[str, str]:
    """amdgpu driver and amdsmi library versions."""
    out: dict[str, str] = {}
    lib = _optional(amdsmi.amdsmi_get_lib_version, amdsmi)
    if lib:
        out["amdsmi_lib"] = f"{lib['major']}.{lib['minor']}.{lib['release']}"
    handles = _optional(amdsmi.amdsmi_get_processor_handles, amdsmi) or []
    driver = _optional(lambda: amdsmi.amdsmi_get_gpu_driver_info(handles[0]), amdsmi) if handles else None
    if driver and driver.get("driver_version") not in (None, "N/A"):
        out["amdgpu_driver"] = str(driver["driver_version"])
    return out


def _energy_joules(amdsmi: ModuleType, handle: Any) -> float | None:
    reading = _optional(lambda: amdsmi.amdsmi_get_energy_count(handle), amdsmi)
    if not reading:
        return None
    # the accumulator counts in units of counter_resolution microjoules
    return float(reading["energy_accumulator"]) * float(reading["counter_resolution"]) / 1e6


@dataclass
class EpochWindow:
    """The energy accumulator at the start of an epoch; :meth:`close` turns it into the epoch's telemetry."""

    handle: Any
    started: float = field(default_factory=lambda: time.monotonic())
    energy_j: float | None = None
    bdf: str = ""  # the GPU's PCI address, naming the energy counter's domain

    @classmethod
    def open(cls, amdsmi: ModuleType, handle: Any, bdf: str = "") -> EpochWindow:
        return cls(handle=handle, energy_j=_energy_joules(amdsmi, handle), bdf=bdf)

    def close(self, amdsmi: ModuleType) -> dict[str, float]:
        elapsed = time.monotonic() - self.started
        out: dict[str, float] = {}
        energy = _energy_joules(amdsmi, self.handle)
        if energy is not None and self.energy_j is not None and energy >= self.energy_j and elapsed > 0:
            out["energy_j"] = energy - self.energy_j
            out["power_w"] = out["energy_j"] / elapsed  # the epoch's mean power
        temperature = _optional(
            lambda: amdsmi.amdsmi_get_temp_metric(
                self.handle, amdsmi.AmdSmiTemperatureType.HOTSPOT, amdsmi.AmdSmiTemperatureMetric.CURRENT
            ),
            amdsmi,
        )
        if isinstance(temperature, (int, float)):
            out["temperature_c"] = float(temperature)
        return out


def _optional(call: Any, amdsmi: ModuleType) -> Any:
    """``call()``, or None when amdsmi answers with an error (not supported on this GPU, no permission, ...)."""
    try:
        return call()
    except amdsmi.AmdSmiException:
        return None
