"""How this process was launched, and launching N local workers through PyTorch's own launcher.

accelbench never starts remote processes itself. A multi-process run is either
- started by ``accelbench run --devices N [--nnodes M --node-rank R --rdzv-endpoint HOST:PORT]``, which hands the
  same command to ``torch.distributed.run`` (torchrun's engine, ``elastic_launch``) on this node; or
- started by torchrun, Slurm's srun, or MPI (Open MPI, Intel MPI / MPICH), recognised from their environment.
Either way each worker ends up with the variables torch.distributed wants: RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import uuid
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from accelbench.errors import ConfigError

RUN_ID_ENV = (
    "ACCELBENCH_RUN_ID"  # shared by the workers of one launched run, so they agree on the record name
)
OMP_THREADS_ENV = "OMP_NUM_THREADS"


@dataclass(frozen=True)
class LaunchEnv:
    """This process's place in a job, as its launcher described it."""

    launcher: str  # "none", "torchrun", "slurm", "openmpi", "mpich"
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    nnodes: int = 1
    master_addr: str | None = None
    master_port: int | None = None

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def torch_env(self) -> dict[str, str]:
        """The variables torch.distributed's env:// initialisation reads."""
        env = {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
        }
        if self.master_addr:
            env["MASTER_ADDR"] = self.master_addr
        if self.master_port:
            env["MASTER_PORT"] = str(self.master_port)
        return env


def _int(env: Mapping[str, str], *names: str, default: int | None = None) -> int:
    for name in names:
        if env.get(name, "").strip():
            try:
                return int(env[name])
            except ValueError:
                raise ConfigError(f"launcher variable {name}={env[name]!r} is not an integer") from None
    if default is None:
        raise ConfigError(f"launcher variable {' or '.join(names)} is missing")
    return default


def detect_launch(env: Mapping[str, str] | None = None) -> LaunchEnv:
    """Recognise torchrun, srun and mpirun from the environment. Explicit MASTER_ADDR/MASTER_PORT always win."""
    env = os.environ if env is None else env
    addr = env.get("MASTER_ADDR") or None
    port = _int(env, "MASTER_PORT", default=0) or None
    if "TORCHELASTIC_RUN_ID" in env or {"RANK", "WORLD_SIZE", "LOCAL_RANK"} <= env.keys():
        world = _int(env, "WORLD_SIZE")
        local_world = _int(env, "LOCAL_WORLD_SIZE", default=world)
        return _checked(LaunchEnv(
            "torchrun", _int(env, "RANK"), _int(env, "LOCAL_RANK"), world, local_world,
            max(1, world // max(1, local_world)), addr, port,
        ), "RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE")  # fmt: skip
    if "SLURM_STEP_NUM_TASKS" in env and "SLURM_PROCID" in env:  # inside an srun step, not the batch script
        world = _int(env, "SLURM_STEP_NUM_TASKS")
        nnodes = _int(env, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", default=1)
        # "4" or "4(x2)": tasks on the first node, which is this node's count in a homogeneous job
        per_node = re.match(
            r"\d+", env.get("SLURM_STEP_TASKS_PER_NODE", "") or env.get("SLURM_TASKS_PER_NODE", "")
        )
        local_world = int(per_node.group()) if per_node else max(1, world // nnodes)
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
        # one node: this host's loopback, which needs no name resolution; several: the step's first node
        host = "127.0.0.1" if nnodes == 1 else first_host(nodelist) if nodelist else None
        return _checked(LaunchEnv(
            "slurm", _int(env, "SLURM_PROCID"), _int(env, "SLURM_LOCALID", default=0), world,
            local_world, nnodes, addr or host, port or _port_from_job(env),
        ), "SLURM_PROCID, SLURM_LOCALID, SLURM_STEP_NUM_TASKS, SLURM_STEP_TASKS_PER_NODE")  # fmt: skip
    if "OMPI_COMM_WORLD_SIZE" in env:
        world = _int(env, "OMPI_COMM_WORLD_SIZE")
        local_world = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", default=world)
        return _checked(LaunchEnv(
            "openmpi", _int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", default=0),
            world, local_world, max(1, world // max(1, local_world)),
            addr or _single_node_addr(world, local_world), port or _port_from_mpi_job(env, world, local_world),
        ), "OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_SIZE")  # fmt: skip
    if "PMI_SIZE" in env and "PMI_RANK" in env:  # Intel MPI, MPICH (hydra)
        world = _int(env, "PMI_SIZE")
        local_world = _int(env, "MPI_LOCALNRANKS", default=world)
        return _checked(LaunchEnv(
            "mpich", _int(env, "PMI_RANK"), _int(env, "MPI_LOCALRANKID", default=0), world, local_world,
            max(1, world // max(1, local_world)), addr or _single_node_addr(world, local_world), port,
        ), "PMI_RANK, MPI_LOCALRANKID, PMI_SIZE, MPI_LOCALNRANKS")  # fmt: skip
    return LaunchEnv("none")


# What makes a process one rank of a launcher's job: the variables :func:`detect_launch` reads, and those other
# libraries adopt a job from (Lightning's SLURMEnvironment reads SLURM_NTASKS, DeepSpeed's MPI discovery OMPI_COMM_*).
# The job's identity (SLURM_JOB_ID, SLURM_JOB_NODELIST) is not among them: a record still names its job.
LAUNCHER_VARIABLES = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "NODE_RANK", "MASTER_ADDR",
    "MASTER_PORT", "TORCHELASTIC_*",
    "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_STEP_*", "SLURM_STEPID",
    "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_GTIDS", "SLURM_TASK_PID", "SLURM_SRUN_COMM_*",
    "OMPI_COMM_WORLD_*", "OMPI_MCA_ess_base_*", "OMPI_UNIVERSE_SIZE", "PMIX_RANK", "PMIX_NAMESPACE", "PMI_*",
    "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
)  # fmt: skip


def without_launcher(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` less :data:`LAUNCHER_VARIABLES`: a process started as one task of a job that is to run on its own
    (``accelbench fleet``'s run on each node) is then a process the user started, not a rank of a multi-node job."""
    import fnmatch

    return {k: v for k, v in env.items() if not any(fnmatch.fnmatchcase(k, p) for p in LAUNCHER_VARIABLES)}


def _checked(env: LaunchEnv, variables: str) -> LaunchEnv:
    """A launcher's description that adds up, or a ConfigError naming the variables that do not."""
    problems = []
    if env.world_size < 1 or env.local_world_size < 1:
        problems.append(
            f"world size {env.world_size} and local size {env.local_world_size} must be at least 1"
        )
    if not 0 <= env.rank < max(1, env.world_size):
        problems.append(f"rank {env.rank} is outside 0..{env.world_size - 1}")
    if not 0 <= env.local_rank < max(1, env.local_world_size):
        problems.append(f"local rank {env.local_rank} is outside 0..{env.local_world_size - 1}")
    if env.local_world_size > env.world_size >= 1:
        problems.append(
            f"{env.local_world_size} processes on this node exceed the world size {env.world_size}"
        )
    if env.master_port is not None and not 1 <= env.master_port <= 65535:
        problems.append(f"MASTER_PORT {env.master_port} is not a port (1-65535)")
    if problems:
        raise ConfigError(
            f"the {env.launcher} environment does not add up ({variables}): " + "; ".join(problems)
        )
    return env


def _single_node_addr(world: int, local_world: int) -> str | None:
    return "127.0.0.1" if world == local_world else None  # all ranks here: no need to ask the user


def _port_from_job(env: Mapping[str, str]) -> int | None:
    """A per-job port, so two Slurm jobs sharing a node do not collide (10000-19999)."""
    job = env.get("SLURM_JOB_ID", "")
    return 10000 + int(job) % 10000 if job.isdigit() else None


OMPI_JOB_VARIABLES = ("OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE")  # Open MPI 4's job id; PMIx's (Open MPI 5)


def _port_from_mpi_job(env: Mapping[str, str], world: int, local_world: int) -> int | None:
    """A rendezvous port every rank of one single-node Open MPI job derives alike, without communicating: from the
    job's id, which mpirun gives each rank (20000-29999, apart from Slurm's range). None across nodes, where rank 0's
    node is not known to the others (the user exports MASTER_ADDR/MASTER_PORT), or without a job id."""
    if world != local_world:
        return None
    job = next((env[name] for name in OMPI_JOB_VARIABLES if env.get(name)), None)
    return 20000 + zlib.crc32(job.encode()) % 10000 if job else None


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: 'gpu[003-005,010],cpu01' -> 'gpu003'."""
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not match:
        raise ConfigError(
            f"cannot read the Slurm node list {nodelist!r}; set MASTER_ADDR to the first node's name"
        )
    prefix, ranges = match.group(1), match.group(2)
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def _resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return True


def node_addr_from_scontrol(shown: str) -> str | None:
    """The ``NodeAddr`` of ``scontrol -o show node NAME``'s line (None when it names none)."""
    match = re.search(r"(?:^|\s)NodeAddr=(\S+)", shown)
    return match.group(1) if match and match.group(1) not in ("(null)", "") else None


def _scontrol_node_addr(node: str) -> str | None:
    try:
        shown = subprocess.run(
            ["scontrol", "-o", "show", "node", node], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return node_addr_from_scontrol(shown.stdout) if shown.returncode == 0 else None


def slurm_node_address(
    node: str,
    resolves: Callable[[str], bool] = _resolves,
    node_addr: Callable[[str], str | None] = _scontrol_node_addr,
) -> str:
    """An address the ranks can reach Slurm node ``node`` at. A Slurm node's name need not be a host name: slurm.conf
    may give the node another host and address (``NodeName=gpu-a NodeHostname=h17 NodeAddr=10.1.0.17``), or run
    several Slurm nodes on one host (``slurmd -N``). Its name where the name resolves (the usual cluster, and no
    question to slurmctld from every rank); else its ``NodeAddr``, the address Slurm itself reaches it at."""
    if resolves(node):
        return node
    addr = node_addr(node)
    if addr:
        return addr
    raise ConfigError(
        f"the step's first Slurm node {node!r} (rank 0's) is not a host name this node resolves, and "
        f"`scontrol show node {node}` gives no NodeAddr; export MASTER_ADDR=<its address> for every rank"
    )


def with_reachable_master(
    env: LaunchEnv,
    exported_addr: bool,
    address: Callable[[str], str] = slurm_node_address,
) -> LaunchEnv:
    """``env`` with the rendezvous host of a Slurm step across nodes made an address (:func:`slurm_node_address`):
    without, a rank whose first node's name does not resolve retries the connection until the store's timeout
    (10 minutes) instead of failing. An exported MASTER_ADDR is the user's and is kept as it is."""
    if env.launcher != "slurm" or env.nnodes == 1 or exported_addr or not env.master_addr:
        return env
    return replace(env, master_addr=address(env.master_addr))


def check_launch(env: LaunchEnv, devices: int | None, nnodes: int | None) -> None:
    """Refuse a job whose shape disagrees with what the user asked, before anything trains."""
    if devices is not None and devices != env.local_world_size:
        raise ConfigError(
            f"--devices {devices}, but {env.launcher} started {env.local_world_size} process(es) on this node; "
            f"one process drives one device: drop --devices or make them agree"
        )
    if nnodes is not None and nnodes != env.nnodes:
        raise ConfigError(
            f"--nnodes {nnodes}, but {env.launcher} reports {env.nnodes} node(s); make the node counts agree"
        )
    if env.distributed and env.nnodes == 1 and env.master_addr and not env.master_port:
        raise ConfigError(
            f"{env.launcher} started {env.world_size} ranks on this node but gave them no job id to agree on a "
            "rendezvous port from; export MASTER_PORT=<free port> for every rank"
        )
    if env.distributed and not (env.master_addr and env.master_port):
        raise ConfigError(
            f"{env.launcher} started {env.world_size} ranks across nodes but MASTER_ADDR/MASTER_PORT are not set; "
            "export MASTER_ADDR=<first node> MASTER_PORT=<free port> for every rank"
        )


def binding_note(env: LaunchEnv, usable: int, host_cores: int) -> str | None:
    """What to tell the user when the launcher pinned each rank to fewer cores than the host has (mpirun binds each
    rank to one core by default): the record keeps it (``system.cpu_usable_cores``, ``system.cpu_affinity``); this
    says it where the user is looking, with the flag that lifts it. None for our own workers and a lone process."""
    if env.launcher in ("none", "torchrun") or usable * env.local_world_size >= host_cores:
        return None
    lift = {
        "openmpi": "mpirun --bind-to none",
        "mpich": "mpirun -bind-to none",
        "slurm": "srun --cpu-bind=none",
    }
    return (
        f"{env.launcher} bound each of this node's {env.local_world_size} rank(s) to {usable} core(s) of {host_cores}"
        f" (recorded as system.cpu_usable_cores/cpu_affinity); {lift[env.launcher]} gives them all"
    )


def worker_threads(
    environ: Mapping[str, str], nproc_per_node: int, threads: int | None, usable: int
) -> dict[str, str]:
    """The OpenMP thread count each of ``nproc_per_node`` workers on a node starts with, where the user set none:
    ``--threads``, else the node's usable cores shared out (what each worker gives torch's intra-op pool too).

    ``torch.set_num_threads`` in a worker sizes OpenMP's team for the thread that calls it; a region opened from a
    thread torch did not size (a library's own thread) takes the runtime's default, which without OMP_NUM_THREADS is
    every core of the host, so ``N`` workers could put ``N`` x cores threads on the cores. torchrun exports
    OMP_NUM_THREADS (1) for every multi-worker job for this reason; ``elastic_launch``, which accelbench calls, does
    not, so a run started with ``--devices N`` would differ from the same run under torchrun. (On the 2-core VM
    these notes come from, 2 DDP workers of one thread each measured no difference either way.) Empty for one worker
    per node, or where OMP_NUM_THREADS is already set (kept)."""
    if nproc_per_node <= 1 or environ.get(OMP_THREADS_ENV):
        return {}
    return {OMP_THREADS_ENV: str(threads or max(1, usable // nproc_per_node))}


def threads_note(env: LaunchEnv, environ: Mapping[str, str]) -> str | None:
    """What to tell the user when srun or mpirun started several ranks on a node without OMP_NUM_THREADS (accelbench
    exports it for the workers it starts itself, :func:`worker_threads`): each rank's OpenMP runtime then sizes its
    threads for every core of the node. None otherwise."""
    if env.launcher in ("none", "torchrun") or env.local_world_size <= 1 or environ.get(OMP_THREADS_ENV):
        return None
    return (
        f"{env.launcher} started {env.local_world_size} ranks on this node without OMP_NUM_THREADS: OpenMP work "
        "outside torch's own thread pool then sizes its threads for every core of the node, in every rank; export "
        "OMP_NUM_THREADS=<cores per rank> for every rank (torchrun exports 1)"
    )


def check_rendezvous_port(env: LaunchEnv, exported_port: bool) -> None:
    """Rank 0 of a job srun or mpirun started hosts the rendezvous (torch's TCPStore) on every interface at
    ``MASTER_PORT``: if something already listens there, say so before anything runs, rather than a DistNetworkError
    on rank 0 while the other ranks wait. torchrun's agent hosts its own store, so its workers are not checked."""
    if env.launcher not in ("slurm", "openmpi", "mpich") or env.rank != 0 or not env.distributed:
        return
    if env.master_port is None:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TCPStore: a port in TIME_WAIT is free
        try:
            sock.bind(("", env.master_port))
        except OSError as exc:
            source = (
                "MASTER_PORT"
                if exported_port
                else f"the port accelbench derived from the {env.launcher} job id"
            )
            raise ConfigError(
                f"rendezvous port {env.master_port} ({source}) is not available on rank 0's node ({exc.strerror}); "
                "export MASTER_PORT=<free port> for every rank"
            ) from None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def check_port_free(host: str, port: int) -> None:
    """The rendezvous port must be free on the node that hosts it; say so before starting workers."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host if host not in ("localhost",) else "127.0.0.1", port))
        except OSError as exc:
            raise ConfigError(
                f"rendezvous port {port} on {host} is not available ({exc.strerror}); "
                "choose another with --rdzv-endpoint HOST:PORT, or omit it on a single node"
            ) from None


@dataclass(frozen=True)
class Launched:
    """How a launch ended: the run id the workers shared, the workers that failed (``{global rank: (exit code,
    message)}``), and the signal that stopped the launcher itself (a scheduler's SIGTERM, Ctrl-C), if one did."""

    run_id: str
    failures: dict[int, tuple[int, str]]
    signal: str | None = None


def launch_workers(
    argv: Sequence[str],
    nproc_per_node: int,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    threads: int | None = None,
) -> Launched:
    """Run ``accelbench <argv>`` as ``nproc_per_node`` workers through torch.distributed's elastic launcher, each
    with OMP_NUM_THREADS set where the user set none (:func:`worker_threads`; ``threads``: the run's ``--threads``).

    On SIGTERM or Ctrl-C the launcher passes the signal on to the workers, which write an ``interrupted`` record
    with the epochs every rank completed, and waits for them; that ends here as :attr:`Launched.signal`.
    """
    import signal

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    run_id = uuid.uuid4().hex
    if rdzv_endpoint is None:
        if nnodes > 1:
            raise ConfigError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (the same on every node)")
        rdzv_endpoint = f"127.0.0.1:{free_port()}"
    elif node_rank == 0:
        host, _, port = rdzv_endpoint.rpartition(":")
        if not port.isdigit():
            raise ConfigError(f"--rdzv-endpoint {rdzv_endpoint!r} is not HOST:PORT")
        if host in ("localhost", "127.0.0.1", socket.gethostname(), socket.getfqdn()):
            check_port_free(host, int(port))
    config = LaunchConfig(
        min_nodes=nnodes,
        max_nodes=nnodes,
        nproc_per_node=nproc_per_node,
        # the rendezvous id must be the same on every node (torchrun's default is "none")
        run_id=os.environ.get("SLURM_JOB_ID", "none") if nnodes > 1 else run_id,
        rdzv_endpoint=rdzv_endpoint,
        rdzv_backend="c10d",
        max_restarts=0,  # a benchmark point that fails is a result, not something to retry silently
        monitor_interval=0.2,
        start_method="spawn",
    )
    from accelbench.hostinfo import usable_cores

    exported = {RUN_ID_ENV: run_id, **worker_threads(os.environ, nproc_per_node, threads, usable_cores())}
    os.environ.update(exported)  # the workers' environment is a copy of this process's
    try:
        elastic_launch(config, sys.executable)("-m", "accelbench.cli", *argv)
    except ChildFailedError as exc:
        return Launched(run_id, {rank: (f.exitcode, f.message) for rank, f in exc.failures.items()})
    except SignalException as exc:  # the workers were sent the signal too, and have ended
        return Launched(run_id, {}, signal.Signals(exc.sigval).name)
    except KeyboardInterrupt:
        return Launched(run_id, {}, "SIGINT")
    finally:
        for name in exported:
            os.environ.pop(name, None)
    return Launched(run_id, {})
