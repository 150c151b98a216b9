"""A run's parallel layout as one object: :class:`ParallelDims` (torchtitan's pattern), torch-free.

Every part of accelbench that needs the layout reads it from here: the run configuration (``--mesh`` made canonical,
the pipeline's options checked), the tensor/pipeline-parallel executor (ranks, groups, stages, torch's
``DeviceMesh``), the analytical model (sizes, schedule, microbatches) and the report (a mesh label's sizes).

The axes have generic names: ``dp`` (data), ``tp`` (tensor), ``pp`` (pipeline), ``ep`` (expert: a mixture of
experts' routed experts sharded over its ranks, which are data-parallel for everything else). On the command line the data axis is
written by what runs on it: ``dp`` (FSDP2, the default), ``fsdp`` or ``ddp``. Ranks are laid out row-major over the
axes in placement order, as ``init_device_mesh`` lays them: the innermost axis takes consecutive ranks, and since
launchers number the ranks of a node consecutively, it stays inside a node whenever its size divides the devices per
node. The default order, ``pp, dp, tp``, puts tensor parallelism inside a node and pipeline stages across nodes,
which seed 001 found fastest (tensor parallelism's all-reduces on every layer need the node's fast links; a pipeline
sends once per microbatch boundary). The expert axis sits inside the data axis (``pp, dp, ep, tp``): its all_to_all
exchanges, two per MoE layer forward and two backward, want the node's links too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from accelbench.contract.strategies import Strategy

if TYPE_CHECKING:
    from accelbench.config import RunConfig

# the data axis's spellings -> what runs on it
DATA_AXES = {"dp": "fsdp", "fsdp": "fsdp", "ddp": "ddp"}
MESH_AXES = ("dp", "tp", "pp", "ep")  # generic names, as --placement lists them
DEFAULT_ORDER = ("pp", "dp", "ep", "tp")  # outermost first: tensor parallelism innermost (inside a node)
# torch.distributed.pipelining's schedules by accelbench's names -> the stages each pipeline rank holds: "one"; "loop"
# (v >= 1 stages, rank r holding stages r, r+p, ...; default 2); "v" (exactly 2, V-shaped: r and 2p-1-r)
PP_SCHEDULES = {
    "gpipe": "one",
    "1f1b": "one",
    "interleaved-1f1b": "loop",
    "looped-bfs": "loop",
    "interleaved-zb": "loop",
    "zbv": "v",
    "dualpipev": "v",
}
# Schedules that split a stage's backward into its input gradient and, later, its weight gradient (zero bubble):
# torch's split backward and activation checkpointing do not compose (pytorch/pytorch#136766: memory grows until it
# runs out; on a CPU here a checkpointed gpt-micro step took 2-3 times interleaved 1F1B's)
SPLIT_BACKWARD_SCHEDULES = frozenset({"interleaved-zb", "zbv", "dualpipev"})


def fewest_microbatches(schedule: str, pipeline_ranks: int, virtual_stages: int) -> int:
    """The fewest microbatches torch's ``schedule`` accepts: 1F1B needs one per pipeline rank, DualPipeV one per
    stage; the others run any number."""
    if schedule == "1f1b":
        return pipeline_ranks
    if schedule == "dualpipev":
        return pipeline_ranks * virtual_stages
    return 1


def parse_mesh(text: str) -> dict[str, int]:
    """``--mesh`` text -> sizes by axis, canonical: ``dp=2,tp=2`` -> ``{"fsdp": 2, "tp": 2}``. The data axis is named
    by what runs on it (dp means FSDP2), axes come in the order data, tp, pp, and axes of size 1 are left out.
    Raises ValueError saying what is wrong and what would work."""
    sizes: dict[str, int] = {}
    for part in text.replace(" ", "").split(","):
        axis, sep, size = part.partition("=")
        axis = axis.lower()
        if (
            not sep
            or not size.isdigit()
            or int(size) < 1
            or (axis not in DATA_AXES and axis not in ("tp", "pp", "ep"))
        ):
            raise ValueError(
                f"--mesh {text!r}: {part!r} is not AXIS=SIZE; write sizes of the axes dp (FSDP2; or fsdp, ddp), tp, "
                "pp and ep (experts), e.g. --mesh dp=2,tp=2"
            )
        name = DATA_AXES.get(axis, axis)
        if any(generic_axis(a) == generic_axis(name) for a in sizes):
            raise ValueError(f"--mesh {text!r}: the {generic_axis(name)} axis is given twice")
        sizes[name] = int(size)
    order = ("fsdp", "ddp", "ep", "tp", "pp")
    return {axis: sizes[axis] for axis in order if sizes.get(axis, 1) > 1}


def format_mesh(sizes: Mapping[str, int]) -> str:
    """Canonical ``--mesh`` text of :func:`parse_mesh`'s sizes: ``fsdp=2,tp=2``."""
    return ",".join(f"{axis}={size}" for axis, size in sizes.items())


def generic_axis(axis: str) -> str:
    """``fsdp``/``ddp``/``dp`` -> ``dp``; ``tp``, ``pp``, ``ep`` unchanged."""
    return "dp" if axis in DATA_AXES else axis


@dataclass(frozen=True)
class ParallelDims:
    """How a job's ranks divide the work: the sizes of the data, tensor, pipeline and expert axes (1 where absent),
    what runs on the data axis, the placement order, and the pipeline's schedule, microbatches and stages per rank.

    Built from a run configuration with :meth:`of` (for any strategy: ddp, fsdp and ZeRO are a dp axis over the
    whole job), or directly for the analytical model."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1  # expert-parallel ranks: each holds 1/ep of every layer's routed experts
    data_parallel: str | None = (
        None  # what runs on the dp axis: fsdp, ddp or a ZeRO strategy; None without one
    )
    placement: str = "auto"  # "auto" or the order given (--placement)
    ranks_per_node: int = 0  # 0: every rank on one node
    schedule: str = "1f1b"
    microbatches: int = 1
    virtual_stages: int = 1
    split: str = "layers"
    sequence_parallel: bool = False

    @classmethod
    def of(cls, config: RunConfig) -> ParallelDims:
        """The layout of a (canonical) run configuration: its ``--mesh`` for tp, pp and mesh runs, else a data axis
        over the whole job (``--devices x --nnodes``) run by the strategy."""
        if config.mesh is None:
            world = config.devices * config.nnodes
            return cls(
                dp=world,
                data_parallel=config.strategy if world > 1 and config.strategy != Strategy.SINGLE else None,
                ranks_per_node=config.devices,
            )
        canonical = parse_mesh(config.mesh)
        pipelined = canonical.get("pp", 1) > 1
        return cls(
            dp=next((s for a, s in canonical.items() if a in DATA_AXES.values()), 1),
            tp=canonical.get("tp", 1),
            pp=canonical.get("pp", 1),
            ep=canonical.get("ep", 1),
            data_parallel=next((a for a in canonical if a in DATA_AXES.values()), None),
            placement=config.placement,
            ranks_per_node=config.devices,
            schedule=config.pp_schedule,
            microbatches=(config.microbatches or 1) if pipelined else 1,
            virtual_stages=(config.virtual_stages or 1) if pipelined else 1,
            split=config.pp_split,
            sequence_parallel=config.sequence_parallel,
        )

    @classmethod
    def from_mesh(cls, text: str, **rest: Any) -> ParallelDims:
        """The layout of ``--mesh`` text alone (a record's or a label's), other fields as given."""
        canonical = parse_mesh(text)
        return cls(
            dp=next((s for a, s in canonical.items() if a in DATA_AXES.values()), 1),
            tp=canonical.get("tp", 1),
            pp=canonical.get("pp", 1),
            ep=canonical.get("ep", 1),
            data_parallel=next((a for a in canonical if a in DATA_AXES.values()), None),
            **rest,
        )

    # -- sizes ---------------------------------------------------------------------------------------------------

    def size(self, axis: str) -> int:
        return {"dp": self.dp, "tp": self.tp, "pp": self.pp, "ep": self.ep}[generic_axis(axis)]

    @property
    def order(self) -> tuple[str, ...]:
        """The axes larger than 1, outermost first."""
        given = DEFAULT_ORDER if self.placement == "auto" else tuple(self.placement.split(","))
        return tuple(axis for axis in given if self.size(axis) > 1)

    @property
    def sizes(self) -> dict[str, int]:
        """Generic axis -> size, for the axes larger than 1, in placement order (outermost first)."""
        return {axis: self.size(axis) for axis in self.order}

    @property
    def _axes(self) -> tuple[str, ...]:
        """The axes a layout speaks of: dp, tp and pp always (size 1 where absent), ep where experts are sharded."""
        return MESH_AXES if self.ep > 1 else tuple(a for a in MESH_AXES if a != "ep")

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp * self.ep

    @property
    def model_parallel(self) -> int:
        """Devices one replica of the model spans (tensor x pipeline)."""
        return self.tp * self.pp

    @property
    def pipelined(self) -> bool:
        return self.pp > 1

    @property
    def stages(self) -> int:
        """Pipeline stages in all: pipeline ranks x stages per rank."""
        return self.pp * self.virtual_stages

    @property
    def shards_parameters(self) -> bool:
        """Whether the data axis shards the parameters (FSDP2), so each device holds 1/dp of them."""
        return self.dp > 1 and self.data_parallel == Strategy.FSDP

    # -- ranks ---------------------------------------------------------------------------------------------------

    def coordinates(self, rank: int) -> dict[str, int]:
        """This rank's index along each axis (0 along absent axes): row-major over the placement order."""
        out = dict.fromkeys(self._axes, 0)
        for axis in reversed(self.order):
            size = self.size(axis)
            out[axis], rank = rank % size, rank // size
        return out

    def rank_of(self, coordinates: Mapping[str, int]) -> int:
        rank = 0
        for axis in self.order:
            rank = rank * self.size(axis) + coordinates[axis]
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
        per_node = self.ranks_per_node or self.world
        return all(len({r // per_node for r in g}) == 1 for g in self.groups(axis))

    # -- the pipeline --------------------------------------------------------------------------------------------

    def stage_ids(self, pp_rank: int) -> list[int]:
        """The pipeline stages rank ``pp_rank`` of the pipeline holds: one; ``pp_rank + i p`` for looped
        schedules; ``pp_rank`` and ``2p - 1 - pp_rank`` for the V-shaped ones (the first and last stage on rank 0)."""
        p = self.pp
        if PP_SCHEDULES.get(self.schedule) == "v":
            return [pp_rank, 2 * p - 1 - pp_rank]
        return [pp_rank + i * p for i in range(self.virtual_stages)]

    def stage_holder(self, stage: int) -> int:
        """The pipeline rank holding ``stage`` (the inverse of :meth:`stage_ids`)."""
        p = self.pp
        if PP_SCHEDULES.get(self.schedule) == "v":
            return stage if stage < p else 2 * p - 1 - stage
        return stage % p

    # -- the record ----------------------------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """The mesh for the record: sizes, order, what runs on the data axis, and where each axis's groups sit."""
        return {
            "sizes": {axis: self.size(axis) for axis in self._axes},
            "data_parallel": self.data_parallel,
            "order": list(self.order),
            "placement": (
                (
                    "auto: pp, dp, ep, tp from outermost to innermost (expert and tensor parallelism inside a node, "
                    "pipeline stages across nodes)"
                    if self.ep > 1
                    else "auto: pp, dp, tp from outermost to innermost (tensor parallelism inside a node, pipeline "
                    "stages across nodes)"
                )
                if self.placement == "auto"
                else f"given: {', '.join(self.order)} from outermost to innermost"
            ),
            "ranks_per_node": self.ranks_per_node,
            "axes": {
                axis: {"size": size, "groups": self.groups(axis), "within_node": self.within_node(axis)}
                for axis, size in self.sizes.items()
            },
        }
