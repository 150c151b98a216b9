"""The host allocator a CPU run trains with: glibc's malloc told to keep freed memory for reuse.

torch's CPU tensors come straight from the C library's ``malloc`` (there is no caching allocator on the CPU).
glibc serves a large block (128 KiB and up, a threshold it raises as blocks are freed, to at most 32 MiB) with a
fresh ``mmap`` and gives it back to the kernel when freed, and trims the heap's free top beyond a threshold. A
training step allocates its activations and gradients anew every step, so each step touches fresh pages: a page
fault and a zeroed page for every 4 KiB written the first time (about 1.2 us each on this project's VM, a write of
3 GiB/s where a reused buffer is written at 7), which a step pays on top of its arithmetic (gpt-micro at batch 16:
10 to 60 MiB of fresh pages a step, 10-15% of its time). Tuned CPU training avoids it: PyTorch's performance tuning
guide and Intel's recommend jemalloc or TCMalloc, which keep freed memory for reuse.

:func:`keep_freed_memory` does the same with the allocator every Linux process already has: ``mallopt`` sets the
mmap threshold to glibc's largest (blocks up to 32 MiB come from the heap and are reused) and puts heap trimming
beyond 2 GiB of free top. What is in force is described for the record (``runtime_versions["host_malloc"]``), and nothing is changed
where the user chose otherwise: another allocator preloaded (jemalloc, TCMalloc, mimalloc), glibc's malloc settings
in the environment (``MALLOC_*_``, ``GLIBC_TUNABLES``), ``--cpu-malloc default``, or a C library that is not glibc.
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Mapping
from pathlib import Path

# glibc's <malloc.h>
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# DEFAULT_MMAP_THRESHOLD_MAX on 64-bit glibc (4 MiB x sizeof(long)): the largest mmap threshold mallopt accepts;
# blocks above it are still mapped and unmapped each time (a gpt2 embedding's gradient, a large batch's logits)
MMAP_THRESHOLD_MAX = 32 * 2**20
# the largest trim threshold mallopt's int takes: the heap's free top is given back only beyond 2 GiB
NO_TRIM = 2**31 - 1

MODES = ("reuse", "default")
# other allocators a user preloads for the same reason; glibc's mallopt would not reach them
OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc", "hoard", "snmalloc")
# glibc reads these at start-up; where the user set any, their choice stands
GLIBC_ENVIRONMENT = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
    "MALLOC_ARENA_MAX",
)

REUSING = "malloc keeping freed memory for reuse"
_applied: str | None = None  # what keep_freed_memory set in this process (None: nothing changed)


def keep_freed_memory(mode: str = "reuse", environ: Mapping[str, str] | None = None) -> str:
    """Make glibc's malloc keep freed memory for reuse in this process (``mode`` 'reuse'), unless the user chose
    otherwise; returns what is in force, for the record. Once set, the settings stand for the process (mallopt's
    settings cannot be read back, and a later ``default`` does not undo them: it says so)."""
    global _applied
    if mode not in MODES:
        raise ValueError(f"cpu malloc mode {mode!r}: choose one of {', '.join(MODES)}")
    if _applied is not None:  # set by an earlier call: mallopt's settings stay for the process
        if mode == "default":
            return f"{_applied}; set earlier in this process, which --cpu-malloc default cannot undo"
        return _applied
    env = os.environ if environ is None else environ
    preloaded = _other_allocator(env.get("LD_PRELOAD", ""))
    if preloaded:
        return f"{preloaded} (preloaded; accelbench leaves it as it is)"
    version = glibc_version()
    if version is None:
        return f"the C library's malloc ({platform.libc_ver()[0] or 'not glibc'}; left as it is)"
    chosen = [name for name in GLIBC_ENVIRONMENT if name in env]
    tunables = [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t.startswith("glibc.malloc.")]
    if chosen or tunables:
        return f"glibc {version} malloc as the environment sets it ({', '.join(chosen + tunables)})"
    if mode == "default":
        return (
            f"glibc {version} malloc defaults (--cpu-malloc default: freed blocks from 128 KiB up go back to "
            "the kernel, so steps write fresh pages)"
        )
    libc = ctypes.CDLL(None)
    ok = libc.mallopt(M_MMAP_THRESHOLD, ctypes.c_int(MMAP_THRESHOLD_MAX)) == 1
    ok = libc.mallopt(M_TRIM_THRESHOLD, ctypes.c_int(NO_TRIM)) == 1 and ok
    if not ok:
        return f"glibc {version} malloc defaults (mallopt refused the reuse settings)"
    _applied = (
        f"glibc {version} {REUSING} (mmap threshold {MMAP_THRESHOLD_MAX // 2**20} "
        "MiB, heap trimmed only beyond 2 GiB free; --cpu-malloc default leaves glibc's defaults)"
    )
    return _applied


def in_force() -> str | None:
    """What :func:`keep_freed_memory` set in this process, None where it changed nothing (yet)."""
    return _applied


def glibc_version() -> str | None:
    """The running glibc's version, None where the C library is not glibc (musl, macOS)."""
    try:
        libc = ctypes.CDLL(None)
        get = libc.gnu_get_libc_version
    except (OSError, AttributeError):
        return None
    get.restype = ctypes.c_char_p
    value = get()
    return value.decode() if isinstance(value, bytes) else None


def _other_allocator(preload: str) -> str | None:
    """The allocator named in ``LD_PRELOAD`` or mapped into this process, if it is not glibc's."""
    names = [Path(p).name for p in preload.replace(":", " ").split()]
    try:
        maps = Path("/proc/self/maps").read_text(errors="replace")
    except OSError:
        maps = ""
    for allocator in OTHER_ALLOCATORS:
        for name in names:
            if allocator in name:
                return name
        if f"lib{allocator}" in maps:
            return f"lib{allocator}"
    return None
