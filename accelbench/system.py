"""What the run ran on: host, CPU, memory, software versions, scheduler job. Shared by `info` and result records."""

from __future__ import annotations

import os
import platform
import socket
import sys

import psutil
import torch
from pydantic import BaseModel, ConfigDict

from accelbench import __version__
from accelbench.backends.cpu import cpu_model, usable_cores

# scheduler -> environment variable holding the job id
_JOB_ID_VARS = {
    "slurm": "SLURM_JOB_ID",
    "pbs": "PBS_JOBID",
    "lsf": "LSB_JOBID",
    "sge": "JOB_ID",
    "flux": "FLUX_JOB_ID",
}
# environment that changes performance and belongs in the record
_RECORDED_ENV = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "ZE_AFFINITY_MASK",
    "ZE_FLAT_DEVICE_HIERARCHY",
    "NCCL_ALGO",
    "NCCL_PROTO",
    "SLURM_JOB_NODELIST",
    "SLURM_NTASKS",
    "PYTORCH_CUDA_ALLOC_CONF",
)


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


def collect_system_info() -> SystemInfo:
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
        environment={k: os.environ[k] for k in _RECORDED_ENV if k in os.environ},
    )
