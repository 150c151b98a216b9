"""`accelbench report` on the command line: the selection options of `compare`, and where the report goes."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.text import Text

from accelbench.compare import add_selection_arguments
from accelbench.compare.command import comparisons_from_args
from accelbench.errors import ConfigError
from accelbench.report.drawing import FIGURE_FORMATS
from accelbench.report.html import (
    build_comm_report,
    build_plan_report,
    build_report,
    check_report_places,
    write_report,
)
from accelbench.report.plan import is_plan_file, read_plan


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    """The `report` subcommand's options."""
    add_selection_arguments(parser)
    parser.add_argument(
        "--output",
        "-o",
        type=Path,
        default=Path("accelbench-report.html"),
        help="the HTML file (default: accelbench-report.html)",
    )
    parser.add_argument(
        "--figures", type=Path, metavar="DIR", help="also write every figure as a file into DIR"
    )
    parser.add_argument(
        "--figure-format",
        choices=FIGURE_FORMATS,
        default="svg",
        help="figure format, embedded and written (default: svg)",
    )
    parser.add_argument("--title", default="accelbench report", help="the report's title")


def report_command(args: argparse.Namespace, err: Console) -> int:
    """`accelbench report`: compare the records, draw the views, write one HTML file. Plan files (`accelbench plan
    --json`, told by their schema) each get a section; given alone, the page is theirs."""
    check_report_places(args.output, args.figures)  # before the records are read and the figures drawn
    from accelbench.report.drawing import load_matplotlib

    load_matplotlib()  # a missing extra is said first, before records are read
    plans = [read_plan(path) for path in args.paths if is_plan_file(path)]  # a bad plan is refused here
    if plans:
        args.paths = [path for path in args.paths if not is_plan_file(path)]
    if plans and not args.paths:
        report = build_plan_report(plans, args.title, args.figure_format)
    else:
        comparison, comm = comparisons_from_args(args, err)
        if comparison is None:  # collective bandwidth records (`accelbench comm`) alone
            assert comm is not None
            if plans:
                raise ConfigError(
                    "a plan and comm records alone make no report together: give the plan alone, or with the "
                    "training runs' result records"
                )
            report = build_comm_report(comm, args.title, args.figure_format)
        else:
            report = build_report(comparison, args.title, args.figure_format, comm=comm, plans=plans)
    written = write_report(report, args.output, args.figures, args.figure_format)
    err.print(Text(f"report written to {args.output} ({len(report.figures)} figure(s))"), soft_wrap=True)
    if written:
        err.print(Text(f"figures written to {args.figures}"), soft_wrap=True)
    return 0
