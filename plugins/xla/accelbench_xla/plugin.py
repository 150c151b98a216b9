"""The accelbench backend for PyTorch/XLA devices. Registered as entry point ``xla`` in the ``accelbench`` group.

PyTorch/XLA's tensors are lazy: operations build a graph that compiles and runs when it is cut. A training loop
cuts it once per step with ``torch_xla.sync()`` (formerly ``xm.mark_step()``); without that the graph grows over
the whole epoch and runs once at the end. This backend cuts it at the contract's ``end_of_step``, which the runner
calls after every step of every executor. What else differs from stock PyTorch (checked on torch-xla 2.9.0):

- the device comes from ``torch_xla.device()``; ``PJRT_DEVICE`` picks the runtime (``TPU``, or ``CPU`` for XLA's
  CPU client, which is how CI trains through this backend without a TPU);
- torch's fused optimizers refuse XLA tensors, foreach kernels work; foreach clipping is refused ("foreach=True is
  not supported with XLA"), so clipping runs per tensor;
- ``--compile`` compiles with ``openxla``; inductor's modes do not apply and are refused up front;
- memory: ``xm.get_memory_info`` where the PJRT client keeps allocator statistics (TPUs); the CPU client has none;
- a single device per process (multi-device XLA training goes through SPMD or the ``xla://`` rendezvous, which
  this backend does not drive yet).

torch_xla is imported inside methods only: the plugin loads, and reports no device, where it is absent.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelbench.contract import (
    Backend,
    BackendInfo,
    DeviceInfo,
    EpochReadings,
    MemoryStats,
    OptimizerImplementation,
    PeakFigures,
    PrecisionPlan,
    Scalar,
    World,
    hookimpl,
    standard_plan,
)
from accelbench.contract.strategies import Strategy
from accelbench.devices import probe_in_subprocess
from accelbench.errors import BackendError, ConfigError
from accelbench_xla import __version__, peaks

if TYPE_CHECKING:
    import torch

    from accelbench.config import RunConfig

accelbench_contract = "3.0"

PJRT_ENV = "PJRT_DEVICE"
TPU_DEVICE_FILES = ("/dev/accel0", "/dev/vfio/0")  # how a TPU VM shows its chips

_PROBE = """
import json, torch_xla, torch_xla.runtime as xr
count = xr.global_runtime_device_count()
kind = xr.device_type()
print(json.dumps([{"index": i, "name": f"{kind} {i}", "kind": kind} for i in range(count)]))
"""


@hookimpl
def accelbench_register_backends(register: Callable[[type[Backend]], None]) -> None:
    register(XlaBackend)


class XlaBackend(Backend):
    """PyTorch/XLA devices: lazy tensors cut once per step (``torch_xla.sync``), openxla compile, TPU peaks."""

    info = BackendInfo(
        name="xla",
        device_type="xla",
        device_unit="XLA device: a TPU chip as PJRT enumerates it (XLA's CPU client with PJRT_DEVICE=CPU)",
        priority=90,
        description="PyTorch/XLA (torch-xla, installed with its torch); PJRT_DEVICE=TPU or CPU.",
    )
    strategies = (Strategy.SINGLE,)

    # before any run -------------------------------------------------------------------------------------------
    def recorded_environment(self) -> list[str]:
        return ["PJRT_*", "XLA_*", "TPU_*", "LIBTPU_*"]

    def detect_devices(self) -> list[DeviceInfo]:
        if importlib.util.find_spec("torch_xla") is None:
            return []
        runtime = os.environ.get(PJRT_ENV, "").upper()
        if runtime == "CPU":  # the CPU client: one device, nothing to probe
            return [
                DeviceInfo(index=0, name="XLA CPU (PJRT CPU client)", arch="cpu", details={"pjrt": "CPU"})
            ]
        if not runtime and not any(Path(p).exists() for p in TPU_DEVICE_FILES):
            return []  # torch-xla installed, but no TPU here and no runtime chosen: nothing for this backend
        found = probe_in_subprocess(
            _PROBE, label="PyTorch/XLA", hang_hint="check the TPU runtime (another process may hold the TPU)"
        )
        return [
            DeviceInfo(
                index=int(d["index"]),
                name=str(d["name"]),
                arch=str(d["kind"]),
                details={"pjrt": runtime or "TPU"},
            )
            for d in found
        ]

    def runtime_versions(self) -> dict[str, str]:
        import torch

        versions = {
            "torch": torch.__version__,
            "accelbench_xla": __version__,
            "pjrt_device": os.environ.get(PJRT_ENV, ""),
        }
        if importlib.util.find_spec("torch_xla") is not None:
            import torch_xla

            versions["torch_xla"] = str(torch_xla.__version__)
        return versions

    def known_devices(self) -> list[DeviceInfo]:
        return peaks.known_devices()

    # device setup ---------------------------------------------------------------------------------------------
    def setup_device(self, world: World, options: Mapping[str, Scalar]) -> torch.device:
        if importlib.util.find_spec("torch_xla") is None:
            raise BackendError(
                "torch-xla is not installed: pip install the torch-xla release built for your torch"
            )
        if not os.environ.get(PJRT_ENV):
            os.environ[PJRT_ENV] = "TPU"  # detection found TPU chips: the runtime PJRT would pick there
        import torch_xla

        device: torch.device = torch_xla.device()
        return device

    def collective_backend(self, device: torch.device) -> str:
        if device.index is not None:
            import torch_xla.distributed.xla_backend  # noqa: F401  (registers "xla" with torch.distributed)
        return "xla"

    def collective_dtypes(self, device: torch.device) -> tuple[str, ...]:
        return ("float32", "bfloat16", "int32")  # TPUs have no native float64

    # precision ------------------------------------------------------------------------------------------------
    def supported_precisions(self, device: torch.device) -> list[str]:
        return ["fp32", "bf16-mixed", "bf16-true"]  # TPUs have no native fp16

    def precision_plan(
        self, precision: str, device: torch.device, options: Mapping[str, Scalar]
    ) -> PrecisionPlan:
        runtime = os.environ.get(PJRT_ENV, "").upper()
        if runtime == "CPU":
            return standard_plan(precision, matmul_math="ieee-fp32")
        # On TPUs, XLA runs fp32 matmuls at its default precision: bf16 passes on the MXU, not IEEE fp32
        return standard_plan(precision, matmul_math="xla default matmul precision (bf16 passes on TPU MXUs)")

    # strategies -----------------------------------------------------------------------------------------------
    def check_run(self, config: RunConfig) -> None:
        if config.compile and config.compile_mode != "default":
            raise ConfigError(
                f"--compile-mode {config.compile_mode}: openxla has no inductor modes; drop --compile-mode"
            )

    def lightning_accelerator(self) -> Any:
        return "tpu" if os.environ.get(PJRT_ENV, "TPU").upper() == "TPU" else None

    # the training step ----------------------------------------------------------------------------------------
    def optimizer_implementation(self, device: torch.device) -> OptimizerImplementation:
        return "foreach"  # torch's fused kernels refuse XLA tensors; foreach ones trace into the step's graph

    def clip_grad_norm(self, parameters: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
        import torch

        return torch.nn.utils.clip_grad_norm_(
            list(parameters), max_norm, foreach=False
        )  # foreach refused on XLA

    def end_of_step(self, device: torch.device) -> None:
        import torch_xla

        torch_xla.sync()  # cut the step's graph: compile once, then run asynchronously every step

    def compile_backend(self) -> str | None:
        return "openxla"

    def compile_options(self, mode: str) -> dict[str, Any]:
        return {"dynamic": False}

    # timing, epochs, memory, peaks ----------------------------------------------------------------------------
    def synchronize(self, device: torch.device) -> None:
        import torch_xla.core.xla_model as xm

        xm.wait_device_ops()

    def epoch_start(self, device: torch.device) -> None:
        """XLA's allocator statistics cannot be reset: the epoch's reading is the lifetime peak (said so)."""

    def epoch_end(self, device: torch.device) -> EpochReadings:
        import torch_xla.core.xla_model as xm

        try:
            info = xm.get_memory_info(device)
        except RuntimeError:  # the CPU client: "GetAllocatorStats is not supported"
            return EpochReadings(
                memory=MemoryStats(
                    peak_bytes=None, source="unknown (this PJRT client keeps no allocator statistics)"
                )
            )
        peak = info.get("peak_bytes_used", info.get("bytes_used"))
        return EpochReadings(
            memory=MemoryStats(
                peak_bytes=int(peak) if peak is not None else None,
                source="XLA allocator peak over the process lifetime (xm.get_memory_info; it cannot be reset)",
                total_bytes=int(info["bytes_limit"]) if "bytes_limit" in info else None,
            )
        )

    def release_memory(self, device: torch.device) -> None:
        """PJRT frees buffers when their tensors go: nothing cached to hand back."""

    def peak_figures(self, device: DeviceInfo, precision: PrecisionPlan) -> PeakFigures | None:
        return peaks.peak_for(device.name, precision)
