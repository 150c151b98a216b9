"""The ``accelbench sweep`` command line: its options, and from them a resolved sweep that is run, listed
(``--dry-run``) or described (``--list``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.text import Text

from accelbench.errors import AccelbenchError
from accelbench.exitcodes import ExitCode
from accelbench.results import check_writable
from accelbench.sweep import spec
from accelbench.sweep.display import print_start, print_summary, verdict_note
from accelbench.sweep.runner import dry_run, run_sweep

MAX_POINT_TIMEOUT_S = (
    365 * 86400.0
)  # a year: beyond it, leave the timeout out (the timer's arithmetic stays finite)


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """The `sweep` subcommand's options."""
    parser.add_argument("sweep", nargs="?", help="a sweep file (.toml, .yaml) or a built-in suite name")
    parser.add_argument("--list", action="store_true", help="list the built-in suites and their scales")
    parser.add_argument(
        "--scale",
        default=spec.BASE_SCALE,
        help=f"sizes: '{spec.BASE_SCALE}' (as written: the seed study's) or a scale the file defines, e.g. 'tiny'",
    )
    parser.add_argument(
        "--output-dir", type=Path, default=Path("results"), help="where records go (default: results/)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="OPTION=VALUE",
        help="fix a run option for every point, e.g. --set precision=bf16-mixed --set backend=cuda (repeatable)",
    )
    parser.add_argument("--repeats", type=int, help="runs per point (overrides the file's 'repeats')")
    parser.add_argument(
        "--memory-cap",
        help="address-space limit per point, e.g. 4GiB (CPU runs only: emulates a device with that much memory)",
    )
    parser.add_argument("--point-timeout", type=float, help="seconds before a point is stopped (SIGTERM)")
    parser.add_argument(
        "--dry-run", action="store_true", help="list the points and which are done; run nothing"
    )
    parser.add_argument(
        "--quiet", "-q", action="store_true", help="no progress display; only the final summary"
    )


def list_suites(console: Console) -> None:
    """Each built-in suite with its scales and description (``--list``)."""
    for name, path in sorted(spec.builtin_suites().items()):
        data = spec.read_sweep_file(path)
        scales = ", ".join([spec.BASE_SCALE, *data.get("scales", {})])
        console.print(Text(name, style="bold"), Text(f"(scales: {scales})"), soft_wrap=True)
        console.print(Text("  " + " ".join(str(data.get("description", "")).split())), soft_wrap=True)


def sweep_command(args: argparse.Namespace, err: Console) -> int:
    """`accelbench sweep`: resolve the sweep, then run it (or list it with --dry-run)."""
    if args.list:
        list_suites(Console())
        return ExitCode.OK
    if not args.sweep:
        raise AccelbenchError(
            "name a sweep file or a built-in suite (`accelbench sweep --list` shows the suites)"
        )
    path = spec.resolve_sweep_source(args.sweep)
    sweep = spec.load_sweep(path, args.scale, spec.parse_set(args.set), output_dir=args.output_dir)
    if args.repeats is not None:
        if not 1 <= args.repeats <= spec.MAX_REPEATS:
            raise AccelbenchError(
                f"--repeats {args.repeats}: give at least 1 run per point, and at most {spec.MAX_REPEATS}"
            )
        sweep.repeats = args.repeats
    if args.memory_cap:
        sweep.memory_cap = spec.parse_memory(args.memory_cap)
    if args.point_timeout is not None and not 0 < args.point_timeout <= MAX_POINT_TIMEOUT_S:  # NaN fails too
        raise AccelbenchError(
            f"--point-timeout {args.point_timeout}: give a number of seconds above 0 and at most "
            f"{MAX_POINT_TIMEOUT_S:.0f} (a year), or leave it out for no limit"
        )

    if args.dry_run:
        if args.output_dir.exists() and not args.output_dir.is_dir():
            raise AccelbenchError(f"--output-dir {args.output_dir}: is a file, not a folder; give a folder")
        note = verdict_note(sweep)
        if note:
            err.print(Text("note: " + note, style="yellow"), soft_wrap=True)
        dry_run(sweep, args.output_dir, Console())
        return ExitCode.OK
    check_writable(args.output_dir)  # before any point runs
    check_points_on_host(sweep, args.output_dir)
    print_start(err, sweep, args.scale, args.output_dir)
    live = not args.quiet and err.is_terminal
    console = err if not args.quiet else Console(stderr=True, quiet=True)
    summary = run_sweep(sweep, args.output_dir, console, live, args.point_timeout)
    print_summary(err, sweep, summary, args.output_dir)
    return summary.exit_code


def check_points_on_host(sweep: spec.Sweep, output_dir: Path) -> None:
    """What each point asks of this host (its processes and threads against the cores and memory, its profiled
    window), checked as `accelbench run` checks it before starting, so that a sweep does not run for hours to find
    a point refused."""
    from accelbench.engine.runner import check_run_on_host

    for point in sweep.points:
        try:
            check_run_on_host(sweep.config(point, output_dir))
        except AccelbenchError as exc:
            raise AccelbenchError(f"point {point.label()}: {exc}") from None
