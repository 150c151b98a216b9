"""Side measurements around each timed epoch, as trackers: each starts just before the epoch's timed region and
stops just after it, and writes what it saw into the rank's log. The runner's loop times the steps and nothing
else; what else an epoch is measured by is the list :func:`epoch_trackers` returns.

- :class:`BackendReadings`: the backend's own epoch readings (``Backend.epoch_start``/``epoch_end``): peak memory,
  energy from the device's counter, telemetry; on rank 0, the node's power from its BMC (:mod:`accelbench.ipmi`).
- :class:`HostLoad`: this process's CPU seconds, its threads' waits for a core and the host's load, which say
  whether the host was contended while the epoch ran.

Trackers start in order and stop in reverse (the backend's readings enclose the host's, as the stock
``epoch_start`` resets allocator peaks before anything else is read). Both starting and stopping happen outside the
timed region: the runner synchronises the device between the trackers' start and its timer, and stops its timer
before they stop.

What runs *after* the timed epochs (the ``--profile`` window and the prediction stored in the record) is not a
tracker: a profiler around a timed epoch would change what is timed, and the prediction measures nothing. They
are the runner's follow-up steps, each preceded by a draft of the record so that it can never cost the epochs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from accelbench.hostinfo import CpuUsage, cpu_usage
from accelbench.ipmi import NodePowerReader

if TYPE_CHECKING:
    import torch

    from accelbench.contract import Backend, Executor, MemoryStats
    from accelbench.engine.metrics import RankLog


class EpochTracker(Protocol):
    """A side measurement of one timed epoch."""

    def start(self) -> None:
        """Just before the epoch's timed region (before the device is synchronised and the timer starts)."""
        ...

    def stop(self, log: RankLog) -> None:
        """Just after it (the device synchronised, the timer stopped): append this epoch's readings to ``log``."""
        ...


class BackendReadings:
    """The backend's epoch readings: peak memory since :meth:`start` (the last epoch's is kept in :attr:`memory`,
    with the reserved peak as the headline where the executor replays graphs), the energy its device counter saw,
    its telemetry."""

    def __init__(self, backend: Backend, device: torch.device, executor: Executor, rank: int = 0) -> None:
        self.backend, self.device, self.executor = backend, device, executor
        self.memory: MemoryStats | None = None
        # the node's BMC (IPMI DCMI), read by rank 0 beside its telemetry (the record keeps rank 0's alone)
        self.node_power = NodePowerReader() if rank == 0 else None

    def start(self) -> None:
        self.backend.epoch_start(self.device)
        if self.node_power is not None:
            self.node_power.begin()

    def stop(self, log: RankLog) -> None:
        readings = self.backend.epoch_end(self.device)
        self.memory = memory_seen(readings.memory, self.executor)
        log.epoch_peak_bytes.append(self.memory.peak_bytes)
        node = self.node_power.end() if self.node_power is not None else {}
        log.epoch_telemetry.append({**readings.telemetry, **node})
        log.epoch_energy_j.append(readings.energy.joules if readings.energy else None)
        if readings.energy:
            log.energy_domain, log.energy_source = readings.energy.domain, readings.energy.source


class HostLoad:
    """This process's CPU seconds over the epoch, its threads' time waiting for a core (Linux's schedstat; None
    elsewhere), the share of its cores' time a virtual machine's hypervisor stole (/proc/stat; 0 on bare metal)
    and the host's 1-minute load at the epoch's end."""

    def __init__(self) -> None:
        self._before: CpuUsage | None = None

    def start(self) -> None:
        self._before = cpu_usage()

    def stop(self, log: RankLog) -> None:
        after, before = cpu_usage(), self._before
        assert before is not None, "HostLoad.stop before start"
        log.epoch_cpu_s.append(after.cpu_s - before.cpu_s)
        log.epoch_cpu_wait_s.append(
            max(0.0, after.wait_s - before.wait_s)
            if after.wait_s is not None and before.wait_s is not None
            else None
        )
        log.epoch_load.append(after.load_1m)
        log.epoch_steal.append(after.steal_since(before))


def epoch_trackers(
    backend: Backend, device: torch.device, executor: Executor, rank: int = 0
) -> tuple[BackendReadings, HostLoad]:
    """The side measurements of every timed epoch of global rank ``rank``, in the order they start."""
    return BackendReadings(backend, device, executor, rank), HostLoad()


def memory_seen(memory: MemoryStats, executor: Executor) -> MemoryStats:
    """The backend's memory reading, with the reserved peak as the headline when the executor replays graphs
    (their private pool is invisible to the allocated-bytes peak); said so in ``source``."""
    if not executor.replays_graphs or memory.peak_reserved_bytes is None:
        return memory
    return memory.model_copy(
        update={
            "peak_bytes": max(memory.peak_reserved_bytes, memory.peak_bytes or 0),
            "source": f"reserved peak: steps replay CUDA graphs from a private memory pool that the allocated "
            f"peak does not see (allocated peak {memory.peak_bytes} bytes; {memory.source})",
        }
    )
