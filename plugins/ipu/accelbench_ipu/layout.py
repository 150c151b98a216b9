"""The IPU layout of a workload's model: which blocks, stages and phases each strategy builds.

A pure function of (strategy, the workload's model parts, IPUs per replica, optional layers-per-IPU list); nothing
here imports poptorch, so the layout is checked before anything is built and is tested without an SDK. The parts come
from the workload (:class:`accelbench.workloads.ModelUnits`), so the mapping never reaches into a model's
attributes; for the GPT:

- ``embedding``: from the first stem module (the token embedding), with the rest of the stem;
- ``layer{i}``: unit i (a transformer layer), or, where units are too few or too coarse for the IPUs, its two
  halves ``layer{i}.attn`` (from the unit) and ``layer{i}.mlp`` (from its split point, the second LayerNorm);
- ``head``: from the first head module (the final LayerNorm), with the LM head and the loss.

The LM head's weight *is* the token embedding (tied), and PopTorch needs layers sharing weights on one IPU,
so the head always runs on IPU 0 with the embedding:

- pipelined / sharded over N > 1 IPUs: stage 0 = embedding + IPU 0's layers on IPU 0, stage k = IPU k's
  layers, and a last stage N = head back on IPU 0, so stage ids rise in execution order (S = N + 1 stages;
  pipelined training then needs gradient accumulation >= 2S - 1);
- serial phased: P phases of N stages, one on each IPU; the embedding opens phase 0 on IPU 0, the head
  closes the last phase on IPU 0;
- parallel phased (N >= 2): even phases on the even IPUs, odd phases on the odd IPUs, N / 2 stages each;
  the number of phases is odd, so the last phase is even and includes IPU 0 for the head. On one IPU the
  parity rule leaves a single phase.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from accelbench.errors import ConfigError
from accelbench.workloads import ModelUnits

STRATEGIES = ("single", "pipelined", "sharded", "serial-phased", "parallel-phased")
MAX_IPUS = 64  # the largest single partition PopTorch reserves (an IPU-POD64)

Granularity = Literal["layer", "half-layer"]


@dataclass(frozen=True)
class BlockSpec:
    """One PopTorch block: where it starts in the GPT (a module path) and where it runs."""

    block_id: str
    module: str  # dotted path of the module whose forward opens the block (poptorch.BeginBlock)
    ipu: int
    stage: int  # index into Layout.stages
    phase: int | None = None


@dataclass(frozen=True)
class StageSpec:
    blocks: tuple[str, ...]
    ipu: int
    phase: int | None = None


@dataclass(frozen=True)
class Layout:
    """Blocks (execution order) and stages (stage-id order; phase-major for phased strategies)."""

    strategy: str
    ipus: int  # IPUs per replica
    n_layer: int
    granularity: Granularity
    blocks: tuple[BlockSpec, ...]
    stages: tuple[StageSpec, ...]
    phases: int | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def pipeline_stages(self) -> int:
        return len(self.stages) if self.strategy in ("pipelined", "sharded") else 1

    @property
    def min_gradient_accumulation(self) -> int:
        """PopART's bound for pipelined training: 2S - 1 (S forward stages, S - 1 more backward ones)."""
        s = self.pipeline_stages
        return 2 * s - 1 if self.strategy == "pipelined" and s > 1 else 1

    def phase_stages(self, phase: int) -> list[StageSpec]:
        return [s for s in self.stages if s.phase == phase]

    def describe(self) -> dict[str, Any]:
        """The layout as recorded in the result: stages (or phases) with their IPU and blocks."""
        out: dict[str, Any] = {
            "ipus_per_replica": self.ipus,
            "granularity": self.granularity,
            "blocks": {b.block_id: b.module for b in self.blocks},
        }
        if self.phases is None:
            out["stages"] = [
                {"stage": i, "ipu": s.ipu, "blocks": list(s.blocks)} for i, s in enumerate(self.stages)
            ]
        else:
            out["phases"] = [
                [{"ipu": s.ipu, "blocks": list(s.blocks)} for s in self.phase_stages(p)]
                for p in range(self.phases)
            ]
        if self.notes:
            out["notes"] = list(self.notes)
        return out


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def parse_layers_per_ipu(text: str | None) -> list[int] | None:
    """``"2,4,4,2"`` -> [2, 4, 4, 2]; a clear error for anything else."""
    if text is None or str(text).strip() == "":
        return None
    try:
        counts = [int(part) for part in str(text).split(",")]
    except ValueError:
        raise ConfigError(
            f"--layers-per-ipu {text!r}: give whole numbers separated by commas, one per IPU, e.g. 3,3,3,3"
        ) from None
    if any(c < 0 for c in counts):
        raise ConfigError(f"--layers-per-ipu {text!r}: layer counts cannot be negative")
    return counts


def plan_layout(
    strategy: str,
    parts: ModelUnits,
    ipus: int,
    layers_per_ipu: Sequence[int] | None = None,
    model: str = "the model",
) -> Layout:
    """The layout for ``strategy`` over ``ipus`` IPUs per replica, or a ConfigError saying what would work."""
    n_layer = len(parts.units)
    if not parts.stem or not parts.head:
        raise ConfigError(f"{model}: the IPU mapping needs a stem (embedding) and a head to place on IPU 0")
    if strategy not in STRATEGIES:
        raise ConfigError(f"unknown IPU strategy {strategy!r}; choose one of: {', '.join(STRATEGIES)}")
    if n_layer < 1:
        raise ConfigError(f"{model} has no transformer layers to place")
    if layers_per_ipu is not None and strategy not in ("pipelined", "sharded"):
        raise ConfigError(
            f"--layers-per-ipu applies to pipelined and sharded execution; {strategy} places one layer (or half "
            "layer) per stage by itself: drop --layers-per-ipu"
        )
    if strategy == "single":
        if ipus != 1:
            raise ConfigError(
                f"strategy 'single' runs a whole replica on one IPU, but {ipus} IPUs per replica were asked for; "
                "split the model with --strategy pipelined, sharded, serial-phased or parallel-phased, or use "
                "--replicas for data parallelism"
            )
        return _one_stage(strategy, parts)
    if strategy in ("pipelined", "sharded"):
        return _pipeline(strategy, parts, ipus, layers_per_ipu, model)
    return _phased(strategy, parts, ipus, model)


# --------------------------------------------------------------------------------------------------------


def _units(parts: ModelUnits, granularity: Granularity) -> list[tuple[str, str]]:
    """(block id, module path) of each layer unit, in execution order."""
    if granularity == "layer":
        return [(f"layer{i}", path) for i, path in enumerate(parts.units)]
    units = []
    for i, (path, split) in enumerate(zip(parts.units, parts.split_points, strict=True)):
        units += [(f"layer{i}.attn", path), (f"layer{i}.mlp", split)]
    return units


def _even_split(total: int, parts: int) -> list[int]:
    """``total`` units over ``parts``, as even as possible; the remainder goes to the last parts (the first
    part, IPU 0 of a pipeline, also carries the embedding and the head)."""
    base, extra = divmod(total, parts)
    return [base + (1 if i >= parts - extra else 0) for i in range(parts)]


def _one_stage(strategy: str, parts: ModelUnits) -> Layout:
    n_layer = len(parts.units)
    units = _units(parts, "layer")
    ids = ["embedding", *(u for u, _ in units), "head"]
    modules = [parts.stem[0], *(m for _, m in units), parts.head[0]]
    blocks = tuple(BlockSpec(b, m, ipu=0, stage=0) for b, m in zip(ids, modules, strict=True))
    return Layout(strategy, 1, n_layer, "layer", blocks, (StageSpec(tuple(ids), 0),))


def _pipeline(strategy: str, parts: ModelUnits, n: int, counts: Sequence[int] | None, model: str) -> Layout:
    n_layer = len(parts.units)
    if n == 1:
        if counts is not None and list(counts) != [n_layer]:
            raise ConfigError(f"--layers-per-ipu {_fmt(counts)} for 1 IPU: the only split is {n_layer}")
        return _one_stage(strategy, parts)
    granularity: Granularity
    if counts is not None:
        _check_counts(counts, n, n_layer)
        granularity, per_ipu = "layer", list(counts)
    else:
        granularity, per_ipu = _choose_split(n_layer, n, strategy, model, halves=bool(parts.split_points))
    units = _units(parts, granularity)
    blocks: list[BlockSpec] = [BlockSpec("embedding", parts.stem[0], ipu=0, stage=0)]
    stage_blocks: list[list[str]] = [["embedding"]]
    cursor = 0
    for ipu, count in enumerate(per_ipu):
        if ipu > 0:
            stage_blocks.append([])
        for block_id, module in units[cursor : cursor + count]:
            blocks.append(BlockSpec(block_id, module, ipu=ipu, stage=ipu))
            stage_blocks[ipu].append(block_id)
        cursor += count
    blocks.append(BlockSpec("head", parts.head[0], ipu=0, stage=n))
    stage_blocks.append(["head"])
    stages = tuple(StageSpec(tuple(b), ipu=i if i < n else 0) for i, b in enumerate(stage_blocks))
    notes = ("the LM head shares its weight with the token embedding, so it runs on IPU 0 as the last stage",)
    return Layout(strategy, n, n_layer, granularity, tuple(blocks), stages, notes=notes)


def _check_counts(counts: Sequence[int], n: int, n_layer: int) -> None:
    example = _fmt(_even_split(n_layer, n)) if n_layer >= n - 1 else None
    hint = f", e.g. {example}" if example else ""
    if len(counts) != n:
        raise ConfigError(
            f"--layers-per-ipu {_fmt(counts)} has {len(counts)} entries for {n} IPUs per replica; give {n} "
            f"counts summing to {n_layer}{hint}"
        )
    if sum(counts) != n_layer:
        raise ConfigError(
            f"--layers-per-ipu {_fmt(counts)} places {sum(counts)} layers, but the model has {n_layer}; give {n} "
            f"counts summing to {n_layer}{hint}"
        )
    idle = [i for i, c in enumerate(counts) if i > 0 and c == 0]
    if idle:
        raise ConfigError(
            f"--layers-per-ipu {_fmt(counts)} leaves IPU {idle[0]} without a layer; every IPU after IPU 0 needs "
            f"at least one (IPU 0 also holds the embedding and head){hint}"
        )


def _choose_split(
    n_layer: int, n: int, strategy: str, model: str, halves: bool = True
) -> tuple[Granularity, list[int]]:
    """Whole layers when that balances as well as half layers; half layers when layers are too few or too
    coarse (12 layers on 8 IPUs: 1.5 layers each instead of 1 or 2). IPU 0 may get no layer: it holds the
    embedding and the head."""
    options: list[tuple[int, Granularity, list[int]]] = []
    for granularity, units in _granularities(n_layer, halves):
        if units < n - 1:
            continue
        split = _even_split(units, n) if units >= n else [0] + [1] * (n - 1)
        load = max(split) * (2 if granularity == "layer" else 1)  # in half layers
        options.append((load, granularity, split))
    if not options:
        fits = _largest_pow2(2 * n_layer + 1)
        raise ConfigError(
            f"{model} has {n_layer} transformer layers ({2 * n_layer} half-layer blocks), too few to give each of "
            f"{n} IPUs a block ({strategy}: IPU 0 holds the embedding and head, every other IPU needs at least "
            f"one half layer); use --ipus {fits} or fewer, or a model with at least {n // 2} layers"
        )
    options.sort(key=lambda o: (o[0], o[1] != "layer"))
    _, granularity, split = options[0]
    return granularity, split


def _phased(strategy: str, parts: ModelUnits, n: int, model: str) -> Layout:
    n_layer = len(parts.units)
    serial = strategy == "serial-phased"
    if not serial and n == 1:
        units = _units(parts, "layer")
        ids = ("embedding", *(u for u, _ in units), "head")
        modules = (parts.stem[0], *(m for _, m in units), parts.head[0])
        whole = tuple(BlockSpec(b, m, ipu=0, stage=0, phase=0) for b, m in zip(ids, modules, strict=True))
        note = "one IPU: even phases run on even IPUs and odd on odd, so the whole model is phase 0"
        return Layout(strategy, 1, n_layer, "layer", whole, (StageSpec(ids, 0, 0),), phases=1, notes=(note,))
    if not serial and n % 2:
        raise ConfigError(
            f"parallel-phased over {n} IPUs: even phases run on the even IPUs and odd phases on the odd ones, so "
            f"the two groups must be equally large; use an even number of IPUs per replica ({n - 1} or {n + 1})"
        )
    group = n if serial else n // 2

    def group_ipus(phase: int) -> list[int]:
        return list(range(n)) if serial else list(range(phase % 2, n, 2))

    granularity, phases = _phase_count(
        n_layer, group, serial, strategy, n, model, halves=bool(parts.split_points)
    )
    units = _units(parts, granularity)
    notes: list[str] = []
    if not serial:
        notes.append(
            f"{phases} phases: an odd count, so the last phase runs on the even IPUs, with IPU 0 for the head"
        )
    per_slot = _even_split(len(units), phases * group)
    blocks: list[BlockSpec] = []
    stages: list[StageSpec] = []
    cursor = 0
    for phase in range(phases):
        for ipu in group_ipus(phase):
            chosen = units[cursor : cursor + per_slot[len(stages)]]
            cursor += len(chosen)
            stage_ids = [b for b, _ in chosen]
            index = len(stages)
            if phase == 0 and ipu == 0:
                blocks.append(BlockSpec("embedding", parts.stem[0], ipu=0, stage=index, phase=0))
                stage_ids.insert(0, "embedding")
            blocks += [BlockSpec(b, m, ipu=ipu, stage=index, phase=phase) for b, m in chosen]
            stages.append(StageSpec(tuple(stage_ids), ipu, phase))
    last = next(i for i, s in enumerate(stages) if s.phase == phases - 1 and s.ipu == 0)
    blocks.append(BlockSpec("head", parts.head[0], ipu=0, stage=last, phase=phases - 1))
    stages[last] = StageSpec((*stages[last].blocks, "head"), 0, phases - 1)
    notes.append(
        "the LM head shares its weight with the token embedding, so it runs on IPU 0 in the last phase"
    )
    return Layout(
        strategy, n, n_layer, granularity, tuple(blocks), tuple(stages), phases=phases, notes=tuple(notes)
    )


def _phase_count(
    n_layer: int, group: int, serial: bool, strategy: str, n: int, model: str, halves: bool = True
) -> tuple[Granularity, int]:
    """Granularity and number of phases: every phase has a stage (one or more units) on each IPU of its group.

    Parallel phased needs at least three phases and an odd count: with one phase the odd IPUs would idle,
    and the last phase must be even so that the head (tied to the embedding on IPU 0) can close it. One unit
    per stage is preferred (whole layers first); otherwise the first granularity that fits, units spread evenly.
    """
    minimum = 1 if serial else 3
    fitting: list[tuple[Granularity, int, bool]] = []
    for granularity, units in _granularities(n_layer, halves):
        phases = units // group
        if not serial and phases % 2 == 0:
            phases -= 1
        if phases >= minimum:
            fitting.append((granularity, phases, units == phases * group))
    if not fitting:
        need_halves = minimum * group
        fits = [p for p in (1, 2, 4, 8, 16, 32, 64) if (p if serial else 3 * (p // 2)) <= 2 * n_layer]
        largest = max(fits, default=1)  # parallel phased on one IPU is a single phase: it always fits
        rule = (
            f"every phase needs a stage on each of the {group} IPUs"
            if serial
            else f"at least 3 phases (an odd count) need a stage on each of the {group} IPUs of their group"
        )
        raise ConfigError(
            f"{model} has {n_layer} transformer layers ({2 * n_layer} half-layer blocks), too few for {strategy} "
            f"over {n} IPUs: {rule}, {need_halves} half layers in all; use --ipus {largest} or fewer, or a model "
            f"with at least {-(-need_halves // 2)} layers"
        )
    exact = [f for f in fitting if f[2]]
    granularity, phases, _ = (exact or fitting)[0]
    return granularity, phases


def _granularities(n_layer: int, halves: bool) -> list[tuple[Granularity, int]]:
    """(granularity, units to place): whole layers, then half layers where the workload can split its units."""
    out: list[tuple[Granularity, int]] = [("layer", n_layer)]
    return [*out, ("half-layer", 2 * n_layer)] if halves else out


def _largest_pow2(limit: int) -> int:
    """The largest power of two <= limit (at least 1)."""
    p = 1
    while p * 2 <= limit:
        p *= 2
    return p


def _fmt(counts: Sequence[int]) -> str:
    return ",".join(str(c) for c in counts)
