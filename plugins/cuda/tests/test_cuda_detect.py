"""Detection: the real "no device" path on this machine, NVML and probe paths against stand-ins."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from accelbench_cuda import detect, probe
from cuda_standins import a100, install_gpus, install_nvml, remove_pynvml, v100

from accelbench.errors import BackendError
from accelbench.plugins import PluginHost

MIG = "MIG-5f3c1e2a-0000-0000-0000-000000000000"


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    """Whether the NVIDIA driver looks loaded: point the driver paths at a file that exists, or does not."""

    def set_present(present: bool) -> None:
        path = tmp_path / "nvidiactl"
        if present:
            path.touch()
        monkeypatch.setattr(detect, "DRIVER_PATHS", (path,))
        monkeypatch.setattr(detect.sys, "platform", "linux")

    return set_present


@pytest.fixture
def probe_answers(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Replace the probe subprocess by its answer (the probe itself is tested for real below)."""
    calls: list[int] = []

    def install(rows: list[dict]) -> list[int]:
        def run_probe() -> list[dict]:
            calls.append(1)
            return rows

        monkeypatch.setattr(probe, "run_probe", run_probe)
        return calls

    return install


def test_this_machine_has_no_cuda_device_and_detection_says_so_cleanly() -> None:
    backend = PluginHost(strict=True).backends["cuda"]
    assert backend.detect() == []
    assert backend.detect_error is None
    assert detect.detect_devices() == []
    assert os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] == "1"
    assert not torch.cuda.is_initialized()


def test_nvml_lists_the_visible_gpus_in_cuda_order(monkeypatch: pytest.MonkeyPatch) -> None:
    install_gpus(monkeypatch, [a100(0), a100(1), a100(2)])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    devices = detect.detect_devices()
    assert [d.index for d in devices] == [0, 1]
    first = devices[0]
    assert first.name == "NVIDIA A100-SXM4-80GB" and first.arch == "sm_80"
    assert first.memory_bytes == 80 * 2**30
    assert first.details["uuid"] == a100(2).uuid and first.details["nvml_index"] == "2"
    assert first.details["pci_bus_id"] == "00000000:12:00.0"  # NVML's bytes decoded
    assert first.details["compute_capability"] == "8.0" and first.details["detected_by"] == "NVML"
    assert devices[1].details["uuid"] == a100(0).uuid


def test_nvml_reads_the_links_comm_grades_against(monkeypatch: pytest.MonkeyPatch) -> None:
    """An SXM A100 with its 12 NVLinks 3 and a PCIe card without NVLink: the facts `comm` grades against."""
    install_gpus(
        monkeypatch, [a100(0, nvlinks=12, nvlink_version=3), a100(1, pcie_generation=5, pcie_width=8)]
    )
    sxm, card = detect.detect_devices()
    assert {k: sxm.details[k] for k in ("nvlink_links", "nvlink_version", "pcie_generation", "pcie_width")} == {
        "nvlink_links": "12", "nvlink_version": "3", "pcie_generation": "4", "pcie_width": "16",
    }  # fmt: skip
    assert "nvlink_links" not in card.details
    assert (card.details["pcie_generation"], card.details["pcie_width"]) == ("5", "8")
    install_gpus(monkeypatch, [a100(0, pcie_generation=None, pcie_width=None)])  # NOT_SUPPORTED: nothing said
    (bare,) = detect.detect_devices()
    assert not {"nvlink_links", "pcie_generation", "pcie_width"} & set(bare.details)


def test_visible_devices_hiding_every_gpu_means_no_device(monkeypatch: pytest.MonkeyPatch) -> None:
    install_gpus(monkeypatch, [a100(0), a100(1)])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert detect.detect_devices() == []


def test_without_nvml_library_or_driver_there_is_nothing_to_probe(
    driver, probe_answers, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    install_nvml(monkeypatch, [], library=False)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    driver(False)
    calls = probe_answers([{"name": "never asked"}])
    assert detect.detect_devices() == []
    assert calls == []  # no driver: no subprocess either


def test_without_pynvml_the_probe_subprocess_answers(
    driver, probe_answers, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    remove_pynvml(monkeypatch)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    driver(True)
    row = {"name": "NVIDIA H100 80GB HBM3", "major": 9, "minor": 0, "total_memory": 85 * 10**9,
           "multi_processor_count": 132, "uuid": "1c2b-..."}  # fmt: skip
    calls = probe_answers([row])
    (device,) = detect.detect_devices()
    assert calls == [1]
    assert (device.name, device.arch, device.memory_bytes) == ("NVIDIA H100 80GB HBM3", "sm_90", 85 * 10**9)
    assert device.details["multiprocessors"] == "132"
    assert "probe subprocess" in device.details["detected_by"]


def test_mig_instances_are_resolved_by_cuda_in_the_probe(driver, probe_answers, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    install_gpus(monkeypatch, [a100(0)])
    driver(True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", MIG)
    row = {"name": "NVIDIA A100-SXM4-80GB MIG 1g.10gb", "major": 8, "minor": 0, "total_memory": 10 * 2**30}
    calls = probe_answers([row])
    (device,) = detect.detect_devices()
    assert calls == [1] and device.name.endswith("MIG 1g.10gb")


def test_gpus_with_a_cpu_build_of_torch_say_why_instead_of_no_device(monkeypatch: pytest.MonkeyPatch) -> None:
    install_nvml(monkeypatch, [a100(0), a100(1)])
    assert torch.version.cuda is None  # this machine's torch is the CPU build
    with pytest.raises(BackendError, match=r"NVML sees 2 NVIDIA GPU\(s\) but torch .* CPU-only build"):
        detect.detect_devices()
    backend = PluginHost().backends["cuda"]
    assert backend.detect() == [] and "install a CUDA build of torch" in backend.detect_error


def test_an_nvml_failure_on_present_gpus_is_an_error_not_no_device(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml, _ = install_gpus(monkeypatch, [v100(0)])

    def gpu_is_lost(handle):  # type: ignore[no-untyped-def]
        raise nvml.module.NVMLError(15)  # NVML_ERROR_GPU_IS_LOST

    nvml.module.nvmlDeviceGetName = gpu_is_lost
    with pytest.raises(BackendError, match="NVML failed while listing GPUs"):
        detect.detect_devices()


# the probe subprocess, for real ----------------------------------------------------------------------------
def test_the_real_probe_finds_no_gpu_with_this_torch() -> None:
    assert probe.run_probe() == []


def test_a_hung_probe_is_stopped_and_named() -> None:
    with pytest.raises(BackendError, match=r"no answer within 1 s: a GPU or its driver may be hung"):
        probe.run_probe("import time; time.sleep(30)", timeout=1)


def test_a_failing_probe_reports_its_last_error_line() -> None:
    with pytest.raises(BackendError, match=r"exit status 1\): RuntimeError: No CUDA GPUs are available"):
        probe.run_probe("raise RuntimeError('No CUDA GPUs are available')")
    with pytest.raises(BackendError, match="printed no device list"):
        probe.run_probe("print('hello')")
