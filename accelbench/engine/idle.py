"""The idle baseline: the energy counters read over a short window before training, with nothing running.

A centre asks how much of a run's energy is the training and how much the node draws anyway. The epochs' energy
comes from the backend's counters (``Backend.epoch_start``/``epoch_end``: RAPL packages read once per node by its
local rank 0, a device's own counter); the idle window reads the same counters the same way, after the model is
built and compiled and before the first timed epoch, so it is in no timed figure (setup, compile, epochs). Every
rank holds still together: one tiny all-reduce decides (any rank with a readable counter makes all of them wait) and
lines them up, so no rank trains while another measures idleness. Where no rank can read a counter the window is
skipped and costs nothing. :func:`accelbench.engine.metrics.idle_baseline` turns the ranks' readings into watts.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from accelbench.contract import Backend
    from accelbench.engine.metrics import RankLog


def read_idle_power(backend: Backend, device: torch.device, seconds: float, log: RankLog) -> None:
    """Read the backend's energy counters over ``seconds`` of doing nothing into ``log`` (``idle_*``)."""
    if seconds <= 0:
        return
    backend.epoch_start(device)
    readable = backend.epoch_end(device).energy is not None  # a counter is there to read
    if not _on_any_rank(readable, device, backend):
        return
    backend.synchronize(device)
    backend.epoch_start(device)
    start = time.perf_counter()
    time.sleep(seconds)
    energy = backend.epoch_end(device).energy
    window = time.perf_counter() - start
    if energy is None:
        return
    log.idle_window_s, log.idle_energy_j, log.idle_domain = window, energy.joules, energy.domain


def _on_any_rank(flag: bool, device: torch.device, backend: Backend) -> bool:
    """``flag`` or'ed over the ranks (one tiny all-reduce where there is a process group), so all decide alike."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    dtype = torch.float64 if "float64" in backend.collective_dtypes(device) else torch.float32
    value = torch.tensor([1.0 if flag else 0.0], dtype=dtype, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return value.item() > 0
