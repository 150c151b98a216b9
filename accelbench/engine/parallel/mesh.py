"""The device mesh of a ``tp``, ``pp`` or ``mesh`` run: which rank sits where, which groups cross nodes, and the
refusals that need the model.

``--mesh`` is parsed and made canonical by :class:`accelbench.config.RunConfig` (so sweeps and records agree on it);
this module turns the canonical config into a :class:`Layout` and builds torch's ``DeviceMesh`` from it. Ranks are
laid out row-major over the axes in placement order, as ``init_device_mesh`` lays them: the innermost axis takes
consecutive ranks, and since launchers number the ranks of a node consecutively, it stays inside a node whenever its
size divides the devices per node. The default order, ``pp, dp, tp``, puts tensor parallelism inside a node and
pipeline stages across nodes, which seed 001 found fastest (tensor parallelism's all-reduces on every layer need the
node's fast links; a pipeline sends once per microbatch boundary).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from accelbench.config import DATA_AXES, PP_SCHEDULES, RunConfig, parse_mesh
from accelbench.errors import ConfigError
from accelbench.estimate.parallel import MeshShape

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from accelbench.workloads import ModelUnits

DEFAULT_ORDER = ("pp", "dp", "tp")  # outermost first: tensor parallelism innermost (inside a node)


@dataclass(frozen=True)
class Layout:
    """A run's parallel layout, from its (canonical) config: sizes of the axes dp, tp, pp (1 where absent), what
    runs on the data axis, the placement order, and the pipeline's schedule, microbatches and stages per rank."""

    sizes: dict[str, int] = field(
        hash=False
    )  # generic axis -> size > 1, in placement order (outermost first)
    data_parallel: str | None  # "fsdp" or "ddp" when there is a dp axis
    placement: str  # "auto" or the order given
    ranks_per_node: int
    schedule: str
    microbatches: int
    virtual_stages: int
    split: str
    sequence_parallel: bool

    @classmethod
    def of(cls, config: RunConfig) -> Layout:
        if config.mesh is None:
            raise ConfigError(f"strategy {config.strategy!r} needs a mesh (--mesh AXIS=SIZE,...)")
        canonical = parse_mesh(config.mesh)
        generic = {("dp" if axis in DATA_AXES.values() else axis): size for axis, size in canonical.items()}
        order = DEFAULT_ORDER if config.placement == "auto" else tuple(config.placement.split(","))
        pipelined = "pp" in generic
        return cls(
            sizes={axis: generic[axis] for axis in order if axis in generic},
            data_parallel=next((a for a in canonical if a in DATA_AXES.values()), None),
            placement=config.placement,
            ranks_per_node=config.devices,
            schedule=config.pp_schedule if pipelined else "",
            microbatches=(config.microbatches or 1) if pipelined else 1,
            virtual_stages=(config.virtual_stages or 1) if pipelined else 1,
            split=config.pp_split,
            sequence_parallel=config.sequence_parallel,
        )

    def size(self, axis: str) -> int:
        return self.sizes.get(axis, 1)

    def shape(self) -> MeshShape:
        """The layout as the analytical model takes it (:mod:`accelbench.estimate.parallel`)."""
        return MeshShape(
            dp=self.size("dp"),
            tp=self.size("tp"),
            pp=self.size("pp"),
            data_parallel=self.data_parallel or "fsdp",
            schedule=self.schedule or "1f1b",
            microbatches=self.microbatches,
            virtual_stages=self.virtual_stages,
            sequence_parallel=self.sequence_parallel,
        )

    @property
    def order(self) -> tuple[str, ...]:
        return tuple(self.sizes)

    @property
    def world(self) -> int:
        out = 1
        for size in self.sizes.values():
            out *= size
        return out

    @property
    def stages(self) -> int:
        """Pipeline stages in all: pipeline ranks x stages per rank."""
        return self.size("pp") * self.virtual_stages

    def coordinates(self, rank: int) -> dict[str, int]:
        """This rank's index along each axis (0 along absent axes): row-major over the placement order."""
        out = {axis: 0 for axis in ("dp", "tp", "pp")}
        for axis in reversed(self.order):
            size = self.sizes[axis]
            out[axis], rank = rank % size, rank // size
        return out

    def rank_of(self, coordinates: dict[str, int]) -> int:
        rank = 0
        for axis in self.order:
            rank = rank * self.sizes[axis] + coordinates[axis]
        return rank

    def group(self, axis: str, rank: int) -> list[int]:
        """The ranks that differ from ``rank`` only along ``axis`` (its process group on that axis)."""
        here = self.coordinates(rank)
        return [self.rank_of({**here, axis: i}) for i in range(self.size(axis))]

    def groups(self, axis: str) -> list[list[int]]:
        """Every group of ``axis``, each once, in rank order."""
        seen: dict[int, list[int]] = {}
        for rank in range(self.world):
            members = self.group(axis, rank)
            seen.setdefault(members[0], members)
        return list(seen.values())

    def within_node(self, axis: str) -> bool:
        """Whether every group of ``axis`` lies on one node (ranks numbered consecutively per node)."""
        return all(len({r // self.ranks_per_node for r in g}) == 1 for g in self.groups(axis))

    def stage_ids(self, pp_rank: int) -> list[int]:
        """The pipeline stages rank ``pp_rank`` of the pipeline holds: one; ``pp_rank + i p`` for looped
        schedules; ``pp_rank`` and ``2p - 1 - pp_rank`` for the V-shaped ones (the first and last stage on rank 0)."""
        p = self.size("pp")
        if PP_SCHEDULES.get(self.schedule) == "v":
            return [pp_rank, 2 * p - 1 - pp_rank]
        return [pp_rank + i * p for i in range(self.virtual_stages)]

    def stage_holder(self, stage: int) -> int:
        """The pipeline rank holding ``stage`` (the inverse of :meth:`stage_ids`)."""
        p = self.size("pp")
        if PP_SCHEDULES.get(self.schedule) == "v":
            return stage if stage < p else 2 * p - 1 - stage
        return stage % p

    def describe(self) -> dict[str, Any]:
        """The mesh for the record: sizes, order, what runs on the data axis, and where each axis's groups sit."""
        return {
            "sizes": {axis: self.size(axis) for axis in ("dp", "tp", "pp")},
            "data_parallel": self.data_parallel,
            "order": list(self.order),
            "placement": (
                "auto: pp, dp, tp from outermost to innermost (tensor parallelism inside a node, pipeline stages "
                "across nodes)"
                if self.placement == "auto"
                else f"given: {', '.join(self.order)} from outermost to innermost"
            ),
            "ranks_per_node": self.ranks_per_node,
            "axes": {
                axis: {"size": size, "groups": self.groups(axis), "within_node": self.within_node(axis)}
                for axis, size in self.sizes.items()
            },
        }


def build_device_mesh(layout: Layout, device_type: str) -> DeviceMesh:
    """torch's DeviceMesh over the job's ranks, dimensions named by axis in placement order."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, tuple(layout.sizes.values()), mesh_dim_names=tuple(layout.sizes))


def check_model_split(config: RunConfig, units: ModelUnits, workload: str) -> None:
    """Refuse, before launch, a layout the model cannot be split into: a tensor-parallel size that does not divide
    the heads or the width (or, with sequence parallelism, the sequence), more pipeline stages than units, or a
    workload that does not say how to split it. ``config`` is canonical (its mesh parsed and checked)."""
    layout = Layout.of(config)
    tp, stages = layout.size("tp"), layout.stages
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
    if layout.size("pp") > 1:
        missing = [n for n in ("stem_method", "head_method", "loss_method") if getattr(units, n) is None]
        if missing:
            raise ConfigError(
                f"workload {workload!r} does not say how to run its model in pieces (ModelUnits.{missing[0]}): it "
                "cannot run a pp axis"
            )
        if stages > len(units.units):
            per = f"{layout.size('pp')} ranks x {layout.virtual_stages} stages each"
            raise ConfigError(
                f"{stages} pipeline stages ({per}) for a model of {len(units.units)} layers: a stage needs at "
                "least one layer; use fewer pipeline ranks or --virtual-stages, or a deeper model"
            )
