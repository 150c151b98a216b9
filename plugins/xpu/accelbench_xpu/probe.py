"""Detection in a subprocess: asking ``torch.xpu`` anything starts the Level Zero runtime, which must not happen in
the parent (forked workers could not use the GPU). The child imports Intel Extension for PyTorch first on the
legacy path, and inherits ZE_AFFINITY_MASK and ZE_FLAT_DEVICE_HIERARCHY, so it sees the devices a run would.
"""

from __future__ import annotations

from accelbench.devices import probe_in_subprocess

TIMEOUT_S = 60.0

SCRIPT = """
import json, sys
import torch
if sys.argv[1] == "ipex":
    import intel_extension_for_pytorch  # adds torch.xpu on torch builds without it
devices = []
for i in range(torch.xpu.device_count()):
    p = torch.xpu.get_device_properties(i)
    get = lambda name, default=None: getattr(p, name, default)
    devices.append({"name": p.name, "total_memory": p.total_memory, "max_compute_units": get("max_compute_units"),
                    "gpu_eu_count": get("gpu_eu_count"), "driver_version": str(get("driver_version", "")),
                    "platform_name": str(get("platform_name", "")), "has_fp16": bool(get("has_fp16", True)),
                    "has_bfloat16_conversions": bool(get("has_bfloat16_conversions", False))})
print(json.dumps(devices))
"""


def run_probe(device_path: str, script: str = SCRIPT, timeout: float = TIMEOUT_S) -> list[dict]:
    """Run ``script`` for ``device_path`` ("torch.xpu" or "ipex") in a child interpreter; the JSON list it prints."""
    return probe_in_subprocess(
        script,
        label="XPU",
        hang_hint="a GPU or its driver may be hung (check `xpu-smi discovery` or `sycl-ls`)",
        args=(device_path,),
        timeout=timeout,
    )
