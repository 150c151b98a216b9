"""The report's first view: every comparison table as one panel of one figure (small multiples).

Each workload the comparison has a table for gets a panel: its steady epoch time per system and device count (or,
compared along an axis, per value of it), coloured as everywhere in the report. Panels are titled with what sets
their workload apart from the others; what they share is said once, under the figure. So every table has a
figure, and many near-identical two-bar charts become one figure that can be read at a glance.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from accelbench.compare import Comparison, WorkloadGroup
from accelbench.compare.keys import format_value
from accelbench.report.drawing import ReportFigure, bars
from accelbench.report.entries import Entry
from accelbench.report.facets import Panel, faceted, titles_apart

if TYPE_CHECKING:
    from matplotlib.axes import Axes


def _epoch(e: Entry) -> float | None:
    return e.epoch_s


def overview_figures(comparison: Comparison) -> list[ReportFigure]:
    """Steady epoch time per system for every workload group, one panel each (small multiples)."""
    groups = [g for g in comparison.groups if g.cells]
    titles, common = titles_apart([g.describe() for g in groups])
    panels = [
        Panel(title, functools.partial(_panel, group=group, comparison=comparison))
        for group, title in zip(groups, titles, strict=True)
    ]
    return [
        ReportFigure(
            "Every comparison at a glance: steady epoch time"
            + (f" by {comparison.axis}" if comparison.axis else " per system")
            + part,
            (f"All panels: {common}. " if common else "")
            + "One panel per table of the comparison, titled with what sets it apart; bars: median steady epoch "
            "time, whiskers: min..max over the steady epochs of every run (lower is faster). A run without a "
            "figure says why at the foot of its panel (OOM, error).",
            fig,
        )
        for fig, part in faceted(panels, comparison.axis or "system")
    ]


def _panel(ax: Axes, group: WorkloadGroup, comparison: Comparison) -> None:
    """One group: bars grouped by device count (by system and device count along an axis), one per system (per
    value along an axis)."""
    items = [Entry(c.key or group.key, c) for c in group.cells]
    if group.axis:
        several = len({c.devices for c in group.cells}) > 1
        place = {id(e): f"{e.cell.system} x{e.cell.devices}" if several else e.cell.system for e in items}
        places = list(dict.fromkeys(place[id(e)] for e in items))
        values = [format_value(v, group.axis) for v in group.values]
        cells = {(place[id(e)], format_value(e.cell.value, group.axis)): e for e in items}
        bars(ax, places, values, cells, _epoch, "steady epoch time (s)", lambda e: e.cell.epoch_s)
        return
    counts = sorted({c.devices for c in group.cells})
    places = [f"{n} device{'s' if n > 1 else ''}" for n in counts]
    systems = [s for s in comparison.systems if any(c.system == s for c in group.cells)]
    cells = {(places[counts.index(e.cell.devices)], e.cell.system): e for e in items}
    bars(ax, places, systems, cells, _epoch, "steady epoch time (s)", lambda e: e.cell.epoch_s)
