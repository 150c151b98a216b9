"""The report's view of a plan (``accelbench plan ... --json``): the candidates ranked by predicted throughput, their
predicted peak memory against the device's, what was dropped or left unpriced and why, and, where ``--measure K``
ran, the predicted against the measured rank with Spearman's correlation.

A plan file is told from result records by its ``schema`` (``accelbench.plan``), so ``accelbench report`` takes it
beside records or alone. A file that says it is a plan but cannot be read as one (truncated JSON, a field the
schema lacks, a newer schema version) is refused with what is wrong and how to write it again, never skipped in
silence: a plan is one file the user named, not one of many records in a folder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from accelbench.display import fmt_bytes
from accelbench.errors import ConfigError
from accelbench.plan.schema import SCHEMA_VERSION, Plan, PlannedRun
from accelbench.report.drawing import ReportFigure, new_figure, wrap

if TYPE_CHECKING:
    from matplotlib.axes import Axes

PLAN_SCHEMA = "accelbench.plan"
FITS, DROPPED, MEASURED = "#0072B2", "#D55E00", "#009E73"
LABELLED = 5  # the top candidates named in the figure (the table has them all)
WRITE_AGAIN = "write it again with `accelbench plan ... --json > FILE`"


@dataclass
class PlanFile:
    path: Path
    plan: Plan


def is_plan_file(path: Path) -> bool:
    """Whether ``path`` is a file that says it is a plan: its JSON's ``schema`` is ``accelbench.plan``, or, for a
    file that is not valid JSON, its text names that schema (a truncated plan, refused by :func:`read_plan`)."""
    if not path.is_file() or path.suffix != ".json":
        return False
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return f'"{PLAN_SCHEMA}"' in text
    return isinstance(data, dict) and data.get("schema") == PLAN_SCHEMA


def read_plan(path: Path) -> PlanFile:
    """The plan in ``path``, or a :class:`ConfigError` saying what is wrong with it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"plan file {path}: cannot be read ({exc})") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"plan file {path}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}; truncated?); "
            f"{WRITE_AGAIN}"
        ) from None
    version = data.get("schema_version")
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise ConfigError(
            f"plan file {path}: schema_version {version} is newer than this accelbench reads ({SCHEMA_VERSION}); "
            "upgrade accelbench to report it"
        )
    try:
        plan = Plan.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or '(top level)'}: {error['msg']}"
            for error in exc.errors()[:5]
        )
        more = f" (and {exc.error_count() - 5} more)" if exc.error_count() > 5 else ""
        raise ConfigError(
            f"plan file {path}: not a valid {PLAN_SCHEMA} (schema_version {SCHEMA_VERSION}) file: {problems}{more}; "
            f"{WRITE_AGAIN}"
        ) from None
    return PlanFile(path, plan)


def plan_section(plan_file: PlanFile, anchor: str) -> tuple[list[str], list[ReportFigure]]:
    """The plan's section of the page: its HTML parts (with ``{figure:N}`` placeholders for its figures, N from 0,
    which the page numbers) and its figures."""
    from accelbench.report.html import esc, html_table

    plan, path = plan_file.plan, plan_file.path
    figures = [_memory_figure(plan)]
    comparison = plan.comparison
    if comparison is not None and any(r.measured_samples_per_s for r in comparison.runs):
        figures.append(_measured_figure(plan))
    budget = plan.token_budget is not None
    parts = [
        f'<h2 id="{esc(anchor)}">Plan: {esc(plan.model)} on {plan.devices * plan.nnodes} device(s)</h2>',
        f'<p class="caption">{esc(_summary(plan, path))}</p>',
        "{figure:0}",
        f"<h3>Ranked ({len(plan.ranked)}): predicted to fit, best first</h3>",
    ]
    header = ["rank", "configuration", "predicted step", "predicted samples/s"]
    header += ["time to the token budget"] if budget else []
    header += ["predicted peak per device", "of the device's memory", "command"]
    rows = []
    for rank, run in enumerate(plan.ranked, 1):
        row = [str(rank), run.label, _ms(run.step_time_s), _rate(run.samples_per_s)]
        row += [_duration(run.time_to_budget_s)] if budget else []
        row += [fmt_bytes(run.peak_memory_bytes), _share(run), run.command]
        rows.append(row)
    parts.append(html_table(header, rows, "plan-ranked"))
    if plan.dropped:
        parts.append(f"<h3>Dropped ({len(plan.dropped)}): predicted not to fit</h3>")
        parts.append(
            html_table(
                ["configuration", "predicted peak per device", "device memory", "why"],
                (
                    [
                        r.label,
                        fmt_bytes(r.peak_memory_bytes),
                        fmt_bytes(r.device_memory_bytes),
                        r.reason or "",
                    ]
                    for r in plan.dropped
                ),
                "plan-dropped",
            )
        )
    if plan.unpriced:
        parts.append(f"<h3>Unpriced ({len(plan.unpriced)}): no step time, never ranked</h3>")
        parts.append(
            html_table(
                ["configuration", "why"], ([r.label, r.reason or ""] for r in plan.unpriced), "plan-unpriced"
            )
        )
    if plan.not_offered:
        parts.append("<h3>Not offered: refused before pricing</h3>")
        parts.append(
            html_table(["reason", "combinations"], ([why, str(n)] for why, n in plan.not_offered.items()))
        )
    if comparison is not None:
        parts.append(f"<h3>Predicted against measured: the top {len(comparison.runs)}, run for real</h3>")
        parts.append(f'<p class="caption">{esc(_verdict(plan))}</p>')
        if len(figures) > 1:
            parts.append("{figure:1}")
        parts.append(
            html_table(
                ["configuration", "predicted rank", "measured rank", "predicted samples/s", "measured samples/s",
                 "outcome", "host", "record"],
                (
                    [r.label, str(r.predicted_rank), str(r.measured_rank or "-"), _rate(r.predicted_samples_per_s),
                     _rate(r.measured_samples_per_s)
                     + (f" (median of {r.measured_runs}, spread {r.spread:.0%})" if r.spread is not None else ""),
                     r.status,
                     ("contended" if r.contended else "idle") + (f", waited {r.waited:.0%}" if r.waited else ""),
                     r.record or "-"]
                    for r in comparison.runs
                ),
                "plan-measured",
            )
        )  # fmt: skip
    if plan.assumptions:
        items = "".join(f"<li>{esc(a)}</li>" for a in plan.assumptions)
        parts.append(f'<h3>Assumptions</h3><ul class="caption">{items}</ul>')
    return parts, figures


def _summary(plan: Plan, path: Path) -> str:
    nodes = f" x {plan.nnodes} nodes" if plan.nnodes > 1 else ""
    batch = f", global batch {plan.global_batch}" if plan.global_batch else ""
    budget = f", token budget {plan.token_budget:.3g}" if plan.token_budget else ""
    return (
        f"{path}: {plan.workload} / {plan.model} on {plan.devices} device(s) per node{nodes} of {plan.device}"
        f"{batch}{budget}. {plan.candidates} configuration(s) priced by accelbench estimate's model: "
        f"{len(plan.ranked)} ranked by {plan.ranked_by}, {len(plan.dropped)} dropped, {len(plan.unpriced)} unpriced"
        f"; {sum(plan.not_offered.values())} combination(s) not offered. Definitions: docs/plan.md."
    )


def _verdict(plan: Plan) -> str:
    c = plan.comparison
    assert c is not None
    rho = "unknown (fewer than two measured, or no order)" if c.spearman is None else f"{c.spearman:+.2f}"
    if c.top_pick_gap is None:
        top = "the predicted top pick has no measurement, so no verdict on it"
    else:
        within = "within" if c.top_pick_within_5pct else "not within"
        top = f"the predicted top pick measured {c.top_pick_gap:.1%} below the best measured ({within} 5%)"
    contended = sum(r.contended for r in c.runs)
    host = f" {contended} run(s) found the host contended: their rates are suspect." if contended else ""
    return (
        f"Spearman's rank correlation of predicted and measured throughput: {rho}; {top}. Records in {c.out}."
        f"{host}"
    )


def _memory_figure(plan: Plan) -> ReportFigure:
    fig = new_figure(width=6.4, height=4.0)
    ax: Axes = fig.add_subplot()
    gib = 2**30
    shown = [r for r in plan.ranked + plan.dropped if r.peak_memory_bytes is not None and r.samples_per_s]
    for runs, colour, marker, label in (
        ([r for r in shown if r in plan.ranked], FITS, "o", "ranked (fits)"),
        ([r for r in shown if r in plan.dropped], DROPPED, "x", "dropped (does not fit)"),
    ):
        if runs:
            ax.scatter([_gib(r) for r in runs], [r.samples_per_s or 0.0 for r in runs], c=colour, marker=marker,
                       s=28, label=label, alpha=0.85)  # fmt: skip
    for rank, run in enumerate(plan.ranked[:LABELLED], 1):
        if run.peak_memory_bytes is not None and run.samples_per_s:
            ax.annotate(f"#{rank}", (_gib(run), run.samples_per_s), xytext=(4, 3), textcoords="offset points",
                        fontsize=8)  # fmt: skip
    memory = next((r.device_memory_bytes for r in plan.ranked + plan.dropped if r.device_memory_bytes), None)
    if memory:
        ax.axvline(memory / gib, color="firebrick", linestyle="--", linewidth=1,
                   label=f"device memory {fmt_bytes(memory)}")  # fmt: skip
    ax.set_xlabel("predicted peak memory per device (GiB)")
    ax.set_ylabel("predicted samples/s")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    top = ", ".join(f"#{i} {wrap(r.label, 60)}" for i, r in enumerate(plan.ranked[:3], 1))
    return ReportFigure(
        f"Plan for {plan.model}: predicted throughput against predicted peak memory",
        f"Each configuration priced ({plan.device}): predicted samples/s against its predicted peak memory per "
        "device, the device's memory as the dashed line; what lies right of it is dropped. "
        + (f"Best first: {top}." if top else "No configuration was ranked."),
        fig,
    )


def _measured_figure(plan: Plan) -> ReportFigure:
    c = plan.comparison
    assert c is not None
    runs = [r for r in c.runs if r.measured_samples_per_s]
    fig = new_figure(width=5.2, height=4.0)
    ax: Axes = fig.add_subplot()
    xs = [r.predicted_samples_per_s for r in runs]
    ys = [r.measured_samples_per_s or 0.0 for r in runs]
    for contended, colour, label in (
        (False, MEASURED, "measured"),
        (True, DROPPED, "measured, host contended"),
    ):
        mine = [r for r in runs if r.contended is contended]
        if mine:
            ax.scatter([r.predicted_samples_per_s for r in mine], [r.measured_samples_per_s or 0.0 for r in mine],
                       c=colour, s=34, label=label)  # fmt: skip
    for r in runs:
        ax.annotate(f"#{r.predicted_rank}", (r.predicted_samples_per_s, r.measured_samples_per_s or 0.0),
                    xytext=(4, 3), textcoords="offset points", fontsize=8)  # fmt: skip
    reach = max([*xs, *ys]) * 1.1
    ax.plot([0, reach], [0, reach], color="grey", linestyle=":", linewidth=1, label="measured = predicted")
    ax.set_xlim(0, reach)
    ax.set_ylim(0, reach)
    ax.set_xlabel("predicted samples/s")
    ax.set_ylabel("measured samples/s (steady epochs)")
    ax.legend(fontsize=8)
    rho = "n/a" if c.spearman is None else f"{c.spearman:+.2f}"
    ax.set_title(f"Spearman {rho}", fontsize=9)
    return ReportFigure(
        f"Plan for {plan.model}: predicted against measured throughput (Spearman {rho})",
        f"The top {len(c.runs)} configurations run for real (plan --measure): measured steady samples/s against the "
        "prediction, each marked with its predicted rank; on the dotted line the model was exact. Spearman's rank "
        "correlation compares the orders alone. Runs on a contended host are drawn in red.",
        fig,
    )


def _gib(run: PlannedRun) -> float:
    return (run.peak_memory_bytes or 0.0) / 2**30


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    ms = seconds * 1e3
    return f"{ms:,.0f} ms" if ms >= 100 else f"{ms:.3g} ms"


def _rate(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:,.1f}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.1f} s"


def _share(run: PlannedRun) -> str:
    if run.peak_memory_bytes is None or not run.device_memory_bytes:
        return "-"
    return f"{run.peak_memory_bytes / run.device_memory_bytes:.0%}"
