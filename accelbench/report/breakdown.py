"""Where a step's time goes (``run --profile``), per system, as stacked bars: seed 001's figures 10 and 12-14.

One panel per workload that has profiled runs, one bar per system (and device count), stacked by category in the
same colours in every panel; panels are titled with what sets their workload apart.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from accelbench.compare import Comparison, WorkloadGroup
from accelbench.compare.render import SPLIT_CATEGORIES
from accelbench.report.drawing import ReportFigure, wrap
from accelbench.report.facets import Panel, faceted, titles_apart

if TYPE_CHECKING:
    from matplotlib.axes import Axes

CATEGORY_COLOURS = {
    "data": "#F0E442",
    "optimizer": "#CC79A7",
    "communication": "#D55E00",
    "kernel": "#0072B2",
    "intra-op dispatch": "#56B4E9",
    "inter-op dispatch": "#999999",
}


def breakdown_figures(comparison: Comparison) -> list[ReportFigure]:
    """Stacked bars of each profiled cell's step: milliseconds per category."""
    groups = [g for g in comparison.groups if any(c.step_split for c in g.cells)]
    titles, common = titles_apart([g.describe() for g in groups])
    panels = [
        Panel(title, functools.partial(_panel, group=group))
        for group, title in zip(groups, titles, strict=True)
    ]
    return [
        ReportFigure(
            f"Where a step's time goes{part}",
            (f"All panels: {common}. " if common else "")
            + "Profiled steady-state steps (run --profile), after the timed epochs. Categories sum to the step: "
            "kernel (the operators' arithmetic), intra-op dispatch (inside operators, not arithmetic), inter-op "
            "dispatch (between operators), exposed communication, optimizer, data (definitions: docs/profile.md).",
            fig,
        )
        for fig, part in faceted(panels, "time of a step")
    ]


def _panel(ax: Axes, group: WorkloadGroup) -> None:
    cells = [c for c in group.cells if c.step_split]
    several = len({c.devices for c in cells}) > 1
    labels = [f"{c.system} x{c.devices}" if several else c.system for c in cells]
    bottoms = [0.0] * len(cells)
    for category in SPLIT_CATEGORIES:
        heights = [(c.step_split or {}).get(category, 0.0) * 1e3 for c in cells]
        ax.bar(
            range(len(cells)),
            heights,
            0.6,
            bottom=bottoms,
            label=category,
            color=CATEGORY_COLOURS[category],
        )
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set_xticks(range(len(cells)), [wrap(label, 16) for label in labels], fontsize=8)
    ax.set_ylabel("ms per step")
    ax.set_ylim(bottom=0)
