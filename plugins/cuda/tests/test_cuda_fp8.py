"""FP8 and MX training on NVIDIA GPUs: which GPUs declare them, every refusal, and the FLOP-weighted peak MFU uses."""

from __future__ import annotations

import pytest
from accelbench_cuda.peaks import peak_for, peaks_by_math
from cuda_standins import a100, h200, install_gpus

from accelbench.config import RunConfig
from accelbench.contract import Float8Layers, World, standard_plan
from accelbench.engine.float8 import FLOP_SHARE_BASIS
from accelbench.engine.metrics import flop_weighted_peak, model_flops_utilisation
from accelbench.errors import ConfigError
from accelbench.plugins import PluginHost
from accelbench.testing import torchao_standin

H100 = "NVIDIA H100 80GB HBM3"


def converted_plan(share: float, precision: str = "fp8-tensorwise") -> object:
    """An FP8 plan as the executor records it once the model's linears are converted."""
    plan = standard_plan(precision, "ieee-fp32")
    layers = Float8Layers(
        recipe=plan.fp8_recipe or "",  # mxfp8_rceil for an MX plan
        converted=["blocks.0.mlp.fc"],
        kept={"lm_head": "head"},
        converted_count=1,
        kept_count=1,
        fp8_flop_share=share,
        flop_share_basis=FLOP_SHARE_BASIS,
    )
    return plan.model_copy(update={"fp8_layers": layers})


def test_mfu_of_an_fp8_run_weighs_the_fp8_and_bf16_peaks_by_their_flops() -> None:
    plan = converted_plan(0.75)
    peak = peak_for(H100, plan)  # type: ignore[arg-type]
    assert peak is not None
    expected = flop_weighted_peak({"fp8": 0.75, "bf16": 0.25}, peaks_by_math(H100))
    assert peak.flops_per_s == pytest.approx(expected)
    assert peak.flops_per_s == pytest.approx(1 / (0.75 / 1979e12 + 0.25 / 989e12))  # between the two peaks
    assert "FLOP-weighted 75.0% of FLOPs in dense fp8 tensor at 1979" in peak.source
    assert "25.0% in dense bf16 tensor at 989" in peak.source
    achieved = 1000e12  # what a run of one device achieved, in model FLOPs/s
    mfu, error = model_flops_utilisation(achieved, peak, devices=1)
    assert error is None and mfu == pytest.approx(achieved / expected)
    # against the BF16 peak alone the same run would read above 100%: the weighting is what makes it right
    assert (
        model_flops_utilisation(achieved, peak_for(H100, standard_plan("bf16-mixed", "ieee-fp32")), 1)[0]
        is None
    )


def test_an_fp8_peak_is_unknown_before_conversion_and_where_the_table_lacks_fp8() -> None:
    assert peak_for(H100, standard_plan("fp8-tensorwise", "ieee-fp32")) is None  # no layers known yet
    assert peak_for("NVIDIA A100-SXM4-80GB", converted_plan(0.5)) is None  # type: ignore[arg-type]  # no FP8
    assert peak_for("NVIDIA H100 NVL", converted_plan(0.5)) is None  # type: ignore[arg-type]  # unknown GPU


def test_blackwell_rows_have_dense_fp8_and_fp4() -> None:
    b200 = peaks_by_math("NVIDIA B200")
    assert (b200["bf16"], b200["fp8"], b200["fp4"]) == (2250e12, 4500e12, 9000e12)  # sparse: twice these
    assert "fp4" not in peaks_by_math(H100)


def test_an_ampere_gpu_refuses_fp8_naming_what_would_work(monkeypatch: pytest.MonkeyPatch) -> None:
    install_gpus(monkeypatch, [a100(0)])
    backend = PluginHost().backends["cuda"]
    device = backend.setup_device(World(local_rank=0), {})
    with pytest.raises(ConfigError) as refused:
        backend.check_precision("fp8-tensorwise", device)
    message = str(refused.value)
    assert "does not support precision 'fp8-tensorwise'" in message
    assert "compute capability >= 8.9 (L4, L40S, H100, H200, B200" in message
    assert "On this device use one of: fp32, fp16-mixed, bf16-mixed, bf16-true" in message


def test_a_hopper_gpu_declares_fp8_and_plans_it(monkeypatch: pytest.MonkeyPatch) -> None:
    install_gpus(monkeypatch, [h200(0)])
    backend = PluginHost().backends["cuda"]
    device = backend.setup_device(World(local_rank=0), {})
    for name in ("fp8-tensorwise", "fp8-rowwise"):
        backend.check_precision(name, device)
        plan = backend.precision_plan(name, device, {})
        assert plan.fp8_recipe == name.removeprefix("fp8-") and plan.autocast_dtype == "bfloat16"


def test_an_fp8_run_without_torchao_is_refused_naming_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    torchao_standin.remove(monkeypatch)
    backend = PluginHost().backends["cuda"]
    config = RunConfig(model="custom", precision="fp8-rowwise")
    with pytest.raises(ConfigError, match=r"install it with: pip install 'accelbench-cuda\[fp8\]'"):
        backend.check_run(config)
    backend.check_run(RunConfig(model="custom", precision="bf16-mixed"))  # nothing to refuse without FP8
    torchao_standin.install(monkeypatch)
    backend.check_run(config)  # torchao present: nothing to refuse


def test_a_catalogue_hopper_gets_an_fp8_plan_and_an_ampere_refuses_it() -> None:
    from accelbench_cuda.peaks import known_devices

    backend = PluginHost().backends["cuda"]
    by_name = {d.details["aliases"].split(",")[0]: d for d in known_devices()}
    assert backend.catalogue_precision_plan("fp8-rowwise", by_name["H100"], {}).fp8_recipe == "rowwise"
    with pytest.raises(ConfigError, match="does not run it"):
        backend.catalogue_precision_plan("fp8-tensorwise", by_name["A100"], {})


def test_an_fp8_estimate_for_a_catalogue_gpu_weighs_the_peaks_by_the_planned_layers() -> None:
    """`accelbench estimate --device H100 --precision fp8-tensorwise`: the linears are chosen on a meta-device build
    (no torchao, no GPU), and the peak is the FLOP-weighted fp8/bf16 one a run would record."""
    from accelbench.estimate.command import resolve_target
    from accelbench.testing import tiny_config

    host = PluginHost()
    config = host.resolve(tiny_config(precision="fp8-tensorwise"))
    target = resolve_target(host, config, device_name="H100")
    layers = target.plan.fp8_layers
    assert layers is not None and layers.converted == [
        "blocks.0.attn.qkv",
        "blocks.0.attn.proj",
        "blocks.0.mlp.fc",
        "blocks.0.mlp.proj",
    ]
    expected = flop_weighted_peak(
        {"fp8": layers.fp8_flop_share, "bf16": 1 - layers.fp8_flop_share}, peaks_by_math(H100)
    )
    assert target.peak is not None and target.peak.flops_per_s == pytest.approx(expected)
    assert any("of the model FLOPs in FP8" in note for note in target.notes)


# MX training (--precision mxfp8): Blackwell's block-scaled tensor cores, through torchao's MXFP8 training

B200 = "NVIDIA B200"
MX_LLAMA = dict(n_layer=1, n_head=2, n_embd=32, n_kv_heads=2, ffn_dim=64, seq_len=16)


def test_blackwell_gpus_declare_mxfp8_and_plan_its_format(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, capability in ((B200, (10, 0)), ("NVIDIA RTX PRO 6000 Blackwell Server Edition", (12, 0))):
        install_gpus(monkeypatch, [h200(0, name=name, capability=capability)])
        backend = PluginHost().backends["cuda"]
        device = backend.setup_device(World(local_rank=0), {})
        backend.check_precision("mxfp8", device)
        plan = backend.precision_plan("mxfp8", device, {})
        assert plan.fp8_recipe == "mxfp8_rceil" and plan.mx is not None and plan.mx.block_size == 32
        assert plan.param_dtype == "bfloat16"


def test_a_hopper_gpu_refuses_mxfp8_naming_the_blackwell_gpus_and_the_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    install_gpus(monkeypatch, [h200(0)])
    backend = PluginHost().backends["cuda"]
    device = backend.setup_device(World(local_rank=0), {})
    with pytest.raises(ConfigError) as refused:
        backend.check_precision("mxfp8", device)
    message = str(refused.value)
    assert "does not support precision 'mxfp8'" in message
    assert "compute capability >= 10.0: B200, GB200, B300, GB300" in message
    assert "pip install 'accelbench-cuda[fp8]'" in message
    assert (
        "On this device use one of: fp32, fp16-mixed, bf16-mixed, bf16-true, fp8-tensorwise, fp8-rowwise"
        in message
    )


def test_an_mx_run_without_torchao_is_refused_naming_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    torchao_standin.remove(monkeypatch)
    backend = PluginHost().backends["cuda"]
    config = RunConfig(model="custom", precision="mxfp8")
    with pytest.raises(ConfigError, match=r"install it with: pip install 'accelbench-cuda\[fp8\]'"):
        backend.check_run(config)
    torchao_standin.install(monkeypatch)
    backend.check_run(config)  # torchao with MXFP8 training present: nothing to refuse


def test_the_mfu_peak_of_an_mx_run_is_the_fp8_rate_weighed_with_bf16() -> None:
    peak = peak_for(B200, converted_plan(0.8, "mxfp8"))  # type: ignore[arg-type]
    assert peak is not None
    assert peak.flops_per_s == pytest.approx(1 / (0.8 / 4500e12 + 0.2 / 2250e12))
    assert "80.0% of FLOPs in dense mxfp8 (the fp8 rate) tensor at 4500 TFLOP/s" in peak.source
    assert peak_for(B200, standard_plan("mxfp8", "ieee-fp32")) is None  # no layers known before conversion


def test_an_mxfp8_estimate_for_a_b200_weighs_the_peaks_by_the_planned_layers() -> None:
    """`accelbench estimate --workload llama --precision mxfp8 --device B200`: the linears chosen on a meta-device
    build, the peak FLOP-weighted over the FP8 rate and BF16; a Hopper refuses it."""
    from accelbench.estimate.command import resolve_target

    host = PluginHost()
    config = host.resolve(
        RunConfig(
            workload="llama", model="custom", precision="mxfp8", batch_size=4, workload_options=MX_LLAMA
        )
    )
    target = resolve_target(host, config, device_name="B200")
    layers = target.plan.fp8_layers
    assert layers is not None and layers.recipe == "mxfp8_rceil" and layers.converted_count == 7
    assert list(layers.kept) == ["output"] and target.plan.mx is not None
    expected = flop_weighted_peak(
        {"fp8": layers.fp8_flop_share, "bf16": 1 - layers.fp8_flop_share}, peaks_by_math(B200)
    )
    assert target.peak is not None and target.peak.flops_per_s == pytest.approx(expected)
    with pytest.raises(ConfigError, match=r"NVIDIA H100 80GB HBM3 \(sm_90\) does not run it"):
        resolve_target(host, config, device_name="H100")
