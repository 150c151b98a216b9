"""The CPU backend's host allocator: glibc's malloc kept from handing freed tensors back to the kernel, so a training
step reuses its pages instead of faulting in fresh ones, unless the user chose another allocator or settings."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from accelbench.backends import host_malloc

glibc = pytest.mark.skipif(
    host_malloc.glibc_version() is None, reason="the C library here is not glibc: nothing to set"
)

# Ten training steps of a four-block MLP (2 MiB activations: above glibc's initial 128 KiB mmap threshold) after five
# to warm up, in a fresh interpreter; prints the page faults the ten took.
FAULTS = textwrap.dedent(
    """
    import resource, sys
    import torch
    from accelbench.backends.host_malloc import keep_freed_memory
    said = keep_freed_memory(sys.argv[1])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    blocks = [
        torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Dropout(0.1), torch.nn.Linear(1024, 256))
        for _ in range(4)
    ]
    model = torch.nn.Sequential(*blocks)
    optimizer = torch.optim.AdamW(model.parameters())
    x = torch.randn(512, 256)
    def step():
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    for _ in range(5):
        step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        step()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(said)
    """
)


def _faults(mode: str, where: Path) -> tuple[int, str]:
    """The page faults of :data:`FAULTS` in a fresh interpreter (-I: the same imports whatever the directory)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.pop("GLIBC_TUNABLES", None)
    env.pop("LD_PRELOAD", None)
    out = subprocess.run(
        [sys.executable, "-I", "-c", FAULTS, mode],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=where,
        timeout=120,
    ).stdout.splitlines()
    return int(out[0]), out[1]


@glibc
@pytest.mark.slow  # two fresh interpreters training ten steps each
def test_reuse_keeps_a_steps_pages_where_glibc_defaults_fault_fresh_ones_in(tmp_path: Path) -> None:
    reused, said = _faults("reuse", tmp_path)
    fresh, said_default = _faults("default", tmp_path)
    assert reused < 2_000, (reused, said)
    assert "keeping freed memory for reuse" in said and "mmap threshold 32 MiB" in said
    assert "defaults" in said_default and "--cpu-malloc default" in said_default
    # glibc's defaults hand part of each step's freed activations back to the kernel (the heap's free top beyond
    # its trim threshold, blocks it still maps), so every step faults pages in again: 33,000-48,000 over the ten
    # steps on this project's VM; kept for reuse, the heap's pages serve them (0-800)
    assert fresh > 10_000, (fresh, said_default)


@glibc
def test_the_users_own_allocator_or_settings_are_left_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_malloc, "_applied", None)
    said = host_malloc.keep_freed_memory(
        "reuse", {"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}
    )
    assert said.startswith("libjemalloc.so.2 (preloaded") and host_malloc.in_force() is None
    said = host_malloc.keep_freed_memory("reuse", {"MALLOC_ARENA_MAX": "2"})
    assert "as the environment sets it (MALLOC_ARENA_MAX)" in said and host_malloc.in_force() is None
    said = host_malloc.keep_freed_memory("reuse", {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"})
    assert "glibc.malloc.trim_threshold=0" in said and host_malloc.in_force() is None
    with pytest.raises(ValueError, match="choose one of reuse, default"):
        host_malloc.keep_freed_memory("jemalloc", {})


@glibc
def test_once_set_a_later_default_says_it_cannot_undo_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_malloc, "_applied", None)
    first = host_malloc.keep_freed_memory("reuse", {})
    assert host_malloc.in_force() == first
    assert host_malloc.keep_freed_memory("reuse", {}) == first
    assert host_malloc.keep_freed_memory("default", {}).endswith("which --cpu-malloc default cannot undo")


def test_the_cpu_backend_records_the_allocator_it_trained_with() -> None:
    from accelbench.backends.cpu import CpuBackend
    from accelbench.contract import World

    backend = CpuBackend()
    assert [o.cli_flag for o in backend.run_options()] == ["cpu-malloc"]
    assert {"LD_PRELOAD", "MALLOC_*", "GLIBC_TUNABLES"} <= set(backend.recorded_environment())
    assert "host_malloc" not in backend.runtime_versions()  # before setup: nothing is known yet
    backend.setup_device(World(rank=0, local_rank=0, world_size=1, local_world_size=1), {})
    said = backend.runtime_versions()["host_malloc"]
    assert "malloc" in said
