"""Building the comparison: runs pooled into cells, cells grouped by workload, ratios, noise verdicts, scaling.

A *cell* is one system running one workload at one device count; repeated runs pool into it. Cells of one
workload form a group and are compared with the baseline system's cell at the same device count. Compared along
an axis (``--vs precision``), a group holds the runs that differ only in that field, a cell is also one value of
it, and each cell is compared with the same system's cell at the baseline value (and, beside that, with the
baseline system's cell at the same value).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from accelbench.compare.environment import environment_differences, split_variants
from accelbench.compare.keys import (
    DEFAULT_LABEL_BY,
    SystemLabeller,
    Value,
    WorkloadKey,
    axis_order,
    match_value,
    parse_axis,
)
from accelbench.compare.parity import Parity, parity
from accelbench.compare.records import RecordSet
from accelbench.compare.stats import DEFAULT_ALPHA, Spread, mann_whitney_p, noise_verdict
from accelbench.compare.summary import RunSummary, shipped_references
from accelbench.errors import AccelbenchError


@dataclass(frozen=True)
class BaselineRatio:
    """One cell against its baseline cell (the baseline system's, or the baseline value's along an axis)."""

    speedup: float  # baseline epoch time / this epoch time: > 1 is faster than the baseline
    throughput_ratio: float
    memory_ratio: float | None
    p_value: float
    verdict: str  # "beyond noise", "within noise" or "too few measurements"
    measurements: tuple[int, int]  # steady epochs behind the baseline's figure and this one's

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Scaling:
    """Throughput at this device count against the same system's smallest device count in the series."""

    base_devices: int
    speedup: float
    efficiency: float
    # seed 001's formula from the base cell's measured step and both cells' predicted exposed communication
    predicted_speedup: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


_UNSET = object()


@dataclass
class Cell:
    """One system running one workload at one device count (and one value of the axis compared along), with every
    run of it. Its figures pool the runs and are computed once, when first asked for (after the runs are in)."""

    system: str
    devices: int
    runs: list[RunSummary]
    baseline: BaselineRatio | None = None
    scaling: Scaling | None = None
    key: WorkloadKey | None = None  # the workload of its runs
    value: Value = None  # its value on the axis compared along (``--vs``)
    vs_system: BaselineRatio | None = None  # along an axis: against the baseline system at the same value
    _spreads: dict[str, Spread | None] = field(default_factory=dict, init=False, repr=False, compare=False)

    @cached_property
    def ok_runs(self) -> list[RunSummary]:
        return [r for r in self.runs if r.ok]

    @cached_property
    def parity(self) -> Parity | None:
        """Whether the successful runs train as their recipe's shipped reference does; None where none was tested."""
        return parity([r.figures for r in self.ok_runs if r.figures is not None], shipped_references())

    def spread(self, name: str) -> Spread | None:
        """The figure ``name`` of :class:`~accelbench.compare.summary.RunFigures` over the successful runs: a value
        per steady epoch (a tuple) pools every steady epoch of every run, one measurement each; a value per run
        is one measurement per run. None where no run has it. Computed once per name."""
        known = self._spreads.get(name, _UNSET)
        if known is _UNSET:
            values: list[Any] = []
            for r in self.ok_runs:
                value = getattr(r.figures, name)
                if isinstance(value, tuple):
                    values.extend(value)
                else:
                    values.append(value)
            known = self._spreads[name] = Spread.of(values)
        return known  # type: ignore[return-value]

    @property
    def epoch_s(self) -> Spread | None:
        return self.spread("epoch_s")

    @property
    def samples_per_s(self) -> Spread | None:
        return self.spread("samples_per_s")

    @property
    def tokens_per_s(self) -> Spread | None:
        return self.spread("tokens_per_s")

    @property
    def joules_per_sample(self) -> Spread | None:
        """Energy per sample over the steady epochs; None unless the devices' energy counters were read."""
        return self.spread("joules_per_sample")

    @property
    def peak_memory_bytes(self) -> Spread | None:
        return self.spread("peak_memory_bytes")

    @property
    def mfu(self) -> Spread | None:
        return self.spread("mfu")

    @property
    def compile_s(self) -> Spread | None:
        return self.spread("compile_s")

    @property
    def megatron_tflops_per_device(self) -> Spread | None:
        """Achieved TFLOP/s per device by Megatron's count (transformer workloads), per run."""
        return self.spread("megatron_tflops_per_device")

    @property
    def bubble(self) -> Spread | None:
        """A pipeline's measured idle fraction per run; None without a pipeline."""
        return self.spread("bubble")

    @property
    def bubble_analytical(self) -> Spread | None:
        return self.spread("bubble_analytical")

    @property
    def warmup_s(self) -> Spread | None:
        return self.spread("warmup_s")

    def status_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self.runs:
            counts[r.status] = counts.get(r.status, 0) + 1
        return counts

    @property
    def step_s(self) -> Spread | None:
        """Measured time per step (steady epochs), per run."""
        return self.spread("step_s")

    @property
    def predicted_step_s(self) -> Spread | None:
        """The analytical model's step time stored in the runs' records."""
        return self.spread("predicted_step_s")

    @property
    def predicted_comm_s(self) -> Spread | None:
        return self.spread("predicted_comm_s")

    @property
    def predicted_peak_bytes(self) -> Spread | None:
        return self.spread("predicted_peak_bytes")

    @property
    def tensor_peak_bytes(self) -> Spread | None:
        """Measured live tensor peak (one untimed step per run, MemTracker); None in older records."""
        return self.spread("tensor_peak_bytes")

    @property
    def predicted_tensor_bytes(self) -> Spread | None:
        return self.spread("predicted_tensor_bytes")

    def memory_check(self) -> tuple[Spread | None, Spread | None, str]:
        """The peak-memory pair the predicted-against-measured views compare, and its basis: tensors against
        the measured tensor peak where every successful run measured one (like with like), else the whole
        prediction against the backend's reading ('reading'; on a CPU the resident set)."""
        tensors = self.tensor_peak_bytes
        if tensors is not None and tensors.n == len(self.ok_runs):
            return self.predicted_tensor_bytes, tensors, "tensors"
        return self.predicted_peak_bytes, self.peak_memory_bytes, "reading"

    @cached_property
    def step_split(self) -> dict[str, float] | None:
        """``run --profile``: seconds per category of a step (median over the profiled runs); None unprofiled."""
        splits = [dict(r.figures.step_split) for r in self.ok_runs if r.figures and r.figures.step_split]
        if not splits:
            return None
        return {name: statistics.median(s.get(name, 0.0) for s in splits) for name in splits[0]}

    @cached_property
    def mfu_errors(self) -> int:
        """Runs whose MFU came out above 100% (a wrong peak), which are never shown as a figure."""
        return sum(1 for r in self.ok_runs if r.figures is not None and r.figures.mfu_error)

    @property
    def contended_runs(self) -> int:
        """Successful runs whose host was busy while they ran (their figures understate the system)."""
        return sum(1 for r in self.ok_runs if r.figures is not None and r.figures.contended)

    @property
    def slowest_ranks(self) -> list[str]:
        """Each successful run's slowest rank and why, where its record names one."""
        return [
            r.figures.slowest_rank for r in self.ok_runs if r.figures is not None and r.figures.slowest_rank
        ]

    def outcome_text(self) -> str:
        """``2 ok``, ``1 ok, 1 oom``, ``2 ok (1 contended)``..."""
        text = ", ".join(f"{n} {status}" for status, n in self.status_counts().items())
        return text + (f" ({self.contended_runs} contended)" if self.contended_runs else "")

    def failure(self) -> str | None:
        """Why there is no figure: the outcome of the last run that did not succeed (e.g. OOM), or None."""
        if self.epoch_s is not None:
            return None
        for r in reversed(self.runs):
            if r.status != "ok":
                if r.status == "oom":
                    return "OOM"
                first_line = next(iter((r.message or "").splitlines()), "")
                return f"{r.status}: {first_line[:80]}" if first_line else r.status
        return "no steady state (needs 2 epochs)"


@dataclass
class WorkloadGroup:
    """The cells of one workload; compared along an axis, of the workloads that differ only on it."""

    key: WorkloadKey  # along an axis: the key of the group's first cell (its axis value is the cells')
    cells: list[Cell]
    axis: str | None = None
    baseline_value: Value = None  # along an axis: the value the ratios are against
    values: list[Value] = field(default_factory=list)  # along an axis: its values here, in natural order
    baseline_system: str = ""  # the system this group's ratios are against (the comparison's, where it ran)
    baseline_note: str | None = (
        None  # why it is another system, when the comparison's baseline did not run it
    )

    def describe(self) -> str:
        return self.key.describe(self.axis)

    def choose_baseline_system(self, wanted: str, systems: Sequence[str]) -> str:
        """The comparison's baseline system if it ran this workload; else the first system (in ``systems``
        order) that did, saying so in :attr:`baseline_note`."""
        present = {c.system for c in self.cells}
        if wanted in present:
            self.baseline_system = wanted
        else:
            self.baseline_system = next(s for s in systems if s in present)
            self.baseline_note = (
                f"{wanted} has no run of this workload: ratios against {self.baseline_system}"
            )
        return self.baseline_system


@dataclass(frozen=True)
class Filters:
    """Keep only records matching every given list (each list: any of its values). Systems match by substring."""

    models: tuple[str, ...] = ()
    precisions: tuple[str, ...] = ()
    strategies: tuple[str, ...] = ()
    systems: tuple[str, ...] = ()

    def keep(self, r: RunSummary, label: str) -> bool:
        if self.models and r.model_name not in self.models and r.key.model not in self.models:
            return False
        if self.precisions and r.key.precision not in self.precisions:
            return False
        if self.strategies and r.key.strategy not in self.strategies:
            return False
        return not self.systems or any(s.lower() in label.lower() for s in self.systems)


@dataclass
class Comparison:
    """Everything `compare` shows, in every output format."""

    systems: list[str]
    baseline: str
    groups: list[WorkloadGroup]
    environment: list[tuple[str, dict[str, list[str]]]]  # attribute, system -> values, only those that differ
    records: list[tuple[str, RunSummary]]  # (system, record) after filtering
    skipped: list[tuple[Path, str]]
    duplicates: list[Path]
    alpha: float
    label_by: tuple[str, ...]
    axis: str | None = None  # the workload field compared along (``--vs``), or None
    cells: list[Cell] = field(init=False, repr=False)
    _has: dict[str, bool] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.cells = [c for g in self.groups for c in g.cells]

    def any_cell_has(self, name: str) -> bool:
        """Whether any cell has the figure ``name`` (:meth:`Cell.spread`): a column such as J/sample, the bubble
        or TFLOP/s per device is shown only then."""
        known = self._has.get(name)
        if known is None:
            known = self._has[name] = any(c.spread(name) is not None for c in self.cells)
        return known

    @property
    def counts_tokens(self) -> bool:
        """Whether some cell's samples are sequences of tokens (a language model's), so tokens/s says more than
        samples/s."""
        known = self._has.get("counts_tokens")
        if known is None:
            known = self._has["counts_tokens"] = any(
                c.tokens_per_s is not None
                and c.samples_per_s is not None
                and c.tokens_per_s.median > c.samples_per_s.median * 1.5
                for c in self.cells
            )
        return known

    @property
    def has_energy(self) -> bool:
        """Whether any cell has an energy figure (``any_cell_has("joules_per_sample")``)."""
        return self.any_cell_has("joules_per_sample")


def choose_baseline(systems: Sequence[str], wanted: str | None) -> str:
    """The system named by ``--baseline`` (exactly, or a unique case-insensitive substring); else the first."""
    if not wanted:
        return systems[0]
    if wanted in systems:
        return wanted
    matches = [s for s in systems if wanted.lower() in s.lower()]
    if len(matches) == 1:
        return matches[0]
    listing = "; ".join(systems)
    if not matches:
        raise AccelbenchError(f"--baseline {wanted!r} matches no system; the systems are: {listing}")
    raise AccelbenchError(
        f"--baseline {wanted!r} matches {len(matches)} systems ({'; '.join(matches)}); give more of the label"
    )


def compare(
    record_set: RecordSet,
    label_by: Sequence[str] = DEFAULT_LABEL_BY,
    baseline: str | None = None,
    filters: Filters = Filters(),
    alpha: float = DEFAULT_ALPHA,
    vs: str | None = None,
    vs_baseline: str | None = None,
) -> Comparison:
    """Group records by workload, put systems side by side, and compute ratios, scaling and noise verdicts.

    With ``vs`` (a workload field: ``precision``, ``batch_size``, an identity entry), runs that differ only in
    that field share a group, and ratios are against ``vs_baseline`` (default: each group's first value in the
    field's natural order) on the same system.
    """
    label = SystemLabeller(label_by)
    if filters == Filters():
        labelled = [(label(r), r) for r in record_set.records]
    else:
        labelled = [(name, r) for r in record_set.records if filters.keep(r, name := label(r))]
    if not labelled:
        what = "no result records matched the filters" if record_set.records else "no result records found"
        raise AccelbenchError(f"{what}; nothing to compare")
    labelled = split_variants(labelled)  # one label, different environments: variants, never pooled
    systems = list(dict.fromkeys(name for name, _ in labelled))
    base = choose_baseline(systems, baseline)
    axis = None
    if vs is None:
        if vs_baseline is not None:
            raise AccelbenchError("--vs-baseline needs --vs AXIS (the field whose values it names)")
        groups = _groups(labelled, systems)
        for group in groups:
            _fill_system_ratios(group.cells, group.choose_baseline_system(base, systems), alpha)
    else:
        keys = {id(r.key): r.key for _, r in labelled}.values()
        axis = parse_axis(vs, {name for key in keys for name, _ in key.identity})
        groups = _axis_groups(labelled, systems, axis, vs_baseline)
        for group in groups:
            _fill_value_ratios(group, group.choose_baseline_system(base, systems), alpha)
    return Comparison(
        systems=systems,
        baseline=base,
        groups=groups,
        environment=environment_differences(labelled, systems),
        records=labelled,
        skipped=record_set.skipped,
        duplicates=record_set.duplicates,
        alpha=alpha,
        label_by=tuple(label_by),
        axis=axis,
    )


def _groups(labelled: Sequence[tuple[str, RunSummary]], systems: Sequence[str]) -> list[WorkloadGroup]:
    """One group per workload, its cells in system order, then by device count."""
    cells: dict[WorkloadKey, dict[tuple[str, int], Cell]] = {}
    for name, r in labelled:
        by_cell = cells.setdefault(r.key, {})
        cell = by_cell.get((name, r.devices))
        if cell is None:
            cell = by_cell[name, r.devices] = Cell(name, r.devices, [], key=r.key)
        cell.runs.append(r)
    order = {s: i for i, s in enumerate(systems)}
    return [
        WorkloadGroup(key, sorted(by_cell.values(), key=lambda c: (order[c.system], c.devices)))
        for key, by_cell in cells.items()
    ]


def _axis_groups(
    labelled: Sequence[tuple[str, RunSummary]], systems: Sequence[str], axis: str, vs_baseline: str | None
) -> list[WorkloadGroup]:
    """One group per workload without ``axis``; in it a cell per system, device count and value of the axis."""
    cells: dict[tuple[Any, ...], dict[tuple[str, int, Value], Cell]] = {}
    shared: dict[int, tuple[Any, ...]] = {}  # keys are shared between runs: work out each one's group once
    for name, r in labelled:
        group_key = shared.get(id(r.key))
        if group_key is None:
            group_key = shared[id(r.key)] = r.key.without(axis)
        value = r.key.value(axis)
        by_cell = cells.setdefault(group_key, {})
        cell = by_cell.get((name, r.devices, value))
        if cell is None:
            cell = by_cell[name, r.devices, value] = Cell(name, r.devices, [], key=r.key, value=value)
        cell.runs.append(r)
    wanted: Value = None
    if vs_baseline is not None:
        everywhere = [c.value for by_cell in cells.values() for c in by_cell.values()]
        wanted = match_value(axis, axis_order(axis, everywhere), vs_baseline)
    order = {s: i for i, s in enumerate(systems)}
    groups = []
    for by_cell in cells.values():
        group_cells = list(by_cell.values())
        sizes: dict[Value, float] = {}
        for c in group_cells:
            for r in c.runs:
                if r.parameters is not None:
                    sizes[c.value] = min(sizes.get(c.value, r.parameters), r.parameters)
        values = axis_order(axis, (c.value for c in group_cells), sizes)
        rank = {v: i for i, v in enumerate(values)}
        group_cells.sort(key=lambda c: (order[c.system], c.devices, rank[c.value]))
        base_value = wanted if vs_baseline is not None else values[0]
        groups.append(WorkloadGroup(group_cells[0].key, group_cells, axis, base_value, values))  # type: ignore[arg-type]
    return groups


def _fill_system_ratios(cells: list[Cell], baseline: str, alpha: float) -> None:
    """Each cell against the baseline system's cell at the same device count; scaling within each system."""
    base_by_devices = {c.devices: c for c in cells if c.system == baseline}
    for cell in cells:
        base = base_by_devices.get(cell.devices)
        if cell.system != baseline and base is not None:
            cell.baseline = _ratio(cell, base, alpha)
    _fill_scaling(cells, lambda c: c.system)


def _fill_value_ratios(group: WorkloadGroup, baseline: str, alpha: float) -> None:
    """Along an axis: each cell against the same system's cell at the baseline value (same device count), and
    against the baseline system's cell at the same value; scaling within each system and value."""
    by_place = {(c.system, c.devices, c.value): c for c in group.cells}
    for cell in group.cells:
        if cell.value != group.baseline_value:
            base = by_place.get((cell.system, cell.devices, group.baseline_value))
            cell.baseline = _ratio(cell, base, alpha) if base else None
        if cell.system != baseline:
            other = by_place.get((baseline, cell.devices, cell.value))
            cell.vs_system = _ratio(cell, other, alpha) if other else None
    _fill_scaling(group.cells, lambda c: (c.system, c.value))


def _fill_scaling(cells: list[Cell], series_of: Any) -> None:
    """Throughput against the same series' smallest device count that has a measurement."""
    series: dict[Any, list[Cell]] = {}
    for c in cells:
        if c.samples_per_s is not None:
            series.setdefault(series_of(c), []).append(c)
    for members in series.values():
        first = min(members, key=lambda c: c.devices)
        for cell in members:
            if first.devices < cell.devices:
                speedup = cell.samples_per_s.median / first.samples_per_s.median  # type: ignore[union-attr]
                cell.scaling = Scaling(
                    first.devices,
                    speedup,
                    speedup / (cell.devices / first.devices),
                    _predicted_speedup(first, cell),
                )


def _predicted_speedup(first: Cell, cell: Cell) -> float | None:
    """Seed 001's speedup from ``first`` (g devices) to ``cell`` (n): the measured step at g, with the exposed
    communication the model predicted there and at n. None unless both records carry those predictions."""
    from accelbench.estimate.scaling import predict_speedup

    step, comm_g, comm_n = first.step_s, first.predicted_comm_s, cell.predicted_comm_s
    if step is None or comm_g is None or comm_n is None:
        return None
    try:
        return predict_speedup(
            step.median, min(comm_g.median, step.median), first.devices, cell.devices, comm_n.median
        ).throughput_speedup
    except ValueError:
        return None


def _ratio(cell: Cell, base: Cell, alpha: float) -> BaselineRatio | None:
    """``cell`` against ``base``; None unless both have steady epoch times."""
    mine, theirs = cell.epoch_s, base.epoch_s
    if mine is None or theirs is None:
        return None
    memory, base_memory = cell.peak_memory_bytes, base.peak_memory_bytes
    p = mann_whitney_p(mine.values, theirs.values)
    return BaselineRatio(
        speedup=theirs.median / mine.median,
        throughput_ratio=cell.samples_per_s.median / base.samples_per_s.median,  # type: ignore[union-attr]
        memory_ratio=memory.median / base_memory.median
        if memory and base_memory and base_memory.median
        else None,
        p_value=p,
        verdict=noise_verdict(p, theirs.n, mine.n, alpha),
        measurements=(theirs.n, mine.n),
    )
