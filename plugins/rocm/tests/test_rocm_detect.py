"""Detection: the real "no device" path here; amdsmi, probe and wrong-build paths against stand-ins."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from accelbench_rocm import detect, probe, smi
from rocm_standins import install_amdsmi, install_gpus, mi250x_gcds, mi300x, remove_amdsmi

from accelbench.errors import BackendError
from accelbench.plugins import PluginHost


def test_this_machine_has_no_rocm_device_and_detection_says_so_cleanly() -> None:
    backend = PluginHost(strict=True).backends["rocm"]
    assert backend.detect() == [] and backend.detect_error is None
    assert not torch.cuda.is_initialized()


def test_an_mi250x_is_two_devices_each_one_gcd(monkeypatch: pytest.MonkeyPatch) -> None:
    install_gpus(monkeypatch, mi250x_gcds())
    devices = detect.detect_devices()
    assert [d.index for d in devices] == [0, 1]
    gcd = devices[1]
    assert (gcd.arch, gcd.memory_bytes) == ("gfx90a", 64 * 2**30)
    assert gcd.details["compute_units"] == "110" and gcd.details["bdf"] == "0000:c6:00.0"
    assert gcd.details["device_unit"] == "GCD (half an MI250X)"


def test_visible_device_variables_select_and_reorder(monkeypatch: pytest.MonkeyPatch) -> None:
    install_gpus(monkeypatch, [*mi250x_gcds(), mi300x()])
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "2,0")
    assert [d.details["bdf"] for d in detect.detect_devices()] == ["0000:05:00.0", "0000:c1:00.0"]


def test_amd_gpus_with_a_non_rocm_torch_say_why(monkeypatch: pytest.MonkeyPatch) -> None:
    install_amdsmi(monkeypatch, [mi300x()])
    assert torch.version.hip is None
    with pytest.raises(BackendError, match=r"amdsmi sees 1 AMD GPU\(s\) but torch .* CPU-only build"):
        detect.detect_devices()


def test_without_amdsmi_the_probe_answers_when_the_driver_is_there(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    remove_amdsmi(monkeypatch)
    monkeypatch.setattr(torch.version, "hip", "6.4.43482")
    kfd = tmp_path / "kfd"
    monkeypatch.setattr(detect, "KFD", kfd)
    monkeypatch.setattr(detect.sys, "platform", "linux")
    monkeypatch.setattr(probe, "run_probe", lambda: [{"name": "", "gcnArchName": "gfx942:sramecc+:xnack-",
                                                       "total_memory": 192 * 2**30, "multi_processor_count": 304}])  # fmt: skip
    assert detect.detect_devices() == []  # no /dev/kfd: no driver, no probe
    kfd.touch()
    (device,) = detect.detect_devices()
    assert (device.name, device.arch, device.details["compute_units"]) == ("", "gfx942", "304")
    assert device.details["device_unit"] == "GPU (MI300X in SPX mode)"  # an empty name: known by arch and CUs


def test_a_missing_libamd_smi_is_no_device_and_prints_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys
) -> None:  # type: ignore[no-untyped-def]
    # the real package prints to stdout and then fails with KeyError when libamd_smi.so is missing
    package = tmp_path / "amdsmi"
    package.mkdir()
    (package / "__init__.py").write_text(
        "print('Could not load libamd_smi.so')\nprint('Unable to find libamd_smi.so library')\n_libraries = {}\n"
        "_libraries['libamd_smi.so'].amdsmi_init\n"
    )
    monkeypatch.delitem(sys.modules, "amdsmi", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(smi, "_session", None)
    assert smi.session() is None
    assert capsys.readouterr().out == ""
    assert detect.detect_devices() == []


def test_amdsmi_without_the_driver_is_no_device(monkeypatch: pytest.MonkeyPatch) -> None:
    install_amdsmi(monkeypatch, [], driver=False)
    monkeypatch.setattr(torch.version, "hip", "6.4.43482")
    monkeypatch.setattr(detect, "KFD", Path("/nonexistent/kfd"))
    assert smi.session() is None and detect.detect_devices() == []


def test_an_unreadable_gpu_is_an_error_not_no_device(monkeypatch: pytest.MonkeyPatch) -> None:
    fake, _ = install_gpus(monkeypatch, [mi300x()])

    def broken(handle):  # type: ignore[no-untyped-def]
        raise fake.module.AmdSmiLibraryException(8)  # AMDSMI_STATUS_BUSY

    fake.module.amdsmi_get_gpu_asic_info = broken
    with pytest.raises(BackendError, match="amdsmi failed while listing GPUs"):
        detect.detect_devices()


def test_the_real_probe_finds_no_gpu_here_and_a_hung_one_is_stopped() -> None:
    assert probe.run_probe() == []
    with pytest.raises(BackendError, match="no answer within 1 s"):
        probe.run_probe("import time; time.sleep(30)", timeout=1)
