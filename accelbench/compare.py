"""`accelbench compare`: result records from many systems, side by side.

An HPC centre runs the same suite on each system and copies the result records to one place; this module reads
them (only records: it never needs a device), groups the runs by workload, and puts the systems side by side:
steady epoch time, throughput, peak memory, MFU, compile time, the ratio against a baseline system, scaling over
device counts, and whether a difference is larger than the run-to-run noise. It also lists what differs between
the environments (versions, effective precision, what one device is), so an unfair comparison is visible.

Terms used throughout:

- a *system* is a label derived from each record (by default host, backend, device model, and the thread,
  compile and engine settings when they are not the defaults); ``--label-by`` chooses the fields, e.g. ``dir``
  for results copied into one folder per system.
- a *workload* is everything that defines the work of a run: workload and model size, block and batch size,
  precision, strategy, data, step cap, dropout and learning rate. The device count is not part of it: the same
  workload at several device counts is a scaling series.
- a *cell* is one system running one workload at one device count; repeated runs pool into it.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import statistics
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from accelbench.display import fmt_bytes
from accelbench.errors import AccelbenchError, ResultFileError
from accelbench.results import ResultRecord, read_record

DEFAULT_ALPHA = 0.05
FORMATS = ("table", "markdown", "csv", "json")


# --------------------------------------------------------------------------------------------------------------
# Reading records
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadedRecord:
    """A validated result record and the file it came from."""

    path: Path
    record: ResultRecord


@dataclass
class RecordSet:
    """What reading a set of files and folders gave: records, and the files skipped with the reason."""

    records: list[LoadedRecord] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    duplicates: list[Path] = field(default_factory=list)


def find_result_files(paths: Sequence[Path]) -> list[Path]:
    """Files named on the command line as given; folders searched recursively for ``*.json``.

    Temporary files of an atomic write in progress (``.tmp-*``) are not records yet and are left alone.
    """
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.rglob("*.json") if p.is_file() and not p.name.startswith(".tmp-"))
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise AccelbenchError(
                f"{path}: no such file or directory; give result files or folders holding them"
            )
    return files


def load_records(paths: Sequence[Path], strict: bool = False) -> RecordSet:
    """Read every result file under ``paths``.

    A malformed, foreign or newer-schema file is skipped and reported by name (with ``strict``, it raises
    :class:`ResultFileError`). The same run found twice (a record copied into two folders) counts once.
    """
    result = RecordSet()
    seen: set[str] = set()
    for path in find_result_files(paths):
        try:
            record = read_record(path)
        except ResultFileError as exc:
            if strict:
                raise
            result.skipped.append((path, str(exc).removeprefix(f"{path}: ")))
            continue
        if record.run_id in seen:
            result.duplicates.append(path)
            continue
        seen.add(record.run_id)
        result.records.append(LoadedRecord(path, record))
    return result


# --------------------------------------------------------------------------------------------------------------
# Systems and workloads
# --------------------------------------------------------------------------------------------------------------


def _device_name(r: LoadedRecord) -> str:
    devices = r.record.backend.devices
    return devices[0].name if devices else "no device"


# field name -> its part of a system label (None: the field adds nothing for this record)
SYSTEM_FIELDS: dict[str, Callable[[LoadedRecord], str | None]] = {
    "host": lambda r: r.record.system.host,
    "backend": lambda r: r.record.backend.info.name,
    "device": _device_name,
    "threads": lambda r: f"threads={r.record.config.threads}" if r.record.config.threads else None,
    "compile": lambda r: "compile" if r.record.config.compile else None,
    "engine": lambda r: f"engine={r.record.engine}" if r.record.engine != "native" else None,
    "options": lambda r: (
        " ".join(f"{k}={v}" for k, v in sorted(r.record.config.backend_options.items())) or None
    ),
    "devices": lambda r: f"x{r.record.backend.devices_used}",
    "dir": lambda r: r.path.parent.name or str(r.path.parent),
    "job": lambda r: f"job {r.record.system.job_id}" if r.record.system.job_id else None,
    "cpu": lambda r: r.record.system.cpu_model,
    "torch": lambda r: f"torch {r.record.system.torch_version}",
    "accelbench": lambda r: f"accelbench {r.record.system.accelbench_version}",
}
DEFAULT_LABEL_BY = ("host", "backend", "device", "threads", "compile", "engine")


def parse_label_by(text: str) -> tuple[str, ...]:
    """``host,backend,device`` -> the field names, each checked against :data:`SYSTEM_FIELDS`."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in SYSTEM_FIELDS]
    if unknown or not names:
        raise AccelbenchError(
            f"--label-by {text!r}: unknown field(s) {', '.join(map(repr, unknown)) or '(none given)'}; "
            f"choose from: {', '.join(SYSTEM_FIELDS)}"
        )
    return names


def system_label(r: LoadedRecord, label_by: Sequence[str] = DEFAULT_LABEL_BY) -> str:
    """The system a record belongs to: the chosen fields' values joined with `` · ``."""
    parts = [SYSTEM_FIELDS[name](r) for name in label_by]
    return " · ".join(p for p in parts if p) or "unlabelled"


@dataclass(frozen=True)
class WorkloadKey:
    """What makes two runs the same work: they are comparable across systems."""

    workload: str
    model: str
    block_size: int
    batch_size: int
    precision: str
    strategy: str
    data: str
    steps_per_epoch: int | None
    dropout: float
    learning_rate: float

    @classmethod
    def of(cls, record: ResultRecord) -> WorkloadKey:
        c = record.config
        model = f"custom {c.n_layer}L/{c.n_head}H/{c.n_embd}E" if c.model == "custom" else c.model
        # by file name, not path: the same corpus sits under different paths on different systems
        data = c.data.name if c.data else "generated"
        return cls(
            workload=c.workload,
            model=model,
            block_size=c.block_size,
            batch_size=c.batch_size,
            precision=c.precision,
            strategy=c.strategy,
            data=data,
            steps_per_epoch=c.steps_per_epoch,
            dropout=c.dropout,
            learning_rate=c.learning_rate,
        )

    def describe(self) -> str:
        steps = f" · {self.steps_per_epoch} steps/epoch" if self.steps_per_epoch else " · full epochs"
        return (
            f"{self.workload} {self.model} · block {self.block_size} · batch {self.batch_size} · "
            f"{self.precision} · {self.strategy} · data {self.data}{steps} · dropout {self.dropout:g} · "
            f"lr {self.learning_rate:g}"
        )

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


# --------------------------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spread:
    """Median and range of repeated measurements."""

    median: float
    low: float
    high: float
    values: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def relative_half_range(self) -> float:
        """Half the range over the median: the ``±`` shown next to a median."""
        return (self.high - self.low) / 2 / self.median if self.median else 0.0

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Spread | None:
        known = tuple(float(v) for v in values if v is not None and math.isfinite(v))
        if not known:
            return None
        return cls(statistics.median(known), min(known), max(known), known)

    def as_dict(self) -> dict[str, Any]:
        return {"median": self.median, "min": self.low, "max": self.high, "n": self.n}


_EXACT_LIMIT = (
    400  # n1 * n2 above this: the normal approximation (exact at 20 x 20 takes 60 ms, at 50 x 50 3 s)
)


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of the Mann-Whitney U test: how likely a separation at least this clear is if both
    samples came from the same distribution. Makes no normality assumption, which suits timings (skewed, with
    outliers). Exact (the permutation distribution, ties given mid-ranks) for small samples; the normal
    approximation with tie correction for large ones."""
    n1, n2 = len(a), len(b)
    if not n1 or not n2:
        raise ValueError("mann_whitney_p needs two non-empty samples")
    n = n1 + n2
    # tied values share their mid-rank; twice a mid-rank is an integer, so rank sums stay exact
    ordered = sorted([*a, *b])
    ties: list[tuple[int, int]] = []  # (how many share the value, twice their mid-rank)
    twice_rank: dict[float, int] = {}
    i = 0
    while i < n:
        j = i
        while j < n and ordered[j] == ordered[i]:
            j += 1
        ties.append((j - i, i + 1 + j))
        twice_rank[ordered[i]] = i + 1 + j
        i = j
    observed = sum(twice_rank[x] for x in a)  # twice sample 1's rank sum
    centre = n1 * (n + 1)  # its expectation under the null hypothesis
    if n1 * n2 > _EXACT_LIMIT:
        correction = sum(t**3 - t for t, _ in ties) / (n * (n - 1))
        sd = math.sqrt(n1 * n2 / 12 * ((n + 1) - correction))
        z = max(0.0, abs(observed - centre) / 2 - 0.5) / sd  # continuity correction
        return min(1.0, math.erfc(z / math.sqrt(2)))
    # ways[(k, s)]: ways to give k of the values seen so far to sample 1 with twice-rank-sum s
    ways: dict[tuple[int, int], int] = {(0, 0): 1}
    for count, rank2 in ties:
        step: dict[tuple[int, int], int] = {}
        for (k, total), w in ways.items():
            for c in range(min(count, n1 - k) + 1):
                state = (k + c, total + c * rank2)
                step[state] = step.get(state, 0) + w * math.comb(count, c)
        ways = step
    deviation = abs(observed - centre)
    extreme = sum(w for (k, total), w in ways.items() if k == n1 and abs(total - centre) >= deviation)
    return min(1.0, extreme / math.comb(n, n1))


def smallest_p(n1: int, n2: int) -> float:
    """The smallest p-value samples of these sizes can reach (complete separation): with 2 vs 2 measurements it
    is 1/3, so no amount of difference can be called beyond the noise."""
    return 2 / math.comb(n1 + n2, n1)


# --------------------------------------------------------------------------------------------------------------
# The comparison
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BaselineRatio:
    """One cell against the baseline system's cell of the same workload and device count."""

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

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Cell:
    """One system running one workload at one device count, with every run of it."""

    system: str
    devices: int
    runs: list[LoadedRecord]
    baseline: BaselineRatio | None = None
    scaling: Scaling | None = None

    @property
    def ok_runs(self) -> list[ResultRecord]:
        return [r.record for r in self.runs if r.record.outcome.status == "ok" and r.record.metrics]

    def status_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self.runs:
            counts[r.record.outcome.status] = counts.get(r.record.outcome.status, 0) + 1
        return counts

    def _steady_epochs(self) -> list[Any]:
        # every steady epoch of every successful run is one measurement (epoch 0 is the warm-up)
        return [e for rec in self.ok_runs for e in rec.metrics.epochs[1:]]  # type: ignore[union-attr]

    @property
    def epoch_s(self) -> Spread | None:
        return Spread.of(e.wall_s for e in self._steady_epochs())

    @property
    def samples_per_s(self) -> Spread | None:
        return Spread.of(e.samples_per_s for e in self._steady_epochs())

    @property
    def tokens_per_s(self) -> Spread | None:
        return Spread.of(e.tokens_per_s for e in self._steady_epochs())

    @property
    def peak_memory_bytes(self) -> Spread | None:
        return Spread.of(rec.metrics.peak_memory_max_bytes for rec in self.ok_runs)  # type: ignore[union-attr]

    @property
    def mfu(self) -> Spread | None:
        return Spread.of(rec.metrics.steady.mfu for rec in self.ok_runs if rec.metrics.steady)  # type: ignore[union-attr]

    @property
    def compile_s(self) -> Spread | None:
        return Spread.of(rec.metrics.compile_s for rec in self.ok_runs)  # type: ignore[union-attr]

    @property
    def warmup_s(self) -> Spread | None:
        return Spread.of(rec.metrics.warmup.wall_s for rec in self.ok_runs if rec.metrics.warmup)  # type: ignore[union-attr]

    def outcome_text(self) -> str:
        """``2 ok``, ``1 ok, 1 oom``..."""
        return ", ".join(f"{n} {status}" for status, n in self.status_counts().items())

    def failure(self) -> str | None:
        """Why there is no figure: the outcome of the last run that did not succeed (e.g. OOM), or None."""
        if self.epoch_s is not None:
            return None
        for r in reversed(self.runs):
            o = r.record.outcome
            if o.status != "ok":
                if o.status == "oom":
                    return "OOM"
                first_line = next(iter((o.message or "").splitlines()), "")
                return f"{o.status}: {first_line[:80]}" if first_line else o.status
        return "no steady state (needs 2 epochs)"


@dataclass
class WorkloadGroup:
    key: WorkloadKey
    cells: list[Cell]


@dataclass(frozen=True)
class Filters:
    """Keep only records matching every given list (each list: any of its values). Systems match by substring."""

    models: tuple[str, ...] = ()
    precisions: tuple[str, ...] = ()
    strategies: tuple[str, ...] = ()
    systems: tuple[str, ...] = ()

    def keep(self, r: LoadedRecord, label: str) -> bool:
        c = r.record.config
        if self.models and c.model not in self.models and WorkloadKey.of(r.record).model not in self.models:
            return False
        if self.precisions and c.precision not in self.precisions:
            return False
        if self.strategies and c.strategy not in self.strategies:
            return False
        return not self.systems or any(s.lower() in label.lower() for s in self.systems)


@dataclass
class Comparison:
    """Everything `compare` shows, in every output format."""

    systems: list[str]
    baseline: str
    groups: list[WorkloadGroup]
    environment: list[tuple[str, dict[str, list[str]]]]  # attribute, system -> values, only those that differ
    records: list[tuple[str, LoadedRecord]]  # (system, record) after filtering
    skipped: list[tuple[Path, str]]
    duplicates: list[Path]
    alpha: float
    label_by: tuple[str, ...]


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
) -> Comparison:
    """Group records by workload, put systems side by side, and compute ratios, scaling and noise verdicts."""
    labelled = [(system_label(r, label_by), r) for r in record_set.records]
    labelled = [(label, r) for label, r in labelled if filters.keep(r, label)]
    if not labelled:
        what = "no result records matched the filters" if record_set.records else "no result records found"
        raise AccelbenchError(f"{what}; nothing to compare")
    systems = list(dict.fromkeys(label for label, _ in labelled))
    base = choose_baseline(systems, baseline)

    cells: dict[WorkloadKey, dict[tuple[str, int], Cell]] = {}
    for label, r in labelled:
        key = WorkloadKey.of(r.record)
        devices = r.record.backend.devices_used
        group = cells.setdefault(key, {})
        group.setdefault((label, devices), Cell(label, devices, [])).runs.append(r)

    order = {s: i for i, s in enumerate(systems)}
    groups = []
    for key, by_cell in cells.items():
        group_cells = sorted(by_cell.values(), key=lambda c: (order[c.system], c.devices))
        _fill_ratios(group_cells, base, alpha)
        groups.append(WorkloadGroup(key, group_cells))
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
    )


def _fill_ratios(cells: list[Cell], baseline: str, alpha: float) -> None:
    base_by_devices = {c.devices: c for c in cells if c.system == baseline}
    for cell in cells:
        epochs, base = cell.epoch_s, base_by_devices.get(cell.devices)
        if cell.system != baseline and base and epochs and base.epoch_s:
            cell.baseline = _ratio(cell, base, alpha)
        # scaling: throughput against the same system's smallest device count that has a measurement
        series = [c for c in cells if c.system == cell.system and c.samples_per_s]
        if cell.samples_per_s and len(series) > 1:
            first = min(series, key=lambda c: c.devices)
            if first.devices < cell.devices:
                speedup = cell.samples_per_s.median / first.samples_per_s.median  # type: ignore[union-attr]
                cell.scaling = Scaling(first.devices, speedup, speedup / (cell.devices / first.devices))


def _ratio(cell: Cell, base: Cell, alpha: float) -> BaselineRatio:
    mine, theirs = cell.epoch_s, base.epoch_s
    assert mine and theirs
    memory = cell.peak_memory_bytes
    base_memory = base.peak_memory_bytes
    p = mann_whitney_p(mine.values, theirs.values)
    if smallest_p(mine.n, theirs.n) >= alpha:
        verdict = "too few measurements"
    elif p < alpha:
        verdict = "beyond noise"
    else:
        verdict = "within noise"
    return BaselineRatio(
        speedup=theirs.median / mine.median,
        throughput_ratio=cell.samples_per_s.median / base.samples_per_s.median,  # type: ignore[union-attr]
        memory_ratio=memory.median / base_memory.median
        if memory and base_memory and base_memory.median
        else None,
        p_value=p,
        verdict=verdict,
        measurements=(theirs.n, mine.n),
    )


# --------------------------------------------------------------------------------------------------------------
# What differs between the environments
# --------------------------------------------------------------------------------------------------------------


def environment_of(record: ResultRecord) -> dict[str, str]:
    """The facts about a run's environment that can make a comparison unfair, flattened to strings."""
    s, b = record.system, record.backend
    env: dict[str, str] = {
        "accelbench": s.accelbench_version,
        "torch": s.torch_version
        + (f" (CUDA {s.torch_cuda})" if s.torch_cuda else "")
        + (f" (HIP {s.torch_hip})" if s.torch_hip else ""),
        "python": s.python,
        "os": s.os,
        "cpu": s.cpu_model,
        "backend": b.info.name + (f" ({b.distribution} {b.version})" if b.distribution else ""),
        "device": b.devices[0].name if b.devices else "none",
        "device unit": b.info.device_unit,
        "collective backend": b.collective_backend or "none",
        "torch threads": str(s.torch_threads),
        "engine": record.engine,
        "launcher": f"{record.launcher} ({record.world_size} processes on {record.nodes} node(s))",
        "scheduler": s.scheduler or "none",
    }
    for name, version in b.runtime_versions.items():
        env[f"runtime {name}"] = version
    for name, version in record.plugins.items():
        env[f"plugin {name}"] = version
    for name, value in s.environment.items():
        env[f"env {name}"] = value
    if record.precision:
        # keyed by the precision asked for: "fp32 that ran as TF32" on one side only is what must show
        p = record.precision
        env[f"precision {p.name}"] = (
            f"params {p.param_dtype}, autocast {p.autocast_dtype or 'off'}, matmul {p.matmul_math}, "
            f"loss scaling {p.loss_scaling}"
        )
    if record.executor:
        env["torch.compile"] = str(record.executor.get("torch_compile"))
        env["optimizer"] = (
            f"{record.executor.get('optimizer')} (fused: {record.executor.get('fused_optimizer')})"
        )
    if record.workload.get("attention"):
        env["attention"] = str(record.workload["attention"])
    if record.metrics and record.metrics.memory:
        env["memory measured"] = record.metrics.memory.source
    if record.metrics and record.metrics.peak:
        env["peak figure"] = record.metrics.peak.source
    return env


def environment_differences(
    labelled: Sequence[tuple[str, LoadedRecord]], systems: Sequence[str]
) -> list[tuple[str, dict[str, list[str]]]]:
    """Attributes whose values differ between the systems that have them (or vary within one), with each system's
    values. An attribute only some systems have (a GPU driver, the plan of a precision only one system ran) is
    not a difference by itself."""
    values: dict[str, dict[str, list[str]]] = {}
    for label, r in labelled:
        for attribute, value in environment_of(r.record).items():
            seen = values.setdefault(attribute, {}).setdefault(label, [])
            if value not in seen:
                seen.append(value)
    differing = []
    for attribute, by_system in values.items():
        per_system = [tuple(sorted(by_system[s])) for s in systems if s in by_system]
        if len(set(per_system)) > 1 or any(len(v) > 1 for v in per_system):
            differing.append((attribute, {s: sorted(by_system.get(s, [])) for s in systems}))
    return differing


# --------------------------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------------------------


def fmt_spread(spread: Spread | None, unit: str = "", digits: int = 3) -> str:
    if spread is None:
        return "-"
    text = f"{spread.median:.{digits}f}{unit}"
    if spread.n > 1:
        text += f" ±{spread.relative_half_range:.1%}"
    return text


def fmt_rate(spread: Spread | None) -> str:
    return "-" if spread is None else f"{spread.median:,.1f}"


def fmt_memory(spread: Spread | None) -> str:
    return "-" if spread is None else fmt_bytes(spread.median)


def fmt_mfu(cell: Cell) -> str:
    if not cell.ok_runs:
        return "-"
    return "unknown" if cell.mfu is None else f"{cell.mfu.median:.1%}"


def fmt_vs_baseline(cell: Cell, baseline: str) -> str:
    if cell.system == baseline:
        return "baseline"
    if cell.baseline is None:
        return "-"
    return f"×{cell.baseline.speedup:.2f}"


def fmt_noise(cell: Cell) -> str:
    r = cell.baseline
    if r is None:
        return "-"
    if r.verdict == "too few measurements":
        return f"can't tell ({r.measurements[0]} vs {r.measurements[1]} epochs)"
    return f"{'yes' if r.verdict == 'beyond noise' else 'no'} (p={r.p_value:.2g})"


def fmt_scaling(cell: Cell) -> str:
    s = cell.scaling
    if s is None:
        return "-"
    return f"×{s.speedup:.2f} vs {s.base_devices} dev, eff {s.efficiency:.0%}"


COLUMNS = (
    "system",
    "devices",
    "runs",
    "steady epoch s",
    "samples/s",
    "peak memory",
    "MFU",
    "compile s",
    "speed ×",
    "memory ×",
    "beyond noise?",
    "scaling",
)


def cell_row(cell: Cell, baseline: str) -> list[str]:
    """A cell as the strings every text format shows, in :data:`COLUMNS` order."""
    failure = cell.failure()
    memory_ratio = cell.baseline.memory_ratio if cell.baseline else None
    return [
        cell.system,
        str(cell.devices),
        cell.outcome_text(),
        failure or fmt_spread(cell.epoch_s, " s"),
        fmt_rate(cell.samples_per_s),
        fmt_memory(cell.peak_memory_bytes),
        fmt_mfu(cell),
        fmt_spread(cell.compile_s, " s", 2) if cell.compile_s else "-",
        fmt_vs_baseline(cell, baseline),
        f"×{memory_ratio:.2f}" if memory_ratio is not None else "-",
        fmt_noise(cell),
        fmt_scaling(cell),
    ]


def _notes(comparison: Comparison) -> list[str]:
    return [
        f"baseline: {comparison.baseline}. speed ×N = baseline epoch time / this epoch time (>1 is faster); "
        "memory ×N = this peak memory / the baseline's. Epoch time = median of the steady epochs (after the "
        "warm-up) of all successful runs, ± half their range.",
        "beyond noise? = two-sided Mann-Whitney test of this system's steady epoch times against the baseline's: "
        f"yes when p < {comparison.alpha:g}; can't tell when so few epochs could never reach that "
        "(run more epochs or --repeats).",
    ]


def render_table(comparison: Comparison, console: Console) -> None:
    """Terminal tables (rich): one per workload, then the environment differences."""
    for group in comparison.groups:
        table = Table(title=Text(group.key.describe()), title_justify="left", show_lines=False)
        for name in COLUMNS:
            left = name in ("system", "runs", "beyond noise?")
            table.add_column(
                name, justify="left" if left else "right", min_width=24 if name == "system" else None
            )
        for cell in group.cells:
            table.add_row(*(Text(v) for v in cell_row(cell, comparison.baseline)))
        console.print(table)
    if comparison.environment:
        env = Table(title="what differs between the environments", title_justify="left")
        env.add_column("attribute")
        for system in comparison.systems:
            env.add_column(Text(system))
        for attribute, by_system in comparison.environment:
            env.add_row(Text(attribute), *(Text(" | ".join(by_system[s]) or "-") for s in comparison.systems))
        console.print(env)
    else:
        console.print(Text("environments: no differences in versions, precision plans or device definitions"))
    for note in _notes(comparison):
        console.print(Text(note), style="dim")


def _md(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def to_markdown(comparison: Comparison) -> str:
    lines = ["# accelbench comparison", ""]
    for group in comparison.groups:
        lines += [f"## {_md(group.key.describe())}", ""]
        lines.append("| " + " | ".join(COLUMNS) + " |")
        lines.append("|" + "|".join("---" for _ in COLUMNS) + "|")
        for cell in group.cells:
            lines.append("| " + " | ".join(_md(v) for v in cell_row(cell, comparison.baseline)) + " |")
        lines.append("")
    lines += ["## What differs between the environments", ""]
    if comparison.environment:
        lines.append("| attribute | " + " | ".join(_md(s) for s in comparison.systems) + " |")
        lines.append("|---|" + "|".join("---" for _ in comparison.systems) + "|")
        for attribute, by_system in comparison.environment:
            cells = [_md(" / ".join(by_system[s]) or "-") for s in comparison.systems]
            lines.append(f"| {_md(attribute)} | " + " | ".join(cells) + " |")
    else:
        lines.append("No differences in versions, precision plans or device definitions.")
    lines.append("")
    lines += [f"- {_md(note)}" for note in _notes(comparison)]
    if comparison.skipped:
        lines += ["", "## Skipped files", ""]
        lines += [f"- `{_md(str(path))}`: {_md(reason)}" for path, reason in comparison.skipped]
    return "\n".join(lines) + "\n"


CSV_FIELDS = (
    *WorkloadKey.__dataclass_fields__,
    "system",
    "devices",
    "runs_ok",
    "runs_oom",
    "runs_error",
    "runs_interrupted",
    "epoch_s_median",
    "epoch_s_min",
    "epoch_s_max",
    "epochs_measured",
    "samples_per_s",
    "tokens_per_s",
    "peak_memory_bytes",
    "mfu",
    "compile_s",
    "warmup_s",
    "speedup_vs_baseline",
    "throughput_ratio_vs_baseline",
    "memory_ratio_vs_baseline",
    "p_value",
    "verdict",
    "scaling_base_devices",
    "scaling_speedup",
    "scaling_efficiency",
)


def cell_fields(group: WorkloadGroup, cell: Cell) -> dict[str, Any]:
    """A cell as flat machine-readable fields (CSV columns); unknown figures are None."""
    counts = cell.status_counts()
    epoch = cell.epoch_s
    ratio, scaling = cell.baseline, cell.scaling

    def median(s: Spread | None) -> float | None:
        return s.median if s else None

    return {
        **group.key.as_dict(),
        "system": cell.system,
        "devices": cell.devices,
        "runs_ok": counts.get("ok", 0),
        "runs_oom": counts.get("oom", 0),
        "runs_error": counts.get("error", 0),
        "runs_interrupted": counts.get("interrupted", 0),
        "epoch_s_median": median(epoch),
        "epoch_s_min": epoch.low if epoch else None,
        "epoch_s_max": epoch.high if epoch else None,
        "epochs_measured": epoch.n if epoch else 0,
        "samples_per_s": median(cell.samples_per_s),
        "tokens_per_s": median(cell.tokens_per_s),
        "peak_memory_bytes": median(cell.peak_memory_bytes),
        "mfu": median(cell.mfu),
        "compile_s": median(cell.compile_s),
        "warmup_s": median(cell.warmup_s),
        "speedup_vs_baseline": ratio.speedup if ratio else None,
        "throughput_ratio_vs_baseline": ratio.throughput_ratio if ratio else None,
        "memory_ratio_vs_baseline": ratio.memory_ratio if ratio else None,
        "p_value": ratio.p_value if ratio else None,
        "verdict": ratio.verdict if ratio else None,
        "scaling_base_devices": scaling.base_devices if scaling else None,
        "scaling_speedup": scaling.speedup if scaling else None,
        "scaling_efficiency": scaling.efficiency if scaling else None,
    }


def to_csv(comparison: Comparison) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for group in comparison.groups:
        for cell in group.cells:
            writer.writerow({k: "" if v is None else v for k, v in cell_fields(group, cell).items()})
    return out.getvalue()


def to_json(comparison: Comparison) -> dict[str, Any]:
    def spread(s: Spread | None) -> dict[str, Any] | None:
        return s.as_dict() if s else None

    groups = []
    for group in comparison.groups:
        cells = []
        for cell in group.cells:
            cells.append(
                {
                    "system": cell.system,
                    "devices": cell.devices,
                    "outcomes": cell.status_counts(),
                    "failure": cell.failure(),
                    "epoch_s": spread(cell.epoch_s),
                    "samples_per_s": spread(cell.samples_per_s),
                    "tokens_per_s": spread(cell.tokens_per_s),
                    "peak_memory_bytes": spread(cell.peak_memory_bytes),
                    "mfu": spread(cell.mfu),
                    "compile_s": spread(cell.compile_s),
                    "warmup_s": spread(cell.warmup_s),
                    "vs_baseline": cell.baseline.as_dict() if cell.baseline else None,
                    "scaling": cell.scaling.as_dict() if cell.scaling else None,
                    "records": [str(r.path) for r in cell.runs],
                }
            )
        groups.append({"workload": group.key.as_dict(), "cells": cells})
    return {
        "systems": comparison.systems,
        "baseline": comparison.baseline,
        "label_by": list(comparison.label_by),
        "alpha": comparison.alpha,
        "groups": groups,
        "environment_differences": [{"attribute": a, "values": v} for a, v in comparison.environment],
        "skipped": [{"path": str(p), "reason": reason} for p, reason in comparison.skipped],
        "duplicates": [str(p) for p in comparison.duplicates],
    }


def render(comparison: Comparison, fmt: str) -> str:
    """The comparison as text in one of :data:`FORMATS` (``table`` renders rich tables to plain text)."""
    if fmt == "markdown":
        return to_markdown(comparison)
    if fmt == "csv":
        return to_csv(comparison)
    if fmt == "json":
        return json.dumps(to_json(comparison), indent=2) + "\n"
    if fmt == "table":
        console = Console(file=io.StringIO(), width=200, force_terminal=False, color_system=None)
        render_table(comparison, console)
        return console.file.getvalue()  # type: ignore[attr-defined]
    raise AccelbenchError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")


# --------------------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------------------


def add_selection_arguments(parser: argparse.ArgumentParser) -> None:
    """Options `compare` and `report` share: inputs, system labels, baseline, filters."""
    parser.add_argument("paths", nargs="+", type=Path, metavar="RESULT_FILES_OR_DIRS")
    parser.add_argument(
        "--label-by",
        default=",".join(DEFAULT_LABEL_BY),
        help=f"record fields that name a system (default: {','.join(DEFAULT_LABEL_BY)}); "
        f"any of: {', '.join(SYSTEM_FIELDS)}. 'dir' = the folder a record is in",
    )
    parser.add_argument(
        "--baseline", help="system the ratios are against (a label or part of one; default: first)"
    )
    parser.add_argument("--model", action="append", default=[], help="only this model (repeatable)")
    parser.add_argument("--precision", action="append", default=[], help="only this precision (repeatable)")
    parser.add_argument("--strategy", action="append", default=[], help="only this strategy (repeatable)")
    parser.add_argument(
        "--system", action="append", default=[], help="only systems whose label contains this (repeatable)"
    )
    parser.add_argument(
        "--alpha",
        type=float,
        default=DEFAULT_ALPHA,
        help=f"significance level for 'beyond noise' (default: {DEFAULT_ALPHA})",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="fail on a malformed, foreign or newer-schema file (default: skip it)",
    )


def comparison_from_args(args: argparse.Namespace, err: Console) -> Comparison:
    """Read, report skipped files on ``err``, and compare, as the `compare` and `report` commands do."""
    if not 0 < args.alpha < 1:
        raise AccelbenchError(f"--alpha {args.alpha}: must be between 0 and 1, e.g. 0.05")
    label_by = parse_label_by(args.label_by)
    record_set = load_records(args.paths, strict=args.strict)
    for path, reason in record_set.skipped:
        err.print(Text(f"skipped {path}: {reason}", style="yellow"), soft_wrap=True)
    if record_set.duplicates:
        err.print(
            Text(f"{len(record_set.duplicates)} duplicate record(s) (same run id) counted once", style="dim"),
            soft_wrap=True,
        )
    filters = Filters(tuple(args.model), tuple(args.precision), tuple(args.strategy), tuple(args.system))
    return compare(record_set, label_by, args.baseline, filters, args.alpha)


def compare_command(args: argparse.Namespace, err: Console) -> int:
    """`accelbench compare`: print (or write) the comparison in the chosen format."""
    comparison = comparison_from_args(args, err)
    if args.output:
        text = render(comparison, args.format)
        args.output.write_text(text, encoding="utf-8")
        err.print(Text(f"comparison written to {args.output}"), soft_wrap=True)
    elif args.format == "table":
        out = Console()
        # piped: wide enough that no column is cropped (a terminal keeps its own width and wraps)
        render_table(comparison, out if out.is_terminal else Console(width=240))
    else:
        sys.stdout.write(render(comparison, args.format))
    return 0


def add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    """The `compare` subcommand's options."""
    add_selection_arguments(parser)
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format (default: table)")
    parser.add_argument("--output", "-o", type=Path, help="write to this file instead of standard output")
