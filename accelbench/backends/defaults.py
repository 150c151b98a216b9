"""Core defaults: what stock PyTorch already gives for any device.

The plugin host loads this module by name and registers it as ``accelbench.defaults``. For any hook the selected
backend does not implement (or, for first-result hooks, answers with None) the answer comes from here, so a backend
plugin overrides a hook simply by implementing it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from accelbench import hookimpl
from accelbench.devices import EpochReadings, MemoryStats, allocator_memory
from accelbench.errors import BackendError

if TYPE_CHECKING:
    import torch

    from accelbench.engine.executor import Executor, ExecutorRequest
    from accelbench.precision import PrecisionPlan
    from accelbench.workloads import Workload

# tp, pp, mesh: tensor, pipeline and composed parallelism (accelbench.engine.parallel), over the backend's collective
STRATEGIES = [
    *("single", "ddp", "fsdp", "deepspeed-zero1", "deepspeed-zero2", "deepspeed-zero3"),
    *("tp", "pp", "mesh"),
]


def _accelerator() -> Any:
    """``torch.accelerator`` (torch >= 2.6 with its memory API from 2.8). Backends for older torch builds (poptorch
    pins torch 2.0) implement these hooks themselves; reaching this default on such a build is a clear error."""
    import torch

    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None or not hasattr(accelerator, "memory"):
        raise BackendError(
            f"torch {torch.__version__} has no torch.accelerator memory API (torch >= 2.8); upgrade torch, "
            "or use a backend plugin that implements device setup, synchronisation and memory hooks itself"
        )
    return accelerator


@hookimpl
def accelbench_register_workloads(register: Callable[[Workload], None]) -> None:
    from accelbench.workloads import register_all

    register_all(register)


@hookimpl
def accelbench_setup_device(device_type: str, local_rank: int) -> torch.device:
    import torch

    if device_type == "cpu":
        return torch.device("cpu")
    _accelerator().set_device_index(local_rank)
    return torch.device(device_type, local_rank)


@hookimpl
def accelbench_collective_backend(device: torch.device) -> str:
    """torch's default backend for the device type (nccl for CUDA and ROCm, xccl for XPU, gloo for CPU). On a CUDA
    build without NCCL, gloo, which carries CUDA tensors too: slower, and recorded as what ran. For other devices the
    default stands even when missing: gloo cannot carry their tensors, and creating the group then fails, saying so."""
    import torch.distributed as dist

    if hasattr(dist, "get_default_backend_for_device"):  # torch >= 2.6
        name = str(dist.get_default_backend_for_device(device))
    else:
        name = {"cpu": "gloo", "cuda": "nccl"}.get(device.type, "gloo")
    available = getattr(dist, "is_backend_available", None)
    if device.type == "cuda" and name != "gloo" and available is not None and not available(name):
        return "gloo"
    return name


@hookimpl
def accelbench_supported_precisions(device: torch.device) -> list[str]:
    from accelbench.precision import PRECISIONS

    return list(PRECISIONS)


@hookimpl
def accelbench_precision_plan(precision: str, device: torch.device) -> PrecisionPlan:
    import torch

    from accelbench.precision import standard_plan

    mode = torch.get_float32_matmul_precision()
    return standard_plan(precision, matmul_math="ieee-fp32" if mode == "highest" else f"reduced ({mode})")


@hookimpl
def accelbench_supported_strategies() -> list[str]:
    return list(STRATEGIES)


@hookimpl
def accelbench_executor(request: ExecutorRequest) -> Executor | None:
    from accelbench.engine.distributed import executor_for

    return executor_for(request)


@hookimpl
def accelbench_synchronize(device: torch.device) -> None:
    if device.type != "cpu":
        _accelerator().synchronize(device)


@hookimpl
def accelbench_epoch_start(device: torch.device) -> None:
    if device.type != "cpu":
        _accelerator().memory.reset_peak_memory_stats(device)


@hookimpl
def accelbench_epoch_end(device: torch.device) -> EpochReadings:
    if device.type == "cpu":  # torch keeps no allocator statistics for CPU tensors
        return EpochReadings(
            memory=MemoryStats(peak_bytes=None, source="unknown (the backend measures no memory)")
        )
    memory = _accelerator().memory
    total = int(memory.get_memory_info(device)[1]) if hasattr(memory, "get_memory_info") else None
    return EpochReadings(memory=allocator_memory(memory, device, "torch allocator", total=total))


@hookimpl
def accelbench_release_memory(device: torch.device) -> None:
    if device.type != "cpu":
        _accelerator().memory.empty_cache()
