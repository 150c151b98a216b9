"""`accelbench comm` on the command line: checked before anything starts, launched as `accelbench run` is, measured
on every rank, one record written by rank 0.

A job is started one of the ways `run` is started: ``--devices N`` (this command hands itself to torch.distributed's
elastic launcher, one worker per device, through :func:`accelbench.launch.launch_workers`; ``--nnodes``,
``--node-rank`` and ``--rdzv-endpoint`` across nodes), or by torchrun, srun or mpirun, recognised from their
environment (:func:`accelbench.launch.detect_launch`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from accelbench.comm.options import comm_config, describe
from accelbench.comm.records import CommConfig, CommRecord, read_comm_record, write_comm_record
from accelbench.errors import BackendError, ConfigError, ResultFileError
from accelbench.exitcodes import ExitCode
from accelbench.results import check_writable, fallback_dir

if TYPE_CHECKING:
    from rich.console import Console

    from accelbench.config import RunConfig
    from accelbench.contract import Backend, DeviceInfo
    from accelbench.launch import LaunchEnv
    from accelbench.plugins import PluginHost


@dataclass(frozen=True)
class Checked:
    """What a job needs that can be checked without touching a device."""

    backend: Backend
    devices: list[DeviceInfo]
    collective: str


def preflight(config: CommConfig, host: PluginHost) -> Checked:
    """Refuse, before anything starts, what cannot measure: one rank, a backend without torch.distributed
    collectives (IPUs replicate inside one process), no device, more devices than found, an unwritable folder."""
    import torch

    ranks = config.devices * config.nnodes
    if ranks < 2:
        raise ConfigError(
            f"collective bandwidth needs 2 or more ranks, and this job has {ranks}: give --devices 2 (or more), "
            "or start it with torchrun/srun/mpirun across 2 or more processes"
        )
    backend = host.select_backend(config.backend)
    collective = backend.collective_backend(torch.device(backend.info.device_type))
    if collective is None:
        raise ConfigError(
            f"backend {backend.name!r} has no torch.distributed collective backend (its devices replicate inside "
            "one process), so accelbench comm cannot measure its collectives; choose another --backend"
        )
    devices = backend.detect()
    if not devices:
        reason = f" (detection failed: {backend.detect_error})" if backend.detect_error else ""
        raise BackendError(f"backend {backend.name!r} found no device on this host{reason}")
    if backend.info.device_type != "cpu" and config.devices > len(devices):
        raise ConfigError(
            f"--devices {config.devices}, but backend {backend.name!r} detected {len(devices)} on this node: "
            + ", ".join(f"{d.index}: {d.name}" for d in devices)
        )
    check_writable(config.output_dir)
    return Checked(backend, devices, collective)


def comm_command(args: argparse.Namespace, err: Console) -> int:
    """`accelbench comm`: check, launch the workers (or be one), measure, write the record."""
    from accelbench.engine.signals import TERMINATION
    from accelbench.launch import RUN_ID_ENV, check_launch, detect_launch
    from accelbench.plugins import get_host

    config, job_shape = comm_config(args)
    launch = detect_launch()
    if launch.launcher != "none":  # a worker of torchrun, srun or mpirun: the job's shape comes from there
        check_launch(launch, getattr(args, "devices", None), getattr(args, "nnodes", None))
        config = config.model_copy(update={"devices": launch.local_world_size, "nnodes": launch.nnodes})
    host = get_host()
    TERMINATION.install()
    worker = launch.launcher == "torchrun" and os.environ.get(RUN_ID_ENV) is not None  # one we started
    if launch.rank == 0 and not worker:
        preflight(config, host)
        if launch.launcher == "none":
            return launch_and_wait(args, config, job_shape, err)
    return measure_here(args, config, host, launch, err)


def measure_here(
    args: argparse.Namespace, config: CommConfig, host: PluginHost, launch: LaunchEnv, err: Console
) -> int:
    """This rank's part: bind the device, join the process group, measure; rank 0 writes the record."""
    import torch

    from accelbench.comm.render import TablePrinter
    from accelbench.comm.run import Job, measure
    from accelbench.engine.ranks import (
        collect_statuses,
        destroy_process_group,
        init_process_group,
        report_status,
    )
    from accelbench.hostinfo import usable_cores
    from accelbench.launch import RUN_ID_ENV
    from accelbench.results import BackendRecord, Outcome, RecordNotSaved
    from accelbench.system import collect_system_info

    checked = preflight(config, host)
    backend = checked.backend
    created = datetime.now(timezone.utc)
    if config.threads:
        torch.set_num_threads(config.threads)
    elif backend.info.device_type == "cpu" and launch.local_world_size > 1:
        torch.set_num_threads(
            max(1, usable_cores() // launch.local_world_size)
        )  # ranks share the host's cores
    from accelbench.contract import World

    world = World(launch.rank, launch.local_rank, launch.world_size, launch.local_world_size, launch.nnodes)
    device = backend.setup_device(world, {})  # comm declares no backend options
    collective = backend.collective_backend(device) or checked.collective
    init_process_group(launch, collective, device, config.collective_timeout)
    rank0 = launch.rank == 0
    table = sys.stderr if args.json else sys.stdout
    printer = TablePrinter(table, launch.world_size) if rank0 and not args.quiet else None
    if printer:
        printer.intro([
            f"accelbench comm: {launch.world_size} ranks on {launch.nnodes} node(s), backend {backend.name} "
            f"({collective} on {device.type}: {checked.devices[0].name}), launcher {launch.launcher}",
            describe(config),
        ])  # fmt: skip
    try:
        measurements, outcome = measure(
            Job(config, backend, device, launch), printer.row if printer else _ignore
        )
        if printer:
            printer.close()
        if not rank0:
            report_status(launch.rank, outcome.status, outcome.message)
        elif (
            outcome.status == "error"
        ):  # what the other ranks saw, briefly waited for (a signal reached them all)
            others = collect_statuses(launch.world_size, min(config.collective_timeout, 10.0))
            seen = [f"rank {r}: {s['status']}: {s['message']}" if s else f"rank {r}: sent no status (died or hangs)"
                    for r, s in sorted(others.items()) if r != 0 and (s is None or s["status"] != "ok")]  # fmt: skip
            if seen:
                message = "; ".join([f"rank 0: {outcome.message}", *seen])
                outcome = Outcome(status=outcome.status, message=message, traceback=outcome.traceback)
    finally:
        destroy_process_group()
    if not rank0:
        return ExitCode.of_status(outcome.status)
    plugin = next(r for r in host.records if r.backend is not None and r.backend.name == backend.name)
    record = CommRecord(
        run_id=os.environ.get(RUN_ID_ENV) or uuid.uuid4().hex,
        created_at=created,
        outcome=outcome,
        config=config,
        system=collect_system_info(host.recorded_environment()),
        backend=BackendRecord(
            info=backend.info,
            distribution=plugin.distribution,
            version=plugin.version,
            devices=checked.devices,
            devices_used=launch.world_size,
            collective_backend=collective,
            runtime_versions=backend.runtime_versions(),
        ),
        plugins=host.versions(),
        world_size=launch.world_size,
        nodes=launch.nnodes,
        launcher=launch.launcher,
        measurements=measurements,
    )
    try:
        path = write_comm_record(record, config.output_dir)
    except RecordNotSaved as exc:  # measured, but the folder could not take it: the record goes to stdout
        print(exc.text, flush=True)
        err.print(f"[bold red]error:[/] {_escape(str(exc))}", highlight=False, soft_wrap=True)
        return ExitCode.ERROR
    if args.json:
        print(record.to_json(), flush=True)
    if outcome.status != "ok":
        err.print(
            f"[bold red]{outcome.status}:[/] {_escape(outcome.message or '')}",
            highlight=False,
            soft_wrap=True,
        )
    elif outcome.message:
        err.print(f"[yellow]note:[/] {_escape(outcome.message)}", highlight=False, soft_wrap=True)
    if not args.quiet:
        err.print(f"comm record: {path}", highlight=False, soft_wrap=True)
    return ExitCode.of_status(outcome.status)


def _ignore(row: object) -> None:
    pass


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def launch_and_wait(args: argparse.Namespace, config: CommConfig, job_shape: RunConfig, err: Console) -> int:
    """Start this same command as one worker per device through torch.distributed's launcher, wait, and end as
    the record says (rank 0's node); the launcher's own view (exit codes, a signal) is told beside it."""
    from accelbench.launch import launch_workers

    argv = sys.argv[1:] if getattr(args, "argv", None) is None else args.argv
    launched = launch_workers(
        argv, config.devices, config.nnodes, job_shape.node_rank, job_shape.rdzv_endpoint
    )
    if job_shape.node_rank != 0:
        return (
            ExitCode.ERROR if launched.failures else ExitCode.INTERRUPTED if launched.signal else ExitCode.OK
        )
    pattern = f"*_{launched.run_id[:8]}.json"
    found = sorted(config.output_dir.glob(pattern))
    record = None
    if found:
        with contextlib.suppress(ResultFileError):
            record = read_comm_record(found[-1])
    if launched.signal:
        kept = (
            f"; the record keeps the sizes measured: {found[-1]}"
            if found
            else ", before a record was written"
        )
        err.print(
            f"[bold yellow]{launched.signal}:[/] the workers were stopped{kept}",
            highlight=False,
            soft_wrap=True,
        )
        return ExitCode.INTERRUPTED
    if record is not None:
        return ExitCode.of_status(record.outcome.status)
    for rank, (code, message) in sorted(launched.failures.items()):
        err.print(
            f"[bold red]rank {rank} failed[/] (exit code {code}): {_escape(message)}",
            highlight=False,
            soft_wrap=True,
        )
    kept_files = sorted(fallback_dir().glob(pattern))
    if kept_files:
        err.print(
            f"[bold red]error:[/] the record could not be written to {config.output_dir}; it was kept in {kept_files[-1]}"
        )
    else:
        err.print("[bold red]error:[/] no comm record was written (rank 0 ended before it could write one)")
    return ExitCode.ERROR
