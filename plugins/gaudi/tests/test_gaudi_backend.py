"""The Gaudi backend against stand-ins of Habana's bridge and HLML that enforce Habana's documented rules."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest
import torch
from accelbench_gaudi import hlml, modes, peaks
from accelbench_gaudi.plugin import GaudiBackend
from gaudi_standins import FakeDevice, LazyModeError, bridge_installed, install_hlml

from accelbench.contract import Backend, BackendInfo, DeviceInfo, ExecutorRequest, World, standard_plan
from accelbench.engine.distributed import executor_for
from accelbench.engine.runner import slowest_rank
from accelbench.errors import BackendError, ConfigError
from accelbench.plugins import PluginHost
from accelbench.testing import tiny_config


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("PT_HPU_LAZY_MODE", raising=False)
    monkeypatch.delenv(hlml.VISIBLE_ENV, raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")  # no real hl-smi
    stand_ins = [m for m in sys.modules if m.startswith("habana_frameworks") or m == "pyhlml"]
    for name in stand_ins:
        monkeypatch.delitem(sys.modules, name)
    yield
    for name in [m for m in sys.modules if m.startswith("habana_frameworks") or m == "pyhlml"]:
        del sys.modules[name]  # what a test installed does not outlive it


def test_the_plugin_registers_a_contract_3_backend() -> None:
    host = PluginHost(strict=False)
    backend = host.backends["gaudi"]
    assert isinstance(backend, GaudiBackend) and backend.info.device_type == "hpu"
    record = next(r for r in host.records if r.name == "gaudi")
    assert (
        record.status == "active"
        and not record.warnings
        and record.contract == "3.0"
        and record.distribution == "accelbench-gaudi"
    )
    for name in (
        "after_backward",
        "after_optimizer_step",
        "compile_backend",
        "clip_grad_norm",
        "setup_device",
    ):
        assert name in record.overrides["gaudi"]


def test_no_device_here_is_reported_not_raised() -> None:
    backend = GaudiBackend()
    assert backend.detect() == [] and backend.detect_error is None


def test_detection_through_hlml_respects_visible_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install_hlml([FakeDevice(module_id=i, uuid=f"g{i}", name="HL-325L") for i in range(8)])
    monkeypatch.setenv(hlml.VISIBLE_ENV, "2,3")
    devices = GaudiBackend().detect()
    assert [d.details["module_id"] for d in devices] == ["2", "3"] and [d.index for d in devices] == [0, 1]
    assert devices[0].name == "HL-325L" and devices[0].memory_bytes == 128 * 10**9
    assert fake.initialised


def test_detection_falls_back_to_hl_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tool = tmp_path / "hl-smi"
    tool.write_text(
        "#!/bin/sh\n"
        'echo "0, 0, HL-225, 98304 MiB, 01P0-A, 0000:19:00.0, 1.22.0"\n'
        'echo "1, 1, HL-225, 98304 MiB, 01P0-B, 0000:1a:00.0, 1.22.0"\n'
    )
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(tmp_path))
    devices = GaudiBackend().detect()
    assert [d.name for d in devices] == ["HL-225", "HL-225"]
    assert devices[1].details["bus_id"] == "0000:1a:00.0" and devices[0].memory_bytes == 98304 * 2**20


def test_mode_is_set_before_the_bridge_loads_and_cannot_change_after() -> None:
    backend = GaudiBackend()
    with bridge_installed(lazy_env=None) as bridge:  # imported with no mode set: the real bridge's default
        pass
    os.environ.pop("PT_HPU_LAZY_MODE", None)
    assert modes.wanted_mode({"hpu_mode": "eager"}) == "eager" and modes.wanted_mode({}) == "lazy"
    modes.set_mode("eager")
    assert os.environ["PT_HPU_LAZY_MODE"] == "0"
    with bridge_installed(lazy_env=None) as bridge:  # the bridge reads what setup set
        assert not bridge.lazy
        device = backend.setup_device(World(), {"hpu_mode": "eager"})
        assert device.type == "hpu"
        with pytest.raises(BackendError, match="already imported in this process in the other mode"):
            backend.setup_device(World(), {"hpu_mode": "lazy"})
    with pytest.raises(BackendError, match="neither 1 .lazy. nor 0"):
        modes.wanted_mode({}, {"PT_HPU_LAZY_MODE": "yes"})


def test_a_local_rank_beyond_the_devices_is_refused() -> None:
    world = World(rank=3, local_rank=3, world_size=4, local_world_size=4)
    with (
        bridge_installed(devices=2),
        pytest.raises(BackendError, match="local rank 3 needs HPU 3 but this process sees 2"),
    ):
        GaudiBackend().setup_device(world, {})


def one_lazy_run(backend: Backend, grad_accum: int = 1, steps: int = 3) -> list[float]:
    """A real training run of the tiny GPT through the core's executor and this backend's step boundaries, the
    runner's way (``end_of_step`` after each step). The tensors are on the CPU: the stand-in enforces the rule."""
    from accelbench.plugins import get_host

    host = get_host()
    config = host.resolve(tiny_config(batch_size=8, grad_accum=grad_accum, epochs=1))
    job = host.workload(config.workload).build(config)
    request = ExecutorRequest(
        config=config, device=torch.device("cpu"), precision=standard_plan("fp32", "ieee-fp32"), world=World(),
        backend=backend, units=job.units, default_executor=executor_for,
    )  # fmt: skip
    executor = backend.executor(request)
    executor.setup(job)
    losses = []
    for _, (inputs, targets) in zip(range(steps), job.data.batches(0), strict=False):
        losses.append(float(executor.train_step(inputs, targets)))
        backend.end_of_step(request.device)
    return losses


class ForgetfulBackend(Backend):
    """A port of a CUDA loop to Gaudi that forgot mark_step: the stock step boundaries do nothing."""

    info = BackendInfo(name="forgetful", device_type="cpu", device_unit="test")


def test_lazy_mode_trains_through_the_step_boundaries() -> None:
    with bridge_installed(lazy_env="1") as bridge:
        backend = GaudiBackend()
        losses = one_lazy_run(backend, grad_accum=2)
        assert len(losses) == 3 and all(loss == loss for loss in losses)
        assert bridge.mark_steps == 3 * (2 + 1)  # per step: after each micro-batch's backward, after the step
        assert bridge.clips == 3  # clipping through FusedClipNorm, not torch's foreach path


def test_a_lazy_step_without_mark_step_fails_as_on_a_gaudi() -> None:
    with bridge_installed(lazy_env="1"), pytest.raises(LazyModeError, match="call htcore.mark_step"):
        one_lazy_run(ForgetfulBackend())


def test_eager_mode_needs_no_mark_step_and_compiles_with_hpu_backend() -> None:
    with bridge_installed(lazy_env="0") as bridge:
        backend = GaudiBackend()
        one_lazy_run(backend)
        assert bridge.mark_steps == 0
        assert backend.compile_backend() == "hpu_backend" and backend.compile_options("default") == {
            "dynamic": False
        }


def test_compile_is_refused_up_front_in_lazy_mode() -> None:
    backend = GaudiBackend()
    with pytest.raises(ConfigError, match="needs eager mode: add --hpu-mode eager"):
        backend.check_run(tiny_config(backend="gaudi", compile=True))
    backend.check_run(tiny_config(backend="gaudi", compile=True, backend_options={"hpu_mode": "eager"}))
    with pytest.raises(ConfigError, match="hpu_backend has no inductor modes"):
        backend.check_run(
            tiny_config(
                backend="gaudi",
                compile=True,
                compile_mode="max-autotune",
                backend_options={"hpu_mode": "eager"},
            )
        )


def test_hccl_has_no_float64_so_the_runner_reduces_in_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = GaudiBackend()
    assert backend.collective_backend(torch.device("hpu")) == "hccl"
    assert "float64" not in backend.collective_dtypes(torch.device("hpu"))
    import torch.distributed as dist

    seen = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(dist, "all_reduce", lambda tensor, op=None: seen.append(tensor.dtype))
    assert slowest_rank(1.5, torch.device("cpu"), backend) == 1.5
    assert seen == [torch.float32]


def test_strategies_and_precisions_by_generation() -> None:
    backend = GaudiBackend()
    assert backend.supported_strategies(torch.device("hpu")) == ["single", "ddp", "fsdp"]
    install_hlml([FakeDevice(name="HL-205")])
    assert "fp16-mixed" not in GaudiBackend().supported_precisions(torch.device("hpu"))
    install_hlml([FakeDevice(name="HL-225")])
    assert "fp16-mixed" in GaudiBackend().supported_precisions(torch.device("hpu"))


def test_epoch_readings_from_the_allocator_and_hlml() -> None:
    install_hlml([FakeDevice(name="HL-325L", uuid="gaudi-0")])
    with bridge_installed(lazy_env="1") as bridge:
        backend = GaudiBackend()
        device = torch.device("hpu", 0)
        bridge.allocated = 2**30
        backend.epoch_start(device)
        bridge.peak = 3 * 2**30
        readings = backend.epoch_end(device)
    assert readings.memory.peak_bytes == 3 * 2**30 and readings.memory.total_bytes == 94 * 2**30
    assert readings.memory.device_used_bytes == 2 * 2**30
    assert readings.energy is not None and readings.energy.joules == pytest.approx(5.0)  # one 5000 mJ step
    assert readings.energy.domain == "hlml:gaudi-0"
    assert readings.telemetry["temperature_c"] == 41.0 and readings.telemetry["utilization_pct"] == 87.0


def test_peaks_are_dense_per_generation_and_unknown_never_borrowed() -> None:
    bf16 = standard_plan("bf16-mixed", "ieee-fp32")
    fp32 = standard_plan("fp32", "ieee-fp32")
    assert peaks.peak_for("HL-325L", bf16).flops_per_s == 1835e12
    assert peaks.peak_for("HL-225", bf16).flops_per_s == 432e12
    assert peaks.peak_for("HL-225", fp32) is None  # not stated by the sources: unknown, not guessed
    assert peaks.peak_for("HL-205", bf16) is None and peaks.peak_for("Gaudi 9", bf16) is None
    labels = {d.details["label"] for d in GaudiBackend().known_devices()}
    assert "Gaudi 3 (HL-325L OAM)" in labels
    assert all(isinstance(d, DeviceInfo) for d in GaudiBackend().known_devices())


def test_fp8_peaks_by_math_are_dense_versioned_and_never_borrowed() -> None:
    assert peaks.peaks_by_math("HL-325L") == {"bf16": 1835e12, "fp8": 1835e12}
    assert peaks.peaks_by_math("HL-225") == {"bf16": 432e12, "fp8": 865e12}  # FP8 at twice BF16 on Gaudi 2
    assert peaks.peaks_by_math("HL-205") == {} and peaks.peaks_by_math("Gaudi 9") == {}  # unknown: nothing
    assert all("fp4" not in peaks.peaks_by_math(g.match[0]) for g in peaks.GENERATIONS)  # no FP4 math
    peak = peaks.peak_for("HL-325L", standard_plan("bf16-mixed", "ieee-fp32"))
    assert peak is not None and peak.table_version == peaks.TABLE_VERSION
    # no FP8 precision runs on this plugin: an FP8 plan gets no (bf16) figure
    assert peaks.peak_for("HL-325L", standard_plan("fp8-tensorwise", "ieee-fp32")) is None
