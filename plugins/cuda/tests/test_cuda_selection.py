"""With several backends installed, detection picks the one whose hardware is present; --backend always wins."""

from __future__ import annotations

import importlib.util

import pytest
from cuda_standins import a100, install_gpus

from accelbench.plugins import PluginHost


def test_without_a_gpu_the_cpu_backend_is_chosen() -> None:
    assert PluginHost().select_backend(None).name == "cpu"


def test_with_nvidia_gpus_cuda_is_chosen_and_an_explicit_backend_still_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    install_gpus(monkeypatch, [a100(0)])
    host = PluginHost()
    cuda = host.backends["cuda"]
    rivals = [b for b in host.backends.values() if b is not cuda and b.info.priority >= cuda.info.priority]
    assert host.select_backend(None).name == "cuda", f"other backends installed: {list(host.backends)}"
    assert host.select_backend("cpu").name == "cpu"
    for backend in rivals:  # e.g. rocm and xpu installed beside cuda: they see no hardware of theirs
        assert backend.detect() == [], backend.name


@pytest.mark.skipif(
    importlib.util.find_spec("accelbench_rocm") is None, reason="accelbench-rocm not installed"
)
def test_a_rocm_build_of_torch_makes_cuda_step_aside(monkeypatch: pytest.MonkeyPatch) -> None:
    install_gpus(monkeypatch, [a100(0)])
    monkeypatch.setattr("torch.version.cuda", None)
    monkeypatch.setattr("torch.version.hip", "6.4.0")
    backend = PluginHost().backends["cuda"]
    assert backend.detect() == [] and "ROCm build" in backend.detect_error
