"""Predicted against measured: the analytical model's step time and peak memory (stored in each record by the
run, ``accelbench estimate``'s model) beside what the run measured, per system and device count.

One panel per workload whose runs carry predictions; in each, paired bars per cell (measured solid, predicted
hatched) for the step time and the peak memory, with the relative error written over the predicted bar.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from accelbench.compare import Comparison, WorkloadGroup
from accelbench.report.drawing import ReportFigure, wrap
from accelbench.report.facets import Panel, faceted, titles_apart

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from accelbench.compare.cells import Cell
    from accelbench.compare.stats import Spread

MEASURED, PREDICTED = "#0072B2", "#E69F00"


def has_predictions(group: WorkloadGroup) -> bool:
    return any(c.predicted_step_s or c.predicted_peak_bytes for c in group.cells)


def predicted_figures(comparison: Comparison) -> list[ReportFigure]:
    """Two faceted figures: step time, and peak memory per device, predicted against measured."""
    groups = [g for g in comparison.groups if has_predictions(g)]
    titles, common = titles_apart([g.describe() for g in groups])
    figures: list[ReportFigure] = []
    for what, unit, pair, scale in (
        ("Step time", "ms per step", _step_pair, 1e3),
        ("Peak memory per device", "MiB", _memory_pair, 1 / 2**20),
    ):
        panels = [
            Panel(title, functools.partial(_panel, group=group, pair=pair, scale=scale, unit=unit))
            for group, title in zip(groups, titles, strict=True)
        ]
        figures += [
            ReportFigure(
                f"{what}: predicted against measured{part}",
                (f"All panels: {common}. " if common else "")
                + "Measured (solid) against the analytical model's prediction for the same configuration "
                "(hatched; accelbench estimate's formulas, stored in each record), with the error "
                "predicted / measured - 1 over each pair. Peak memory compares tensors with tensors where the runs "
                "measured a live tensor peak (the prediction less its runtime share), else the whole prediction "
                "with the backend's reading (on CPUs the resident set). Definitions and where the model misses: "
                "docs/estimate.md.",
                fig,
            )
            for fig, part in faceted(panels, unit)
        ]
    return figures


Pair = Callable[["Cell"], tuple["Spread | None", "Spread | None"]]


def _step_pair(cell: Cell) -> tuple[Spread | None, Spread | None]:
    """(measured, predicted) step time."""
    return cell.step_s, cell.predicted_step_s


def _memory_pair(cell: Cell) -> tuple[Spread | None, Spread | None]:
    """(measured, predicted) peak memory: tensors against the measured tensor peak where the runs have one, else
    the whole prediction against the backend's reading (:meth:`~accelbench.compare.cells.Cell.memory_check`)."""
    predicted, measured, _ = cell.memory_check()
    return measured, predicted


def _median(spread: Spread | None) -> float | None:
    return spread.median if spread else None


def _panel(ax: Axes, group: WorkloadGroup, pair: Pair, scale: float, unit: str) -> None:
    cells = [c for c in group.cells if _median(pair(c)[1]) is not None]
    several = len({c.devices for c in cells}) > 1
    labels = [f"{c.system} x{c.devices}" if several else c.system for c in cells]
    width = 0.38
    for i, cell in enumerate(cells):
        seen, guess = (_median(s) for s in pair(cell))
        if seen is not None:
            ax.bar(i - width / 2, seen * scale, width, color=MEASURED, label="measured" if i == 0 else None)
        assert guess is not None
        ax.bar(
            i + width / 2,
            guess * scale,
            width,
            color="white",
            edgecolor=PREDICTED,
            hatch="//",
            label="predicted" if i == 0 else None,
        )
        if seen:
            top = max(seen, guess) * scale
            ax.annotate(
                f"{guess / seen - 1:+.0%}", (i, top), ha="center", va="bottom", fontsize=8, xytext=(0, 2),
                textcoords="offset points",
            )  # fmt: skip
    ax.set_xticks(range(len(cells)), [wrap(label, 16) for label in labels], fontsize=8)
    ax.set_ylabel(unit)
    ax.set_ylim(bottom=0)
    ax.margins(y=0.12)
