"""Binding, RCCL, memory and per-epoch energy through the plugin host, against stand-in AMD GPUs."""

from __future__ import annotations

import types

import pytest
import torch
import torch.distributed as dist
from accelbench_rocm import smi
from rocm_standins import install_gpus, mi250x_gcds, mi300x, remove_amdsmi

from accelbench.contract import Backend, World
from accelbench.errors import BackendError
from accelbench.plugins import PluginHost


def rocm() -> Backend:
    return PluginHost().backends["rocm"]


def test_the_backend_trains_on_torchs_cuda_device_type() -> None:
    assert rocm().info.device_type == "cuda"
    assert "GCD" in rocm().info.device_unit


def test_each_local_rank_binds_one_gcd_and_too_many_ranks_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, hip = install_gpus(monkeypatch, mi250x_gcds())
    assert rocm().setup_device(World(local_rank=1), {}) == torch.device("cuda", 1) and hip.current == 1
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "0,1")
    with pytest.raises(
        BackendError, match=r"local rank 2 .* sees 2 \(HIP_VISIBLE_DEVICES='0,1'\).*an MI250X counts as two"
    ):
        rocm().setup_device(World(local_rank=2), {})


def test_binding_without_a_rocm_torch_says_so() -> None:
    with pytest.raises(BackendError, match="no ROCm GPU is available in this process"):
        rocm().setup_device(World(local_rank=0), {})


def test_the_collective_backend_is_rccl_under_nccls_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    assert rocm().collective_backend(torch.device("cuda")) == "nccl"


def test_memory_and_energy_belong_to_the_bound_gcd(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = [mi300x("0000:05:00.0"), mi300x("0000:15:00.0")]
    gpus[1].memory_used = 9 * 2**30
    install_gpus(monkeypatch, gpus)
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "1")  # HIP's device 0 is the second GPU
    clock = types.SimpleNamespace(now=50.0)
    monkeypatch.setattr(smi, "time", types.SimpleNamespace(monotonic=lambda: clock.now))
    backend = rocm()
    device = backend.setup_device(World(local_rank=0), {})
    backend.epoch_start(device)
    clock.now += 4.0
    gpus[1].energy_accumulator += 131_070_000  # x 15.259 uJ = 2000 J
    gpus[1].temperature_c = 80
    epoch = backend.epoch_end(device)
    readings = epoch.telemetry
    assert epoch.energy is not None and epoch.energy.joules == pytest.approx(2000.0, rel=1e-3)
    assert epoch.energy.domain == "amdsmi:0000:15:00.0"  # the bound GCD's counter, by its PCI address
    assert readings["power_w"] == pytest.approx(500.0, rel=1e-3)
    assert readings["temperature_c"] == 80.0
    stats = epoch.memory
    assert stats.device_used_bytes == 9 * 2**30 and stats.total_bytes == 192 * 2**30
    assert "HIP caching allocator" in stats.source


def test_a_gcd_without_a_power_sensor_reports_no_energy(monkeypatch: pytest.MonkeyPatch) -> None:
    install_gpus(monkeypatch, mi250x_gcds())
    backend = rocm()
    device = backend.setup_device(
        World(local_rank=1), {}
    )  # the second GCD: amdsmi reports the package's power on the first
    backend.epoch_start(device)
    epoch = backend.epoch_end(device)
    assert set(epoch.telemetry) == {"temperature_c"} and epoch.energy is None


def test_without_amdsmi_device_figures_are_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    install_gpus(monkeypatch, [mi300x()])
    remove_amdsmi(monkeypatch)
    backend = rocm()
    device = backend.setup_device(World(local_rank=0), {})
    backend.epoch_start(device)
    epoch = backend.epoch_end(device)
    assert epoch.memory.device_used_bytes is None
    assert epoch.telemetry == {} and epoch.energy is None


def test_runtime_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    install_gpus(monkeypatch, [mi300x()])
    versions = rocm().runtime_versions()
    assert versions["hip"] == "6.4.43482" and versions["amdgpu_driver"] == "6.10.5"
    assert versions["amdsmi_lib"] == "25.5.1"
