"""The accelbench backend for Intel Gaudi (HPU). Registered as entry point ``gaudi`` in the ``accelbench`` group.

What differs from stock PyTorch, and where:

- detection through HLML (``pyhlml``) or ``hl-smi``, so no device runtime starts in the caller;
- ``--hpu-mode lazy|eager``: set before Habana's bridge loads (``setup_device``), recorded with the run;
- lazy mode: ``htcore.mark_step()`` after every backward pass and every optimizer step (the step boundaries every
  accelbench executor calls), which is where the accumulated graph runs;
- eager mode: ``--compile`` compiles with ``hpu_backend``; in lazy mode ``--compile`` is refused up front;
- HCCL as the collective (``habana_frameworks.torch.distributed.hccl`` registers it); it reduces no float64;
- gradient clipping through Habana's ``FusedClipNorm`` (torch's foreach clipping refuses hpu tensors);
- memory from the HPU allocator (``torch.hpu``), energy and telemetry from HLML's counters;
- dense peaks per generation (Gaudi 2, Gaudi 3) and Lightning's ``HPUAccelerator`` (lightning-habana).

The vendor libraries are imported inside methods: the plugin loads and reports "no device" anywhere.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
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
    RunOption,
    Scalar,
    World,
    hookimpl,
    standard_plan,
)
from accelbench.contract.strategies import Strategy
from accelbench.devices import readings_with_energy
from accelbench.errors import BackendError, ConfigError
from accelbench_gaudi import __version__, hlml, modes, peaks

if TYPE_CHECKING:
    import torch

    from accelbench.config import RunConfig

accelbench_contract = "3.0"

# what HCCL reduces (sum, min, max); Habana's torch layer converts other dtypes to fp32, and float64 not at all
HCCL_DTYPES = ("float32", "bfloat16", "float16", "int32")


@hookimpl
def accelbench_register_backends(register: Callable[[type[Backend]], None]) -> None:
    register(GaudiBackend)


class GaudiBackend(Backend):
    """Intel Gaudi 2/3 through habana_frameworks: lazy or eager mode, HCCL, hpu_backend, HLML telemetry."""

    info = BackendInfo(
        name="gaudi",
        device_type="hpu",
        device_unit="HPU (one Gaudi card)",
        priority=100,
        description="Intel Gaudi through habana_frameworks; HLML (extra 'hlml') or hl-smi for detection and energy.",
    )

    def __init__(self) -> None:
        super().__init__()
        self._windows: dict[int, hlml.EpochWindow] = {}

    # before any run -------------------------------------------------------------------------------------------
    def run_options(self) -> list[RunOption]:
        return [
            RunOption(
                name="hpu_mode",
                type="str",
                choices=("lazy", "eager"),
                help="Gaudi execution mode: lazy (graphs cut at mark_step) or eager (with --compile: hpu_backend); "
                f"default: {modes.LAZY_ENV}, else lazy",
                backend="gaudi",
            )
        ]

    def recorded_environment(self) -> list[str]:
        return [
            "PT_HPU_*",
            "PT_ENABLE_*",
            "HABANA_*",
            "HLS_*",
            "HCCL_*",
            "ENABLE_CONSOLE",
            "LOG_LEVEL_*",
            "GRAPH_VISUALIZATION",
        ]

    def detect_devices(self) -> list[DeviceInfo]:
        return hlml.detect_devices()

    def runtime_versions(self) -> dict[str, str]:
        import torch

        versions = {
            "torch": torch.__version__,
            "accelbench_gaudi": __version__,
            "hpu_mode": modes.current_mode(),
        }
        try:
            from habana_frameworks.torch import __version__ as bridge

            versions["habana_frameworks"] = str(bridge)
        except Exception:  # the bridge is not loaded here (info, estimate): nothing to record
            pass
        session = hlml.session()
        if session is not None:
            versions.update(hlml.driver_version(session))
        return versions

    def known_devices(self) -> list[DeviceInfo]:
        return peaks.known_devices()

    # device setup ---------------------------------------------------------------------------------------------
    def setup_device(self, world: World, options: Mapping[str, Scalar]) -> torch.device:
        modes.set_mode(modes.wanted_mode(options))  # before the bridge loads: it reads the mode once
        import habana_frameworks.torch.core  # noqa: F401  (registers the hpu device with torch)
        import habana_frameworks.torch.hpu as hpu
        import torch

        if not hpu.is_available():
            raise BackendError(
                "no Gaudi device is available to this process; check `hl-smi` and HABANA_VISIBLE_MODULES"
            )
        count = int(hpu.device_count())
        if world.local_rank >= count:
            raise BackendError(
                f"local rank {world.local_rank} needs HPU {world.local_rank} but this process sees {count}; start at "
                f"most {count} processes per node or widen {hlml.VISIBLE_ENV}"
            )
        return torch.device("hpu", world.local_rank) if count > 1 else torch.device("hpu")

    def collective_backend(self, device: torch.device) -> str:
        if (
            device.index is not None
        ):  # a bound device: the bridge is loaded, register HCCL with torch.distributed
            import habana_frameworks.torch.distributed.hccl  # noqa: F401
        return "hccl"

    def collective_dtypes(self, device: torch.device) -> tuple[str, ...]:
        return HCCL_DTYPES

    # precision ------------------------------------------------------------------------------------------------
    def supported_precisions(self, device: torch.device) -> list[str]:
        names = ["fp32", "bf16-mixed", "bf16-true"]
        detected = self.detect()
        generation = peaks.generation_of(detected[0].name) if detected else None
        if generation is None or generation.fp16:
            names.append("fp16-mixed")
        return names

    def precision_plan(
        self, precision: str, device: torch.device, options: Mapping[str, Scalar]
    ) -> PrecisionPlan:
        # the MME computes fp32 matmuls in fp32 unless PT_HPU_* math overrides are set (recorded in the environment)
        plan = standard_plan(precision, matmul_math="ieee-fp32")
        return plan.model_copy(
            update={"notes": (plan.notes + "; " if plan.notes else "") + f"HPU {modes.current_mode()} mode"}
        )

    # strategies and the executor --------------------------------------------------------------------------
    def supported_strategies(self, device: torch.device) -> list[str]:
        # DeepSpeed on Gaudi is Habana's fork, and the tensor/pipeline strategies use DTensor paths Habana does not
        # document for HPU: offer what the bridge documents (DDP, FSDP) and the single device
        return [Strategy.SINGLE, Strategy.DDP, Strategy.FSDP]

    def check_run(self, config: RunConfig) -> None:
        mode = modes.wanted_mode(config.backend_options)
        if config.compile and mode == "lazy":
            raise ConfigError(
                "--compile on Gaudi compiles with hpu_backend, which needs eager mode: add --hpu-mode eager (lazy mode "
                "already builds graphs between mark_step calls)"
            )
        if config.compile and config.compile_mode != "default":
            raise ConfigError(
                f"--compile-mode {config.compile_mode}: hpu_backend has no inductor modes; drop --compile-mode"
            )

    def lightning_accelerator(self) -> Any:
        try:
            from lightning_habana import HPUAccelerator
        except ImportError:
            return None
        return HPUAccelerator()

    # the training step ----------------------------------------------------------------------------------------
    def optimizer_implementation(self, device: torch.device) -> OptimizerImplementation:
        # torch's fused AdamW/SGD list hpu; its foreach kernels refuse hpu tensors: plain where not fused
        return "fused" if super().optimizer_implementation(device) == "fused" else "plain"

    def clip_grad_norm(self, parameters: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
        params = list(parameters)
        try:
            from habana_frameworks.torch.hpex.normalization import FusedClipNorm
        except ImportError:  # an older bridge: torch's clipping without foreach (refused on hpu tensors)
            import torch

            return torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=False)
        clipper = FusedClipNorm(params, max_norm)
        norm: torch.Tensor = clipper.clip_norm(params)
        return norm

    def after_backward(self, device: torch.device) -> None:
        if modes.current_mode() == "lazy":
            import habana_frameworks.torch.core as htcore

            htcore.mark_step()

    def after_optimizer_step(self, device: torch.device) -> None:
        if modes.current_mode() == "lazy":
            import habana_frameworks.torch.core as htcore

            htcore.mark_step()

    def compile_backend(self) -> str | None:
        return "hpu_backend"

    def compile_options(self, mode: str) -> dict[str, Any]:
        return {"dynamic": False}  # hpu_backend takes no inductor mode

    # timing, epochs, memory, peaks ----------------------------------------------------------------------------
    def synchronize(self, device: torch.device) -> None:
        import habana_frameworks.torch.hpu as hpu

        hpu.synchronize()

    def epoch_start(self, device: torch.device) -> None:
        import habana_frameworks.torch.hpu as hpu

        hpu.reset_peak_memory_stats(device)
        session = hlml.session()
        handle = hlml.handle_for_index(session, _index(device)) if session is not None else None
        if (
            session is not None and handle is not None
        ):  # snapshot the counters the epoch's end will difference
            self._windows[_index(device)] = hlml.EpochWindow.open(session, handle)

    def epoch_end(self, device: torch.device) -> EpochReadings:
        import habana_frameworks.torch.hpu as hpu

        stats = hpu.memory_stats(device)
        session = hlml.session()
        handle = hlml.handle_for_index(session, _index(device)) if session is not None else None
        memory = MemoryStats(
            peak_bytes=int(hpu.max_memory_allocated(device)),
            source="HPU allocator peak (torch.hpu.max_memory_allocated)",
            device_used_bytes=hlml.memory_used(session, handle) if handle is not None else None,
            total_bytes=int(stats["Limit"]) if "Limit" in stats else None,
        )
        window = self._windows.pop(_index(device), None)
        if session is None or handle is None or window is None:
            return EpochReadings(memory=memory)
        return readings_with_energy(
            memory, window.close(session, handle), f"hlml:{window.uuid}",
            "HLML total energy consumption counter (mJ)",
        )  # fmt: skip

    def release_memory(self, device: torch.device) -> None:
        import habana_frameworks.torch.hpu as hpu

        empty = getattr(hpu, "empty_cache", None)
        if callable(empty):
            empty()

    def peak_figures(self, device: DeviceInfo, precision: PrecisionPlan) -> PeakFigures | None:
        return peaks.peak_for(device.name, precision)


def _index(device: torch.device) -> int:
    if device.index is not None:
        return int(device.index)
    hpu = sys.modules.get("habana_frameworks.torch.hpu")
    return int(hpu.current_device()) if hpu is not None else 0
