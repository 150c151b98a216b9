"""The report's collective bandwidth view: bus bandwidth against message size, one panel per collective and type,
one line per system (its colour as everywhere in the report), out-of-place solid and in-place dashed.

Message sizes double, so the x axis is log2; a size a system could not measure is marked at the foot of its panel
(OOM, wrong, unsupported) rather than left as a silent gap.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

from accelbench.comm.collectives import size_label
from accelbench.compare.bandwidth import BandwidthTable, CommComparison, caption
from accelbench.report.drawing import ReportFigure, mark_failures
from accelbench.report.facets import Panel, faceted, titles_apart
from accelbench.report.palette import colour

if TYPE_CHECKING:
    from matplotlib.axes import Axes

_LINESTYLE = {"out-of-place": "-", "in-place": "--"}
MAX_TICKS = 7


def bandwidth_figures(comparison: CommComparison) -> list[ReportFigure]:
    """Bus bandwidth against message size per system, one panel per collective x type (small multiples)."""
    by_panel: dict[tuple[str, str], list[BandwidthTable]] = {}
    for table in comparison.tables:
        by_panel.setdefault((table.op, table.dtype), []).append(table)
    titles, common = titles_apart([f"{op} · {dtype}" for op, dtype in by_panel])
    panels = [
        Panel(title, functools.partial(_panel, tables=tables))
        for title, tables in zip(titles, by_panel.values(), strict=True)
    ]
    return [
        ReportFigure(
            "Bus bandwidth against message size" + part,
            (f"All panels: {common}. " if common else "")
            + caption(comparison)
            + " Solid: out-of-place; dashed: in-place (all_reduce, broadcast and reduce work in place only).",
            fig,
        )
        for fig, part in faceted(panels, "system")
    ]


def _panel(ax: Axes, tables: list[BandwidthTable]) -> None:
    sizes = sorted({size for t in tables for size in t.sizes})
    for table in tables:
        for system in table.systems:
            cells = [(size, table.cells.get((system, size))) for size in table.sizes]
            points = [(size, c.busbw_gbps) for size, c in cells if c is not None and c.busbw_gbps is not None]
            failed = [
                (size, c.failure) for size, c in cells if c is not None and c.busbw_gbps is None and c.failure
            ]
            label = system if table.variant == "out-of-place" else f"{system} (in-place)"
            if points:
                ax.plot(
                    [p[0] for p in points],
                    [p[1] for p in points],
                    color=colour(system),
                    linestyle=_LINESTYLE.get(table.variant, "-"),
                    marker="o",
                    markersize=3,
                    label=label,
                )
            if failed:
                mark_failures(ax, [f[0] for f in failed], [f[1] or "" for f in failed])
    ax.set_xscale("log", base=2)
    step = max(1, math.ceil(len(sizes) / MAX_TICKS))
    ticks = sizes[::step]
    ax.set_xticks(ticks, [size_label(s) for s in ticks], fontsize=7, rotation=45)
    ax.minorticks_off()
    ax.set_xlabel("message size")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_ylim(bottom=0)
