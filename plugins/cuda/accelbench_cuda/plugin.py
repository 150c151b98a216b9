"""The accelbench backend for NVIDIA GPUs. Registered as entry point ``cuda`` in the ``accelbench`` group.

Overrides what differs from the stock-PyTorch ``Backend`` (contract 3.0): detection (NVML, no CUDA context in the caller),
device binding per local rank with CUDA_VISIBLE_DEVICES respected, precisions by compute capability with an explicit
TF32 policy, allocator and NVML memory figures, per-epoch NVML energy and telemetry, peak tables and versions.
Timing (``torch.accelerator.synchronize``, exactly ``torch.cuda.synchronize``) and the collective backend (NCCL, or
gloo on builds without it), the step boundaries (none needed: CUDA is eager), inductor and foreach clipping are the
stock ones. torch is imported inside the methods that drive the GPU, so loading the plugin and detecting GPUs stay
cheap.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from accelbench.contract import (
    FP8_PRECISIONS,
    MX_PRECISIONS,
    Backend,
    BackendInfo,
    DeviceInfo,
    EpochReadings,
    PeakFigures,
    PrecisionPlan,
    RunOption,
    Scalar,
    World,
    allocator_memory,
    hookimpl,
)
from accelbench.devices import readings_with_energy
from accelbench.errors import BackendError, ConfigError
from accelbench_cuda import __version__, detect, nvml, peaks
from accelbench_cuda import precision as precision_rules
from accelbench_cuda.visible import ENV

if TYPE_CHECKING:
    import torch

    from accelbench.config import RunConfig

accelbench_contract = "3.2"  # 3.2: device_profiles (a measured H200 profile shipped)


@hookimpl
def accelbench_register_backends(register: Callable[[type[Backend]], None]) -> None:
    register(CudaBackend)


class CudaBackend(Backend):
    """The CUDA backend. The NVML counters of each device's running epoch (energy, PCIe bytes) live here."""

    info = BackendInfo(
        name="cuda",
        device_type="cuda",
        device_unit="GPU (or the MIG instance CUDA_VISIBLE_DEVICES names)",
        priority=100,
        description="NVIDIA GPUs through CUDA; NVML (extra 'nvml') for detection, device memory and telemetry.",
    )

    def __init__(self) -> None:
        super().__init__()
        self._windows: dict[int, nvml.EpochWindow] = {}  # device index -> the running epoch's counters

    def recorded_environment(self) -> list[str]:
        return [ENV, "CUDA_DEVICE_ORDER", "CUDA_LAUNCH_BLOCKING", "CUDA_MODULE_LOADING", "NCCL_*", "CUBLAS_*",
                "CUDNN_*", precision_rules.TF32_ENV]  # fmt: skip

    def detect_devices(self) -> list[DeviceInfo]:
        return detect.detect_devices()

    def runtime_versions(self) -> dict[str, str]:
        import contextlib

        import torch

        versions = {
            "torch": torch.__version__,
            "cuda_runtime": str(torch.version.cuda),
            "accelbench_cuda": __version__,
        }
        if torch.backends.cudnn.is_available():
            if torch.cuda.is_initialized():
                versions["cudnn"] = str(torch.backends.cudnn.version())
            else:  # asking torch would initialise CUDA here (seen with torch 2.11 on an H200): read the wheel instead
                wheel = _cudnn_wheel_version()
                if wheel:
                    versions["cudnn_wheel"] = wheel
        with contextlib.suppress(Exception):  # a build without NCCL: nothing to record
            versions["nccl"] = ".".join(str(part) for part in torch.cuda.nccl.version())
        pynvml = nvml.session()
        if pynvml is not None:
            versions.update(nvml.driver_version(pynvml))
        return versions

    def setup_device(self, world: World, options: Mapping[str, Scalar]) -> torch.device:
        local_rank = world.local_rank
        import torch

        if not torch.cuda.is_available():
            raise BackendError(
                f"CUDA is not available in this process (torch {torch.__version__}, {ENV}="
                f"{os.environ.get(ENV)!r}); check `nvidia-smi` and that torch is a CUDA build"
            )
        count = torch.cuda.device_count()
        if local_rank >= count:
            raise BackendError(
                f"local rank {local_rank} needs GPU {local_rank} but this process sees {count} "
                f"({ENV}={os.environ.get(ENV)!r}); start at most {count} processes per node or widen {ENV}"
            )
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)

    def supported_precisions(self, device: torch.device) -> list[str]:
        return precision_rules.supported_precisions(_capability(device))

    def run_options(self) -> list[RunOption]:
        return [
            RunOption(
                name="tf32",
                type="str",
                choices=("on", "off"),
                help="TF32 policy for fp32 matmuls and convolutions on Ampere and newer "
                f"(default: {precision_rules.TF32_ENV}, else off)",
                backend="cuda",
            )
        ]

    def precision_plan(
        self, precision: str, device: torch.device, options: Mapping[str, Scalar]
    ) -> PrecisionPlan:
        tf32 = _tf32(options)
        precision_rules.apply_tf32(tf32)  # what the plan records is what runs
        return precision_rules.make_plan(precision, _capability(device), tf32)

    def check_run(self, config: RunConfig) -> None:
        """An FP8 or MX run needs torchao (the extra ``fp8``): refused before anything starts when it is missing (or,
        for MX, too old for MXFP8 training, or the torch build lacks what torchao's MXFP8 training asserts)."""
        if config.precision in FP8_PRECISIONS:
            from accelbench.engine.float8 import require_torchao

            require_torchao()
        if config.precision in MX_PRECISIONS:
            from accelbench.engine.float8 import require_torchao_mx

            require_torchao_mx()

    def catalogue_precision_plan(
        self, precision: str, device: DeviceInfo, options: Mapping[str, Scalar]
    ) -> PrecisionPlan:
        """The plan for a GPU of the catalogue that is not here (``accelbench estimate --device A100``): its compute
        capability from the catalogue, the same TF32 policy as a run (``--tf32``, else ``ACCELBENCH_TF32``), and no
        switch set, since nothing runs."""
        capability = precision_rules.catalogue_capability(device)
        supported = precision_rules.supported_precisions(capability)
        if precision not in supported:
            raise ConfigError(
                f"--precision {precision}: {device.name} (sm_{capability[0]}{capability[1]}) does not run it; it "
                f"runs: {', '.join(supported)}"
            )
        return precision_rules.make_plan(precision, capability, _tf32(options))

    def epoch_start(self, device: torch.device) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats(device)
        pynvml = nvml.session()
        handle = _nvml_handle(pynvml, device)
        if (
            pynvml is not None and handle is not None
        ):  # the epoch starts now: snapshot the counters the epoch's end will difference
            self._windows[_index(device)] = nvml.EpochWindow.open(pynvml, handle)

    def epoch_end(self, device: torch.device) -> EpochReadings:
        import torch

        pynvml = nvml.session()
        handle = _nvml_handle(pynvml, device)
        used = nvml.memory_used(pynvml, handle) if pynvml is not None and handle is not None else None
        total = int(torch.cuda.get_device_properties(device).total_memory)
        memory = allocator_memory(torch.cuda, device, "torch CUDA caching allocator", used, total)
        window = self._windows.pop(_index(device), None)
        if pynvml is None or window is None:
            return EpochReadings(memory=memory)
        source = "NVML total energy consumption counter (mJ; it advances in steps of ~0.1 s on Hopper)"
        return readings_with_energy(memory, window.close(pynvml), f"nvml:{window.uuid}", source)

    def peak_figures(self, device: DeviceInfo, precision: PrecisionPlan) -> PeakFigures | None:
        return peaks.peak_for(device.name, precision, device.details)

    def known_devices(self) -> list[DeviceInfo]:
        return peaks.known_devices()

    def device_profiles(self) -> list[str]:
        """The profiles measured on NVIDIA GPUs this plugin ships (``profiles/*.json``; the H200's, 2026-11-28)."""
        from importlib.resources import files

        folder = files("accelbench_cuda") / "profiles"
        return [
            f.read_text() for f in sorted(folder.iterdir(), key=lambda f: f.name) if f.name.endswith(".json")
        ]


def _tf32(options: Mapping[str, Scalar]) -> bool:
    """The TF32 policy: ``--tf32`` wins over the environment variable; neither given means off."""
    given = {precision_rules.TF32_ENV: str(options["tf32"])} if "tf32" in options else os.environ
    return precision_rules.tf32_policy(given)


def _cudnn_wheel_version() -> str | None:
    """The version of the nvidia-cudnn-cuXX wheel torch loads cuDNN from, or None (a system cuDNN)."""
    from importlib.metadata import distributions

    for dist in distributions():
        if (dist.metadata["Name"] or "").lower().startswith("nvidia-cudnn-cu"):
            return dist.version
    return None


def _capability(device: torch.device) -> tuple[int, int]:
    """The compute capability of ``device``. Asked with an index-less device before CUDA is initialised (the
    launcher checks precisions before starting workers), it is the lowest over the visible GPUs, read through
    detection so that the launcher creates no CUDA context of its own."""
    import torch

    if device.index is not None or torch.cuda.is_initialized():
        major, minor = torch.cuda.get_device_capability(device)
        return int(major), int(minor)
    known = [
        d.details["compute_capability"] for d in detect.detect_devices() if "compute_capability" in d.details
    ]
    if not known:
        raise BackendError(
            "no CUDA device is visible to ask for its compute capability (see `accelbench info`)"
        )
    major, minor = min(tuple(int(part) for part in value.split(".")) for value in known)
    return major, minor


def _index(device: torch.device) -> int:
    import torch

    return device.index if device.index is not None else int(torch.cuda.current_device())


def _nvml_handle(pynvml: Any, device: torch.device) -> Any | None:
    import torch

    if pynvml is None:
        return None
    uuid = str(getattr(torch.cuda.get_device_properties(device), "uuid", "") or "")
    return nvml.handle_for_uuid(pynvml, uuid) if uuid else None
