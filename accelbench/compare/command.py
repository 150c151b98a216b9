"""`accelbench compare` on the command line, and the selection options `report` shares with it."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from accelbench.compare.bandwidth import CommComparison, compare_comm, render_comm_table, render_with_runs
from accelbench.compare.cells import Comparison, Filters, compare
from accelbench.compare.keys import CORE_AXES, DEFAULT_LABEL_BY, SYSTEM_FIELDS, parse_label_by
from accelbench.compare.records import load_records
from accelbench.compare.render import FORMATS, render_table
from accelbench.compare.stats import DEFAULT_ALPHA
from accelbench.errors import AccelbenchError, ConfigError
from accelbench.results import check_writable, write_output


def add_selection_arguments(parser: argparse.ArgumentParser) -> None:
    """Options `compare` and `report` share: inputs, system labels, baseline, the axis compared along, filters."""
    parser.add_argument("paths", nargs="+", type=Path, metavar="RESULT_FILES_OR_DIRS")
    parser.add_argument(
        "--label-by",
        default=",".join(DEFAULT_LABEL_BY),
        help=f"record fields that name a system (default: {','.join(DEFAULT_LABEL_BY)}); "
        f"any of: {', '.join(SYSTEM_FIELDS)}. 'dir' = the folder a record is in",
    )
    parser.add_argument(
        "--baseline",
        help="system the ratios are against (with --vs: the 'vs baseline system' column's); a label or part of "
        "one (default: the first)",
    )
    parser.add_argument(
        "--vs",
        metavar="AXIS",
        help="compare along a workload field: runs that differ only in it (e.g. precision, batch_size, strategy, "
        "model, or a workload identity entry such as block_size) share a table, one row per value and system, "
        "with ratios against the baseline value on the same system",
    )
    parser.add_argument(
        "--vs-baseline",
        metavar="VALUE",
        help="with --vs: the value the ratios are against (default: each table's first value in natural order, "
        "e.g. fp32, the smallest batch)",
    )
    parser.add_argument("--model", action="append", default=[], help="only this model (repeatable)")
    parser.add_argument("--precision", action="append", default=[], help="only this precision (repeatable)")
    parser.add_argument("--strategy", action="append", default=[], help="only this strategy (repeatable)")
    parser.add_argument(
        "--system", action="append", default=[], help="only systems whose label contains this (repeatable)"
    )
    parser.add_argument(
        "--alpha",
        type=float,
        default=DEFAULT_ALPHA,
        help=f"significance level for 'beyond noise' (default: {DEFAULT_ALPHA})",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="fail on a malformed, foreign or newer-schema file (default: skip it)",
    )
    parser.add_argument(
        "--prices",
        type=Path,
        metavar="FILE",
        help="a TOML/JSON file of $ per device-hour ([device_hour], by device name) and $ per kWh (kwh): adds $ per "
        "million tokens and $ per run",
    )


def comparisons_from_args(
    args: argparse.Namespace, err: Console
) -> tuple[Comparison | None, CommComparison | None]:
    """Read, report skipped files on ``err``, and compare, as the `compare` and `report` commands do: training
    runs' result records as a :class:`Comparison`, `accelbench comm` records as bandwidth curves; either may be
    absent (None), not both."""
    if not 0 < args.alpha < 1:
        raise AccelbenchError(f"--alpha {args.alpha}: must be between 0 and 1, e.g. 0.05")
    label_by = parse_label_by(args.label_by)
    record_set = load_records(args.paths, strict=args.strict)
    for path, reason in record_set.skipped:
        err.print(Text(f"skipped {path}: {reason}", style="yellow"), soft_wrap=True)
    if record_set.duplicates:
        err.print(
            Text(f"{len(record_set.duplicates)} duplicate record(s) (same run id) counted once", style="dim"),
            soft_wrap=True,
        )
    comm = None
    if record_set.comm:
        if args.vs and not record_set.records:
            raise AccelbenchError(
                f"--vs {args.vs}: compares training runs along a workload field, and the inputs hold only comm "
                "records (collective bandwidth); drop --vs"
            )
        comm = compare_comm(record_set.comm, label_by, args.baseline, args.system, bool(record_set.records))
        comm.skipped, comm.duplicates = record_set.skipped, record_set.duplicates
        if not record_set.records:
            return None, comm
    if args.prices is not None:
        from accelbench.compare.prices import priced, read_prices

        record_set.records = priced(record_set.records, read_prices(args.prices))
    filters = Filters(tuple(args.model), tuple(args.precision), tuple(args.strategy), tuple(args.system))
    vs = args.vs if args.vs is not None else one_axis(args.paths, record_set.records)
    if vs is not None and args.vs is None:
        err.print(
            Text(f"the files given differ only in {vs}: one table along it (--vs {vs}; another --vs to choose)",
                 style="dim"),
            soft_wrap=True,
        )  # fmt: skip
    comparison = compare(
        record_set,
        label_by,
        args.baseline,
        filters,
        args.alpha,
        vs=vs,
        vs_baseline=args.vs_baseline,
    )
    return comparison, comm


def one_axis(paths: list[Path], records: list[Any]) -> str | None:
    """Where result files are given one by one (no folder) and their runs differ in exactly one workload field
    (precision, batch size, strategy, model, ...), that field: the files then share one table along it, with one
    baseline, instead of a table each. None otherwise."""
    if len(records) < 2 or any(path.is_dir() for path in paths):
        return None
    keys = {r.key for r in records}
    if len(keys) < 2:
        return None
    first = next(iter(keys))
    axes = [*CORE_AXES, *sorted({name for key in keys for name, _ in key.identity})]
    differing = [axis for axis in axes if len({key.value(axis) for key in keys}) > 1]
    if len(differing) != 1:
        return None
    axis = differing[0]
    return axis if all(key.without(axis) == first.without(axis) for key in keys) else None


def comparison_from_args(args: argparse.Namespace, err: Console) -> Comparison:
    """:func:`comparisons_from_args` for training runs alone (comm records are read and set aside)."""
    comparison, _ = comparisons_from_args(args, err)
    if comparison is None:
        raise AccelbenchError("no training result records found (only comm records); nothing to compare")
    return comparison


def add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    """The `compare` subcommand's options."""
    add_selection_arguments(parser)
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format (default: table)")
    parser.add_argument("--output", "-o", type=Path, help="write to this file instead of standard output")
    parser.add_argument(
        "--fleet",
        action="store_true",
        help="rank the nodes (hosts) that ran the same benchmark by median and MAD, flag the outliers (> 3 MADs "
        "and > 2%% from the median) and list what in their environment differs",
    )
    parser.add_argument(
        "--wide",
        action="store_true",
        help="every column, however wide (by default a table fits the terminal, leaving out the least asked-for "
        "columns and saying which)",
    )


def fleet_text(args: argparse.Namespace, err: Console) -> str:
    """``--fleet``: the nodes of each benchmark ranked, outliers flagged (:mod:`accelbench.compare.fleet`)."""
    from accelbench.compare.fleet import fleet, render_fleet

    for flag in ("vs", "vs_baseline", "baseline"):
        if getattr(args, flag):
            name = "--" + flag.replace("_", "-")
            raise ConfigError(
                f"{name} {getattr(args, flag)}: --fleet ranks the nodes of each benchmark against their median, "
                f"not against a baseline; drop {name} (or --fleet)"
            )
    if args.format not in ("table", "markdown", "json"):
        raise ConfigError(f"--format {args.format}: --fleet writes table, markdown or json")
    record_set = load_records(args.paths, strict=args.strict)
    for path, reason in record_set.skipped:
        err.print(Text(f"skipped {path}: {reason}", style="yellow"), soft_wrap=True)
    filters = Filters(tuple(args.model), tuple(args.precision), tuple(args.strategy), tuple(args.system))
    groups, notes = fleet(r for r in record_set.records if filters.keep(r, r.system.host))
    if not groups and not notes:
        raise AccelbenchError("no successful training records found: nothing to rank (--fleet)")
    if args.format == "json":
        return json.dumps({"benchmarks": [g.as_dict() for g in groups], "notes": notes}, indent=2) + "\n"
    lines = render_fleet(groups, notes)
    if args.format == "markdown":
        return "```\n" + "\n".join(lines) + "\n```\n"
    return "\n".join(lines) + "\n"


def compare_command(args: argparse.Namespace, err: Console) -> int:
    """`accelbench compare`: print (or write) the comparison in the chosen format."""
    if args.output is not None and args.output.is_dir():
        raise AccelbenchError(f"--output {args.output}: is a folder; give a file name")
    if args.output is not None and not (args.output.exists() and not args.output.is_file()):
        check_writable(args.output.parent, "--output's folder")  # (a device or pipe is written into as it is)
    if args.fleet:
        text = fleet_text(args, err)
        if args.output:
            try:
                write_output(text.encode("utf-8"), args.output)
            except OSError as exc:
                raise AccelbenchError(
                    f"--output {args.output}: cannot write it ({exc.strerror or exc})"
                ) from None
            err.print(Text(f"fleet written to {args.output}"), soft_wrap=True)
        else:
            sys.stdout.write(text)
        return 0
    comparison, comm = comparisons_from_args(args, err)
    if args.output:
        text = render_with_runs(comparison, comm, args.format, wide=args.wide)
        try:
            write_output(text.encode("utf-8"), args.output)  # atomically: never half a comparison
        except OSError as exc:
            raise AccelbenchError(
                f"--output {args.output}: cannot write it ({exc.strerror or exc})"
            ) from None
        err.print(Text(f"comparison written to {args.output}"), soft_wrap=True)
    elif args.format == "table":
        out = Console()
        if not out.is_terminal and "COLUMNS" not in os.environ:
            out = Console(width=240)  # piped, width unknown: wide enough that nothing is left out
        if comparison is not None:
            render_table(comparison, out, wide=args.wide)
        if comm is not None:
            render_comm_table(comm, out)
    else:
        sys.stdout.write(render_with_runs(comparison, comm, args.format))
    return 0
