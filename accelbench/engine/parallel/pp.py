"""Pipeline parallelism with ``torch.distributed.pipelining``: stages cut from the workload's units, the schedule,
and the clock that measures each rank's idle time.

- **Stages.** The units (the GPT's blocks) are dealt to ``p x v`` stages in order, by equal unit counts or balanced
  parameters (``--pp-split``); the stem joins the first stage and the head the last. A stage runs the model's own
  stem, head and loss methods (named by ``ModelUnits``), so the stages together compute exactly ``model(x, y)``.
- **Tied parameters** (the GPT's head tied to its token embedding) whose two users land on different stages are
  untied: the head's stage gets its own copy of the owner module (the embedding), starting from the same values.
  After each backward the two gradients are summed (an all-reduce between the two stages' ranks, or a local add
  when one rank holds both, as the V-shaped schedules do), so both copies take identical optimizer steps: the
  maths of the tied model, as Megatron-LM does it. The copy counts once in the gradient norm.
- **The bubble.** :class:`StageClock` timestamps the schedule's compute actions (each microbatch's forward,
  backward, and weight-gradient for the zero-bubble schedules) on this rank's stages. A step's idle time is its
  wall time less the time in those actions: the pipeline bubble plus any communication not hidden behind compute.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from accelbench.workloads import ModelUnits

# accelbench's schedule names -> torch.distributed.pipelining's
TORCH_SCHEDULES = {
    "gpipe": "GPipe",
    "1f1b": "1F1B",
    "interleaved-1f1b": "Interleaved1F1B",
    "looped-bfs": "LoopedBFS",
    "interleaved-zb": "InterleavedZeroBubble",
    "zbv": "ZBVZeroBubble",
    "dualpipev": "DualPipeV",
}
# the zero-bubble schedules: each backward split into the inputs' gradients and, later, the weights'
SPLIT_BACKWARD_SCHEDULES = ("interleaved-zb", "zbv", "dualpipev")


def split_units(
    weights: Sequence[int], stages: int, by: str, first_extra: int = 0, last_extra: int = 0
) -> list[range]:
    """Contiguous runs of unit indices, one per stage, none empty.

    ``by="layers"``: equal counts, the first stages taking one more where they do not divide. ``by="parameters"``:
    the split whose largest stage (counting ``first_extra`` parameters on the first stage, the stem, and
    ``last_extra`` on the last, the head) is smallest, found exactly by dynamic programming over the cut points.
    """
    n = len(weights)
    if not 1 <= stages <= n:
        raise ValueError(f"{stages} stages for {n} units")
    if by == "layers":
        base, extra = divmod(n, stages)
        bounds, start = [], 0
        for s in range(stages):
            stop = start + base + (1 if s < extra else 0)
            bounds.append(range(start, stop))
            start = stop
        return bounds
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)

    def cost(s: int, i: int, j: int) -> int:  # stage s holding units i..j-1
        return prefix[j] - prefix[i] + (first_extra if s == 0 else 0) + (last_extra if s == stages - 1 else 0)

    inf = float("inf")
    # best[s][j]: smallest largest-stage cost of units 0..j-1 over stages 0..s; cut[s][j]: where stage s starts
    best = [[inf] * (n + 1) for _ in range(stages)]
    cut = [[0] * (n + 1) for _ in range(stages)]
    for j in range(1, n + 1):
        best[0][j] = cost(0, 0, j)
    for s in range(1, stages):
        for j in range(s + 1, n + 1):
            for i in range(s, j):
                value = max(best[s - 1][i], cost(s, i, j))
                if value < best[s][j]:
                    best[s][j], cut[s][j] = value, i
    bounds_rev, j = [], n
    for s in range(stages - 1, 0, -1):
        i = cut[s][j]
        bounds_rev.append(range(i, j))
        j = i
    bounds_rev.append(range(0, j))
    return list(reversed(bounds_rev))


@dataclass
class TiedCopy:
    """A tied parameter untied on a stage: the ``owner`` path's module copied there for the ``user`` path."""

    user: str  # e.g. "lm_head.weight"
    owner: str  # e.g. "wte.weight"
    module: nn.Module  # the copy of the owner's module on the user's stage
    attribute: str  # its parameter's name in that module ("weight")

    @property
    def parameter(self) -> torch.Tensor:
        """The copy's current parameter (FSDP replaces parameter objects when it shards them)."""
        return getattr(self.module, self.attribute)


class StageModule(nn.Module):
    """One pipeline stage: the model's parts of this stage, run in order (the stem on the first stage, the head on
    the last). The units and the stem's and head's modules are the model's own, registered here (the latter by
    their paths, ``.`` as ``/``) so that the stage's ``parameters()`` are exactly its share; the stem and head run
    through the model's methods."""

    def __init__(
        self,
        parts: dict[str, nn.Module],
        units: list[nn.Module],
        stem: Callable[[torch.Tensor], torch.Tensor] | None,
        head: Callable[[torch.Tensor], torch.Tensor] | None,
    ) -> None:
        super().__init__()
        self.parts = nn.ModuleDict({path.replace(".", "/"): module for path, module in parts.items()})
        self.units = nn.ModuleList(units)
        # bound methods of the whole model: plain attributes, not submodules (the model is not this stage's)
        self._stem = stem
        self._head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._stem is not None:
            x = self._stem(x)
        for unit in self.units:
            x = unit(x)
        if self._head is not None:
            x = self._head(x)
        return x


@dataclass
class StagePlan:
    """Which units each of the ``stages`` stages holds (indices into ``ModelUnits.units``)."""

    bounds: list[range]
    by: str

    def stage_of(self, units: ModelUnits, module_path: str) -> int | None:
        """The stage holding the module at ``module_path`` (in the stem, a unit or the head); None if none does."""

        def inside(paths: Sequence[str]) -> bool:
            return any(module_path == p or module_path.startswith(p + ".") for p in paths)

        if inside(units.stem):
            return 0
        if inside(units.head):
            return len(self.bounds) - 1
        for stage, bounds in enumerate(self.bounds):
            if inside([units.units[i] for i in bounds]):
                return stage
        return None

    def describe(self, units: ModelUnits) -> list[dict[str, Any]]:
        last = len(self.bounds) - 1
        return [
            {
                "stage": s,
                "units": [units.units[i] for i in r],
                "stem": list(units.stem) if s == 0 else [],
                "head": list(units.head) if s == last else [],
            }
            for s, r in enumerate(self.bounds)
        ]


def plan_stages(model: nn.Module, units: ModelUnits, stages: int, by: str) -> StagePlan:
    """Deal the units to ``stages`` stages (:func:`split_units`), weighing parameters where ``by`` says so."""

    def count(paths: Sequence[str]) -> int:
        seen: set[int] = set()
        total = 0
        for module in units.modules(model, tuple(paths)):
            for p in module.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    total += p.numel()
        return total

    weights = [count([u]) for u in units.units]
    return StagePlan(split_units(weights, stages, by, count(units.stem), count(units.head)), by)


def build_stage(
    model: nn.Module, units: ModelUnits, plan: StagePlan, stage: int
) -> tuple[StageModule, list[TiedCopy]]:
    """The module of stage ``stage`` (on the host, before it is placed), and the tied parameters untied on it."""
    first, last = stage == 0, stage == len(plan.bounds) - 1
    unit_paths = [units.units[i] for i in plan.bounds[stage]]
    parts = {
        path: model.get_submodule(path)
        for path in (*(units.stem if first else ()), *(units.head if last else ()))
    }
    here = [*parts, *unit_paths]

    def holds(module_path: str) -> bool:
        return any(module_path == p or module_path.startswith(p + ".") for p in here)

    copies: list[TiedCopy] = []
    for user, owner in units.tied:
        user_module, owner_module = user.rpartition(".")[0], owner.rpartition(".")[0]
        if holds(user_module) and not holds(owner_module):
            # the head's stage lacks the embedding: give it its own copy, pointed to by the head
            clone = copy.deepcopy(model.get_submodule(owner_module))
            attribute = owner.rpartition(".")[2]
            setattr(model.get_submodule(user_module), user.rpartition(".")[2], getattr(clone, attribute))
            parts[owner_module] = clone
            copies.append(TiedCopy(user, owner, clone, attribute))
    stem = getattr(model, units.stem_method) if first and units.stem_method else None
    head = getattr(model, units.head_method) if last and units.head_method else None
    return StageModule(parts, [model.get_submodule(p) for p in unit_paths], stem, head), copies


def make_schedule(
    name: str,
    stages: list[Any],
    microbatches: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> Any:
    """torch's schedule ``name`` over this rank's ``stages``. Gradients are not scaled by the schedule: the executor
    divides each parameter's gradient by the microbatch count once (a tied parameter sits in two stages of a
    V-shaped schedule, and would be divided twice)."""
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti, get_schedule_class

    cls = get_schedule_class(TORCH_SCHEDULES[name])
    target = stages if issubclass(cls, PipelineScheduleMulti) else stages[0]
    return cls(target, microbatches, loss_fn=loss_fn, scale_grads=False)


def receive_buffers(stages: list[Any]) -> list[torch.Tensor]:
    """The receive buffers ``stages`` (torch ``PipelineStage``s) hold from step to step: one a microbatch for the
    activations each receives and one for the gradients sent back to it, made at its first step (torch's
    ``args_recv_info`` and ``grad_recv_info``, a ``_RecvInfo`` each with its ``buffer``; none before that)."""
    buffers: list[torch.Tensor] = []
    for stage in stages:
        for table in (getattr(stage, "args_recv_info", {}), getattr(stage, "grad_recv_info", {})):
            for infos in table.values():
                for info in infos:
                    buffer = getattr(info, "buffer", None)
                    if isinstance(buffer, torch.Tensor):
                        buffers.append(buffer)
    return buffers


@dataclass
class _Timed:
    start: Any
    end: Any


@dataclass
class StageClock:
    """The busy and wall time of this rank's pipeline steps, from timestamps around the schedule's compute actions.

    On CPU the clock is ``perf_counter``; on accelerators, timing events recorded on the current stream (so
    nothing synchronises the device during a step), read once at the end of the run. The first step (the
    schedule's shape inference, lazy initialisation) is not counted.
    """

    device: torch.device
    steps: list[tuple[_Timed, list[_Timed]]] = field(default_factory=list)
    _actions: list[_Timed] | None = None
    _start: Any = None
    skipped: int = 0

    def _mark(self) -> Any:
        if self.device.type == "cpu":
            return time.perf_counter()
        event = torch.Event(device=self.device, enable_timing=True)
        event.record()
        return event

    def _elapsed(self, timed: _Timed) -> float:
        if self.device.type == "cpu":
            return float(timed.end - timed.start)
        return float(timed.start.elapsed_time(timed.end)) / 1000.0

    def instrument(self, stage: Any) -> None:
        """Time ``stage``'s compute actions (its forward, backward and weight-gradient of one microbatch)."""
        for method in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"):
            original = getattr(stage, method, None)
            if original is not None:
                setattr(stage, method, self._timed(original))

    def _timed(self, action: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._actions is None:
                return action(*args, **kwargs)
            start = self._mark()
            out = action(*args, **kwargs)
            self._actions.append(_Timed(start, self._mark()))
            return out

        return timed

    def begin_step(self) -> None:
        if self.skipped == 0:
            self.skipped = 1  # the first step: not counted
            return
        self._actions, self._start = [], self._mark()

    def end_step(self) -> None:
        if self._actions is not None:
            self.steps.append((_Timed(self._start, self._mark()), self._actions))
        self._actions = None

    def summary(self) -> dict[str, float | int | None]:
        """Counted steps, their busy and wall seconds, and the idle fraction ``1 - busy / wall``."""
        busy = wall = 0.0
        for step, actions in self.steps:
            wall += self._elapsed(step)
            busy += sum(self._elapsed(a) for a in actions)
        return {
            "steps": len(self.steps),
            "busy_s": busy,
            "wall_s": wall,
            "idle_fraction": max(0.0, 1.0 - busy / wall) if wall > 0 else None,
        }
