"""`accelbench sweep`: run a grid of benchmark points, each in its own process, resumably.

A sweep file (TOML or YAML) names run options for every point and one or more grids over them::

    description = "gpt2 and gpt2-medium in three precisions"
    repeats = 1                      # runs per point (more give compare a noise estimate)
    [run]                            # options of every point (the names of `accelbench run` flags)
    epochs = 2
    [[grid]]                         # a list is an axis; a scalar fixes the option for this grid
    model = ["gpt2", "gpt2-medium"]
    precision = ["fp16-mixed", "bf16-mixed", "fp32"]
    batch_size = [64, 128]
    [[grid]]
    model = ["gpt2", "gpt2-large", "gpt2-xl"]
    batch_size = 1
    largest_fit = "model"            # walk this axis in order; stop after the first point that runs out of memory
    [scales.tiny]                    # `--scale tiny`: the same experiment, small enough for a laptop CPU
    run = { steps_per_epoch = 4 }
    axes = { model = ["gpt-nano", "gpt-micro"] }
    memory_cap = "4GiB"

Every point runs as ``python -m accelbench.cli run --config POINT.json`` in a child process (its own session, so a
terminal's Ctrl-C reaches only the sweep, which forwards it once), so a crash, an out-of-memory or a hard kill of
one point never ends the sweep. Result records are the source of truth: a point is done when the output folder
holds an ``ok`` record of its configuration (``repeats`` of them) or an ``oom`` record; re-running the sweep skips
done points and retries the rest. Each attempt is also appended to ``accelbench-sweep.log.jsonl`` there, which is
where refused points and crashes (no record) are described.

Where things are, one module per job:

- :mod:`~accelbench.sweep.spec`: sweep files and built-in suites, scales, ``--set``, grids -> :class:`Point` s,
  and a point's :class:`~accelbench.config.RunConfig` (:class:`Sweep`).
- :mod:`~accelbench.sweep.options`: which run option a name in a sweep file or ``--set`` means.
- :mod:`~accelbench.sweep.resume`: what is already recorded, and when a point is done (:func:`point_done`).
- :mod:`~accelbench.sweep.supervise`: one point in a child process (:func:`run_point`): timeouts, forwarded
  interrupts, the record it wrote.
- :mod:`~accelbench.sweep.runner`: every point in order (:func:`run_sweep`), and what ``--dry-run`` lists.
- :mod:`~accelbench.sweep.log`: the JSON-lines attempt log.
- :mod:`~accelbench.sweep.display`: progress and the summary on a terminal.
- :mod:`~accelbench.sweep.command`: the ``accelbench sweep`` command line.
- :mod:`~accelbench.sweep.slurm` and :mod:`~accelbench.sweep.resources`: ``--submit slurm``, the points as Slurm
  job arrays (a task per point, an array per set of points needing the same resources) or a job each, followed
  through ``squeue`` until they end; a point with its records is never submitted again, and one whose job or task
  is queued is followed, not submitted twice.

Nothing here imports torch at import time: ``accelbench sweep --list`` and ``--dry-run`` train nothing.
"""

from __future__ import annotations

from accelbench.sweep.command import add_sweep_arguments, list_suites, sweep_command
from accelbench.sweep.display import SweepDisplay
from accelbench.sweep.log import SWEEP_LOG, log_attempt
from accelbench.sweep.resume import LargestFit, Recorded, point_done, same_point
from accelbench.sweep.runner import SweepSummary, dry_run, run_sweep
from accelbench.sweep.spec import (
    BASE_SCALE,
    POINTS_FOLDER,
    Point,
    Sweep,
    builtin_suites,
    load_sweep,
    parse_memory,
    parse_set,
    read_sweep_file,
    resolve_sweep_source,
)
from accelbench.sweep.supervise import INTERRUPT_GRACE_S, Attempt, SweepInterrupted, child_command, run_point

__all__ = [
    "BASE_SCALE",
    "INTERRUPT_GRACE_S",
    "POINTS_FOLDER",
    "SWEEP_LOG",
    "Attempt",
    "LargestFit",
    "Point",
    "Recorded",
    "Sweep",
    "SweepDisplay",
    "SweepInterrupted",
    "SweepSummary",
    "add_sweep_arguments",
    "builtin_suites",
    "child_command",
    "dry_run",
    "list_suites",
    "load_sweep",
    "log_attempt",
    "parse_memory",
    "parse_set",
    "point_done",
    "read_sweep_file",
    "resolve_sweep_source",
    "run_point",
    "run_sweep",
    "same_point",
    "sweep_command",
]
