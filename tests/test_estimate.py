"""`accelbench estimate`: the analytical model against figures worked out by hand, the measured peak and its cache,
devices by name, refusals, comm records, and the command line's JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from core_support import accelbench
from hostile_support import comm_record

from accelbench.comm.records import CommMeasurement, InStepTime, write_comm_record
from accelbench.config import RunConfig
from accelbench.contract import BackendInfo, DeviceInfo, PeakFigures, World
from accelbench.errors import ConfigError
from accelbench.estimate import Prediction, predict, predict_speedup
from accelbench.estimate.catalog import find_device
from accelbench.estimate.comm import BusBandwidth, load_bus_bandwidth
from accelbench.estimate.facts import WorkloadFacts, meta_facts
from accelbench.hostinfo import CpuUsage
from accelbench.plugins import get_host

GIB = 2**30


def facts_for(**config: object) -> tuple[RunConfig, WorkloadFacts]:
    host = get_host()
    resolved = host.resolve(RunConfig(**config))  # type: ignore[arg-type]
    return resolved, meta_facts(host.workload(resolved.workload), resolved)


# A: custom GPT, 2 layers, 2 heads, width 64, context 32, the generated corpus's 65 characters padded to 128 rows;
# bf16-mixed, batch 8 per device, 2 devices, on a GPU-like device (fused attention: no a*s^2 scores kept).
#   a block: ln_1 2d + qkv 3d^2+3d + proj d^2+d + ln_2 2d + fc 4d^2+4d + mlp.proj 4d^2+d = 12d^2 + 13d = 49,984
#   stored: 2 x 49,984 + wte 128 x 64 (8,192, the head tied to it) + wpe 32 x 64 (2,048) + ln_f 128 = 110,336
#   the workload's count leaves out the 63 padding rows: 110,336 - 63 x 64 = 106,304
#   FLOPs per token 6 N + 12 l d s, N without wpe: 6 x 104,256 + 12 x 2 x 64 x 32 = 674,688; x 32 tokens x 8 samples
A = {"model": "custom", "workload_options": {"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 32},
     "batch_size": 8, "precision": "bf16-mixed", "devices": 2}  # fmt: skip
A_STORED, A_PARAMETERS, A_FLOPS = 110_336, 106_304, 674_688 * 32 * 8
# linear layers' parameters (autocast copies them to bf16): per block 12d^2 + 9d = 49,728, x 2, + the head 8,192
A_MATMUL = 2 * 49_728 + 8_192
# activations, 2-byte values, no scores: per layer 34 s b h = 34 x 32 x 8 x 64 = 557,056, x 2 layers;
# outside the layers s b h (1 + 4) = 81,920 and the fp32 log-probabilities over the 65 columns the loss reads (the
# vocabulary's, its padding to 128 dropped) 4 s b V = 4 x 32 x 8 x 65 = 66,560 (DeepSpeed's bf16 mode runs the model
# in bf16); under autocast the two norms' inputs stay fp32: + 4 s b h = 65,536 a layer
A_ACTIVATIONS_16 = 2 * 557_056 + 81_920 + 66_560
A_ACTIVATIONS = A_ACTIVATIONS_16 + 2 * 65_536
# the start of backward: the cross-entropy's gradients for the log-probabilities (65 columns) and the logits (128:
# the padding's columns get zeros), fp32 4 s b V each
A_LOSS_GRADIENTS = 4 * 32 * 8 * (65 + 128)  # 197,632

# B: custom GPT, 1 layer, 4 heads, width 256, context 32; fp32, batch 4 per device, 2 devices, on a CPU (dropout 0.1:
# torch's CPU attention runs the math path, which keeps the a*s^2 scores).
#   a block: 12 x 65,536 + 13 x 256 = 789,760; wte 128 x 256 = 32,768; wpe 32 x 256 = 8,192; ln_f 512
B = {"model": "custom", "workload_options": {"n_layer": 1, "n_head": 4, "n_embd": 256, "block_size": 32},
     "batch_size": 4, "precision": "fp32", "devices": 2}  # fmt: skip
B_STORED = 789_760 + 32_768 + 8_192 + 512  # 831,232
B_PARAMETERS = B_STORED - 63 * 256  # 815,104
# ZeRO-3 keeps tensors under 1e5 elements whole: only qkv.weight 196,608, fc.weight and mlp.proj.weight 262,144
B_PARTITIONED = 196_608 + 2 * 262_144  # 720,896
B_PERSISTENT = B_STORED - B_PARTITIONED  # 110,336
#   FLOPs: 6 x (815,104 - 8,192) + 12 x 1 x 256 x 32 = 4,939,776 per token, x 32 tokens x 4 samples
B_FLOPS = 4_939_776 * 32 * 4
# activations, fp32: Korthikanti's 34 s b h (16-bit) x 2 = 68 s b h, whose two 1-byte dropout masks are fp32 noise
# tensors on a CPU (+ 2 x 3 - 2 = 4): 32 x 4 x 256 x 72; the scores torch's math attention keeps, 12 bytes each (fp32
# softmax, dropout noise, dropout output): 12 x a s^2 b = 12 x 4 x 32^2 x 4; outside the layers: 32,768 x (4-byte
# embedding dropout noise + 4 x 4 / 2) + 4 s b V = 4 x 32 x 4 x 65 (the columns the loss reads)
B_ACTIVATIONS = 32_768 * 72 + 12 * 4 * 32 * 32 * 4 + 32_768 * 12 + 33_280
B_LOSS_GRADIENTS = 4 * 32 * 4 * (65 + 128)  # 98,816


def test_the_facts_are_the_hand_counted_ones() -> None:
    _, facts = facts_for(**A)
    assert (facts.stored_parameters, facts.parameters, facts.matmul_parameters) == (
        A_STORED,
        A_PARAMETERS,
        A_MATMUL,
    )
    assert facts.flops_per_sample * 8 == A_FLOPS
    assert facts.unit_parameters == (49_984, 49_984) and facts.outer_parameters == 8_192 + 2_048 + 128
    _, facts = facts_for(**B)
    assert (facts.stored_parameters, facts.parameters) == (B_STORED, B_PARAMETERS)
    assert sum(t for t in facts.tensor_sizes if t >= 100_000) == B_PARTITIONED


def test_a_ddp_against_zero3_on_a_gpu() -> None:
    config, facts = facts_for(**A, strategy="ddp")
    ddp = predict(config, facts, device_type="cuda")
    m = ddp.memory
    # replicated: fp32 weights 4 + gradients 4 + AdamW moments 8 bytes per parameter; autocast's bf16 copies
    assert (m.weights_bytes, m.gradients_bytes, m.optimizer_bytes) == (
        4 * A_STORED,
        4 * A_STORED,
        8 * A_STORED,
    )
    assert m.transient_bytes == 2 * A_MATMUL
    assert m.activations_bytes == A_ACTIVATIONS
    assert m.backward_transient_bytes == A_LOSS_GRADIENTS
    # the peak is at the start of backward: everything the forward holds and the loss's gradients
    assert (
        ddp.peak_memory_bytes == 16 * A_STORED + 2 * A_MATMUL + A_ACTIVATIONS + A_LOSS_GRADIENTS == 3_571_968
    )
    assert ddp.peak_phase == "backward"
    assert ddp.flops_per_step == A_FLOPS and ddp.parameters == A_PARAMETERS
    # all-reduce of the fp32 gradients: 2 (p-1)/p x 4 x 110,336 bytes = 441,344 per device
    assert [(op.op, op.bus_bytes) for op in ddp.comm] == [("all_reduce", 441_344.0)]

    config, facts = facts_for(**A, strategy="deepspeed-zero3")
    zero3 = predict(config, facts, device_type="cuda")
    m = zero3.memory
    # DeepSpeed's bf16 mode: bf16 parameters (every tensor is under 1e5 elements: all stay whole, beside their
    # partitions 2 x n / 2), an fp32 master partition 4 x n / 2, the bf16 gradient partition buffer 2 x n / 2 (its
    # fp32 copy 4 x n / 2 only in the optimizer step), fp32 moments 8 x n / 2, and the gradient bucket an
    # accelerator allocates whole: 5e8 elements x 2 bytes
    assert m.weights_bytes == 2 * A_STORED + A_STORED
    assert m.master_weights_bytes == 2 * A_STORED
    assert m.gradients_bytes == A_STORED and m.optimizer_transient_bytes == 2 * A_STORED
    assert m.optimizer_bytes == 4 * A_STORED
    assert m.buffer_bytes == 500_000_000 * 2 and m.transient_bytes == 0
    assert m.activations_bytes == A_ACTIVATIONS_16
    assert zero3.peak_memory_bytes == 1_002_476_288 - A_STORED + A_LOSS_GRADIENTS
    # nothing to all-gather in forward or backward; after the optimizer step the 28 persistent tensors (2 x 12 of
    # the blocks, wte, wpe, ln_f's 2) gathered whole again one call each, (p-1)/p x 2 x 110,336 in bf16, back to
    # back; reduce-scatter of bf16 gradients: (p-1)/p x 2 x 110,336
    assert [(op.op, op.bus_bytes, op.count, op.burst) for op in zero3.comm] == [
        ("all_gather", 110_336.0, 28, True),
        ("reduce_scatter", 110_336.0, 1, False),
    ]
    assert zero3.comm_bytes_per_step == 2 * 110_336


def test_b_ddp_against_zero3_on_a_cpu() -> None:
    config, facts = facts_for(**B, strategy="ddp")
    ddp = predict(config, facts, device_type="cpu")
    assert ddp.memory.activations_bytes == B_ACTIVATIONS == 2_982_400
    assert ddp.peak_memory_bytes == 16 * B_STORED + B_ACTIVATIONS + B_LOSS_GRADIENTS == 16_380_928
    assert ddp.flops_per_step == B_FLOPS == 632_291_328
    assert ddp.comm_bytes_per_step == 4 * B_STORED  # 2 (p-1)/p x 4 bytes x n, p = 2

    config, facts = facts_for(**B, strategy="deepspeed-zero3")
    zero3 = predict(config, facts, device_type="cpu")
    m = zero3.memory
    # every parameter's partition, and the persistent tensors whole beside theirs
    assert m.weights_bytes == 4 * B_STORED / 2 + 4 * B_PERSISTENT == 2_103_808
    assert m.master_weights_bytes == 4 * B_STORED / 2 == 1_662_464
    # the gradient partition buffer; its fp32 copy is made in the optimizer step
    assert m.gradients_bytes == 4 * B_STORED / 2 == m.optimizer_transient_bytes == 1_662_464
    assert m.optimizer_bytes == 8 * B_STORED / 2 == 3_324_928
    # gathered parameters (all the partitioned ones: under the 5e7 prefetch) + the bucket, a tensor of 5e8 fp32
    # elements whatever the model (a CPU's resident set holds only what is written; the tensor peak counts it whole)
    assert m.transient_bytes == 4 * B_PARTITIONED and m.buffer_bytes == 500_000_000 * 4
    # more than DDP's: for so small a model DeepSpeed's copies and bucket outweigh what the sharding saves
    held = m.weights_bytes + m.master_weights_bytes + m.gradients_bytes + m.optimizer_bytes + m.buffer_bytes
    assert (
        zero3.peak_memory_bytes
        == held + m.transient_bytes + B_ACTIVATIONS + B_LOSS_GRADIENTS
        == 14_718_464 + 2_000_000_000
    )
    # all-gather of the partitioned parameters twice, (p-1)/p x 2 x 4 x 720,896, one call per tensor in forward
    # and in backward; the 13 persistent tensors' after the optimizer step, (p-1)/p x 4 x 110,336; reduce-scatter
    # (p-1)/p x 4 x n
    ops = [(op.op, op.bus_bytes, op.count) for op in zero3.comm]
    assert ops == [
        ("all_gather", 2_883_584.0, 6),
        ("all_gather", 220_672.0, 13),
        ("reduce_scatter", 1_662_464.0, 1),
    ]


def test_one_device_frees_its_gradients_so_its_peak_holds_the_larger_of_them_and_the_activations() -> None:
    config, facts = facts_for(**{**B, "devices": 1}, strategy="single")
    single = predict(config, facts, device_type="cpu")
    assert single.memory.gradients_bytes == 4 * B_STORED and single.memory.gradients_freed_each_step
    # weights 4 + moments 8 bytes a parameter, and max(gradients 4 x n = 3,324,928, activations 2,982,400 + the
    # loss's gradients 98,816): the gradients, at the end of backward and in the optimizer step (fused: no
    # temporaries)
    assert single.peak_memory_bytes == 12 * B_STORED + max(4 * B_STORED, B_ACTIVATIONS + B_LOSS_GRADIENTS)
    assert single.peak_memory_bytes == 13_299_712 and single.peak_phase == "backward"
    assert single.phase_bytes == {
        "forward": 12 * B_STORED + B_ACTIVATIONS,
        "backward": 16 * B_STORED,
        "optimizer": 16 * B_STORED,
    }
    assert single.comm == [] and single.comm_bytes_per_step == 0


def test_step_time_and_fit_follow_from_peak_bandwidth_and_memory() -> None:
    config, facts = facts_for(**B, strategy="ddp")
    device = DeviceInfo(index=0, name="test", memory_bytes=15_000_000)
    peak = PeakFigures(flops_per_s=1e12, memory_bandwidth_bytes_per_s=1e11, source="test")
    bandwidth = BusBandwidth.constant(1e9, "test")
    p = predict(config, facts, device_type="cuda", device=device, peak=peak, bandwidth=bandwidth, efficiency=0.5,
                overlap="none")  # fmt: skip
    assert p.compute_s == pytest.approx(B_FLOPS / 0.5e12)
    assert p.comm_s == pytest.approx(4 * B_STORED / 1e9)
    # AdamW streams fp32 weights (read, write), gradients and both moments (read, write): 28 bytes a parameter
    assert p.optimizer_s == pytest.approx(28 * B_STORED / 1e11)
    assert p.step_time_s == pytest.approx(p.compute_s + p.comm_s + p.optimizer_s)
    assert p.samples_per_s == pytest.approx(2 * 4 / p.step_time_s)
    # on a GPU-like device no scores are kept and fused dropout's masks are a byte (Korthikanti's 34 s b h at fp32
    # width, 68, less a byte for each of the two masks): 16 x n + 32,768 x 66 + 294,912 + 65,536 + the loss's
    # gradients > 15,000,000 bytes
    assert p.peak_memory_bytes == 16 * B_STORED + 32_768 * 66 + 32_768 * 9 + 33_280 + B_LOSS_GRADIENTS
    assert p.fits is False
    overlapped = predict(config, facts, device_type="cuda", peak=peak, bandwidth=bandwidth, efficiency=0.5,
                         overlap="backward")  # fmt: skip
    assert overlapped.comm_exposed_s == pytest.approx(max(0.0, p.comm_s - 2 / 3 * p.compute_s))


def test_seed_001_speedup() -> None:
    # 1 s steps of which 0.2 s communication at g = 8; at n = 16 the communication takes 0.25 s: eff = 0.8
    s = predict_speedup(1.0, 0.2, 8, 16, 0.25)
    assert s.network_efficiency == pytest.approx(0.8)
    assert s.step_ratio == pytest.approx(1 / (0.8 + 0.2 / 0.8))
    assert s.throughput_speedup == pytest.approx(2 / 1.05)
    one = predict_speedup(0.5, 0.0, 1, 2, 0.1)  # from one device: no communication to scale from
    assert one.network_efficiency is None and one.throughput_speedup == pytest.approx(2 * 0.5 / 0.6)


def test_measured_peak_is_positive_and_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from accelbench.contract import standard_plan
    from accelbench.estimate import peak as peak_module

    backend = get_host().backends["cpu"]
    plan = standard_plan("fp32", "ieee-fp32")
    device = backend.setup_device(World(), {})
    torch.set_num_threads(1)
    quiet = iter([CpuUsage(0.0, 0.0, None), CpuUsage(1.0, 0.0, None)])  # ran 1 s, never waited for a core
    monkeypatch.setattr(peak_module, "cpu_usage", lambda: next(quiet))
    first = peak_module.measured_peak(backend, device, plan, budget_s=0.2, directory=tmp_path)
    assert first is not None and first.flops_per_s > 0 and first.source.startswith("measured: dense matmul")
    assert (first.memory_bandwidth_bytes_per_s or 0) > 0
    assert "1 thread(s)" in first.source and "float32" in first.source
    stored = json.loads((tmp_path / peak_module.CACHE_FILE).read_text())
    assert len(stored) == 1

    def no_timing(*args: object, **kwargs: object) -> None:
        raise AssertionError("the second call must read the cache, not measure")

    monkeypatch.setattr(peak_module, "time_matmul", no_timing)
    again = peak_module.measured_peak(backend, device, plan, budget_s=0.2, directory=tmp_path)
    assert again == first
    torch.set_num_threads(2)  # another thread count is another measurement
    assert peak_module.measured_peak(backend, device, plan, cached_only=True, directory=tmp_path) is None


def test_a_peak_measured_on_a_busy_host_is_measured_again_and_the_higher_rate_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy host can only lower a matmul rate: a contended measurement is cached but measured again next time,
    keeping the higher rate, until one on a quiet host stands."""
    from accelbench.contract import standard_plan
    from accelbench.estimate import peak as peak_module
    from accelbench.estimate.peak import MatmulRate

    backend = get_host().backends["cpu"]
    plan = standard_plan("fp32", "ieee-fp32")
    device = backend.setup_device(World(), {})
    rates = iter([100e9, 80e9, 150e9])  # busy, busy and slower, then quiet and faster
    waits = iter([0.5, 0.5, 0.0])  # seconds waited for a core over 1 s of running
    readings: list[CpuUsage] = []

    def usage() -> CpuUsage:
        if not readings:
            readings.append(CpuUsage(0.0, 0.0, None))
            return readings[0]
        readings.clear()
        return CpuUsage(1.0, next(waits), None)

    def timed(*args: object, **kwargs: object) -> MatmulRate:
        rate = next(rates)
        return MatmulRate("float32", 256, 3, rate, rate)

    monkeypatch.setattr(peak_module, "cpu_usage", usage)
    monkeypatch.setattr(peak_module, "time_matmul", timed)
    monkeypatch.setattr(peak_module, "time_copy", lambda *a, **k: 1e10)

    def measure() -> PeakFigures:
        figures = peak_module.measured_peak(backend, device, plan, directory=tmp_path)
        assert figures is not None
        return figures

    busy = measure()
    assert busy.flops_per_s == 100e9 and "the host was busy meanwhile (threads waited 33%" in busy.source
    assert measure().flops_per_s == 100e9  # measured again, slower: the higher rate stands
    quiet = measure()
    assert quiet.flops_per_s == 150e9 and "busy" not in quiet.source
    assert measure() == quiet  # a quiet measurement is trusted: no fourth timing (rates would run out)


def test_a_peak_measured_while_the_hypervisor_stole_the_cores_is_a_lower_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A virtual machine's threads do not wait for a core the hypervisor gave away, they just run slower: 20% of
    the cores' ticks stolen marks the measurement busy though no thread waited."""
    from accelbench.contract import standard_plan
    from accelbench.estimate import peak as peak_module
    from accelbench.estimate.peak import MatmulRate

    backend = get_host().backends["cpu"]
    device = backend.setup_device(World(), {})
    readings = iter([CpuUsage(0.0, 0.0, None, 100, 1000), CpuUsage(1.0, 0.0, None, 300, 2000)])
    monkeypatch.setattr(peak_module, "cpu_usage", lambda: next(readings))
    monkeypatch.setattr(peak_module, "time_matmul", lambda *a, **k: MatmulRate("float32", 256, 3, 1e11, 1e11))
    monkeypatch.setattr(peak_module, "time_copy", lambda *a, **k: 1e10)
    figures = peak_module.measured_peak(
        backend, device, standard_plan("fp32", "ieee-fp32"), directory=tmp_path
    )
    assert (
        figures is not None
        and "threads waited 0% of their ready time, the hypervisor stole 20%" in figures.source
    )
    (entry,) = json.loads((tmp_path / peak_module.CACHE_FILE).read_text()).values()
    assert entry["contended"] and entry["steal"] == pytest.approx(0.2)


@pytest.mark.needs_plugin(
    "accelbench-cuda", "accelbench-rocm", why="H100 and the MI2xx devices come from their peak tables"
)
def test_devices_by_name_and_unknown_names() -> None:
    host = get_host()
    h100 = find_device(host, "h100")
    assert h100.backend.name == "cuda" and h100.device.memory_bytes == 80 * GIB
    assert find_device(host, "MI250X").device.details["compute_units"] == "110"
    with pytest.raises(
        ConfigError, match=r"no installed plugin's peak table knows it; known devices: .*H100"
    ):
        find_device(host, "Z9000")
    with pytest.raises(ConfigError, match="matches several devices"):
        find_device(host, "MI2")


def test_impossible_configurations_are_refused() -> None:
    config, facts = facts_for(**B, strategy="ddp")
    with pytest.raises(ConfigError, match="strategy 'single' trains on one device"):
        predict(config.model_copy(update={"strategy": "single"}), facts, device_type="cpu")
    with pytest.raises(ConfigError, match="DeepSpeed keeps fp32 master weights"):
        predict(config.model_copy(update={"strategy": "deepspeed-zero2", "precision": "bf16-true"}), facts,
                device_type="cpu")  # fmt: skip
    with pytest.raises(ConfigError, match="--efficiency"):
        predict(config, facts, device_type="cpu", efficiency=1.5)
    with pytest.raises(ConfigError, match="no model for strategy 'pipelined'"):
        predict(config.model_copy(update={"strategy": "pipelined"}), facts, device_type="cpu")


def test_comm_records_give_bandwidth_by_size(tmp_path: Path) -> None:
    def measured(op: str, size: int, busbw: float, variant: str = "out-of-place") -> CommMeasurement:
        return CommMeasurement(op=op, dtype="fp32", variant=variant, size_bytes=size, count=size // 4,  # type: ignore[arg-type]
                               requested_bytes=size, status="ok", iters=1, busbw_gbps=busbw, bus_factor=1.0)  # fmt: skip

    record = comm_record(
        [
            measured("all_reduce", 2**20, 1.0),
            measured("all_reduce", 2**20, 9.0, "in-place"),
            measured("all_reduce", 2**24, 4.0),
        ],
        [2**20, 2**24],
        run_id="0123456789abcdef",
    )
    write_comm_record(record, tmp_path)
    (tmp_path / "other.json").write_text('{"schema": "accelbench.result"}')  # another record: skipped
    bandwidth = load_bus_bandwidth([tmp_path])
    found = bandwidth.lookup("all_reduce", 2, 2**22, "fp32")
    assert found is not None
    assert found[0] == pytest.approx(2e9)  # log-log halfway between 1 GB/s at 1 MiB and 4 GB/s at 16 MiB
    assert bandwidth.lookup("all_reduce", 2, 2**10, "fp32")[0] == pytest.approx(1e9)  # type: ignore[index]
    sibling = bandwidth.lookup("reduce_scatter", 8, 2**24, "bf16")
    assert sibling is not None and "none measured over 8 ranks" in sibling[1] and "no bf16" in sibling[1]
    with pytest.raises(ConfigError, match="not an accelbench comm record"):
        load_bus_bandwidth([tmp_path / "other.json"])


def all_gather_timed(size: int, in_step: list[tuple[float, float]]) -> CommMeasurement:
    """An all_gather of ``size`` bytes over 2 ranks at 0.5 GB/s bus bandwidth alone, and ``in_step`` (compute ms,
    call us) as a step met it."""
    return CommMeasurement(op="all_gather", dtype="fp32", variant="out-of-place", size_bytes=size, count=size // 4,
                           requested_bytes=size, status="ok", iters=1, time_us=size / 1e3, busbw_gbps=0.5,
                           bus_factor=0.5,
                           in_step=[InStepTime(compute_ms=ms, time_us=us) for ms, us in in_step])  # fmt: skip


def test_several_records_of_a_host_price_a_call_in_a_step_at_their_mean(tmp_path: Path) -> None:
    """On this VM the same 1 MiB all_reduce after 5 ms of compute took 1.2 ms in one record and 2.6 ms in another
    made minutes later. Records given together are pooled by the compute asked for (--in-step): each size's call
    after 5 ms is the mean of the records' (compute 4.6 and 5.4 ms measured, not two points to zigzag between), and
    the text says how many records it averages. A record alone reads as before."""
    from accelbench.comm.records import write_comm_record

    for name, lengths, times in (("a", (4.6, 18.0), (1000.0, 3000.0)), ("b", (5.4, 22.0), (3000.0, 5000.0))):
        record = comm_record([all_gather_timed(2**20, list(zip(lengths, times, strict=True)))], [2**20],
                             run_id=name * 16)  # fmt: skip
        record = record.model_copy(
            update={"config": record.config.model_copy(update={"in_step_ms": [5.0, 20.0]})}
        )
        write_comm_record(record, tmp_path / name)
    both = load_bus_bandwidth([tmp_path / "a", tmp_path / "b"])
    found = both.lookup_in_step("all_gather", 2, 2**20, "fp32", 0.005)
    assert found is not None and found[0] == pytest.approx(2e-3) and "the mean of 2 records" in found[1]
    assert both.lookup_in_step("all_gather", 2, 2**20, "fp32", 0.020)[0] == pytest.approx(4e-3)  # type: ignore[index]
    alone = load_bus_bandwidth([tmp_path / "a"]).lookup_in_step("all_gather", 2, 2**20, "fp32", 0.0046)
    assert alone is not None and alone[0] == pytest.approx(1e-3) and "mean of" not in alone[1]


def test_collectives_are_priced_as_a_step_meets_them_where_comm_timed_them_so(tmp_path: Path) -> None:
    """On this CPU an FSDP all_gather of 704 KiB took 0.4-0.9 ms timed alone and 2-3.5 ms after 5-70 ms of compute
    on both ranks (the wait for the slower rank and the collective's own cold start), and the prediction, pricing
    each call at its bus bandwidth alone, came 12-35% short of 2-process runs. `accelbench comm --in-step` times
    the calls after compute; where every collective is exposed (a CPU's overlap none), each call is priced at that
    time, read at the step's compute over its calls (log-linear in compute, log-log in size, clamped), in place of
    bus bytes over bus bandwidth. Where collectives overlap the backward pass (an accelerator's default) the
    bandwidth model stands, and so does a record without in-step times."""
    record = comm_record(
        [
            all_gather_timed(2**20, [(5.0, 1000.0), (20.0, 3000.0)]),
            all_gather_timed(2**22, [(5.0, 2000.0), (20.0, 6000.0)]),
        ],
        [2**20, 2**22],
    )
    write_comm_record(record, tmp_path)
    bandwidth = load_bus_bandwidth([tmp_path])
    # 10 ms lies log-halfway between 5 and 20: 2,000 us at 1 MiB, 4,000 at 4 MiB; 2 MiB log-log halfway: sqrt(8e6)
    found = bandwidth.lookup_in_step("all_gather", 2, 2**21, "fp32", 0.010)
    assert found is not None and found[0] == pytest.approx(8e6**0.5 * 1e-6)
    assert "after 10 ms of compute" in found[1]
    assert bandwidth.lookup_in_step("all_gather", 2, 2**20, "fp32", 0.001)[0] == pytest.approx(1e-3)  # type: ignore[index]
    assert bandwidth.lookup_in_step("all_gather", 2, 2**30, "fp32", 1.0)[0] == pytest.approx(6e-3)  # type: ignore[index]
    sibling = bandwidth.lookup_in_step("reduce_scatter", 2, 2**20, "fp32", 0.005)
    assert sibling is not None and "its sibling all_gather" in sibling[1]
    assert bandwidth.lookup_in_step("all_reduce", 2, 2**20, "fp32", 0.005) is None  # no stand-in: bandwidth

    config, facts = facts_for(**B, strategy="fsdp")
    peak = PeakFigures(flops_per_s=1e12, memory_bandwidth_bytes_per_s=1e11, source="test")
    p = predict(config, facts, device_type="cpu", peak=peak, bandwidth=bandwidth, efficiency=0.5)
    calls = sum(op.count for op in p.comm)
    assert p.compute_s is not None and p.optimizer_s is not None and calls > 1
    segment = (p.compute_s + p.optimizer_s) / calls
    for op in p.comm:
        per_call = bandwidth.lookup_in_step(op.op, 2, op.message_bytes, "fp32", segment)
        assert per_call is not None and op.time_s == pytest.approx(op.count * per_call[0])
        assert (op.bandwidth_source or "").startswith("in step: ")
    assert p.comm_exposed_s == pytest.approx(sum(op.time_s or 0.0 for op in p.comm))
    assert p.step_time_s == pytest.approx(p.compute_s + p.optimizer_s + p.comm_exposed_s)
    assert any("accelbench comm --in-step" in a for a in p.assumptions)

    overlapped = predict(config, facts, device_type="cuda", peak=peak, bandwidth=bandwidth, efficiency=0.5)
    bandwidth.in_step = []
    alone = predict(config, facts, device_type="cpu", peak=peak, bandwidth=bandwidth, efficiency=0.5)
    for prediction in (overlapped, alone):
        assert [op.time_s for op in prediction.comm] == pytest.approx(
            [op.bus_bytes / 1e9 * 2 for op in prediction.comm]  # bus bytes over 0.5 GB/s
        )
        assert not any("--in-step" in a for a in prediction.assumptions)


def test_zero3s_gather_of_its_persistent_tensors_is_one_burst_of_which_only_the_first_call_meets_the_step(
    tmp_path: Path,
) -> None:
    """After its optimizer step DeepSpeed ZeRO-3 gathers each persistent tensor (under 1e5 elements) whole again,
    one all_gather a tensor, launched back to back (stage3's _post_step): B's 13 such calls. Priced as a step
    meets collectives (a CPU's), the burst's first call waits for the step (its in-step time, read at the step's
    compute over its calls, the burst counted as one) and the other 12 cost what calls timed alone cost (bus
    bytes over 0.5 GB/s here); the model had no such collective until 2026-11-28, when gpt-micro's ZeRO-3 step,
    whose every tensor is persistent, came 25% short."""
    record = comm_record(
        [
            all_gather_timed(2**14, [(5.0, 1000.0), (20.0, 3000.0)]),
            all_gather_timed(2**22, [(5.0, 2000.0), (20.0, 6000.0)]),
        ],
        [2**14, 2**22],
    )
    write_comm_record(record, tmp_path)
    bandwidth = load_bus_bandwidth([tmp_path])
    config, facts = facts_for(**B, strategy="deepspeed-zero3")
    peak = PeakFigures(flops_per_s=1e12, memory_bandwidth_bytes_per_s=1e11, source="test")
    p = predict(config, facts, device_type="cpu", peak=peak, bandwidth=bandwidth, efficiency=0.5)
    gathers, burst, scatter = p.comm
    assert (burst.count, burst.burst, gathers.burst, scatter.burst) == (13, True, False, False)
    assert p.compute_s is not None and p.optimizer_s is not None
    segment = (p.compute_s + p.optimizer_s) / (gathers.count + 1 + scatter.count)
    first = bandwidth.lookup_in_step("all_gather", 2, burst.message_bytes, "fp32", segment)
    assert first is not None
    alone = burst.bus_bytes / 0.5e9  # the 13 calls' bus bytes over the bus bandwidth of calls timed alone
    assert burst.time_s == pytest.approx(first[0] + alone * 12 / 13)
    assert "the 12 calls after it back to back, as timed alone" in (burst.bandwidth_source or "")
    for op in (gathers, scatter):  # each of their calls meets the step
        per_call = bandwidth.lookup_in_step(op.op, 2, op.message_bytes, "fp32", segment)
        assert per_call is not None and op.time_s == pytest.approx(op.count * per_call[0])


def test_a_burst_is_priced_at_a_calls_time_in_a_burst_where_comm_timed_bursts(tmp_path: Path) -> None:
    """gloo on this CPU ran 52 gathers of gpt-micro's persistent tensors, issued back to back, at 0.85 ms a call
    where one call alone took 0.4 ms: the burst was priced at half its time. Where the comm record timed bursts
    (`accelbench comm --burst N`), a burst's calls are priced at a call's time in a burst (log-log in size; here
    3 and 12 ms a call at 16 KiB and 4 MiB, where calls alone take 16 and 4194 us); where collectives are priced
    as a step meets them, the first still meets the step and the rest cost that. The other collectives, not
    bursts, stand as they were; a record without bursts prices calls timed alone, as before."""
    measurements = [
        all_gather_timed(2**14, [(5.0, 1000.0), (20.0, 3000.0)]).model_copy(update={"burst_us": 3000.0}),
        all_gather_timed(2**22, [(5.0, 2000.0), (20.0, 6000.0)]).model_copy(update={"burst_us": 12000.0}),
    ]
    record = comm_record(measurements, [2**14, 2**22])
    record.config.burst = 16
    write_comm_record(record, tmp_path)
    bandwidth = load_bus_bandwidth([tmp_path])
    per_call = bandwidth.lookup_burst("all_gather", 2, 2**18, "fp32")
    assert per_call is not None and per_call[0] == pytest.approx(6e-3)  # halfway, log-log: sqrt(3 x 12) ms
    assert "in a burst (measured in bursts of 16 calls, at 16 KiB to 4 MiB)" in per_call[1]
    config, facts = facts_for(**B, strategy="deepspeed-zero3")
    peak = PeakFigures(flops_per_s=1e12, memory_bandwidth_bytes_per_s=1e11, source="test")
    gpu = predict(config, facts, device_type="cuda", peak=peak, bandwidth=bandwidth, efficiency=0.5)
    gathers, burst, scatter = gpu.comm
    expected = bandwidth.lookup_burst("all_gather", 2, burst.message_bytes, "fp32")
    assert expected is not None and burst.time_s == pytest.approx(13 * expected[0])
    assert gathers.time_s == pytest.approx(gathers.bus_bytes / 0.5e9)  # not a burst: its bus bandwidth
    cpu = predict(config, facts, device_type="cpu", peak=peak, bandwidth=bandwidth, efficiency=0.5)
    gathers, burst, scatter = cpu.comm
    assert cpu.compute_s is not None and cpu.optimizer_s is not None
    segment = (cpu.compute_s + cpu.optimizer_s) / (gathers.count + 1 + scatter.count)
    first = bandwidth.lookup_in_step("all_gather", 2, burst.message_bytes, "fp32", segment)
    assert first is not None and burst.time_s == pytest.approx(first[0] + 12 * expected[0])
    assert "the 12 calls after it back to back, as a burst" in (burst.bandwidth_source or "")
    record.config.burst = 0  # a record without bursts: the calls after the first as timed alone
    for m in record.measurements:
        m.burst_us = None
    write_comm_record(record, tmp_path / "alone")
    alone = predict(config, facts, device_type="cpu", peak=peak, bandwidth=load_bus_bandwidth([tmp_path / "alone"]),
                    efficiency=0.5).comm[1]  # fmt: skip
    assert alone.time_s == pytest.approx(first[0] + alone.bus_bytes / 0.5e9 * 12 / 13)


@pytest.mark.needs_plugin("accelbench-cuda", why="--device H100 comes from its peak table")
@pytest.mark.slow
def test_command_line_json_validates_and_refusals_exit_2(tmp_path: Path) -> None:
    args = ["estimate", "--model", "gpt2", "--batch-size", "16", "--precision", "bf16-mixed", "--strategy", "fsdp",
            "--devices", "8", "--device", "H100", "--bus-bandwidth", "450", "--scale-to", "16"]  # fmt: skip
    done = accelbench(*args, "--json", timeout=120)
    assert done.returncode == 0, done.stderr
    prediction = Prediction.model_validate_json(done.stdout)
    assert prediction.device.startswith("NVIDIA H100 80GB HBM3") and prediction.fits is True
    assert prediction.step_time_s and prediction.scaling[0].devices_to == 16
    table = accelbench(*args, timeout=120)
    assert table.returncode == 0 and "memory per device" in table.stdout and "fits" in table.stdout
    unknown = accelbench("estimate", "--device", "Z9000", timeout=120)
    assert unknown.returncode == 2 and "known devices" in unknown.stderr and "H100" in unknown.stderr
    single = accelbench("estimate", "--devices", "2", "--device", "H100", timeout=120)
    assert single.returncode == 2 and "strategy 'single' trains on one device" in single.stderr


def test_help_imports_no_torch() -> None:
    import subprocess

    code = (
        "import sys\nfrom accelbench.cli import main\n"
        "for argv in (['--help'], ['estimate', '--help']):\n"
        "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
        "print('torch' in sys.modules, file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stderr.strip().splitlines()[-1] == "False", out.stderr
    assert "--measure-peak" in out.stdout and "estimate" in out.stdout


@pytest.mark.slow
def test_runs_carry_their_prediction_and_compare_and_report_set_it_against_what_they_measured(
    tmp_path: Path,
) -> None:
    """Real runs (DDP on one process, then over two gloo processes, with comm records of this host) each store the
    model's prediction for their own configuration; compare puts it against what they measured, with the
    predicted 1 -> 2 speedup (seed 001's formula) beside the measured one, and report draws it."""
    comm = tmp_path / "comm"
    done = accelbench("comm", "--devices", "2", "--ops", "all_reduce", "--dtypes", "fp32", "--min-bytes", "4KiB",
                      "--max-bytes", "1MiB", "--factor", "4", "--iters", "3", "--warmup", "1", "--output-dir",
                      str(comm), "-q")  # fmt: skip
    assert done.returncode == 0, done.stderr
    tiny = ["--model", "custom", "--layers", "1", "--heads", "2", "--embd", "32", "--block-size", "16",
            "--batch-size", "4", "--dropout", "0", "--threads", "1", "--epochs", "2", "--steps-per-epoch", "3"]  # fmt: skip
    runs = tmp_path / "runs"
    for strategy, devices in (("ddp", "1"), ("ddp", "2")):  # one series: compare scales within a strategy
        done = accelbench("run", *tiny, "--strategy", strategy, "--devices", devices, "--comm-records", str(comm),
                          "--output-dir", str(runs), "-q")  # fmt: skip
        assert done.returncode == 0, done.stderr
    records = {r["config"]["devices"]: r for r in map(json.loads, map(Path.read_text, runs.glob("*.json")))}
    one, two = records[1]["prediction"], records[2]["prediction"]
    assert one["comm_bytes_per_step"] == 0 and one["note"] is None
    # DDP over 2 ranks all-reduces every gradient: 2 (n-1)/n x 4 bytes x parameters on the bus per device
    stored = two["memory_bytes"]["weights"] / 4
    assert two["comm_bytes_per_step"] == pytest.approx(2 * (2 - 1) / 2 * 4 * stored, rel=1e-6)
    assert two["comm_s"] > 0 and two["comm_exposed_s"] == two["comm_s"]  # a CPU overlaps nothing
    assert two["step_time_s"] == pytest.approx(two["compute_s"] + two["optimizer_s"] + two["comm_exposed_s"])
    assert str(comm) in two["bandwidth_source"]

    done = accelbench("compare", str(runs), "--format", "json")
    assert done.returncode == 0, done.stderr
    cells = {c["devices"]: c for c in json.loads(done.stdout)["groups"][0]["cells"]}
    assert cells[1]["predicted"]["step_s"]["median"] == pytest.approx(one["step_time_s"])
    measured_step = cells[1]["step_s"]["median"]
    steps = records[1]["metrics"]["epochs"][-1]["steps"]
    assert measured_step == pytest.approx(records[1]["metrics"]["steady"]["epoch_s_median"] / steps)
    # seed 001: speedup = (n/g) t_iter(g) / (t_iter(g) - t_comm(g) + t_comm(n)), t_iter(1) measured
    expected = 2 * measured_step / (measured_step + two["comm_exposed_s"])
    assert cells[2]["predicted"]["speedup"] == pytest.approx(expected)
    assert cells[2]["scaling"]["speedup"] > 0
    done = accelbench("compare", str(runs), env={**__import__("os").environ, "COLUMNS": "160"})
    assert done.returncode == 0, done.stderr
    assert "predicted (accelbench estimate's model) against measured" in done.stdout
    assert f"{expected:.2f}x" in done.stdout

    done = accelbench("report", str(runs), "--output", str(tmp_path / "report.html"))
    assert done.returncode == 0, done.stderr
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "Predicted against measured" in html


@pytest.mark.parametrize("what", ["missing", "empty", "not a comm record"])
def test_unreadable_comm_records_are_refused_before_a_run(what: str, tmp_path: Path, capsys) -> None:
    from accelbench.cli import main

    path = tmp_path / "comm"
    if what == "empty":
        path.mkdir()
    elif what == "not a comm record":
        path.write_text('{"schema": "accelbench.result", "schema_version": 2}')
    code = main(
        ["run", "--model", "gpt-nano", "--comm-records", str(path), "--output-dir", str(tmp_path / "out")]
    )
    assert code == 2  # refused before anything ran: no record
    assert "--comm-records" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_a_named_device_applies_the_backends_run_options_to_its_precision_plan(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`estimate --device A100 --tf32 on` predicts TF32 math at the TF32 peak, and says so; an option of another
    backend is refused, never dropped (issue 22)."""
    from accelbench.cli import main

    monkeypatch.delenv("ACCELBENCH_TF32", raising=False)

    def estimate(*args: str) -> Prediction:
        assert main(["estimate", "--device", "A100", *args, "--json"]) == 0
        return Prediction.model_validate_json(capsys.readouterr().out)

    # a model whose products, not the host's dispatching, bound its step (gpt-nano's is all dispatch: TF32 or not)
    on, off = (
        estimate("--tf32", tf32, "--model", "gpt-mini", "--batch-size", "256") for tf32 in ("on", "off")
    )
    assert on.peak_flops_per_s == 156e12 and "tf32" in (on.peak_source or "") and on.matmul_math == "tf32"
    assert off.peak_flops_per_s == 19.5e12 and off.matmul_math == "ieee-fp32"
    assert on.step_time_s and off.step_time_s and on.step_time_s < off.step_time_s / 2
    assert any("TF32 policy on" in line for line in on.assumptions)
    monkeypatch.setenv("ACCELBENCH_TF32", "on")  # the policy's environment variable, as a run reads it
    assert estimate().matmul_math == "tf32"
    assert main(["estimate", "--device", "A100", "--tf32", "on"]) == 0
    assert "matmul math: tf32" in capsys.readouterr().out
    assert main(["estimate", "--device", "GC200", "--tf32", "on"]) == 2
    assert "--tf32 is an option of backend 'cuda', not of 'ipu'" in capsys.readouterr().err


def test_a_plugin_that_needs_its_device_for_the_plan_refuses_options_it_cannot_apply() -> None:
    """A catalogue device whose plugin makes its plan only with the device present: the standard plan, said so,
    when no backend option was given; a refusal naming the options when some were (never silently dropped)."""
    from accelbench.contract import Backend
    from accelbench.errors import BackendError
    from accelbench.estimate.catalog import KnownDevice
    from accelbench.estimate.command import _catalogue_plan

    class NeedsItsDevice(Backend):
        info = BackendInfo(name="needy", device_type="cpu", device_unit="a device")

        def precision_plan(self, precision, device, options):  # type: ignore[no-untyped-def]
            raise BackendError("no device to ask")

    known = KnownDevice(NeedsItsDevice(), DeviceInfo(index=0, name="Needy 1"))
    config = RunConfig(precision="fp32")
    plan, note = _catalogue_plan(known, config, "cpu")
    assert plan.matmul_math == "ieee-fp32" and note and "only with the device present" in note
    with pytest.raises(
        ConfigError, match=r"--fast-math on: the needy plugin makes its precision plan only with"
    ):
        _catalogue_plan(known, config.model_copy(update={"backend_options": {"fast_math": "on"}}), "cpu")


def test_a_named_ipu_applies_the_partials_option_and_refuses_what_a_run_would(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`estimate --device GC200 --partials half|float`: the AMP mode the option selects (FP16.16 at its 250 TFLOP/s,
    FP16.32 with no published peak), stated; --partials half with fp32 is refused with the plugin's own message,
    as a run is, never replaced by the standard fp32 plan (issue 22)."""
    from accelbench.cli import main

    def estimate(*args: str) -> Prediction:
        assert main(["estimate", "--device", "GC200", "--precision", "fp16-mixed", *args, "--json"]) == 0
        return Prediction.model_validate_json(capsys.readouterr().out)

    half, single = estimate("--partials", "half"), estimate("--partials", "float")
    assert half.peak_flops_per_s == 250e12 and (half.matmul_math or "").startswith("FP16.16")
    assert single.peak_flops_per_s is None and (single.matmul_math or "").startswith("FP16.32")
    assert (estimate().matmul_math or "").startswith("FP16.32")  # PopTorch's default: float partials
    assert main(["estimate", "--device", "GC200", "--precision", "fp32", "--partials", "half"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --partials half applies to fp16 matmuls, but --precision is fp32"), err
    assert "only with the device present" not in err
    assert main(["estimate", "--device", "GC200", "--precision", "fp16-mixed", "--partials", "double"]) == 2
    assert "--partials" in capsys.readouterr().err


def test_megatron_flops_in_both_forms_each_labelled_as_what_it_is() -> None:
    """Issue 22: seed 002's formula (Narayanan et al. 2021) is 96 B s l h^2 (1 + s/6h + V/16lh), with full activation
    recomputation (4 passes); the 72 B s l h^2 (1 + s/6h + V/12lh) form is without it. GPT-2 small's shape, one
    sequence, summed term by term: 72 s l h^2 = 521,838,526,464, 12 s^2 l h = 115,964,116,992, 6 s h V (V 50,257) =
    237,142,278,144; with recomputation 96 s l h^2 = 695,784,701,952, 16 s^2 l h = 154,618,822,656, the same 6 s h V."""
    from rich.console import Console

    from accelbench.estimate.command import show
    from accelbench.estimate.parallel import megatron_flops_per_iteration

    assert megatron_flops_per_iteration(1, 1024, 12, 768, 50_257) == pytest.approx(874_944_921_600)
    assert megatron_flops_per_iteration(1, 1024, 12, 768, 50_257, recompute=True) == pytest.approx(
        1_087_545_802_752
    )
    # gpt2 at context 1024 on the character corpus (V = 65: 6 s h V = 306,708,480), batch 2
    config, facts = facts_for(model="gpt2", batch_size=2, workload_options={"block_size": 1024})
    p = predict(config, facts, device_type="cuda")
    assert p.megatron_flops_per_step == pytest.approx(2 * 638_109_351_936)
    assert p.megatron_recompute_flops_per_step == pytest.approx(2 * 850_710_233_088)
    seventy_two = [s for s in p.sources if "72 B s l h^2" in s]
    ninety_six = [s for s in p.sources if "96 B s l h^2" in s]
    assert len(seventy_two) == 1 and "without activation recomputation" in seventy_two[0]
    assert len(ninety_six) == 1 and "full activation recomputation" in ninety_six[0]
    assert "seed 002's formula" in ninety_six[0] and "seed 002's formula" not in seventy_two[0]
    out = Console(record=True, width=200)
    show(p, out)
    text = out.export_text()
    assert "FLOPs per device (Megatron-LM 72-form, no recompute)" in text and "1.276e+12" in text
    assert "FLOPs per device (seed 002: Megatron-LM 96-form, full recompute)" in text and "1.701e+12" in text


def test_the_table_states_the_parameter_count() -> None:
    """Issue 22: the human-readable estimate says how many parameters the model has (the workload's count, and the
    stored elements where padding makes them differ)."""
    from rich.console import Console

    from accelbench.estimate.command import show

    config, facts = facts_for(**A, strategy="ddp")
    out = Console(record=True, width=200)
    show(predict(config, facts, device_type="cuda"), out)
    assert "parameters: 106.3 k (106,304; 110,336 stored, padding included, tied once)" in out.export_text()
    from accelbench.estimate.command import _count

    assert (_count(124_439_808), _count(1_557_611_200), _count(999)) == ("124.4 M", "1.6 B", "999")
