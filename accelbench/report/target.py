"""Time to a target: every run asked for one (``--target-loss`` or ``--target``), what it cost to get there beside
its speed, or plainly that it did not get there.

Throughput alone can favour a setting that converges slower (seed 004): the time, steps, samples and energy to a
validation loss are the comparison that counts, so the report sets them beside each run's samples per second.
One row per run rather than per cell, so that a run that never reached its target is never hidden in a median.
"""

from __future__ import annotations

import statistics

from accelbench.compare import Comparison, RunSummary
from accelbench.report.entries import entries

TARGET_HEADER = [
    "system",
    "workload",
    "precision",
    "strategy",
    "devices × batch",
    "samples/s",
    "target",
    "time to target",
    "epoch",
    "steps",
    "samples",
    "energy to target",
    "final val loss",
    "run",
]

TARGET_CAPTION = (
    "Runs asked for a target (--target-loss X, or --target NAME: a loss from the model's shipped reference). Time "
    "to target: the timed training epochs until the held-out loss first reached the target, evaluation excluded; "
    "steps: optimizer steps; samples: trained on, all devices together; energy: from the devices' own counters, "
    "where they read every epoch (never estimated). samples/s: median over the run's steady epochs. A run that "
    "never reached its target says so, with its best held-out loss; a run that failed (diverged, out of memory) "
    "has no valid figures."
)


def has_targets(comparison: Comparison) -> bool:
    """Whether any run of ``comparison`` was asked for a target."""
    return bool(_runs(comparison))


def _runs(comparison: Comparison) -> list[tuple[str, RunSummary]]:
    return [
        (entry.cell.system, run)
        for entry in entries(comparison)
        for run in entry.cell.runs
        if run.figures is not None and run.figures.target_loss is not None
    ]


def target_rows(comparison: Comparison) -> list[list[str]]:
    """One row per run asked for a target (:data:`TARGET_HEADER`'s columns), in the comparison's order."""
    rows = []
    for system, run in _runs(comparison):
        f = run.figures
        assert f is not None and f.target_loss is not None  # _runs keeps only these
        key = run.key
        target = f"{f.target_name} ({f.target_loss:.4g})" if f.target_name else f"{f.target_loss:.4g}"
        throughput = f"{statistics.median(f.samples_per_s):,.1f}" if f.samples_per_s else "-"
        if not run.ok:
            reached = [f"no valid result: {run.status}"] + ["-"] * 4
        elif f.time_to_target_s is None:
            # the record's sentence: not reached in N epochs, and the best held-out loss it got to
            reached = [f"not reached: {f.target_message}" if f.target_message else "not reached"] + ["-"] * 4
        else:
            reached = [
                f"{f.time_to_target_s:.3g} s",
                _count(f.target_epoch),
                _count(f.target_steps),
                _count(f.target_samples),
                f"{f.target_energy_j:.3g} J" if f.target_energy_j is not None else "not measured",
            ]
        rows.append(
            [
                system,
                f"{key.workload} {key.model}",
                key.precision,
                key.strategy,
                f"{run.devices} × {key.batch_size}",
                throughput,
                target,
                *reached,
                f"{f.val_loss:.4f}" if f.val_loss is not None else "-",
                run.file,
            ]
        )
    return rows


def _count(value: float | None) -> str:
    return f"{int(value):,}" if value is not None else "-"
