"""Which Intel GPU devices this process may use, without starting the Level Zero runtime in it.

Order of questions: is there a GPU render node (Linux; answered without importing torch); can this torch drive
Intel GPUs at all (:mod:`accelbench_xpu.paths`); then torch.xpu itself in a probe subprocess. Each device records what it is (card or tile), the
hierarchy in force and the affinity mask.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from accelbench.contract import DeviceInfo
from accelbench_xpu import level_zero, paths, probe

DRI = Path("/dev/dri")


def detect_devices(environ: Mapping[str, str] = os.environ) -> list[DeviceInfo]:
    """The devices a run would see; [] when torch cannot drive Intel GPUs or there is no GPU."""
    if not gpu_node_present():  # first: it needs no torch, so a machine without GPUs answers at once
        return []
    path = paths.resolve(environ)
    if path.device is None:
        return []
    return [_device(ordinal, row, path, environ) for ordinal, row in enumerate(probe.run_probe(path.device))]


def gpu_node_present() -> bool:
    """Whether any GPU render node exists (always assumed off Linux)."""
    if not sys.platform.startswith("linux"):
        return True
    return DRI.is_dir() and any(node.name.startswith("renderD") for node in DRI.iterdir())


def _device(ordinal: int, row: dict, path: paths.XpuPath, environ: Mapping[str, str]) -> DeviceInfo:
    name, memory = str(row["name"]), int(row["total_memory"])
    details = {
        "device_unit": level_zero.device_unit(name, memory),
        "ze_flat_device_hierarchy": level_zero.hierarchy(environ),
        "bf16": str(bool(row.get("has_bfloat16_conversions"))).lower(),
        "fp16": str(bool(row.get("has_fp16", True))).lower(),
        "path": path.describe(),
    }
    if level_zero.AFFINITY_ENV in environ:
        details["ze_affinity_mask"] = environ[level_zero.AFFINITY_ENV]
    for key in ("max_compute_units", "gpu_eu_count", "driver_version", "platform_name"):
        if row.get(key) not in (None, ""):
            details[key] = str(row[key])
    return DeviceInfo(index=ordinal, name=name, arch=None, memory_bytes=memory, details=details)
