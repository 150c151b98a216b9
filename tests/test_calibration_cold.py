"""What a calibration measures as a step meets it: tensors out of every cache, and the optimizer phase's host cost.

The memory the timed calls cycle through (accelbench.estimate.calibration.ColdMemory) is twice the CPU's last-level
cache as Linux reports it: on an Intel Xeon VM reporting a 480 MiB L3 the calibration had cycled through a fixed
64 MiB, which sat in that cache; its streams ran at 58 GB/s where a training step's ran at 31, and the README's
first run was predicted 18% short. The optimizer phase (clipping, AdamW's step, zero_grad) is priced at its host
cost per step and per parameter tensor, measured after a backward with caches cold.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import accelbench.hostinfo as hostinfo
from accelbench.estimate import calibration as module
from accelbench.estimate.calibration import (
    COLD_BYTES,
    CPU_COLD_BYTES,
    MAX_BUFFER_SETS,
    MAX_COLD_BYTES,
    ColdMemory,
)

CPU = torch.device("cpu")
FP32 = torch.float32


def _span(t: torch.Tensor) -> tuple[int, int]:
    start = t.data_ptr()
    return start, start + t.numel() * t.element_size()


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 < b1 and b0 < a1


def _sysfs(root: Path, caches: list[tuple[str, str]]) -> Path:
    for i, (kind, size) in enumerate(caches):
        entry = root / f"index{i}"
        entry.mkdir(parents=True)
        (entry / "type").write_text(kind + "\n")
        (entry / "size").write_text(size + "\n")
    return root


def test_the_last_level_cache_is_the_largest_data_cache_sysfs_lists(tmp_path: Path) -> None:
    xeon = _sysfs(tmp_path / "xeon", [("Data", "48K"), ("Instruction", "64K"), ("Unified", "2048K"),
                                      ("Unified", "491520K")])  # fmt: skip
    assert hostinfo.last_level_cache_bytes(xeon) == 480 * 2**20
    # an instruction cache larger than every data cache is not the one data streams through
    odd = _sysfs(tmp_path / "odd", [("Data", "32K"), ("Instruction", "4M")])
    assert hostinfo.last_level_cache_bytes(odd) == 32 * 2**10
    assert hostinfo.last_level_cache_bytes(tmp_path / "absent") is None
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24576000 kB\nMemAvailable:   20480000 kB\n")
    assert hostinfo.available_memory_bytes(meminfo) == 20480000 * 1024
    assert hostinfo.available_memory_bytes(tmp_path / "none") is None


@pytest.mark.parametrize(
    ("cache", "available", "expected"),
    [
        (480 * 2**20, 24 * 2**30, 960 * 2**20),  # the Xeon VM: twice its L3
        (32 * 2**20, 24 * 2**30, CPU_COLD_BYTES),  # an EPYC's 32 MiB slice: the floor, eight times it
        (None, None, CPU_COLD_BYTES),  # nothing readable (not Linux)
        (1152 * 2**20, 64 * 2**30, 2304 * 2**20),  # a 3D V-cache EPYC
        (4 * 2**30, 256 * 2**30, MAX_COLD_BYTES),  # never beyond the cap
        (480 * 2**20, 2 * 2**30, 128 * 2**20),  # a sixteenth of what is available, a calibration holding four
        (480 * 2**20, 2**29, COLD_BYTES),  # and never under the accelerators' 64 MiB
    ],
)
def test_a_cpu_cycles_through_twice_its_last_level_cache(
    monkeypatch: pytest.MonkeyPatch, cache: int | None, available: int | None, expected: int
) -> None:
    monkeypatch.setattr(hostinfo, "last_level_cache_bytes", lambda: cache)
    monkeypatch.setattr(hostinfo, "available_memory_bytes", lambda: available)
    assert module.cold_memory_bytes(CPU) == expected
    # an accelerator's memory is not the host's cache: as before
    assert module.cold_memory_bytes(torch.device("meta")) == COLD_BYTES


def test_a_pools_sets_never_share_memory_and_outputs_never_alias_inputs() -> None:
    memory = ColdMemory(CPU, 2**20)
    pool = memory.sets((FP32, (100, 10)), (torch.bool, (100, 10)), (FP32, (7,)), out=(FP32, (100, 10)))
    sets = [next(pool) for _ in range(MAX_BUFFER_SETS)]
    count = len({_span(s[0]) for s in sets})
    # a set's fp32 inputs take 4,032 + 64 bytes of their buffer (each tensor on a 64-byte line): the fewest slots
    assert count == 2**20 // (4032 + 64)
    for i, a in enumerate(sets[:count]):
        assert (
            a[0].shape == (100, 10) and a[0].dtype == FP32 and a[1].dtype == torch.bool and a[2].shape == (7,)
        )
        assert bool((a[0] == 0.5).all()) and bool(a[1].all()) and bool((a[2] == 0.5).all())
        assert not any(_overlap(x, y) for x in a for y in a if x is not y)
        for b in sets[i + 1 : count]:
            assert not any(_overlap(x, y) for x in a for y in b)
    assert all(x is y for x, y in zip(sets[count], sets[0], strict=True))  # then round again


def test_each_pool_starts_where_the_calls_before_it_left_off() -> None:
    """A call's tensors are the ones touched longest ago: the next pool takes the slots after those the previous
    pool's calls used, and after its whole ring where they went round it."""
    memory = ColdMemory(CPU, 64 * 4096)
    first = memory.sets((FP32, (1024,)))  # 4 KiB a set: 64 slots
    used = [next(first)[0] for _ in range(5)]
    second = memory.sets((FP32, (1024,)))
    assert _span(next(second)[0])[0] == _span(used[-1])[1]
    # a pool that went round its ring: the next starts after the ring (here the buffer's start again)
    ring = memory.sets((FP32, (1024,)))
    start = _span(next(ring)[0])[0]
    for _ in range(200):
        next(ring)
    after = memory.sets((FP32, (1024,)))
    assert _span(next(after)[0])[0] == start
    # a set larger than the buffer gets a buffer its own size, as one slot
    big = memory.sets((FP32, (128 * 1024,)), out=(FP32, (128 * 1024,)))
    a, b = next(big), next(big)
    assert a[0].data_ptr() == b[0].data_ptr() and not _overlap(a[0], a[1])


def test_a_calibration_says_how_much_memory_it_cycled_through(tmp_path: Path) -> None:
    found = module.calibrate(CPU, lambda device: None, backend="cpu", device_name="test cpu", dtype="float32",
                             directory=tmp_path, matmul_sizes=(16, 64), stream_bytes=(3 * 2**12, 3 * 2**20),
                             cold_bytes=8 * 2**20)  # fmt: skip
    assert found is not None and found.cold_bytes == 8 * 2**20
    assert "on 8 MiB of tensors cycled through" in found.describe()
    assert module.calibrate(CPU, lambda device: None, backend="cpu", device_name="test cpu", dtype="float32",
                            directory=tmp_path, cached_only=True).cold_bytes == 8 * 2**20  # fmt: skip


def _calibration(**update: object) -> module.Calibration:
    from accelbench.estimate.calibration import MatmulPoint, StreamPoint

    matmul = [MatmulPoint(dtype="float32", m=m, n=n, k=k, best_flops_per_s=1e10, median_flops_per_s=1e10)
              for m in (16, 64) for n in (16, 64) for k in (16, 64)]  # fmt: skip
    stream = [StreamPoint(bytes_moved=b, best_bytes_per_s=1e10, median_bytes_per_s=1e10) for b in (10, 10**9)]
    made = module.Calibration(key="made up", device_type="cpu", dtype="float32", threads=1, matmul=matmul,
                              stream=stream, dispatch_s=1e-6, autograd_dispatch_s=2e-6, step_dispatch_s=3e-6,
                              measured_at="now", seconds=0.0)  # fmt: skip
    return made.model_copy(update=update)


def test_the_optimizer_phase_pays_its_host_cost_per_step_and_per_parameter_tensor() -> None:
    """gpt-micro at batch 2 on the Xeon VM: an optimizer phase of 1.8-1.9 ms (clipping, AdamW's fused step,
    zero_grad) was priced at 0.65 ms, the operators' work and a bare dispatch each; the step 8-10% short. With the
    calibration's host cost of the phase, the phase is the operators' work plus that cost for the rank's parameter
    tensors (tied ones once), in place of their dispatch; forward and backward are unchanged."""
    from accelbench.config import RunConfig
    from accelbench.contract import standard_plan
    from accelbench.estimate.notes import Notes
    from accelbench.estimate.operators import step_operators
    from accelbench.estimate.predictor import run_shape
    from accelbench.estimate.step_time import calibrated_times, operator_seconds
    from accelbench.plugins import get_host

    host = get_host()
    config = host.resolve(RunConfig(workload="gpt", model="gpt-nano", batch_size=2))
    ops = step_operators(host.workload("gpt"), config, standard_plan("fp32", "ieee-fp32"), "cpu", "fused")
    model = host.workload("gpt").build(config).model
    assert (
        ops.parameter_tensors == len(list(model.parameters())) == 40
    )  # the head tied to the embedding: once
    layout = run_shape(config)
    without = calibrated_times(ops, _calibration(), layout, Notes())
    phase = module.OptimizerPhase(per_step_s=7e-4, per_tensor_s=1.1e-5)
    notes = Notes()
    withit = calibrated_times(ops, _calibration(optimizer_phase={"fused": phase}), layout, notes)
    work = sum(operator_seconds(op, _calibration(), "cpu")[0] for op in ops.phase("optimizer"))
    dispatch = sum(operator_seconds(op, _calibration(), "cpu")[1] for op in ops.phase("optimizer"))
    assert without.optimizer_s == pytest.approx(work + dispatch)
    assert withit.optimizer_s == pytest.approx(work + 7e-4 + 40 * 1.1e-5)
    assert (withit.forward_s, withit.backward_s) == (without.forward_s, without.backward_s)
    assert any("optimizer phase's host cost" in a and "40 parameter tensors" in a for a in notes.assumptions)
    # another kernels' cost does not apply: the foreach one is not the fused one's
    other = calibrated_times(ops, _calibration(optimizer_phase={"foreach": phase}), layout, Notes())
    assert other.optimizer_s == pytest.approx(without.optimizer_s)


def test_the_optimizer_phase_is_measured_for_each_kernel_the_device_runs() -> None:
    """Real phases of the tiny transformer on this CPU: a cost per tensor for every AdamW kernel, the fused one the
    cheapest per tensor (one kernel for every tensor, where foreach groups and plain loops)."""
    memory = ColdMemory(CPU, 16 * 2**20)
    found = {
        k: module._time_optimizer_phase(CPU, lambda d: None, memory, k) for k in module.OPTIMIZER_KERNELS
    }
    for kernels, phase in found.items():
        assert phase is not None, kernels
        assert phase.per_step_s >= 0 and 0 < phase.per_tensor_s < 1e-3, (kernels, phase)
    assert found["plain"] is not None and found["fused"] is not None
    assert found["fused"].per_tensor_s < found["plain"].per_tensor_s
    # a busy host only slows: of two measurements, the cheaper of each figure is kept
    slow = module.OptimizerPhase(per_step_s=1.0, per_tensor_s=1e-6)
    kept = module._cheaper(found["fused"], slow)
    assert kept.per_step_s == found["fused"].per_step_s and kept.per_tensor_s == 1e-6


def test_a_cpu_carves_its_sets_from_buffers_and_another_device_makes_them_apart() -> None:
    """A CPU's sets are slices of its buffers, every output in one buffer of bytes; another device's (the meta
    device standing in) are tensors of their own, as many as fit the memory's bytes: a lazy device compiles a graph
    for each slice of a buffer (XLA's CPU device compiled for minutes over a calibration's slices)."""
    memory = ColdMemory(CPU, 2**16)
    _, out = next(memory.sets((FP32, (16,)), out=(FP32, (16,))))
    _, tested = next(memory.sets((FP32, (16,)), out=(torch.bool, (16,))))
    assert (out.dtype, tested.dtype) == (FP32, torch.bool) and set(memory._buffers) == {FP32, None}
    meta = ColdMemory(torch.device("meta"), 2**16)
    pool = meta.sets((FP32, (1024,)), out=(torch.bool, (1024,)))
    sets = [next(pool) for _ in range(13)]
    assert meta._buffers == {} and all(x.device.type == "meta" for s in sets for x in s)
    assert len({id(s[0]) for s in sets}) == 2**16 // (4096 + 1024) == 12  # then round again
    assert sets[0][1].dtype == torch.bool
    meta.sweep()  # a buffer of its bytes read whole
