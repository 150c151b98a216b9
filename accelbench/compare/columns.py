"""Every column of the comparison in one registry: :data:`REGISTRY`, read by each output format.

The terminal table, Markdown and the report's HTML tables show the text columns (those with a ``header``) that
:func:`shown` keeps; CSV and JSON carry every *figure* column (those with ``figure=True``: a measured value of the
cell, :meth:`Cell.spread`), its median (CSV) or median, range and count (JSON), in registry order, between the
cell's identification and its ratios. What a column says under the text formats (``note``) and in the report's
caption (``caption``), where it is shown only when some cell has it (``optional``), how it may wrap or be left out
of a narrow terminal (``wrap``, ``drop``): all of it is here, once.

Adding a metric
---------------

1. A measured value: add its field to :class:`accelbench.compare.summary.RunFigures` (a tuple for a value per steady
   epoch, pooled over the runs; a scalar for a value per run) and read it from the record in ``summarize``.
2. Add one :class:`Column` to :data:`REGISTRY`, named as that field, where its CSV and JSON field should go:
   ``Column("my_metric", "my header", figure=True, optional=True, after="mfu", text=..., note=...)``.

That is all: :meth:`Cell.spread` pools it, :meth:`Comparison.any_cell_has` decides whether it is shown, and the
table, Markdown, CSV, JSON and the report follow. ``after`` places a text column right after another in the
tables (before the columns placed there earlier in the registry) without moving its CSV and JSON fields.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from accelbench.compare.keys import format_value
from accelbench.compare.stats import Spread
from accelbench.display import fmt_bytes

if TYPE_CHECKING:
    from accelbench.compare.cells import Cell, Comparison, WorkloadGroup

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


def fmt_significant(spread: Spread | None) -> str:
    """Three significant digits of the median (TFLOP/s per device on a CPU is a few millionths)."""
    return "-" if spread is None else f"{spread.median:.3g}"


def fmt_mfu(cell: Cell) -> str:
    if not cell.ok_runs:
        return "-"
    if cell.mfu is None:
        return "error: >100%" if cell.mfu_errors else "unknown"
    return f"{cell.mfu.median:.1%}"


def fmt_epoch(cell: Cell) -> str:
    """Why there is no figure, else the steady epoch time, marked ⚠ when a run's host was busy."""
    return cell.failure() or fmt_spread(cell.epoch_s, " s") + (" ⚠" if cell.contended_runs else "")


def fmt_compile(cell: Cell) -> str:
    return fmt_spread(cell.compile_s, " s", 2) if cell.compile_s else "-"


def is_baseline(cell: Cell, group: WorkloadGroup) -> bool:
    """Whether ``cell`` is what its group's ratios are against (the baseline value's, or the baseline system's)."""
    return cell.value == group.baseline_value if group.axis else cell.system == group.baseline_system


def fmt_vs_baseline(cell: Cell, group: WorkloadGroup) -> str:
    if is_baseline(cell, group):
        return "baseline"
    return "-" if cell.baseline is None else f"×{cell.baseline.speedup:.2f}"


def fmt_memory_ratio(cell: Cell) -> str:
    ratio = cell.baseline.memory_ratio if cell.baseline else None
    return f"×{ratio:.2f}" if ratio is not None else "-"


def fmt_vs_system(cell: Cell, group: WorkloadGroup) -> str:
    if cell.system == group.baseline_system:
        return "baseline"
    return "-" if cell.vs_system is None else f"×{cell.vs_system.speedup:.2f}"


def fmt_noise(cell: Cell) -> str:
    r = cell.baseline
    if r is None:
        return "-"
    if r.verdict == "too few measurements":
        return f"can't tell ({r.measurements[0]} vs {r.measurements[1]} epochs)"
    return f"{'yes' if r.verdict == 'beyond noise' else 'no'} (p={r.p_value:.2g})"


def fmt_bubble(cell: Cell) -> str:
    """A pipeline's measured idle fraction, with the schedule's analytical bubble beside it where known."""
    if cell.bubble is None:
        return "-"
    model = f" (model {cell.bubble_analytical.median:.0%})" if cell.bubble_analytical else ""
    return f"{cell.bubble.median:.0%}{model}"


def fmt_loss(spread: Spread | None) -> str:
    return "-" if spread is None else f"{spread.median:.4f}"


def fmt_val_loss(cell: Cell) -> str:
    """The held-out loss, and where the runs have a shipped reference, whether they train as it does
    (:class:`~accelbench.compare.parity.Parity`, docs/quality.md)."""
    text = fmt_loss(cell.spread("val_loss"))
    return text if cell.parity is None else f"{text} {cell.parity.text()}"


def fmt_target(cell: Cell) -> str:
    """Training time to --target-loss (the median of the runs that reached it, how many did where some did not),
    or 'not reached' where none did."""
    asked, reached = cell.spread("target_loss"), cell.spread("time_to_target_s")
    if reached is None:
        return "not reached" if asked is not None else "-"
    missed = f" ({reached.n}/{asked.n} reached)" if asked is not None and asked.n > reached.n else ""
    return f"{reached.median:.3g} s{missed}"


def fmt_scaling(cell: Cell) -> str:
    s = cell.scaling
    if s is None:
        return "-"
    return f"×{s.speedup:.2f} vs {s.base_devices} dev, eff {s.efficiency:.0%}"


# --------------------------------------------------------------------------------------------------------------
# The registry
# --------------------------------------------------------------------------------------------------------------

# how a text column shows a cell: from the cell alone, or with its group (ratios name the group's baseline)
CellText = Callable[["Cell", "WorkloadGroup"], str]
# CSV fields of a figure column beyond its median (epoch time: its range and count too)
CsvFields = Callable[[str, "Spread | None"], dict[str, Any]]


def _median_field(name: str, spread: Spread | None) -> dict[str, Any]:
    return {name: spread.median if spread else None}


def _epoch_fields(name: str, spread: Spread | None) -> dict[str, Any]:
    return {
        f"{name}_median": spread.median if spread else None,
        f"{name}_min": spread.low if spread else None,
        f"{name}_max": spread.high if spread else None,
        "epochs_measured": spread.n if spread else 0,
    }


@dataclass(frozen=True)
class Column:
    """One column of the comparison.

    ``name`` is its key: for a figure column the :class:`~accelbench.compare.summary.RunFigures` field it pools
    (:meth:`Cell.spread`) and its CSV and JSON field. ``header`` is what the text formats call it (None: CSV and
    JSON only); the axis compared along (``name="value"``) is headed by the axis itself."""

    name: str
    header: str | None = None
    text: CellText | None = None  # how the text formats show a cell; default: a figure's median, ``unit``
    unit: str = ""
    figure: bool = False  # a measured value of the cell (Cell.spread(name)), carried by CSV and JSON
    csv: CsvFields = _median_field  # a figure's CSV fields from its spread
    optional: bool = False  # shown only when some cell has it (Comparison.any_cell_has(name))
    optional_on: str | None = None  # ... or, given, when some cell has this other figure
    shown_when: Callable[[Comparison], bool] | None = None  # shown only when this holds for the comparison
    axis_only: bool = False  # shown only when comparing along an axis (--vs)
    systems_only: bool = False  # ... and only with several systems
    after: str | None = None  # in the text formats, right after this column instead of in registry order
    align: Literal["left", "right"] = "right"
    wrap: int | None = None  # may wrap in a terminal, down to this width; None: never wraps
    drop: int | None = None  # a terminal too narrow leaves columns out from drop=1 up; None: never left out
    note: str | None = None  # how to read it, under the text formats when shown
    caption: str | None = None  # the same, in the report's comparison caption when shown

    def title(self, comparison: Comparison) -> str:
        """The header in the text formats."""
        return str(comparison.axis) if self.name == "value" else str(self.header)

    def show(self, cell: Cell, group: WorkloadGroup) -> str:
        """A cell as this column's text."""
        if self.name == "value":
            return format_value(cell.value, str(group.axis))
        if self.text is not None:
            return self.text(cell, group)
        spread = cell.spread(self.name)
        return "-" if spread is None else f"{spread.median:.3g}{self.unit}"

    def shown_in(self, comparison: Comparison) -> bool:
        """Whether the text formats show it for ``comparison``."""
        if self.header is None and self.name != "value":
            return False
        if self.axis_only and not comparison.axis:
            return False
        if self.systems_only and len(comparison.systems) < 2:
            return False
        if self.shown_when is not None and not self.shown_when(comparison):
            return False
        return not self.optional or comparison.any_cell_has(self.optional_on or self.name)


REGISTRY: tuple[Column, ...] = (
    Column("system", "system", lambda c, g: c.system, align="left", wrap=16),
    Column("devices", "devices", lambda c, g: str(c.devices), drop=10),
    Column("value", axis_only=True, align="left"),  # the axis compared along (--vs); headed by its name
    Column("runs", "runs", lambda c, g: c.outcome_text(), align="left", wrap=8, drop=9),
    Column("epoch_s", "steady epoch s", lambda c, g: fmt_epoch(c), figure=True, csv=_epoch_fields),
    Column("samples_per_s", "samples/s", lambda c, g: fmt_rate(c.samples_per_s), figure=True),
    Column(
        "tokens_per_s",
        "tokens/s",
        lambda c, g: fmt_rate(c.tokens_per_s),
        figure=True,
        shown_when=lambda comparison: comparison.counts_tokens,
        after="samples_per_s",
        drop=1,
        note="tokens/s = tokens trained on a second (samples/s times the tokens of a sample), the figure language-"
        "model training is compared on; shown when some workload's sample is a sequence of tokens.",
    ),
    Column(
        "peak_memory_bytes", "peak memory", lambda c, g: fmt_memory(c.peak_memory_bytes), figure=True, drop=8
    ),
    Column("mfu", "MFU", lambda c, g: fmt_mfu(c), figure=True, drop=6),
    Column(
        "val_loss",
        "val loss",
        lambda c, g: fmt_val_loss(c),
        figure=True,
        optional=True,
        after="samples_per_s",
        wrap=12,  # never left out: whether the run trains right belongs beside its speed
        note="val loss = the held-out loss after each run's last epoch (median over runs); ✓ ref / ✗ outside ref: a "
        "run of a shipped reference's recipe (gpt-nano, gpt-micro, llama-tiny, bert-tiny, mobilenet-v3-small: batch "
        "16, 20 steps, 4 epochs) whose held-out loss after every epoch is within / after some epoch outside the "
        "reference's 99% prediction interval over seeds (fp32, one device); with 2 or more runs (seeds), also "
        "Welch's t-test of their final losses against the reference's at 99% (docs/quality.md): a precision, "
        "strategy or backend that trains wrong shows here beside its speed.",
    ),
    Column(
        "time_to_target_s",
        "to target",
        lambda c, g: fmt_target(c),
        figure=True,
        optional=True,
        optional_on="target_loss",
        after="samples_per_s",
        wrap=11,
        note="to target = training time (the timed epochs, evaluation excluded) until the validation loss first "
        "reached --target-loss; 'not reached' where no run reached it.",
    ),
    Column("target_loss", figure=True),
    Column("target_steps", figure=True),
    Column("target_samples", figure=True),
    Column("target_energy_j", figure=True),
    Column("reference_val_loss", figure=True),
    Column("outside_reference", figure=True),
    Column(
        "joules_per_sample",
        "J/sample",
        lambda c, g: fmt_energy(c.joules_per_sample),
        figure=True,
        optional=True,
        after="mfu",
        drop=3,
        note="J/sample = joules per sample over the steady epochs, from the devices' energy counters.",
        caption="J/sample: joules per sample from the devices' energy counters.",
    ),
    Column(
        "megatron_tflops_per_device",
        "TFLOP/s/dev",
        figure=True,
        optional=True,
        after="mfu",
        drop=7,
        note="TFLOP/s/dev = achieved TFLOP/s per device by Megatron's FLOP count (72 B s l h^2 (1 + s/6h + "
        "V/12lh) per iteration), as seed 003 reports it.",
    ),
    Column(
        "routing_imbalance",
        "routing",
        lambda c, g: "-" if (r := c.spread("routing_imbalance")) is None else f"{r.median:.2f}×",
        figure=True,
        optional=True,
        after="mfu",
        drop=4,
        note="routing = a mixture of experts' balance: tokens routed to the busiest expert over the mean, over the "
        "timed steps of every rank and all layers (1.00× = even; record.workload.routing has each layer's): under "
        "expert parallelism the rank holding the busiest expert sets the step's time.",
        caption="routing: tokens of the busiest expert over the mean (1.00× = even).",
    ),
    Column(
        "bubble",
        "bubble",
        lambda c, g: fmt_bubble(c),
        figure=True,
        optional=True,
        after="mfu",
        drop=4,
        note="bubble = the pipeline's measured idle fraction of a step (bubble plus unhidden communication), "
        "with the schedule's analytical (p-1)/(v m + p-1) beside it.",
    ),
    Column("bubble_analytical", figure=True),
    Column(
        "usd_per_mtok",
        "$/M tokens",
        lambda c, g: fmt_significant(c.spread("usd_per_mtok")),
        figure=True,
        optional=True,
        after="mfu",
        drop=4,
        note="$/M tokens, $/run = --prices: the run's devices x $ per device-hour, plus with kwh its energy x $ per "
        "kWh (its devices' counters; a node's counters apportioned over its ranks); per million tokens over the "
        "steady epochs, per run over its timed epochs. Unknown (-) where kwh is priced and the run's energy is not.",
    ),
    Column(
        "usd_per_run",
        "$/run",
        lambda c, g: fmt_significant(c.spread("usd_per_run")),
        figure=True,
        optional=True,
        after="mfu",
        drop=3,
    ),
    Column("compile_s", "compile s", lambda c, g: fmt_compile(c), figure=True, drop=2),
    Column("warmup_s", figure=True),
    Column("speed", "speed ×", fmt_vs_baseline),
    Column("memory_ratio", "memory ×", lambda c, g: fmt_memory_ratio(c), drop=5),
    Column("noise", "beyond noise?", lambda c, g: fmt_noise(c), align="left", wrap=12),
    Column("vs_system", "vs baseline system", fmt_vs_system, axis_only=True, systems_only=True),
    Column("scaling", "scaling", lambda c, g: fmt_scaling(c), drop=1),
)

FIGURES: tuple[Column, ...] = tuple(c for c in REGISTRY if c.figure)


def column(name: str) -> Column:
    """The registry's column called ``name``."""
    return next(c for c in REGISTRY if c.name == name)


def shown(comparison: Comparison) -> list[Column]:
    """The text columns ``comparison`` shows, in table order: registry order, each ``after`` column moved right
    after the one it names (several after the same one keep registry order)."""
    out = [c for c in REGISTRY if c.after is None and c.shown_in(comparison)]
    for c in reversed(REGISTRY):
        if c.after is not None and c.shown_in(comparison):
            out.insert(next(i for i, o in enumerate(out) if o.name == c.after) + 1, c)
    return out


def headers(columns: Sequence[Column], comparison: Comparison) -> list[str]:
    return [c.title(comparison) for c in columns]


def drop_order(columns: Sequence[Column], comparison: Comparison) -> list[str]:
    """The headers a narrow terminal leaves out, first to last."""
    droppable = sorted((c for c in columns if c.drop is not None), key=lambda c: c.drop or 0)
    return [c.title(comparison) for c in droppable]


def notes(comparison: Comparison) -> list[str]:
    """The notes of the shown columns that have one."""
    return [c.note for c in REGISTRY if c.note and c.shown_in(comparison)]


def captions(comparison: Comparison) -> list[str]:
    """The report captions of the shown columns that have one."""
    return [c.caption for c in REGISTRY if c.caption and c.shown_in(comparison)]


def figure_csv(cell: Cell) -> dict[str, Any]:
    """A cell's figures as flat CSV fields, in registry order."""
    out: dict[str, Any] = {}
    for c in FIGURES:
        out.update(c.csv(c.name, cell.spread(c.name)))
    return out


def figure_json(cell: Cell) -> dict[str, Any]:
    """A cell's figures as JSON: each its spread (median, range, count, values) or null, in registry order."""
    out: dict[str, Any] = {}
    for c in FIGURES:
        spread = cell.spread(c.name)
        out[c.name] = spread.as_dict() if spread else None
    return out
