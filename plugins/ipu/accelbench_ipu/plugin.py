"""The IPU backend (entry point ``ipu`` in the ``accelbench`` group): :class:`IpuBackend`, on plugin contract 3.0.

It overrides only what differs from the stock :class:`~accelbench.contract.Backend`, whose methods use
``torch.accelerator`` (which knows nothing of IPUs, and which the SDK's torch 2.0 lacks): detection through poptorch
in a subprocess, host tensors (PopTorch streams them to the IPUs itself), no torch.distributed collective (replication
is a PopTorch option), the AMP modes as precision plans, its own strategies and executor (PopTorch compiles the whole
graph ahead of training, so ``--compile`` and ``--engine lightning`` are refused up front), and memory from the
compile-time graph profile. poptorch is never imported when this module loads, so the plugin loads (and reports no
device, with the reason) on any machine.

IPU memory comes from the graph profile of the executor this backend built last; it is the reading every epoch
reports (nothing accumulates per epoch).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from accelbench.contract import (
    NO_COLLECTIVE,
    Backend,
    BackendInfo,
    DeviceInfo,
    EpochReadings,
    NoCollective,
    PeakFigures,
    PrecisionPlan,
    RunOption,
    Scalar,
    World,
    hookimpl,
)
from accelbench.errors import ConfigError
from accelbench_ipu import detect, memory, peaks, settings
from accelbench_ipu.layout import STRATEGIES
from accelbench_ipu.precision import SUPPORTED, ipu_precision_plan

if TYPE_CHECKING:
    import torch

    from accelbench.config import RunConfig
    from accelbench.contract import Executor, ExecutorRequest

accelbench_contract = "3.0"

DESCRIPTION = (
    "Graphcore IPUs through PopTorch: pipelined, sharded, serial-phased and parallel-phased execution, "
    "replication, compile time measured apart."
)


@hookimpl
def accelbench_register_backends(register: Callable[[type[Backend]], None]) -> None:
    register(IpuBackend)


def _description() -> str:
    """The description, saying why the backend cannot run here when poptorch is not importable."""
    if importlib.util.find_spec("poptorch") is not None:
        return DESCRIPTION
    return f"{DESCRIPTION} Not usable here: {detect.SDK_NOTE}."


class IpuBackend(Backend):
    """Graphcore IPUs through PopTorch: its own executor (pipelined, sharded, phased, replicated), host tensors,
    no torch.distributed collective, AMP precision plans, memory from the compile-time graph profile. The graph
    profile's memory reading of the executor it built last lives here."""

    info = BackendInfo(
        name="ipu", device_type="ipu", device_unit="IPU", priority=80, description=_description()
    )
    strategies = STRATEGIES

    def __init__(self) -> None:
        super().__init__()
        self.graph_memory: memory.GraphMemory = memory.NOT_COMPILED

    # before any run -----------------------------------------------------------------------------------------
    def run_options(self) -> list[RunOption]:
        return settings.run_options()

    def recorded_environment(self) -> list[str]:
        return ["POPLAR_*", "POPTORCH_*", "IPUOF_*", "POPART_*", "GCDA_*"]

    def detect_devices(self) -> list[DeviceInfo]:
        return detect.devices()

    def runtime_versions(self) -> dict[str, str]:
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

    def known_devices(self) -> list[DeviceInfo]:
        return peaks.known_devices()

    # device setup -------------------------------------------------------------------------------------------
    def setup_device(self, world: World, options: Mapping[str, Scalar]) -> torch.device:
        """The host: PopTorch takes host tensors and streams them to the IPUs itself, so the runner's batches
        stay on the host (torch cannot hold tensors on "ipu"). One process drives every IPU of the run."""
        import torch

        return torch.device("cpu")

    def collective_backend(self, device: torch.device) -> NoCollective:
        return NO_COLLECTIVE  # replication is a PopTorch option: one process drives every IPU

    def supported_precisions(self, device: torch.device) -> list[str]:
        return list(SUPPORTED)

    def precision_plan(
        self, precision: str, device: torch.device, options: Mapping[str, Scalar]
    ) -> PrecisionPlan:
        """The AMP mode the run's ``--partials``, ``--stochastic-rounding`` and ``--ipu-loss-scaling`` select
        (PopTorch's defaults where not given); the executor applies the same options."""
        partials, stochastic_rounding, loss_scaling = settings.precision_options(options, precision)
        return ipu_precision_plan(precision, partials, stochastic_rounding, loss_scaling)

    def check_run(self, config: RunConfig) -> None:
        """Refuse ``--activation-checkpointing``: PopTorch recomputes by its own options and annotations
        (``poptorch.recomputationCheckpoint``), which this plugin does not map it to yet."""
        if config.activation_checkpointing:
            raise ConfigError(
                "--activation-checkpointing is not mapped to PopTorch's recomputation on IPUs yet; drop it (phased "
                "execution and --layers-per-ipu spread a large model's activations instead)"
            )

    # the executor -------------------------------------------------------------------------------------------
    def executor(self, request: ExecutorRequest) -> Executor:
        """PopTorch's executor for every IPU strategy: the core's executors (torch.distributed, torch.compile)
        cannot drive IPUs, so none is wrapped."""
        from accelbench_ipu.executor import PopTorchExecutor

        self.graph_memory = memory.NOT_COMPILED
        return PopTorchExecutor(request, on_memory=self._compiled)

    def _compiled(self, reading: memory.GraphMemory) -> None:
        self.graph_memory = reading

    def lightning_accelerator(self) -> Any:
        """None: Lightning dropped IPU support (and the PopTorch executor is the only one that drives IPUs), so
        ``--engine lightning`` is refused up front."""
        return None

    def compile_backend(self) -> str | None:
        """None: PopTorch compiles every run's whole graph itself (timed apart, cold and cached) and torch.compile
        cannot target IPUs, so ``--compile`` is refused up front."""
        return None

    # timing, epochs and memory ------------------------------------------------------------------------------
    def synchronize(self, device: torch.device) -> None:
        """Nothing to wait for: PopTorch calls return only when the IPUs are done."""

    def epoch_start(self, device: torch.device) -> None:
        """Nothing to reset: the memory figure comes from the compile-time profile, and IPUs have no energy
        counter PopTorch exposes."""

    def epoch_end(self, device: torch.device) -> EpochReadings:
        return EpochReadings(memory=self.graph_memory.stats())

    def peak_figures(self, device: DeviceInfo, precision: PrecisionPlan) -> PeakFigures | None:
        return peaks.peak_figures(device, precision)
