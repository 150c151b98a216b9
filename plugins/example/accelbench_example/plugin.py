"""accelbench hooks for example devices. Registered as entry point ``example`` in the ``accelbench`` group.

Made from accelbench's plugin template (contract 2.0). The plugin is one object whose methods are the hooks, so
what a backend keeps between hooks (an open management-library session, the counters of the running epoch) lives
on it. Each hook here is one a vendor usually needs; ``TODO(vendor)`` marks where your runtime's calls go (see
docs/writing-a-backend-plugin.md). As generated, the plugin trains on CPU tensors (device type "cpu"), so it runs,
and passes the conformance kit, on any machine. Hooks you do not implement fall back to the core defaults
(accelbench.backends.defaults: torch.accelerator and torch.distributed).
"""

from __future__ import annotations

import platform
from typing import TYPE_CHECKING

from accelbench import hookimpl
from accelbench.devices import BackendInfo, DeviceInfo, EpochReadings, MemoryStats, PeakFigures
from accelbench.errors import BackendError
from accelbench_example import __version__

if TYPE_CHECKING:
    import torch

    from accelbench.precision import PrecisionPlan

DEVICE_TYPE = "cpu"

# Dense peak FLOP/s and bandwidth by device name, from the vendor's datasheets: {name: (bf16, fp32, bytes/s)}.
# TODO(vendor): fill in; a device missing here gets MFU "unknown" (never a guess).
PEAKS: dict[str, tuple[float, float, float]] = {}
NO_PEAK = "unknown (CPU tensors have no allocator peak counter)"


class ExampleBackend:
    """The example backend: detection, device binding, precisions, epoch readings and peak figures."""

    accelbench_contract = "2.0"  # the plugin contract this plugin implements (accelbench.CONTRACT_VERSION)

    def __init__(self) -> None:
        # TODO(vendor): state the hooks share, e.g. the energy counter of each device at its epoch's start.
        self._energy_at_start: dict[int, float] = {}

    @hookimpl
    def accelbench_backend(self) -> BackendInfo:
        return BackendInfo(
            name="example",
            device_type=DEVICE_TYPE,
            device_unit="the host CPU, standing in for an accelerator",
            priority=-10,
            description="example devices (made from the accelbench plugin template).",
        )

    @hookimpl
    def accelbench_recorded_environment(self) -> list[str]:
        # TODO(vendor): the environment variables that change your device's performance (visible devices, ...).
        return ["EXAMPLE_*"]

    @hookimpl
    def accelbench_detect_devices(self) -> list[DeviceInfo]:
        # TODO(vendor): ask your management library (or a probe subprocess) which devices are present. Never start
        # the device runtime here and never raise when the library or hardware is absent: return [].
        if DEVICE_TYPE != "cpu":
            return []
        return [
            DeviceInfo(
                index=0,
                name=f"host CPU ({platform.machine()}) standing in for example hardware",
                arch=platform.machine(),
                details={"stand_in": "true"},
            )
        ]

    @hookimpl
    def accelbench_runtime_versions(self) -> dict[str, str]:
        import torch

        # TODO(vendor): driver, runtime and library versions worth recording.
        return {"torch": torch.__version__, "accelbench_example": __version__}

    @hookimpl
    def accelbench_setup_device(self, device_type: str, local_rank: int) -> torch.device:
        import torch

        if DEVICE_TYPE == "cpu":
            return torch.device("cpu")
        # TODO(vendor): apply visible-device variables for local_rank before the runtime starts, then bind.
        count = torch.accelerator.device_count()
        if local_rank >= count:
            raise BackendError(
                f"local rank {local_rank} needs device {local_rank} but this process sees {count}"
            )
        torch.accelerator.set_device_index(local_rank)
        return torch.device(DEVICE_TYPE, local_rank)

    @hookimpl
    def accelbench_supported_precisions(self, device: torch.device) -> list[str]:
        # TODO(vendor): the precisions the device runs natively (not emulated), from accelbench.precision.PRECISIONS.
        return ["fp32", "bf16-mixed"]

    @hookimpl
    def accelbench_precision_plan(self, precision: str, device: torch.device) -> PrecisionPlan:
        from accelbench.precision import standard_plan

        # TODO(vendor): set any global math switch your device has, and record the math really in effect.
        return standard_plan(precision, matmul_math="ieee-fp32")

    @hookimpl
    def accelbench_epoch_start(self, device: torch.device) -> None:
        # TODO(vendor): reset your allocator's peak, and read cumulative counters (energy) to difference at the end.
        if device.type != "cpu":
            import torch

            torch.accelerator.memory.reset_peak_memory_stats(device)

    @hookimpl
    def accelbench_epoch_end(self, device: torch.device) -> EpochReadings:
        if device.type == "cpu":  # CPU tensors have no allocator peak: unknown, never estimated
            return EpochReadings(memory=MemoryStats(peak_bytes=None, source=NO_PEAK))
        import torch

        # TODO(vendor): your allocator's peak since the epoch's start, device-level use from your management
        # library, and the energy your counter saw (an accelbench.devices.EnergyReading; None without a counter).
        memory = torch.accelerator.memory
        return EpochReadings(
            memory=MemoryStats(
                peak_bytes=int(memory.max_memory_allocated(device)),
                source="torch allocator peak (torch.accelerator.memory.max_memory_allocated)",
            )
        )

    @hookimpl
    def accelbench_peak_figures(self, device: DeviceInfo, precision: PrecisionPlan) -> PeakFigures | None:
        figures = PEAKS.get(device.name)
        if figures is None:
            return None
        bf16, fp32, bandwidth = figures
        sixteen = precision.autocast_dtype == "bfloat16" or precision.param_dtype == "bfloat16"
        return PeakFigures(
            flops_per_s=bf16 if sixteen else fp32,
            memory_bandwidth_bytes_per_s=bandwidth,
            source=f"accelbench-example table: {device.name}, {'bf16' if sixteen else 'fp32'}",
        )
