"""The ``accelbench plan`` flags: cheap to import (no torch), since the command line builds every subcommand's
parser at start-up. The device, bandwidth and efficiency flags mean what they mean for ``accelbench estimate``
(and are checked by the same :func:`~accelbench.estimate.command.check_estimate_flags`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from accelbench.estimate.arguments import DEFAULT_EFFICIENCY

# Per-device batch sizes tried when --batch-sizes is not given: powers of two, as people choose them.
DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_TOP = 10
# pipeline schedules a plan prices by default: those whose bubble has a closed form (estimate's pipeline_bubble);
# the zero-bubble ones (interleaved-zb, zbv, dualpipev) have none, so the model would rank them as bubble-free
PLANNED_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")
# A measured point's length: a warm-up epoch and two steady ones of a few steps, enough for a steady median on the
# small models plan is measured with here; longer runs are `accelbench sweep PLAN.toml` with the file --sweep-file writes.
DEFAULT_MEASURE_EPOCHS = 3
DEFAULT_MEASURE_STEPS = 6


def _csv(kind: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    """A comma- (or space-) separated list of ``kind`` values: ``--batch-sizes 8,16,32``."""

    def parse(text: str) -> list[Any]:
        items = [t.strip() for t in text.replace(",", " ").split() if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError("give at least one value")
        try:
            return [kind(t) for t in items]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected {getattr(kind, '__name__', '')} values"
            ) from None

    return parse


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``plan`` subcommand's flags."""
    job = parser.add_argument_group("the job")
    job.add_argument("--workload", default="gpt", help="the workload (default: gpt)")
    job.add_argument("--model", required=True, help="the workload's size name, e.g. gpt-mini")
    job.add_argument("--devices", type=int, default=1, help="devices per node (default: 1)")
    job.add_argument("--nnodes", type=int, default=1, help="nodes (default: 1)")
    job.add_argument("--backend", default=None, help="the backend (default: the one that detects a device)")
    space = parser.add_argument_group("what is considered")
    space.add_argument("--strategies", type=_csv(str), metavar="S,...",
                       help="strategies to consider: single, ddp, fsdp, deepspeed-zero1/2/3, tp, pp, mesh (default: "
                            "single on one device; else ddp, fsdp, tp, pp, mesh, and ZeRO 1-3 where DeepSpeed is "
                            "installed)")  # fmt: skip
    space.add_argument("--precisions", type=_csv(str), metavar="P,...",
                       help="precisions to consider (default: every one the device runs)")  # fmt: skip
    space.add_argument("--batch-sizes", type=_csv(int), metavar="B,...",
                       help="per-device (per-replica) batch sizes; with --global-batch, the micro-batch sizes "
                            f"accumulation may use (default: {','.join(map(str, DEFAULT_BATCH_SIZES))})")  # fmt: skip
    space.add_argument("--global-batch", type=int, metavar="N",
                       help="samples per optimizer step over the whole job: each layout's per-replica batch is N / "
                            "its data-parallel size, split into micro-batches by gradient accumulation")  # fmt: skip
    space.add_argument("--pp-schedules", type=_csv(str), metavar="S,...",
                       help="pipeline schedules to consider for layouts with a pp axis (default: "
                            f"{','.join(PLANNED_SCHEDULES)}: those whose bubble has a closed form)")  # fmt: skip
    space.add_argument("--activation-checkpointing", choices=("auto", "off", "on", "both"), default="auto",
                       help="auto: consider it for a configuration that does not fit without it; off: never; on: "
                            "always; both: every configuration with and without (default: auto)")  # fmt: skip
    rank = parser.add_argument_group("ranking and output")
    rank.add_argument("--token-budget", type=float, metavar="T",
                      help="rank by the time to train T tokens (samples, for workloads without tokens)")  # fmt: skip
    rank.add_argument("--top", type=int, default=DEFAULT_TOP, help=f"rows shown (default: {DEFAULT_TOP})")
    rank.add_argument("--sweep-file", type=Path, metavar="PATH",
                      help="write the top K as a sweep file (.toml; .yaml with PyYAML) that `accelbench sweep` runs")  # fmt: skip
    rank.add_argument(
        "--json", action="store_true", help="print the whole plan as JSON (schema accelbench.plan)"
    )
    measure = parser.add_argument_group("measuring the ranking")
    measure.add_argument("--measure", type=int, metavar="K",
                         help="run the top K for real (short runs through `accelbench sweep`, resumable) and compare "
                              "predicted with measured throughput and rank")  # fmt: skip
    measure.add_argument("--out", type=Path, default=Path("results/plan"),
                         help="where --measure's records go; a second run with the same folder reuses finished "
                              "points (default: results/plan)")  # fmt: skip
    measure.add_argument("--measure-epochs", type=int, default=DEFAULT_MEASURE_EPOCHS,
                         help=f"epochs per measured point, the first a warm-up (default: {DEFAULT_MEASURE_EPOCHS})")  # fmt: skip
    measure.add_argument("--measure-steps", type=int, default=DEFAULT_MEASURE_STEPS,
                         help=f"steps per epoch of a measured point (default: {DEFAULT_MEASURE_STEPS})")  # fmt: skip
    measure.add_argument("--measure-repeats", type=int, default=1, metavar="R",
                         help="measure each configuration R times, in R passes over the top K (a host whose speed "
                              "drifts during the passes moves every configuration alike), and compare their "
                              "medians; the spread of each is shown (default: 1)")  # fmt: skip
    device = parser.add_argument_group("the device (as for accelbench estimate)")
    device.add_argument("--device", dest="estimate_device", metavar="NAME",
                        help="plan for a device from the plugins' peak tables (H100, MI250X, ...) instead of the "
                             "one detected here")  # fmt: skip
    device.add_argument("--comm", nargs="+", action="extend", type=Path, metavar="DIR_OR_FILE",
                        help="comm records (from `accelbench comm`) for the collectives' bus bandwidth")  # fmt: skip
    device.add_argument("--bus-bandwidth", type=float, metavar="GB_PER_S",
                        help="one bus bandwidth (GB/s, nccl-tests' busbw) for every collective")  # fmt: skip
    device.add_argument("--device-profile", type=Path, metavar="FILE",
                        help="price each configuration with this device profile (from `accelbench calibrate "
                             "--export FILE` on the device planned for)")  # fmt: skip
    device.add_argument("--efficiency", type=float, default=None,
                        help="price compute as FLOPs at this fraction of the peak instead of the device profile "
                             f"(where no profile can be made: {DEFAULT_EFFICIENCY})")  # fmt: skip
    device.add_argument("--overlap", choices=("auto", "none", "backward"), default="auto",
                        help="which collectives hide behind compute (default: auto)")  # fmt: skip
    device.add_argument("--measure-peak", action="store_true",
                        help="time dense matmuls on this device (cached) and predict with the measured rate")  # fmt: skip
    device.add_argument("--refresh-peak", action="store_true", help="with --measure-peak: measure again")
    device.add_argument("--calibrate", action="store_true",
                        help="price each configuration's step from this device's calibration over its traced "
                        "operators (as estimate --calibrate), instead of a fixed efficiency")  # fmt: skip
    device.add_argument("--refresh-calibration", action="store_true",
                        help="with --calibrate: measure the calibration again")  # fmt: skip
    device.add_argument("--runtime-mib", type=float, default=0.0, metavar="MIB",
                        help="memory a process holds before the model, added to each peak (default: 0)")  # fmt: skip
    from accelbench.estimate.arguments import add_stack_arguments

    add_stack_arguments(parser)  # the training stack priced, as for estimate
