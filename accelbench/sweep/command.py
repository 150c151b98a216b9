"""The ``accelbench sweep`` command line: its options, and from them a resolved sweep that is run, listed
(``--dry-run``) or described (``--list``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.text import Text

from accelbench.errors import AccelbenchError, ConfigError
from accelbench.exitcodes import ExitCode
from accelbench.results import check_writable
from accelbench.sweep import spec
from accelbench.sweep.display import print_start, print_summary, verdict_note
from accelbench.sweep.resources import check_resources
from accelbench.sweep.runner import dry_run, run_sweep

SUBMITTERS = ("local", "slurm")
SLURM_FLAGS = ("nodes", "ntasks_per_node", "gpus_per_node", "time", "partition", "account")
MAX_ARRAY_THROTTLE = 100_000  # tasks of one array running at once: beyond any MaxArraySize
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
    slurm = parser.add_argument_group(
        "Slurm (--submit slurm)",
        "the points as job arrays (one sbatch per set of points needing the same resources) or, with "
        "--no-slurm-array, a job each; flags override the sweep file's [slurm] table; what neither sets "
        "comes from the point (nodes: its nnodes; tasks per node: its devices; GPUs per node: its devices on a "
        "GPU backend)",
    )
    slurm.add_argument(
        "--submit",
        choices=SUBMITTERS,
        default="local",
        help="local: run the points here, one after another (default); slurm: submit them as Slurm jobs",
    )
    slurm.add_argument(
        "--slurm-array",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="points needing the same resources go as one job array, a task each (default); "
        "--no-slurm-array: one job per point (where the cluster turns arrays off)",
    )
    slurm.add_argument(
        "--max-concurrent",
        type=int,
        metavar="M",
        help="at most M tasks of each array running at once (sbatch --array=0-N%%M)",
    )
    slurm.add_argument("--nodes", type=int, help="nodes per job (sbatch --nodes)")
    slurm.add_argument("--ntasks-per-node", type=int, help="ranks per node (sbatch --ntasks-per-node)")
    slurm.add_argument("--gpus-per-node", type=int, help="GPUs per node (sbatch --gpus-per-node)")
    slurm.add_argument("--time", help="time limit per job, e.g. 30, 01:30:00, 1-00:00:00 (sbatch --time)")
    slurm.add_argument("--partition", help="the partition to submit to (sbatch --partition)")
    slurm.add_argument("--account", help="the account to charge (sbatch --account)")
    slurm.add_argument(
        "--sbatch-arg",
        action="append",
        default=[],
        metavar="OPTION",
        help="one more sbatch option for every job, e.g. --sbatch-arg=--exclusive (repeatable)",
    )
    slurm.add_argument(
        "--no-wait",
        action="store_true",
        help="submit and return; run the same command again to follow the jobs (nothing is submitted twice)",
    )
    slurm.add_argument(
        "--poll-interval",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how often the queue is read while following the jobs (default: 10)",
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

    check_submit_flags(args, sweep)
    if args.dry_run:
        if args.output_dir.exists() and not args.output_dir.is_dir():
            raise AccelbenchError(f"--output-dir {args.output_dir}: is a file, not a folder; give a folder")
        note = verdict_note(sweep)
        if note:
            err.print(Text("note: " + note, style="yellow"), soft_wrap=True)
        dry_run(sweep, args.output_dir, Console())
        return ExitCode.OK
    check_writable(args.output_dir)  # before any point runs
    console = err if not args.quiet else Console(stderr=True, quiet=True)
    if args.submit == "slurm":
        from accelbench.sweep.slurm import check_slurm, submit_sweep

        check_slurm()
        print_start(err, sweep, args.scale, args.output_dir)
        summary = submit_sweep(
            sweep,
            args.output_dir,
            console,
            not args.no_wait,
            args.poll_interval,
            array=args.slurm_array is not False,
            max_concurrent=args.max_concurrent,
        )
        print_summary(err, sweep, summary, args.output_dir)
        return summary.exit_code
    check_points_on_host(sweep, args.output_dir)
    print_start(err, sweep, args.scale, args.output_dir)
    live = not args.quiet and err.is_terminal
    summary = run_sweep(sweep, args.output_dir, console, live, args.point_timeout)
    print_summary(err, sweep, summary, args.output_dir)
    return summary.exit_code


def check_submit_flags(args: argparse.Namespace, sweep: spec.Sweep) -> None:
    """The Slurm flags: refused without ``--submit slurm`` (they would do nothing), checked as the file's
    ``[slurm]`` table is, and merged over it into ``sweep.slurm``."""
    given = [f for f in SLURM_FLAGS if getattr(args, f) is not None]
    if args.sbatch_arg:
        given.append("sbatch_arg")
    if args.no_wait:
        given.append("no_wait")
    if args.slurm_array is not None:
        given.append("slurm_array" if args.slurm_array else "no_slurm_array")
    if args.max_concurrent is not None:
        given.append("max_concurrent")
    if args.submit != "slurm":
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise ConfigError(
                f"{flag} is a Slurm job's option and this sweep runs its points here (--submit {args.submit}); "
                "add --submit slurm, or leave it out"
            )
        return
    if args.point_timeout is not None:
        raise ConfigError(
            f"--point-timeout {args.point_timeout:g} stops a point run here; a Slurm job's limit is --time "
            "(e.g. --time 01:00:00 or [slurm] time in the sweep file)"
        )
    if not 0.1 <= args.poll_interval <= 3600:  # NaN fails too
        raise ConfigError(
            f"--poll-interval {args.poll_interval}: give seconds between 0.1 and 3600 (default 10; a busy "
            "controller prefers 30 or more)"
        )
    if args.max_concurrent is not None:
        if args.slurm_array is False:
            raise ConfigError(
                f"--max-concurrent {args.max_concurrent} throttles a job array's tasks and --no-slurm-array "
                "submits one job per point; leave one of them out"
            )
        if not 1 <= args.max_concurrent <= MAX_ARRAY_THROTTLE:
            raise ConfigError(
                f"--max-concurrent {args.max_concurrent}: give how many of an array's tasks may run at once, "
                f"from 1 to {MAX_ARRAY_THROTTLE}, or leave it out for no limit"
            )
    for name in SLURM_FLAGS:  # one at a time, so that an error names its flag
        if getattr(args, name) is not None:
            one = check_resources({name: getattr(args, name)}, "--" + name.replace("_", "-"))
            sweep.slurm = sweep.slurm.merged(one)
    sweep.slurm = sweep.slurm.merged(check_resources({"sbatch_args": args.sbatch_arg}, "--sbatch-arg"))


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
