"""A real one-node Slurm (munge, slurmctld, slurmd) and a real Open MPI ``mpirun`` for the launcher tests.

The tests in ``test_real_launchers.py`` start accelbench the way users do on a cluster: through ``srun``, ``sbatch``
and ``mpirun``, never by setting a launcher's variables by hand. Debian's packages (``apt-get install slurm-wlm munge
openmpi-bin``) run here as root without cgroups (``proctrack/linuxproc``, ``task/none``). The Slurm configuration,
state, spool and logs live in a temporary folder that ``SLURM_CONF`` points at, so ``/etc/slurm`` is never touched;
munge uses its packaged key. Where a binary is missing or a daemon does not come up, :class:`ClusterUnavailable`
says why, and the fixtures skip with that reason.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SLURM_BINARIES = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "sinfo", "squeue", "scontrol")
START_TIMEOUT_S = (
    60.0  # slurmd registers and the node turns idle within seconds; a minute means it never will
)


class ClusterUnavailable(Exception):
    """This host cannot run the real launcher: the message says what is missing or what failed."""


def _binary(name: str) -> str | None:
    return shutil.which(name) or next(
        (str(p) for p in (Path("/usr/sbin") / name, Path("/usr/bin") / name) if p.is_file()), None
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def job_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a launched accelbench needs: this checkout's accelbench first on the path, the virtual
    environment's ``accelbench`` command on PATH, and no launcher variables of the process running the tests."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "OMPI_", "PMIX_", "PMI_"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        and k not in ("TORCHELASTIC_RUN_ID",)
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "/usr/bin:/bin")])
    env.update(extra or {})
    return env


def _munge_works() -> bool:
    try:
        cred = subprocess.run(["munge", "-n"], capture_output=True, timeout=10, check=False)
        if cred.returncode != 0:
            return False
        check = subprocess.run(["unmunge"], input=cred.stdout, capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return check.returncode == 0


@dataclass
class Daemons:
    """Processes these fixtures started, to stop by their ids (and only them) at the end."""

    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)  # daemons that forked away (munged)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


def _start_munge(daemons: Daemons) -> None:
    """Use a running munged, or start one as the munge user with the packaged key (``/etc/munge/munge.key``)."""
    if _munge_works():
        return
    munged = _binary("munged")
    if munged is None or _binary("munge") is None:
        raise ClusterUnavailable("munge is not installed (apt-get install munge)")
    if os.geteuid() != 0:
        raise ClusterUnavailable("munged is not running and only root can start it for these tests")
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        raise ClusterUnavailable(f"no munge key at {key} (the munge package creates one when it installs)")
    run_dir = Path("/run/munge")
    run_dir.mkdir(mode=0o755, exist_ok=True)
    shutil.chown(run_dir, "munge", "munge")
    pidfile = run_dir / "munged.pid"
    started = subprocess.run(
        ["runuser", "-u", "munge", "--", munged], capture_output=True, text=True, check=False
    )
    if started.returncode != 0:
        raise ClusterUnavailable(f"munged did not start: {started.stderr.strip()[-500:]}")
    if pidfile.exists():
        daemons.pids.append(int(pidfile.read_text().split()[0]))
    deadline = time.monotonic() + 10
    while not _munge_works():
        if time.monotonic() > deadline:
            raise ClusterUnavailable("munged started but `munge -n | unmunge` does not succeed")
        time.sleep(0.2)


def slurm_conf(folder: Path, node: str, cpus: int, nodes: Sequence[str] = ()) -> str:
    """A minimal one-node configuration without cgroups (CLUSTER.md's), everything under ``folder``, on free ports.
    With ``nodes``, several Slurm nodes of ``cpus`` each on this one host (``node``): a slurmd each (``slurmd -N
    name``), on its own port, with its own spool folder, pid file and log (``%n``, the node's name)."""
    if nodes:
        return _several_nodes(slurm_conf(folder, node, cpus), folder, node, cpus, nodes)
    return "\n".join([
        "ClusterName=accelbench-test",
        f"SlurmctldHost={node}(127.0.0.1)",
        f"SlurmctldPort={_free_port()}",
        f"SlurmdPort={_free_port()}",
        "SlurmUser=root",
        "AuthType=auth/munge",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "ReturnToService=2",
        "MpiDefault=none",
        "JobAcctGatherType=jobacct_gather/none",
        f"StateSaveLocation={folder / 'state'}",
        f"SlurmdSpoolDir={folder / 'spool'}",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
        f"SlurmdPidFile={folder / 'slurmd.pid'}",
        f"SlurmctldLogFile={folder / 'slurmctld.log'}",
        f"SlurmdLogFile={folder / 'slurmd.log'}",
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
        f"PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP",
        "",
    ])  # fmt: skip


def _several_nodes(conf: str, folder: Path, host: str, cpus: int, nodes: Sequence[str]) -> str:
    per_node = (
        "SlurmdPort=",
        "SlurmdSpoolDir=",
        "SlurmdPidFile=",
        "SlurmdLogFile=",
        "NodeName=",
        "PartitionName=",
    )
    lines = [line for line in conf.splitlines() if line and not line.startswith(per_node)]
    lines += [f"SlurmdSpoolDir={folder / 'spool-%n'}", f"SlurmdPidFile={folder / 'slurmd-%n.pid'}",
              f"SlurmdLogFile={folder / 'slurmd-%n.log'}"]  # fmt: skip
    lines += [
        f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={_free_port()} CPUs={cpus} State=UNKNOWN"
        for name in nodes
    ]
    return "\n".join(
        [*lines, f"PartitionName=debug Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP", ""]
    )


@dataclass
class SlurmCluster:
    """A running one-node Slurm: its configuration folder and the environment every Slurm command needs."""

    folder: Path
    node: str
    daemons: Daemons
    nodes: list[str] = field(default_factory=list)  # the Slurm nodes on this host, where there are several

    @property
    def env(self) -> dict[str, str]:
        return job_env({"SLURM_CONF": str(self.folder / "slurm.conf")})

    def command(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(args), capture_output=True, text=True, env=self.env, timeout=timeout, check=False
        )

    def node_state(self) -> str:
        """``idle`` when every node is (one state per node otherwise, as sinfo lists them)."""
        out = self.command("sinfo", "-h", "-N", "-o", "%T", timeout=10)
        if out.returncode != 0:
            return f"sinfo failed: {out.stderr.strip()}"
        states = out.stdout.split()
        return "idle" if states and set(states) == {"idle"} else " ".join(states)

    def srun(self, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["srun", *args],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=cwd,
            timeout=timeout,
            check=False,
        )

    def sbatch(self, script: Path, cwd: Path) -> str:
        """Submit ``script`` from ``cwd``; the job id."""
        out = subprocess.run(
            ["sbatch", "--parsable", str(script)], capture_output=True, text=True, env=self.env, cwd=cwd,
            timeout=30, check=False,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        return out.stdout.strip().split(";")[0]

    def wait_for_job(self, job_id: str, timeout: float = 300) -> str:
        """Poll until the job has left the queue; its final state (``scontrol show job``), or AssertionError."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            shown = self.command("scontrol", "-o", "show", "job", job_id, timeout=10).stdout
            state = re.search(r"JobState=(\S+)", shown)
            if state and state.group(1) not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
                return state.group(1)
            time.sleep(1)
        self.command("scancel", job_id)
        raise AssertionError(f"Slurm job {job_id} did not end within {timeout:.0f} s")

    def stop(self) -> None:
        """Cancel what is still queued or running (a test that timed out leaves its tasks to slurmstepd, which
        outlives slurmd), then stop the daemons by process id."""
        try:
            jobs = self.command("squeue", "-h", "-o", "%i", timeout=10).stdout.split()
            if jobs:
                self.command("scancel", *jobs, timeout=10)
                deadline = time.monotonic() + 20
                while self.command("squeue", "-h", timeout=10).stdout.strip() and time.monotonic() < deadline:
                    time.sleep(0.5)
        finally:
            self.daemons.stop()

    def logs(self) -> str:
        names = ("slurmctld.log", "slurmd.log", *(f"slurmd-{n}.log" for n in self.nodes))
        return "\n".join(
            f"--- {name}\n" + (self.folder / name).read_text(errors="replace")[-3000:]
            for name in names
            if (self.folder / name).exists()
        )


def start_slurm(folder: Path, nodes: int = 1) -> SlurmCluster:
    """munge, then slurmctld and slurmd in the foreground (``-D``, so their ids are the processes started here),
    then wait until ``sinfo`` shows the node idle. Raises :class:`ClusterUnavailable` saying why not.

    ``nodes`` > 1: that many Slurm nodes on this host, of one CPU each, a slurmd each (``slurmd -N name``; Debian's
    build runs several on one host, each on its own port); a job on 2 of them is a real 2-node job to Slurm, whose
    tasks share this host's name."""
    missing = [name for name in SLURM_BINARIES if _binary(name) is None]
    if missing:
        raise ClusterUnavailable(
            f"Slurm is not installed ({', '.join(missing)} missing): apt-get install slurm-wlm munge"
        )
    if os.geteuid() != 0:
        raise ClusterUnavailable(
            "the test cluster runs slurmd as root (SlurmUser=root); these tests are not root"
        )
    cpus = os.cpu_count() or 1
    if cpus < 2:
        raise ClusterUnavailable(f"a 2-rank job needs 2 CPUs; this host has {cpus}")
    node = socket.gethostname().split(".")[0]
    names = [f"{node}-{i}" for i in range(1, nodes + 1)] if nodes > 1 else []
    daemons = Daemons()
    cluster = SlurmCluster(folder, node, daemons, names)
    try:
        _start_munge(daemons)
        for sub in ("state", "spool", *(f"spool-{n}" for n in names)):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        (folder / "slurm.conf").write_text(slurm_conf(folder, node, 1 if names else 2, names))
        env = cluster.env
        slurmds = [("slurmd", f"slurmd-{n}", ["-N", n]) for n in names] or [("slurmd", "slurmd", [])]
        for daemon, label, extra in [("slurmctld", "slurmctld", []), *slurmds]:
            daemons.procs.append(subprocess.Popen(
                [str(_binary(daemon)), "-D", *extra, "-f", str(folder / "slurm.conf")], env=env,
                stdout=subprocess.DEVNULL, stderr=(folder / f"{label}.stderr").open("wb"),
            ))  # fmt: skip
            time.sleep(0.5 if daemon == "slurmctld" else 0)
        deadline = time.monotonic() + START_TIMEOUT_S
        state = ""
        while time.monotonic() < deadline:
            for proc in daemons.procs:
                if proc.poll() is not None:
                    args = [str(a) for a in proc.args]  # type: ignore[union-attr]
                    name = Path(args[0]).name + (f"-{args[args.index('-N') + 1]}" if "-N" in args else "")
                    stderr = (folder / f"{name}.stderr").read_text(errors="replace")[-1000:]
                    raise ClusterUnavailable(
                        f"{name} exited with code {proc.returncode}: {stderr}\n{cluster.logs()}"
                    )
            state = cluster.node_state()
            if state == "idle":
                return cluster
            time.sleep(0.5)
        raise ClusterUnavailable(
            f"the node {node} is not idle after {START_TIMEOUT_S:.0f} s (sinfo: {state!r})\n{cluster.logs()}"
        )
    except BaseException:
        cluster.stop()
        raise


MPIRUN = ("mpirun", "--allow-run-as-root", "--oversubscribe")


def check_mpirun() -> list[str]:
    """``mpirun`` with the flags root needs, once it has started 2 ranks of ``true``; ClusterUnavailable if not."""
    if _binary("mpirun") is None:
        raise ClusterUnavailable("Open MPI is not installed (apt-get install openmpi-bin)")
    try:
        out = subprocess.run(
            [*MPIRUN, "-np", "2", "true"], capture_output=True, text=True, timeout=60, check=False
        )
    except subprocess.TimeoutExpired:
        raise ClusterUnavailable("`mpirun -np 2 true` did not end within 60 s") from None
    if out.returncode != 0:
        raise ClusterUnavailable(
            f"`mpirun -np 2 true` failed ({out.returncode}): {out.stderr.strip()[-500:]}"
        )
    return list(MPIRUN)
