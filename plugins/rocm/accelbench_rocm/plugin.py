"""accelbench hooks for AMD GPUs through ROCm. Registered as entry point ``rocm`` in the ``accelbench`` group.

A ROCm build of torch drives AMD GPUs through the ``cuda`` device type (HIP), so allocator statistics and
synchronisation are torch.cuda's; what differs is here: detection through ``torch.version.hip`` and amdsmi (the
gfx architecture and compute units recorded, one MI250X GCD = one device), HIP/ROCR visible devices, precisions by
architecture, amdsmi device memory and energy, and the Instinct peak table. The collective backend is the core
default, "nccl", under which name RCCL registers.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from accelbench.contract import (
    FP8_PRECISIONS,
    Backend,
    BackendInfo,
    DeviceInfo,
    EpochReadings,
    PeakFigures,
    PrecisionPlan,
    Scalar,
    World,
    allocator_memory,
    hookimpl,
)
from accelbench.devices import readings_with_energy
from accelbench.errors import BackendError, ConfigError
from accelbench_rocm import __version__, detect, peaks, smi
from accelbench_rocm import precision as precision_rules
from accelbench_rocm.visible import HIP_ENV, ROCR_ENV

if TYPE_CHECKING:
    import torch

    from accelbench.config import RunConfig

accelbench_contract = "3.0"


@hookimpl
def accelbench_register_backends(register: Callable[[type[Backend]], None]) -> None:
    register(RocmBackend)


class RocmBackend(Backend):
    """The ROCm backend. The amdsmi handles and each device's running epoch (its energy accumulator) live here."""

    info = BackendInfo(
        name="rocm",
        device_type="cuda",  # ROCm builds of torch expose AMD GPUs as "cuda" devices
        device_unit="GPU as HIP enumerates it: one GCD (an MI250X is two devices), or one MI300X partition",
        priority=100,
        description="AMD GPUs through ROCm/HIP; amdsmi (extra 'amdsmi') for detection, device memory and energy.",
    )

    def __init__(self) -> None:
        super().__init__()
        self._windows: dict[int, smi.EpochWindow] = {}  # device index -> energy window of the running epoch
        self._handles: dict[int, Any] = {}  # device index -> amdsmi handle

    def recorded_environment(self) -> list[str]:
        return [HIP_ENV, ROCR_ENV, "CUDA_VISIBLE_DEVICES", "HSA_*", "HIP_*", "NCCL_*", "RCCL_*", "MIOPEN_*",
                "PYTORCH_ROCM_ARCH"]  # fmt: skip

    def detect_devices(self) -> list[DeviceInfo]:
        return detect.detect_devices()

    def runtime_versions(self) -> dict[str, str]:
        import torch

        versions = {"torch": torch.__version__, "hip": str(torch.version.hip), "accelbench_rocm": __version__}
        with contextlib.suppress(Exception):  # a build without RCCL: nothing to record
            versions["rccl"] = ".".join(str(part) for part in torch.cuda.nccl.version())
        amdsmi = smi.session()
        if amdsmi is not None:
            versions.update(smi.versions(amdsmi))
        return versions

    def setup_device(self, world: World, options: Mapping[str, Scalar]) -> torch.device:
        local_rank = world.local_rank
        import torch

        if torch.version.hip is None or not torch.cuda.is_available():
            raise BackendError(
                f"no ROCm GPU is available in this process (torch {torch.__version__}, HIP {torch.version.hip}); "
                "check `amd-smi list` and that torch is a ROCm build"
            )
        count = torch.cuda.device_count()
        if local_rank >= count:
            shown = ", ".join(
                f"{k}={os.environ[k]!r}"
                for k in (ROCR_ENV, HIP_ENV, "CUDA_VISIBLE_DEVICES")
                if k in os.environ
            )
            raise BackendError(
                f"local rank {local_rank} needs GPU {local_rank} but this process sees {count} "
                f"({shown or 'no visible-device variable set'}); start at most {count} processes per node "
                "(an MI250X counts as two)"
            )
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)

    def supported_precisions(self, device: torch.device) -> list[str]:
        return precision_rules.supported_precisions(_arch(device))

    def precision_plan(
        self, precision: str, device: torch.device, options: Mapping[str, Scalar]
    ) -> PrecisionPlan:
        precision_rules.check_tf32_policy()
        return precision_rules.make_plan(precision, _arch(device))

    def check_run(self, config: RunConfig) -> None:
        """An FP8 run needs torchao (the extra ``fp8``): refused before anything starts when it is not installed.
        Looked up, not imported: importing torchao.float8 asks device 0 its architecture (to pick the FNUZ or OCP
        dtypes), which would start HIP in the launcher."""
        import importlib.util

        if config.precision in FP8_PRECISIONS and importlib.util.find_spec("torchao") is None:
            raise ConfigError(
                f"--precision {config.precision} runs through torchao's float8 training, and torchao is not "
                f"installed; install it with: {precision_rules.TORCHAO_INSTALL}"
            )

    def catalogue_precision_plan(
        self, precision: str, device: DeviceInfo, options: Mapping[str, Scalar]
    ) -> PrecisionPlan:
        """The plan for a catalogue GPU that is not here (``accelbench estimate --device MI300X``): its architecture
        from the catalogue, no switch set, since nothing runs."""
        arch = device.arch or ""
        supported = precision_rules.supported_precisions(arch)
        if precision not in supported:
            raise ConfigError(
                f"--precision {precision}: {device.name} ({arch}) does not run it; it runs: {', '.join(supported)}"
            )
        precision_rules.check_tf32_policy()
        return precision_rules.plan_for(precision, arch)

    def epoch_start(self, device: torch.device) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats(device)
        amdsmi = smi.session()
        handle = self._smi_handle(amdsmi, device)
        if amdsmi is not None and handle is not None:  # the epoch starts now: read the energy accumulator
            self._windows[_index(device)] = smi.EpochWindow.open(amdsmi, handle, self._bdf(device) or "")

    def epoch_end(self, device: torch.device) -> EpochReadings:
        import torch

        amdsmi = smi.session()
        handle = self._smi_handle(amdsmi, device)
        used = smi.memory_used(amdsmi, handle) if amdsmi is not None and handle is not None else None
        total = int(torch.cuda.get_device_properties(device).total_memory)
        memory = allocator_memory(torch.cuda, device, "torch HIP caching allocator", used, total)
        window = self._windows.pop(_index(device), None)
        if amdsmi is None or window is None:
            return EpochReadings(memory=memory)
        source = (
            "amdsmi energy accumulator (amdsmi_get_energy_count x counter resolution; on an MI250X the accumulator "
            "is the whole package, shared by its two GCDs)"
        )
        return readings_with_energy(
            memory, window.close(amdsmi), f"amdsmi:{window.bdf or _index(device)}", source
        )

    def peak_figures(self, device: DeviceInfo, precision: PrecisionPlan) -> PeakFigures | None:
        return peaks.peak_for(device, precision)

    def known_devices(self) -> list[DeviceInfo]:
        return peaks.known_devices()

    def _bdf(self, device: torch.device) -> str | None:
        index = _index(device)
        devices = detect.detect_devices()
        return devices[index].details.get("bdf") if index < len(devices) else None

    def _smi_handle(self, amdsmi: Any, device: torch.device) -> Any | None:
        """The amdsmi handle of ``device``, found by PCI address through detection (HIP ordinal -> amdsmi GPU)."""
        if amdsmi is None:
            return None
        index = _index(device)
        if index not in self._handles:
            bdf = self._bdf(device)
            self._handles[index] = smi.handle_for_bdf(amdsmi, bdf) if bdf else None
        return self._handles[index]


def _index(device: torch.device) -> int:
    import torch

    return device.index if device.index is not None else int(torch.cuda.current_device())


def _arch(device: torch.device) -> str:
    """The gfx architecture of ``device``. Asked with an index-less device before HIP is initialised (the
    launcher's preflight), it comes from detection, so the launcher starts no HIP runtime of its own; on a mixed
    node the precisions are those every GPU supports."""
    import torch

    if device.index is not None or torch.cuda.is_initialized():
        return precision_rules.base_arch(getattr(torch.cuda.get_device_properties(device), "gcnArchName", ""))
    archs = {d.arch for d in detect.detect_devices() if d.arch}
    if not archs:
        raise BackendError("no ROCm GPU is visible to ask for its architecture (see `accelbench info`)")
    common = [
        a
        for a in archs
        if all(
            set(precision_rules.supported_precisions(a)) <= set(precision_rules.supported_precisions(b))
            for b in archs
        )
    ]
    return sorted(common or archs)[0]
