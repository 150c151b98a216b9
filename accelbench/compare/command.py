"""`accelbench compare` on the command line, and the selection options `report` shares with it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.text import Text

from accelbench.compare.cells import Comparison, Filters, compare
from accelbench.compare.keys import DEFAULT_LABEL_BY, SYSTEM_FIELDS, parse_label_by
from accelbench.compare.records import load_records
from accelbench.compare.render import FORMATS, render, render_table
from accelbench.compare.stats import DEFAULT_ALPHA
from accelbench.errors import AccelbenchError


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


def comparison_from_args(args: argparse.Namespace, err: Console) -> Comparison:
    """Read, report skipped files on ``err``, and compare, as the `compare` and `report` commands do."""
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
    filters = Filters(tuple(args.model), tuple(args.precision), tuple(args.strategy), tuple(args.system))
    return compare(
        record_set,
        label_by,
        args.baseline,
        filters,
        args.alpha,
        vs=args.vs,
        vs_baseline=args.vs_baseline,
    )


def add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    """The `compare` subcommand's options."""
    add_selection_arguments(parser)
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format (default: table)")
    parser.add_argument("--output", "-o", type=Path, help="write to this file instead of standard output")


def compare_command(args: argparse.Namespace, err: Console) -> int:
    """`accelbench compare`: print (or write) the comparison in the chosen format."""
    comparison = comparison_from_args(args, err)
    if args.output:
        text = render(comparison, args.format)
        args.output.write_text(text, encoding="utf-8")
        err.print(Text(f"comparison written to {args.output}"), soft_wrap=True)
    elif args.format == "table":
        out = Console()
        # piped: wide enough that no column is cropped (a terminal keeps its own width and wraps)
        render_table(comparison, out if out.is_terminal else Console(width=240))
    else:
        sys.stdout.write(render(comparison, args.format))
    return 0
