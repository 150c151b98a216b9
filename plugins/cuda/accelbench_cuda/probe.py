"""Detection in a subprocess, for when NVML is not available.

Asking torch for device properties initialises CUDA, and a process that has initialised CUDA cannot fork workers
that use it. So the question is asked in a short-lived child interpreter, with a timeout in case a driver hangs.
The child inherits the environment, so CUDA_VISIBLE_DEVICES (including MIG instances) applies as in a run.
"""

from __future__ import annotations

from accelbench.devices import probe_in_subprocess

TIMEOUT_S = 60.0

SCRIPT = """
import json, torch
devices = []
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    devices.append({"name": p.name, "major": p.major, "minor": p.minor, "total_memory": p.total_memory,
                    "multi_processor_count": p.multi_processor_count, "uuid": str(getattr(p, "uuid", ""))})
print(json.dumps(devices))
"""


def run_probe(script: str = SCRIPT, timeout: float = TIMEOUT_S) -> list[dict]:
    """Run ``script`` in a child interpreter and return the JSON list it prints last."""
    return probe_in_subprocess(
        script,
        label="CUDA",
        hang_hint="a GPU or its driver may be hung (check `nvidia-smi`)",
        timeout=timeout,
    )
