"""NVML through ``pynvml`` (PyPI: nvidia-ml-py): detection, device-level memory and per-epoch telemetry.

NVML talks to the driver without creating a CUDA context, so all of this is safe in the parent process. It is
optional: without the package, or without the driver's ``libnvidia-ml``, :func:`session` returns None and the plugin
falls back (detection: the probe subprocess; device-level memory and telemetry: not recorded).

Telemetry is measured over an epoch, not sampled after it: the runner reads telemetry after the epoch's closing
synchronisation, when the GPU is already idle, so an instantaneous power or PCIe reading then would describe an
idle GPU. :class:`EpochWindow` instead snapshots NVML's cumulative counters (energy, PCIe bytes) when the epoch
starts and takes the difference at the end, and averages the driver's own utilisation samples in between.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from accelbench.errors import BackendError
from accelbench_cuda.visible import PhysicalGpu

_session: ModuleType | None = None  # pynvml, once nvmlInit succeeded in this process

# c_nvmlValue_t member to read for each nvmlValueType_t
_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def session() -> ModuleType | None:
    """``pynvml`` with NVML initialised, or None when the package, the library or the driver is missing."""
    global _session
    if _session is not None:
        return _session
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()  # reference-counted by NVML; this process keeps its session until exit
    except (pynvml.NVMLError, OSError):
        return None
    _session = pynvml
    return pynvml


def physical_gpus(pynvml: ModuleType) -> list[PhysicalGpu]:
    """Every GPU NVML sees, in NVML index order (PCI bus order)."""
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            gpus.append(
                PhysicalGpu(
                    index=index,
                    uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                    name=_text(pynvml.nvmlDeviceGetName(handle)),
                    memory_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                    capability=_capability(pynvml.nvmlDeviceGetCudaComputeCapability(handle)),
                    pci_bus_id=_optional(
                        lambda h=handle: _text(pynvml.nvmlDeviceGetPciInfo(h).busId), pynvml
                    ),
                    power_limit_w=_scaled(
                        _optional(lambda h=handle: pynvml.nvmlDeviceGetEnforcedPowerLimit(h), pynvml), 1e-3
                    ),
                    max_sm_clock_mhz=_scaled(
                        _optional(
                            lambda h=handle: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM), pynvml
                        ),
                        1.0,
                    ),
                    links=link_facts(pynvml, handle),
                )
            )
        return gpus
    except (
        pynvml.NVMLError
    ) as exc:  # GPUs are there but NVML cannot read them: say so rather than "no device"
        raise BackendError(f"NVML failed while listing GPUs: {exc} (check `nvidia-smi`)") from exc


def _scaled(value: Any, factor: float) -> float | None:
    return None if value is None else float(value) * factor


def _capability(pair: Any) -> tuple[int, int]:
    major, minor = pair
    return int(major), int(minor)


def driver_version(pynvml: ModuleType) -> dict[str, str]:
    """Driver and the CUDA version it supports, as NVML reports them."""
    versions: dict[str, str] = {}
    driver = _optional(lambda: _text(pynvml.nvmlSystemGetDriverVersion()), pynvml)
    if driver:
        versions["nvidia_driver"] = driver
    cuda = _optional(pynvml.nvmlSystemGetCudaDriverVersion, pynvml)
    if cuda:  # e.g. 12080 -> "12.8"
        versions["cuda_driver_api"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
    return versions


def handle_for_uuid(pynvml: ModuleType, uuid: str) -> Any | None:
    """The NVML handle of the GPU (or MIG instance) with this UUID, or None if NVML does not know it."""
    if not uuid.upper().startswith(("GPU-", "MIG-")):
        uuid = "GPU-" + uuid  # torch prints device UUIDs without NVML's prefix
    return _optional(lambda: pynvml.nvmlDeviceGetHandleByUUID(uuid), pynvml)


def memory_used(pynvml: ModuleType, handle: Any) -> int | None:
    """Device memory in use by every process on the GPU (what nvidia-smi shows), bytes."""
    info = _optional(lambda: pynvml.nvmlDeviceGetMemoryInfo(handle), pynvml)
    return int(info.used) if info is not None else None


@dataclass
class EpochWindow:
    """NVML counters at the start of an epoch; :meth:`close` turns them into the epoch's telemetry."""

    handle: Any
    uuid: str = ""  # the GPU's, naming the energy counter's domain
    started: float = field(default_factory=lambda: time.monotonic())
    sample_since_us: int = field(default_factory=lambda: int(time.time() * 1e6))  # NVML sample clock
    energy_mj: int | None = None
    pcie_tx_bytes: int | None = None
    pcie_rx_bytes: int | None = None

    @classmethod
    def open(cls, pynvml: ModuleType, handle: Any) -> EpochWindow:
        uuid = _optional(lambda: _text(pynvml.nvmlDeviceGetUUID(handle)), pynvml) or "unknown"
        window = cls(handle=handle, uuid=uuid)
        window.energy_mj = _optional(lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle), pynvml)
        window.pcie_tx_bytes, window.pcie_rx_bytes = _pcie_counters(pynvml, handle)
        return window

    def close(self, pynvml: ModuleType) -> dict[str, float]:
        """Telemetry for the epoch since :meth:`open`: averages from counters, instantaneous readings at its end."""
        handle = self.handle
        elapsed = time.monotonic() - self.started
        out: dict[str, float] = {}
        energy = _optional(lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle), pynvml)
        if energy is not None and self.energy_mj is not None and energy >= self.energy_mj and elapsed > 0:
            out["energy_j"] = (energy - self.energy_mj) / 1000.0
            out["power_w"] = out["energy_j"] / elapsed  # the epoch's mean power, not one sample
        tx, rx = _pcie_counters(pynvml, handle)
        for key, start, end in (
            ("pcie_tx_bytes_per_s", self.pcie_tx_bytes, tx),
            ("pcie_rx_bytes_per_s", self.pcie_rx_bytes, rx),
        ):
            if (
                start is not None and end is not None and end >= start and elapsed > 0
            ):  # a wrapped counter: unknown
                out[key] = (end - start) / elapsed
        utilization = _mean_samples(pynvml, handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, self.sample_since_us)
        if utilization is not None:
            out["utilization_pct"] = utilization
        temperature = _optional(
            lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU), pynvml
        )
        if temperature is not None:
            out["temperature_c"] = float(temperature)
        clock = _optional(lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM), pynvml)
        if clock is not None:
            out["clock_sm_mhz"] = float(clock)
        return out


def _pcie_counters(pynvml: ModuleType, handle: Any) -> tuple[int | None, int | None]:
    """Cumulative PCIe bytes sent and received (NVML field values; Hopper and newer drivers), or None."""
    fields = [pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES]
    values = _optional(lambda: pynvml.nvmlDeviceGetFieldValues(handle, fields), pynvml)
    if values is None:
        return None, None
    read: list[int | None] = []
    for value in values:
        if value.nvmlReturn != pynvml.NVML_SUCCESS:  # per-field status: NOT_SUPPORTED on older GPUs
            read.append(None)
            continue
        read.append(int(getattr(value.value, _VALUE_MEMBER.get(value.valueType, "ullVal"))))
    return read[0], read[1]


def _mean_samples(pynvml: ModuleType, handle: Any, kind: int, since_us: int) -> float | None:
    """Mean of the driver's buffered samples of ``kind`` taken after ``since_us``, or None if there are none."""
    answer = _optional(lambda: pynvml.nvmlDeviceGetSamples(handle, kind, since_us), pynvml)
    if not answer:
        return None
    value_type, samples = answer
    member = _VALUE_MEMBER.get(value_type, "uiVal")
    values = [float(getattr(sample.sampleValue, member)) for sample in samples if sample.timeStamp > since_us]
    return sum(values) / len(values) if values else None


def link_facts(pynvml: ModuleType, handle: Any) -> tuple[tuple[str, str], ...]:
    """The links a GPU's collectives cross, as NVML reports them (``accelbench comm`` grades its bus bandwidth
    against their ceiling): active NVLinks and their version, and the PCIe link's maximum generation and width for
    this device in this system (the current ones drop while the GPU idles, as it does during detection)."""
    facts: list[tuple[str, str]] = []
    active, version = 0, None
    for link in range(int(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18))):
        state = _optional(lambda i=link: pynvml.nvmlDeviceGetNvLinkState(handle, i), pynvml)
        if state is None:
            break  # past the device's last link (or no NVLink at all)
        if state:
            active += 1
            if version is None:
                version = _optional(lambda i=link: pynvml.nvmlDeviceGetNvLinkVersion(handle, i), pynvml)
    if active:
        facts.append(("nvlink_links", str(active)))
        if version is not None:
            facts.append(("nvlink_version", str(version)))
    generation = _optional(lambda: pynvml.nvmlDeviceGetMaxPcieLinkGeneration(handle), pynvml)
    width = _optional(lambda: pynvml.nvmlDeviceGetMaxPcieLinkWidth(handle), pynvml)
    if generation:
        facts.append(("pcie_generation", str(generation)))
    if width:
        facts.append(("pcie_width", str(width)))
    return tuple(facts)


def _optional(call: Any, pynvml: ModuleType) -> Any:
    """``call()``, or None when NVML answers with an error (NOT_SUPPORTED, NO_PERMISSION, NOT_FOUND, ...)."""
    try:
        return call()
    except pynvml.NVMLError:
        return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
