"""The comparison as text: terminal tables, Markdown, CSV and JSON.

The text formats (table, Markdown, the report's HTML) show the same columns (:func:`columns`, :func:`cell_row`);
CSV and JSON carry every figure as a number, unknown ones empty (CSV) or null (JSON), never 0.
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
from accelbench.compare.keys import CORE_AXES, format_value
from accelbench.compare.stats import Spread
from accelbench.display import fmt_bytes
from accelbench.errors import AccelbenchError

FORMATS = ("table", "markdown", "csv", "json")

# --------------------------------------------------------------------------------------------------------------
# Cells as text
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


def fmt_energy(spread: Spread | None) -> str:
    """Joules per sample, three significant digits (a small model's figure is a few millijoules)."""
    if spread is None:
        return "-"
    text = f"{spread.median:.3g}"
    return text + (f" ±{spread.relative_half_range:.1%}" if spread.n > 1 else "")


def fmt_mfu(cell: Cell) -> str:
    if not cell.ok_runs:
        return "-"
    return "unknown" if cell.mfu is None else f"{cell.mfu.median:.1%}"


def fmt_vs_baseline(cell: Cell, comparison: Comparison, group: WorkloadGroup) -> str:
    is_baseline = cell.value == group.baseline_value if group.axis else cell.system == comparison.baseline
    if is_baseline:
        return "baseline"
    return "-" if cell.baseline is None else f"×{cell.baseline.speedup:.2f}"


def fmt_vs_system(cell: Cell, comparison: Comparison) -> str:
    if cell.system == comparison.baseline:
        return "baseline"
    return "-" if cell.vs_system is None else f"×{cell.vs_system.speedup:.2f}"


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
ENERGY_COLUMN = "J/sample"
VS_SYSTEM_COLUMN = "vs baseline system"


def columns(comparison: Comparison) -> list[str]:
    """The columns the text formats show: :data:`COLUMNS`, with the axis compared along after the device count,
    energy per sample when any run has it, and, along an axis with several systems, the ratio against the
    baseline system."""
    out = list(COLUMNS)
    if comparison.axis:
        out.insert(out.index("devices") + 1, comparison.axis)
        if len(comparison.systems) > 1:
            out.insert(out.index("beyond noise?") + 1, VS_SYSTEM_COLUMN)
    if comparison.has_energy:
        out.insert(out.index("MFU") + 1, ENERGY_COLUMN)
    return out


def cell_row(cell: Cell, comparison: Comparison, group: WorkloadGroup) -> list[str]:
    """A cell as the strings every text format shows, in :func:`columns` order."""
    memory_ratio = cell.baseline.memory_ratio if cell.baseline else None
    text = {
        "system": cell.system,
        "devices": str(cell.devices),
        "runs": cell.outcome_text(),
        "steady epoch s": cell.failure() or fmt_spread(cell.epoch_s, " s"),
        "samples/s": fmt_rate(cell.samples_per_s),
        "peak memory": fmt_memory(cell.peak_memory_bytes),
        "MFU": fmt_mfu(cell),
        ENERGY_COLUMN: fmt_energy(cell.joules_per_sample),
        "compile s": fmt_spread(cell.compile_s, " s", 2) if cell.compile_s else "-",
        "speed ×": fmt_vs_baseline(cell, comparison, group),
        "memory ×": f"×{memory_ratio:.2f}" if memory_ratio is not None else "-",
        "beyond noise?": fmt_noise(cell),
        VS_SYSTEM_COLUMN: fmt_vs_system(cell, comparison),
        "scaling": fmt_scaling(cell),
    }
    if comparison.axis:
        text[comparison.axis] = format_value(cell.value, comparison.axis)
    return [text[name] for name in columns(comparison)]


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
            against += f" {VS_SYSTEM_COLUMN} = the same against {comparison.baseline} at the same {axis}."
    else:
        against = (
            f"baseline: {comparison.baseline}. speed ×N = baseline epoch time / this epoch time (>1 is faster); "
            "memory ×N = this peak memory / the baseline's."
        )
    out = [
        f"{against} Epoch time = median of the steady epochs (after the warm-up) of all successful runs, ± half "
        "their range.",
        f"beyond noise? = two-sided Mann-Whitney test of these steady epoch times against the baseline's: yes when "
        f"p < {comparison.alpha:g}; can't tell when so few epochs could never reach that (run more epochs or "
        "--repeats).",
    ]
    if comparison.has_energy:
        out.append(
            f"{ENERGY_COLUMN} = joules per sample over the steady epochs, from the devices' energy counters."
        )
    return out


# --------------------------------------------------------------------------------------------------------------
# Terminal and Markdown
# --------------------------------------------------------------------------------------------------------------

_LEFT = ("system", "runs", "beyond noise?")


def render_table(comparison: Comparison, console: Console) -> None:
    """Terminal tables (rich): one per workload, then the environment differences."""
    header = columns(comparison)
    for group in comparison.groups:
        table = Table(title=Text(group.describe()), title_justify="left", show_lines=False)
        for name in header:
            table.add_column(
                name,
                justify="left" if name in _LEFT or name == comparison.axis else "right",
                min_width=24 if name == "system" else None,
            )
        for cell in group.cells:
            table.add_row(*(Text(v) for v in cell_row(cell, comparison, group)))
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

CSV_FIELDS = (
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
    "epoch_s_median",
    "epoch_s_min",
    "epoch_s_max",
    "epochs_measured",
    "samples_per_s",
    "tokens_per_s",
    "peak_memory_bytes",
    "mfu",
    "joules_per_sample",
    "compile_s",
    "warmup_s",
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
)


def baseline_of(comparison: Comparison, group: WorkloadGroup) -> str:
    """What a group's ratios are against: the baseline system, or ``axis=value`` along an axis."""
    if group.axis:
        return f"{group.axis}={format_value(group.baseline_value, group.axis)}"
    return comparison.baseline


def _median(s: Spread | None) -> float | None:
    return s.median if s else None


def cell_fields(comparison: Comparison, group: WorkloadGroup, cell: Cell) -> dict[str, Any]:
    """A cell as flat machine-readable fields (CSV columns); unknown figures are None."""
    counts = cell.status_counts()
    epoch = cell.epoch_s
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
        "epoch_s_median": _median(epoch),
        "epoch_s_min": epoch.low if epoch else None,
        "epoch_s_max": epoch.high if epoch else None,
        "epochs_measured": epoch.n if epoch else 0,
        "samples_per_s": _median(cell.samples_per_s),
        "tokens_per_s": _median(cell.tokens_per_s),
        "peak_memory_bytes": _median(cell.peak_memory_bytes),
        "mfu": _median(cell.mfu),
        "joules_per_sample": _median(cell.joules_per_sample),
        "compile_s": _median(cell.compile_s),
        "warmup_s": _median(cell.warmup_s),
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
        "failure": cell.failure(),
        "epoch_s": _spread(cell.epoch_s),
        "samples_per_s": _spread(cell.samples_per_s),
        "tokens_per_s": _spread(cell.tokens_per_s),
        "peak_memory_bytes": _spread(cell.peak_memory_bytes),
        "mfu": _spread(cell.mfu),
        "joules_per_sample": _spread(cell.joules_per_sample),
        "compile_s": _spread(cell.compile_s),
        "warmup_s": _spread(cell.warmup_s),
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
