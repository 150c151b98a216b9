"""The software path (modern stock torch.xpu + xccl, legacy IPEX + ccl), card vs tile, and ZE_AFFINITY_MASK."""

from __future__ import annotations

import pytest
from accelbench_xpu.level_zero import device_unit, hierarchy, pin_local_rank
from accelbench_xpu.paths import XpuPath, resolve

from accelbench.errors import BackendError, ConfigError

GIB = 2**30


def installed(*names: str):  # type: ignore[no-untyped-def]
    return lambda module: object() if module in names else None


def test_stock_torch_xpu_with_xccl_is_the_modern_path() -> None:
    path = resolve({}, torch_has_xpu=True, xccl_available=True, installed=installed())
    assert path == XpuPath("torch.xpu", "xccl") and not path.legacy
    assert path.describe() == "modern: device stock torch.xpu, collective xccl (stock torch.distributed)"


def test_torch_before_xccl_uses_the_oneccl_bindings_when_installed() -> None:
    path = resolve(
        {}, torch_has_xpu=True, xccl_available=False, installed=installed("oneccl_bindings_for_pytorch")
    )
    assert path == XpuPath("torch.xpu", "ccl") and path.legacy


def test_a_torch_without_xpu_takes_the_ipex_path_when_installed() -> None:
    both = installed("intel_extension_for_pytorch", "oneccl_bindings_for_pytorch")
    assert resolve({}, torch_has_xpu=False, xccl_available=False, installed=both) == XpuPath("ipex", "ccl")
    assert resolve({}, torch_has_xpu=False, xccl_available=False, installed=installed()) == XpuPath(
        None, None
    )


def test_the_legacy_path_can_be_forced_and_misuse_is_explained() -> None:
    both = installed("intel_extension_for_pytorch", "oneccl_bindings_for_pytorch")
    forced = resolve(
        {"ACCELBENCH_XPU_PATH": "legacy"}, torch_has_xpu=True, xccl_available=True, installed=both
    )
    assert forced == XpuPath("ipex", "ccl")
    with pytest.raises(ConfigError, match="intel_extension_for_pytorch is not installed"):
        resolve(
            {"ACCELBENCH_XPU_PATH": "legacy"}, torch_has_xpu=True, xccl_available=True, installed=installed()
        )
    with pytest.raises(ConfigError, match="use 'modern' .* or 'legacy'"):
        resolve({"ACCELBENCH_XPU_PATH": "old"}, torch_has_xpu=True, xccl_available=True, installed=both)
    with pytest.raises(ConfigError, match="built without XPU support"):
        resolve({"ACCELBENCH_XPU_PATH": "modern"}, torch_has_xpu=False, xccl_available=False, installed=both)


def test_this_machine_has_neither_path() -> None:
    assert resolve({}) == XpuPath(None, None)


def test_a_max_1550_tile_is_told_from_a_card_by_its_memory() -> None:
    assert device_unit("Intel(R) Data Center GPU Max 1550", 64 * GIB) == "tile (one stack of a Max 1550)"
    assert device_unit("Intel(R) Data Center GPU Max 1550", 128 * GIB) == "card (both stacks of a Max 1550)"
    assert device_unit("Intel(R) Arc(TM) A770 Graphics", 16 * GIB).startswith("card (a single-stack GPU")


def test_the_hierarchy_is_recorded_as_set_or_as_the_driver_default() -> None:
    assert hierarchy({"ZE_FLAT_DEVICE_HIERARCHY": "composite"}) == "COMPOSITE"
    assert hierarchy({}).startswith("unset (driver default: FLAT")


def test_each_local_rank_is_pinned_before_the_runtime_starts() -> None:
    env: dict[str, str] = {}
    assert pin_local_rank(env, 3, runtime_started=False) == (
        0,
        "ZE_AFFINITY_MASK=3 set by accelbench-xpu for local rank 3",
    )
    assert env["ZE_AFFINITY_MASK"] == "3"


def test_a_mask_from_the_launcher_is_respected() -> None:
    assert (
        pin_local_rank({"ZE_AFFINITY_MASK": "0.1"}, 5, runtime_started=False)[0] == 0
    )  # one device per rank
    index, note = pin_local_rank({"ZE_AFFINITY_MASK": "4,5,6,7"}, 2, runtime_started=False)
    assert index == 2 and "uses its entry 2" in note
    with pytest.raises(BackendError, match=r"ZE_AFFINITY_MASK='0,1' exposes 2; start at most 2 processes"):
        pin_local_rank({"ZE_AFFINITY_MASK": "0,1"}, 2, runtime_started=False)


def test_once_the_runtime_started_the_index_is_used_and_the_record_says_why() -> None:
    env: dict[str, str] = {}
    index, note = pin_local_rank(env, 1, runtime_started=True)
    assert (index, env) == (1, {}) and "already started" in note
