"""ROCR_VISIBLE_DEVICES then HIP_VISIBLE_DEVICES (or its alias CUDA_VISIBLE_DEVICES), as the ROCm runtime applies them."""

from __future__ import annotations

from accelbench_rocm.visible import visible_gpus

GCDS = ["gcd0", "gcd1", "gcd2", "gcd3", "gcd4", "gcd5", "gcd6", "gcd7"]  # four MI250X packages


def test_unset_means_every_gcd() -> None:
    assert visible_gpus({}, GCDS) == GCDS


def test_hip_indexes_into_what_rocr_left() -> None:
    env = {"ROCR_VISIBLE_DEVICES": "4,5,6,7", "HIP_VISIBLE_DEVICES": "1,3"}
    assert visible_gpus(env, GCDS) == ["gcd5", "gcd7"]


def test_cuda_visible_devices_is_hips_alias_and_hip_takes_precedence() -> None:
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2"}, GCDS) == ["gcd2"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2", "HIP_VISIBLE_DEVICES": "6"}, GCDS) == ["gcd6"]


def test_parsing_stops_at_the_first_index_naming_no_device() -> None:
    assert visible_gpus({"HIP_VISIBLE_DEVICES": "1,9,2"}, GCDS) == ["gcd1"]
    assert visible_gpus({"ROCR_VISIBLE_DEVICES": "-1"}, GCDS) == []
    assert visible_gpus({"ROCR_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "2"}, GCDS) == []


def test_repeated_devices_hide_all_and_uuids_are_left_to_hip() -> None:
    assert visible_gpus({"HIP_VISIBLE_DEVICES": "3,3"}, GCDS) == []
    assert visible_gpus({"ROCR_VISIBLE_DEVICES": "GPU-4b2a6e9151e5a9f1"}, GCDS) is None
