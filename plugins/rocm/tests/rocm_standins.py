"""Faithful stand-ins for what the ROCm plugin calls without AMD hardware: ``amdsmi`` and torch's HIP side.

The ``amdsmi`` stand-in keeps the real package's documented behaviour (amdsmi 7.x, amdsmi_interface.py): calls
before ``amdsmi_init`` fail with AMDSMI_STATUS_NOT_INIT, ``amdsmi_init`` fails without the amdgpu driver, every
per-GPU call rejects anything but a processor handle with AmdSmiParameterException, memory calls reject a memory
type that is not an ``AmdSmiMemoryType``, unsupported readings raise AmdSmiLibraryException(NOT_SUPPORTED),
``amdsmi_get_gpu_asic_info`` reports ``gfx`` + hex of the target version and "N/A" for an empty name, and energy
comes as an accumulator with its resolution in microjoules. Between two GPUs, ``amdsmi_topo_get_link_type`` answers
``{"hops", "type"}`` with the KFD io-link type (1 PCIe, 2 xGMI), and
``amdsmi_get_minmax_bandwidth_between_processors`` answers only for a direct xGMI peer (NOT_SUPPORTED otherwise),
in MB/s as the kernel fills the io link: one x16 link at 25 Gbps (50000) as the minimum, that times the links
between the pair as the maximum.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import pytest
import torch

AMDSMI_STATUS_NOT_SUPPORTED = 2
AMDSMI_STATUS_INVAL = 1
IOLINK_TYPE_PCIEXPRESS = 1
IOLINK_TYPE_XGMI = 2
XGMI_LINK_MBYTES = 16 * 25000 // 8  # amdgpu_amdkfd_get_xgmi_bandwidth_mbytes: one x16 link at 25 Gbps
AMDSMI_STATUS_NOT_INIT = 32
AMDSMI_STATUS_DRIVER_NOT_LOADED = 48


class AmdSmiException(Exception):
    """Base smi exception class"""


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code: int) -> None:
        super().__init__(err_code)
        self.err_code = abs(err_code)

    def get_error_code(self) -> int:
        return self.err_code

    def __str__(self) -> str:
        return f"Error code:\n\t{self.err_code} | AMDSMI error {self.err_code}"


class AmdSmiParameterException(AmdSmiException):
    def __init__(self, received: Any, expected: Any) -> None:
        super().__init__(f"Invalid parameter: received {received!r}, expected {expected}")


class AmdSmiMemoryType(IntEnum):
    VRAM = 0
    VIS_VRAM = 1
    GTT = 2


class AmdSmiTemperatureType(IntEnum):
    EDGE = 0
    HOTSPOT = 1
    VRAM = 2


class AmdSmiTemperatureMetric(IntEnum):
    CURRENT = 0
    MAX = 1


class ProcessorHandle:  # amdsmi_wrapper.amdsmi_processor_handle: an opaque pointer
    def __init__(self, index: int) -> None:
        self.index = index


@dataclass
class FakeAmdGpu:
    """One GPU (one GCD on an MI250X) as amdsmi and HIP see it, with the counters a test advances."""

    name: str  # amdsmi market_name and torch's device name
    target_graphics_version: int  # e.g. 0x90A
    compute_units: int
    memory_total: int
    bdf: str
    memory_used: int = 0
    uuid: str = ""
    energy_accumulator: int | None = 10_000_000  # None: not supported (e.g. the second GCD of an MI250X)
    counter_resolution: float = 15.259  # microjoules per count, as the driver reports
    temperature_c: int = 45
    xgmi: dict[int, int] = field(default_factory=dict)  # amdsmi index of a direct xGMI peer -> links to it
    xgmi_bandwidth: bool = True  # False: the driver fills no io-link bandwidth (both 0)

    @property
    def gcn_arch_name(self) -> str:
        return f"gfx{self.target_graphics_version:x}:sramecc+:xnack-"


class FakeAmdSmi:
    """Builds an ``amdsmi`` module over a list of :class:`FakeAmdGpu`."""

    def __init__(self, gpus: list[FakeAmdGpu], driver: bool = True) -> None:
        self.gpus = gpus
        self.driver = driver
        self.initialised = False
        self.module = self._build()

    def _gpu(self, handle: Any) -> FakeAmdGpu:
        if not isinstance(handle, ProcessorHandle):
            raise AmdSmiParameterException(handle, ProcessorHandle)
        if not self.initialised:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_INIT)
        return self.gpus[handle.index]

    def _build(self) -> types.ModuleType:
        m = types.ModuleType("amdsmi")
        for cls in (AmdSmiException, AmdSmiLibraryException, AmdSmiParameterException, AmdSmiMemoryType,
                    AmdSmiTemperatureType, AmdSmiTemperatureMetric):  # fmt: skip
            setattr(m, cls.__name__, cls)

        def init() -> None:
            if not self.driver:
                raise AmdSmiLibraryException(AMDSMI_STATUS_DRIVER_NOT_LOADED)
            self.initialised = True

        def handles() -> list[ProcessorHandle]:
            if not self.initialised:
                raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_INIT)
            return [ProcessorHandle(i) for i in range(len(self.gpus))]

        def asic_info(handle: Any) -> dict[str, Any]:
            gpu = self._gpu(handle)
            return {
                "market_name": gpu.name or "N/A",
                "vendor_id": "0x1002",
                "device_id": "0x740c",
                "num_compute_units": gpu.compute_units,
                "target_graphics_version": "gfx" + hex(gpu.target_graphics_version)[2:],
            }

        def memory(kind: str):  # type: ignore[no-untyped-def]
            def call(handle: Any, mem_type: Any) -> int:
                gpu = self._gpu(handle)
                if not isinstance(mem_type, AmdSmiMemoryType):
                    raise AmdSmiParameterException(mem_type, AmdSmiMemoryType)
                return gpu.memory_total if kind == "total" else gpu.memory_used

            return call

        def energy(handle: Any) -> dict[str, Any]:
            gpu = self._gpu(handle)
            if gpu.energy_accumulator is None:
                raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
            return {"energy_accumulator": gpu.energy_accumulator, "counter_resolution": gpu.counter_resolution,
                    "timestamp": 0}  # fmt: skip

        def temperature(handle: Any, sensor: Any, metric: Any) -> int:
            gpu = self._gpu(handle)
            if not isinstance(sensor, AmdSmiTemperatureType) or not isinstance(
                metric, AmdSmiTemperatureMetric
            ):
                raise AmdSmiParameterException(
                    (sensor, metric), "AmdSmiTemperatureType, AmdSmiTemperatureMetric"
                )
            return gpu.temperature_c

        def link_type(src: Any, dst: Any) -> dict[str, int]:
            gpu, peer = self._gpu(src), self._gpu(dst)
            if gpu is peer:
                return {"hops": 0, "type": IOLINK_TYPE_PCIEXPRESS}
            if dst.index in gpu.xgmi:
                return {"hops": 1, "type": IOLINK_TYPE_XGMI}
            return {"hops": 2, "type": IOLINK_TYPE_PCIEXPRESS}  # through the host's root complex

        def minmax_bandwidth(src: Any, dst: Any) -> dict[str, int]:
            gpu, peer = self._gpu(src), self._gpu(dst)
            if gpu is peer:
                raise AmdSmiLibraryException(AMDSMI_STATUS_INVAL)
            if dst.index not in gpu.xgmi:
                raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
            if not gpu.xgmi_bandwidth:
                return {"min_bandwidth": 0, "max_bandwidth": 0}
            return {
                "min_bandwidth": XGMI_LINK_MBYTES,
                "max_bandwidth": gpu.xgmi[dst.index] * XGMI_LINK_MBYTES,
            }

        m.amdsmi_init = init
        m.amdsmi_shut_down = lambda: setattr(self, "initialised", False)
        m.amdsmi_get_processor_handles = handles
        m.amdsmi_get_gpu_asic_info = asic_info
        m.amdsmi_get_gpu_memory_total = memory("total")
        m.amdsmi_get_gpu_memory_usage = memory("used")
        m.amdsmi_get_gpu_device_uuid = lambda h: self._gpu(h).uuid
        m.amdsmi_get_gpu_device_bdf = lambda h: self._gpu(h).bdf
        m.amdsmi_get_energy_count = energy
        m.amdsmi_get_temp_metric = temperature
        m.amdsmi_topo_get_link_type = link_type
        m.amdsmi_get_minmax_bandwidth_between_processors = minmax_bandwidth
        m.amdsmi_get_gpu_driver_info = lambda h: {
            "driver_name": "amdgpu",
            "driver_version": "6.10.5",
            "driver_date": "N/A",
        }
        m.amdsmi_get_lib_version = lambda: {"major": 25, "minor": 5, "release": 1, "build": "0"}
        return m


@dataclass
class FakeHipProperties:
    name: str
    gcnArchName: str  # noqa: N815 - torch's field name
    total_memory: int
    multi_processor_count: int


class FakeHip:
    """torch.cuda on a ROCm build of torch, over the visible :class:`FakeAmdGpu` s."""

    def __init__(self, gpus: list[FakeAmdGpu]) -> None:
        self.gpus = gpus
        self.current: int | None = None
        self.peak_allocated = 77 * 2**20

    def index(self, device: torch.device | int | None) -> int:
        if isinstance(device, torch.device):
            device = device.index
        if device is None:
            device = self.current or 0
        if not 0 <= device < len(self.gpus):
            raise RuntimeError(f"HIP error: invalid device ordinal {device}")
        return device

    def set_device(self, device: int) -> None:
        self.current = self.index(device)

    def properties(self, device: torch.device | int | None = None) -> FakeHipProperties:
        gpu = self.gpus[self.index(device)]
        return FakeHipProperties(gpu.name, gpu.gcn_arch_name, gpu.memory_total, gpu.compute_units)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        cuda = torch.cuda
        monkeypatch.setattr(torch.version, "hip", "6.4.43482")
        monkeypatch.setattr(torch.version, "cuda", None)
        monkeypatch.setattr(cuda, "is_available", lambda: bool(self.gpus))
        monkeypatch.setattr(cuda, "device_count", lambda: len(self.gpus))
        monkeypatch.setattr(cuda, "is_initialized", lambda: self.current is not None)
        monkeypatch.setattr(cuda, "set_device", self.set_device)
        monkeypatch.setattr(cuda, "current_device", lambda: self.index(None))
        monkeypatch.setattr(cuda, "get_device_properties", self.properties)
        monkeypatch.setattr(cuda, "max_memory_allocated", lambda d=None: self.peak_allocated)
        monkeypatch.setattr(cuda, "max_memory_reserved", lambda d=None: 2 * self.peak_allocated)
        monkeypatch.setattr(cuda, "reset_peak_memory_stats", lambda d=None: None)


def mi250x_gcds() -> list[FakeAmdGpu]:
    """One MI250X: two GCDs, each its own device with 110 CUs and 64 GiB; only the first reports energy. The GCDs
    are joined by 4 xGMI links inside the package (AMD CDNA 2 white paper: 400 GB/s bidirectional)."""
    return [
        FakeAmdGpu(
            "AMD Instinct MI250X/MI250", 0x90A, 110, 64 * 2**30, "0000:c1:00.0", uuid="a1", xgmi={1: 4}
        ),
        FakeAmdGpu(
            "AMD Instinct MI250X/MI250",
            0x90A,
            110,
            64 * 2**30,
            "0000:c6:00.0",
            uuid="a2",
            energy_accumulator=None,
            xgmi={0: 4},
        ),
    ]


def mi300x(bdf: str = "0000:05:00.0") -> FakeAmdGpu:
    return FakeAmdGpu("AMD Instinct MI300X", 0x942, 304, 192 * 2**30, bdf)


def mi300x_platform(count: int = 8) -> list[FakeAmdGpu]:
    """An 8-GPU MI300X OAM platform: every GPU one xGMI link to each of the others."""
    gpus = [mi300x(f"0000:{0x05 + 0x10 * i:02x}:00.0") for i in range(count)]
    for i, gpu in enumerate(gpus):
        gpu.uuid = f"m{i}"
        gpu.xgmi = {j: 1 for j in range(count) if j != i}
    return gpus


def install_amdsmi(
    monkeypatch: pytest.MonkeyPatch, gpus: list[FakeAmdGpu], driver: bool = True
) -> FakeAmdSmi:
    """``amdsmi`` reporting ``gpus`` (or, with ``driver=False``, a machine without the amdgpu driver)."""
    from accelbench_rocm import smi

    fake = FakeAmdSmi(gpus, driver=driver)
    monkeypatch.setitem(sys.modules, "amdsmi", fake.module)
    monkeypatch.setattr(
        smi, "_session", None
    )  # as in a fresh process (the plugin object's handles are new too)
    return fake


def install_gpus(monkeypatch: pytest.MonkeyPatch, gpus: list[FakeAmdGpu]) -> tuple[FakeAmdSmi, FakeHip]:
    """A ROCm build of torch on a machine with ``gpus``: amdsmi and torch.cuda (HIP) both see them."""
    for name in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    fake = install_amdsmi(monkeypatch, gpus)
    hip = FakeHip(gpus)
    hip.install(monkeypatch)
    return fake, hip


def remove_amdsmi(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine where the amdsmi package is not installed."""
    from accelbench_rocm import smi

    monkeypatch.setitem(sys.modules, "amdsmi", None)
    monkeypatch.setattr(smi, "_session", None)
