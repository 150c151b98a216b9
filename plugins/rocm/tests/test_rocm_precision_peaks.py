"""Precisions by gfx architecture, IEEE fp32, and the Instinct peak table per GCD."""

from __future__ import annotations

import pytest
import torch
from accelbench_rocm.peaks import lookup, peak_for
from accelbench_rocm.precision import base_arch, make_plan, supported_precisions
from rocm_standins import FakeAmdGpu, install_gpus, mi250x_gcds, mi300x

from accelbench.contract import DeviceInfo, World, standard_plan
from accelbench.errors import ConfigError
from accelbench.plugins import PluginHost

ALL = ["fp32", "fp16-mixed", "bf16-mixed", "bf16-true"]
FP8 = ["fp8-tensorwise", "fp8-rowwise"]


@pytest.mark.parametrize(
    ("arch", "expected"),
    [
        ("gfx906", ["fp32", "fp16-mixed"]),  # MI50/MI60: no matrix cores, bf16 only emulated
        ("gfx1030", ["fp32", "fp16-mixed"]),
        ("gfx908", ALL),
        ("gfx90a:sramecc+:xnack-", ALL),
        ("gfx942", ALL + FP8),  # CDNA 3: FP8 matrix cores
        ("gfx950", ALL + FP8),
        ("gfx1100", ALL),
    ],
)
def test_bf16_only_where_the_matrix_cores_run_it(arch: str, expected: list[str]) -> None:
    assert supported_precisions(arch) == expected


def test_fp32_is_ieee_and_the_switch_is_set_to_match() -> None:
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        plan = make_plan("fp32", "gfx90a:sramecc+:xnack-")
        assert plan.matmul_math == "ieee-fp32" and not torch.backends.cuda.matmul.allow_tf32
        assert "gfx90a" in plan.notes and base_arch("gfx942:xnack-") == "gfx942"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False


def test_asking_for_tf32_is_refused_not_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    install_gpus(monkeypatch, [mi300x()])
    monkeypatch.setenv("ACCELBENCH_TF32", "on")
    backend = PluginHost().backends["rocm"]
    with pytest.raises(ConfigError, match="IEEE fp32 only"):
        backend.precision_plan("fp32", backend.setup_device(World(local_rank=0), {}), {})


def test_an_mi50_refuses_bf16_and_the_launcher_asks_without_starting_hip(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, hip = install_gpus(
        monkeypatch, [FakeAmdGpu("AMD Instinct MI50", 0x906, 60, 32 * 2**30, "0000:03:00.0"), mi300x()]
    )
    backend = PluginHost().backends["rocm"]
    assert backend.supported_precisions(torch.device("cuda")) == [
        "fp32",
        "fp16-mixed",
    ]  # the weaker GPU decides
    assert hip.current is None
    with pytest.raises(ConfigError, match="does not support precision 'bf16-mixed'"):
        backend.check_precision("bf16-mixed", backend.setup_device(World(local_rank=0), {}))
    assert backend.supported_precisions(backend.setup_device(World(local_rank=1), {})) == ALL + FP8


def device(name: str, arch: str, units: int) -> DeviceInfo:
    return DeviceInfo(index=0, name=name, arch=arch, details={"compute_units": str(units)})


def test_the_ambiguous_mi250x_mi250_name_is_told_apart_by_compute_units() -> None:
    assert lookup("AMD Instinct MI250X/MI250", "gfx90a", 110).label == "one GCD of an MI250X"
    assert lookup("AMD Instinct MI250X/MI250", "gfx90a", 104).label.startswith(
        "MI210, or one GCD of an MI250"
    )
    peak = peak_for(
        device("AMD Instinct MI250X/MI250", "gfx90a", 110), standard_plan("bf16-mixed", "ieee-fp32")
    )
    assert (peak.flops_per_s, peak.memory_bandwidth_bytes_per_s) == (191.5e12, 1.6e12)  # per GCD: half of 383


def test_names_must_not_contradict_and_partitions_get_no_whole_gpu_figure() -> None:
    # same arch and CUs as an MI300X, more bandwidth: its own row, never the MI300X's
    assert lookup("AMD Instinct MI325X", "gfx942", 304).memory_gib == 256
    assert lookup("AMD Instinct MI300X", "gfx942", 38) is None  # one XCD of a CPX-partitioned MI300X
    assert lookup("", "gfx942", 304, 192 * 2**30).label.startswith("MI300X")  # unnamed: told apart by memory
    assert lookup("", "gfx942", 304, 256 * 2**30).label.startswith("MI325X")
    assert lookup("", "gfx942", 304) is None  # unnamed, memory unknown: MI300X or MI325X, so no figure
    assert lookup("AMD Instinct MI300X", "gfx942", None) is None


@pytest.mark.parametrize(
    ("precision", "tflops", "math"),
    [
        ("fp32", 163.4, "fp32 matrix"),
        ("fp16-mixed", 1307.4, "dense fp16 matrix"),
        ("bf16-true", 1307.4, "dense bf16 matrix"),
    ],
)
def test_the_figure_is_for_the_math_in_use(precision: str, tflops: float, math: str) -> None:
    peak = peak_for(device("AMD Instinct MI300X", "gfx942", 304), standard_plan(precision, "ieee-fp32"))
    assert peak.flops_per_s == pytest.approx(tflops * 1e12) and peak.source.endswith(math)


def test_mi100_bf16_runs_at_half_its_fp16_rate() -> None:
    entry = lookup("AMD Instinct MI100", "gfx908", 120)
    assert entry.bf16 * 2 == pytest.approx(entry.fp16)


def test_the_hook_reads_the_detected_compute_units(monkeypatch: pytest.MonkeyPatch) -> None:
    install_gpus(monkeypatch, mi250x_gcds())
    backend = PluginHost().backends["rocm"]
    detected = backend.detect()[0]
    assert backend.peak_figures(detected, standard_plan("fp32", "ieee-fp32")).flops_per_s == pytest.approx(
        47.9e12
    )


def test_fp8_and_fp4_peaks_are_dense_and_only_where_the_gpu_has_them() -> None:
    from accelbench_rocm.peaks import TABLE_VERSION, peaks_by_math

    mi300x = peaks_by_math(device("AMD Instinct MI300X", "gfx942", 304))
    assert mi300x["fp8"] == pytest.approx(2614.9e12) and "fp4" not in mi300x  # 5229.8 is with sparsity
    mi355x = peaks_by_math(device("AMD Instinct MI355X", "gfx950", 256))
    assert (mi355x["bf16"], mi355x["fp8"], mi355x["fp4"]) == pytest.approx((2516.6e12, 5033.2e12, 10066.3e12))
    assert "fp8" not in peaks_by_math(device("AMD Instinct MI250X/MI250", "gfx90a", 110))  # CDNA 2: no FP8
    peak = peak_for(device("AMD Instinct MI325X", "gfx942", 304), standard_plan("bf16-mixed", "ieee-fp32"))
    assert peak.table_version == TABLE_VERSION and peak.memory_bandwidth_bytes_per_s == 6.0e12


def test_an_unknown_or_sibling_device_never_gets_another_devices_peak() -> None:
    from accelbench_rocm.peaks import peaks_by_math

    plan = standard_plan("bf16-mixed", "ieee-fp32")
    for unknown in (
        device("AMD Instinct MI350X", "gfx950", 256),  # the MI355X's sibling at a lower clock
        device("", "gfx950", 256),  # unnamed: MI350X or MI355X
        device("AMD Instinct MI300A", "gfx942", 228),
        device("AMD Radeon PRO W7900", "gfx1100", 96),
    ):
        assert peak_for(unknown, plan) is None and peaks_by_math(unknown) == {}, unknown.name
    # an FP8 plan before its linears are converted has no share to weigh by: no figure, never the bf16 one
    assert (
        peak_for(device("AMD Instinct MI300X", "gfx942", 304), standard_plan("fp8-tensorwise", "ieee-fp32"))
        is None
    )
