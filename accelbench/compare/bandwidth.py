"""Collective bandwidth records (`accelbench comm`) side by side: per collective x type x variant, the bus bandwidth
of every system at every message size, its ratio against the baseline system at that size, and each system's peak.

Bus bandwidth (nccl-tests' busbw) is what is compared: it is scaled by the collective's factor so that systems
with different rank counts can be read against the same link speed; a system label still carries the rank count
(``host · cpu · device x2``), because a ring of 2 and a ring of 64 are different things to measure. The same
system measured several times gives the median of its records at each size. A size that could not be measured
says why (OOM, wrong, unsupported, error) instead of a figure.
"""

from __future__ import annotations

import csv
import io
import json
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from accelbench.comm.collectives import OPS, VARIANTS, size_label
from accelbench.comm.records import CommMeasurement, CommRecord
from accelbench.compare.cells import Comparison, choose_baseline
from accelbench.compare.render import render, to_json
from accelbench.errors import AccelbenchError

_FAILURES = {"oom": "OOM", "wrong": "wrong", "unsupported": "unsupported", "error": "error"}


def _device(record: CommRecord) -> str:
    return record.backend.devices[0].name if record.backend.devices else "no device"


# label field -> its part of a comm record's system label (the fields of accelbench.compare.keys.SYSTEM_FIELDS
# that a comm record has; the others, about training runs, add nothing)
COMM_SYSTEM_FIELDS: dict[str, Callable[[CommRecord, str], str | None]] = {
    "host": lambda r, f: r.system.host,
    "backend": lambda r, f: r.backend.info.name,
    "device": lambda r, f: _device(r),
    "threads": lambda r, f: f"threads={r.config.threads}" if r.config.threads else None,
    "dir": lambda r, f: os.path.basename(os.path.dirname(f) or ".") or os.path.dirname(f),
    "job": lambda r, f: f"job {r.system.job_id}" if r.system.job_id else None,
    "cpu": lambda r, f: r.system.cpu_model,
    "torch": lambda r, f: f"torch {r.system.torch_version}",
    "accelbench": lambda r, f: f"accelbench {r.system.accelbench_version}",
}


def comm_system_label(record: CommRecord, file: str, label_by: Sequence[str]) -> str:
    """The system a comm record belongs to: the chosen fields it has, joined with `` · ``, and its rank count."""
    parts = [COMM_SYSTEM_FIELDS[name](record, file) for name in label_by if name in COMM_SYSTEM_FIELDS]
    return f"{' · '.join(p for p in parts if p) or 'unlabelled'} x{record.world_size}"


@dataclass(frozen=True)
class BandwidthCell:
    """One system at one size: the median bus bandwidth of its records (GB/s), or why there is none."""

    busbw_gbps: float | None
    failure: str | None = None
    ratio: float | None = None  # against the baseline system at the same size (>1: more bandwidth)
    records: int = 0

    def text(self, baseline: bool) -> str:
        if self.busbw_gbps is None:
            return self.failure or ""
        ratio = f" ×{self.ratio:.2f}" if self.ratio is not None and not baseline else ""
        return f"{self.busbw_gbps:.3g}{ratio}"


@dataclass
class BandwidthTable:
    """One collective in one type and variant: sizes down, systems across."""

    op: str
    dtype: str
    variant: str
    sizes: list[int]
    systems: list[str]
    cells: dict[tuple[str, int], BandwidthCell]
    peaks: dict[str, tuple[float, int] | None] = field(default_factory=dict)  # system -> (busbw, at size)

    def describe(self) -> str:
        return f"{self.op} · {self.dtype} · {self.variant}"

    def peak_ratio(self, system: str, baseline: str) -> float | None:
        mine, base = self.peaks.get(system), self.peaks.get(baseline)
        return mine[0] / base[0] if mine and base and base[0] > 0 else None


@dataclass
class CommComparison:
    """Every comm record read, labelled, and its tables."""

    systems: list[str]
    baseline: str
    tables: list[BandwidthTable]
    records: list[tuple[str, str, CommRecord]]  # (system, file, record)
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    duplicates: list[Path] = field(default_factory=list)


def compare_comm(
    records: Sequence[tuple[str, CommRecord]],
    label_by: Sequence[str],
    baseline: str | None = None,
    systems_wanted: Sequence[str] = (),
    lenient_baseline: bool = False,
) -> CommComparison:
    """Label the records (``(file, record)``), keep the systems asked for (``--system``: part of a label), and
    build one table per collective x type x variant. ``lenient_baseline``: a ``--baseline`` that names no comm
    system (it named a training system) falls back to the first comm system instead of failing."""
    labelled = [(comm_system_label(r, f, label_by), f, r) for f, r in records]
    if systems_wanted:
        labelled = [x for x in labelled if any(w.lower() in x[0].lower() for w in systems_wanted)]
    if not labelled:
        raise AccelbenchError("no comm records matched --system; nothing to compare")
    systems = list(dict.fromkeys(name for name, _, _ in labelled))
    try:
        base = choose_baseline(systems, baseline)
    except AccelbenchError:
        if not lenient_baseline:
            raise
        base = systems[0]
    found: dict[tuple[str, str, str], dict[tuple[str, int], list[CommMeasurement]]] = {}
    for name, _, record in labelled:
        for m in record.measurements:
            found.setdefault((m.op, m.dtype, m.variant), {}).setdefault((name, m.size_bytes), []).append(m)
    order = {op: i for i, op in enumerate(OPS)}
    tables = []
    variants: list[str] = list(VARIANTS)
    for (op, dtype, variant), by_cell in sorted(
        found.items(), key=lambda kv: (order.get(kv[0][0], len(order)), kv[0][1], variants.index(kv[0][2]))
    ):
        table_systems = [s for s in systems if any(name == s for name, _ in by_cell)]
        sizes = sorted({size for _, size in by_cell})
        medians = {key: _cell(ms) for key, ms in by_cell.items()}
        cells = {}
        for (name, size), cell in medians.items():
            reference = medians.get((base, size))
            ratio = (
                cell.busbw_gbps / reference.busbw_gbps
                if cell.busbw_gbps is not None and reference and reference.busbw_gbps
                else None
            )
            cells[name, size] = BandwidthCell(cell.busbw_gbps, cell.failure, ratio, cell.records)
        peaks: dict[str, tuple[float, int] | None] = {}
        for name in table_systems:
            measured = [
                (c.busbw_gbps, size)
                for (s, size), c in cells.items()
                if s == name and c.busbw_gbps is not None
            ]
            peaks[name] = max(measured) if measured else None
        tables.append(BandwidthTable(op, dtype, variant, sizes, table_systems, cells, peaks))
    return CommComparison(systems, base, tables, labelled)


def _cell(measurements: Sequence[CommMeasurement]) -> BandwidthCell:
    ok = [m.busbw_gbps for m in measurements if m.busbw_gbps is not None]
    if ok:
        return BandwidthCell(statistics.median(ok), records=len(ok))
    failures = [m.status for m in measurements if m.status in _FAILURES]
    return BandwidthCell(None, _FAILURES[failures[0]] if failures else None, records=0)


# --------------------------------------------------------------------------------------------------------------
# As text
# --------------------------------------------------------------------------------------------------------------


def table_rows(table: BandwidthTable, baseline: str) -> tuple[list[str], list[list[str]]]:
    """The header and rows every text format shows: one row per size, then the peaks."""
    header = ["size", *(f"{s} (baseline)" if s == baseline else s for s in table.systems)]
    rows = [
        [size_label(size), *(_text(table.cells.get((s, size)), s == baseline) for s in table.systems)]
        for size in table.sizes
    ]
    peaks = ["peak"]
    for s in table.systems:
        peak = table.peaks.get(s)
        ratio = table.peak_ratio(s, baseline)
        peaks.append(
            f"{peak[0]:.3g}{f' ×{ratio:.2f}' if ratio is not None and s != baseline else ''} at {size_label(peak[1])}"
            if peak
            else "-"
        )
    return header, [*rows, peaks]


def _text(cell: BandwidthCell | None, baseline: bool) -> str:
    return cell.text(baseline) if cell else ""


def caption(comparison: CommComparison) -> str:
    return (
        "Bus bandwidth in GB/s (nccl-tests' busbw: algbw x the collective's factor), the median of a system's "
        f"records at each size; ×N = this system's over the baseline's ({comparison.baseline}) at the same size "
        "(>1: more bandwidth). A system label ends with its rank count."
    )


def grade_lines(comparison: CommComparison) -> list[str]:
    """Each system's best bus bandwidth per collective x type, graded against the ceiling of the link it crossed
    (:mod:`accelbench.comm.grade`)."""
    from accelbench.comm.grade import Grade, grade_record

    best: dict[tuple[str, str, str], Grade] = {}
    for system, _, record in comparison.records:
        for grade in grade_record(record):
            key = (system, grade.op, grade.dtype)
            if key not in best or grade.busbw_gbps > best[key].busbw_gbps:
                best[key] = grade
    return [f"{system}: {grade.describe()}" for (system, _, _), grade in best.items()]


def render_comm_table(comparison: CommComparison, console: Console) -> None:
    """Terminal tables (rich), one per collective x type x variant, then the grades against the links."""
    console.print(Text(f"Collective bandwidth. {caption(comparison)}", style="bold"), soft_wrap=True)
    for table in comparison.tables:
        header, rows = table_rows(table, comparison.baseline)
        shown = Table(title=Text(f"{table.describe()}: bus bandwidth (GB/s)"), title_justify="left")
        for i, name in enumerate(header):
            shown.add_column(name, justify="left" if i == 0 else "right", overflow="fold")
        for i, row in enumerate(rows):
            shown.add_row(*(Text(v, style="bold" if i == len(rows) - 1 else "") for v in row))
        console.print(shown)
    for line in grade_lines(comparison):
        console.print(Text(line, style="yellow" if ": far below its ceiling" in line else ""), soft_wrap=True)


def _md(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def comm_markdown(comparison: CommComparison) -> str:
    lines = ["# Collective bandwidth", "", _md(caption(comparison)), ""]
    for table in comparison.tables:
        header, rows = table_rows(table, comparison.baseline)
        lines += [f"## {_md(table.describe())}", ""]
        lines.append("| " + " | ".join(_md(h) for h in header) + " |")
        lines.append("|" + "|".join("---" for _ in header) + "|")
        lines += ["| " + " | ".join(_md(v) for v in row) + " |" for row in rows]
        lines.append("")
    grades = grade_lines(comparison)
    if grades:
        lines += ["## Against the link's ceiling", "", *(f"- {_md(line)}" for line in grades), ""]
    return "\n".join(lines)


CSV_FIELDS = ("op", "dtype", "variant", "size_bytes", "system", "baseline", "busbw_gbps", "vs_baseline", "failure",
              "records")  # fmt: skip


def _points(comparison: CommComparison) -> list[dict[str, Any]]:
    return [
        {
            "op": t.op,
            "dtype": t.dtype,
            "variant": t.variant,
            "size_bytes": size,
            "system": s,
            "baseline": s == comparison.baseline,
            "busbw_gbps": cell.busbw_gbps,
            "vs_baseline": cell.ratio,
            "failure": cell.failure,
            "records": cell.records,
        }
        for t in comparison.tables
        for size in t.sizes
        for s in t.systems
        if (cell := t.cells.get((s, size))) is not None
    ]


def comm_csv(comparison: CommComparison) -> str:
    """One row per collective x type x variant x size x system; unknown figures empty, never 0."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for point in _points(comparison):
        writer.writerow({k: "" if v is None else v for k, v in point.items()})
    return out.getvalue()


def comm_json(comparison: CommComparison) -> dict[str, Any]:
    return {
        "systems": comparison.systems,
        "baseline": comparison.baseline,
        "tables": [
            {
                "op": t.op,
                "dtype": t.dtype,
                "variant": t.variant,
                "peaks": {
                    s: {
                        "busbw_gbps": p[0],
                        "size_bytes": p[1],
                        "vs_baseline": t.peak_ratio(s, comparison.baseline),
                    }
                    if (p := t.peaks.get(s))
                    else None
                    for s in t.systems
                },
            }
            for t in comparison.tables
        ],
        "points": _points(comparison),
        "records": [
            {"system": s, "file": f, "run_id": r.run_id, "status": r.outcome.status}
            for s, f, r in comparison.records
        ],  # fmt: skip
    }


def render_with_runs(
    runs: Comparison | None, comm: CommComparison | None, fmt: str, wide: bool = True
) -> str:
    """Training runs (a :class:`~accelbench.compare.cells.Comparison`, or None) and collective bandwidth (or None)
    as text in one format: tables and Markdown one after the other; JSON as one object (the runs' comparison with
    ``collectives`` added); CSV holds one kind of row, so one kind of record."""
    if comm is None:
        if runs is None:
            raise AccelbenchError("no result records found; nothing to compare")
        return render(runs, fmt, wide=wide)
    if fmt == "json":
        data: dict[str, Any] = to_json(runs) if runs is not None else {}
        if runs is None:
            data["skipped"] = [{"path": str(p), "reason": reason} for p, reason in comm.skipped]
            data["duplicates"] = [str(p) for p in comm.duplicates]
        return json.dumps({**data, "collectives": comm_json(comm)}, indent=2) + "\n"
    if fmt == "csv":
        if runs is not None:
            raise AccelbenchError(
                "--format csv: the inputs hold both training result records and comm records, whose rows have "
                "different columns; compare them apart (give each kind's files or folders), or use --format json"
            )
        return comm_csv(comm)
    if fmt == "markdown":
        parts = [render(runs, fmt)] if runs is not None else []
        text = comm_markdown(comm)
        if runs is None and comm.skipped:
            text += "\n## Skipped files\n\n" + "".join(
                f"- `{_md(str(p))}`: {_md(r)}\n" for p, r in comm.skipped
            )
        return "\n".join([*parts, text])
    console = Console(file=io.StringIO(), width=200, force_terminal=False, color_system=None)
    if runs is not None:
        console.print(render(runs, "table", wide=wide), end="")
    render_comm_table(comm, console)
    return console.file.getvalue()  # type: ignore[attr-defined]
