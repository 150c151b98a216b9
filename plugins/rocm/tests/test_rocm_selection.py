"""With vendor plugins side by side, detection picks the backend whose hardware is present; --backend wins."""

from __future__ import annotations

import importlib.util

import pytest
from rocm_standins import install_gpus, mi300x

from accelbench.plugins import PluginHost


def test_with_amd_gpus_rocm_is_chosen_and_an_explicit_backend_still_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    install_gpus(monkeypatch, [mi300x()])
    host = PluginHost()
    assert host.select_backend(None).name == "rocm"
    assert host.select_backend("cpu").name == "cpu"


@pytest.mark.skipif(
    importlib.util.find_spec("accelbench_cuda") is None, reason="accelbench-cuda not installed"
)
def test_the_cuda_plugin_beside_it_sees_no_nvidia_gpu_on_a_rocm_torch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    install_gpus(monkeypatch, [mi300x()])
    cuda = PluginHost().backends["cuda"]
    assert cuda.detect() == [] and cuda.detect_error is None
