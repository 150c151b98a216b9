"""Workloads: what is trained. The core ships the GPT reference workload; plugins may register more."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from accelbench.config import RunConfig

Batch = tuple[torch.Tensor, torch.Tensor]


class BatchSource(Protocol):
    """Training data for one run. Batches are produced on the host; the runner moves them to the device."""

    samples_per_epoch: int

    def steps(self, rank: int, world_size: int) -> int:
        """How many batches ``batches`` yields for this rank."""
        ...

    def batches(self, epoch: int, rank: int, world_size: int) -> Iterator[Batch]:
        """This rank's share of one epoch, as (inputs, targets) host tensors. Deterministic per seed and epoch."""
        ...

    def describe(self) -> dict[str, Any]:
        """Facts for the result record (source, size, vocabulary, where batches are made)."""
        ...

    # Optional: ``to_device(device, placement) -> BatchSource | None``, the same batches made on an accelerator
    # (``placement`` is 'auto' or 'device'; None declines, for 'auto' only). The runner uses it when the run's
    # --data-placement allows; sources without it are copied to the device batch by batch.


@dataclass
class TrainingJob:
    """A workload built for one run: model, data, optimizer recipe and the FLOPs it costs."""

    model: torch.nn.Module  # forward(inputs, targets) -> scalar loss
    data: BatchSource
    make_optimizer: Callable[[torch.nn.Module, torch.device], torch.optim.Optimizer]
    flops_per_sample: float
    flops_formula: str
    tokens_per_sample: int
    grad_clip_norm: float | None = 1.0
    summary: dict[str, Any] = field(default_factory=dict)


class Workload(Protocol):
    """A named workload. Register instances through the ``accelbench_register_workloads`` hook."""

    name: str
    description: str

    def build(self, config: RunConfig) -> TrainingJob:
        """Build model and data for ``config``; raise ``ValueError`` with an actionable message on bad input."""
        ...

    def model_names(self) -> list[str]:
        """The size names ``--model`` accepts."""
        ...
