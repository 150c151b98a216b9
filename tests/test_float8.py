"""FP8 training (--precision fp8-tensorwise / fp8-rowwise): which linears convert, what the record says, and every
refusal, against a faithful stand-in of torchao's float8 API (accelbench.testing.torchao_standin). The CPU backend
has no FP8 math, so it refuses FP8 up front; the conversion path itself trains for real on the CPU here."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from accelbench.contract import FP8_PRECISIONS, PRECISIONS, ExecutorRequest, World, standard_plan
from accelbench.engine.executor import TorchExecutor
from accelbench.engine.float8 import (
    FLOP_SHARE_BASIS,
    HEAD_REASON,
    check_fp8_run,
    convert_to_fp8,
    require_torchao,
)
from accelbench.errors import ConfigError
from accelbench.plugins import get_host
from accelbench.testing import tiny_config, torchao_standin

GPT_LINEARS = ["blocks.0.attn.qkv", "blocks.0.attn.proj", "blocks.0.mlp.fc", "blocks.0.mlp.proj"]


@pytest.fixture
def torchao(monkeypatch: pytest.MonkeyPatch) -> object:
    return torchao_standin.install(monkeypatch)


def fp8_executor(precision: str = "fp8-tensorwise", **values: object) -> tuple[TorchExecutor, object]:
    host = get_host()
    config = host.resolve(tiny_config(batch_size=8, epochs=1, **values))
    job = host.workload(config.workload).build(config)
    request = ExecutorRequest(
        config=config,
        device=torch.device("cpu"),
        precision=standard_plan(precision, "ieee-fp32"),
        world=World(),
        backend=host.backends["cpu"],
        units=job.units,
    )
    executor = TorchExecutor(request)
    executor.setup(job)
    return executor, job


def test_fp8_precisions_are_named_and_planned_as_fp8_linears_under_bf16_autocast() -> None:
    assert set(FP8_PRECISIONS) <= set(PRECISIONS)
    for name, recipe in (("fp8-tensorwise", "tensorwise"), ("fp8-rowwise", "rowwise")):
        plan = standard_plan(name, "ieee-fp32")
        assert (plan.fp8_recipe, plan.autocast_dtype, plan.param_dtype) == (recipe, "bfloat16", "float32")
        assert plan.fp8_layers is None  # known once the model is converted
    assert standard_plan("bf16-mixed", "ieee-fp32").fp8_recipe is None


@pytest.mark.usefixtures("torchao")
def test_the_linears_convert_and_the_head_stays_in_bf16() -> None:
    executor, job = fp8_executor()
    model = executor.model
    for fqn in GPT_LINEARS:
        assert isinstance(model.get_submodule(fqn), torchao_standin.Float8Linear), fqn
    assert type(model.get_submodule("lm_head")) is torch.nn.Linear
    plan = executor.effective_precision(executor.request.precision)
    layers = plan.fp8_layers
    assert layers is not None and layers.recipe == "tensorwise"
    assert layers.converted == GPT_LINEARS and layers.converted_count == 4
    assert layers.kept == {"lm_head": HEAD_REASON} and layers.kept_count == 1
    # 6 x (16x48 + 16x16 + 16x64 + 64x16) FLOPs a token x 16 tokens, over the GPT's model FLOPs per sample
    assert layers.fp8_flop_share == pytest.approx(6 * 3072 * 16 / job.flops_per_sample)
    assert 0 < layers.fp8_flop_share < 1 and layers.flop_share_basis == FLOP_SHARE_BASIS
    # read off torchao's config: the OCP pair, as torchao picks it on anything but an MI300
    assert layers.fp8_dtypes == {
        "input": "float8_e4m3fn",
        "weight": "float8_e4m3fn",
        "grad_output": "float8_e5m2",
    }
    record = plan.model_dump(mode="json")  # what the result record carries, and reads back
    assert record["fp8_layers"]["converted"] == GPT_LINEARS and record["fp8_recipe"] == "tensorwise"
    assert (record["fp8_layers"]["converted_count"], record["fp8_layers"]["kept_count"]) == (4, 1)
    assert type(plan).model_validate(record) == plan


@pytest.mark.usefixtures("torchao")
def test_an_fp8_model_trains_for_real_under_bf16_autocast() -> None:
    executor, job = fp8_executor("fp8-rowwise")
    inputs, targets = next(job.data.batches(0))
    before = executor.model.get_submodule("blocks.0.mlp.fc").weight.detach().clone()
    losses = [float(executor.train_step(inputs, targets)) for _ in range(3)]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert not torch.equal(before, executor.model.get_submodule("blocks.0.mlp.fc").weight)
    assert executor.effective_precision(executor.request.precision).fp8_layers.recipe == "rowwise"


def test_linears_not_divisible_by_16_stay_in_bf16(torchao: object) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.ReLU(), torch.nn.Linear(48, 24))
    units = get_host().workload("gpt").units(get_host().resolve(tiny_config()))
    layers = convert_to_fp8(model, "tensorwise", units, flops_per_sample=1e6, tokens_per_sample=4)
    assert layers.converted == ["0"]
    assert layers.kept == {"2": "in_features 48 x out_features 24: FP8 matmuls need both divisible by 16"}
    assert type(model[2]) is torch.nn.Linear and isinstance(model[0], torchao_standin.Float8Linear)
    assert layers.fp8_flop_share == pytest.approx(6 * 32 * 48 * 4 / 1e6)


def test_linear_subclasses_are_listed_as_kept_with_the_reason(torchao: object) -> None:
    model = torch.nn.ModuleDict({"mha": torch.nn.MultiheadAttention(32, 2), "fc": torch.nn.Linear(32, 32)})
    units = get_host().workload("gpt").units(get_host().resolve(tiny_config()))
    layers = convert_to_fp8(model, "tensorwise", units, flops_per_sample=1e6, tokens_per_sample=1)
    assert layers.converted == ["fc"] and list(layers.kept) == ["mha.out_proj"]
    assert "NonDynamicallyQuantizableLinear, not a plain nn.Linear" in layers.kept["mha.out_proj"]
    assert not isinstance(model["mha"].out_proj, torchao_standin.Float8Linear)


@pytest.mark.usefixtures("torchao")
def test_a_model_with_no_convertible_linear_is_refused() -> None:
    with pytest.raises(ConfigError, match="no linear of this model can run in FP8") as refused:
        fp8_executor(n_embd=24, n_head=2)  # 24-wide: no dimension divisible by 16
    assert "multiples of 16" in str(refused.value)


def test_the_stand_in_keeps_torchaos_rules(torchao: object) -> None:
    with pytest.raises(AssertionError, match="not in valid names"):
        torchao_standin.Float8LinearConfig.from_recipe_name("fp8-tensorwise")
    with pytest.raises(RuntimeError, match="divisible by 16"):
        torchao_standin.Float8Linear.from_float(torch.nn.Linear(24, 16))
    seen: list[tuple[type, str]] = []

    def spy(module: torch.nn.Module, fqn: str) -> bool:
        seen.append((type(module), fqn))
        return False

    torchao_standin.convert_to_float8_training(
        torch.nn.Sequential(torch.nn.Linear(16, 16)), module_filter_fn=spy
    )
    assert seen == [(torch.nn.Linear, "0")]


def test_a_missing_torchao_is_refused_naming_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    torchao_standin.remove(monkeypatch)
    with pytest.raises(ConfigError, match=r"pip install 'accelbench-cuda\[fp8\]'"):
        require_torchao()


def test_the_cpu_backend_refuses_fp8_naming_what_would_work() -> None:
    backend = get_host().backends["cpu"]
    assert not set(FP8_PRECISIONS) & set(backend.supported_precisions(torch.device("cpu")))
    for name in FP8_PRECISIONS:
        with pytest.raises(ConfigError) as refused:
            backend.check_precision(name, torch.device("cpu"))
        message = str(refused.value)
        assert f"does not support precision {name!r}" in message
        assert "compute capability >= 8.9" in message and "pip install 'accelbench-cuda[fp8]'" in message
        assert "bf16-mixed" in message  # what runs here


@pytest.mark.parametrize(
    ("values", "refusal"),
    [
        ({"engine": "lightning"}, "--engine lightning: FP8 linears are converted by the native engine only"),
        ({"strategy": "deepspeed-zero2", "devices": 2}, "--strategy deepspeed-zero2: FP8 training runs with"),
        (
            {"strategy": "tp", "devices": 2},
            "--strategy tp: FP8 training runs with strategies single, ddp, fsdp",
        ),
    ],
)
def test_strategies_and_engines_that_would_not_convert_are_refused(
    values: dict[str, object], refusal: str
) -> None:
    with pytest.raises(ConfigError, match=refusal.replace("[", r"\[")):
        check_fp8_run(tiny_config(precision="fp8-tensorwise", **values))
    check_fp8_run(tiny_config(precision="bf16-mixed", **values))  # nothing to refuse without FP8


def test_a_cpu_run_with_fp8_is_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from core_support import TINY, accelbench_here

    code, stderr = accelbench_here(
        capsys, "run", *TINY, "--precision", "fp8-tensorwise", "--output-dir", str(tmp_path)
    )
    assert code == 2, stderr[-2000:]
    assert "FP8 training needs an NVIDIA GPU with compute capability >= 8.9" in stderr
    assert not list(tmp_path.glob("*.json"))


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
    reason="FP8 training for real needs an NVIDIA GPU with compute capability >= 8.9 and torchao",
)
def test_fp8_trains_on_a_real_gpu() -> None:  # pragma: no cover - needs the hardware
    pytest.importorskip(
        "torchao.float8", reason="torchao is not installed (pip install 'accelbench-cuda[fp8]')"
    )
    host = get_host()
    if "cuda" not in host.backends:
        pytest.skip("the CUDA plugin (accelbench-cuda) is not installed")
    config = host.resolve(tiny_config(batch_size=8, epochs=1))
    job = host.workload(config.workload).build(config)
    request = ExecutorRequest(
        config=config,
        device=torch.device("cuda"),
        precision=standard_plan("fp8-tensorwise", "ieee-fp32"),
        world=World(),
        backend=host.backends["cuda"],
        units=job.units,
    )
    executor = TorchExecutor(request)
    executor.setup(job)
    inputs, targets = next(job.data.batches(0))
    assert torch.isfinite(executor.train_step(inputs.cuda(), targets.cuda()))
    assert type(executor.model.get_submodule("blocks.0.mlp.fc")).__name__ == "Float8Linear"


# A test device with FP8 math: the CPU backend declaring FP8 and reading a stated two-math peak table, so the runner's
# FP8 path (conversion, record, FLOP-weighted peak) runs end to end here. Its timings are real; its peaks are the table's.
TEST_PEAKS = {"fp8": 2e15, "bf16": 1e15}


@pytest.mark.slow  # a real two-epoch run
def test_an_fp8_run_records_its_layers_and_its_mfu_uses_the_flop_weighted_peak(
    torchao: object, monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    from accelbench.contract import PeakFigures
    from accelbench.engine.metrics import flop_weighted_peak
    from accelbench.engine.runner import run
    from accelbench.plugins import PluginHost

    host = PluginHost()
    cpu = host.backends["cpu"]
    standard = type(cpu).supported_precisions(cpu, torch.device("cpu"))
    monkeypatch.setattr(cpu, "supported_precisions", lambda device: [*standard, *FP8_PRECISIONS])

    def peak_figures(device: object, plan: object) -> PeakFigures | None:
        layers = plan.fp8_layers  # type: ignore[attr-defined]
        if layers is None:
            return None
        share = layers.fp8_flop_share
        flops = flop_weighted_peak({"fp8": share, "bf16": 1 - share}, TEST_PEAKS)
        return PeakFigures(flops_per_s=flops, source="test table: fp8 and bf16, FLOP-weighted")

    monkeypatch.setattr(cpu, "peak_figures", peak_figures)
    config = tiny_config(
        backend="cpu",
        precision="fp8-tensorwise",
        epochs=2,
        steps_per_epoch=2,
        output_dir=tmp_path,
        no_tensor_peak=True,
    )
    record, _, status = run(config, host)
    assert status == "ok" and record is not None, record and record.outcome
    layers = record.precision.fp8_layers
    assert layers is not None and layers.converted == GPT_LINEARS and list(layers.kept) == ["lm_head"]
    peak = record.metrics.peak
    expected = flop_weighted_peak(
        {"fp8": layers.fp8_flop_share, "bf16": 1 - layers.fp8_flop_share}, TEST_PEAKS
    )
    assert peak is not None and peak.flops_per_s == pytest.approx(expected)
    steady = record.metrics.steady
    assert steady.mfu == pytest.approx(steady.achieved_flops_per_s / expected)


# A backend whose device has FP8 math (a CPU stand-in declaring it, with a stated fp8/bf16 peak table) and torchao's
# stand-in, installed as distributions on PYTHONPATH, so two real gloo worker processes run FP8 under DDP.
FP8DEV = """
from accelbench.backends.cpu import CpuBackend
from accelbench.contract import FP8_PRECISIONS, BackendInfo, PeakFigures, hookimpl
from accelbench.engine.metrics import flop_weighted_peak
accelbench_contract = "3.0"

@hookimpl
def accelbench_register_backends(register):
    register(Fp8DevBackend)

class Fp8DevBackend(CpuBackend):
    info = BackendInfo(name="fp8dev", device_type="cpu", device_unit="test device with FP8 math", priority=-1)

    def supported_precisions(self, device):
        return [*super().supported_precisions(device), *FP8_PRECISIONS]

    def peak_figures(self, device, plan):
        if plan.fp8_layers is None:
            return None
        share = plan.fp8_layers.fp8_flop_share
        flops = flop_weighted_peak({"fp8": share, "bf16": 1 - share}, {"fp8": 2e15, "bf16": 1e15})
        return PeakFigures(flops_per_s=flops, source="fp8dev table, FLOP-weighted")
"""
TORCHAO_PACKAGE = "from accelbench.testing.torchao_standin import *  # noqa: F403\n"


@pytest.mark.slow  # two worker processes
@pytest.mark.parametrize(("strategy", "executor"), [("ddp", "DDPExecutor"), ("fsdp", "FSDPExecutor")])
def test_fp8_trains_on_two_processes(site: object, tmp_path: object, strategy: str, executor: str) -> None:
    import json

    from core_support import TINY, accelbench

    site.add_distribution("accelbench-fp8dev", {"fp8dev": "fp8dev_plugin"}, {"fp8dev_plugin": FP8DEV})  # type: ignore[attr-defined]
    package = site.path / "torchao"  # type: ignore[attr-defined]
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "float8.py").write_text(TORCHAO_PACKAGE)
    out = tmp_path / "out"  # type: ignore[operator]
    proc = accelbench(
        "run", "--backend", "fp8dev", *TINY, "--precision", "fp8-rowwise", "--strategy", strategy, "--devices", "2",
        "--epochs", "2", "--steps-per-epoch", "2", "--no-tensor-peak", "--output-dir", str(out), "--json", "-q",
        env=site.env(),  # type: ignore[attr-defined]
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(proc.stdout)
    assert record["world_size"] == 2 and record["executor"]["executor"] == executor
    layers = record["precision"]["fp8_layers"]
    assert (
        layers["recipe"] == "rowwise"
        and layers["converted"] == GPT_LINEARS
        and list(layers["kept"]) == ["lm_head"]
    )
    share = layers["fp8_flop_share"]
    peak = record["metrics"]["peak"]
    assert peak["flops_per_s"] == pytest.approx(1 / (share / 2e15 + (1 - share) / 1e15))
    steady = record["metrics"]["steady"]
    assert steady["mfu"] == pytest.approx(steady["achieved_flops_per_s"] / (2 * peak["flops_per_s"]))
