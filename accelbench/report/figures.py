"""The report's views, one function each: the seed study's figures (seeds/000, the Turing report) and table 5,
the ``--vs`` view along any workload field, and energy per sample. Each view draws only where the records hold
its data and returns no figure otherwise."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from accelbench.compare import Comparison, Spread
from accelbench.compare.keys import format_value
from accelbench.display import fmt_bytes
from accelbench.precision import PRECISIONS
from accelbench.report.drawing import (
    ReportFigure,
    bars,
    legend_outside,
    log2_devices,
    mark_failures,
    new_figure,
    short_failure,
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


def _precision_bars(
    group: list[Entry],
    systems: Sequence[str],
    metric: Callable[[Entry], float | None],
    whiskers: Callable[[Entry], Spread | None],
    ylabel: str,
) -> Any:
    """Bars of ``metric`` per system (and device count) x precision, one panel per batch size."""
    several = len({e.cell.devices for e in group}) > 1
    batches = sorted({e.key.batch_size for e in group})
    places = list(
        dict.fromkeys(
            _place(e, several)
            for s in systems
            for e in sorted(group, key=lambda e: e.cell.devices)
            if e.cell.system == s
        )
    )
    precisions = sorted({e.key.precision for e in group}, key=_precision_order)
    fig = new_figure(ncols=len(batches), width=max(3.4, 1.2 * len(places) + 1.5))
    axes = fig.subplots(1, len(batches), squeeze=False)[0]
    for ax, batch in zip(axes, batches, strict=True):
        cells = {(_place(e, several), e.key.precision): e for e in group if e.key.batch_size == batch}
        bars(ax, places, precisions, cells, metric, ylabel, whiskers)
        ax.set_title(f"batch {batch}")
    legend_outside(axes[-1], "precision")
    return fig


def epoch_time_figures(items: list[Entry], systems: Sequence[str]) -> list[ReportFigure]:
    """Seed figure 2: average epoch time per system x precision, one panel per batch size, on one device with
    the plain loop or DDP (as the study ran it). Other strategies are the strategy view's."""
    single = [e for e in items if e.cell.devices == 1 and e.key.strategy in SINGLE_DEVICE_STRATEGIES]
    figures = []
    for _, group in group_by(single, lambda e: without(e.key, "precision", "batch_size")).items():
        if sum(e.epoch_s is not None for e in group) < 2:
            continue  # one bar compares nothing; the comparison table has it
        fig = _precision_bars(group, systems, _epoch, _epoch_spread, "steady epoch time (s)")
        key = group[0].key
        figures.append(
            ReportFigure(
                f"Epoch time: {key.workload} {key.model}, {key.strategy}",
                f"{caption(key, 'precision', 'batch_size')}; one device. Bars: median steady epoch; "
                "whiskers: min..max over the steady epochs of every run.",
                fig,
            )
        )
    return figures


def energy_figures(items: list[Entry], systems: Sequence[str]) -> list[ReportFigure]:
    """Energy per sample per system x precision, one panel per batch size, where the devices' energy counters
    were read (a figure without a reading is never estimated)."""
    known = [e for e in items if e.joules_per_sample is not None]
    figures = []
    for _, group in group_by(known, lambda e: without(e.key, "precision", "batch_size")).items():
        fig = _precision_bars(group, systems, _energy, _energy_spread, "energy per sample (J)")
        key = group[0].key
        figures.append(
            ReportFigure(
                f"Energy per sample: {key.workload} {key.model}, {key.strategy}",
                f"{caption(key, 'precision', 'batch_size')}. Bars: median over the steady epochs of joules per "
                "sample from the devices' own energy counters; whiskers: min..max.",
                fig,
            )
        )
    return figures


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
            time_ax.plot(devices, [e.epoch_s for e in measured], marker="o", label=f"batch {batch}")
            base = measured[0]
            speed = [e.cell.samples_per_s.median / base.cell.samples_per_s.median for e in measured]  # type: ignore[union-attr]
            speed_ax.plot(devices, speed, marker="o", label=f"batch {batch}")
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
            compile_ax.plot(devices, [e.cell.compile_s.median for e in series], marker="o", label=strategy)  # type: ignore[union-attr]
            time_ax.plot(devices, [e.epoch_s for e in series], marker="o", label=strategy)
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
