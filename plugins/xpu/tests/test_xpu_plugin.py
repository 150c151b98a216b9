"""The XPU hooks through the plugin host, against a stand-in torch.xpu and stand-in legacy packages."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import torch
from accelbench_xpu import detect, probe
from accelbench_xpu.peaks import peak_for
from xpu_standins import GIB, FakeXpuDevice, install_legacy_packages, install_xpus

from accelbench.contract import Backend, DeviceInfo, World, standard_plan
from accelbench.errors import BackendError, ConfigError
from accelbench.plugins import PluginHost


def xpu() -> Backend:
    return PluginHost().backends["xpu"]


def test_this_machine_has_no_intel_gpu_and_detection_says_so_cleanly() -> None:
    backend = PluginHost(strict=True).backends["xpu"]
    assert backend.detect() == [] and backend.detect_error is None
    assert not torch.xpu.is_initialized()


def test_the_real_probe_answers_for_this_torch() -> None:
    assert probe.run_probe("torch.xpu") == []  # torch.xpu.device_count() is 0 on the CPU build
    with pytest.raises(BackendError, match="no answer within 1 s"):
        probe.run_probe("torch.xpu", script="import time; time.sleep(30)", timeout=1)


def test_no_gpu_render_node_means_no_probe(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    install_xpus(monkeypatch, [FakeXpuDevice()])
    monkeypatch.undo()  # keep nothing but the real gpu_node_present, pointed at an empty /dev/dri
    monkeypatch.setattr(torch._C, "_has_xpu", True, raising=False)
    monkeypatch.setattr(detect, "DRI", tmp_path)
    monkeypatch.setattr(detect.sys, "platform", "linux")
    monkeypatch.setattr(probe, "run_probe", lambda path: pytest.fail("probed without a GPU"))
    assert detect.detect_devices() == []
    (tmp_path / "renderD128").touch()
    assert detect.gpu_node_present()


def test_a_max_1550_in_flat_mode_is_two_tiles_each_with_half_the_peak(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    install_xpus(monkeypatch, [FakeXpuDevice(), FakeXpuDevice()])
    devices = xpu().detect()
    assert [d.details["device_unit"] for d in devices] == ["tile (one stack of a Max 1550)"] * 2
    assert devices[0].details["path"].startswith("modern: device stock torch.xpu, collective xccl")
    assert devices[0].details["ze_flat_device_hierarchy"].startswith("unset")
    peak = xpu().peak_figures(devices[0], standard_plan("bf16-mixed", "ieee-fp32"))
    assert (peak.flops_per_s, peak.memory_bandwidth_bytes_per_s) == (419.5e12, 1.64e12)


def test_in_composite_mode_a_card_is_one_device_with_the_whole_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    install_xpus(monkeypatch, [FakeXpuDevice(total_memory=128 * GIB)])
    monkeypatch.setenv("ZE_FLAT_DEVICE_HIERARCHY", "COMPOSITE")
    (card,) = xpu().detect()
    assert card.details["device_unit"] == "card (both stacks of a Max 1550)"
    assert card.details["ze_flat_device_hierarchy"] == "COMPOSITE"
    assert xpu().peak_figures(card, standard_plan("fp32", "ieee-fp32")).flops_per_s == 52e12


def test_unknown_devices_and_math_get_no_peak() -> None:
    arc = DeviceInfo(index=0, name="Intel(R) Arc(TM) A770 Graphics", details={"device_unit": "card"})
    assert peak_for(arc, standard_plan("bf16-mixed", "ieee-fp32")) is None
    tile = DeviceInfo(
        index=0, name="Intel(R) Data Center GPU Max 1550", details={"device_unit": "tile (one stack)"}
    )
    assert peak_for(tile, standard_plan("fp32", "tf32")) is None


def test_setup_pins_the_local_rank_with_the_affinity_mask_and_records_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = install_xpus(monkeypatch, [FakeXpuDevice()])  # after pinning this process sees one device
    backend = xpu()
    assert backend.setup_device(World(local_rank=1), {}) == torch.device("xpu", 0)
    assert os.environ["ZE_AFFINITY_MASK"] == "1" and fake.current == 0
    versions = backend.runtime_versions()
    assert versions["device_pinning"] == "ZE_AFFINITY_MASK=1 set by accelbench-xpu for local rank 1"
    assert versions["ZE_AFFINITY_MASK"] == "1" and versions["gpu_driver"] == "1.6.31294+21"
    assert versions["xpu_path"].startswith("modern")


def test_a_launcher_mask_wider_than_the_visible_devices_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    install_xpus(monkeypatch, [FakeXpuDevice(), FakeXpuDevice()])
    monkeypatch.setenv("ZE_AFFINITY_MASK", "0,1,2,3")
    with pytest.raises(BackendError, match="needs XPU device 3 but this process sees 2"):
        xpu().setup_device(World(local_rank=3), {})


def test_binding_without_an_xpu_torch_says_what_to_install() -> None:
    with pytest.raises(BackendError, match="cannot drive Intel GPUs: install an XPU build of torch"):
        xpu().setup_device(World(local_rank=0), {})


def test_the_legacy_path_imports_ipex_and_the_oneccl_bindings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    install_xpus(monkeypatch, [FakeXpuDevice()], xccl=False)
    install_legacy_packages(monkeypatch, tmp_path)
    monkeypatch.setenv("ACCELBENCH_XPU_PATH", "legacy")
    backend = xpu()
    backend.setup_device(World(local_rank=0), {})
    assert sys.modules["intel_extension_for_pytorch"].IMPORTED
    assert backend.collective_backend(torch.device("xpu")) == "ccl"
    assert sys.modules["oneccl_bindings_for_pytorch"].IMPORTED
    assert backend.runtime_versions()["xpu_path"] == (
        "legacy: device Intel Extension for PyTorch, collective ccl (oneCCL bindings)"
    )


def test_the_modern_collective_is_xccl_and_without_any_the_core_default_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    install_xpus(monkeypatch, [FakeXpuDevice()])
    assert xpu().collective_backend(torch.device("xpu")) == "xccl"
    install_xpus(monkeypatch, [FakeXpuDevice()], xccl=False)
    assert (
        xpu().collective_backend(torch.device("xpu")) == "xccl"
    )  # torch's default map; init fails later, loudly


def test_precisions_follow_native_bf16_support(monkeypatch: pytest.MonkeyPatch) -> None:
    install_xpus(
        monkeypatch,
        [FakeXpuDevice(), FakeXpuDevice(name="Intel(R) Arc(TM) A380", has_bfloat16_conversions=False)],
    )
    monkeypatch.setenv("ZE_AFFINITY_MASK", "0,1")
    backend = xpu()
    assert backend.supported_precisions(torch.device("xpu")) == [
        "fp32",
        "fp16-mixed",
    ]  # preflight: every device
    assert not torch.xpu.is_initialized()
    assert backend.supported_precisions(backend.setup_device(World(local_rank=0), {})) == [
        "fp32",
        "fp16-mixed",
        "bf16-mixed",
        "bf16-true",
    ]
    with pytest.raises(ConfigError, match="does not support precision 'bf16-true'"):
        backend.check_precision("bf16-true", backend.setup_device(World(local_rank=1), {}))


def test_fp32_is_ieee_explicitly_and_tf32_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    install_xpus(monkeypatch, [FakeXpuDevice()])
    backend = xpu()
    device = backend.setup_device(World(local_rank=0), {})
    previous = torch.backends.mkldnn.matmul.fp32_precision
    try:
        torch.backends.mkldnn.matmul.fp32_precision = "bf16"
        plan = backend.precision_plan("fp32", device, {})
        assert plan.matmul_math == "ieee-fp32" and torch.backends.mkldnn.matmul.fp32_precision == "ieee"
        monkeypatch.setenv("ACCELBENCH_TF32", "on")
        with pytest.raises(ConfigError, match="IEEE fp32 only"):
            backend.precision_plan("fp32", device, {})
    finally:
        torch.backends.mkldnn.matmul.fp32_precision = previous


def test_memory_telemetry_and_synchronisation_go_through_torch_xpu(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install_xpus(monkeypatch, [FakeXpuDevice()])
    backend = xpu()
    device = backend.setup_device(World(local_rank=0), {})
    backend.synchronize(device)
    assert fake.synchronized == 1
    epoch = backend.epoch_end(device)
    stats = epoch.memory
    assert (stats.peak_bytes, stats.device_used_bytes, stats.total_bytes) == (42 * 2**20, 3 * GIB, 64 * GIB)
    assert epoch.telemetry == {"temperature_c": 38.0}
    fake.devices[0].sysman = False  # no pyzes: unknown, not zero
    epoch = backend.epoch_end(device)
    assert epoch.memory.device_used_bytes is None and epoch.telemetry == {}


def test_with_intel_gpus_xpu_is_chosen_and_an_explicit_backend_still_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    install_xpus(monkeypatch, [FakeXpuDevice()])
    host = PluginHost()
    assert host.select_backend(None).name == "xpu"
    assert host.select_backend("cpu").name == "cpu"


def test_power_and_utilisation_are_sampled_through_the_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install_xpus(monkeypatch, [FakeXpuDevice(power_w=420.0, utilization_pct=96.0)])
    backend = xpu()
    device = backend.setup_device(World(local_rank=0), {})
    backend.epoch_start(device)  # the runner: an epoch starts, the sampler with it
    time.sleep(0.1)  # the epoch
    fake.devices[0].power_w = 380.0  # the draw changes during the epoch: the mean follows
    time.sleep(0.1)
    readings = backend.epoch_end(device).telemetry
    assert 380.0 < readings["power_w"] < 420.0
    assert readings["utilization_pct"] == 96.0 and readings["temperature_c"] == 38.0
    assert readings["telemetry_samples"] >= 2
    assert backend.epoch_end(device).telemetry == {"temperature_c": 38.0}, "the sampler stops with the epoch"


def test_readings_the_gpu_refuses_are_left_out_not_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    install_xpus(monkeypatch, [FakeXpuDevice(power_permitted=False)])
    backend = xpu()
    device = backend.setup_device(World(local_rank=0), {})
    backend.epoch_start(device)
    time.sleep(0.05)
    readings = backend.epoch_end(device).telemetry
    assert "power_w" not in readings and readings["utilization_pct"] == 97.0


def intel_card(root: Path, name: str, energy_uj: int | None, vendor: str = "0x8086") -> Path:
    """A DRM card as the i915/xe driver shows it in sysfs, with a hwmon energy counter (microjoules)."""
    device = root / name / "device"
    (device / "hwmon" / "hwmon3").mkdir(parents=True)
    (device / "vendor").write_text(vendor + "\n")
    counter = device / "hwmon" / "hwmon3" / "energy1_input"
    if energy_uj is not None:
        counter.write_text(f"{energy_uj}\n")
    return counter


def test_energy_from_the_cards_hwmon_counter_when_the_card_is_known(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from accelbench_xpu.plugin import XpuBackend

    install_xpus(monkeypatch, [FakeXpuDevice()])
    counter = intel_card(tmp_path, "card1", 5_000_000)
    intel_card(tmp_path, "card0", 7, vendor="0x1234")  # another vendor's card does not count
    (tmp_path / "card1-DP-1").mkdir()  # a connector, not a card
    plugin = XpuBackend(drm=tmp_path)
    device = torch.device("xpu", 0)
    plugin.epoch_start(device)
    counter.write_text("65000000\n")  # 60 J later
    energy = plugin.epoch_end(device).energy
    assert energy is not None and energy.joules == 60.0 and energy.domain == "hwmon:card1"
    assert plugin.epoch_end(device).energy is None, "a reading belongs to one epoch"
    # two Intel cards: which one this rank runs on is not known here, so the energy is unknown, not guessed
    intel_card(tmp_path, "card2", 1)
    plugin.epoch_start(device)
    assert plugin.epoch_end(device).energy is None


def test_the_max_series_has_no_fp8_and_unknown_devices_get_no_peaks_by_math() -> None:
    from accelbench_xpu.peaks import MAX_1550_CARD, TABLE_VERSION, peaks_by_math

    tile = DeviceInfo(
        index=0, name="Intel(R) Data Center GPU Max 1550", details={"device_unit": "tile (one stack)"}
    )
    assert MAX_1550_CARD["fp8"] is None and MAX_1550_CARD["fp4"] is None  # recorded as absent, not guessed
    assert peaks_by_math(tile) == {"bf16": 419.5e12, "fp16": 419.5e12, "fp32": 26e12}  # half a card's, dense
    arc = DeviceInfo(index=0, name="Intel(R) Arc(TM) A770 Graphics", details={"device_unit": "card"})
    assert peaks_by_math(arc) == {}
    assert peak_for(tile, standard_plan("bf16-mixed", "ieee-fp32")).table_version == TABLE_VERSION
    assert (
        peak_for(tile, standard_plan("fp8-tensorwise", "ieee-fp32")) is None
    )  # no FP8 math: no bf16 stand-in
