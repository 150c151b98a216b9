"""The configurations worth considering for a model on a device count: every strategy and mesh layout
(dp x tp x pp, and ep for a mixture of experts, = the job's devices) the model splits into, every per-device batch
and accumulation (reaching ``--global-batch`` when given), every pipeline schedule and microbatch count of a
pipelined layout, every precision asked for, with and without activation checkpointing as asked. Each is a validated
:class:`~accelbench.config.RunConfig`, exactly what ``accelbench run`` would run; a combination the configuration or
the model refuses is not offered, and the reason is counted (the plan says how many and why)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from accelbench.contract.strategies import Strategy
from accelbench.errors import ConfigError
from accelbench.plan.arguments import PLANNED_SCHEDULES

if TYPE_CHECKING:
    from accelbench.config import RunConfig
    from accelbench.workloads import ModelUnits

DATA_PARALLEL = ("ddp", "fsdp", "deepspeed-zero1", "deepspeed-zero2", "deepspeed-zero3")
MODEL_PARALLEL = ("tp", "pp", "mesh")
PLANNABLE = ("single", *DATA_PARALLEL, *MODEL_PARALLEL)


@dataclass(frozen=True)
class Layout:
    """How the job's devices are used: a strategy and its mesh sizes (data-parallel, tensor, pipeline, expert)."""

    strategy: str
    dp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1

    @property
    def mesh(self) -> str | None:
        """``--mesh`` for tensor, pipeline or expert parallelism (the data axis as FSDP2's ``dp``); None for the
        others."""
        if self.strategy not in MODEL_PARALLEL:
            return None
        sizes = (("dp", self.dp), ("tp", self.tp), ("pp", self.pp), ("ep", self.ep))
        return ",".join(f"{axis}={size}" for axis, size in sizes if size > 1)

    @property
    def replicas(self) -> int:
        """The replicas training their own share of the batch: the data axis, times the expert axis (each ep rank
        trains its own share, as a data-parallel replica does)."""
        return self.dp * self.ep

    def text(self) -> str:
        """dp x tp x pp (x ep), as the table shows it."""
        return f"dp{self.dp} tp{self.tp} pp{self.pp}" + (f" ep{self.ep}" if self.ep > 1 else "")


@dataclass
class Candidates:
    """The configurations to price, and the combinations not offered (reason -> how many)."""

    configs: list[RunConfig] = field(default_factory=list)
    layouts: list[Layout] = field(default_factory=list)  # each config's layout, in step with configs
    not_offered: Counter[str] = field(default_factory=Counter)


def layouts(world: int, strategies: Sequence[str], experts: int = 0) -> list[Layout]:
    """Every layout of ``world`` devices the strategies name: one device alone (``single``, only for one device),
    data parallelism over all of them, and the dp x tp x pp meshes whose product is ``world`` (``tp``: tp alone,
    ``pp``: pp alone, ``mesh``: two or three axes above 1). For a mixture of ``experts`` experts per layer, also the
    meshes with an expert axis whose size divides them (``mesh``, whatever the other axes)."""
    out: list[Layout] = []
    for name in strategies:
        if name == "single":
            if world == 1:
                out.append(Layout("single"))
        elif name in DATA_PARALLEL and world > 1:
            out.append(Layout(name, dp=world))
    for ep in (e for e in _divisors(world) if e == 1 or (experts and experts % e == 0)):
        for tp in _divisors(world // ep):
            for pp in _divisors(world // (ep * tp)):
                dp = world // (ep * tp * pp)
                axes = sum(size > 1 for size in (dp, tp, pp))
                if tp == 1 and pp == 1 and ep == 1:
                    continue  # data parallelism alone: ddp/fsdp above
                kind = "mesh" if axes > 1 or ep > 1 else ("tp" if tp > 1 else "pp")
                if kind in strategies:
                    out.append(Layout(kind, dp=dp, tp=tp, pp=pp, ep=ep))
    return out


def batch_choices(
    replicas: int, batch_sizes: Sequence[int], global_batch: int | None
) -> list[tuple[int, int]]:
    """(per-replica batch, gradient accumulation) pairs: each batch size with no accumulation; or, for a global
    batch, the per-replica batch ``global_batch / replicas`` split into micro-batches of the sizes given (the
    accumulation is the number of micro-batches). Empty when the global batch cannot be reached this way."""
    if global_batch is None:
        return [(b, 1) for b in sorted(set(batch_sizes))]
    if global_batch % replicas:
        return []
    batch = global_batch // replicas
    return [
        (batch, batch // micro) for micro in sorted(set(batch_sizes)) if micro <= batch and batch % micro == 0
    ]


def microbatch_choices(pp: int, batch: int) -> list[int | None]:
    """Pipeline microbatches per step for ``pp`` stages: the stages, twice and four times them (fewer idle stages:
    the bubble (p-1)/(m+p-1) shrinks), those that divide the batch; None (no pipeline) for pp = 1."""
    if pp == 1:
        return [None]
    return [m for m in (pp, 2 * pp, 4 * pp) if m <= batch and batch % m == 0]


def schedule_choices(pp: int, schedules: Sequence[str]) -> list[str | None]:
    """The pipeline schedules to price for ``pp`` stages; None (no pipeline) for pp = 1."""
    return [None] if pp == 1 else list(schedules)


def enumerate_candidates(
    *,
    base: dict[str, Any],
    world: int,
    strategies: Sequence[str],
    precisions: Sequence[str],
    batch_sizes: Sequence[int],
    global_batch: int | None,
    units: ModelUnits,
    check: Callable[[RunConfig], object] | None = None,
    schedules: Sequence[str] = PLANNED_SCHEDULES,
    checkpointing: Sequence[bool] = (False,),
) -> Candidates:
    """Every configuration of ``base`` (workload, model, devices, nnodes, backend) over the layouts, batches,
    pipeline ``schedules`` (for a pp axis), precisions and ``checkpointing`` choices given (activation
    checkpointing off, on), validated as ``accelbench run`` validates it (the configuration's own checks and the
    model's split for tp/pp, then ``check``: the plugin host's resolution, the workload's and the strategy's own
    checks); what fails is counted in ``not_offered`` by its reason."""
    from accelbench.cli import make_config
    from accelbench.engine.parallel.mesh import check_model_split

    found = Candidates()
    for layout in layouts(world, strategies, units.experts):
        replicas = layout.replicas
        choices = batch_choices(replicas, batch_sizes, global_batch)
        if not choices:
            found.not_offered[f"{layout.strategy} {layout.text()}: --global-batch {global_batch} is not a "
                              f"whole number of samples per replica over {replicas} replica(s) in micro-batches "
                              f"of {','.join(map(str, sorted(set(batch_sizes))))}"] += 1  # fmt: skip
            continue
        options = [
            (batch, accum, schedule, microbatches, precision, checkpointed)
            for batch, accum in choices
            for schedule in schedule_choices(layout.pp, schedules)
            for microbatches in microbatch_choices(layout.pp, batch)
            for precision in precisions
            for checkpointed in checkpointing
        ]
        for batch, accum, schedule, microbatches, precision, checkpointed in options:
            values = {**base, "strategy": layout.strategy, "precision": precision, "batch_size": batch,
                      "grad_accum": accum}  # fmt: skip
            if layout.mesh is not None:
                values["mesh"] = layout.mesh
            if schedule is not None:
                values["pp_schedule"] = schedule
            if microbatches is not None:
                values["microbatches"] = microbatches
            if checkpointed:
                values["activation_checkpointing"] = True
            try:
                config = make_config(values)
                if config.mesh is not None:
                    check_model_split(config, units, config.workload)
                if check is not None:
                    check(config)
            except ConfigError as exc:
                found.not_offered[f"{layout.strategy} {layout.text()}: {_reason(exc)}"] += 1
                continue
            found.configs.append(config)
            found.layouts.append(layout)
    return found


def default_strategies(world: int, deepspeed: bool) -> list[str]:
    """single on one device; else data parallelism (ZeRO only where DeepSpeed is installed) and tp, pp, meshes."""
    if world == 1:
        return ["single"]
    return [s for s in (*DATA_PARALLEL, *MODEL_PARALLEL) if deepspeed or Strategy(s).zero_stage is None]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _reason(exc: ConfigError) -> str:
    """A refusal's first sentence, without the value-specific tail, so that equal reasons count together."""
    return str(exc).split("; ")[0]
