"""Drawing with matplotlib, without pyplot: figures with no global state, the report's style, grouped bars.

matplotlib is imported only when a report is built (it is the ``[report]`` extra); mathtext is off so a ``$`` in
a host name is just a character.
"""

from __future__ import annotations

import io
import math
import textwrap
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from accelbench import __version__
from accelbench.compare import Spread
from accelbench.errors import AccelbenchError
from accelbench.report.entries import Entry
from accelbench.report.palette import colour

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FIGURE_FORMATS = ("svg", "png")
STYLE = {
    "text.parse_math": False,  # record strings are text, never TeX
    "font.size": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "svg.fonttype": "none",  # text stays text in SVG: smaller files, selectable labels
}


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


def load_matplotlib() -> Any:
    try:
        import matplotlib
        import matplotlib.colors
        import matplotlib.figure
    except ImportError:
        raise AccelbenchError(
            "accelbench report draws its figures with matplotlib, which is not installed: "
            "pip install 'accelbench[report]' (or pip install matplotlib)"
        ) from None
    return matplotlib


def new_figure(ncols: int = 1, nrows: int = 1, width: float = 5.2, height: float = 3.6) -> Figure:
    # a Figure without pyplot: no global state, no GUI backend, nothing to close
    return load_matplotlib().figure.Figure(figsize=(width * ncols, height * nrows), layout="constrained")


def wrap(label: str, width: int = 22) -> str:
    return textwrap.fill(label, width) if len(label) > width else label


def short_failure(text: str) -> str:
    return "OOM" if text == "OOM" else text.split(":")[0]


def mark_failures(ax: Axes, xs: Sequence[float], labels: Sequence[str]) -> None:
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


def bars(
    ax: Axes,
    groups: Sequence[str],
    series: Sequence[str],
    cells: Mapping[tuple[str, str], Entry],
    metric: Callable[[Entry], float | None],
    ylabel: str,
    whiskers: Callable[[Entry], Spread | None] | None = None,
) -> None:
    """Grouped bars: one group per x label, one bar per series (``cells`` keyed by both); min..max whiskers from
    ``whiskers``; a cell whose runs failed is marked with why (OOM, error)."""
    width = 0.8 / max(1, len(series))
    for j, name in enumerate(series):
        xs: list[float] = []
        heights: list[float] = []
        errs: tuple[list[float], list[float]] = ([], [])
        fails: list[float] = []
        fail_labels: list[str] = []
        for i, group in enumerate(groups):
            entry = cells.get((group, name))
            x = i - 0.4 + width * (j + 0.5)
            if entry is None:
                continue
            y = metric(entry)
            if y is None:
                failure = entry.cell.failure()
                if failure:  # a run that failed says why; a figure that is just unknown stays blank
                    fails.append(x)
                    fail_labels.append(failure)
                continue
            xs.append(x)
            heights.append(y)
            spread = whiskers(entry) if whiskers else None
            errs[0].append(y - spread.low if spread else 0)
            errs[1].append(spread.high - y if spread else 0)
        ax.bar(
            xs,
            heights,
            width * 0.95,
            label=name,
            color=colour(name),
            yerr=errs if any(errs[1]) else None,
            capsize=2,
        )
        mark_failures(ax, fails, [short_failure(f) for f in fail_labels])
    ax.set_xticks(range(len(groups)), [wrap(g) for g in groups], fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)


def batch_colour(batch: int) -> str:
    """A batch size's colour, the same in every figure: darker for larger batches (viridis, by powers of two)."""
    position = min(1.0, max(0.0, math.log2(max(batch, 1)) / 12))  # batch 1 .. 4096
    return str(
        load_matplotlib().colors.to_hex(load_matplotlib().colormaps["viridis_r"](0.1 + 0.85 * position))
    )


_LINESTYLES = ("-", "--", ":", "-.")


def system_linestyle(system: str) -> str:
    """Lines of one colour (a precision) told apart by system: each system keeps its line style."""
    return _LINESTYLES[zlib.crc32(system.encode()) % len(_LINESTYLES)]


def legend_outside(ax: Axes, title: str | None = None) -> None:
    """A legend to the right of the plot, where it hides no bar or line (constrained layout makes room)."""
    ax.legend(title=title, fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)


def log2_devices(ax: Axes, devices: Sequence[int]) -> None:
    """A device-count x axis: powers of two evenly spaced, each count labelled."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(devices, [str(d) for d in devices])
    ax.set_xlabel("devices")
