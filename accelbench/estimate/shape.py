"""The run as the formulas see it: :class:`RunShape` (strategy, precision, batch, parallel layout) and the
strategies the analytical model covers, grouped by how they spread a model."""

from __future__ import annotations

from dataclasses import dataclass

from accelbench.contract.strategies import MODEL_PARALLEL_STRATEGIES
from accelbench.parallel_dims import ParallelDims

DATA_PARALLEL = ("single", "ddp", "fsdp", "deepspeed-zero1", "deepspeed-zero2", "deepspeed-zero3")
MODEL_PARALLEL = MODEL_PARALLEL_STRATEGIES
STRATEGIES = DATA_PARALLEL + MODEL_PARALLEL


@dataclass(frozen=True)
class RunShape:
    """The run as the formulas see it (from a RunConfig: :func:`accelbench.estimate.predictor.run_shape`): the
    strategy, precision, per-device (per-replica) batch and its accumulation steps, and the parallel layout (a data
    axis over every device for ddp, fsdp and ZeRO; the mesh for tp, pp and mesh)."""

    strategy: str
    precision: str
    batch_size: int
    dims: ParallelDims
    grad_accum: int = 1

    @property
    def devices(self) -> int:
        """Devices in the whole job."""
        return self.dims.world


def model_ranks(layout: RunShape) -> int:
    """Devices that hold one copy of the model together (tensor x pipeline), 1 for data parallelism."""
    return layout.dims.model_parallel
