"""``plan --measure K``: the top K run for real as short runs through ``accelbench sweep`` (each point its own
process, resumable: a second invocation with the same ``--out`` reuses finished points, since records are the
sweep's source of truth), then predicted against measured: throughput, rank, Spearman's rank correlation, and
whether the predicted top pick is within 5% of the best measured."""

from __future__ import annotations

import argparse
import statistics
from typing import TYPE_CHECKING

from accelbench.plan.ranking import spearman
from accelbench.plan.schema import Comparison, MeasuredRun, Plan

if TYPE_CHECKING:
    from rich.console import Console

# The top pick is "good enough" when its measured throughput is within this fraction of the best measured.
TOP_PICK_TOLERANCE = 0.05
SWEEP_NAME = "plan-measure.toml"  # TOML: accelbench sweep reads it with the core alone


def measure_top(plan: Plan, args: argparse.Namespace, err: Console) -> tuple[Comparison, int]:
    """Run the top ``args.measure`` of ``plan`` into ``args.out`` and compare them with their predictions; with the
    sweep's exit status (130 when interrupted: the points not run are reported as such, and a second invocation
    runs them)."""
    from rich.console import Console

    from accelbench.plan.command import write_sweep_file
    from accelbench.results import check_writable
    from accelbench.sweep.command import check_points_on_host
    from accelbench.sweep.resume import Recorded, same_point
    from accelbench.sweep.runner import run_sweep
    from accelbench.sweep.spec import load_sweep

    top = plan.ranked[: args.measure]
    out = args.out
    check_writable(out, "--out")
    path = write_sweep_file(out / SWEEP_NAME, top, args, measured=True)
    sweep = load_sweep(path, output_dir=out)
    check_points_on_host(sweep, out)
    console = err if not args.json else Console(stderr=True)
    console.print(f"measuring the top {len(top)} in {out} (sweep file {path}; finished points are reused)",
                  highlight=False, soft_wrap=True)  # fmt: skip
    # one pass over the top K per repeat, each run once more (the sweep counts a point's ok records), so that a
    # host's drift over the passes moves every configuration alike rather than the ones measured last
    for repeat in range(1, args.measure_repeats + 1):
        if args.measure_repeats > 1:
            console.print(f"pass {repeat} of {args.measure_repeats}", highlight=False)
        sweep.repeats = repeat
        summary = run_sweep(sweep, out, console, live=False)
        if summary.interrupted:
            break
    recorded = Recorded.scan(out)
    runs: list[MeasuredRun] = []
    for i, (run, point) in enumerate(zip(top, sweep.points, strict=True), 1):
        config = sweep.config(point, out)
        mine = [(status, file) for cfg, status, file in recorded.entries if same_point(config, cfg)]
        rates, files, waited, contended = [], [], [], False
        for status, file in mine:
            if status == "ok":
                rate, waiting, busy = _steady_rate(file)
                if rate is not None:
                    rates.append(rate)
                    files.append(file)
                    waited += [waiting] if waiting is not None else []
                    contended = contended or busy
        unrecorded = (
            "not run (interrupted)" if summary.interrupted else "failed (no record: see the sweep log)"
        )
        status = "ok" if rates else (mine[-1][0] if mine else unrecorded)
        median = statistics.median(rates) if rates else None
        runs.append(MeasuredRun(
            label=run.label,
            predicted_rank=i,
            measured_rank=None,
            predicted_samples_per_s=run.samples_per_s or 0.0,
            measured_samples_per_s=median,
            measured_runs=len(rates),
            spread=(max(rates) - min(rates)) / median if median and len(rates) > 1 else None,
            status=status,
            record=str(files[-1]) if files else None,
            waited=max(waited) if waited else None,
            contended=contended,
        ))  # fmt: skip
    if summary.interrupted:
        console.print("interrupted: the comparison covers the points measured so far; the same command resumes",
                      style="yellow", highlight=False)  # fmt: skip
    return compare(runs, str(out)), summary.exit_code


def compare(runs: list[MeasuredRun], out: str) -> Comparison:
    """Measured ranks, Spearman's coefficient and the top pick's gap over the runs that measured a throughput."""
    done = [r for r in runs if r.measured_samples_per_s is not None]
    measured = [r.measured_samples_per_s or 0.0 for r in done]
    # the measured rank as a table shows it: 1 + how many measured faster (equal rates share the better rank)
    runs = [
        r.model_copy(update={"measured_rank": 1 + sum(m > r.measured_samples_per_s for m in measured)})
        if r.measured_samples_per_s is not None
        else r
        for r in runs
    ]
    rho = spearman([r.predicted_samples_per_s for r in done], measured)
    gap = within = None
    top = runs[0] if runs else None
    if done and top is not None and top.measured_samples_per_s is not None:
        gap = 1.0 - top.measured_samples_per_s / max(measured)
        within = gap <= TOP_PICK_TOLERANCE
    return Comparison(out=out, runs=runs, spearman=rho, top_pick_gap=gap, top_pick_within_5pct=within)


def _steady_rate(path: object) -> tuple[float | None, float | None, bool]:
    """A record's steady samples/s (None without steady epochs), the share of ready time its threads waited for a
    core, and whether the run found the host contended (its figures suspect)."""
    from pathlib import Path

    from accelbench.results import read_record

    record = read_record(Path(str(path)))
    if record.metrics is None or record.metrics.steady is None:
        return None, None, False
    host = record.metrics.host
    return record.metrics.steady.samples_per_s, host.waiting if host else None, bool(host and host.contended)


def show_comparison(comparison: Comparison, out: Console) -> None:
    """Predicted against measured, per configuration, and the verdicts."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"predicted against measured (records in {comparison.out})")
    repeated = any(r.measured_runs > 1 for r in comparison.runs)
    for column in ("configuration", "pred. rank", "meas. rank", "pred. samples/s", "meas. samples/s", "error",
                   *(("runs", "spread") if repeated else ()), "waited", "status"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("configuration", "status") else "right")
    for r in comparison.runs:
        m = r.measured_samples_per_s
        error = f"{r.predicted_samples_per_s / m - 1:+.0%}" if m else ""
        spread = (str(r.measured_runs), f"{r.spread:.0%}" if r.spread is not None else "") if repeated else ()
        table.add_row(escape(r.label), str(r.predicted_rank), str(r.measured_rank or "-"),
                      f"{r.predicted_samples_per_s:.4g}", f"{m:.4g}" if m else "-", error, *spread,
                      f"{r.waited:.0%}" if r.waited is not None else "", escape(r.status))  # fmt: skip
    out.print(table)
    if repeated:
        out.print("meas. samples/s: the median of each configuration's runs; spread: (fastest - slowest) / median",
                  highlight=False)  # fmt: skip
    busy = sum(r.contended for r in comparison.runs)
    if busy:
        out.print(f"[yellow]{busy} of {len(comparison.runs)} run(s) found the host contended (their threads waited "
                  "for a core, 'waited', or the hypervisor stole the cores' time): their measured figures, and the ranks and correlation below, say little; "
                  "measure again on an idle host (the same command with a new --out)[/]", highlight=False,
                  soft_wrap=True)  # fmt: skip
    rho = (
        f"{comparison.spearman:.3f}"
        if comparison.spearman is not None
        else "undefined (fewer than 2 measured)"
    )
    out.print(f"Spearman's rank correlation (predicted vs measured throughput): {rho}", highlight=False)
    if comparison.top_pick_gap is None:
        out.print("top pick: not measured (its run failed)", highlight=False)
    else:
        verdict = "within" if comparison.top_pick_within_5pct else "NOT within"
        out.print(f"top pick: {comparison.top_pick_gap:.1%} below the best measured: {verdict} "
                  f"{TOP_PICK_TOLERANCE:.0%}", highlight=False)  # fmt: skip
