"""``accelbench run``: one benchmark run, from the command line's configuration to the result record.

The shared :class:`~accelbench.launcher.Launcher` starts the ranks (or adopts those torchrun, Slurm or MPI started);
each trains its part (:func:`accelbench.engine.runner.run`) and rank 0 writes and shows the record.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from accelbench.config import RunConfig
from accelbench.exitcodes import ExitCode

if TYPE_CHECKING:
    from rich.console import Console

    from accelbench.engine.runner import Preflight
    from accelbench.launch import LaunchEnv


def run_command(args: argparse.Namespace, err: Console) -> int:
    """``accelbench run``: launch the ranks the job needs (or be one), train, and write one result record."""
    from accelbench.launcher import JobShape, Launcher, RecordKind
    from accelbench.plugins import get_host
    from accelbench.results import read_record, write_record

    launcher = Launcher(err, args.argv)
    if launcher.adopt_job_shape(getattr(args, "devices", None), getattr(args, "nnodes", None)):
        args.devices, args.nnodes = launcher.env.local_world_size, launcher.env.nnodes
        if hasattr(args, "node_rank"):
            del args.node_rank
    from accelbench.cli import config_from_args

    config = config_from_args(args)
    host = get_host()

    made: list[Preflight] = []  # this process's preflight, handed to the run if it trains here

    def preflight_once() -> bool:
        """Said once, by the process the user started; True where the job needs worker processes."""
        from accelbench.engine.runner import check_run_on_host, preflight

        checked = preflight(config, host)
        made.append(checked)
        check_run_on_host(checked.config, launcher.env.launcher == "none", checked.workload)
        for warning in checked.warnings:
            err.print(f"[bold yellow]warning:[/] {_escape(warning)}", highlight=False, soft_wrap=True)
        spread = (
            config.devices * config.nnodes > 1 and checked.collective is not None
        )  # IPUs replicate in one
        prepare = getattr(checked.workload, "prepare", None)
        if (
            spread and prepare is not None
        ):  # once here, rather than in every worker at once (a tokenizer cache)
            prepare(checked.config)
        return spread

    shape = JobShape(
        config.devices,
        config.nnodes,
        config.node_rank,
        config.rdzv_endpoint,
        config.output_dir,
        config.threads,
    )
    records = RecordKind(
        "result record", read_record, lambda r, folder, path: write_record(r, folder, path=path)
    )
    return launcher.launch(
        shape,
        preflight_once,
        lambda env: _train_here(args, config, env, err, made[0] if made else None),
        records,
    )


def _train_here(
    args: argparse.Namespace, config: RunConfig, launch: LaunchEnv, err: Console, checked: Preflight | None
) -> int:
    """This process's part of the run: train (as a rank, or alone; ``checked``: the preflight this process made,
    if any); rank 0 writes and shows the record."""
    from accelbench.display import LiveProgress, LogProgress
    from accelbench.engine.runner import NoProgress, Progress, run
    from accelbench.plugins import get_host
    from accelbench.results import RecordNotSaved

    progress: Progress = NoProgress()
    if not args.quiet and launch.rank == 0:
        progress = LiveProgress(err) if err.is_terminal else LogProgress(sys.stderr)
    try:
        with _stdout_to_stderr() if args.json else contextlib.nullcontext():  # keep --json output clean
            record, path, status = run(config, get_host(), progress, launch, checked)
    except RecordNotSaved as exc:  # measured, but the folder could not take it: the record goes to stdout
        print(exc.text, flush=True)
        err.print(f"[bold red]error:[/] {_escape(str(exc))}", highlight=False, soft_wrap=True)
        return ExitCode.ERROR
    if record is not None:
        if args.json:
            print(record.to_json(), flush=True)
        if not args.quiet:
            from accelbench.display import summary_table

            err.print(summary_table(record))
            err.print(f"result record: {path}", highlight=False, soft_wrap=True)
        elif record.outcome.status != "ok" and launch.rank == 0:  # quiet, but a failure always says why
            why = (record.outcome.message or "").strip().splitlines()
            err.print(f"[bold red]{record.outcome.status}:[/] {_escape(why[0] if why else 'no message')} "
                      f"(result record: {path})", highlight=False, soft_wrap=True)  # fmt: skip
    return ExitCode.of_status(status)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Send everything written to stdout (by libraries, even from C++) to stderr while it lasts."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
