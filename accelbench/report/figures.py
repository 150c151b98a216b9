"""The report's views, one function each: the seed study's figures (seeds/000, the Turing report) and table 5,
seed 004's throughput against batch size and epoch 1 against epoch 2, the ``--vs`` view along any workload field,
and energy per sample. Each view draws only where the records hold
its data and returns no figure otherwise."""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from accelbench.compare import Comparison, Spread
from accelbench.compare.keys import format_value
from accelbench.contract import PRECISIONS
from accelbench.contract.strategies import Strategy
from accelbench.display import fmt_bytes
from accelbench.report.drawing import (
    ReportFigure,
    bars,
    batch_colour,
    legend_outside,
    log2_devices,
    mark_failures,
    new_figure,
    short_failure,
    system_linestyle,
    wrap,
)
from accelbench.report.entries import (
    SINGLE_DEVICE_STRATEGIES,
    Entry,
    caption,
    group_by,
    models_in_order,
    without,
)
from accelbench.report.facets import Panel, faceted, titles_apart
from accelbench.report.palette import colour

if TYPE_CHECKING:
    from matplotlib.axes import Axes


def _epoch(e: Entry) -> float | None:
    return e.epoch_s


def _epoch_spread(e: Entry) -> Spread | None:
    return e.cell.epoch_s


def _memory(e: Entry) -> float | None:
    return e.memory_gib


def _energy(e: Entry) -> float | None:
    return e.joules_per_sample


def _energy_spread(e: Entry) -> Spread | None:
    return e.cell.joules_per_sample


def _precision_order(name: str) -> int:
    return PRECISIONS.index(name) if name in PRECISIONS else len(PRECISIONS)


def _place(e: Entry, several_counts: bool) -> str:
    """A bar group's label: the system, with its device count when the figure has several."""
    return f"{e.cell.system} x{e.cell.devices}" if several_counts else e.cell.system


def _bars_panel(
    ax: Axes,
    group: list[Entry],
    systems: Sequence[str],
    series: Sequence[str],
    series_of: Callable[[Entry], str],
    metric: Callable[[Entry], float | None],
    whiskers: Callable[[Entry], Spread | None] | None,
    ylabel: str,
) -> None:
    """One panel: bars of ``metric`` per system (and device count), one bar per series (a precision, a phase)."""
    several = len({e.cell.devices for e in group}) > 1
    ordered = sorted(group, key=lambda e: e.cell.devices)
    places = list(dict.fromkeys(_place(e, several) for s in systems for e in ordered if e.cell.system == s))
    cells = {(_place(e, several), series_of(e)): e for e in group}
    bars(ax, places, series, cells, metric, ylabel, whiskers)


def _precision_panels(
    items: list[Entry],
    systems: Sequence[str],
    metric: Callable[[Entry], float | None],
    whiskers: Callable[[Entry], Spread | None],
    ylabel: str,
) -> tuple[list[Panel], str]:
    """Small multiples of ``metric`` per system x precision: a panel per workload and batch size, titled with what
    sets it apart; and what every panel shares."""
    panels = group_by(items, lambda e: e.key.without("precision"))
    # a workload none of whose runs has the figure (runs interrupted before a steady epoch) gets no empty panel:
    # the comparison table says why each has none
    groups = [g for g in panels.values() if any(metric(e) is not None for e in g)]
    titles, common = titles_apart([g[0].key.describe("precision") for g in groups])
    out = []
    for group, title in zip(groups, titles, strict=True):
        precisions = sorted({e.key.precision for e in group}, key=_precision_order)
        draw = functools.partial(
            _bars_panel,
            group=group,
            systems=systems,
            series=precisions,
            series_of=lambda e: e.key.precision,
            metric=metric,
            whiskers=whiskers,
            ylabel=ylabel,
        )
        out.append(Panel(title, draw))
    return out, common


def epoch_time_figures(items: list[Entry], systems: Sequence[str]) -> list[ReportFigure]:
    """Seed figure 2: steady epoch time per system x precision, on one device with the plain loop or DDP (as the
    study ran it), as small multiples: one panel per workload and batch size. Other strategies are the strategy
    view's."""
    single = [e for e in items if e.cell.devices == 1 and e.key.strategy in SINGLE_DEVICE_STRATEGIES]
    panels, common = _precision_panels(single, systems, _epoch, _epoch_spread, "steady epoch time (s)")
    return [
        ReportFigure(
            f"Epoch time per system and precision{part}",
            (f"All panels: {common}; one device. " if common else "One device. ")
            + "A panel per workload and batch size; bars: median steady epoch, whiskers: min..max over the steady "
            "epochs of every run (lower is faster).",
            fig,
        )
        for fig, part in faceted(panels, "precision")
    ]


def energy_figures(items: list[Entry], systems: Sequence[str]) -> list[ReportFigure]:
    """Energy per sample per system x precision, a panel per workload and batch size, where the devices' energy
    counters were read (a figure without a reading is never estimated)."""
    known = [e for e in items if e.joules_per_sample is not None]
    panels, common = _precision_panels(known, systems, _energy, _energy_spread, "energy per sample (J)")
    return [
        ReportFigure(
            f"Energy per sample per system and precision{part}",
            (f"All panels: {common}. " if common else "")
            + "Bars: median over the steady epochs of joules per sample from the devices' own energy counters; "
            "whiskers: min..max.",
            fig,
        )
        for fig, part in faceted(panels, "precision")
    ]


def axis_figures(comparison: Comparison) -> list[ReportFigure]:
    """``--vs AXIS``: figure 2 along any workload field. For each workload, bars of the steady epoch time per value
    of the axis side by side for each system, and each value's speedup over the baseline value on that system
    (and energy per sample where known)."""
    axis = comparison.axis
    if axis is None:
        return []
    figures = []
    for group in comparison.groups:
        if len(group.values) < 2:
            continue  # nothing varies along the axis here; the comparison table has it
        several = len({c.devices for c in group.cells}) > 1
        items = [Entry(c.key or group.key, c) for c in group.cells]
        places = list(dict.fromkeys(_place(e, several) for e in items))
        values = [format_value(v, axis) for v in group.values]
        cells = {(_place(e, several), format_value(e.cell.value, axis)): e for e in items}

        def speedup(e: Entry, base: Any = group.baseline_value) -> float | None:
            if e.cell.baseline is not None:
                return e.cell.baseline.speedup
            return 1.0 if e.cell.value == base and e.epoch_s is not None else None

        energy = any(e.joules_per_sample is not None for e in items)
        fig = new_figure(ncols=3 if energy else 2, width=max(3.6, 1.1 * len(places) + 1.8))
        panels = fig.subplots(1, 3 if energy else 2, squeeze=False)[0]
        bars(panels[0], places, values, cells, _epoch, "steady epoch time (s)", _epoch_spread)
        shown = format_value(group.baseline_value, axis)
        bars(panels[1], places, values, cells, speedup, f"speedup vs {axis} {shown}")
        panels[1].axhline(1.0, color="k", linewidth=0.8, linestyle="--")
        if energy:
            bars(panels[2], places, values, cells, _energy, "energy per sample (J)", _energy_spread)
        legend_outside(panels[-1], axis)
        key = group.key
        name = (
            key.workload
            if axis == "model"
            else key.model
            if axis == "workload"
            else f"{key.workload} {key.model}"
        )
        figures.append(
            ReportFigure(
                f"Epoch time by {axis}: {name}, {key.strategy if axis != 'strategy' else 'per strategy'}",
                f"{group.describe()}. Bars: median steady epoch; whiskers: min..max over the steady epochs of every "
                f"run. Speedup: epoch time at {axis} {shown} over this epoch time on the same system (>1 is faster).",
                fig,
            )
        )
    return figures


def scaling_figures(items: list[Entry]) -> list[ReportFigure]:
    """Seed figure 3: epoch time and throughput speedup against the device count, one line per batch size."""
    figures = []
    for (_, system), group in group_by(
        items, lambda e: (without(e.key, "batch_size"), e.cell.system)
    ).items():
        if len({e.cell.devices for e in group}) < 2:
            continue
        fig = new_figure(ncols=2)
        time_ax, speed_ax = fig.subplots(1, 2)
        for batch, series in sorted(group_by(group, lambda e: e.key.batch_size).items()):
            series.sort(key=lambda e: e.cell.devices)
            measured = [e for e in series if e.epoch_s is not None]
            if not measured:
                continue
            devices = [e.cell.devices for e in measured]
            time_ax.plot(
                devices,
                [e.epoch_s for e in measured],
                marker="o",
                label=f"batch {batch}",
                color=batch_colour(batch),
            )
            base = measured[0]
            speed = [e.cell.samples_per_s.median / base.cell.samples_per_s.median for e in measured]  # type: ignore[union-attr]
            speed_ax.plot(devices, speed, marker="o", label=f"batch {batch}", color=batch_colour(batch))
            failed = [e for e in series if e.epoch_s is None]
            mark_failures(
                time_ax,
                [e.cell.devices for e in failed],
                [short_failure(e.cell.failure() or "") for e in failed],
            )
        all_devices = sorted({e.cell.devices for e in group})
        first = all_devices[0]
        speed_ax.plot(all_devices, [d / first for d in all_devices], "k--", linewidth=0.8, label="ideal")
        for ax in (time_ax, speed_ax):
            log2_devices(ax, all_devices)
        time_ax.set_ylabel("steady epoch time (s)")
        time_ax.set_ylim(bottom=0)
        speed_ax.set_ylim(bottom=0)
        speed_ax.set_ylabel(f"throughput speedup vs {first} device(s)")
        legend_outside(speed_ax)
        key = group[0].key
        figures.append(
            ReportFigure(
                f"Scaling: {key.model} {key.precision} {key.strategy} on {system}",
                f"{caption(key, 'batch_size')}. Speedup = samples/s over samples/s at the smallest device count "
                "(global throughput: all ranks' samples over the slowest rank's time).",
                fig,
            )
        )
    return figures


def memory_by_batch_figures(items: list[Entry]) -> list[ReportFigure]:
    """Seed figure 4: peak memory against batch size, one line per system, device count and precision."""
    figures = []
    for _, group in group_by(items, lambda e: without(e.key, "batch_size", "precision")).items():
        if len({e.key.batch_size for e in group}) < 2:
            continue
        fig = new_figure(width=6)
        ax = fig.subplots()
        lines = group_by(group, lambda e: (e.cell.system, e.cell.devices, e.key.precision))
        for (system, devices, precision), series in lines.items():
            measured = sorted((e.key.batch_size, m) for e in series if (m := e.memory_gib) is not None)
            if measured:
                ax.plot(
                    [batch for batch, _ in measured],
                    [gib for _, gib in measured],
                    marker="o",
                    label=wrap(f"{system} x{devices} {precision}", 40),
                    color=colour(precision),  # the precision's colour; systems apart by line style
                    linestyle=system_linestyle(system),
                )
            failed = [e for e in series if e.memory_gib is None]
            mark_failures(
                ax,
                [e.key.batch_size for e in failed],
                [short_failure(e.cell.failure() or "") for e in failed],
            )
        ax.set_xscale("log", base=2)
        batches = sorted({e.key.batch_size for e in group})
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.set_xlabel("batch size (per device)")
        ax.set_ylabel("peak memory (GiB)")
        ax.set_ylim(bottom=0)
        legend_outside(ax)
        key = group[0].key
        figures.append(
            ReportFigure(
                f"Peak memory against batch size: {key.model} {key.strategy}",
                caption(key, "batch_size", "precision"),
                fig,
            )
        )
    return figures


def memory_by_model_figures(items: list[Entry]) -> list[ReportFigure]:
    """Seed figure 6 (a) and table 5: peak memory against model size; runs out of memory marked."""
    figures = []
    for _, group in group_by(items, lambda e: without(e.key, "model")).items():
        models = models_in_order(group)
        if len(models) < 2:
            continue
        fig = new_figure(width=max(5.0, 0.8 * len(models) + 2))
        ax = fig.subplots()
        for (system, devices), series in group_by(group, lambda e: (e.cell.system, e.cell.devices)).items():
            by_model = {e.key.model: e for e in series}
            points = [
                (i, gib)
                for i, m in enumerate(models)
                if m in by_model and (gib := by_model[m].memory_gib) is not None
            ]
            line = ax.plot(
                [i for i, _ in points],
                [gib for _, gib in points],
                marker="o",
                label=wrap(f"{system} x{devices}", 40),
                color=colour(system),
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
                mark_failures(ax, oom, ["OOM"] * len(oom))
        ax.set_xticks(range(len(models)), [wrap(m, 14) for m in models], fontsize=8)
        ax.set_xlabel("model (by size)")
        ax.set_ylabel("peak memory (GiB)")
        ax.set_ylim(bottom=0)
        legend_outside(ax)
        key = group[0].key
        figures.append(
            ReportFigure(
                f"Peak memory against model size: {key.precision} {key.strategy} batch {key.batch_size}",
                caption(key, "model"),
                fig,
            )
        )
    return figures


def strategy_figures(items: list[Entry]) -> list[ReportFigure]:
    """Seed figure 6: peak memory and epoch time per strategy across model sizes, one figure per device count."""
    figures = []
    keyed = group_by(items, lambda e: (without(e.key, "model", "strategy"), e.cell.system, e.cell.devices))
    for (_, system, devices), group in keyed.items():
        strategies = list(dict.fromkeys(e.key.strategy for e in group))
        if len(strategies) < 2:
            continue
        models = models_in_order(group)
        cells = {(e.key.model, e.key.strategy): e for e in group}
        fig = new_figure(ncols=2, width=max(4.5, 0.9 * len(models) + 2))
        mem_ax, time_ax = fig.subplots(1, 2)
        bars(mem_ax, models, strategies, cells, _memory, "peak memory (GiB)")
        bars(time_ax, models, strategies, cells, _epoch, "steady epoch time (s)", _epoch_spread)
        legend_outside(time_ax, "strategy")
        key = group[0].key
        figures.append(
            ReportFigure(
                f"Strategies on {devices} device(s): {system}",
                f"{caption(key, 'model', 'strategy')}. OOM: the model did not fit with that strategy.",
                fig,
            )
        )
    return figures


def compile_figures(items: list[Entry]) -> list[ReportFigure]:
    """Seed figure 8: compile time and epoch time per strategy against the device count (IPUs, or any compile)."""
    compiled = [e for e in items if e.cell.compile_s is not None]
    figures = []
    for (_, system), group in group_by(
        compiled, lambda e: (without(e.key, "strategy"), e.cell.system)
    ).items():
        fig = new_figure(ncols=2)
        compile_ax, time_ax = fig.subplots(1, 2)
        for strategy, series in group_by(group, lambda e: e.key.strategy).items():
            series.sort(key=lambda e: e.cell.devices)
            devices = [e.cell.devices for e in series]
            compile_s = [e.cell.compile_s.median for e in series]  # type: ignore[union-attr]
            compile_ax.plot(devices, compile_s, marker="o", label=strategy, color=colour(strategy))
            time_ax.plot(
                devices, [e.epoch_s for e in series], marker="o", label=strategy, color=colour(strategy)
            )
        all_devices = sorted({e.cell.devices for e in group})
        for ax in (compile_ax, time_ax):
            log2_devices(ax, all_devices)
        compile_ax.set_ylabel("compile time (s)")
        time_ax.set_ylabel("steady epoch time (s)")
        compile_ax.set_ylim(bottom=0)
        time_ax.set_ylim(bottom=0)
        legend_outside(time_ax, "strategy")
        key = group[0].key
        figures.append(
            ReportFigure(
                f"Compile time and epoch time per strategy: {key.model} on {system}",
                f"{caption(key, 'strategy')}. Compile: the executor's compile step, timed apart from the epochs.",
                fig,
            )
        )
    return figures


def throughput_by_batch_figures(items: list[Entry]) -> list[ReportFigure]:
    """Seed 004, tables 3 and 4: steady throughput against batch size, one line per system and device count, so
    where each system peaks shows (IPUs at small batches, GPUs at large ones). Any workload."""
    figures = []
    for _, group in group_by(items, lambda e: without(e.key, "batch_size")).items():
        if len({e.key.batch_size for e in group}) < 2:
            continue
        fig = new_figure(width=6)
        ax = fig.subplots()
        for (system, devices), series in group_by(group, lambda e: (e.cell.system, e.cell.devices)).items():
            measured = sorted(
                (e.key.batch_size, rate.median) for e in series if (rate := e.cell.samples_per_s) is not None
            )
            if measured:
                ax.plot(
                    [batch for batch, _ in measured],
                    [rate for _, rate in measured],
                    marker="o",
                    label=wrap(f"{system} x{devices}", 40),
                    color=colour(system),
                )
            failed = [e for e in series if e.cell.samples_per_s is None]
            mark_failures(
                ax,
                [e.key.batch_size for e in failed],
                [short_failure(e.cell.failure() or "") for e in failed],
            )
        batches = sorted({e.key.batch_size for e in group})
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.set_xlabel("batch size (per device)")
        ax.set_ylabel("throughput (samples/s)")
        ax.set_ylim(bottom=0)
        legend_outside(ax)
        key = group[0].key
        figures.append(
            ReportFigure(
                f"Throughput against batch size: {key.workload} {key.model} {key.precision} {key.strategy}",
                f"{caption(key, 'batch_size')}. Median samples/s over the steady epochs (all devices together).",
                fig,
            )
        )
    return figures


def warmup_samples_per_s(e: Entry) -> float | None:
    """Epoch 1's throughput: an epoch's samples (every epoch of a run takes the same steps) over epoch 1's time,
    the median over the cell's runs; None without a steady epoch to count the samples from."""
    rates = [
        f.samples_per_s[0] * f.epoch_s[0] / f.warmup_s
        for r in e.cell.ok_runs
        if (f := r.figures) is not None and f.warmup_s and f.samples_per_s and f.epoch_s
    ]
    return statistics.median(rates) if rates else None


@dataclass(frozen=True)
class _Phase(Entry):
    """A cell seen as one of its phases: epoch 1 (the warm-up) or the steady epochs."""

    warmup: bool = False


_EPOCH1, _STEADY = "epoch 1 (warm-up)", "steady epochs"


def _phase_rate(e: Entry) -> float | None:
    if isinstance(e, _Phase) and e.warmup:
        return warmup_samples_per_s(e)
    return e.cell.samples_per_s.median if e.cell.samples_per_s else None


def warmup_figures(items: list[Entry], systems: Sequence[str]) -> list[ReportFigure]:
    """Seed 004, table 1: the throughput of epoch 1 (graph compilation, worker start-up, lazy initialisation)
    beside the steady epochs', per system and device count: a panel per workload and batch size. Any workload."""
    known = [e for e in items if warmup_samples_per_s(e) is not None]
    groups = list(group_by(known, lambda e: e.key).values())
    titles, common = titles_apart([g[0].key.describe() for g in groups])
    panels = []
    for group, title in zip(groups, titles, strict=True):
        phases: list[Entry] = [
            e2 for e in group for e2 in (_Phase(e.key, e.cell, warmup=True), _Phase(e.key, e.cell))
        ]
        draw = functools.partial(
            _bars_panel,
            group=phases,
            systems=systems,
            series=[_EPOCH1, _STEADY],
            series_of=lambda e: _EPOCH1 if isinstance(e, _Phase) and e.warmup else _STEADY,
            metric=_phase_rate,
            whiskers=None,
            ylabel="throughput (samples/s)",
        )
        panels.append(Panel(title, draw))
    return [
        ReportFigure(
            f"Epoch 1 against the steady epochs{part}",
            (f"All panels: {common}. " if common else "")
            + "Epoch 1 includes what happens once (compilation by graph compilers, data-loader start-up, allocator "
            "warm-up); a compile step accelbench runs before epoch 1 is timed apart. Bars: median samples/s.",
            fig,
        )
        for fig, part in faceted(panels, None)
    ]


def largest_fit_tables(items: list[Entry]) -> list[tuple[str, list[list[str]]]]:
    """Seed table 5: per series of growing models that met an out-of-memory, what fitted and at what cost."""
    tables = []
    keyed = group_by(items, lambda e: (without(e.key, "model"), e.cell.system, e.cell.devices))
    for (_, system, devices), group in keyed.items():
        if not any(e.out_of_memory for e in group) or len({e.key.model for e in group}) < 2:
            continue
        rows = []
        by_model = {e.key.model: e for e in group}
        for model in models_in_order(group):
            e = by_model[model]
            if e.out_of_memory:
                rows.append([model, "out of memory", "-"])
            elif e.epoch_s is not None:
                memory = e.cell.peak_memory_bytes
                rows.append([model, fmt_bytes(memory.median) if memory else "unknown", f"{e.epoch_s:.3f}"])
            else:
                rows.append([model, e.cell.failure() or "-", "-"])
        title = f"{system} x{devices} · {caption(group[0].key, 'model')}"
        tables.append((title, rows))
    return tables


# --------------------------------------------------------------------------------------------------------------
# Tensor, pipeline and composed parallelism (seed 003, figures 13-15; seed 001's model-parallel experiments)
# --------------------------------------------------------------------------------------------------------------

_MESH_FIELDS = ("mesh", "strategy", "batch_size", "pp_schedule", "microbatches")


def mesh_label(e: Entry) -> str | None:
    """A run's layout as the figures' x axis names it: its mesh (``tp=2,pp=2``), or data parallelism alone over
    its devices (``fsdp=4``); None for other runs."""
    if e.key.mesh is not None:
        return e.key.mesh
    if e.key.strategy in (Strategy.DDP, Strategy.FSDP) and e.cell.devices > 1:
        return f"{e.key.strategy}={e.cell.devices}"
    return None


def _mesh_sizes(label: str) -> dict[str, int]:
    """A mesh label's sizes by generic axis (dp, tp, pp), the axes larger than 1."""
    from accelbench.parallel_dims import ParallelDims

    return ParallelDims.from_mesh(label.split(" ")[0]).sizes


def _mesh_order(label: str) -> tuple[int, int, int, str]:
    sizes = _mesh_sizes(label)
    return (sizes.get("tp", 1), sizes.get("dp", 1), sizes.get("pp", 1), label)


def _data_parallel_kind(e: Entry) -> str | None:
    """What runs on the data axis (``fsdp``, ``ddp``), where there is one."""
    axis = str(mesh_label(e)).split(" ")[0].split(",")[0].split("=")[0]
    return axis if axis in (Strategy.FSDP, Strategy.DDP) else None


def _tflops(e: Entry) -> float | None:
    spread = e.cell.megatron_tflops_per_device
    return spread.median if spread else None


# the seed's figures: the pair of axes each varies (13: tensor and pipeline, 14: data and pipeline, 15: tensor
# and data); meshes with all three axes get a figure of their own
_AXIS_PAIRS = (("tp", "pp"), ("dp", "pp"), ("tp", "dp"))
_AXIS_NAMES = {"tp": "tensor-parallel", "dp": "data-parallel", "pp": "pipeline-parallel"}


def mesh_figures(items: list[Entry]) -> list[ReportFigure]:
    """Seed 003, figures 13-15: achieved TFLOP/s per device (Megatron's FLOPs count) against the mesh shape at a
    fixed device count, per pair of axes (tensor and pipeline, data and pipeline, tensor and data), one line per
    global batch (and pipeline schedule where several ran), per system and device count. A mesh of one axis sits
    in each figure with that axis (pp=4 is (tp, pp) = (1, 4)); data parallelism alone stands for dp."""
    known = [e for e in items if mesh_label(e) is not None and e.cell.runs]
    figures = []
    groups = group_by(known, lambda e: (without(e.key, *_MESH_FIELDS), e.cell.system, e.cell.devices))
    for (_, system, devices), group in groups.items():
        if not any(_tflops(e) is not None for e in group):
            continue
        sizes = {id(e): _mesh_sizes(str(mesh_label(e))) for e in group}
        panels: list[tuple[tuple[str, ...], list[Entry]]] = []
        for pair in _AXIS_PAIRS:
            members = [e for e in group if set(sizes[id(e)]) <= set(pair)]
            if len({tuple(sizes[id(e)].get(a, 1) for a in pair) for e in members}) > 1:
                panels.append((pair, members))
        full = [e for e in group if len(sizes[id(e)]) == 3]
        if full:
            panels.append((("tp", "dp", "pp"), group))
        for axes, members in panels:
            figures.append(_mesh_figure(axes, members, sizes, system, devices))
    return figures


def _mesh_figure(
    axes: tuple[str, ...], group: list[Entry], sizes: dict[int, dict[str, int]], system: str, devices: int
) -> ReportFigure:
    """One of :func:`mesh_figures`: TFLOP/s per device against the sizes of ``axes``."""

    def shape(e: Entry) -> tuple[int, ...]:
        return tuple(sizes[id(e)].get(axis, 1) for axis in axes)

    shapes = sorted({shape(e) for e in group})
    schedules = {e.key.pp_schedule for e in group if e.key.pp_schedule}
    kinds = {kind for e in group if (kind := _data_parallel_kind(e))}

    def line(e: Entry) -> tuple[int, str]:
        batch = e.key.batch_size * sizes[id(e)].get("dp", 1)
        parts = [
            e.key.pp_schedule if len(schedules) > 1 else None,
            _data_parallel_kind(e) if len(kinds) > 1 else None,
        ]
        return batch, ", ".join(p for p in parts if p)

    fig = new_figure(width=max(5.0, 0.9 * len(shapes) + 2.5))
    ax = fig.subplots()
    for (batch, schedule), series in sorted(group_by(group, line).items()):
        by_shape = {shape(e): e for e in series}
        points = [(i, y) for i, sh in enumerate(shapes) if sh in by_shape and (y := _tflops(by_shape[sh]))]
        name = f"batch {batch}" + (f", {schedule}" if schedule else "")
        if points:
            ax.plot([i for i, _ in points], [y for _, y in points], marker="o", label=name)
        failed = [
            (i, by_shape[sh])
            for i, sh in enumerate(shapes)
            if sh in by_shape and _tflops(by_shape[sh]) is None
        ]
        mark_failures(ax, [i for i, _ in failed], [short_failure(e.cell.failure() or "") for _, e in failed])
    ax.set_xticks(range(len(shapes)), [f"({', '.join(map(str, sh))})" for sh in shapes], fontsize=8)
    ax.set_xlabel(f"({', '.join(_AXIS_NAMES[a] + ' size' for a in axes)})")
    ax.set_ylabel("achieved TFLOP/s per device")
    ax.set_ylim(bottom=0)
    legend_outside(ax, "global batch")
    key = group[0].key
    figures: dict[tuple[str, ...], str] = {
        ("tp", "pp"): "figure 13",
        ("dp", "pp"): "figure 14",
        ("tp", "dp"): "figure 15",
    }
    figure = figures.get(axes, "")
    return ReportFigure(
        f"TFLOP/s per device against the mesh ({', '.join(axes)}): {key.model} on {system} x{devices}",
        f"{caption(key, *_MESH_FIELDS)}. Seed 003{', ' + figure if figure else ''}: achieved TFLOP/s per device by "
        "Megatron's count, 72 B s l h^2 (1 + s/6h + V/12lh) FLOPs per iteration of B sequences, over devices and "
        "seconds (median over the steady epochs). Global batch = batch per replica x dp.",
        fig,
    )


@dataclass(frozen=True)
class _Bubble(Entry):
    """A pipeline cell seen as its measured or its analytical bubble."""

    analytical: bool = False


_MEASURED, _ANALYTICAL = "measured idle", "analytical (p-1)/(v m+p-1)"


def _bubble(e: Entry) -> float | None:
    spread = e.cell.bubble_analytical if isinstance(e, _Bubble) and e.analytical else e.cell.bubble
    return spread.median if spread else None


def bubble_figures(items: list[Entry]) -> list[ReportFigure]:
    """The pipeline bubble per layout (seed 003's "fraction of time idling due to pipeline flush"): each pipeline
    rank's measured idle fraction (the bubble plus communication not hidden by compute), averaged over the
    pipeline, beside the schedule's analytical bubble, per system and device count."""
    known = [e for e in items if e.cell.bubble is not None]
    figures = []
    groups = group_by(known, lambda e: (without(e.key, *_MESH_FIELDS), e.cell.system, e.cell.devices))
    for (_, system, devices), group in groups.items():

        def place(e: Entry) -> str:
            return f"{e.key.mesh}\n{e.key.pp_schedule}\nm={e.key.microbatches} b={e.key.batch_size}"

        ordered = sorted(group, key=lambda e: (_mesh_order(str(e.key.mesh)), place(e)))
        places = list(dict.fromkeys(place(e) for e in ordered))
        cells: dict[tuple[str, str], Entry] = {}
        for e in ordered:
            cells[(place(e), _MEASURED)] = _Bubble(e.key, e.cell, analytical=False)
            cells[(place(e), _ANALYTICAL)] = _Bubble(e.key, e.cell, analytical=True)
        fig = new_figure(width=max(5.0, 1.4 * len(places) + 2.5))
        ax = fig.subplots()
        bars(ax, places, [_MEASURED, _ANALYTICAL], cells, _bubble, "fraction of the step idle")
        ax.set_xticks(range(len(places)), places, fontsize=8)  # one line each: mesh, schedule, sizes
        ax.set_ylim(0, 1)
        legend_outside(ax)
        key = group[0].key
        figures.append(
            ReportFigure(
                f"Pipeline bubble: {key.model} on {system} x{devices}",
                f"{caption(key, *_MESH_FIELDS)}. Measured: per pipeline rank, 1 - (time in the schedule's forward "
                "and backward actions) / (step time) over the steps after the first, averaged over the pipeline's "
                "ranks; analytical: (p-1)/(v m + p-1) for p pipeline ranks, m microbatches, v stages per rank "
                "(none drawn for the zero-bubble schedules).",
                fig,
            )
        )
    return figures
