"""``accelbench fleet``: the same short benchmark on every node of an allocation, one record per node, then
``compare --fleet`` over them.

The nodes are started by the cluster's own launcher, never by accelbench: ``srun --nodes=N --ntasks-per-node=1``
inside a Slurm allocation, ``mpirun --map-by ppr:1:node`` where the allocation is MPI's (a PBS, LSF or SGE host
file, or ``--launcher mpirun``). Each node's task is an independent single-node ``accelbench run`` on that node's own
devices: it is run with the launcher's rank variables removed (:func:`accelbench.launch.without_launcher`), so it
neither adopts the step as one multi-node job nor waits for a rendezvous with the other nodes; with ``--devices N``
it starts its N workers on its node as ``accelbench run`` does. Every record goes to one folder (named by its host,
:func:`accelbench.results.record_name`), which ``compare --fleet`` then ranks.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from accelbench.errors import ConfigError
from accelbench.exitcodes import ExitCode

if TYPE_CHECKING:
    from rich.console import Console

# the fleet's own options, taken out of the command line before the rest goes to every node's `accelbench run`
OWN_OPTIONS = {"--nodes": True, "--launcher": True, "--hostfile": True, "--dry-run": False}
# host files of the schedulers whose allocations mpirun reads (PBS/Torque, LSF, SGE)
HOSTFILE_VARIABLES = ("PBS_NODEFILE", "LSB_DJOB_HOSTFILE", "PE_HOSTFILE")
NODE_MODULE = (
    "accelbench.commands.fleet"  # what each node runs: `python -m accelbench.commands.fleet <run options>`
)


def add_fleet_arguments(parser: argparse.ArgumentParser) -> None:
    """The fleet's own options (the run's are added beside them by the command line)."""
    own = parser.add_argument_group("fleet options (every other option is the run's, the same on every node)")
    own.add_argument(
        "--nodes", type=int, metavar="N", help="how many of the allocation's nodes (default: all)"
    )
    own.add_argument(
        "--launcher",
        choices=("auto", "srun", "mpirun"),
        default="auto",
        help="what starts one task per node (default: srun inside a Slurm allocation, mpirun inside a PBS, LSF "
        "or SGE one)",
    )
    own.add_argument("--hostfile", type=Path, metavar="FILE", help="mpirun's host file (one node per line)")
    own.add_argument("--dry-run", action="store_true", help="print the launcher's command line, run nothing")


@dataclass(frozen=True)
class Allocation:
    """The nodes this fleet runs on, as the scheduler granted them."""

    launcher: str  # "srun" or "mpirun"
    nodes: int | None  # None: mpirun's own allocation, whose size it alone knows
    job_id: str | None
    hostfile: Path | None = None


def run_options(argv: Sequence[str]) -> list[str]:
    """``argv`` (``fleet ...``, as typed) less the command's name and the fleet's own options: every node's run."""
    rest, out = list(argv[1:]), []
    while rest:
        arg = rest.pop(0)
        name, has_value, _ = arg.partition("=")
        if name in OWN_OPTIONS:
            if OWN_OPTIONS[name] and not has_value and rest:
                rest.pop(0)
            continue
        out.append(arg)
    return out


def find_allocation(
    env: Mapping[str, str], launcher: str, nodes: int | None, hostfile: Path | None
) -> Allocation | None:
    """The allocation this process runs in, or None outside one. ``nodes`` (``--nodes``) takes fewer than all."""
    if launcher in ("auto", "srun") and env.get("SLURM_JOB_ID"):
        granted = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or "1"
        if not granted.isdigit():
            raise ConfigError(f"SLURM_JOB_NUM_NODES={granted!r} is not a node count")
        if nodes is not None and nodes > int(granted):
            raise ConfigError(f"--nodes {nodes}, but this Slurm allocation has {granted} node(s)")
        return Allocation("srun", nodes or int(granted), env["SLURM_JOB_ID"])
    if launcher == "srun":
        return None
    named = hostfile or next((Path(env[v]) for v in HOSTFILE_VARIABLES if env.get(v)), None)
    if named is None and launcher == "auto":
        return None
    hosts = _hosts(named) if named is not None else None
    if nodes is not None and hosts is not None and nodes > len(hosts):
        raise ConfigError(f"--nodes {nodes}, but {named} names {len(hosts)} node(s)")
    size = len(hosts) if hosts is not None else None  # else mpirun's own: a Slurm allocation's, or this host
    if size is None and (env.get("SLURM_JOB_NUM_NODES") or "").isdigit():
        size = int(env["SLURM_JOB_NUM_NODES"])
    job = next((env[v] for v in ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "JOB_ID") if env.get(v)), None)
    return Allocation("mpirun", nodes or size, job, named)


def _hosts(path: Path) -> list[str]:
    """The distinct hosts of a host file (PBS repeats a host once per slot; SGE's lines are `host slots ...`)."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read the host file {path}: {exc.strerror or exc}") from None
    hosts = [line.split()[0] for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return list(dict.fromkeys(hosts))


def node_command(allocation: Allocation, options: Sequence[str], python: str = sys.executable) -> list[str]:
    """The one launcher command that starts ``accelbench run <options>`` once on each node, each on its own.

    srun: one task per node, each given every CPU the job holds there (``--whole``) unbound (``--cpu-bind=none``),
    and a node that fails does not stop the others (``--kill-on-bad-exit=0``). mpirun: one process per node
    (``ppr:1:node``), unbound, ``PYTHONPATH`` passed on to the other nodes."""
    node = [python, "-m", NODE_MODULE, *options]
    if allocation.launcher == "srun":
        return [
            "srun", f"--nodes={allocation.nodes}", "--ntasks-per-node=1", f"--ntasks={allocation.nodes}",
            "--whole", "--cpu-bind=none", "--kill-on-bad-exit=0", "--label", *node,
        ]  # fmt: skip
    command = ["mpirun", "--map-by", "ppr:1:node", "--bind-to", "none", "--tag-output"]
    if allocation.nodes is not None:
        command += ["-np", str(allocation.nodes)]
    if allocation.hostfile is not None:
        command += ["--hostfile", str(allocation.hostfile)]
    if os.environ.get("PYTHONPATH"):
        command += ["-x", "PYTHONPATH"]
    return [*command, *node]


def no_allocation_message(argv: Sequence[str]) -> str:
    """What to type instead, outside an allocation: the same command under sbatch (or salloc)."""
    command = shlex.join(["accelbench", *argv])
    return (
        "accelbench fleet runs inside an allocation and starts one run per node through its launcher; there is "
        f"none here. Submit it: sbatch --nodes=4 --exclusive --wrap {shlex.quote(command)}   (or, interactively: "
        f"salloc --nodes=4 --exclusive {command}; under PBS, LSF or SGE it uses mpirun)"
    )


def fleet_command(args: argparse.Namespace, err: Console) -> int:
    """``accelbench fleet``: every node's run through the allocation's launcher, then ``compare --fleet``."""
    import subprocess

    from accelbench.cli import config_from_args
    from accelbench.launch import detect_launch

    launched = detect_launch()
    if launched.launcher != "none":
        raise ConfigError(
            f"accelbench fleet was started as a rank of a {launched.launcher} job; run it once, in the batch script "
            "or the salloc shell: it starts one task per node itself"
        )
    config = config_from_args(args)  # the run's options, judged once here rather than on every node
    if config.nnodes > 1 or config.rdzv_endpoint:
        raise ConfigError(
            "--nnodes/--rdzv-endpoint make one run across nodes; a fleet runs one single-node benchmark per node "
            "(--devices N still uses N devices on each)"
        )
    if args.nodes is not None and args.nodes < 1:
        raise ConfigError(f"--nodes {args.nodes}: give 1 or more")
    allocation = find_allocation(os.environ, args.launcher, args.nodes, args.hostfile)
    if allocation is None:
        raise ConfigError(no_allocation_message(args.argv))
    if shutil.which(allocation.launcher) is None and not args.dry_run:
        raise ConfigError(f"{allocation.launcher} is not on PATH here; load the module that provides it")
    folder = _fleet_folder(args, config.output_dir, allocation).resolve()
    options = [*run_options(args.argv), "--output-dir", str(folder), "--quiet"]
    command = node_command(allocation, options)
    if args.dry_run:
        print(shlex.join(command), flush=True)
        return ExitCode.OK
    folder.mkdir(parents=True, exist_ok=True)
    before = {p.name for p in folder.glob("*.json")}
    size = f"{allocation.nodes} node(s)" if allocation.nodes else "every node of the allocation"
    _say(err, f"fleet: {size} through {allocation.launcher}, records in {folder}")
    ended = subprocess.run(command, check=False).returncode
    return _report(err, folder, before, allocation, ended)


def _fleet_folder(args: argparse.Namespace, output_dir: Path, allocation: Allocation) -> Path:
    """``--output-dir`` where the user gave one (on the command line or in ``--config``); else a folder of this
    job's own, so that ``compare --fleet`` ranks this fleet alone."""
    given = "output_dir" in vars(args) or output_dir != Path("results")
    return output_dir if given else output_dir / f"fleet-{allocation.job_id or 'local'}"


def _report(err: Console, folder: Path, before: set[str], allocation: Allocation, ended: int) -> int:
    """One line per node that wrote a record, what is missing, then ``compare --fleet`` on the folder."""
    from accelbench.errors import ResultFileError
    from accelbench.results import read_record

    written = sorted(p for p in folder.glob("*.json") if p.name not in before)
    ok = 0
    for path in written:
        try:
            record = read_record(path)
        except ResultFileError as exc:
            _say(err, f"  [red]unreadable[/] {path.name}: {_escape(str(exc))}")
            continue
        ok += record.outcome.status == "ok"
        steady = record.metrics.steady if record.metrics is not None else None
        figure = f", median steady epoch {steady.epoch_s_median:.4g} s" if steady else ""
        _say(err, f"  {_escape(record.system.host)}: {record.outcome.status}{figure}  ({path.name})")
    expected = allocation.nodes if allocation.nodes is not None else len(written)
    if len(written) < expected:
        _say(
            err,
            f"[bold red]fleet:[/] {len(written)} of {expected} node(s) wrote a record in {folder} ({allocation.launcher} "
            f"ended with {ended}); the folder must be on a filesystem every node shares",
        )
    from accelbench.cli import main

    main(["compare", str(folder), "--fleet"])
    return ExitCode.OK if ok == expected and len(written) == expected and ended == 0 else ExitCode.ERROR


def _say(err: Console, text: str) -> None:
    err.print(text, highlight=False, soft_wrap=True)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def node_main(argv: Sequence[str]) -> int:
    """One node's run: ``accelbench run <argv>`` as a process of its own, not a rank of the launcher's job."""
    from accelbench.cli import main
    from accelbench.launch import without_launcher

    alone = without_launcher(os.environ)
    os.environ.clear()
    os.environ.update(alone)
    return main(["run", *argv])


if __name__ == "__main__":
    sys.exit(node_main(sys.argv[1:]))
