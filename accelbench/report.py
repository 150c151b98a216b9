"""`accelbench report`: one self-contained HTML file with the seed study's views, from result records.

The views follow the Turing report (seeds/000): epoch time per system x precision x batch size; scaling across
device counts; peak memory against batch size and model size, with the "largest model that fits" table; strategy
comparison (DDP / FSDP / ZeRO stages) across model sizes and device counts; compile time against epoch time per
strategy (IPUs, or any run with a compile step). Each view is drawn only where the records hold its data, and the
report says which views had none.

Figures are drawn with matplotlib (Agg, no display) and embedded as data URIs, so the report is one file that
opens anywhere; ``--figures DIR`` also writes them as files. Every string taken from a record (host names,
messages, paths) is HTML-escaped, and matplotlib's mathtext is off so a ``$`` in a host name is just a character.
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import re
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.text import Text

from accelbench import __version__
from accelbench.compare import (
    COLUMNS,
    Cell,
    Comparison,
    WorkloadKey,
    add_selection_arguments,
    cell_row,
    comparison_from_args,
)
from accelbench.display import fmt_bytes
from accelbench.errors import AccelbenchError
from accelbench.precision import PRECISIONS

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FIGURE_FORMATS = ("svg", "png")
_MIME = {"svg": "image/svg+xml", "png": "image/png"}
_STYLE = {
    "text.parse_math": False,  # record strings are text, never TeX
    "font.size": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "svg.fonttype": "none",  # text stays text in SVG: smaller files, selectable labels
}
_GIB = 2**30
SINGLE_DEVICE_STRATEGIES = ("single", "ddp")  # the seed study's single-accelerator runs used DDP on one GPU


# --------------------------------------------------------------------------------------------------------------
# The data of the views: cells with their workload
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """A cell with its workload key: what every view is drawn from."""

    key: WorkloadKey
    cell: Cell

    @property
    def epoch_s(self) -> float | None:
        return self.cell.epoch_s.median if self.cell.epoch_s else None

    @property
    def memory_gib(self) -> float | None:
        m = self.cell.peak_memory_bytes
        return m.median / _GIB if m else None

    @property
    def out_of_memory(self) -> bool:
        return self.cell.epoch_s is None and any(r.record.outcome.status == "oom" for r in self.cell.runs)

    @property
    def model_size(self) -> float:
        """Parameters (recorded; else estimated from the size table as 12 l d^2): for ordering models only."""
        for r in self.cell.runs:
            if r.record.workload.get("parameters"):
                return float(r.record.workload["parameters"])
        config = self.cell.runs[0].record.config
        layers, width = config.n_layer, config.n_embd
        if layers is None or width is None:
            from accelbench.workloads.gpt import MODEL_SIZES

            layers, _, width = MODEL_SIZES.get(config.model, (0, 0, 0))
        return 12.0 * layers * width**2


def entries(comparison: Comparison) -> list[Entry]:
    return [Entry(group.key, cell) for group in comparison.groups for cell in group.cells]


def _without(key: WorkloadKey, *names: str) -> tuple[Any, ...]:
    return tuple(v for k, v in key.as_dict().items() if k not in names)


def _caption(key: WorkloadKey, *names: str) -> str:
    """The workload fields shared by a figure (those not on its axes), as a subtitle."""
    d = key.as_dict()
    parts = {
        "workload": f"{d['workload']} {d['model']}",
        "block_size": f"block {d['block_size']}",
        "batch_size": f"batch {d['batch_size']}",
        "precision": d["precision"],
        "strategy": d["strategy"],
        "data": f"data {d['data']}",
        "steps_per_epoch": f"{d['steps_per_epoch']} steps/epoch" if d["steps_per_epoch"] else "full epochs",
    }
    if "model" in names:
        parts["workload"] = d["workload"]
    return " · ".join(v for k, v in parts.items() if k not in names)


def _group(items: Iterable[Entry], key: Callable[[Entry], Any]) -> dict[Any, list[Entry]]:
    out: dict[Any, list[Entry]] = {}
    for item in items:
        out.setdefault(key(item), []).append(item)
    return out


def _wrap(label: str, width: int = 22) -> str:
    return textwrap.fill(label, width) if len(label) > width else label


# --------------------------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------------------------


@dataclass
class ReportFigure:
    title: str
    caption: str
    figure: Figure

    def encode(self, fmt: str) -> bytes:
        buf = io.BytesIO()
        self.figure.savefig(buf, format=fmt, dpi=110, bbox_inches="tight", metadata=_metadata(fmt))
        return buf.getvalue()


def _metadata(fmt: str) -> dict[str, Any]:
    # no creation date: the same records give byte-identical figures
    return {"Date": None} if fmt == "svg" else {"Software": f"accelbench {__version__}"}


def _matplotlib() -> Any:
    try:
        import matplotlib
        import matplotlib.figure
    except ImportError:
        raise AccelbenchError(
            "accelbench report draws its figures with matplotlib, which is not installed: "
            "pip install matplotlib"
        ) from None
    return matplotlib


def _new_figure(ncols: int = 1, nrows: int = 1, width: float = 5.2, height: float = 3.6) -> Figure:
    # a Figure without pyplot: no global state, no GUI backend, nothing to close
    return _matplotlib().figure.Figure(figsize=(width * ncols, height * nrows), layout="constrained")


def _mark_failures(ax: Axes, xs: Sequence[float], labels: Sequence[str]) -> None:
    """Write OOM / error at the foot of the axis where a point has no figure."""
    for x, label in zip(xs, labels, strict=True):
        ax.annotate(
            label,
            (x, 0),
            xycoords=("data", "axes fraction"),
            xytext=(0, 4),
            textcoords="offset points",
            ha="center",
            va="bottom",
            rotation=90,
            fontsize=8,
            color="firebrick",
        )


def _bars(
    ax: Axes,
    groups: Sequence[str],
    series: Sequence[str],
    cells: Mapping[tuple[str, str], Entry],
    metric: Callable[[Entry], float | None],
    ylabel: str,
) -> None:
    """Grouped bars: one group per x label, one bar per series (``cells`` keyed by both); min..max whiskers on
    epoch times; a cell without a figure is marked with why (OOM, error)."""
    width = 0.8 / max(1, len(series))
    for j, name in enumerate(series):
        xs, heights, errs, fails, fail_labels = [], [], [[], []], [], []
        for i, group in enumerate(groups):
            entry = cells.get((group, name))
            x = i - 0.4 + width * (j + 0.5)
            if entry is None:
                continue
            y = metric(entry)
            if y is None:
                fails.append(x)
                fail_labels.append(entry.cell.failure() or "-")
                continue
            xs.append(x)
            heights.append(y)
            spread = entry.cell.epoch_s if metric is _epoch else None
            errs[0].append(y - spread.low if spread else 0)
            errs[1].append(spread.high - y if spread else 0)
        ax.bar(xs, heights, width * 0.95, label=name, yerr=errs if any(errs[1]) else None, capsize=2)
        _mark_failures(ax, fails, [_short_failure(f) for f in fail_labels])
    ax.set_xticks(range(len(groups)), [_wrap(g) for g in groups], fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)


def _legend_outside(ax: Axes, title: str | None = None) -> None:
    """A legend to the right of the plot, where it hides no bar or line (constrained layout makes room)."""
    ax.legend(title=title, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)


def _short_failure(text: str) -> str:
    return "OOM" if text == "OOM" else text.split(":")[0]


def _epoch(e: Entry) -> float | None:
    return e.epoch_s


def _memory(e: Entry) -> float | None:
    return e.memory_gib


def epoch_time_figures(items: list[Entry], systems: Sequence[str]) -> list[ReportFigure]:
    """Seed figure 2: average epoch time per system x precision, one panel per batch size, on one device with
    the plain loop or DDP (as the study ran it). Other strategies are the strategy view's."""
    single = [e for e in items if e.cell.devices == 1 and e.key.strategy in SINGLE_DEVICE_STRATEGIES]
    figures = []
    for _, group in _group(single, lambda e: _without(e.key, "precision", "batch_size")).items():
        if sum(e.epoch_s is not None for e in group) < 2:
            continue  # one bar compares nothing; the comparison table has it
        batches = sorted({e.key.batch_size for e in group})
        names = [s for s in systems if any(e.cell.system == s for e in group)]
        precisions = sorted({e.key.precision for e in group}, key=_precision_order)
        fig = _new_figure(ncols=len(batches), width=max(3.4, 1.2 * len(names) + 1.5))
        axes = fig.subplots(1, len(batches), squeeze=False)[0]
        for ax, batch in zip(axes, batches, strict=True):
            cells = {(e.cell.system, e.key.precision): e for e in group if e.key.batch_size == batch}
            _bars(ax, names, precisions, cells, _epoch, "steady epoch time (s)")
            ax.set_title(f"batch {batch}")
        _legend_outside(axes[-1], "precision")
        key = group[0].key
        figures.append(
            ReportFigure(
                f"Epoch time: {key.workload} {key.model}, {key.strategy}",
                f"{_caption(key, 'precision', 'batch_size')}; one device. Bars: median steady epoch; "
                "whiskers: min..max over the steady epochs of every run.",
                fig,
            )
        )
    return figures


def _precision_order(name: str) -> int:
    return PRECISIONS.index(name) if name in PRECISIONS else len(PRECISIONS)


def scaling_figures(items: list[Entry]) -> list[ReportFigure]:
    """Seed figure 3: epoch time and throughput speedup against the device count, one line per batch size."""
    figures = []
    for (_, system), group in _group(items, lambda e: (_without(e.key, "batch_size"), e.cell.system)).items():
        if len({e.cell.devices for e in group}) < 2:
            continue
        fig = _new_figure(ncols=2)
        time_ax, speed_ax = fig.subplots(1, 2)
        top = 1
        for batch, series in sorted(_group(group, lambda e: e.key.batch_size).items()):
            series.sort(key=lambda e: e.cell.devices)
            measured = [e for e in series if e.epoch_s is not None]
            if not measured:
                continue
            devices = [e.cell.devices for e in measured]
            time_ax.plot(devices, [e.epoch_s for e in measured], marker="o", label=f"batch {batch}")
            base = measured[0]
            speed = [e.cell.samples_per_s.median / base.cell.samples_per_s.median for e in measured]  # type: ignore[union-attr]
            speed_ax.plot(devices, speed, marker="o", label=f"batch {batch}")
            top = max(top, max(devices) // base.cell.devices)
            failed = [e for e in series if e.epoch_s is None]
            _mark_failures(
                time_ax,
                [e.cell.devices for e in failed],
                [_short_failure(e.cell.failure() or "") for e in failed],
            )
        all_devices = sorted({e.cell.devices for e in group})
        first = all_devices[0]
        speed_ax.plot(all_devices, [d / first for d in all_devices], "k--", linewidth=0.8, label="ideal")
        for ax in (time_ax, speed_ax):
            ax.set_xscale("log", base=2)
            ax.set_xticks(all_devices, [str(d) for d in all_devices])
            ax.set_xlabel("devices")
        time_ax.set_ylabel("steady epoch time (s)")
        time_ax.set_ylim(bottom=0)
        speed_ax.set_ylim(bottom=0)
        speed_ax.set_ylabel(f"throughput speedup vs {first} device(s)")
        _legend_outside(speed_ax)
        key = group[0].key
        figures.append(
            ReportFigure(
                f"Scaling: {key.model} {key.precision} {key.strategy} on {system}",
                f"{_caption(key, 'batch_size')}. Speedup = samples/s over samples/s at the smallest device count "
                "(global throughput: all ranks' samples over the slowest rank's time).",
                fig,
            )
        )
    return figures


def memory_by_batch_figures(items: list[Entry]) -> list[ReportFigure]:
    """Seed figure 4: peak memory against batch size, one line per system, device count and precision."""
    figures = []
    for _, group in _group(items, lambda e: _without(e.key, "batch_size", "precision")).items():
        if len({e.key.batch_size for e in group}) < 2:
            continue
        fig = _new_figure(width=6)
        ax = fig.subplots()
        lines = _group(group, lambda e: (e.cell.system, e.cell.devices, e.key.precision))
        for (system, devices, precision), series in lines.items():
            measured = sorted((e for e in series if e.memory_gib is not None), key=lambda e: e.key.batch_size)
            if measured:
                ax.plot(
                    [e.key.batch_size for e in measured],
                    [e.memory_gib for e in measured],
                    marker="o",
                    label=_wrap(f"{system} x{devices} {precision}", 40),
                )
            failed = [e for e in series if e.memory_gib is None]
            _mark_failures(
                ax,
                [e.key.batch_size for e in failed],
                [_short_failure(e.cell.failure() or "") for e in failed],
            )
        ax.set_xscale("log", base=2)
        batches = sorted({e.key.batch_size for e in group})
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.set_xlabel("batch size (per device)")
        ax.set_ylabel("peak memory (GiB)")
        ax.set_ylim(bottom=0)
        _legend_outside(ax)
        key = group[0].key
        figures.append(
            ReportFigure(
                f"Peak memory against batch size: {key.model} {key.strategy}",
                _caption(key, "batch_size", "precision"),
                fig,
            )
        )
    return figures


def _models_in_order(group: Sequence[Entry]) -> list[str]:
    sizes: dict[str, float] = {}
    for e in group:
        sizes[e.key.model] = max(sizes.get(e.key.model, 0.0), e.model_size)
    return sorted(sizes, key=lambda m: sizes[m])


def memory_by_model_figures(items: list[Entry]) -> list[ReportFigure]:
    """Seed figure 6 (a) and table 5: peak memory against model size; runs out of memory marked."""
    figures = []
    for _, group in _group(items, lambda e: _without(e.key, "model")).items():
        models = _models_in_order(group)
        if len(models) < 2:
            continue
        fig = _new_figure(width=max(5.0, 0.8 * len(models) + 2))
        ax = fig.subplots()
        for (system, devices), series in _group(group, lambda e: (e.cell.system, e.cell.devices)).items():
            by_model = {e.key.model: e for e in series}
            xs = [i for i, m in enumerate(models) if m in by_model and by_model[m].memory_gib is not None]
            line = ax.plot(
                xs,
                [by_model[models[i]].memory_gib for i in xs],
                marker="o",
                label=_wrap(f"{system} x{devices}", 40),
            )
            oom = [i for i, m in enumerate(models) if m in by_model and by_model[m].out_of_memory]
            if oom:
                ax.plot(
                    oom,
                    [0] * len(oom),
                    "x",
                    color=line[0].get_color(),
                    markersize=9,
                    transform=ax.get_xaxis_transform(),
                )
                _mark_failures(ax, oom, ["OOM"] * len(oom))
        ax.set_xticks(range(len(models)), [_wrap(m, 14) for m in models], fontsize=8)
        ax.set_xlabel("model (by size)")
        ax.set_ylabel("peak memory (GiB)")
        ax.set_ylim(bottom=0)
        _legend_outside(ax)
        key = group[0].key
        figures.append(
            ReportFigure(
                f"Peak memory against model size: {key.precision} {key.strategy} batch {key.batch_size}",
                _caption(key, "model"),
                fig,
            )
        )
    return figures


def strategy_figures(items: list[Entry]) -> list[ReportFigure]:
    """Seed figure 6: peak memory and epoch time per strategy across model sizes, one figure per device count."""
    figures = []
    keyed = _group(items, lambda e: (_without(e.key, "model", "strategy"), e.cell.system, e.cell.devices))
    for (_, system, devices), group in keyed.items():
        strategies = list(dict.fromkeys(e.key.strategy for e in group))
        if len(strategies) < 2:
            continue
        models = _models_in_order(group)
        cells = {(e.key.model, e.key.strategy): e for e in group}
        fig = _new_figure(ncols=2, width=max(4.5, 0.9 * len(models) + 2))
        mem_ax, time_ax = fig.subplots(1, 2)
        _bars(mem_ax, models, strategies, cells, _memory, "peak memory (GiB)")
        _bars(time_ax, models, strategies, cells, _epoch, "steady epoch time (s)")
        _legend_outside(time_ax, "strategy")
        key = group[0].key
        figures.append(
            ReportFigure(
                f"Strategies on {devices} device(s): {system}",
                f"{_caption(key, 'model', 'strategy')}. OOM: the model did not fit with that strategy.",
                fig,
            )
        )
    return figures


def compile_figures(items: list[Entry]) -> list[ReportFigure]:
    """Seed figure 8: compile time and epoch time per strategy against the device count (IPUs, or any compile)."""
    compiled = [e for e in items if e.cell.compile_s is not None]
    figures = []
    for (_, system), group in _group(
        compiled, lambda e: (_without(e.key, "strategy"), e.cell.system)
    ).items():
        fig = _new_figure(ncols=2)
        compile_ax, time_ax = fig.subplots(1, 2)
        for strategy, series in _group(group, lambda e: e.key.strategy).items():
            series.sort(key=lambda e: e.cell.devices)
            devices = [e.cell.devices for e in series]
            compile_ax.plot(devices, [e.cell.compile_s.median for e in series], marker="o", label=strategy)  # type: ignore[union-attr]
            time_ax.plot(devices, [e.epoch_s for e in series], marker="o", label=strategy)
        all_devices = sorted({e.cell.devices for e in group})
        for ax in (compile_ax, time_ax):
            ax.set_xscale("log", base=2)
            ax.set_xticks(all_devices, [str(d) for d in all_devices])
            ax.set_xlabel("devices")
        compile_ax.set_ylabel("compile time (s)")
        time_ax.set_ylabel("steady epoch time (s)")
        compile_ax.set_ylim(bottom=0)
        time_ax.set_ylim(bottom=0)
        _legend_outside(time_ax, "strategy")
        key = group[0].key
        figures.append(
            ReportFigure(
                f"Compile time and epoch time per strategy: {key.model} on {system}",
                f"{_caption(key, 'strategy')}. Compile: the executor's compile step, timed apart from the epochs.",
                fig,
            )
        )
    return figures


# --------------------------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------------------------


def largest_fit_tables(items: list[Entry]) -> list[tuple[str, list[list[str]]]]:
    """Seed table 5: per series of growing models that met an out-of-memory, what fitted and at what cost."""
    tables = []
    keyed = _group(items, lambda e: (_without(e.key, "model"), e.cell.system, e.cell.devices))
    for (_, system, devices), group in keyed.items():
        if not any(e.out_of_memory for e in group) or len({e.key.model for e in group}) < 2:
            continue
        rows = []
        by_model = {e.key.model: e for e in group}
        for model in _models_in_order(group):
            e = by_model[model]
            if e.out_of_memory:
                rows.append([model, "out of memory", "-"])
            elif e.epoch_s is not None:
                memory = e.cell.peak_memory_bytes
                rows.append([model, fmt_bytes(memory.median) if memory else "unknown", f"{e.epoch_s:.3f}"])
            else:
                rows.append([model, e.cell.failure() or "-", "-"])
        title = f"{system} x{devices} · {_caption(group[0].key, 'model')}"
        tables.append((title, rows))
    return tables


# --------------------------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------------------------


def esc(value: object) -> str:
    """Escape anything for HTML text and attribute values."""
    return html.escape(str(value), quote=True)


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], css: str = "") -> str:
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


def build_report(
    comparison: Comparison, title: str = "accelbench report", figure_format: str = "svg"
) -> Report:
    """The HTML page and its figures (rendered lazily by the caller if it wants files too)."""
    matplotlib = _matplotlib()
    if figure_format not in FIGURE_FORMATS:
        raise AccelbenchError(f"--figure-format {figure_format!r}: choose one of {', '.join(FIGURE_FORMATS)}")
    items = entries(comparison)
    with matplotlib.rc_context(_STYLE):
        views = [
            (
                "epoch-time",
                "Epoch time per system, precision and batch size",
                "Single-device runs (seed study, figure 2).",
                epoch_time_figures(items, comparison.systems),
            ),
            (
                "scaling",
                "Scaling across device counts",
                "The same workload at several device counts on one system (seed study, figure 3).",
                scaling_figures(items),
            ),
            (
                "memory-batch",
                "Peak memory against batch size",
                "Seed study, figure 4.",
                memory_by_batch_figures(items),
            ),
            (
                "memory-model",
                "Peak memory against model size",
                "Seed study, figure 6 and table 5; the tables below list what fitted.",
                memory_by_model_figures(items),
            ),
            (
                "strategies",
                "Strategy comparison across model sizes and device counts",
                "DDP, FSDP and ZeRO stages (seed study, figure 6).",
                strategy_figures(items),
            ),
            (
                "compile",
                "Compile time and epoch time per strategy",
                "IPU strategies, or any run with a compile step (seed study, figure 8).",
                compile_figures(items),
            ),
        ]
        body: list[str] = []
        figures: list[ReportFigure] = []
        for anchor, heading, intro, view_figures in views:
            body.append(f'<h2 id="{anchor}">{esc(heading)}</h2><p class="caption">{esc(intro)}</p>')
            if not view_figures:
                body.append('<p class="none">No records for this view.</p>')
            for fig in view_figures:
                figures.append(fig)
                data = base64.b64encode(fig.encode(figure_format)).decode("ascii")
                body.append(
                    f'<figure id="figure-{len(figures)}"><h3>Figure {len(figures)}. {esc(fig.title)}</h3>'
                    f'<img alt="{esc(fig.title)}" src="data:{_MIME[figure_format]};base64,{data}">'
                    f'<figcaption class="caption">{esc(fig.caption)}</figcaption></figure>'
                )
            if anchor == "memory-model":
                for table_title, rows in largest_fit_tables(items):
                    body.append(f"<h3>Largest model that fits: {esc(table_title)}</h3>")
                    body.append(_table(["model", "peak memory", "steady epoch time (s)"], rows))
    page = _page(comparison, title, body)
    return Report(page, figures)


def _page(comparison: Comparison, title: str, views: list[str]) -> str:
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        f'<p class="meta">{len(comparison.records)} result record(s) from {len(comparison.systems)} system(s); '
        f"baseline: {esc(comparison.baseline)}; generated {esc(generated)} by accelbench {esc(__version__)}.</p>",
        '<nav><ul><li><a href="#systems">Systems</a></li><li><a href="#comparison">Comparison</a></li>'
        '<li><a href="#environment">What differs between the environments</a></li>'
        '<li><a href="#epoch-time">Epoch time</a></li><li><a href="#scaling">Scaling</a></li>'
        '<li><a href="#memory-batch">Memory against batch size</a></li>'
        '<li><a href="#memory-model">Memory against model size</a></li>'
        '<li><a href="#strategies">Strategies</a></li><li><a href="#compile">Compile time</a></li>'
        '<li><a href="#records">Records</a></li></ul></nav>',
    ]
    if comparison.skipped:
        items = "".join(f"<li><code>{esc(p)}</code>: {esc(reason)}</li>" for p, reason in comparison.skipped)
        parts.append(
            f'<p class="skipped">Skipped files (not valid result records):</p><ul class="skipped">{items}</ul>'
        )
    parts.append('<h2 id="systems">Systems</h2>')
    parts.append(
        _table(["system", "hosts", "backend", "device", "one device is", "records"], _system_rows(comparison))
    )
    parts.append('<h2 id="comparison">Comparison</h2>')
    parts.append(
        f'<p class="caption">speed ×N = epoch time of the baseline ({esc(comparison.baseline)}) over this epoch '
        "time (>1 is faster). Epoch time: median of the steady epochs (after the warm-up) of all successful runs, "
        f"± half their range. Beyond noise: two-sided Mann-Whitney test of the steady epoch times against the "
        f"baseline's at α = {comparison.alpha:g}.</p>"
    )
    for group in comparison.groups:
        parts.append(f"<h3>{esc(group.key.describe())}</h3>")
        parts.append(_table(COLUMNS, (cell_row(c, comparison.baseline) for c in group.cells), "comparison"))
    parts.append('<h2 id="environment">What differs between the environments</h2>')
    if comparison.environment:
        rows = [
            [attribute, *(" | ".join(v[s]) or "-" for s in comparison.systems)]
            for attribute, v in comparison.environment
        ]
        parts.append(_table(["attribute", *comparison.systems], rows))
    else:
        parts.append('<p class="none">No differences in versions, precision plans or device definitions.</p>')
    parts += views
    parts.append('<h2 id="records">Records</h2>')
    record_rows = []
    for system, r in comparison.records:
        o = r.record.outcome
        record_rows.append([str(r.path), system, r.record.config.model, o.status, (o.message or "")[:300]])
    parts.append(_table(["file", "system", "model", "outcome", "message"], record_rows))
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _system_rows(comparison: Comparison) -> list[list[str]]:
    rows = []
    for system in comparison.systems:
        mine = [r.record for s, r in comparison.records if s == system]
        hosts = sorted({rec.system.host for rec in mine})
        first = mine[0]
        device = first.backend.devices[0].name if first.backend.devices else "none"
        rows.append(
            [
                system,
                ", ".join(hosts),
                first.backend.info.name,
                device,
                first.backend.info.device_unit,
                str(len(mine)),
            ]
        )
    return rows


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60] or "figure"


def write_report(report: Report, output: Path, figures_dir: Path | None, figure_format: str) -> list[Path]:
    """Write the HTML file, and the figures as files when asked; returns the figure files written."""
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(report.html, encoding="utf-8")
    written = []
    if figures_dir is not None:
        figures_dir.mkdir(parents=True, exist_ok=True)
        for i, fig in enumerate(report.figures, 1):
            path = figures_dir / f"{i:02d}-{_slug(fig.title)}.{figure_format}"
            path.write_bytes(fig.encode(figure_format))
            written.append(path)
    return written


# --------------------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------------------


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    """The `report` subcommand's options."""
    add_selection_arguments(parser)
    parser.add_argument(
        "--output",
        "-o",
        type=Path,
        default=Path("accelbench-report.html"),
        help="the HTML file (default: accelbench-report.html)",
    )
    parser.add_argument(
        "--figures", type=Path, metavar="DIR", help="also write every figure as a file into DIR"
    )
    parser.add_argument(
        "--figure-format",
        choices=FIGURE_FORMATS,
        default="svg",
        help="figure format, embedded and written (default: svg)",
    )
    parser.add_argument("--title", default="accelbench report", help="the report's title")


def report_command(args: argparse.Namespace, err: Console) -> int:
    """`accelbench report`: compare the records, draw the views, write one HTML file."""
    comparison = comparison_from_args(args, err)
    report = build_report(comparison, args.title, args.figure_format)
    written = write_report(report, args.output, args.figures, args.figure_format)
    err.print(Text(f"report written to {args.output} ({len(report.figures)} figure(s))"), soft_wrap=True)
    if written:
        err.print(Text(f"figures written to {args.figures}"), soft_wrap=True)
    return 0
