"""The IPU backend's hook implementations (entry point ``ipu`` in the ``accelbench`` group).

Only what differs from ``accelbench.backends.defaults``: those use ``torch.accelerator``, which knows
nothing of IPUs. poptorch is never imported when this module loads, so the plugin loads (and reports no
device, with the reason) on any machine. IPU memory comes from the compile-time graph profile of the executor
this plugin object built last; it is the reading every epoch reports (nothing accumulates per epoch).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import TYPE_CHECKING

from accelbench import hookimpl
from accelbench.config import RunOption
from accelbench.devices import (
    NO_COLLECTIVE,
    BackendInfo,
    DeviceInfo,
    EpochReadings,
    NoCollective,
    PeakFigures,
)
from accelbench_ipu import detect, memory, peaks, settings
from accelbench_ipu.layout import STRATEGIES
from accelbench_ipu.precision import SUPPORTED, ipu_precision_plan

if TYPE_CHECKING:
    import torch

    from accelbench.engine.executor import Executor, ExecutorRequest
    from accelbench.precision import PrecisionPlan

DESCRIPTION = (
    "Graphcore IPUs through PopTorch: pipelined, sharded, serial-phased and parallel-phased execution, "
    "replication, compile time measured apart."
)


class IpuBackend:
    """The IPU backend. The graph profile's memory reading of the executor it built lives here."""

    accelbench_contract = "2.1"

    def __init__(self) -> None:
        self.graph_memory: memory.GraphMemory = memory.NOT_COMPILED

    @hookimpl
    def accelbench_backend(self) -> BackendInfo:
        note = (
            ""
            if importlib.util.find_spec("poptorch") is not None
            else f" Not usable here: {detect.SDK_NOTE}."
        )
        return BackendInfo(
            name="ipu", device_type="ipu", device_unit="IPU", priority=80, description=DESCRIPTION + note
        )

    @hookimpl
    def accelbench_recorded_environment(self) -> list[str]:
        return ["POPLAR_*", "POPTORCH_*", "IPUOF_*", "POPART_*", "GCDA_*"]

    @hookimpl
    def accelbench_run_options(self) -> list[RunOption]:
        return settings.run_options()

    @hookimpl
    def accelbench_detect_devices(self) -> list[DeviceInfo]:
        return detect.devices()

    @hookimpl
    def accelbench_runtime_versions(self) -> dict[str, str]:
        import torch

        found = detect.probe()
        versions = {"python": sys.version.split()[0], "torch": torch.__version__}
        versions["poptorch"] = found.poptorch or f"not available ({found.error})"
        if found.stand_in:
            versions["poptorch"] += " (test stand-in, not Graphcore's)"
        sdk = os.environ.get("POPLAR_SDK_ENABLED")
        if sdk:
            versions["poplar_sdk"] = sdk  # the SDK enable script's install path, which names its version
        for key in ("driver version", "firmware version"):
            if key in found.board:
                versions[f"ipu_{key.replace(' ', '_')}"] = found.board[key]
        versions["pva"] = "available" if memory.pva_available() else "not importable (IPU memory unknown)"
        return versions

    @hookimpl
    def accelbench_setup_device(self, device_type: str, local_rank: int) -> torch.device:
        import torch

        # PopTorch takes host tensors and streams them to the IPUs itself: the runner's batches stay on the host.
        return torch.device("cpu")

    @hookimpl
    def accelbench_collective_backend(self, device: torch.device) -> NoCollective:
        return NO_COLLECTIVE  # replication is a PopTorch option: one process drives every IPU

    @hookimpl
    def accelbench_supported_precisions(self, device: torch.device) -> list[str]:
        return list(SUPPORTED)

    @hookimpl
    def accelbench_precision_plan(self, precision: str, device: torch.device) -> PrecisionPlan:
        # PopTorch's defaults (float partials, no stochastic rounding); the executor's effective_precision
        # carries the run's --partials / --stochastic-rounding / --ipu-loss-scaling into the record.
        return ipu_precision_plan(precision)

    @hookimpl
    def accelbench_supported_strategies(self) -> list[str]:
        return list(STRATEGIES)

    @hookimpl
    def accelbench_executor(self, request: ExecutorRequest) -> Executor:
        from accelbench_ipu.executor import PopTorchExecutor

        self.graph_memory = memory.NOT_COMPILED
        return PopTorchExecutor(request, on_memory=self._compiled)

    def _compiled(self, reading: memory.GraphMemory) -> None:
        self.graph_memory = reading

    @hookimpl
    def accelbench_synchronize(self, device: torch.device) -> None:
        """Nothing to wait for: PopTorch calls return only when the IPUs are done."""

    @hookimpl
    def accelbench_epoch_start(self, device: torch.device) -> None:
        """Nothing to reset: the memory figure comes from the compile-time profile, and IPUs have no energy
        counter PopTorch exposes."""

    @hookimpl
    def accelbench_epoch_end(self, device: torch.device) -> EpochReadings:
        return EpochReadings(memory=self.graph_memory.stats())

    @hookimpl
    def accelbench_peak_figures(self, device: DeviceInfo, precision: PrecisionPlan) -> PeakFigures | None:
        return peaks.peak_figures(device, precision)

    @hookimpl
    def accelbench_known_devices(self) -> list[DeviceInfo]:
        return peaks.known_devices()
