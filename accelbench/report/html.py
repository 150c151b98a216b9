"""The report page: one self-contained HTML file, every string from a record escaped, figures as data URIs.

Embedding the figures makes the report one file that opens anywhere, without a network; ``--figures DIR`` also
writes them as files. Host names, messages and paths come from records gathered from other machines, so each is
escaped (:func:`esc`) wherever it lands in the page.
"""

from __future__ import annotations

import base64
import html
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from accelbench import __version__
from accelbench.compare import Comparison, RunSummary, cell_row, columns
from accelbench.compare.bandwidth import CommComparison, table_rows
from accelbench.compare.columns import captions as column_captions
from accelbench.errors import AccelbenchError, ConfigError
from accelbench.report.bandwidth import bandwidth_figures
from accelbench.report.breakdown import breakdown_figures
from accelbench.report.drawing import FIGURE_FORMATS, STYLE, ReportFigure, load_matplotlib
from accelbench.report.entries import entries
from accelbench.report.figures import (
    axis_figures,
    bubble_figures,
    compile_figures,
    energy_figures,
    epoch_time_figures,
    largest_fit_tables,
    memory_by_batch_figures,
    memory_by_model_figures,
    mesh_figures,
    scaling_figures,
    strategy_figures,
    throughput_by_batch_figures,
    warmup_figures,
)
from accelbench.report.overview import overview_figures
from accelbench.report.palette import Palette, using
from accelbench.report.plan import PlanFile, plan_section
from accelbench.report.predicted import has_predictions, predicted_figures
from accelbench.report.target import TARGET_CAPTION, TARGET_HEADER, has_targets, target_rows
from accelbench.results import check_writable, write_output

_MIME = {"svg": "image/svg+xml", "png": "image/png"}


def esc(value: object) -> str:
    """Escape anything for HTML text and attribute values."""
    return html.escape(str(value), quote=True)


def html_table(header: Sequence[str], rows: Iterable[Sequence[str]], css: str = "") -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{esc(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f'<table class="{esc(css)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 1200px;
       color: #1d232a; line-height: 1.45; padding: 0 1rem; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; } h2 { border-bottom: 1px solid #ccd; padding-bottom: .2rem;
     margin-top: 2.2rem; } h3 { font-size: 1rem; margin-bottom: .3rem; }
.meta, .caption, .none { color: #5a6572; font-size: .9rem; }
table { border-collapse: collapse; margin: .4rem 0 1.2rem; font-size: .85rem; }
th, td { border: 1px solid #d5dae0; padding: .25rem .5rem; text-align: left; vertical-align: top; }
th { background: #f1f4f7; } tbody tr:nth-child(even) { background: #fafbfc; }
figure { margin: 1rem 0 2rem; } figure img { max-width: 100%; border: 1px solid #e3e7eb; }
.skipped { color: #8a4b00; } nav ul { columns: 2; }
"""


@dataclass
class Report:
    html: str
    figures: list[ReportFigure]


@dataclass
class View:
    """A section of the report: its anchor, heading, what it shows, and its figures."""

    anchor: str
    heading: str
    intro: str
    figures: list[ReportFigure]
    nav: str


def build_report(
    comparison: Comparison,
    title: str = "accelbench report",
    figure_format: str = "svg",
    comm: CommComparison | None = None,
    plans: Sequence[PlanFile] = (),
) -> Report:
    """The HTML page and its figures (rendered lazily by the caller if it wants files too); with ``comm``, the
    collective bandwidth view too (:func:`build_comm_report` when there are comm records alone); with ``plans``, a
    section per plan after the views (:func:`build_plan_report` when there are plans alone)."""
    matplotlib = load_matplotlib()
    if figure_format not in FIGURE_FORMATS:
        raise AccelbenchError(f"--figure-format {figure_format!r}: choose one of {', '.join(FIGURE_FORMATS)}")
    items = entries(comparison)
    systems = [*comparison.systems, *(comm.systems if comm else [])]
    with matplotlib.rc_context(STYLE), using(Palette(systems)):
        views = [
            View(
                "overview",
                "At a glance",
                "Every table of the comparison as a panel: steady epoch time per system (one colour per system, "
                "precision and strategy in every figure).",
                overview_figures(comparison),
                "At a glance",
            )
        ]
        if comparison.axis:
            views.append(
                View(
                    "vs",
                    f"Along {comparison.axis}",
                    f"--vs {comparison.axis}: each workload's runs side by side per {comparison.axis} and system "
                    "(seed study, figure 2, along any field).",
                    axis_figures(comparison),
                    f"Along {comparison.axis}",
                )
            )
        views += [
            View(
                "epoch-time",
                "Epoch time per system, precision and batch size",
                "Single-device runs (seed study, figure 2).",
                epoch_time_figures(items, comparison.systems),
                "Epoch time",
            ),
            View(
                "scaling",
                "Scaling across device counts",
                "The same workload at several device counts on one system (seed study, figure 3).",
                scaling_figures(items),
                "Scaling",
            ),
            View(
                "throughput-batch",
                "Throughput against batch size",
                "Per system and device count: where each peaks (seed 004, tables 3 and 4: IPUs at small batches, "
                "GPUs at large ones).",
                throughput_by_batch_figures(items),
                "Throughput against batch size",
            ),
            View(
                "warm-up",
                "Epoch 1 against the steady epochs",
                "Throughput of the first epoch, which includes graph compilation and warm-up, beside the later "
                "epochs' (seed 004, table 1).",
                warmup_figures(items, comparison.systems),
                "Epoch 1 and steady epochs",
            ),
            View(
                "memory-batch",
                "Peak memory against batch size",
                "Seed study, figure 4.",
                memory_by_batch_figures(items),
                "Memory against batch size",
            ),
            View(
                "memory-model",
                "Peak memory against model size",
                "Seed study, figure 6 and table 5; the tables below list what fitted.",
                memory_by_model_figures(items),
                "Memory against model size",
            ),
            View(
                "strategies",
                "Strategy comparison across model sizes and device counts",
                "DDP, FSDP and ZeRO stages (seed study, figure 6).",
                strategy_figures(items),
                "Strategies",
            ),
            View(
                "compile",
                "Compile time and epoch time per strategy",
                "IPU strategies, or any run with a compile step (seed study, figure 8).",
                compile_figures(items),
                "Compile time",
            ),
        ]
        # tensor/pipeline parallelism: only where the records hold such runs
        mesh, bubble = mesh_figures(items), bubble_figures(items)
        if mesh:
            views.append(
                View(
                    "mesh",
                    "TFLOP/s per device against the mesh shape",
                    "Tensor, pipeline and data parallelism composed at a fixed device count (seed 003, figures "
                    "13-15): achieved TFLOP/s per device by Megatron's FLOPs count.",
                    mesh,
                    "Mesh shapes",
                )
            )
        if bubble:
            views.append(
                View(
                    "bubble",
                    "Pipeline bubble",
                    "Each pipeline's measured idle fraction beside the schedule's analytical bubble.",
                    bubble,
                    "Pipeline bubble",
                )
            )
        if any(c.step_split for c in comparison.cells):  # only runs made with --profile have one
            views.append(
                View(
                    "breakdown",
                    "Where a step's time goes",
                    "Runs made with --profile: each profiled step split into kernel, dispatch, communication, optimizer "
                    "and data (seed 001, figures 10 and 12-14).",
                    breakdown_figures(comparison),
                    "Step time breakdown",
                )
            )
        if any(has_predictions(g) for g in comparison.groups):  # records from runs that stored one
            views.append(
                View(
                    "predicted",
                    "Predicted against measured",
                    "The analytical model's step time and peak memory for each run's own configuration (stored in "
                    "its record; accelbench estimate's formulas) beside what the run measured, with the error.",
                    predicted_figures(comparison),
                    "Predicted vs measured",
                )
            )
        if comparison.any_cell_has("joules_per_sample"):
            views.append(
                View(
                    "energy",
                    "Energy per sample",
                    "Where the devices' energy counters were read; a figure is never estimated.",
                    energy_figures(items, comparison.systems),
                    "Energy",
                )
            )
        if comm is not None:
            views.append(bandwidth_view(comm))
        distinguish_titles([fig for view in views for fig in view.figures])
        body: list[str] = []
        figures: list[ReportFigure] = []
        # a view with nothing to draw for these records is left out, named once at the top
        # the bandwidth view's tables, and the memory view's largest-fit tables, stand without figures
        kept = {"bandwidth"} | ({"memory-model"} if largest_fit_tables(items) else set())
        empty = [v for v in views if not v.figures and v.anchor not in kept]
        views = [v for v in views if v.figures or v.anchor in kept]
        if empty:
            body.append(
                f'<p class="none">Nothing to draw for these records: {esc(", ".join(v.heading for v in empty))}.</p>'
            )
        for view in views:
            body.append(
                f'<h2 id="{view.anchor}">{esc(view.heading)}</h2><p class="caption">{esc(view.intro)}</p>'
            )
            if not view.figures:
                body.append('<p class="none">No records for this view.</p>')
            for fig in view.figures:
                figures.append(fig)
                body.append(figure_html(fig, len(figures), figure_format))
            if view.anchor == "bandwidth" and comm is not None:
                body += bandwidth_tables_html(comm)
            if view.anchor == "memory-model":
                for table_title, rows in largest_fit_tables(items):
                    body.append(f"<h3>Largest model that fits: {esc(table_title)}</h3>")
                    body.append(html_table(["model", "peak memory", "steady epoch time (s)"], rows))
        links = plan_sections(plans, figures, body, figure_format)
    page = _page(comparison, title, views, body, links)
    return Report(page, figures)


def plan_sections(
    plans: Sequence[PlanFile], figures: list[ReportFigure], body: list[str], figure_format: str
) -> list[tuple[str, str]]:
    """Each plan's section appended to ``body``, its figures to ``figures`` (numbered after those there); returns
    the sections' (anchor, navigation text). Call within the report's matplotlib style."""
    links = []
    for index, plan_file in enumerate(plans, 1):
        anchor = f"plan-{index}"
        parts, drawn = plan_section(plan_file, anchor)
        first = len(figures)
        figures += drawn
        for part in parts:
            if part.startswith("{figure:") and part.endswith("}"):
                number = first + int(part[len("{figure:") : -1])
                body.append(figure_html(figures[number], number + 1, figure_format))
            else:
                body.append(part)
        links.append((anchor, f"Plan: {plan_file.plan.model} ({plan_file.path.name})"))
    return links


def build_plan_report(
    plans: Sequence[PlanFile], title: str = "accelbench report", figure_format: str = "svg"
) -> Report:
    """The page for plans alone (``accelbench plan --json`` files, no result records): one section each."""
    matplotlib = load_matplotlib()
    if figure_format not in FIGURE_FORMATS:
        raise AccelbenchError(f"--figure-format {figure_format!r}: choose one of {', '.join(FIGURE_FORMATS)}")
    figures: list[ReportFigure] = []
    body: list[str] = []
    with matplotlib.rc_context(STYLE):
        links = plan_sections(plans, figures, body, figure_format)
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    nav = "".join(f'<li><a href="#{anchor}">{esc(text)}</a></li>' for anchor, text in links)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        f'<p class="meta">{len(plans)} plan(s); generated {esc(generated)} by accelbench {esc(__version__)}.</p>',
        f"<nav><ul>{nav}</ul></nav>",
        *body,
        "</body></html>",
    ]
    return Report("\n".join(parts) + "\n", figures)


def distinguish_titles(figures: Sequence[ReportFigure]) -> None:
    """Figures that would share a title get what sets each apart appended to it: the parts of their captions'
    first clause (the workload fields they share, ``gpt gpt2 · batch 8 · fp32``) that differ between them."""
    by_title: dict[str, list[ReportFigure]] = {}
    for fig in figures:
        by_title.setdefault(fig.title, []).append(fig)
    for same in by_title.values():
        if len(same) < 2:
            continue
        parts = [re.split(r"[.;] ", fig.caption, maxsplit=1)[0].split(" · ") for fig in same]
        common = set.intersection(*(set(p) for p in parts))
        for fig, mine in zip(same, parts, strict=True):
            apart = [p for p in mine if p not in common]
            if apart:
                fig.title = f"{fig.title} ({', '.join(apart)})"


def _page(
    comparison: Comparison,
    title: str,
    views: Sequence[View],
    body: list[str],
    extra: Sequence[tuple[str, str]] = (),
) -> str:
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    links = [
        ("systems", "Systems"),
        ("comparison", "Comparison"),
        *((("target", "Time to a target"),) if has_targets(comparison) else ()),
        ("environment", "What differs between the environments"),
        *((v.anchor, v.nav) for v in views),
        *extra,
        ("records", "Records"),
    ]
    nav = "".join(f'<li><a href="#{anchor}">{esc(text)}</a></li>' for anchor, text in links)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        f'<p class="meta">{len(comparison.records)} result record(s) from {len(comparison.systems)} system(s); '
        f"baseline: {esc(comparison.baseline)}; generated {esc(generated)} by accelbench {esc(__version__)}.</p>",
        f"<nav><ul>{nav}</ul></nav>",
    ]
    if comparison.skipped:
        items = "".join(f"<li><code>{esc(p)}</code>: {esc(reason)}</li>" for p, reason in comparison.skipped)
        parts.append(
            f'<p class="skipped">Skipped files (not valid result records):</p><ul class="skipped">{items}</ul>'
        )
    parts.append('<h2 id="systems">Systems</h2>')
    parts.append(
        html_table(
            ["system", "hosts", "backend", "device", "one device is", "records"], _system_rows(comparison)
        )
    )
    parts.append('<h2 id="comparison">Comparison</h2>')
    parts.append(f'<p class="caption">{esc(_comparison_caption(comparison))}</p>')
    header = columns(comparison)
    for group in comparison.groups:
        parts.append(f"<h3>{esc(group.describe())}</h3>")
        if group.baseline_note:
            parts.append(f'<p class="caption">{esc(group.baseline_note)}.</p>')
        parts.append(html_table(header, (cell_row(c, comparison, group) for c in group.cells), "comparison"))
        slowest = [(c, c.slowest_ranks) for c in group.cells if c.slowest_ranks]
        if slowest:  # the rank that held the others up in a multi-rank run, and why (compare's note too)
            items = "".join(
                f"<li>{esc(c.system)} x{c.devices}: {esc('; '.join(ranks))}</li>" for c, ranks in slowest
            )
            parts.append(f'<p class="caption">Slowest rank (held the others up):</p><ul>{items}</ul>')
    if has_targets(comparison):  # beside the speed: what reaching the target cost, or that it was not reached
        parts.append('<h2 id="target">Time to a target</h2>')
        parts.append(f'<p class="caption">{esc(TARGET_CAPTION)}</p>')
        parts.append(html_table(TARGET_HEADER, target_rows(comparison), "target"))
    parts.append('<h2 id="environment">What differs between the environments</h2>')
    if comparison.environment:
        rows = [
            [attribute, *(" | ".join(v[s]) or "-" for s in comparison.systems)]
            for attribute, v in comparison.environment
        ]
        parts.append(html_table(["attribute", *comparison.systems], rows))
    else:
        parts.append('<p class="none">No differences in versions, precision plans or device definitions.</p>')
    parts += body
    parts.append('<h2 id="records">Records</h2>')
    record_rows = [
        [r.file, system, r.model_name, r.status, (r.message or "")[:300]] for system, r in comparison.records
    ]
    parts.append(html_table(["file", "system", "model", "outcome", "message"], record_rows))
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _comparison_caption(comparison: Comparison) -> str:
    if comparison.axis:
        against = (
            f"Compared along {comparison.axis}: speed ×N = epoch time at the baseline {comparison.axis} (marked "
            "baseline) over this epoch time on the same system (>1 is faster)."
        )
    else:
        against = f"speed ×N = epoch time of the baseline ({comparison.baseline}) over this epoch time (>1 is faster)."
    shown = "".join(f" {caption}" for caption in column_captions(comparison))
    return (
        f"{against} Epoch time: median of the steady epochs (after the warm-up) of all successful runs, ± half "
        "their range. Beyond noise: two-sided Mann-Whitney test of the steady epoch times against the baseline's "
        f"at α = {comparison.alpha:g}.{shown}"
    )


def _system_rows(comparison: Comparison) -> list[list[str]]:
    """Per system: its hosts, backend, device, what one device is, and how many records."""
    by_system: dict[str, list[RunSummary]] = {}
    for system, r in comparison.records:
        by_system.setdefault(system, []).append(r)
    rows = []
    for system in comparison.systems:
        mine = by_system[system]
        hosts = sorted({r.system.host for r in mine})
        first = mine[0].system
        device = "none" if first.device == "no device" else first.device
        rows.append([system, ", ".join(hosts), first.backend, device, first.device_unit, str(len(mine))])
    return rows


def figure_html(fig: ReportFigure, number: int, figure_format: str) -> str:
    """A figure embedded in the page (a data URI), numbered and captioned."""
    data = base64.b64encode(fig.encode(figure_format)).decode("ascii")
    return (
        f'<figure id="figure-{number}"><h3>Figure {number}. {esc(fig.title)}</h3>'
        f'<img alt="{esc(fig.title)}" src="data:{_MIME[figure_format]};base64,{data}">'
        f'<figcaption class="caption">{esc(fig.caption)}</figcaption></figure>'
    )


# --------------------------------------------------------------------------------------------------------------
# Collective bandwidth (`accelbench comm` records)
# --------------------------------------------------------------------------------------------------------------


def bandwidth_view(comm: CommComparison) -> View:
    """The collective bandwidth view: bus bandwidth against message size per system, and its tables."""
    return View(
        "bandwidth",
        "Collective bandwidth",
        "accelbench comm records: the bus bandwidth of each collective against the message size, per system "
        "(nccl-tests' busbw), with the ratio against the baseline system at each size in the tables below.",
        bandwidth_figures(comm),
        "Collective bandwidth",
    )


def bandwidth_tables_html(comm: CommComparison) -> list[str]:
    """One table per collective x type x variant: sizes down, systems across, peaks last."""
    parts = []
    for table in comm.tables:
        header, rows = table_rows(table, comm.baseline)
        parts.append(f"<h3>Bus bandwidth (GB/s): {esc(table.describe())}</h3>")
        parts.append(html_table(header, rows, "comparison"))
    return parts


def build_comm_report(
    comm: CommComparison, title: str = "accelbench report", figure_format: str = "svg"
) -> Report:
    """The page for comm records alone: their systems, the collective bandwidth view, and the records."""
    matplotlib = load_matplotlib()
    if figure_format not in FIGURE_FORMATS:
        raise AccelbenchError(f"--figure-format {figure_format!r}: choose one of {', '.join(FIGURE_FORMATS)}")
    with matplotlib.rc_context(STYLE), using(Palette(comm.systems)):
        view = bandwidth_view(comm)
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    hosts: dict[str, set[str]] = {}
    for system, _, record in comm.records:
        hosts.setdefault(system, set()).add(record.system.host)
    first = {system: record for system, _, record in reversed(comm.records)}
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        f'<p class="meta">{len(comm.records)} comm record(s) from {len(comm.systems)} system(s); baseline: '
        f"{esc(comm.baseline)}; generated {esc(generated)} by accelbench {esc(__version__)}.</p>",
    ]
    if comm.skipped:
        items = "".join(f"<li><code>{esc(p)}</code>: {esc(reason)}</li>" for p, reason in comm.skipped)
        parts.append(
            f'<p class="skipped">Skipped files (not valid records):</p><ul class="skipped">{items}</ul>'
        )
    parts.append('<h2 id="systems">Systems</h2>')
    rows = [
        [system, ", ".join(sorted(hosts[system])), first[system].backend.info.name,
         first[system].backend.collective_backend or "-",
         first[system].backend.devices[0].name if first[system].backend.devices else "none",
         str(first[system].world_size), str(sum(1 for s, _, _ in comm.records if s == system))]
        for system in comm.systems
    ]  # fmt: skip
    parts.append(
        html_table(["system", "hosts", "backend", "collectives", "device", "ranks", "records"], rows)
    )
    parts.append(f'<h2 id="{view.anchor}">{esc(view.heading)}</h2><p class="caption">{esc(view.intro)}</p>')
    for number, fig in enumerate(view.figures, 1):
        parts.append(figure_html(fig, number, figure_format))
    parts += bandwidth_tables_html(comm)
    parts.append('<h2 id="records">Records</h2>')
    record_rows = [
        [file, system, str(record.world_size), record.outcome.status, (record.outcome.message or "")[:300]]
        for system, file, record in comm.records
    ]
    parts.append(html_table(["file", "system", "ranks", "outcome", "message"], record_rows))
    parts.append("</body></html>")
    return Report("\n".join(parts) + "\n", view.figures)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60] or "figure"


def write_report(report: Report, output: Path, figures_dir: Path | None, figure_format: str) -> list[Path]:
    """Write the HTML file (atomically: a reader never sees half of it), and the figures as files when asked;
    returns the figure files written. A place that cannot take them is a :class:`ConfigError` saying so."""
    check_report_places(output, figures_dir)
    try:
        write_output(
            report.html.encode("utf-8"), output
        )  # a device (/dev/null) is written into, never replaced
        written = []
        if figures_dir is not None:
            for i, fig in enumerate(report.figures, 1):
                path = figures_dir / f"{i:02d}-{_slug(fig.title)}.{figure_format}"
                write_output(fig.encode(figure_format), path)
                written.append(path)
    except OSError as exc:
        raise ConfigError(
            f"the report could not be written: {exc.strerror or exc} ({exc.filename or output})"
        ) from None
    return written


def check_report_places(output: Path, figures_dir: Path | None) -> None:
    """Refuse, before the figures are drawn, an output that is a folder or a folder that cannot take files (a
    device or pipe, e.g. /dev/null, is written into as it is)."""
    if output.is_dir():
        raise ConfigError(
            f"--output {output}: is a folder; give the HTML file's name, e.g. {output}/report.html"
        )
    if output.exists() and not output.is_file():
        if not os.access(output, os.W_OK):
            raise ConfigError(f"--output {output}: cannot be written; give a file name")
    else:
        check_writable(output.parent, "--output's folder")
    if figures_dir is not None:
        check_writable(figures_dir, "--figures")
