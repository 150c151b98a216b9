"""The accelbench backend for example devices. Registered as entry point ``example`` in the ``accelbench`` group.

The plugin template's output with its TODOs done, for a pretend device: the host CPU standing in for an
accelerator (device type "cpu"), so it installs, loads and passes the conformance kit on any machine, and shows
what a finished plugin looks like. :class:`ExampleBackend` subclasses :class:`accelbench.contract.Backend`: every
method it does not override is the stock-PyTorch behaviour. A real vendor's version of each method is in
accelbench's plugins/cuda, plugins/gaudi and plugins/xla.
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from typing import TYPE_CHECKING

from accelbench.contract import (
    Backend,
    BackendInfo,
    DeviceInfo,
    EpochReadings,
    MemoryStats,
    PeakFigures,
    PrecisionPlan,
    hookimpl,
)
from accelbench_example import __version__

if TYPE_CHECKING:
    import torch

accelbench_contract = "3.3"

# Dense peak FLOP/s and bandwidth by device name, from the vendor's datasheet: {name: (bf16, fp32, bytes/s)}. The
# stand-in has no datasheet, so its MFU is "unknown" (never a guess).
PEAKS: dict[str, tuple[float, float, float]] = {}


@hookimpl
def accelbench_register_backends(register: Callable[[type[Backend]], None]) -> None:
    register(ExampleBackend)


class ExampleBackend(Backend):
    """The example backend: the host CPU standing in for an accelerator."""

    info = BackendInfo(
        name="example",
        device_type="cpu",
        device_unit="the host CPU, standing in for an accelerator",
        priority=-10,
        description="example devices (made from the accelbench plugin template).",
    )

    def detect_devices(self) -> list[DeviceInfo]:
        return [
            DeviceInfo(
                index=0,
                name=f"host CPU ({platform.machine()}) standing in for example hardware",
                arch=platform.machine(),
                details={"stand_in": "true"},
            )
        ]

    def runtime_versions(self) -> dict[str, str]:
        import torch

        return {"torch": torch.__version__, "accelbench_example": __version__}

    def supported_precisions(self, device: torch.device) -> list[str]:
        return ["fp32", "bf16-mixed"]

    def epoch_end(self, device: torch.device) -> EpochReadings:
        # CPU tensors have no allocator peak counter: unknown, never estimated; the stand-in has no energy counter
        return EpochReadings(
            memory=MemoryStats(peak_bytes=None, source="unknown (CPU tensors have no allocator peak counter)")
        )

    def peak_figures(self, device: DeviceInfo, precision: PrecisionPlan) -> PeakFigures | None:
        figures = PEAKS.get(device.name)
        if figures is None:
            return None
        bf16, fp32, bandwidth = figures
        sixteen = "bfloat16" in (precision.autocast_dtype, precision.param_dtype)
        return PeakFigures(
            flops_per_s=bf16 if sixteen else fp32,
            memory_bandwidth_bytes_per_s=bandwidth,
            source=f"accelbench-example table: {device.name}, {'bf16' if sixteen else 'fp32'}",
        )
