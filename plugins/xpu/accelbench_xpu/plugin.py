"""accelbench hooks for Intel GPUs. Registered as entry point ``xpu`` in the ``accelbench`` group.

Implements what differs from the core defaults: detection (in a subprocess, card or tile recorded), the software
path (stock torch.xpu + xccl, or IPEX + oneCCL's ccl) chosen and recorded, one device per local rank through
ZE_AFFINITY_MASK, precisions from the device's bf16 support, allocator and Level Zero memory figures, temperature,
the Max 1550 peak table, and versions. Synchronisation and memory go through ``torch.xpu`` directly, which works
on both paths.

Telemetry: torch.xpu's power and utilisation readings measure the 100 ms after the call, and the epoch's end comes
after its closing synchronisation, when the GPU is idle; so they are sampled through the epoch by
:class:`~accelbench_xpu.sampler.EpochSampler`, started at the epoch's start, and averaged. Energy comes from the
kernel driver's hwmon counter (:mod:`accelbench_xpu.hwmon`) where the card is known.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelbench.contract import (
    Backend,
    BackendInfo,
    DeviceInfo,
    EnergyReading,
    EpochReadings,
    NoCollective,
    PeakFigures,
    PrecisionPlan,
    Scalar,
    World,
    allocator_memory,
    hookimpl,
)
from accelbench.devices import CounterFile
from accelbench.errors import BackendError, ConfigError
from accelbench_xpu import __version__, detect, hwmon, level_zero, paths, peaks
from accelbench_xpu.sampler import EpochSampler

if TYPE_CHECKING:
    import torch

TF32_ENV = "ACCELBENCH_TF32"

accelbench_contract = "3.0"


@hookimpl
def accelbench_register_backends(register: Callable[[type[Backend]], None]) -> None:
    register(XpuBackend)


class XpuBackend(Backend):
    """The XPU backend. What device binding did about ZE_AFFINITY_MASK, and each device's running epoch (its
    power/utilisation sampler and energy counter reading) live here."""

    info = BackendInfo(
        name="xpu",
        device_type="xpu",
        device_unit="tile (stack) in FLAT mode, card in COMPOSITE mode (ZE_FLAT_DEVICE_HIERARCHY): see each device",
        priority=100,
        description="Intel GPUs: stock torch.xpu + xccl, or Intel Extension for PyTorch + oneCCL (ccl).",
    )

    def __init__(self, drm: Path = hwmon.DRM) -> None:
        super().__init__()
        self._pinning: str | None = None  # what setup_device did about ZE_AFFINITY_MASK, for the record
        self._samplers: dict[int, EpochSampler] = {}  # device index -> the running epoch's sampler
        self._energy_start: dict[int, tuple[CounterFile, int]] = {}
        self._drm = drm

    def recorded_environment(self) -> list[str]:
        return ["ZE_*", "ONEAPI_DEVICE_SELECTOR", "SYCL_*", "CCL_*", "FI_*", "IPEX_*", paths.PATH_ENV]

    def detect_devices(self) -> list[DeviceInfo]:
        return detect.detect_devices()

    def runtime_versions(self) -> dict[str, str]:
        import torch

        path = paths.resolve()
        versions = {"torch": torch.__version__, "xpu_path": path.describe(), "accelbench_xpu": __version__}
        for dist in ("intel-extension-for-pytorch", "oneccl_bind_pt"):
            with contextlib.suppress(importlib.metadata.PackageNotFoundError):
                versions[dist] = importlib.metadata.version(dist)
        versions[level_zero.HIERARCHY_ENV] = level_zero.hierarchy(os.environ)
        versions[level_zero.AFFINITY_ENV] = os.environ.get(level_zero.AFFINITY_ENV, "unset")
        if self._pinning:
            versions["device_pinning"] = self._pinning
        if (
            hasattr(torch, "xpu") and torch.xpu.is_initialized()
        ):  # driver version without starting the runtime
            versions["gpu_driver"] = str(getattr(torch.xpu.get_device_properties(), "driver_version", ""))
        return versions

    def setup_device(self, world: World, options: Mapping[str, Scalar]) -> torch.device:
        local_rank = world.local_rank
        import torch

        path = paths.resolve()
        if path.device is None:
            raise BackendError(
                f"torch {torch.__version__} cannot drive Intel GPUs: install an XPU build of torch "
                "(https://pytorch.org/get-started/locally/) or, on older stacks, intel_extension_for_pytorch"
            )
        started = hasattr(torch, "xpu") and torch.xpu.is_initialized()
        index, self._pinning = level_zero.pin_local_rank(
            os.environ, local_rank, started
        )  # before the runtime starts
        if path.device == "ipex":
            importlib.import_module(paths.IPEX)  # the legacy path: IPEX provides torch.xpu
        count = torch.xpu.device_count()
        if index >= count:
            raise BackendError(
                f"local rank {local_rank} needs XPU device {index} but this process sees {count} "
                f"({level_zero.AFFINITY_ENV}={os.environ.get(level_zero.AFFINITY_ENV)!r}); start fewer processes "
                "per node"
            )
        torch.xpu.set_device(index)
        return torch.device("xpu", index)

    def collective_backend(self, device: torch.device) -> str | NoCollective:
        path = paths.resolve()
        if path.collective == "ccl":
            importlib.import_module(paths.ONECCL)  # registers the "ccl" backend with torch.distributed
        if path.collective is None:
            # neither xccl nor the oneCCL bindings: torch's default answers, and a multi-device run then fails with
            # torch's own message when it creates the process group
            return super().collective_backend(device)
        return path.collective

    def supported_precisions(self, device: torch.device) -> list[str]:
        fp16, bf16 = _half_support(device)
        return ["fp32"] + (["fp16-mixed"] if fp16 else []) + (["bf16-mixed", "bf16-true"] if bf16 else [])

    def precision_plan(
        self, precision: str, device: torch.device, options: Mapping[str, Scalar]
    ) -> PrecisionPlan:
        import torch

        from accelbench.contract import standard_plan

        if os.environ.get(TF32_ENV, "off").strip().lower() != "off":
            raise ConfigError(
                f"{TF32_ENV}={os.environ[TF32_ENV]!r}: the XPU plugin runs fp32 matmuls in IEEE fp32 only; "
                f"unset {TF32_ENV}"
            )
        onednn_matmul: Any = torch.backends.mkldnn.matmul  # type: ignore[attr-defined]  # torch >= 2.9; not in stubs
        onednn_matmul.fp32_precision = "ieee"  # oneDNN's fp32 math, explicit and recorded
        plan = standard_plan(precision, matmul_math="ieee-fp32")
        notes = [plan.notes] if plan.notes else []
        notes.append(f"oneDNN fp32 matmuls in IEEE fp32; {paths.resolve().describe()}")
        return plan.model_copy(update={"notes": "; ".join(notes)})

    def synchronize(self, device: torch.device) -> None:
        import torch

        torch.xpu.synchronize(device)

    def epoch_start(self, device: torch.device) -> None:
        import torch

        torch.xpu.reset_peak_memory_stats(device)
        index = _index(device)
        previous = self._samplers.pop(index, None)
        if previous is not None:  # an epoch that ended without a reading
            previous.stop()
        readings = {
            "power_w": lambda: torch.xpu.power_draw(device),
            "utilization_pct": lambda: torch.xpu.utilization(device),
        }
        self._samplers[index] = EpochSampler(readings).start()  # the epoch starts now
        counter = hwmon.the_counter(self._drm)
        start = counter.read() if counter else None
        if counter is not None and start is not None:
            self._energy_start[index] = (counter, start)

    def epoch_end(self, device: torch.device) -> EpochReadings:
        import torch

        used: int | None = None
        with contextlib.suppress(Exception):  # Level Zero Sysman (pyzes) absent, or no permission: unknown
            used = int(torch.xpu.device_memory_used(device))
        total = int(torch.xpu.get_device_properties(device).total_memory)
        memory = allocator_memory(torch.xpu, device, "torch XPU caching allocator", used, total)
        index = _index(device)
        sampler = self._samplers.pop(index, None)
        telemetry = sampler.stop() if sampler is not None else {}
        with contextlib.suppress(Exception):  # needs Level Zero Sysman (pyzes), sometimes elevated privileges
            telemetry["temperature_c"] = float(torch.xpu.temperature(device))
        return EpochReadings(memory=memory, energy=self._energy(index), telemetry=telemetry)

    def _energy(self, index: int) -> EnergyReading | None:
        started = self._energy_start.pop(index, None)
        if started is None:
            return None
        counter, start = started
        delta = counter.since(start)
        if delta is None:
            return None
        return EnergyReading(
            joules=delta / 1e6,
            domain=f"hwmon:{counter.name}",
            source=f"kernel hwmon energy counter of {counter.name} (energy1_input, uJ; the card's Level Zero "
            "power domain: both tiles of a two-tile card)",
        )

    def peak_figures(self, device: DeviceInfo, precision: PrecisionPlan) -> PeakFigures | None:
        return peaks.peak_for(device, precision)

    def known_devices(self) -> list[DeviceInfo]:
        return peaks.known_devices()


def _index(device: torch.device) -> int:
    import torch

    return device.index if device.index is not None else int(torch.xpu.current_device())


def _half_support(device: torch.device) -> tuple[bool, bool]:
    """(fp16, native bf16) of ``device``. Asked with an index-less device before the runtime starts (the
    launcher's preflight), it comes from detection, so the launcher starts no Level Zero runtime of its own."""
    import torch

    if device.index is not None or (hasattr(torch, "xpu") and torch.xpu.is_initialized()):
        props: Any = torch.xpu.get_device_properties(device)
        return bool(getattr(props, "has_fp16", True)), bool(getattr(props, "has_bfloat16_conversions", False))
    devices = detect.detect_devices()
    if not devices:
        raise BackendError("no Intel GPU is visible to ask what it supports (see `accelbench info`)")
    return (
        all(d.details.get("fp16") == "true" for d in devices),
        all(d.details.get("bf16") == "true" for d in devices),
    )
