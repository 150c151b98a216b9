"""CUDA_VISIBLE_DEVICES read as the CUDA driver reads it."""

from __future__ import annotations

import pytest
from accelbench_cuda.visible import PhysicalGpu, visible_gpus

GPUS = [
    PhysicalGpu(0, "GPU-0aaa1111-0000-0000-0000-000000000000", "g0"),
    PhysicalGpu(1, "GPU-1bbb2222-0000-0000-0000-000000000000", "g1"),
    PhysicalGpu(2, "GPU-1bbb3333-0000-0000-0000-000000000000", "g2"),
    PhysicalGpu(3, "GPU-3ddd4444-0000-0000-0000-000000000000", "g3"),
]


def names(value: str | None) -> list[str] | None:
    found = visible_gpus(value, GPUS)
    return None if found is None else [g.name for g in found]


def test_unset_means_every_gpu_in_order() -> None:
    assert names(None) == ["g0", "g1", "g2", "g3"]


def test_indices_reorder_and_select() -> None:
    assert names("2,0") == ["g2", "g0"]
    assert names(" 3 , 1 ") == ["g3", "g1"]


def test_parsing_stops_at_the_first_entry_naming_no_device() -> None:
    assert names("1,7,2") == ["g1"]  # 7 does not exist: 2 is never reached
    assert names("0,gpu1,2") == ["g0"]
    assert names("-1,0") == []  # the common trick to hide every GPU


@pytest.mark.parametrize("value", ["", "0,0", "1,GPU-1bbb2222"])
def test_empty_or_repeated_hides_every_gpu(value: str) -> None:
    assert names(value) == []


def test_uuid_and_unique_uuid_prefixes() -> None:
    assert names("GPU-3ddd4444-0000-0000-0000-000000000000,GPU-0aaa") == ["g3", "g0"]
    assert names("gpu-3ddd") == ["g3"]  # the driver compares case-insensitively


def test_ambiguous_uuid_prefix_names_no_device() -> None:
    assert names("GPU-0aaa,GPU-1bbb,3") == ["g0"]  # GPU-1bbb matches two GPUs


def test_mig_instances_are_left_to_cuda() -> None:
    assert names("MIG-5f3c1e2a-0000-0000-0000-000000000000") is None
