"""Terminal output: the live progress display and the end-of-run summary (rich)."""

from __future__ import annotations

import time
from datetime import datetime
from typing import TYPE_CHECKING, Any, TextIO

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from accelbench.contract.strategies import Strategy
from accelbench.results import EpochMetrics, PredictionCheck, ResultRecord, check_prediction

if TYPE_CHECKING:
    from accelbench.contract import PrecisionPlan

_REFRESH_S = 0.25  # the display is updated at most this often, so a fast step loop pays ~100 ns per step


def progress_bar(console: Console, counted: str, transient: bool, auto_refresh: bool = True) -> Progress:
    """The one progress bar style (label, bar, done/total, a counted-unit or rate column, elapsed time) that runs
    and sweeps share; ``counted`` is a literal text or a ``{task.fields[...]}`` column. ``auto_refresh=False``:
    no refresh thread, the caller refreshes."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(counted),
        TimeElapsedColumn(),
        console=console,
        transient=transient,
        auto_refresh=auto_refresh,
    )


def fmt_duration(seconds: float) -> str:
    """``0:42``, ``12:05``, ``3:02:11``: a duration as a clock shows it."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def contention_text(metrics: EpochMetrics) -> str:
    """``contended: its threads waited 35% of the time for a core ...`` where the epoch's host was busy (as the run's
    host contention judges it, :func:`accelbench.engine.metrics.host_contention`), else ``""``: said the moment it
    is, in the progress, not only in the final summary."""
    from accelbench.engine.metrics import CONTENTION_THRESHOLD

    parts = []
    if (
        metrics.cpu_s is not None
        and metrics.cpu_wait_s is not None
        and metrics.cpu_s + metrics.cpu_wait_s > 0
    ):
        waiting = metrics.cpu_wait_s / (metrics.cpu_s + metrics.cpu_wait_s)
        if waiting >= CONTENTION_THRESHOLD:
            parts.append(f"its threads waited {waiting:.0%} of the time for a core")
    if metrics.steal is not None and metrics.steal >= CONTENTION_THRESHOLD:
        parts.append(f"the hypervisor took {metrics.steal:.0%} of the cores' time")
    if not parts:
        return ""
    return (
        f"contended: {' and '.join(parts)} (other work on this host): this epoch's time is longer and noisier "
        "than the device's; the record marks it, and --epochs auto waits for steady epochs"
    )


def fmt_left(seconds: float) -> str:
    """``about 40 s left``, ``about 12 min left``, ``about 1 h 05 min left``: what remains of a run, as a duration
    (a clock-like ``12:05`` reads as a time of day)."""
    seconds = max(0, round(seconds))
    if seconds < 90:
        return f"about {seconds} s left"
    minutes = round(seconds / 60)
    if minutes < 90:
        return f"about {minutes} min left"
    return f"about {minutes // 60} h {minutes % 60:02d} min left"


class RunClock:
    """Where a run stands and when it should end: the rate of the current epoch, and the remaining time from the
    last completed epoch's time (the current epoch's pace before one has completed)."""

    def __init__(self) -> None:
        self.epoch = self.expected = self.steps = self.done = 0
        self.samples_per_step = 1
        self.start = 0.0
        self.last_epoch_s: float | None = (
            None  # the latest completed epoch after the warm-up (or the warm-up)
        )

    def start_epoch(self, epoch: int, expected: int, steps: int, samples_per_step: int) -> None:
        self.epoch, self.expected, self.steps, self.done = epoch, expected, steps, 0
        self.samples_per_step = samples_per_step
        self.start = time.perf_counter()

    def label(self) -> str:
        warmup = " (warm-up)" if self.epoch == 1 and self.expected > 1 else ""
        return f"epoch {self.epoch}/{self.expected}{warmup}"

    def rate(self, now: float) -> float:
        return self.done * self.samples_per_step / max(now - self.start, 1e-9)

    def remaining_s(self, now: float) -> float | None:
        """Seconds until the run's expected last epoch ends; None before anything can be said."""
        if not self.done:
            return None
        elapsed = now - self.start
        this_epoch = elapsed / self.done * max(self.steps - self.done, 0)
        per_epoch = self.last_epoch_s if self.last_epoch_s is not None else elapsed / self.done * self.steps
        return this_epoch + per_epoch * max(self.expected - self.epoch, 0)

    def end_epoch(self, wall_s: float) -> None:
        if self.epoch > 1 or self.last_epoch_s is None:
            self.last_epoch_s = wall_s
        self.done = self.steps


def stamped(text: str) -> str:
    """A progress line as a log keeps it: ``[accelbench HH:MM:SS] TEXT``."""
    return f"[accelbench {datetime.now().strftime('%H:%M:%S')}] {text}"


class LiveProgress:
    """Epoch / step / rate / the run's ETA on a terminal. The per-step cost is one counter increment and one clock
    read."""

    def __init__(self, console: Console) -> None:
        # refreshed from the training loop itself, not by Rich's thread: a Ctrl-C or SIGTERM raised while the loop
        # holds the display's lock would otherwise leave that thread waiting for it, and closing the display hangs
        self._progress = progress_bar(console, "{task.fields[rate]}", transient=False, auto_refresh=False)
        self._task = TaskID(0)  # replaced by each epoch's task
        self._clock = RunClock()
        self._next = 0.0
        self._progress.start()

    def start_epoch(self, epoch: int, epochs: int, steps: int, samples_per_step: int) -> None:
        self._clock.start_epoch(epoch, epochs, steps, samples_per_step)
        self._task = self._progress.add_task(self._clock.label(), total=steps, rate="")
        self._progress.refresh()
        self._next = self._clock.start + _REFRESH_S

    def step(self) -> None:
        self._clock.done += 1
        now = time.perf_counter()
        if now >= self._next:
            self._next = now + _REFRESH_S
            eta = self._clock.remaining_s(now)
            self._progress.update(
                self._task,
                completed=self._clock.done,
                rate=f"~{self._clock.rate(now):,.0f} samples/s"
                + (f", {fmt_left(eta)}" if eta is not None else ""),
                refresh=True,
            )

    def end_epoch(self, metrics: EpochMetrics) -> None:
        self._clock.end_epoch(metrics.wall_s)
        loss = f", loss {metrics.loss:.3f}" if metrics.loss is not None else ""
        self._progress.update(
            self._task,
            completed=metrics.steps,
            rate=f"{metrics.samples_per_s:,.0f} samples/s{loss}",
            refresh=True,
        )
        busy = contention_text(metrics)
        if busy:
            self.note(f"epoch {self._clock.epoch}: {busy}")

    def close(self) -> None:
        self._progress.stop()

    def note(self, text: str) -> None:
        self._progress.console.print(stamped(text), markup=False, highlight=False)


class LogProgress:
    """Plain progress lines for output that is not a terminal (a Slurm or PBS batch log, ``| tee``): one line per
    epoch, and one every ``every_s`` seconds within a long epoch, each with the rate and the run's ETA."""

    def __init__(self, stream: TextIO, every_s: float = 30.0) -> None:
        self._stream = stream
        self._every = every_s
        self._clock = RunClock()
        self._next = 0.0

    def _line(self, text: str) -> None:
        self._stream.write(stamped(text) + "\n")
        self._stream.flush()

    def start_epoch(self, epoch: int, epochs: int, steps: int, samples_per_step: int) -> None:
        self._clock.start_epoch(epoch, epochs, steps, samples_per_step)
        self._next = self._clock.start + self._every
        if epoch == 1:
            self._line(f"training: {steps} steps of {samples_per_step} samples per epoch")

    def step(self) -> None:
        self._clock.done += 1
        now = time.perf_counter()
        if now >= self._next:
            self._next = now + self._every
            c = self._clock
            eta = c.remaining_s(now)
            self._line(
                f"{c.label()}: step {c.done}/{c.steps} ({c.done / max(c.steps, 1):.0%}), "
                f"{c.rate(now):,.1f} samples/s" + (f", {fmt_left(eta)}" if eta is not None else "")
            )

    def end_epoch(self, metrics: EpochMetrics) -> None:
        c = self._clock
        c.end_epoch(metrics.wall_s)
        left = (c.expected - c.epoch) * (c.last_epoch_s or 0.0)
        loss = f", loss {metrics.loss:.4f}" if metrics.loss is not None else ""
        ends = f"; {fmt_left(left)}" if c.expected > c.epoch else ""
        busy = contention_text(metrics)
        self._line(
            f"{c.label()} done: {metrics.wall_s:.3f} s, {metrics.samples_per_s:,.1f} samples/s{loss}{ends}"
            + (f"; {busy}" if busy else "")
        )

    def close(self) -> None:
        pass

    def note(self, text: str) -> None:
        self._line(text)


def short_formula(formula: str) -> str:
    """A FLOPs formula's short name: the text before its parenthesised source (the record keeps it whole)."""
    return formula.split(" (", 1)[0]


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def prediction_text(check: PredictionCheck) -> str:
    """``step 12.1 ms (measured 14.0 ms, -14%); peak 512 MiB (measured 540 MiB, -5%)``, and what is missing."""

    def part(
        name: str, predicted: float | None, measured: float | None, error: float | None, fmt: Any
    ) -> str:
        if predicted is None:
            return f"{name} unknown"
        seen = (
            f"measured {fmt(measured)}, {error:+.0%}"
            if measured is not None and error is not None
            else "not measured"
        )
        return f"{name} {fmt(predicted)} ({seen})"

    parts = [
        part(
            "step",
            check.predicted_step_s,
            check.measured_step_s,
            check.step_error,
            lambda s: f"{s * 1e3:.1f} ms",
        ),
        part(
            "tensor peak" if check.memory_basis == "tensors" else "peak",
            check.predicted_peak_bytes,
            check.measured_peak_bytes,
            check.memory_error,
            fmt_bytes,
        ),
    ]
    text = (
        "; ".join(parts)
        + " (accelbench estimate's model"
        + (f"; {check.error_band}" if check.error_band else "")
        + ")"
    )
    return text + (f"; {escape(check.note)}" if check.note else "")


def summary_table(record: ResultRecord) -> Table:
    """The figures a reader wants first, from a result record."""
    c, m = record.config, record.metrics
    table = Table(
        title=f"accelbench: {c.workload}/{c.model} on {record.backend.info.name}", show_header=False
    )
    table.add_column(style="bold")
    table.add_column()
    table.add_row(
        "outcome",
        record.outcome.status + (f": {escape(record.outcome.message)}" if record.outcome.message else ""),
    )
    table.add_row("device", f"{record.backend.devices_used} x {record.backend.devices[0].name}")
    if record.world_size > 1 or c.strategy != Strategy.SINGLE:
        nodes = f" on {record.nodes} nodes" if record.nodes > 1 else ""
        collective = f", {record.backend.collective_backend}" if record.backend.collective_backend else ""
        launcher = f", launched by {record.launcher}" if record.launcher != "none" else ""
        table.add_row(
            "strategy", f"{c.strategy} over {record.world_size} process(es){nodes}{collective}{launcher}"
        )
    if record.precision:
        table.add_row("precision", precision_in_words(record.precision))
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
        label = f"epoch {e.epoch}" + (" (warm-up)" if e.epoch == 1 and len(m.epochs) > 1 else "")
        loss = f", loss {e.loss:.4f}" if e.loss is not None else ""
        table.add_row(label, f"{e.wall_s:.3f} s, {e.samples_per_s:,.1f} samples/s{loss}")
    if m.steady:
        s = m.steady
        table.add_row("steady epoch (median)", f"{s.epoch_s_median:.3f} s over {s.epochs} epoch(s)")
        table.add_row("throughput", f"{s.samples_per_s:,.1f} samples/s, {s.tokens_per_s:,.0f} tokens/s")
        table.add_row(
            "achieved", f"{s.achieved_flops_per_s / 1e12:.4g} TFLOP/s ({short_formula(m.flops_formula)})"
        )
        if s.mfu is not None and m.peak:
            mfu_text = f"{s.mfu:.1%} of {m.peak.source}"
        elif s.mfu_error:
            mfu_text = f"[bold red]error[/]: {escape(s.mfu_error)}"
        else:
            mfu_text = "unknown (no peak figure; give --peak-tflops)"
        table.add_row("MFU", mfu_text)
    elif m.epochs:
        table.add_row("steady state", "needs at least 2 epochs (the first is the warm-up)")
    if record.profile is not None:
        prof = record.profile
        split = ", ".join(
            f"{name} {seconds / prof.step_s:.0%}"
            for name, seconds in prof.seconds.items()
            if seconds > 0.005 * prof.step_s
        )
        overlapped = (
            f"; {prof.overlapped_communication_s * 1e3:.1f} ms communication overlapped"
            if prof.overlapped_communication_s
            else ""
        )
        table.add_row(
            "step time split",
            f"{split} of {prof.step_s * 1e3:.1f} ms ({prof.steps} profiled steps{overlapped})",
        )
        top = ", ".join(f"{op.name.removeprefix('aten::')} {op.share:.0%}" for op in prof.top_operators[:5])
        table.add_row("top operators", top + (f"; trace: {prof.trace}" if prof.trace else ""))
        timeline = prof.device_timeline
        if timeline:  # CUDA/ROCm with the hta extra: Holistic Trace Analysis's reading of the same trace
            overlap = timeline.get("comm_comp_overlap_pct")
            table.add_row(
                "device timeline",
                f"idle {timeline['idle_fraction']:.0%}, compute {timeline['compute_fraction']:.0%}, non-compute "
                f"{timeline['non_compute_fraction']:.0%} of {timeline['span_s'] * 1e3:.1f} ms a step"
                + (f"; communication overlapped with compute {overlap:.0f}%" if overlap is not None else "")
                + " (Holistic Trace Analysis)",
            )
        elif prof.device_timeline_source and "not installed" in prof.device_timeline_source:
            table.add_row("device timeline", escape(prof.device_timeline_source))
    if m.epochs_decision:
        table.add_row("epochs", escape(m.epochs_decision))
    quality = record.quality
    if quality is not None:
        measured = [q for q in quality.epochs if q.val_loss is not None]
        table.add_row(
            "validation",
            ", ".join(f"{q.val_loss:.4f}" for q in measured)
            + f" (held-out loss per epoch; {sum(q.eval_s for q in quality.epochs):.2f} s of evaluation, outside "
            "the epochs' time)"
            if measured
            else escape(quality.validation or "not measured"),
        )
        if quality.target is not None:
            style = "" if quality.target.reached else "[bold yellow]"
            table.add_row("target", style + escape(quality.target.message))
    routing = record.workload.get("routing")
    if isinstance(routing, dict) and routing.get("tokens_per_expert"):  # a mixture of experts' load
        imbalance, worst = routing.get("imbalance"), routing.get("worst_layer_imbalance")
        table.add_row(
            "routing",
            f"tokens per expert {', '.join(f'{n:,}' for n in routing['tokens_per_expert'])} (all layers, timed "
            "steps); imbalance max/mean "
            + (f"{imbalance:.2f}" if imbalance is not None else "n/a")
            + (f", worst layer {worst:.2f}" if worst is not None else ""),
        )
    if m.host is not None:
        table.add_row("host", ("[bold yellow]" if m.host.contended else "") + escape(m.host.note))
    if record.data.get("bottleneck"):  # a workload's data pipeline that kept the training loop waiting
        table.add_row("data", "[bold yellow]" + escape(str(record.data["bottleneck"])))
    if m.peak_memory_max_bytes is not None:
        source = f" ({m.memory.source})" if m.memory else ""
        table.add_row("peak memory", fmt_bytes(m.peak_memory_max_bytes) + source)
    if m.tensor_peak is not None:
        kinds = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in m.tensor_peak.by_kind.items())
        table.add_row(
            "tensor peak",
            f"{fmt_bytes(m.tensor_peak.peak_bytes)} live tensors, one untimed step (MemTracker)"
            + (f": {escape(kinds)}" if kinds else ""),
        )
    check = check_prediction(record)
    if check is not None:
        table.add_row("predicted", prediction_text(check))
    if m.steady and m.steady.joules_per_sample is not None:
        table.add_row(
            "energy",
            f"{m.steady.joules_per_sample:.4g} J/sample, {m.steady.samples_per_joule:.4g} samples/J ({m.energy_source})",
        )
    return table


def precision_in_words(plan: PrecisionPlan) -> str:
    """What a precision plan runs, in words: what autocast computes in, what stays in float32, how float32 matmuls
    are done (a plan's ``matmul_math``: IEEE, or TF32 and the like where the backend enables it)."""
    fp32_math = "IEEE float32" if plan.matmul_math == "ieee-fp32" else plan.matmul_math
    if plan.autocast_dtype:
        words = (
            f"{plan.name}: weights, gradients and optimizer in {plan.param_dtype}; matmuls and convolutions in "
            f"{plan.autocast_dtype} under autocast; norms, softmax and the loss in float32"
        )
        if plan.fp8_recipe:
            words += f"; linears in FP8 ({plan.fp8_recipe})"
        return words + (
            f" (the remaining float32 matmuls: {fp32_math})" if fp32_math != "IEEE float32" else ""
        )
    if plan.param_dtype == "float32":
        return f"{plan.name}: everything in float32, matmuls as {fp32_math}"
    return f"{plan.name}: weights, activations and matmuls in {plan.param_dtype}, no autocast"
