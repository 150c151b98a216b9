"""ROCR_VISIBLE_DEVICES, then HIP_VISIBLE_DEVICES (or CUDA_VISIBLE_DEVICES, HIP's alias for it).

The ROCm runtime applies ROCR_VISIBLE_DEVICES first, to the GPUs of the node; HIP then indexes into what is left.
Like CUDA, parsing stops at the first index that names no device, and a repeated device hides all of them.
Entries that are UUIDs are not resolved here: :func:`visible_gpus` returns None and detection asks HIP itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

ROCR_ENV = "ROCR_VISIBLE_DEVICES"
HIP_ENV = "HIP_VISIBLE_DEVICES"
CUDA_ENV = "CUDA_VISIBLE_DEVICES"

G = TypeVar("G")


def visible_gpus(environ: Mapping[str, str], gpus: Sequence[G]) -> list[G] | None:
    """The GPUs HIP enumerates, in HIP ordinal order; None when a variable holds UUIDs."""
    pool: list[G] | None = list(gpus)
    for value in (environ.get(ROCR_ENV), environ.get(HIP_ENV, environ.get(CUDA_ENV))):
        if value is not None and pool is not None:
            pool = _select(value, pool)
    return pool


def _select(value: str, pool: list[G]) -> list[G] | None:
    entries = [entry.strip() for entry in value.split(",")]
    if any(entry and not entry.isdigit() and not entry.startswith("-") for entry in entries):
        return None  # UUIDs: only the runtime can match them
    chosen: list[G] = []
    for entry in entries:
        if not entry.isdigit() or int(entry) >= len(pool):
            break  # the first index naming no device ends the list
        gpu = pool[int(entry)]
        if any(gpu is other for other in chosen):
            return []
        chosen.append(gpu)
    return chosen
