"""FP8 training on AMD Instinct GPUs: which architectures declare it and in which FP8 formats, the dtype a
conversion records (FNUZ on an MI300X, OCP on an MI355X, through the torchao stand-in's own choice), every refusal,
and the FLOP-weighted peak MFU uses."""

from __future__ import annotations

import pytest
import torch
from accelbench_rocm.peaks import known_devices, peak_for, peaks_by_math
from rocm_standins import FakeAmdGpu, install_gpus, mi250x_gcds, mi300x

from accelbench.config import RunConfig
from accelbench.contract import DeviceInfo, Float8Layers, World, standard_plan
from accelbench.engine.float8 import FLOP_SHARE_BASIS, convert_to_fp8
from accelbench.engine.metrics import flop_weighted_peak
from accelbench.errors import BackendError, ConfigError
from accelbench.plugins import PluginHost
from accelbench.testing import torchao_standin
from accelbench.workloads import ModelUnits

FNUZ = {"input": "float8_e4m3fnuz", "weight": "float8_e4m3fnuz", "grad_output": "float8_e5m2fnuz"}
OCP = {"input": "float8_e4m3fn", "weight": "float8_e4m3fn", "grad_output": "float8_e5m2"}


def mi355x() -> FakeAmdGpu:
    return FakeAmdGpu("AMD Instinct MI355X", 0x950, 256, 288 * 2**30, "0000:05:00.0")


class TwoLinears(torch.nn.Module):
    """A model with two convertible linears and a head, trained on the CPU through the stand-in's FP8 rounding."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(32, 64)
        self.proj = torch.nn.Linear(64, 32)
        self.head = torch.nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.proj(torch.relu(self.fc(x))))


UNITS = ModelUnits(stem=(), units=("fc", "proj"), head=("head",))


@pytest.mark.parametrize(
    ("gpus", "expected_e4m3", "dtypes"),
    [([mi300x()], "float8_e4m3fnuz", FNUZ), ([mi355x()], "float8_e4m3fn", OCP)],
)
def test_the_plan_and_the_conversion_name_the_fp8_dtypes_of_the_architecture(
    monkeypatch: pytest.MonkeyPatch, gpus: list[FakeAmdGpu], expected_e4m3: str, dtypes: dict[str, str]
) -> None:
    install_gpus(monkeypatch, gpus)
    backend = PluginHost().backends["rocm"]
    device = backend.setup_device(World(local_rank=0), {})
    backend.check_precision("fp8-tensorwise", device)
    plan = backend.precision_plan("fp8-tensorwise", device, {})
    assert plan.fp8_recipe == "tensorwise" and plan.autocast_dtype == "bfloat16"
    assert plan.fp8_e4m3_dtype == expected_e4m3 and expected_e4m3 in plan.notes
    torchao_standin.install(monkeypatch)  # after HIP is there, as torchao picks its dtypes when imported
    model = TwoLinears()
    layers = convert_to_fp8(model, "tensorwise", UNITS, 1e6, 4, expected_e4m3=plan.fp8_e4m3_dtype)
    assert layers.fp8_dtypes == dtypes and layers.converted == ["fc", "proj"]
    # the converted model trains on the CPU, its linears rounding through the recorded e4m3 dtype
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 32), torch.randn(8, 16)
    losses = []
    for _ in range(3):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_rowwise_casts_every_operand_to_e4m3_in_the_fnuz_format(monkeypatch: pytest.MonkeyPatch) -> None:
    install_gpus(monkeypatch, [mi300x()])
    torchao_standin.install(monkeypatch)
    layers = convert_to_fp8(TwoLinears(), "rowwise", UNITS, 1e6, 4, expected_e4m3="float8_e4m3fnuz")
    assert set(layers.fp8_dtypes.values()) == {"float8_e4m3fnuz"}


def test_a_config_casting_to_another_format_than_the_gpu_takes_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torchao decides FNUZ or OCP by device 0: a torchao imported before HIP sees no MI300 and picks OCP, which an
    MI300's matrix cores do not take. The conversion is refused, nothing converted."""
    torchao_standin.install(monkeypatch)  # no ROCm GPU yet: the OCP pair
    install_gpus(monkeypatch, [mi300x()])
    model = TwoLinears()
    with pytest.raises(
        BackendError, match="casts to float8_e4m3fn but this GPU's FP8 matrix cores take float8_e4m3fnuz"
    ):
        convert_to_fp8(model, "tensorwise", UNITS, 1e6, 4, expected_e4m3="float8_e4m3fnuz")
    assert type(model.fc) is torch.nn.Linear


@pytest.mark.parametrize(
    "gpus", [mi250x_gcds(), [FakeAmdGpu("AMD Instinct MI100", 0x908, 120, 32 * 2**30, "0:3:0.0")]]
)
def test_older_instincts_refuse_fp8_naming_the_gpus_that_run_it(
    monkeypatch: pytest.MonkeyPatch, gpus: list[FakeAmdGpu]
) -> None:
    install_gpus(monkeypatch, gpus)
    backend = PluginHost().backends["rocm"]
    device = backend.setup_device(World(local_rank=0), {})
    with pytest.raises(ConfigError) as refused:
        backend.check_precision("fp8-rowwise", device)
    message = str(refused.value)
    assert "does not support precision 'fp8-rowwise'" in message
    assert "AMD Instinct MI300X, MI325X (gfx942) or MI355X (gfx950)" in message
    assert "pip install 'accelbench-rocm[fp8]'" in message
    assert "On this device use one of: fp32, fp16-mixed, bf16-mixed, bf16-true" in message


def test_an_fp8_run_without_torchao_is_refused_naming_the_rocm_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    backend = PluginHost().backends["rocm"]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else object())
    with pytest.raises(ConfigError, match=r"install it with: pip install 'accelbench-rocm\[fp8\]'"):
        backend.check_run(RunConfig(model="custom", precision="fp8-tensorwise"))
    backend.check_run(RunConfig(model="custom", precision="bf16-mixed"))  # nothing to refuse without FP8


def test_catalogue_plans_for_an_estimate() -> None:
    backend = PluginHost().backends["rocm"]
    by_name = {d.details["aliases"].split(",")[0]: d for d in known_devices()}
    assert (
        backend.catalogue_precision_plan("fp8-rowwise", by_name["MI325X"], {}).fp8_e4m3_dtype
        == "float8_e4m3fnuz"
    )
    assert (
        backend.catalogue_precision_plan("fp8-tensorwise", by_name["MI355X"], {}).fp8_e4m3_dtype
        == "float8_e4m3fn"
    )
    assert backend.catalogue_precision_plan("bf16-mixed", by_name["MI250X"], {}).fp8_e4m3_dtype is None
    with pytest.raises(ConfigError, match=r"AMD Instinct MI250X \(gfx90a\) does not run it"):
        backend.catalogue_precision_plan("fp8-tensorwise", by_name["MI250X"], {})


def converted_plan(share: float) -> object:
    plan = standard_plan("fp8-tensorwise", "ieee-fp32")
    layers = Float8Layers(
        recipe="tensorwise",
        converted=["layers.0.attention.wq"],
        kept={"output": "head"},
        converted_count=1,
        kept_count=1,
        fp8_flop_share=share,
        flop_share_basis=FLOP_SHARE_BASIS,
        fp8_dtypes=FNUZ,
    )
    return plan.model_copy(update={"fp8_layers": layers, "fp8_e4m3_dtype": "float8_e4m3fnuz"})


def instinct(name: str, arch: str, units: int) -> DeviceInfo:
    return DeviceInfo(index=0, name=name, arch=arch, details={"compute_units": str(units)})


def test_the_mfu_peak_of_an_fp8_run_weighs_dense_fp8_and_bf16_by_their_flops() -> None:
    mi300x_info = instinct("AMD Instinct MI300X", "gfx942", 304)
    peak = peak_for(mi300x_info, converted_plan(0.8))  # type: ignore[arg-type]
    assert peak is not None
    expected = flop_weighted_peak({"fp8": 0.8, "bf16": 0.2}, peaks_by_math(mi300x_info))
    assert peak.flops_per_s == pytest.approx(expected)
    assert peak.flops_per_s == pytest.approx(1 / (0.8 / 2614.9e12 + 0.2 / 1307.4e12))  # dense, not sparse
    assert (
        "80.0% of FLOPs in dense fp8 matrix at 2614.9" in peak.source and "20.0% in dense bf16" in peak.source
    )
    mi355 = peak_for(instinct("AMD Instinct MI355X", "gfx950", 256), converted_plan(1.0))  # type: ignore[arg-type]
    assert mi355 is not None and mi355.flops_per_s == pytest.approx(5033.2e12)
    # an MI250X GCD has no FP8 figure: no peak rather than the bf16 one
    assert peak_for(instinct("AMD Instinct MI250X/MI250", "gfx90a", 110), converted_plan(0.8)) is None  # type: ignore[arg-type]


def test_an_fp8_estimate_for_an_mi300x_weighs_the_peaks_by_the_planned_layers() -> None:
    """`accelbench estimate --device MI300X --precision fp8-tensorwise`: the linears chosen on a meta-device build
    (no torchao, no GPU), the FNUZ formats in the plan, the FLOP-weighted peak a run would record."""
    from accelbench.estimate.command import resolve_target
    from accelbench.testing import tiny_config

    host = PluginHost()
    config = host.resolve(tiny_config(precision="fp8-tensorwise"))
    target = resolve_target(host, config, device_name="MI300X")
    layers = target.plan.fp8_layers
    assert layers is not None and layers.converted_count == 4 and layers.fp8_dtypes == {}  # nothing converted
    assert target.plan.fp8_e4m3_dtype == "float8_e4m3fnuz"
    expected = flop_weighted_peak(
        {"fp8": layers.fp8_flop_share, "bf16": 1 - layers.fp8_flop_share},
        peaks_by_math(instinct("AMD Instinct MI300X", "gfx942", 304)),
    )
    assert target.peak is not None and target.peak.flops_per_s == pytest.approx(expected)


def test_an_mi355x_refuses_mxfp8_saying_why_and_naming_what_runs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """gfx950 has MX matrix cores, but torchao 0.18's MXFP8 training casts the backward's operands with a CUDA-only
    kernel (MXFP8Dim1CastKernelChoice.CUDA, loaded only on sm_100+), so the plugin does not declare mxfp8."""
    install_gpus(monkeypatch, [mi355x()])
    backend = PluginHost().backends["rocm"]
    device = backend.setup_device(World(local_rank=0), {})
    assert "mxfp8" not in backend.supported_precisions(device)
    with pytest.raises(ConfigError) as refused:
        backend.check_precision("mxfp8", device)
    message = str(refused.value)
    assert "MX training needs an NVIDIA Blackwell GPU" in message and "MI355X (gfx950)" in message
    assert "CUDA-only kernel" in message and "fp8-tensorwise, fp8-rowwise" in message
