"""One launcher for every command that runs on ranks (``run``, ``comm``): optimum-benchmark's ``Launcher.launch(worker)``.

A command hands :class:`Launcher` its preflight check and its worker function. The launcher decides where the
worker runs: here, when this process is already a rank (torchrun, srun or mpirun started it, or a single process
suffices), or on ``--devices`` workers per node started through torch.distributed's elastic launcher
(:func:`accelbench.launch.launch_workers`, the same command again), after which it reads the record rank 0 wrote and
ends as the record says, adding what only the launcher saw (a rank's exit code, a signal).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelbench.errors import ResultFileError
from accelbench.exitcodes import ExitCode
from accelbench.launch import (
    RUN_ID_ENV,
    LaunchEnv,
    binding_note,
    check_launch,
    check_rendezvous_port,
    detect_launch,
    launch_workers,
    threads_note,
    with_reachable_master,
)
from accelbench.results import fallback_dir

if TYPE_CHECKING:
    from rich.console import Console


@dataclass(frozen=True)
class JobShape:
    """What the user asked for: worker processes per node, nodes, this node's rank and the rendezvous."""

    devices: int
    nnodes: int
    node_rank: int
    rdzv_endpoint: str | None
    output_dir: Path
    threads: int | None = None  # --threads: each worker's OpenMP threads where OMP_NUM_THREADS is unset


@dataclass(frozen=True)
class RecordKind:
    """The record a command's rank 0 writes, as the launcher reads it back: ``read`` raises ResultFileError, ``write``
    replaces it atomically at a path."""

    noun: str  # "result record", "comm record"
    read: Callable[[Path], Any]
    write: Callable[[Any, Path, Path], Any]


class Launcher:
    """Runs a command's worker on the job's ranks (see the module docstring)."""

    def __init__(self, err: Console, argv: Sequence[str] | None = None) -> None:
        self.err = err
        self.argv = list(sys.argv[1:] if argv is None else argv)
        self.env: LaunchEnv = detect_launch()

    def adopt_job_shape(self, devices: int | None, nnodes: int | None) -> bool:
        """When torchrun, srun or mpirun started this process, the job's shape comes from there (checked against
        ``--devices``/``--nnodes`` if given): True, and the command takes ``env.local_world_size`` and
        ``env.nnodes``; False for a process the user started."""
        if self.env.launcher == "none":
            return False
        check_launch(self.env, devices, nnodes)
        self.env = with_reachable_master(self.env, exported_addr=bool(os.environ.get("MASTER_ADDR")))
        return True

    def launch(
        self,
        shape: JobShape,
        preflight: Callable[[], bool],
        worker: Callable[[LaunchEnv], int],
        kind: RecordKind,
    ) -> int:
        """Check once (``preflight``, in the process the user started; True where the job needs worker processes),
        then run ``worker`` here, or start the workers and wait for them."""
        from accelbench.engine.signals import TERMINATION

        TERMINATION.install()
        started_by_us = self.env.launcher == "torchrun" and os.environ.get(RUN_ID_ENV) is not None
        if self.env.rank == 0 and not started_by_us:
            self._note_binding()
            check_rendezvous_port(self.env, exported_port=bool(os.environ.get("MASTER_PORT")))
            spread = preflight()
            if self.env.launcher == "none" and spread:
                return self.start_and_wait(shape, kind)
        return worker(self.env)

    def _note_binding(self) -> None:
        from accelbench.hostinfo import usable_cores

        for note in (
            binding_note(self.env, usable_cores(), os.cpu_count() or 1),
            threads_note(self.env, os.environ),
        ):
            if note:
                self._say(f"[yellow]note:[/] {_escape(note)}")

    def start_and_wait(self, shape: JobShape, kind: RecordKind) -> int:
        """Start this same command as one worker per device through torch.distributed's launcher, wait, and end as
        the record rank 0 wrote says; a rank's exit code only the launcher saw is added to a failed record."""
        launched = launch_workers(
            self.argv, shape.devices, shape.nnodes, shape.node_rank, shape.rdzv_endpoint, shape.threads
        )
        failures = launched.failures
        if shape.node_rank != 0:  # rank 0's node reports; this one says how its own workers ended
            return ExitCode.ERROR if failures else ExitCode.INTERRUPTED if launched.signal else ExitCode.OK
        pattern = f"*_{launched.run_id[:8]}.json"
        found = sorted(shape.output_dir.glob(pattern))
        record = None
        if found:
            with contextlib.suppress(ResultFileError):
                record = kind.read(found[-1])
        if record is not None:
            if failures and record.outcome.status != "ok":  # add what only the launcher saw: exit codes
                seen = "; ".join(
                    f"rank {r} exited with code {code}" for r, (code, _) in sorted(failures.items())
                )
                outcome = record.outcome.model_copy(
                    update={"message": f"{record.outcome.message} [launcher: {seen}]"}
                )
                kind.write(record.model_copy(update={"outcome": outcome}), shape.output_dir, found[-1])
            if launched.signal:
                self._say(
                    f"[bold yellow]{launched.signal}:[/] the workers were stopped; the {kind.noun} keeps what every "
                    f"rank completed: {found[-1]}"
                )
                return ExitCode.INTERRUPTED
            return ExitCode.of_status(record.outcome.status)
        for rank, (code, message) in sorted(failures.items()):
            self._say(f"[bold red]rank {rank} failed[/] (exit code {code}): {_escape(message)}")
        kept = sorted(fallback_dir().glob(pattern))
        if kept:
            self._say(f"[bold red]error:[/] the {kind.noun} could not be written to {shape.output_dir}; it was kept in "
                      f"{kept[-1]}")  # fmt: skip
        elif launched.signal:
            self._say(f"[bold yellow]{launched.signal}:[/] the job was stopped before anything was measured")
            return ExitCode.INTERRUPTED
        else:
            self._say(
                f"[bold red]error:[/] no {kind.noun} was written (rank 0 ended before it could write one)"
            )
        return ExitCode.ERROR

    def _say(self, text: str) -> None:
        self.err.print(text, highlight=False, soft_wrap=True)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
