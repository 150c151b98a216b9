"""The device mesh of a ``tp``, ``pp`` or ``mesh`` run: torch's ``DeviceMesh`` from the run's
:class:`~accelbench.parallel_dims.ParallelDims` (which rank sits where, which groups cross nodes), and the refusals
that need the model.

``--mesh`` is parsed and made canonical by :class:`accelbench.config.RunConfig` (so sweeps and records agree on it);
:meth:`ParallelDims.of` turns the canonical config into the layout the executor, the analytical model and the record
share.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import torch

from accelbench.config import RunConfig
from accelbench.contract import Executor, ExecutorRequest
from accelbench.errors import ConfigError
from accelbench.parallel_dims import ParallelDims

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from accelbench.workloads import ModelUnits


class MeshExecutor(Executor):
    """What every executor of a ``--mesh`` starts from: the request, the mesh's layout checked against the job's
    ranks, this rank's coordinates on it, the precision plan's autocast and the clipping norm (set by ``setup``)."""

    def __init__(self, request: ExecutorRequest) -> None:
        self.request = request
        self.backend = request.backend
        self.device = request.device
        config = request.config
        if config.mesh is None:
            raise ConfigError(f"strategy {config.strategy!r} needs a mesh (--mesh AXIS=SIZE,...)")
        self.layout = ParallelDims.of(config)
        if self.layout.world != request.world.world_size:
            raise ConfigError(
                f"--mesh {config.mesh} covers {self.layout.world} ranks, but the job has {request.world.world_size}"
            )
        self.rank, self.world = request.world.rank, request.world.world_size
        self.coordinates = self.layout.coordinates(self.rank)
        dtype = request.precision.torch_autocast_dtype
        self._autocast: Any = (
            torch.autocast(self.device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
        )
        self._clip: float | None = None


def build_device_mesh(layout: ParallelDims, device_type: str) -> DeviceMesh:
    """torch's DeviceMesh over the job's ranks, dimensions named by axis in placement order. With FSDP2 on the data
    axis beside tensor parallelism (no expert axis), the dp and tp dimensions flattened into one more
    (``DeviceMesh._flatten``, as torchtitan flattens its data axes; torch 2.13 has no public form): a gradient is a
    DTensor sharded over both, and its norm (clipping's) is then reduced in one all-reduce, where DTensor otherwise
    runs one per dimension and warns of it on every rank."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device_type, tuple(layout.sizes.values()), mesh_dim_names=tuple(layout.sizes))
    if layout.shards_parameters and layout.tp > 1 and layout.ep == 1:
        mesh[tuple(axis for axis in layout.order if axis in ("dp", "tp"))]._flatten("dp_tp")
    return mesh


def check_model_split(config: RunConfig, units: ModelUnits, workload: str) -> None:
    """Refuse, before launch, a layout the model cannot be split into: a tensor-parallel size that does not divide
    the heads or the width (or, with sequence parallelism, the sequence), more pipeline stages than units, or a
    workload that does not say how to split it. ``config`` is canonical (its mesh parsed and checked)."""
    if config.mesh is None:
        raise ConfigError(f"strategy {config.strategy!r} needs a mesh (--mesh AXIS=SIZE,...)")
    layout = ParallelDims.of(config)
    tp, stages = layout.tp, layout.stages
    if layout.ep > 1:
        if not units.experts:
            raise ConfigError(
                f"--mesh {config.mesh}: an expert-parallel (ep) axis shards a mixture of experts' experts, and workload "
                f"{workload!r} has none; use --workload moe, or a data axis (--strategy ddp/fsdp)"
            )
        if units.experts % layout.ep:
            fits = [n for n in range(2, units.experts + 1) if units.experts % n == 0]
            raise ConfigError(
                f"--mesh {config.mesh}: {units.experts} experts per layer do not divide over ep={layout.ep} ranks; "
                f"an ep size must divide {units.experts}: {', '.join(map(str, fits))}"
            )
    if tp > 1:
        if not units.tp_plan:
            raise ConfigError(
                f"workload {workload!r} declares no tensor-parallel plan (ModelUnits.tp_plan): it cannot run a tp axis"
            )
        for what, size in units.tp_divides:
            if size % tp:
                fits = [n for n in range(1, size + 1) if all(s % n == 0 for _, s in units.tp_divides)]
                raise ConfigError(
                    f"tensor parallelism over {tp} devices does not divide the model's {size} {what}; a tp size "
                    f"must divide {' and '.join(f'{s} {w}' for w, s in units.tp_divides)}: {', '.join(map(str, fits))}"
                )
        length = units.sequence_length
        if layout.sequence_parallel and length and length % tp:
            raise ConfigError(
                f"--sequence-parallel over {tp} devices shards the sequence of {length} positions unevenly; "
                f"choose a block size divisible by {tp}, or leave sequence parallelism off"
            )
    if layout.pipelined:
        missing = [n for n in ("stem_method", "head_method", "loss_method") if getattr(units, n) is None]
        if missing:
            raise ConfigError(
                f"workload {workload!r} does not say how to run its model in pieces (ModelUnits.{missing[0]}): it "
                "cannot run a pp axis"
            )
        if stages > len(units.units):
            per = f"{layout.pp} ranks x {layout.virtual_stages} stages each"
            raise ConfigError(
                f"{stages} pipeline stages ({per}) for a model of {len(units.units)} layers: a stage needs at "
                "least one layer; use fewer pipeline ranks or --virtual-stages, or a deeper model"
            )
