"""Terminal output: the live progress display and the end-of-run summary (rich)."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from accelbench.results import EpochMetrics, ResultRecord

_REFRESH_S = 0.25  # the display is updated at most this often, so a fast step loop pays ~100 ns per step


def progress_bar(console: Console, counted: str, transient: bool) -> Progress:
    """The one progress bar style (label, bar, done/total, a counted-unit or rate column, elapsed time) that runs
    and sweeps share; ``counted`` is a literal text or a ``{task.fields[...]}`` column."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(counted),
        TimeElapsedColumn(),
        console=console,
        transient=transient,
    )


class LiveProgress:
    """Epoch / step / rate on stderr. The per-step cost is one counter increment and one clock read."""

    def __init__(self, console: Console) -> None:
        self._progress = progress_bar(console, "{task.fields[rate]}", transient=False)
        self._task = TaskID(0)  # replaced by each epoch's task
        self._steps = 0
        self._reported = 0
        self._start = 0.0
        self._next = 0.0
        self._samples_per_step = 1
        self._progress.start()

    def start_epoch(self, epoch: int, epochs: int, steps: int, samples_per_step: int) -> None:
        label = f"epoch {epoch + 1}/{epochs}" + (" (warm-up)" if epoch == 0 and epochs > 1 else "")
        self._task = self._progress.add_task(label, total=steps, rate="")
        self._steps = self._reported = 0
        self._samples_per_step = samples_per_step
        self._start = time.perf_counter()
        self._next = self._start + _REFRESH_S

    def step(self) -> None:
        self._steps += 1
        now = time.perf_counter()
        if now >= self._next:
            self._next = now + _REFRESH_S
            rate = self._steps * self._samples_per_step / (now - self._start)
            self._progress.update(self._task, completed=self._steps, rate=f"~{rate:,.0f} samples/s")

    def end_epoch(self, metrics: EpochMetrics) -> None:
        loss = f", loss {metrics.loss:.3f}" if metrics.loss is not None else ""
        self._progress.update(
            self._task, completed=metrics.steps, rate=f"{metrics.samples_per_s:,.0f} samples/s{loss}"
        )

    def close(self) -> None:
        self._progress.stop()


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def summary_table(record: ResultRecord) -> Table:
    """The figures a reader wants first, from a result record."""
    c, m = record.config, record.metrics
    table = Table(
        title=f"accelbench: {c.workload}/{c.model} on {record.backend.info.name}", show_header=False
    )
    table.add_column(style="bold")
    table.add_column()
    table.add_row(
        "outcome", record.outcome.status + (f": {record.outcome.message}" if record.outcome.message else "")
    )
    table.add_row(
        "device",
        f"{record.backend.devices_used} x {record.backend.devices[0].name} "
        f"({record.backend.info.device_unit})",
    )
    if record.precision:
        table.add_row("precision", f"{record.precision.name} (matmul math: {record.precision.matmul_math})")
    options = ", ".join(
        f"{k} {v}" for k, v in c.workload_options.items() if k not in ("n_layer", "n_head", "n_embd")
    )
    table.add_row(
        "model",
        f"{record.workload.get('parameters', 0) / 1e6:.2f}M parameters, batch {c.batch_size}"
        + (f" ({options})" if options else ""),
    )
    if m is None:
        return table
    if m.compile_s is not None:
        table.add_row("compile", f"{m.compile_s:.2f} s")
    for e in m.epochs:
        label = "warm-up epoch" if e.epoch == 0 and len(m.epochs) > 1 else f"epoch {e.epoch + 1}"
        table.add_row(label, f"{e.wall_s:.3f} s, {e.samples_per_s:,.1f} samples/s, loss {e.loss:.4f}")
    if m.steady:
        s = m.steady
        table.add_row("steady epoch (median)", f"{s.epoch_s_median:.3f} s over {s.epochs} epoch(s)")
        table.add_row("throughput", f"{s.samples_per_s:,.1f} samples/s, {s.tokens_per_s:,.0f} tokens/s")
        table.add_row("achieved", f"{s.achieved_flops_per_s / 1e12:.4f} TFLOP/s ({m.flops_formula})")
        table.add_row(
            "MFU",
            f"{s.mfu:.1%} of {m.peak.source}"
            if s.mfu is not None and m.peak
            else "unknown (no peak figure; give --peak-tflops)",
        )
    elif m.epochs:
        table.add_row("steady state", "needs at least 2 epochs (the first is the warm-up)")
    if m.peak_memory_max_bytes is not None:
        source = f" ({m.memory.source})" if m.memory else ""
        table.add_row("peak memory", fmt_bytes(m.peak_memory_max_bytes) + source)
    if m.steady and m.steady.joules_per_sample is not None:
        table.add_row(
            "energy",
            f"{m.steady.joules_per_sample:.4g} J/sample, {m.steady.samples_per_joule:.4g} samples/J ({m.energy_source})",
        )
    return table
