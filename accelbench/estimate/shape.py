"""The run as the formulas see it: :class:`RunShape` (strategy, precision, batch, parallel layout) and the
strategies the analytical model covers, grouped by how they spread a model."""

from __future__ import annotations

from dataclasses import dataclass

from accelbench.contract.strategies import (
    DATA_PARALLEL_STRATEGIES,
    MODEL_PARALLEL_STRATEGIES,
    ZERO_STRATEGIES,
    Strategy,
)
from accelbench.parallel_dims import ParallelDims

# every device holds a whole replica: one device, DDP, FSDP2, ZeRO 1-3
DATA_PARALLEL = (Strategy.SINGLE.value, *DATA_PARALLEL_STRATEGIES)
# one replica over several devices: tensor, pipeline, both (a mesh)
MODEL_PARALLEL = MODEL_PARALLEL_STRATEGIES
STRATEGIES = DATA_PARALLEL + MODEL_PARALLEL
# each data-parallel rank updates its shard of the parameters: FSDP2 and ZeRO 1-3
SHARDED_OPTIMIZER = (Strategy.FSDP.value, *ZERO_STRATEGIES)


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
