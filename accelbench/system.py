"""What the run ran on: host, CPU, memory, software versions, scheduler job. Shared by `info` and result records."""

from __future__ import annotations

import fnmatch
import os
import platform
import socket
import sys
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field

from accelbench import __version__
from accelbench.hostinfo import cpu_affinity, cpu_model, numa_nodes, usable_cores

# scheduler -> environment variable holding the job id
_JOB_ID_VARS = {
    "slurm": "SLURM_JOB_ID",
    "pbs": "PBS_JOBID",
    "lsf": "LSB_JOBID",
    "sge": "JOB_ID",
    "flux": "FLUX_JOB_ID",
}
# environment the core itself wants recorded (launcher and job shape); vendors add theirs through the
# accelbench_recorded_environment hook (CUDA_VISIBLE_DEVICES, HIP_*, ZE_*, ...)
CORE_ENVIRONMENT = ("SLURM_JOB_NODELIST", "SLURM_NTASKS", "SLURM_CPUS_PER_TASK", "PYTORCH_*", "TORCH_*")


class SystemInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str
    os: str
    python: str
    cpu_model: str
    cpu_logical_cores: int
    cpu_usable_cores: int
    memory_bytes: int
    torch_version: str
    torch_cuda: str | None
    torch_hip: str | None
    torch_threads: int
    accelbench_version: str
    scheduler: str | None
    job_id: str | None
    environment: dict[str, str]
    # NUMA layout ({'node0': '0-15', ...}) and the CPUs this process may use (cpulist): data loading and the
    # placement of host processes on NUMA nodes bound input pipelines (seed 004). Absent in older records.
    numa_nodes: dict[str, str] = Field(default_factory=dict)
    cpu_affinity: str | None = None


def recorded_environment(patterns: Iterable[str], environ: dict[str, str] | None = None) -> dict[str, str]:
    """The variables of ``environ`` named by ``patterns`` (names, or ``PREFIX*``), sorted by name."""
    environ = dict(os.environ if environ is None else environ)
    wanted = [*CORE_ENVIRONMENT, *patterns]
    return {k: environ[k] for k in sorted(environ) if any(fnmatch.fnmatchcase(k, p) for p in wanted)}


def collect_system_info(environment: Iterable[str] = ()) -> SystemInfo:
    """The host as a record describes it; ``environment`` names (or ``PREFIX*``) the variables to record besides
    the core's own (the plugins' ``accelbench_recorded_environment``)."""
    import psutil
    import torch

    scheduler, job_id = next(
        ((s, os.environ[v]) for s, v in _JOB_ID_VARS.items() if os.environ.get(v)), (None, None)
    )
    return SystemInfo(
        host=socket.gethostname(),
        os=f"{platform.system()} {platform.release()}",
        python=sys.version.split()[0],
        cpu_model=cpu_model(),
        cpu_logical_cores=os.cpu_count() or 1,
        cpu_usable_cores=usable_cores(),
        memory_bytes=psutil.virtual_memory().total,
        torch_version=torch.__version__,
        torch_cuda=torch.version.cuda,
        torch_hip=getattr(torch.version, "hip", None),
        torch_threads=torch.get_num_threads(),
        accelbench_version=__version__,
        scheduler=scheduler,
        job_id=job_id,
        environment=recorded_environment(environment),
        numa_nodes=numa_nodes(),
        cpu_affinity=cpu_affinity(),
    )
