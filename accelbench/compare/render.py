"""The comparison as text: terminal tables, Markdown, CSV and JSON.

The text formats (table, Markdown, the report's HTML) show the same columns (:func:`columns`, :func:`cell_row`);
CSV and JSON carry every figure as a number, unknown ones empty (CSV) or null (JSON), never 0. Every column, what
it shows and when, is one entry of :data:`accelbench.compare.columns.REGISTRY`; adding a metric is one entry there.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from accelbench.compare.cells import Cell, Comparison, WorkloadGroup
from accelbench.compare.columns import (
    FIGURES,
    REGISTRY,
    column,
    drop_order,
    figure_csv,
    figure_json,
    headers,
    shown,
)
from accelbench.compare.columns import notes as column_notes
from accelbench.compare.keys import CORE_AXES, format_value
from accelbench.compare.parity import CSV_FIELDS as PARITY_FIELDS
from accelbench.compare.stats import Spread
from accelbench.errors import AccelbenchError

FORMATS = ("table", "markdown", "csv", "json")

# --------------------------------------------------------------------------------------------------------------
# Cells as text: the columns of the registry (accelbench.compare.columns)
# --------------------------------------------------------------------------------------------------------------

# the columns every comparison shows (others: the axis compared along, and those shown only when some cell has them)
COLUMNS = tuple(str(c.header) for c in REGISTRY if c.header and not (c.optional or c.axis_only))


def columns(comparison: Comparison) -> list[str]:
    """The headers of the columns the text formats show (:func:`accelbench.compare.columns.shown`)."""
    return headers(shown(comparison), comparison)


def cell_row(cell: Cell, comparison: Comparison, group: WorkloadGroup) -> list[str]:
    """A cell as the strings every text format shows, in :func:`columns` order."""
    return [c.show(cell, group) for c in shown(comparison)]


SPLIT_CATEGORIES = ("data", "optimizer", "communication", "kernel", "intra-op dispatch", "inter-op dispatch")


def split_rows(group: WorkloadGroup) -> list[list[str]]:
    """``run --profile`` breakdowns of a group's cells side by side (header first): the profiled step in ms and
    each category's share; empty when no cell was profiled."""
    cells = [c for c in group.cells if c.step_split]
    if not cells:
        return []
    header = ["system", "devices", "step ms", *SPLIT_CATEGORIES]
    rows = [header]
    for cell in cells:
        split = cell.step_split or {}
        step = sum(split.values())
        rows.append(
            [cell.system, str(cell.devices), f"{step * 1e3:.1f}"]
            + [f"{split.get(name, 0.0) / step:.0%}" if step else "-" for name in SPLIT_CATEGORIES]
        )
    return rows


def _error(predicted: float | None, measured: float | None) -> str:
    return f"{predicted / measured - 1:+.0%}" if predicted is not None and measured else "-"


def prediction_rows(group: WorkloadGroup) -> list[list[str]]:
    """The analytical model's predictions stored in the records against what the runs measured (header first):
    step time, peak memory per device, and speedup over the series' smallest device count; empty when no record
    carries a prediction. The peak pair is tensors against the measured tensor peak where the runs have one, else
    the whole prediction against the backend's reading (``peak of``: 'tensors' or 'reading')."""
    cells = [c for c in group.cells if c.predicted_step_s or c.predicted_peak_bytes]
    if not cells:
        return []

    def ms(s: Spread | None) -> str:
        return f"{s.median * 1e3:.1f}" if s else "-"

    def mib(s: Spread | None) -> str:
        return f"{s.median / 2**20:,.0f}" if s else "-"

    def median(s: Spread | None) -> float | None:
        return s.median if s else None

    rows = [
        ["system", "devices", "step ms pred.", "measured", "error", "peak of", "peak MiB pred.", "measured", "error",
         "speedup pred.", "measured"]
    ]  # fmt: skip
    for cell in cells:
        scaling = cell.scaling
        predicted_peak, measured_peak, basis = cell.memory_check()
        rows.append(
            [
                cell.system,
                str(cell.devices),
                ms(cell.predicted_step_s),
                ms(cell.step_s),
                _error(median(cell.predicted_step_s), median(cell.step_s)),
                basis,
                mib(predicted_peak),
                mib(measured_peak),
                _error(median(predicted_peak), median(measured_peak)),
                f"{scaling.predicted_speedup:.2f}x" if scaling and scaling.predicted_speedup else "-",
                f"{scaling.speedup:.2f}x" if scaling else "-",
            ]
        )
    return rows


def _narrowed(rows: list[list[str]]) -> list[list[str]]:
    """A terminal's prediction table without the columns that say nothing (one device count, no scaling series),
    under short headers, so that it fits 80 columns."""
    if not rows:
        return rows
    header, body = rows[0], rows[1:]
    drop = set()
    if len({row[1] for row in body}) == 1:
        drop.add(1)  # devices
    if all(row[8] == "-" for row in body):
        drop.update((8, 9))  # no scaling series: no speedups
    names = {
        2: "ms pred.",
        3: "ms meas.",
        4: "error",
        5: "MiB pred.",
        6: "MiB meas.",
        8: "×n pred.",
        9: "×n meas.",
    }
    header = [names.get(i, name) for i, name in enumerate(header)]
    return [[v for i, v in enumerate(row) if i not in drop] for row in [header, *body]]


def notes(comparison: Comparison) -> list[str]:
    """How to read the figures, under every text format."""
    if comparison.axis:
        axis = comparison.axis
        against = (
            f"compared along {axis}: speed ×N = epoch time at the group's baseline {axis} (marked baseline) / this "
            "epoch time, on the same system and device count (>1 is faster); memory ×N = this peak memory / the "
            "baseline's."
        )
        if len(comparison.systems) > 1:
            against += (
                f" {column('vs_system').header} = the same against {comparison.baseline} at the same {axis}."
            )
    else:
        against = (
            f"baseline: {comparison.baseline}. speed ×N = baseline epoch time / this epoch time (>1 is faster); "
            "memory ×N = this peak memory / the baseline's."
        )
    out = [
        f"{against} Epoch time = median of the steady epochs (after the warm-up) of all successful runs, ± half "
        "their range.",
        *(
            f"{group.describe()}: {group.baseline_note}."
            for group in comparison.groups
            if group.baseline_note
        ),
        f"beyond noise? = two-sided Mann-Whitney test of these steady epoch times against the baseline's: yes when "
        f"p < {comparison.alpha:g}; can't tell when so few epochs could never reach that (run more epochs or "
        "--repeats).",
    ]
    out += column_notes(comparison)
    for group in comparison.groups:
        for cell in group.cells:
            if cell.slowest_ranks:
                out.append(
                    f"slowest rank, {group.describe()} on {cell.system} x{cell.devices}: "
                    + "; ".join(cell.slowest_ranks)
                    + " (it held the others up: its own work per step above theirs; the record's "
                    "metrics.slowest_rank.note gives the parts)"
                )
    if any(c.contended_runs for c in comparison.cells):
        out.append(
            "⚠ / contended = the host was busy while a run measured (its threads waited for a core 10% or more "
            "of the time they were ready to run): its figures understate the system; rerun on an idle node."
        )
    return out


# --------------------------------------------------------------------------------------------------------------
# Terminal and Markdown
# --------------------------------------------------------------------------------------------------------------


def fitting_columns(
    header: list[str], rows: list[list[str]], width: int, wrapping: dict[str, int], drop: list[str]
) -> list[str]:
    """The columns that fit ``width`` terminal columns: all of them if they fit (wrapping the columns that may
    wrap, down to their ``wrapping`` width), else without the first of ``drop`` until they do."""
    natural = {h: max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(header)}
    least = {h: min(natural[h], wrapping[h]) if h in wrapping else natural[h] for h in header}
    kept = list(header)
    for name in drop:
        if sum(least[h] + 3 for h in kept) + 1 <= width:
            break
        if name in kept:
            kept.remove(name)
    return kept


def render_table(comparison: Comparison, console: Console, wide: bool = False) -> None:
    """Terminal tables (rich): one per workload, then the environment differences. The tables fit the console's
    width by leaving out the least asked-for columns (said under them); ``wide`` keeps every column."""
    cols = shown(comparison)
    header = headers(cols, comparison)
    by_header = dict(zip(header, cols, strict=True))
    wrapping = {h: c.wrap for h, c in by_header.items() if c.wrap is not None}
    rows = {id(g): [cell_row(c, comparison, g) for c in g.cells] for g in comparison.groups}
    every_row = [row for group_rows in rows.values() for row in group_rows]
    drop = drop_order(cols, comparison)
    kept = header if wide else fitting_columns(header, every_row, console.width, wrapping, drop)
    needed = sum(max([len(h), *(len(r[i]) for r in every_row)]) + 3 for i, h in enumerate(header)) + 1
    if wide and needed > console.width:  # every column at full width, however wide the terminal is
        console = Console(file=console.file, width=needed, force_terminal=console.is_terminal)
    for group in comparison.groups:
        table = Table(
            title=Text(group.describe()),
            title_justify="left",
            show_lines=False,
            caption=Text(group.baseline_note) if group.baseline_note else None,
            caption_justify="left",
        )
        for name in kept:
            table.add_column(
                name,
                justify=by_header[name].align,
                no_wrap=name not in wrapping,
                overflow="fold",
            )
        for row in rows[id(group)]:
            table.add_row(*(Text(row[header.index(name)]) for name in kept))
        console.print(table)
        split = split_rows(group)
        if split:
            breakdown = Table(title=Text("where a step's time goes (run --profile)"), title_justify="left")
            for name in split[0]:
                breakdown.add_column(name, justify="left" if name == "system" else "right")
            for row in split[1:]:
                breakdown.add_row(*(Text(v) for v in row))
            console.print(breakdown)
        predicted = _narrowed(prediction_rows(group))
        if predicted:
            against = Table(
                title=Text("predicted (accelbench estimate's model) against measured"), title_justify="left"
            )
            for name in predicted[0]:
                if name == "system":
                    against.add_column(name, justify="left", min_width=10, overflow="fold")
                else:
                    against.add_column(name, justify="right")
            for row in predicted[1:]:
                against.add_row(*(Text(v) for v in row))
            console.print(against)
    left_out = [h for h in header if h not in kept]
    if left_out:
        console.print(
            Text(
                f"left out to fit {console.width} columns: {', '.join(left_out)} (--wide shows every column; "
                "--format csv or json carries every figure)"
            ),
            style="yellow",
        )
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
    for note in notes(comparison):
        console.print(Text(note), style="dim")


def _md(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def to_markdown(comparison: Comparison) -> str:
    header = columns(comparison)
    lines = ["# accelbench comparison", ""]
    for group in comparison.groups:
        lines += [f"## {_md(group.describe())}", ""]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "|".join("---" for _ in header) + "|")
        for cell in group.cells:
            lines.append("| " + " | ".join(_md(v) for v in cell_row(cell, comparison, group)) + " |")
        lines.append("")
        split = split_rows(group)
        if split:
            lines += ["Where a step's time goes (run --profile):", ""]
            lines.append("| " + " | ".join(split[0]) + " |")
            lines.append("|" + "|".join("---" for _ in split[0]) + "|")
            lines += ["| " + " | ".join(_md(v) for v in row) + " |" for row in split[1:]]
            lines.append("")
        predicted = prediction_rows(group)
        if predicted:
            lines += ["Predicted (accelbench estimate's model) against measured:", ""]
            lines.append("| " + " | ".join(predicted[0]) + " |")
            lines.append("|" + "|".join("---" for _ in predicted[0]) + "|")
            lines += ["| " + " | ".join(_md(v) for v in row) + " |" for row in predicted[1:]]
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
    lines += [f"- {_md(note)}" for note in notes(comparison)]
    if comparison.skipped:
        lines += ["", "## Skipped files", ""]
        lines += [f"- `{_md(str(path))}`: {_md(reason)}" for path, reason in comparison.skipped]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------------------
# CSV and JSON
# --------------------------------------------------------------------------------------------------------------

_CSV_HEAD = (
    *CORE_AXES,
    "identity",
    "system",
    "devices",
    "compared_along",
    "value",
    "runs_ok",
    "runs_oom",
    "runs_error",
    "runs_interrupted",
    "runs_contended",
)
_CSV_TAIL = (
    "baseline",
    "speedup_vs_baseline",
    "throughput_ratio_vs_baseline",
    "memory_ratio_vs_baseline",
    "p_value",
    "verdict",
    "speedup_vs_baseline_system",
    "scaling_base_devices",
    "scaling_speedup",
    "scaling_efficiency",
    "step_s",
    "predicted_step_s",
    "predicted_peak_memory_bytes",
    "predicted_scaling_speedup",
    "tensor_peak_bytes",
    "predicted_tensor_bytes",
    *PARITY_FIELDS,
)
# the cell's identification, its figures (the registry's, in its order), then its ratios and predictions
CSV_FIELDS = (*_CSV_HEAD, *(name for c in FIGURES for name in c.csv(c.name, None)), *_CSV_TAIL)


def baseline_of(comparison: Comparison, group: WorkloadGroup) -> str:
    """What a group's ratios are against: the baseline system, or ``axis=value`` along an axis."""
    if group.axis:
        return f"{group.axis}={format_value(group.baseline_value, group.axis)}"
    return group.baseline_system


def _median(s: Spread | None) -> float | None:
    return s.median if s else None


def cell_fields(comparison: Comparison, group: WorkloadGroup, cell: Cell) -> dict[str, Any]:
    """A cell as flat machine-readable fields (CSV columns); unknown figures are None."""
    counts = cell.status_counts()
    ratio, scaling = cell.baseline, cell.scaling
    key = cell.key or group.key
    return {
        **key.as_dict(),
        "system": cell.system,
        "devices": cell.devices,
        "compared_along": group.axis,
        "value": cell.value if group.axis else None,
        "runs_ok": counts.get("ok", 0),
        "runs_oom": counts.get("oom", 0),
        "runs_error": counts.get("error", 0),
        "runs_interrupted": counts.get("interrupted", 0),
        "runs_contended": cell.contended_runs,
        **figure_csv(cell),
        "baseline": baseline_of(comparison, group),
        "speedup_vs_baseline": ratio.speedup if ratio else None,
        "throughput_ratio_vs_baseline": ratio.throughput_ratio if ratio else None,
        "memory_ratio_vs_baseline": ratio.memory_ratio if ratio else None,
        "p_value": ratio.p_value if ratio else None,
        "verdict": ratio.verdict if ratio else None,
        "speedup_vs_baseline_system": cell.vs_system.speedup if cell.vs_system else None,
        "scaling_base_devices": scaling.base_devices if scaling else None,
        "scaling_speedup": scaling.speedup if scaling else None,
        "scaling_efficiency": scaling.efficiency if scaling else None,
        "step_s": _median(cell.step_s),
        "predicted_step_s": _median(cell.predicted_step_s),
        "predicted_peak_memory_bytes": _median(cell.predicted_peak_bytes),
        "predicted_scaling_speedup": scaling.predicted_speedup if scaling else None,
        "tensor_peak_bytes": _median(cell.tensor_peak_bytes),
        "predicted_tensor_bytes": _median(cell.predicted_tensor_bytes),
        **(cell.parity.csv_fields() if cell.parity else dict.fromkeys(PARITY_FIELDS)),
    }


def to_csv(comparison: Comparison) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for group in comparison.groups:
        for cell in group.cells:
            fields = cell_fields(comparison, group, cell)
            writer.writerow({k: "" if v is None else v for k, v in fields.items()})
    return out.getvalue()


def _spread(s: Spread | None) -> dict[str, Any] | None:
    return s.as_dict() if s else None


def cell_json(cell: Cell) -> dict[str, Any]:
    return {
        "system": cell.system,
        "devices": cell.devices,
        "value": cell.value,
        "outcomes": cell.status_counts(),
        "contended_runs": cell.contended_runs,
        "slowest_ranks": cell.slowest_ranks,
        "step_split_s": cell.step_split,
        "step_s": _spread(cell.step_s),
        "tensor_peak_bytes": _spread(cell.tensor_peak_bytes),
        "predicted": {
            "step_s": _spread(cell.predicted_step_s),
            "comm_exposed_s": _spread(cell.predicted_comm_s),
            "peak_memory_bytes": _spread(cell.predicted_peak_bytes),
            "tensor_bytes": _spread(cell.predicted_tensor_bytes),
            "speedup": cell.scaling.predicted_speedup if cell.scaling else None,
        }
        if cell.predicted_step_s or cell.predicted_peak_bytes
        else None,
        "failure": cell.failure(),
        **figure_json(cell),
        "parity": cell.parity.as_dict() if cell.parity else None,
        "vs_baseline": cell.baseline.as_dict() if cell.baseline else None,
        "vs_baseline_system": cell.vs_system.as_dict() if cell.vs_system else None,
        "scaling": cell.scaling.as_dict() if cell.scaling else None,
        "records": [r.file for r in cell.runs],
    }


def to_json(comparison: Comparison) -> dict[str, Any]:
    groups = [
        {
            "workload": group.key.as_dict(group.axis),
            "vs": group.axis,
            "baseline": baseline_of(comparison, group),
            "baseline_value": group.baseline_value,
            "baseline_system": group.baseline_system,
            "baseline_note": group.baseline_note,
            "cells": [cell_json(cell) for cell in group.cells],
        }
        for group in comparison.groups
    ]
    return {
        "systems": comparison.systems,
        "baseline": comparison.baseline,
        "vs": comparison.axis,
        "label_by": list(comparison.label_by),
        "alpha": comparison.alpha,
        "groups": groups,
        "environment_differences": [{"attribute": a, "values": v} for a, v in comparison.environment],
        "skipped": [{"path": str(p), "reason": reason} for p, reason in comparison.skipped],
        "duplicates": [str(p) for p in comparison.duplicates],
    }


def render(comparison: Comparison, fmt: str, wide: bool = True) -> str:
    """The comparison as text in one of :data:`FORMATS` (``table`` renders rich tables to plain text)."""
    if fmt == "markdown":
        return to_markdown(comparison)
    if fmt == "csv":
        return to_csv(comparison)
    if fmt == "json":
        return json.dumps(to_json(comparison), indent=2) + "\n"
    if fmt == "table":
        console = Console(file=io.StringIO(), width=200, force_terminal=False, color_system=None)
        render_table(comparison, console, wide=wide)
        return console.file.getvalue()  # type: ignore[attr-defined]
    raise AccelbenchError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
