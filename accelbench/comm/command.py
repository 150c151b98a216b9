"""`accelbench comm` on the command line: checked before anything starts, launched as `accelbench run` is, measured
on every rank, one record written by rank 0.

A job is started one of the ways `run` is started: ``--devices N`` (this command hands itself to torch.distributed's
elastic launcher, one worker per device, through :func:`accelbench.launch.launch_workers`; ``--nnodes``,
``--node-rank`` and ``--rdzv-endpoint`` across nodes), or by torchrun, srun or mpirun, recognised from their
environment (:func:`accelbench.launch.detect_launch`).
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from accelbench.comm.options import comm_config, describe
from accelbench.comm.records import (
    IN_STEP_TIMING,
    CommConfig,
    CommRecord,
    read_comm_record,
    write_comm_record,
)
from accelbench.errors import BackendError, ConfigError
from accelbench.exitcodes import ExitCode
from accelbench.results import check_writable

if TYPE_CHECKING:
    from rich.console import Console

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

    ranks = config.devices * config.nnodes
    if ranks < 2:
        raise ConfigError(
            f"collective bandwidth needs 2 or more ranks, and this job has {ranks}: give --devices 2 (or more), "
            "or start it with torchrun/srun/mpirun across 2 or more processes"
        )
    backend = host.select_backend(config.backend)
    collective = backend.collective(backend.device_kind())
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


def check_on_host(config: CommConfig, checked: Checked, spawning: bool, flag: str = "--max-bytes") -> None:
    """What the job asks of this host, checked once before any rank starts: its ranks' processes and threads (where
    accelbench starts them: ``spawning``) and every message size's buffers against the memory each rank has: the
    host's available memory shared by its ranks on a CPU, else the device's (``flag``: the option that gave the
    sizes)."""
    import psutil

    from accelbench.comm.collectives import size_label
    from accelbench.comm.options import HOST_MEMORY_SHARE, check_sizes_fit
    from accelbench.engine.runner import PROCESS_BASELINE_BYTES, check_host_capacity

    local = config.devices
    if spawning:
        check_host_capacity(local, config.threads)
    ranks = config.devices * config.nnodes
    if checked.backend.info.device_type == "cpu":
        available = psutil.virtual_memory().available
        room = int(available * HOST_MEMORY_SHARE) - (local * PROCESS_BASELINE_BYTES if spawning else 0)
        where = (
            f"this host's available memory ({size_label(available)}; {HOST_MEMORY_SHARE:.0%} of it for the "
            f"buffers{', less each rank process' if spawning else ''}), shared by its {local} rank(s),"
        )
        check_sizes_fit(config, ranks, max(0, room // local), where, flag)
        return
    known = [d.memory_bytes for d in checked.devices[:local] if d.memory_bytes]
    if known:
        name = checked.devices[0].name
        check_sizes_fit(config, ranks, min(known), f"each {name} ({size_label(min(known))})", flag)


def comm_command(args: argparse.Namespace, err: Console) -> int:
    """`accelbench comm`: check, launch the workers (or be one), measure, write the record."""
    from accelbench.launcher import JobShape, Launcher, RecordKind
    from accelbench.plugins import get_host

    config, job_shape = comm_config(args)
    launcher = Launcher(err, getattr(args, "argv", None))
    if launcher.adopt_job_shape(getattr(args, "devices", None), getattr(args, "nnodes", None)):
        config = config.model_copy(
            update={"devices": launcher.env.local_world_size, "nnodes": launcher.env.nnodes}
        )
    host = get_host()

    size_flag = "--sizes" if args.sizes is not None else "--max-bytes"

    def preflight_once() -> bool:
        checked = preflight(config, host)
        check_on_host(config, checked, launcher.env.launcher == "none", size_flag)
        return True  # collectives need 2 or more ranks: the check refuses fewer

    shape = JobShape(
        config.devices,
        config.nnodes,
        job_shape.node_rank,
        job_shape.rdzv_endpoint,
        config.output_dir,
        config.threads,
    )
    records = RecordKind("comm record", read_comm_record, write_comm_record)
    return launcher.launch(
        shape, preflight_once, lambda env: measure_here(args, config, host, env, err), records
    )


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
    collective = backend.collective(device) or checked.collective
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
        in_step_timing=IN_STEP_TIMING if config.in_step_ms else None,
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
        from rich.text import Text

        from accelbench.comm.grade import grade_record

        for grade in grade_record(
            record
        ):  # is this bandwidth good? against the ceiling of the link it crossed
            style = "yellow" if grade.verdict == "far below" else ""
            err.print(Text("bandwidth: " + grade.describe(), style=style), soft_wrap=True)
    return ExitCode.of_status(outcome.status)


def _ignore(row: object) -> None:
    pass


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
