"""Device profiles: one operator-level step model for every device, its rates from a calibration measured here, a
profile file, a profile the device's plugin ships, or the datasheet, in that order, each prediction saying which
and its error band (accelbench/estimate/profile.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from accelbench.cli import main
from accelbench.estimate.calibration import Calibration, TiledMatmul
from accelbench.estimate.profile import (
    DeviceProfile,
    datasheet_profile,
    implausible,
    load_profile,
    write_profile,
)
from accelbench.estimate.schema import Prediction

NEEDS_CUDA = pytest.mark.needs_plugin(
    "accelbench-cuda", why="its catalogue, its peak table and its shipped profile"
)


def estimate(capsys: pytest.CaptureFixture[str], *args: str) -> Prediction:
    assert main(["estimate", "--model", "gpt-nano", "--batch-size", "8", *args, "--json"]) == 0, (
        capsys.readouterr().err
    )
    return Prediction.model_validate_json(capsys.readouterr().out)


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["estimate", "--model", "gpt-nano", "--batch-size", "8", *args]) == 2
    return capsys.readouterr().err


def h100_profile() -> DeviceProfile:
    return datasheet_profile(device="NVIDIA H100 80GB HBM3", device_type="cuda", backend="cuda",
                             peaks={"float32": 67e12}, bandwidth_bytes_per_s=3.35e12, compute_units=132,
                             label="H100 SXM5")  # fmt: skip


# --------------------------------------------------------------------------------------------------------------
# Where the rates come from, in order, and what each prediction says of them
# --------------------------------------------------------------------------------------------------------------


@NEEDS_CUDA
def test_a_named_device_is_priced_from_its_shipped_profile_else_its_datasheet_each_said_with_its_band(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The H200 has a profile measured on it that the cuda plugin ships; the H100 has none, so its datasheet prices
    it; --efficiency asks for the old model. Each prediction names its source and its error band, and both profile
    predictions are operator by operator (forward, backward and dispatch priced), never FLOPs at 40% of the peak."""
    shipped = estimate(capsys, "--device", "H200", "--precision", "bf16-mixed")
    assert shipped.rates_source == "shipped" and "measured by accelbench's calibration" in (
        shipped.rates or ""
    )
    assert shipped.forward_s and shipped.dispatch_s and "calibrated" in (shipped.time_model or "")
    datasheet = estimate(capsys, "--device", "H100", "--precision", "bf16-mixed")
    assert datasheet.rates_source == "datasheet" and "H100 SXM5's datasheet" in (datasheet.rates or "")
    assert "132 compute units" in (datasheet.rates or "")
    old = estimate(capsys, "--device", "H100", "--precision", "bf16-mixed", "--efficiency", "0.4")
    assert (
        old.rates_source == "efficiency" and old.forward_s is None and "0.4 of the peak" in (old.rates or "")
    )
    for p in (shipped, datasheet, old):
        assert p.error_band and p.rates_source in p.error_band


@NEEDS_CUDA
def test_a_catalogued_prediction_carries_the_fixed_costs_a_launch_bound_step_is_made_of(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """gpt-nano at batch 8 on an H100 does almost no arithmetic: its step is the host's dispatch of its few
    hundred operators (about 14 us each on a GPU host) and the kernels' fixed time, tens of times what its FLOPs at
    40% of the peak take (the old model's 3.9-42x misses at small batches)."""
    p = estimate(capsys, "--device", "H100")
    assert p.dispatch_s is not None and p.step_time_s is not None
    flops_time = p.flops_per_step / (67e12 * 0.4)
    assert p.step_time_s > 20 * flops_time
    assert p.dispatch_s > 300 * 10e-6  # hundreds of operators at the typical ~14 us
    assert p.step_time_s >= p.dispatch_s * 0.9


@NEEDS_CUDA
def test_a_profile_file_prices_a_named_device_and_bad_ones_are_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--device-profile FILE wins over the shipped and datasheet profiles; a file that is not JSON, not a profile,
    of another version, of another device, or without the precision's rates is refused naming what is wrong."""
    good = tmp_path / "h100.json"
    write_profile(h100_profile().model_copy(update={"provenance": "a test's"}), good)
    p = estimate(capsys, "--device", "H100", "--device-profile", str(good))
    assert p.rates_source == "file" and str(good) in (p.rates or "") and "a test's" in (p.rates or "")
    (tmp_path / "broken.json").write_text("{not json")
    assert "not JSON" in refused(
        capsys, "--device", "H100", "--device-profile", str(tmp_path / "broken.json")
    )
    (tmp_path / "record.json").write_text(json.dumps({"schema": "accelbench.result"}))
    assert "not an accelbench device profile" in refused(
        capsys, "--device", "H100", "--device-profile", str(tmp_path / "record.json")
    )
    data = json.loads(good.read_text())
    (tmp_path / "v9.json").write_text(json.dumps({**data, "version": 9}))
    assert "profile version 9" in refused(
        capsys, "--device", "H100", "--device-profile", str(tmp_path / "v9.json")
    )
    other = refused(capsys, "--device", "A100", "--device-profile", str(good))
    assert "measured on NVIDIA H100 80GB HBM3" in other and "not on the NVIDIA A100" in other
    assert "not for the bfloat16 ones of bf16-mixed" in refused(
        capsys, "--device", "H100", "--precision", "bf16-mixed", "--device-profile", str(good)
    )
    data["calibrations"][0]["matmul"][0]["best_flops_per_s"] = -1.0
    (tmp_path / "negative.json").write_text(json.dumps(data))
    assert "not a positive number" in refused(
        capsys, "--device", "H100", "--device-profile", str(tmp_path / "negative.json")
    )
    assert "give one of them" in refused(
        capsys, "--device", "H100", "--device-profile", str(good), "--efficiency", "0.5"
    )


def test_a_profile_for_the_device_here_must_be_of_this_torch_and_this_device(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A profile priced for the device in front of you is refused where it was measured with another torch release
    (its dispatch costs are that release's) or on another device."""
    from accelbench.plugins import get_host

    cpu = get_host().backends["cpu"].detect()[0]
    profile = datasheet_profile(device=cpu.name, device_type="cpu", backend="cpu", peaks={"float32": 1e11},
                                bandwidth_bytes_per_s=2e10, compute_units=None, label="this CPU")  # fmt: skip
    write_profile(profile, tmp_path / "here.json")
    assert (
        estimate(capsys, "--backend", "cpu", "--device-profile", str(tmp_path / "here.json")).rates_source
        == "file"
    )
    write_profile(profile.model_copy(update={"torch": "1.13.1"}), tmp_path / "old.json")
    err = refused(capsys, "--backend", "cpu", "--device-profile", str(tmp_path / "old.json"))
    assert "measured with torch 1.13.1" in err and "another release's" in err
    write_profile(profile.model_copy(update={"device": "Another CPU"}), tmp_path / "other.json")
    assert "measured on Another CPU" in refused(
        capsys, "--backend", "cpu", "--device-profile", str(tmp_path / "other.json")
    )


# --------------------------------------------------------------------------------------------------------------
# The datasheet profile's products, and rates that refuse nonsense
# --------------------------------------------------------------------------------------------------------------


def test_a_datasheet_product_pays_for_its_tiles_its_waves_and_a_kernels_fixed_time() -> None:
    """A large product runs near the peak's efficiency, never above; one tile more than the compute units fill
    costs a whole wave; a tiny product is its kernel's fixed time."""
    tiles = TiledMatmul(peak_flops_per_s={"bfloat16": 1e15}, efficiency=0.8, compute_units=100, kernel_s=2e-6)
    large = tiles.rate(8192, 8192, 8192, "bfloat16")
    assert 0.7e15 < large <= 0.8e15
    # 100 tiles of 128x128 fill the 100 units in one wave; 110 need two (or smaller tiles, or split k: the best)
    full, over = tiles.rate(1280, 1280, 4096, "bfloat16"), tiles.rate(1280 + 128, 1280, 4096, "bfloat16")
    assert over < full * 0.9
    tiny = tiles.rate(32, 32, 32, "bfloat16")
    assert tiny == pytest.approx(2 * 32**3 / (2e-6 + (2 * 32 * 32 * 32 * 3) / (0.8e15 * 0.5 / 100)), rel=1e-6)
    untiered = TiledMatmul(
        peak_flops_per_s={"bfloat16": 1e15}, efficiency=0.8, compute_units=None, kernel_s=0.0
    )
    assert untiered.rate(1280 + 128, 1280, 4096, "bfloat16") > over  # no waves without the units


def test_rates_above_the_datasheet_peak_or_not_positive_are_refused() -> None:
    """A product timed above the device's peak is a timing that did not wait for the device (the H200's 2048^3 at
    1,095 of 989 TFLOP/s, 2026-11-28); a rate that is not a positive number no measurement gives."""
    calibration = h100_profile().calibrations[0]
    assert implausible(calibration, 67e12) is None
    fast = calibration.model_copy(
        update={"matmul": [p.model_copy(update={"best_flops_per_s": 80e12}) for p in calibration.matmul]}
    )
    assert "above the device's datasheet peak of 67" in (implausible(fast, 67e12) or "")
    zero = calibration.model_copy(
        update={"stream": [calibration.stream[0].model_copy(update={"best_bytes_per_s": 0.0})]}
    )
    assert "not a positive number" in (implausible(zero) or "")


@NEEDS_CUDA
def test_the_shipped_h200_profile_is_valid_measured_and_capped_at_the_peak() -> None:
    """What the cuda plugin ships reads as a profile, carries its provenance and its torch, and none of its
    products beats the H200's datasheet peak (one was timed above it and capped)."""
    from accelbench.estimate.profile import shipped_profiles
    from accelbench.plugins import get_host

    profiles = shipped_profiles(get_host().backends["cuda"])
    h200 = next(p for p in profiles if p.device == "NVIDIA H200")
    assert set(h200.dtypes()) == {"bfloat16", "float32"} and h200.torch.startswith("2.11")
    assert "H200" in h200.provenance and "2026-11-28" in h200.provenance
    bf16 = h200.calibration("bfloat16")
    assert bf16 is not None and implausible(bf16, 989e12) is None
    assert any("capped" in note for note in bf16.notes)


def test_load_profile_round_trips_what_write_profile_wrote(tmp_path: Path) -> None:
    profile = h100_profile()
    write_profile(profile, tmp_path / "p.json")
    again = load_profile(tmp_path / "p.json")
    assert again == profile and isinstance(again.calibrations[0], Calibration)
    assert again.calibrations[0].tiles is not None  # a datasheet profile keeps its tile model


# --------------------------------------------------------------------------------------------------------------
# The step traced for an accelerator on a CPU, and traced once for many batches
# --------------------------------------------------------------------------------------------------------------


def test_a_cpu_trace_standing_in_for_an_accelerator_runs_its_fused_attention_and_dropout() -> None:
    """On a CPU build the step of a GPU is traced on the CPU, but with the kernels the GPU runs: attention through
    the fused kernel (its dropout inside it) and dropout as one native_dropout, not the CPU's explicit softmax over
    a*s^2 scores and its three-pass dropout (1,572 operators for gpt2, as the H200 traced, not 2,391)."""
    from accelbench.config import RunConfig
    from accelbench.contract import standard_plan
    from accelbench.estimate.operators import operators_for, step_operators
    from accelbench.plugins import get_host

    host = get_host()
    config = host.resolve(RunConfig(model="gpt-nano", batch_size=4))
    plan = standard_plan("fp32", "ieee-fp32")
    workload = host.workload("gpt")
    cpu = {op.name for op in step_operators(workload, config, plan, "cpu", "fused").operators}
    gpu = operators_for(workload, config, plan, "cuda", "fused")
    names = {op.name for op in gpu.operators}
    assert gpu.device_type == "cuda" and "fused attention and dropout" in gpu.traced_elsewhere
    assert "_softmax" in cpu and "bernoulli_" in cpu
    assert "_softmax" not in names and "bernoulli_" not in names and "native_dropout" in names
    assert any("scaled_dot_product" in name for name in names)


def test_plan_reads_a_batch_off_the_line_through_three_small_ones_as_its_own_trace_would_be() -> None:
    """plan prices each shape at many batches: the step traced at 2, 4 and 8 samples gives any larger batch's
    operators exactly (figures, shapes, largest tensors), gradient accumulation's micro-batches included."""
    from accelbench.config import RunConfig
    from accelbench.contract import standard_plan
    from accelbench.estimate.operators import step_operators
    from accelbench.plugins import get_host

    host = get_host()
    workload, plan = host.workload("gpt"), standard_plan("bf16-mixed", "ieee-fp32")
    for batch, accum in ((24, 1), (40, 2)):
        config = host.resolve(
            RunConfig(model="gpt-nano", batch_size=batch, grad_accum=accum, precision="bf16-mixed")
        )
        read = step_operators(workload, config, plan, "cpu", "fused", by_batch=True)
        traced = step_operators(workload, config, plan, "cpu", "fused")
        assert read == traced, batch


# --------------------------------------------------------------------------------------------------------------
# accelbench calibrate --export
# --------------------------------------------------------------------------------------------------------------


def test_calibrate_exports_a_profile_another_estimate_reads_and_never_a_busy_hosts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`accelbench calibrate --export FILE` writes this device's calibration as a profile with its provenance,
    which `estimate --device-profile FILE` prices with; a second precision is added to the same file; one measured
    while the host was busy, or faster than the device's peak, is refused and the file left as it was; a file that
    is not a profile is never overwritten."""
    import accelbench.estimate.command as command

    # rates of a slow CPU: below any peak this host's CPU measures (an export faster than the peak is refused)
    made = datasheet_profile(device="a CPU", device_type="cpu", backend="cpu", peaks={"float32": 1e9},
                             bandwidth_bytes_per_s=1e10, compute_units=None, label="a slow CPU").calibrations[0]  # fmt: skip
    cpu_like = made.model_copy(update={"tiles": None, "measured_at": "2026-12-07T10:00:00+00:00"})
    handed: list[Calibration] = [cpu_like]
    monkeypatch.setattr(command, "_calibration", lambda *a, **k: handed[0])
    out = tmp_path / "here.json"
    assert main(["calibrate", "--export", str(out), "--provenance", "the test bench"]) == 0
    profile = load_profile(out)
    assert profile.dtypes() == ["float32"] and "the test bench" in profile.provenance
    assert "measured by `accelbench calibrate`" in profile.provenance
    capsys.readouterr()
    p = estimate(capsys, "--backend", "cpu", "--device-profile", str(out))
    assert p.rates_source == "file"
    bf16 = [p.model_copy(update={"dtype": "bfloat16"}) for p in cpu_like.matmul]
    handed[0] = cpu_like.model_copy(update={"dtype": "bfloat16", "matmul": bf16 + cpu_like.matmul})
    assert main(["calibrate", "--precision", "bf16-mixed", "--export", str(out)]) == 0
    assert sorted(load_profile(out).dtypes()) == ["bfloat16", "float32"]
    before = out.read_text()
    handed[0] = cpu_like.model_copy(update={"contended": True})
    capsys.readouterr()
    assert main(["calibrate", "--export", str(out)]) == 2
    assert "not exported" in capsys.readouterr().err and out.read_text() == before
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["calibrate", "--export", str(tmp_path / "notes.txt")]) == 2
    assert "not a device profile" in capsys.readouterr().err
    assert (tmp_path / "notes.txt").read_text() == "mine"


@NEEDS_CUDA
def test_what_estimate_prints_cites_only_what_users_have(capsys: pytest.CaptureFixture[str]) -> None:
    """Its sources named a file of this project's notes (shared/notes/MEASUREMENT.md) that users never get."""
    assert main(["estimate", "--model", "gpt-nano", "--devices", "2", "--strategy", "ddp", "--device", "H100",
                 "--bus-bandwidth", "100"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "sources" in out and "shared/" not in out


# --------------------------------------------------------------------------------------------------------------
# Rates that refuse nonsense: a busy host's calibration, and one far below the run's own peak
# --------------------------------------------------------------------------------------------------------------


def test_a_calibration_measured_on_a_busy_host_is_said_and_never_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its rates are a lower bound of the device's (a shared host gave 0.002 GFLOP/s against the 30 the same run
    measured as its peak, and the cache kept it for the next run): returned marked, with a note, and not stored."""
    import torch

    from accelbench.estimate import calibration as module
    from accelbench.hostinfo import CpuUsage

    class Busy(CpuUsage):
        def waiting_since(self, before: CpuUsage) -> float | None:
            return 0.5

    real = module.cpu_usage
    monkeypatch.setattr(module, "cpu_usage", lambda: Busy(**vars(real())))
    found = module.calibrate(torch.device("cpu"), lambda device: None, backend="cpu", device_name="busy cpu",
                             dtype="float32", directory=tmp_path, matmul_sizes=(16, 64),
                             stream_bytes=(3 * 2**12, 3 * 2**20), cold_bytes=8 * 2**20)  # fmt: skip
    assert found is not None and found.contended and found.waiting == 0.5
    assert any("lower bound of this device's, and it is not cached" in note for note in found.notes)
    assert not (tmp_path / module.CACHE_FILE).exists()


def test_a_calibration_far_below_the_runs_own_peak_prices_nothing() -> None:
    """A calibration whose largest product runs 100x below the peak the same run measured is not of this device
    as it runs: the record says why, instead of a step 10^4 times too long."""
    from accelbench.contract import PeakFigures
    from accelbench.engine.prediction import consistent_with_peak

    calibration = h100_profile().calibrations[0]  # fp32 products of up to ~53 TFLOP/s
    operators = object()
    ok = consistent_with_peak((calibration, operators), PeakFigures(flops_per_s=67e12, source="table"))  # type: ignore[arg-type]
    assert ok == (calibration, operators)
    far = consistent_with_peak((calibration, operators), PeakFigures(flops_per_s=67e16, source="a run's"))  # type: ignore[arg-type]
    assert (
        isinstance(far, str) and "run over 100x below this run's peak" in far and "nothing is priced" in far
    )
