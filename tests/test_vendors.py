"""The vendor plugins in plugins/, as the core knows them without their being installed (accelbench/vendors.py): a
device in a plugin's table names that plugin, and `plugins` lists the ones not loaded with their install line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from accelbench.vendors import IN_TREE, plugin_knowing


@pytest.mark.needs_plugin(
    "accelbench-cuda",
    "accelbench-rocm",
    "accelbench-xpu",
    "accelbench-gaudi",
    "accelbench-xla",
    "accelbench-ipu",
    why="the core's list of their devices is checked against their own catalogues",
)
def test_the_cores_list_of_each_plugins_devices_is_its_catalogues_short_names() -> None:
    from accelbench.estimate.catalog import known_devices
    from accelbench.plugins import get_host

    catalogued: dict[str, list[str]] = {}
    for known in known_devices(get_host()):
        catalogued.setdefault(known.backend.name, []).append(known.names[0])
    for plugin in IN_TREE:
        assert list(plugin.devices) == catalogued[plugin.backend], plugin.distribution


def test_a_device_name_finds_the_plugin_whose_table_holds_it() -> None:
    assert plugin_knowing("h100") is not None and plugin_knowing("h100").distribution == "accelbench-cuda"  # type: ignore[union-attr]
    assert plugin_knowing("MI300X").backend == "rocm"  # type: ignore[union-attr]
    assert plugin_knowing("max-1550").backend == "xpu"  # type: ignore[union-attr]
    assert plugin_knowing("no such chip") is None
    assert plugin_knowing("MI").backend == "rocm"  # type: ignore[union-attr]  # part of AMD's names only
    assert plugin_knowing("100") is None  # A100 and V100 (cuda), MI100 (rocm): not one plugin's


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ACCELBENCH_PLUGINS": "cpu"}  # as a machine with the core alone
    return subprocess.run([sys.executable, "-m", "accelbench", *args], capture_output=True, text=True, env=env,
                          timeout=120, check=False)  # fmt: skip


def test_without_its_plugin_a_named_device_says_which_plugin_to_install_and_plugins_lists_it() -> None:
    """The README's `estimate --device H100` after the quick start (the core alone): not "known devices: none", but
    the plugin that knows it and how to install it; `accelbench plugins` lists every vendor plugin not loaded."""
    refused = run("estimate", "--device", "H100", "--model", "gpt-nano")
    assert refused.returncode == 2
    err = " ".join(refused.stderr.split())
    assert "the accelbench-cuda plugin's table knows it (NVIDIA GPUs (CUDA))" in err
    assert "pip install ./plugins/cuda" in err
    listed = run("plugins")
    assert listed.returncode == 0
    out = " ".join(listed.stdout.split())
    for plugin in IN_TREE:
        assert f"{plugin.distribution} ({plugin.hardware}): {plugin.install}" in out
