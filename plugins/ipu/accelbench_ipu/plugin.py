"""The IPU backend's hook implementations (entry point ``ipu`` in the ``accelbench`` group).

Only what differs from ``accelbench.backends.defaults``: those use ``torch.accelerator``, which knows
nothing of IPUs. poptorch is never imported when this module loads, so the plugin loads (and reports no
device, with the reason) on any machine.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import torch

from accelbench import hookimpl
from accelbench.config import RunOption
from accelbench.devices import BackendInfo, DeviceInfo, MemoryStats, PeakFigures
from accelbench.engine.executor import Executor, ExecutorRequest
from accelbench.precision import PrecisionPlan
from accelbench_ipu import detect, memory, peaks, settings
from accelbench_ipu.layout import STRATEGIES
from accelbench_ipu.precision import SUPPORTED, ipu_precision_plan

DESCRIPTION = (
    "Graphcore IPUs through PopTorch: pipelined, sharded, serial-phased and parallel-phased execution, "
    "replication, compile time measured apart."
)


@hookimpl
def accelbench_backend() -> BackendInfo:
    note = "" if importlib.util.find_spec("poptorch") is not None else f" Not usable here: {detect.SDK_NOTE}."
    return BackendInfo(
        name="ipu", device_type="ipu", device_unit="IPU", priority=80, description=DESCRIPTION + note
    )


@hookimpl
def accelbench_run_options() -> list[RunOption]:
    return settings.run_options()


@hookimpl
def accelbench_detect_devices() -> list[DeviceInfo]:
    return detect.devices()


@hookimpl
def accelbench_runtime_versions() -> dict[str, str]:
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
def accelbench_setup_device(device_type: str, local_rank: int) -> torch.device:
    # PopTorch takes host tensors and streams them to the IPUs itself: the runner's batches stay on the host.
    return torch.device("cpu")


@hookimpl
def accelbench_collective_backend(device: torch.device) -> str:
    return "none"  # replication is a PopTorch option: one process drives every IPU


@hookimpl
def accelbench_supported_precisions(device: torch.device) -> list[str]:
    return list(SUPPORTED)


@hookimpl
def accelbench_precision_plan(precision: str, device: torch.device) -> PrecisionPlan:
    # PopTorch's defaults (float partials, no stochastic rounding); the executor's effective_precision
    # carries the run's --partials / --stochastic-rounding / --ipu-loss-scaling into the record.
    return ipu_precision_plan(precision)


@hookimpl
def accelbench_supported_strategies() -> list[str]:
    return list(STRATEGIES)


@hookimpl
def accelbench_executor(request: ExecutorRequest) -> Executor:
    from accelbench_ipu.executor import PopTorchExecutor

    return PopTorchExecutor(request)


@hookimpl
def accelbench_synchronize(device: torch.device) -> bool:
    return True  # PopTorch calls return only when the IPUs are done


@hookimpl
def accelbench_reset_peak_memory(device: torch.device) -> bool:
    return True  # the figure comes from the compile-time profile: nothing accumulates per epoch


@hookimpl
def accelbench_memory_stats(device: torch.device) -> MemoryStats:
    return memory.current().stats()


@hookimpl
def accelbench_peak_figures(device: DeviceInfo, precision: PrecisionPlan) -> PeakFigures | None:
    return peaks.peak_figures(device, precision)
