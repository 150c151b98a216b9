"""The peak table: exact device names, dense figures, and the figure for the math the plan really uses."""

from __future__ import annotations

import pytest
from accelbench_cuda.peaks import TABLE, lookup, peak_for

from accelbench.contract import DeviceInfo, standard_plan
from accelbench.plugins import PluginHost


def plan(name: str, math: str = "ieee-fp32"):  # type: ignore[no-untyped-def]
    return standard_plan(name, matmul_math=math)


def test_names_match_exactly_up_to_case_and_spacing() -> None:
    assert lookup("NVIDIA A100-SXM4-80GB").label == "A100 SXM4 80GB"
    assert lookup("  nvidia  h100 80gb hbm3 ").label == "H100 SXM5"


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA H100 NVL",
        "NVIDIA H200 NVL",
        "NVIDIA A100-SXM4-80GB MIG 1g.10gb",
        "Quadro P1000",
        "",
        # Blackwell Ultra: its dense per-GPU figures are on third-party pages only (docs/precision.md)
        "NVIDIA B300 SXM6 AC",
        "NVIDIA GB300",
    ],
)
def test_a_variant_the_table_does_not_know_gets_no_figure(name: str) -> None:
    assert lookup(name) is None and peak_for(name, plan("bf16-mixed")) is None


@pytest.mark.parametrize(
    ("precision", "math", "tflops", "kind"),
    [
        ("bf16-mixed", "ieee-fp32", 989, "bf16 tensor"),
        ("bf16-true", "ieee-fp32", 989, "bf16 tensor"),
        ("fp16-mixed", "ieee-fp32", 989, "fp16 tensor"),
        ("fp32", "tf32", 495, "tf32 tensor"),
        ("fp32", "ieee-fp32", 67, "fp32"),
    ],
)
def test_the_figure_is_for_the_math_in_use(precision: str, math: str, tflops: float, kind: str) -> None:
    peak = peak_for("NVIDIA H100 80GB HBM3", plan(precision, math))
    assert peak.flops_per_s == tflops * 1e12
    assert peak.memory_bandwidth_bytes_per_s == 3.35e12
    assert peak.source.startswith("accelbench-cuda table: H100 SXM5, ") and peak.source.endswith(kind)


def test_math_a_gpu_lacks_has_no_figure() -> None:
    assert peak_for("Tesla V100-SXM2-32GB", plan("bf16-mixed")) is None  # Volta has no bf16
    assert peak_for("Tesla V100-SXM2-32GB", plan("fp16-mixed")).flops_per_s == 125e12


def test_figures_are_dense_not_the_sparsity_headlines() -> None:
    h100 = lookup("NVIDIA H100 80GB HBM3")
    assert h100.bf16 < 1000e12  # NVIDIA's "1979 TFLOPS" is with 2:4 sparsity
    for entry in TABLE:  # tensor math is never slower than plain fp32, TF32 sits between
        assert entry.fp32 < (entry.tf32 or entry.fp16) <= (entry.bf16 or entry.fp16)


def test_the_hook_answers_for_a_detected_device() -> None:
    backend = PluginHost().backends["cuda"]
    device = DeviceInfo(index=0, name="NVIDIA A100-SXM4-40GB", arch="sm_80")
    peak = backend.peak_figures(device, plan("bf16-mixed"))
    assert (peak.flops_per_s, peak.memory_bandwidth_bytes_per_s) == (312e12, 1555e9)
    assert backend.peak_figures(DeviceInfo(index=0, name="NVIDIA GeForce RTX 4090"), plan("fp32")) is None


def test_a_peak_carries_the_table_version_and_the_conditions_detection_read() -> None:
    from accelbench_cuda.peaks import TABLE_VERSION, peaks_by_math

    details = {"power_limit_w": "700", "max_sm_clock_mhz": "1980", "uuid": "GPU-x"}
    peak = peak_for("NVIDIA H100 80GB HBM3", plan("bf16-mixed"), details)
    assert peak is not None and peak.table_version == TABLE_VERSION
    assert peak.conditions == {
        "power_limit_w": "700",
        "max_sm_clock_mhz": "1980",
    }  # nothing else of detection's
    # every math the table has, dense, for a run that mixes them; FP8 only where the GPU has it
    assert peaks_by_math("NVIDIA H100 80GB HBM3")["fp8"] == 1979e12
    assert "fp8" not in peaks_by_math("NVIDIA A100-SXM4-80GB")
    assert peaks_by_math("NVIDIA H100 NVL") == {}  # unknown: nothing, never a neighbour's


def test_detection_reads_the_power_limit_and_maximum_clock_where_nvml_has_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from accelbench_cuda import detect
    from cuda_standins import a100, install_gpus

    capped = a100(0)
    capped.power_limit_mw, capped.max_clock_sm_mhz = 250_000, 1410
    unsupported = a100(1)
    unsupported.power_limit_mw = None  # NVML answers NOT_SUPPORTED
    install_gpus(monkeypatch, [capped, unsupported])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    first, second = detect.detect_devices()
    assert first.details["power_limit_w"] == "250" and first.details["max_sm_clock_mhz"] == "1410"
    assert "power_limit_w" not in second.details
