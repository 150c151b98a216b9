"""Detection in a subprocess, for when amdsmi is not available.

Asking torch for device properties initialises HIP, and a process that has done so cannot fork workers that use
the GPU; so a short-lived child interpreter asks, with a timeout. It inherits the visible-device variables.
"""

from __future__ import annotations

import json
import subprocess
import sys

from accelbench.errors import BackendError

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
    try:
        proc = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise BackendError(
            f"the ROCm device probe gave no answer within {timeout:.0f} s: a GPU or the amdgpu driver may be "
            "hung (check `amd-smi list` or `rocm-smi`)"
        ) from exc
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise BackendError(f"the ROCm device probe failed (exit status {proc.returncode}): {last}")
    try:
        devices = json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise BackendError(f"the ROCm device probe printed no device list: {lines[-1][:200]!r}") from exc
    if not isinstance(devices, list):
        raise BackendError(f"the ROCm device probe printed {type(devices).__name__}, not a device list")
    return devices
