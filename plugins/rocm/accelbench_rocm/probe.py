"""Detection in a subprocess, for when amdsmi is not available.

Asking torch for device properties initialises HIP, and a process that has done so cannot fork workers that use
the GPU; so a short-lived child interpreter asks, with a timeout. It inherits the visible-device variables.
"""

from __future__ import annotations

from accelbench.devices import probe_in_subprocess

TIMEOUT_S = 60.0

SCRIPT = """
import json, torch
devices = []
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    devices.append({"name": p.name, "gcnArchName": getattr(p, "gcnArchName", ""), "total_memory": p.total_memory,
                    "multi_processor_count": p.multi_processor_count, "uuid": str(getattr(p, "uuid", ""))})
print(json.dumps(devices))
"""


def run_probe(script: str = SCRIPT, timeout: float = TIMEOUT_S) -> list[dict]:
    """Run ``script`` in a child interpreter and return the JSON list it prints last."""
    return probe_in_subprocess(
        script,
        label="ROCm",
        hang_hint="a GPU or the amdgpu driver may be hung (check `amd-smi list` or `rocm-smi`)",
        timeout=timeout,
    )
