"""Faithful stand-ins for what the CUDA plugin calls when there is no NVIDIA GPU: ``pynvml`` and ``torch.cuda``.

The ``pynvml`` stand-in follows nvidia-ml-py's documented behaviour, not just its names: every device call before
``nvmlInit`` fails with NVML_ERROR_UNINITIALIZED, a missing library fails ``nvmlInit`` with
NVML_ERROR_LIBRARY_NOT_FOUND, ``NVMLError(code)`` builds the code's subclass, bad indices and unknown UUIDs fail as
NVML does, counters a GPU lacks answer NVML_ERROR_NOT_SUPPORTED (per field for field values),
``nvmlDeviceGetSamples`` returns only samples newer than the given timestamp and fails with NVML_ERROR_NOT_FOUND
when there are none, and string getters return ``str`` (nvidia-ml-py decodes them) while ``busId`` stays bytes.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3


@dataclass
class FakeGpu:
    """One GPU as NVML and CUDA see it, with the counters a test advances."""

    name: str
    uuid: str
    capability: tuple[int, int]
    memory_total: int
    memory_used: int = 0
    bus_id: str = "00000000:00:00.0"
    multiprocessors: int = 108
    energy_mj: int | None = 1_000_000  # None: the GPU has no energy counter (pre-Volta)
    pcie_tx: int | None = 0  # None: no PCIe byte counters (older GPUs or drivers)
    pcie_rx: int | None = 0
    utilization_samples: list[tuple[int, int]] = field(default_factory=list)  # (timestamp in us, percent)
    temperature_c: int = 40
    clock_sm_mhz: int = 1410
    max_clock_sm_mhz: int = 1410
    power_limit_mw: int | None = 400_000  # None: NVML answers NOT_SUPPORTED (as for some boards)
    nvlinks: int = 0  # active NVLinks (links past them answer NOT_SUPPORTED, as past a device's last link)
    nvlink_version: int = 3
    pcie_generation: int | None = 4  # None: NOT_SUPPORTED
    pcie_width: int | None = 16


class NVMLError(Exception):
    """As in nvidia-ml-py: ``NVMLError(code)`` returns an instance of that code's subclass."""

    _subclasses: dict[int, type[NVMLError]] = {}

    def __new__(cls, value: int) -> NVMLError:  # noqa: PYI034
        if cls is NVMLError:
            cls = NVMLError._subclasses.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        super().__init__(value)

    def __str__(self) -> str:
        return {
            NVML_ERROR_UNINITIALIZED: "Uninitialized",
            NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
            NVML_ERROR_NOT_SUPPORTED: "Not Supported",
            NVML_ERROR_NOT_FOUND: "Not Found",
            NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
        }.get(self.value, f"NVML Error with code {self.value}")


def _subclass(name: str, code: int) -> type[NVMLError]:
    cls = type(name, (NVMLError,), {})
    NVMLError._subclasses[code] = cls
    return cls


NVMLError_Uninitialized = _subclass("NVMLError_Uninitialized", NVML_ERROR_UNINITIALIZED)
NVMLError_InvalidArgument = _subclass("NVMLError_InvalidArgument", NVML_ERROR_INVALID_ARGUMENT)
NVMLError_NotSupported = _subclass("NVMLError_NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NotFound = _subclass("NVMLError_NotFound", NVML_ERROR_NOT_FOUND)
NVMLError_LibraryNotFound = _subclass("NVMLError_LibraryNotFound", NVML_ERROR_LIBRARY_NOT_FOUND)


@dataclass(frozen=True)
class _Handle:
    index: int


class _Value:  # c_nvmlValue_t: a union; the stand-in fills the member the value type names
    def __init__(self, **members: int) -> None:
        self.__dict__.update(members)


@dataclass
class _FieldValue:
    fieldId: int  # noqa: N815 - NVML's field names
    nvmlReturn: int  # noqa: N815
    valueType: int = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG  # noqa: N815
    value: _Value = field(default_factory=_Value)


@dataclass
class _Sample:
    timeStamp: int  # noqa: N815
    sampleValue: _Value  # noqa: N815


class FakeNvml:
    """Builds a ``pynvml`` module over a list of :class:`FakeGpu`."""

    def __init__(self, gpus: list[FakeGpu], library: bool = True) -> None:
        self.gpus = gpus
        self.library = library
        self.initialised = False
        self.module = self._build()

    def _gpu(self, handle: _Handle) -> FakeGpu:
        if not self.initialised:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        return self.gpus[handle.index]

    def _build(self) -> types.ModuleType:
        m = types.ModuleType("pynvml")
        m.__dict__.update(
            {k: v for k, v in globals().items() if k.startswith(("NVML_", "NVMLError"))},
        )
        m.NVML_TEMPERATURE_GPU = 0
        m.NVML_CLOCK_SM = 1
        m.NVML_GPU_UTILIZATION_SAMPLES = 1
        m.NVML_FI_DEV_PCIE_COUNT_TX_BYTES = 197
        m.NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 198

        def nvml_init() -> None:
            if not self.library:
                raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
            self.initialised = True

        def device_count() -> int:
            if not self.initialised:
                raise NVMLError(NVML_ERROR_UNINITIALIZED)
            return len(self.gpus)

        def handle_by_index(index: int) -> _Handle:
            if not self.initialised:
                raise NVMLError(NVML_ERROR_UNINITIALIZED)
            if not 0 <= index < len(self.gpus):
                raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
            return _Handle(index)

        def handle_by_uuid(uuid: str) -> _Handle:
            if not self.initialised:
                raise NVMLError(NVML_ERROR_UNINITIALIZED)
            for index, gpu in enumerate(self.gpus):
                if gpu.uuid == uuid:
                    return _Handle(index)
            raise NVMLError(NVML_ERROR_NOT_FOUND)

        def memory_info(handle: _Handle) -> Any:
            gpu = self._gpu(handle)
            return types.SimpleNamespace(
                total=gpu.memory_total, used=gpu.memory_used, free=gpu.memory_total - gpu.memory_used
            )

        def energy(handle: _Handle) -> int:
            gpu = self._gpu(handle)
            if gpu.energy_mj is None:
                raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
            return gpu.energy_mj

        def field_values(handle: _Handle, ids: list[int]) -> list[_FieldValue]:
            gpu = self._gpu(handle)
            out = []
            for fid in ids:
                counter = {197: gpu.pcie_tx, 198: gpu.pcie_rx}.get(fid)
                if counter is None:
                    out.append(_FieldValue(fid, NVML_ERROR_NOT_SUPPORTED))
                else:
                    out.append(_FieldValue(fid, NVML_SUCCESS, value=_Value(ullVal=counter)))
            return out

        def samples(handle: _Handle, kind: int, since: int) -> tuple[int, list[_Sample]]:
            gpu = self._gpu(handle)
            newer = [_Sample(ts, _Value(uiVal=v)) for ts, v in gpu.utilization_samples if ts > since]
            if not newer:
                raise NVMLError(NVML_ERROR_NOT_FOUND)
            return NVML_VALUE_TYPE_UNSIGNED_INT, newer

        def system_call(value: Any) -> Any:
            def call() -> Any:
                if not self.initialised:
                    raise NVMLError(NVML_ERROR_UNINITIALIZED)
                return value

            return call

        m.nvmlInit = nvml_init
        m.nvmlShutdown = lambda: None
        m.nvmlDeviceGetCount = device_count
        m.nvmlDeviceGetHandleByIndex = handle_by_index
        m.nvmlDeviceGetHandleByUUID = handle_by_uuid
        m.nvmlDeviceGetName = lambda h: self._gpu(h).name
        m.nvmlDeviceGetUUID = lambda h: self._gpu(h).uuid
        m.nvmlDeviceGetMemoryInfo = memory_info
        m.nvmlDeviceGetCudaComputeCapability = lambda h: self._gpu(h).capability
        m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=self._gpu(h).bus_id.encode())
        m.nvmlDeviceGetTotalEnergyConsumption = energy
        m.nvmlDeviceGetFieldValues = field_values
        m.nvmlDeviceGetSamples = samples
        m.nvmlDeviceGetTemperature = lambda h, sensor: self._gpu(h).temperature_c
        m.nvmlDeviceGetClockInfo = lambda h, clock: self._gpu(h).clock_sm_mhz
        m.nvmlDeviceGetMaxClockInfo = lambda h, clock: self._gpu(h).max_clock_sm_mhz

        def power_limit(handle: _Handle) -> int:
            gpu = self._gpu(handle)
            if gpu.power_limit_mw is None:
                raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
            return gpu.power_limit_mw

        m.nvmlDeviceGetEnforcedPowerLimit = power_limit
        m.NVML_NVLINK_MAX_LINKS = 18

        def nvlink_state(handle: _Handle, link: int) -> int:
            if link >= self._gpu(handle).nvlinks:
                raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
            return 1

        def pcie(name: str) -> Any:
            def read(handle: _Handle) -> int:
                value = getattr(self._gpu(handle), name)
                if value is None:
                    raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
                return int(value)

            return read

        m.nvmlDeviceGetNvLinkState = nvlink_state
        m.nvmlDeviceGetNvLinkVersion = lambda h, link: self._gpu(h).nvlink_version
        m.nvmlDeviceGetMaxPcieLinkGeneration = pcie("pcie_generation")
        m.nvmlDeviceGetMaxPcieLinkWidth = pcie("pcie_width")
        m.nvmlSystemGetDriverVersion = system_call("570.124.06")
        m.nvmlSystemGetCudaDriverVersion = system_call(12080)
        return m


@dataclass
class FakeProperties:
    """What ``torch.cuda.get_device_properties`` returns, for the fields the plugin reads."""

    name: str
    major: int
    minor: int
    total_memory: int
    multi_processor_count: int
    uuid: str


class FakeCuda:
    """``torch.cuda`` over :class:`FakeGpu` s, for the functions the plugin calls: devices are the visible ones."""

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.current: int | None = None
        self.peak_allocated = 123 * 2**20
        self.peak_reserved = 256 * 2**20
        self.resets = 0
        self.initialised_by: str | None = None  # what created a CUDA context other than set_device

    def index(self, device: torch.device | int | None) -> int:
        if isinstance(device, torch.device):
            device = device.index
        if device is None:
            device = self.current or 0
        if not 0 <= device < len(self.gpus):  # torch: "Invalid device id" / "invalid device ordinal"
            raise RuntimeError(f"CUDA error: invalid device ordinal {device}")
        return device

    def set_device(self, device: int) -> None:
        self.current = self.index(device)

    def properties(self, device: torch.device | int | None = None) -> FakeProperties:
        gpu = self.gpus[self.index(device)]
        uuid = gpu.uuid.removeprefix("GPU-")  # torch prints UUIDs without NVML's prefix
        return FakeProperties(gpu.name, *gpu.capability, gpu.memory_total, gpu.multiprocessors, uuid)

    def cudnn_version(self) -> int:
        self.initialised_by = self.initialised_by or "torch.backends.cudnn.version()"
        return 91900

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        cuda = torch.cuda
        monkeypatch.setattr(torch.version, "cuda", "12.8")
        monkeypatch.setattr(torch.version, "hip", None)
        monkeypatch.setattr(cuda, "is_available", lambda: bool(self.gpus))
        monkeypatch.setattr(cuda, "device_count", lambda: len(self.gpus))
        monkeypatch.setattr(
            cuda, "is_initialized", lambda: self.current is not None or bool(self.initialised_by)
        )
        # torch 2.11 on an H200: torch.backends.cudnn.version() initialises CUDA (torch.cuda.is_initialized()
        # turned True after it, and after nothing else the plugin asks); is_available() does not
        monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
        monkeypatch.setattr(torch.backends.cudnn, "version", self.cudnn_version)
        monkeypatch.setattr(cuda, "set_device", self.set_device)
        monkeypatch.setattr(cuda, "current_device", lambda: self.index(None))
        monkeypatch.setattr(cuda, "get_device_properties", self.properties)
        monkeypatch.setattr(cuda, "get_device_capability", lambda d=None: self.gpus[self.index(d)].capability)
        monkeypatch.setattr(cuda, "max_memory_allocated", lambda d=None: self.peak_allocated)
        monkeypatch.setattr(cuda, "max_memory_reserved", lambda d=None: self.peak_reserved)
        monkeypatch.setattr(
            cuda, "reset_peak_memory_stats", lambda d=None: setattr(self, "resets", self.resets + 1)
        )


def a100(index: int = 0, **overrides: Any) -> FakeGpu:
    values: dict[str, Any] = {
        "name": "NVIDIA A100-SXM4-80GB",
        "uuid": f"GPU-a100{index:04d}-1111-2222-3333-444455556666",
        "capability": (8, 0),
        "memory_total": 80 * 2**30,
        "bus_id": f"00000000:{0x10 + index:02X}:00.0",
    }
    values.update(overrides)
    return FakeGpu(**values)


def h200(index: int = 0, **overrides: Any) -> FakeGpu:
    """As an H200 SXM reported itself on 2026-11-23 (driver 580.159.04): NVML's total is the whole HBM,
    150754820096 bytes; CUDA's total_memory (what the allocator may use) was 150109880320."""
    values: dict[str, Any] = {
        "name": "NVIDIA H200",
        "uuid": f"GPU-310d54ad-6d25-2052-b51f-13cae491{index:04d}",
        "capability": (9, 0),
        "memory_total": 150754820096,
        "multiprocessors": 132,
        "bus_id": f"00000000:00:{0x06 + index:02X}.0",
        "clock_sm_mhz": 1980,
    }
    values.update(overrides)
    return FakeGpu(**values)


def v100(index: int = 0, **overrides: Any) -> FakeGpu:
    values: dict[str, Any] = {
        "name": "Tesla V100-SXM2-32GB",
        "uuid": f"GPU-v100{index:04d}-1111-2222-3333-444455556666",
        "capability": (7, 0),
        "memory_total": 32 * 2**30,
        "multiprocessors": 80,
        "pcie_tx": None,
        "pcie_rx": None,
    }
    values.update(overrides)
    return FakeGpu(**values)


# Installing the stand-ins (helpers rather than fixtures: plugin test folders keep no conftest.py, whose module
# name would clash with the core's when all suites run in one pytest session).
def install_nvml(monkeypatch: pytest.MonkeyPatch, gpus: list[FakeGpu], library: bool = True) -> FakeNvml:
    """``pynvml`` reporting ``gpus`` (or, with ``library=False``, a driver without libnvidia-ml)."""
    from accelbench_cuda import nvml

    fake = FakeNvml(gpus, library=library)
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    monkeypatch.setattr(nvml, "_session", None)  # as in a fresh process: NVML not initialised yet
    return fake


def install_gpus(monkeypatch: pytest.MonkeyPatch, gpus: list[FakeGpu]) -> tuple[FakeNvml, FakeCuda]:
    """A CUDA build of torch on a machine with ``gpus``: NVML and torch.cuda both see them."""
    nvml = install_nvml(monkeypatch, gpus)
    cuda = FakeCuda(gpus)
    cuda.install(monkeypatch)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return nvml, cuda


def remove_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine where nvidia-ml-py is not installed: ``import pynvml`` raises ImportError."""
    from accelbench_cuda import nvml

    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(nvml, "_session", None)
