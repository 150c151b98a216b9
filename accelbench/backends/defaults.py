"""Core defaults: what stock PyTorch already gives for any device.

Registered by the plugin host under the name ``accelbench.defaults``; every implementation is ``trylast``,
so a backend plugin overrides a hook simply by implementing it.
"""

from __future__ import annotations

import torch

from accelbench import hookimpl
from accelbench.devices import MemoryStats
from accelbench.engine.distributed import executor_for
from accelbench.engine.executor import Executor, ExecutorRequest
from accelbench.errors import BackendError
from accelbench.precision import PRECISIONS, PrecisionPlan, standard_plan
from accelbench.workloads import Workload


def _accelerator():  # type: ignore[no-untyped-def]
    """``torch.accelerator`` (torch >= 2.6 with its memory API from 2.8). Backends for older torch builds (poptorch
    pins torch 2.0) implement these hooks themselves; reaching this default on such a build is a clear error."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None or not hasattr(accelerator, "memory"):
        raise BackendError(
            f"torch {torch.__version__} has no torch.accelerator memory API (torch >= 2.8); upgrade torch, "
            "or use a backend plugin that implements device setup, synchronisation and memory hooks itself"
        )
    return accelerator


STRATEGIES = ["single", "ddp", "fsdp", "deepspeed-zero1", "deepspeed-zero2", "deepspeed-zero3"]


@hookimpl(trylast=True)
def accelbench_register_workloads(register) -> None:  # type: ignore[no-untyped-def]
    from accelbench.workloads.gpt import GPTWorkload

    workload: Workload = GPTWorkload()
    register(workload)


@hookimpl(trylast=True)
def accelbench_setup_device(device_type: str, local_rank: int) -> torch.device:
    if device_type == "cpu":
        return torch.device("cpu")
    _accelerator().set_device_index(local_rank)
    return torch.device(device_type, local_rank)


@hookimpl(trylast=True)
def accelbench_collective_backend(device: torch.device) -> str:
    import torch.distributed as dist

    if hasattr(dist, "get_default_backend_for_device"):  # torch >= 2.6
        return dist.get_default_backend_for_device(device)
    return {"cpu": "gloo", "cuda": "nccl"}.get(device.type, "gloo")


@hookimpl(trylast=True)
def accelbench_supported_precisions(device: torch.device) -> list[str]:
    return list(PRECISIONS)


@hookimpl(trylast=True)
def accelbench_precision_plan(precision: str, device: torch.device) -> PrecisionPlan:
    highest = torch.get_float32_matmul_precision() == "highest"
    return standard_plan(
        precision, matmul_math="ieee-fp32" if highest else f"reduced ({torch.get_float32_matmul_precision()})"
    )


@hookimpl(trylast=True)
def accelbench_supported_strategies() -> list[str]:
    return list(STRATEGIES)


@hookimpl(trylast=True)
def accelbench_executor(request: ExecutorRequest) -> Executor | None:
    return executor_for(request)


@hookimpl(trylast=True)
def accelbench_synchronize(device: torch.device) -> bool:
    if device.type != "cpu":
        _accelerator().synchronize(device)
    return True


@hookimpl(trylast=True)
def accelbench_reset_peak_memory(device: torch.device) -> bool:
    if device.type != "cpu":
        _accelerator().memory.reset_peak_memory_stats(device)
    return True


@hookimpl(trylast=True)
def accelbench_release_memory(device: torch.device) -> bool:
    if device.type != "cpu":
        _accelerator().memory.empty_cache()
    return True


@hookimpl(trylast=True)
def accelbench_memory_stats(device: torch.device) -> MemoryStats:
    if device.type == "cpu":  # torch keeps no allocator statistics for CPU tensors
        return MemoryStats(peak_bytes=None, source="unknown (the backend implements no memory query)")
    memory = _accelerator().memory
    total = None
    if hasattr(memory, "get_memory_info"):
        total = int(memory.get_memory_info(device)[1])
    return MemoryStats(
        peak_bytes=int(memory.max_memory_allocated(device)),
        source="torch allocator peak (torch.accelerator.memory.max_memory_allocated)",
        peak_reserved_bytes=int(memory.max_memory_reserved(device)),
        total_bytes=total,
    )
