"""Device binding, NCCL, memory and per-epoch telemetry through the plugin host, against stand-in GPUs."""

from __future__ import annotations

import types

import pytest
import torch
import torch.distributed as dist
from accelbench_cuda import nvml
from cuda_standins import a100, install_gpus, remove_pynvml, v100

from accelbench.contract import Backend, World
from accelbench.errors import BackendError
from accelbench.plugins import PluginHost


class Clock:
    """Stands in for the ``time`` module NVML windows read: epochs last exactly as long as a test says."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1.7e9 + self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(nvml, "time", types.SimpleNamespace(monotonic=fake.monotonic, time=fake.time))
    return fake


def cuda_backend() -> Backend:
    return PluginHost().backends["cuda"]


def test_each_local_rank_binds_its_own_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    _, cuda = install_gpus(monkeypatch, [a100(0), a100(1)])
    assert cuda_backend().setup_device(World(local_rank=1), {}) == torch.device("cuda", 1)
    assert cuda.current == 1


def test_more_ranks_than_visible_gpus_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    install_gpus(monkeypatch, [a100(0), a100(1)])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(
        BackendError, match=r"local rank 2 needs GPU 2 but this process sees 2 \(CUDA_VISIBLE_DEVICES='0,1'\)"
    ):
        cuda_backend().setup_device(World(local_rank=2), {})


def test_binding_without_cuda_says_so() -> None:
    with pytest.raises(BackendError, match="CUDA is not available in this process"):
        cuda_backend().setup_device(World(), {})


def test_the_collective_backend_is_nccl_or_what_really_runs_without_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = cuda_backend()
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    assert backend.collective_backend(torch.device("cuda")) == "nccl"
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)  # Windows builds: gloo carries CUDA tensors
    assert backend.collective_backend(torch.device("cuda")) == "gloo"


def test_memory_is_the_allocator_peak_plus_nvml_device_use(monkeypatch: pytest.MonkeyPatch) -> None:
    _, cuda = install_gpus(monkeypatch, [a100(0), a100(1, memory_used=5 * 2**30)])
    backend = cuda_backend()
    device = backend.setup_device(World(local_rank=1), {})
    backend.epoch_start(device)
    stats = backend.epoch_end(device).memory
    assert cuda.resets == 1
    assert (stats.peak_bytes, stats.peak_reserved_bytes) == (cuda.peak_allocated, cuda.peak_reserved)
    assert stats.device_used_bytes == 5 * 2**30  # GPU 1's, found by UUID, not GPU 0's
    assert stats.total_bytes == 80 * 2**30
    assert "max_memory_allocated" in stats.source


def test_without_nvml_device_level_memory_is_unknown_not_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    install_gpus(monkeypatch, [a100(0)])
    remove_pynvml(monkeypatch)
    backend = cuda_backend()
    device = backend.setup_device(World(local_rank=0), {})
    stats = backend.epoch_end(device).memory
    assert stats.device_used_bytes is None and stats.peak_bytes is not None
    backend.epoch_start(device)
    readings = backend.epoch_end(device)
    assert readings.telemetry == {} and readings.energy is None


def test_telemetry_averages_over_the_epoch_from_counters(
    monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    nvml_fake, _ = install_gpus(monkeypatch, [a100(0)])
    gpu = nvml_fake.gpus[0]
    backend = cuda_backend()
    device = backend.setup_device(World(local_rank=0), {})
    start_us = int(clock.time() * 1e6)
    gpu.utilization_samples.append((start_us - 500_000, 0))  # before the epoch: must not count
    backend.epoch_start(device)  # the runner: an epoch starts
    clock.now += 10.0  # a 10 s epoch
    gpu.energy_mj += 3_000_000  # 3 kJ
    gpu.pcie_tx += 4_000_000_000
    gpu.pcie_rx += 1_000_000_000
    gpu.utilization_samples += [(start_us + 1_000_000, 90), (start_us + 5_000_000, 100)]
    gpu.temperature_c, gpu.clock_sm_mhz = 71, 1275
    readings = backend.epoch_end(device)
    assert readings.energy is not None and readings.energy.joules == 3000.0
    assert readings.energy.domain == f"nvml:{gpu.uuid}" and "NVML" in readings.energy.source
    assert readings.telemetry == {
        "power_w": 300.0,  # the epoch's mean, from the energy counter
        "pcie_tx_bytes_per_s": 4e8,
        "pcie_rx_bytes_per_s": 1e8,
        "utilization_pct": 95.0,
        "temperature_c": 71.0,
        "clock_sm_mhz": 1275.0,
    }
    again = backend.epoch_end(device)
    assert again.telemetry == {} and again.energy is None, (
        "a window is used once: no reading without a new start"
    )


def test_counters_a_gpu_lacks_are_left_out_not_reported_as_zero(
    monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    nvml_fake, _ = install_gpus(monkeypatch, [v100(0, energy_mj=None)])  # no PCIe counters, no energy counter
    backend = cuda_backend()
    device = backend.setup_device(World(local_rank=0), {})
    backend.epoch_start(device)
    clock.now += 5.0
    readings = backend.epoch_end(device)
    assert readings.energy is None  # no counter: no energy, never a made-up one
    assert set(readings.telemetry) == {
        "temperature_c",
        "clock_sm_mhz",
    }  # no samples either: no utilisation


def test_a_wrapped_counter_gives_no_rate(monkeypatch: pytest.MonkeyPatch, clock: Clock) -> None:
    nvml_fake, _ = install_gpus(monkeypatch, [a100(0, pcie_tx=2**64 - 10)])
    backend = cuda_backend()
    device = backend.setup_device(World(local_rank=0), {})
    backend.epoch_start(device)
    clock.now += 1.0
    nvml_fake.gpus[0].pcie_tx = 5  # NVML: "value can wrap"
    readings = backend.epoch_end(device).telemetry
    assert "pcie_tx_bytes_per_s" not in readings and "pcie_rx_bytes_per_s" in readings


def test_runtime_versions_name_driver_and_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    install_gpus(monkeypatch, [a100(0)])
    versions = cuda_backend().runtime_versions()
    assert versions["nvidia_driver"] == "570.124.06"
    assert versions["cuda_driver_api"] == "12.8" and versions["cuda_runtime"] == "12.8"
    assert versions["accelbench_cuda"] == "0.1.0"


def test_runtime_versions_leave_cuda_uninitialised_in_the_parent(monkeypatch: pytest.MonkeyPatch) -> None:
    """`accelbench info` and the launcher's parent must not create a CUDA context: on an H200 with torch 2.11,
    asking torch for the cuDNN version did (the stand-in does the same); after device setup it is asked."""
    _, cuda = install_gpus(monkeypatch, [a100(0)])
    backend = cuda_backend()
    versions = backend.runtime_versions()
    assert cuda.initialised_by is None and not torch.cuda.is_initialized()
    assert "cudnn" not in versions
    backend.setup_device(
        World(local_rank=0), {}
    )  # a run: CUDA is up, so the runtime's own answer is recorded
    assert backend.runtime_versions()["cudnn"] == "91900"


def test_info_shows_the_gpu_its_memory_and_peak_row_without_starting_cuda(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What `accelbench info` printed on the H200: name, arch, memory in GiB, the table's H200 row, versions."""
    from cuda_standins import h200

    from accelbench import plugins
    from accelbench.cli import main

    _, cuda = install_gpus(monkeypatch, [h200(0)])
    monkeypatch.setattr(plugins, "_HOST", None)  # detect afresh, with the stand-ins
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "[0] NVIDIA H200 (sm_90, 140.4 GiB)" in out
    assert (
        "bf16: 989 TFLOP/s" in out and "memory 4.8 TB/s" in out and "accelbench-cuda table: H200 SXM" in out
    )
    assert "nvidia_driver 570.124.06" in out
    assert not torch.cuda.is_initialized() and cuda.initialised_by is None
