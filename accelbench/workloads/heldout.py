"""Held-out data for the validation loss (:mod:`accelbench.engine.quality`): a split of the corpus never trained on.

The text workloads (GPT, Llama) sample training windows at random offsets in a corpus. Their held-out split is the
corpus's last tenth (:data:`HELD_OUT_FRACTION`): training windows are drawn from the part before it only, so no
held-out token is ever trained on, and the validation windows are the held-out part's consecutive, non-overlapping
windows, in order: the same every epoch, on every backend, for a seed. A corpus too short to keep a tenth apart and
still hold a window on each side has no held-out split (the record says so).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

HELD_OUT_FRACTION = 0.1


def held_out_start(length: int, window: int) -> int | None:
    """Where the held-out tail of a corpus of ``length`` tokens begins, for windows of ``window`` tokens (inputs and
    the next token); None where either side would be shorter than a window plus one token."""
    start = length - math.ceil(length * HELD_OUT_FRACTION)
    if start < window + 1 or length - start < window:
        return None
    return start


class HeldOutWindows:
    """The validation windows of ``window`` tokens between ``start`` and ``end`` of a corpus, ``gather`` turning an
    array of token positions into token ids. Rank ``r`` of ``n`` takes windows ``r, r + n, ...`` (padded by wrapping,
    so every rank evaluates the same number of batches and collectives inside evaluation meet)."""

    def __init__(
        self, gather: Callable[[np.ndarray], np.ndarray], start: int, end: int, window: int, batch_size: int
    ) -> None:
        self.gather = gather
        self.start, self.end, self.window, self.batch_size = start, end, window, batch_size
        self.samples_per_epoch = (end - start) // window

    def _rank_samples(self, world_size: int) -> int:
        return math.ceil(self.samples_per_epoch / world_size)

    def steps(self, rank: int = 0, world_size: int = 1) -> int:
        return math.ceil(self._rank_samples(world_size) / self.batch_size)

    def batches(
        self, epoch: int, rank: int = 0, world_size: int = 1
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's validation windows (the same whatever ``epoch``: a fixed held-out set)."""
        order = np.resize(np.arange(self.samples_per_epoch), self._rank_samples(world_size) * world_size)
        starts = self.start + order[rank::world_size] * self.window
        offsets = np.arange(self.window, dtype=np.int64)
        for step in range(self.steps(rank, world_size)):
            idx = starts[step * self.batch_size : (step + 1) * self.batch_size]
            windows = torch.from_numpy(self.gather(idx[:, None] + offsets).astype(np.int64))
            yield windows[:, :-1], windows[:, 1:]

    def describe(self) -> dict[str, Any]:
        return {
            "split": f"the corpus's last {HELD_OUT_FRACTION:.0%} (tokens {self.start} to {self.end}, never trained "
            f"on), as {self.samples_per_epoch} consecutive windows of {self.window - 1} + 1 tokens",
            "samples": self.samples_per_epoch,
        }
