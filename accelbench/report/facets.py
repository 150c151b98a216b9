"""Small multiples: many near-identical charts drawn as the panels of one figure, each titled with what sets it
apart, what they share said once, one legend for all.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from accelbench.report.drawing import new_figure, wrap

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PANELS_PER_FIGURE = 24  # more panels than this are split over several figures
COLUMNS = 4


@dataclass(frozen=True)
class Panel:
    """One chart of a faceted figure: its title and how to draw it on an axes."""

    title: str
    draw: Callable[[Axes], None]


def titles_apart(descriptions: Sequence[str]) -> tuple[list[str], str]:
    """Panel titles from one-line descriptions (``gpt gpt2 · batch 8 · fp32``): per description, the parts that
    not all share; and the parts every one shares, once."""
    if not descriptions:
        return [], ""
    parts = [d.split(" · ") for d in descriptions]
    common = set(parts[0]).intersection(*parts[1:])
    titles = [" · ".join(p for p in mine if p not in common) or "all runs" for mine in parts]
    return titles, " · ".join(p for p in parts[0] if p in common)


def faceted(
    panels: Sequence[Panel], legend_title: str | None, width: float = 3.3, height: float = 2.9
) -> list[tuple[Figure, str]]:
    """The panels in figures of up to :data:`PANELS_PER_FIGURE` (at most :data:`COLUMNS` a row), each with one
    legend under it; returns each figure with its part label (``""``, or `` (2 of 3)`` when split)."""
    out = []
    count = math.ceil(len(panels) / PANELS_PER_FIGURE)
    for start in range(0, len(panels), PANELS_PER_FIGURE):
        chunk = panels[start : start + PANELS_PER_FIGURE]
        ncols = min(COLUMNS, len(chunk))
        nrows = math.ceil(len(chunk) / ncols)
        fig = new_figure(ncols=ncols, nrows=nrows, width=width, height=height)
        axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
        for ax, panel in zip(axes, chunk, strict=False):
            panel.draw(ax)
            ax.set_title(wrap(panel.title, 40), fontsize=8)
        for ax in axes[len(chunk) :]:
            ax.set_axis_off()
        shared_legend(fig, list(axes[: len(chunk)]), legend_title)
        part = f" ({start // PANELS_PER_FIGURE + 1} of {count})" if count > 1 else ""
        out.append((fig, part))
    return out


def shared_legend(fig: Figure, axes: Sequence[Any], title: str | None) -> None:
    """One legend under the figure with every series any panel drew (panels draw the same series alike)."""
    handles: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    if handles:
        fig.legend(
            list(handles.values()),
            [wrap(label, 40) for label in handles],
            loc="outside lower center",
            ncols=min(4, len(handles)),
            fontsize=8,
            title=title,
        )
