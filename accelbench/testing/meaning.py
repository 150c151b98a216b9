"""What the conformance kit checks beyond shape: that a backend's readings mean what they say.

Each check takes the backend and its device (set up for local rank 0), does something whose effect is known (a
tensor of known size allocated on the device, work queued that takes a known time, a collective over a one-rank
group, two local ranks set up), and raises :class:`ContractViolation` naming what is wrong where the backend's
answer contradicts it. A check that cannot be made on this machine (no second device, a device torch cannot
allocate on directly) returns a :class:`NotProven` saying why; one that holds returns a :class:`Proven` saying what
it showed. :class:`accelbench.testing.BackendContract` runs them all, and ``accelbench check-backend`` reports them.

The kit's own tests (tests/test_kit_meaning.py) apply each defect a vendor's plugin has shipped with (a memory query
always 0, a peak reset that does nothing, a ``synchronize`` that does not wait, a collective backend torch does not
have, local ranks sharing one device) to a working backend and check that the check catches it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from accelbench.contract import Backend, DeviceInfo

MIB = 2**20
# the tensor whose allocation the memory peak must cover: above glibc's largest mmap threshold (32 MiB), so a host
# RSS reading sees it returned to the kernel when it is freed
PROBE_BYTES = 256 * MIB
# the work queued to see whether synchronize waits: at least this long on the device
SYNC_WORK_S = 0.05


class ContractViolation(AssertionError):
    """The backend's answer contradicts what the check did: the message says what is wrong and what to fix."""


@dataclass(frozen=True)
class Proven:
    check: str
    detail: str


@dataclass(frozen=True)
class NotProven:
    check: str
    why: str


Outcome = Proven | NotProven


# ----------------------------------------------------------------------------------------------------------------
# Memory: the peak covers what was allocated, and a reset brings it back down
# ----------------------------------------------------------------------------------------------------------------


def check_memory(backend: Backend, device: torch.device, size: int = PROBE_BYTES) -> Outcome:
    """An epoch with a ``size``-byte tensor allocated (and written) on the device reads a peak at least ``size``
    above an epoch with nothing allocated; after the tensor is freed, the next epoch (its peak reset by
    ``epoch_start``) reads at least ``size / 2`` below it. A backend that measures no memory (``peak_bytes`` None)
    is stated, not failed."""
    import torch

    def epoch(allocate: int) -> int | None:
        backend.epoch_start(device)
        tensor = torch.ones(allocate // 4, dtype=torch.float32, device=device) if allocate else None
        backend.synchronize(device)
        readings = backend.epoch_end(device)
        del tensor
        return readings.memory.peak_bytes

    try:
        empty = epoch(0)
        if empty is None:
            return NotProven("memory", "the backend measures no memory (peak_bytes None): nothing to check")
        full = epoch(size)
        after = epoch(MIB)
    except (RuntimeError, NotImplementedError) as exc:  # a device torch cannot allocate on outside a graph
        return NotProven("memory", f"a tensor cannot be allocated on {device} directly ({_first_line(exc)})")
    assert full is not None and after is not None
    if full - empty < size * 0.9:
        raise ContractViolation(
            f"memory: an epoch that allocated a {size // MIB} MiB tensor on {device} read a peak of "
            f"{full / MIB:.1f} MiB, {max(0, full - empty) / MIB:.1f} MiB above an epoch that allocated nothing "
            f"({empty / MIB:.1f} MiB): epoch_end's memory query does not measure what the device holds (a query "
            "that always answers 0, or reads another device or the host?)"
        )
    if full - after < size / 2:
        raise ContractViolation(
            f"memory: after the {size // MIB} MiB tensor was freed, the next epoch read a peak of "
            f"{after / MIB:.1f} MiB against {full / MIB:.1f} MiB with it: epoch_start does not reset the peak "
            "(every epoch would report the run's highest)"
        )
    return Proven(
        "memory",
        f"a {size // MIB} MiB tensor raised the epoch's peak by {(full - empty) / MIB:.0f} MiB, and the next "
        f"epoch's reset brought it back to {after / MIB:.0f} MiB",
    )


# ----------------------------------------------------------------------------------------------------------------
# synchronize: the closing read of a timed region waits for the device's work
# ----------------------------------------------------------------------------------------------------------------


def check_synchronize(
    backend: Backend,
    device: torch.device,
    queue_work: Callable[[], Any] | None = None,
    collect: Callable[[Any], None] | None = None,
) -> Outcome:
    """Work queued on the device (at least twice SYNC_WORK_S of it), then ``synchronize``: collecting the result afterwards must not wait (the work is
    done). Where queuing the work itself takes as long as the work (a synchronous device: the CPU's kernels run as
    they are called), there is nothing to wait for and the check says so. ``queue_work`` (returns a handle) and
    ``collect`` (waits for it) default to a chain of matrix products on the device and a copy of its result to the
    host; the kit's own tests give a stand-in device's."""
    collect = collect or _to_host
    if queue_work is None:  # a chain of products long enough to time: doubled until it takes SYNC_WORK_S
        try:
            chain, length = _matmul_chain(device), 2
            while True:
                started = time.perf_counter()
                collect(chain(length))
                if time.perf_counter() - started >= 2 * SYNC_WORK_S or length >= 2**14:
                    break
                length *= 2
        except (
            RuntimeError,
            NotImplementedError,
        ) as exc:  # a device torch cannot run eagerly (an IPU's graph)
            return NotProven("synchronize", f"work cannot be queued on {device} eagerly ({_first_line(exc)})")
        queue_work = lambda: chain(length)  # noqa: E731
    collect(queue_work())  # warm up: kernels loaded, memory allocated
    started = time.perf_counter()
    handle = queue_work()
    queued = time.perf_counter() - started
    collect(handle)
    whole = time.perf_counter() - started
    if whole < SYNC_WORK_S:
        return NotProven("synchronize", f"the probe's work took {whole * 1e3:.1f} ms, too short to tell")
    if queued > whole * 0.8:
        return Proven(
            "synchronize",
            f"{device.type} runs work as it is queued ({queued * 1e3:.0f} of {whole * 1e3:.0f} ms spent queuing): "
            "synchronous, nothing to wait for",
        )
    handle = queue_work()
    backend.synchronize(device)
    started = time.perf_counter()
    collect(handle)
    left = time.perf_counter() - started
    if left > (whole - queued) * 0.5:
        raise ContractViolation(
            f"synchronize: after synchronize({device}) returned, collecting the queued work's result still took "
            f"{left * 1e3:.0f} ms of its {whole * 1e3:.0f} ms: synchronize does not wait for the device, so every "
            "timed region ends before its work does"
        )
    return Proven(
        "synchronize",
        f"work queued in {queued * 1e3:.1f} ms and done in {whole * 1e3:.0f} ms was finished when synchronize "
        f"returned ({left * 1e3:.1f} ms left to collect)",
    )


def _matmul_chain(device: torch.device) -> Callable[[int], Any]:
    import torch

    a = torch.randn(512, 512, device=device)

    def queue(length: int) -> Any:
        out = a
        for _ in range(length):
            out = out @ a
            out = out / out.norm()  # keeps the values finite
        return out

    return queue


def _to_host(handle: Any) -> None:
    handle.cpu()


# ----------------------------------------------------------------------------------------------------------------
# The collective backend: torch.distributed has it, and it reduces the backend's dtypes on its device
# ----------------------------------------------------------------------------------------------------------------


def check_collective_backend(backend: Backend, device: torch.device, dtypes: list[torch.dtype]) -> Outcome:
    """The collective backend the plugin names is one this torch.distributed has, and an all-reduce over a
    one-rank group of it on the device returns each of ``dtypes`` (the plan's parameter and autocast types)
    unchanged. A backend that replicates without torch.distributed (NO_COLLECTIVE) is stated."""
    import torch
    import torch.distributed as dist

    from accelbench.contract import NO_COLLECTIVE

    name = backend.collective_backend(device)
    if name is NO_COLLECTIVE:
        return NotProven("collectives", "the backend replicates without torch.distributed (NO_COLLECTIVE)")
    if not isinstance(name, str) or not name:
        raise ContractViolation(
            f"collectives: collective_backend({device}) returned {name!r}, not a backend name"
        )
    available = getattr(dist, "is_backend_available", None)
    if available is not None and not available(name):
        raise ContractViolation(
            f"collectives: collective_backend({device}) names {name!r}, which this torch.distributed does not have "
            f"(torch {torch.__version__}; the vendor's package registers its backend when imported: does "
            "setup_device import it?)"
        )
    if dist.is_initialized():
        return NotProven("collectives", "a process group is already initialised in this process")
    done: list[str] = []
    dist.init_process_group(name, store=dist.HashStore(), rank=0, world_size=1)
    try:
        for dtype in dtypes:
            try:
                tensor = torch.full((8,), 3.0, dtype=dtype, device=device)
            except (RuntimeError, NotImplementedError) as exc:
                return NotProven(
                    "collectives", f"a tensor cannot be made on {device} eagerly ({_first_line(exc)})"
                )
            try:
                dist.all_reduce(tensor)
            except Exception as exc:  # noqa: BLE001 - named in the violation
                raise ContractViolation(
                    f"collectives: an all_reduce of {dtype} on {device} over {name!r} failed ({_first_line(exc)}): "
                    "a precision the backend declares cannot be reduced by its collective backend"
                ) from exc
            if not bool((tensor.float().cpu() == 3.0).all()):
                raise ContractViolation(
                    f"collectives: an all_reduce of {dtype} over one rank changed its values"
                )
            done.append(str(dtype).removeprefix("torch."))
    finally:
        dist.destroy_process_group()
    return Proven("collectives", f"{name!r} reduced {', '.join(done)} on {device}")


def declared_dtypes(backend: Backend, device: torch.device) -> list[torch.dtype]:
    """The parameter and autocast types of the precisions ``backend`` declares for ``device`` (not FP8's: no
    collective reduces them), what its collectives must reduce."""
    import torch

    found: list[torch.dtype] = []
    for name in backend.supported_precisions(device):
        plan = backend.precision_plan(name, device, {})
        for dtype_name in (plan.param_dtype, plan.autocast_dtype):
            dtype = getattr(torch, dtype_name, None) if dtype_name else None
            if isinstance(dtype, torch.dtype) and dtype.itemsize > 1 and dtype not in found:
                found.append(dtype)
    return found


# ----------------------------------------------------------------------------------------------------------------
# Local ranks: two processes on a node get two devices
# ----------------------------------------------------------------------------------------------------------------


def check_local_ranks(backend: Backend, devices: list[DeviceInfo]) -> Outcome:
    """Where two devices are detected, setting up local ranks 0 and 1 gives two different devices (one process per
    device, as the launcher starts them); the device of local rank 0 is set up again afterwards. A backend whose one
    process drives every device (NO_COLLECTIVE: an IPU's replicas) is stated."""
    from accelbench.contract import NO_COLLECTIVE, World

    if len(devices) < 2:
        return NotProven("local ranks", f"{len(devices)} device(s) detected: two ranks cannot be given two")
    if backend.collective_backend(backend.device_kind()) is NO_COLLECTIVE:
        return Proven(
            "local ranks",
            f"one process drives all {len(devices)} devices (the backend replicates without torch.distributed): "
            "there is no process per device to bind",
        )
    try:
        first = backend.setup_device(World(rank=0, local_rank=0, world_size=2, local_world_size=2), {})
        second = backend.setup_device(World(rank=1, local_rank=1, world_size=2, local_world_size=2), {})
    finally:
        backend.setup_device(World(), {})
    if first == second:
        raise ContractViolation(
            f"local ranks: local ranks 0 and 1 were both given {first} where {len(devices)} devices are detected: "
            "setup_device ignores world.local_rank, so every process of a node would train on one device"
        )
    return Proven("local ranks", f"local ranks 0 and 1 got {first} and {second}")


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"
