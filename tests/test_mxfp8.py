"""MX training (--precision mxfp8): the plan, which linears convert and why the others do not, what the record says,
and every refusal, against the torchao stand-in's MXFP8 training (accelbench.testing.torchao_standin: quantize_ with
torchao 0.18's MXFP8TrainingOpConfig, which wraps the chosen linears' parameters). The CPU backend has no MX math, so
it refuses mxfp8 up front; the conversion path itself trains a small Llama for real on the CPU here."""

from __future__ import annotations

import pytest
import torch

from accelbench.config import RunConfig
from accelbench.contract import (
    MX_PRECISIONS,
    MXFP8_RECIPE,
    PRECISIONS,
    ExecutorRequest,
    PrecisionPlan,
    World,
    standard_plan,
)
from accelbench.engine.executor import TorchExecutor
from accelbench.engine.float8 import (
    HEAD_REASON,
    MX_BIAS_REASON,
    check_fp8_run,
    convert_to_mx,
    planned_fp8_layers,
    require_torchao_mx,
)
from accelbench.errors import ConfigError
from accelbench.plugins import get_host
from accelbench.testing import tiny_config, torchao_standin
from accelbench.workloads import ModelUnits

LLAMA = dict(n_layer=1, n_head=2, n_embd=32, n_kv_heads=2, ffn_dim=64, seq_len=16)
LLAMA_LINEARS = [
    "layers.0.attention.wq",
    "layers.0.attention.wk",
    "layers.0.attention.wv",
    "layers.0.attention.wo",
    "layers.0.feed_forward.w1",
    "layers.0.feed_forward.w2",
    "layers.0.feed_forward.w3",
]
UNITS = ModelUnits(stem=(), units=(), head=("head",))


@pytest.fixture
def torchao(monkeypatch: pytest.MonkeyPatch) -> object:
    return torchao_standin.install(monkeypatch)


def llama_config(**values: object) -> RunConfig:
    options = {**LLAMA, **values.pop("workload_options", {})}  # type: ignore[dict-item]
    base: dict[str, object] = dict(workload="llama", model="custom", batch_size=4, epochs=1)
    return RunConfig(**{**base, **values, "workload_options": options})  # type: ignore[arg-type]


def mx_executor(**values: object) -> tuple[TorchExecutor, object]:
    host = get_host()
    config = host.resolve(llama_config(**values))
    job = host.workload(config.workload).build(config)
    request = ExecutorRequest(
        config=config,
        device=torch.device("cpu"),
        precision=standard_plan("mxfp8", "ieee-fp32"),
        world=World(),
        backend=host.backends["cpu"],
        units=job.units,
    )
    executor = TorchExecutor(request)
    executor.setup(job)
    return executor, job


def test_mxfp8_is_planned_as_block_scaled_e4m3_linears_with_bfloat16_parameters() -> None:
    assert set(MX_PRECISIONS) == {"mxfp8"} and set(MX_PRECISIONS) <= set(PRECISIONS)
    plan = standard_plan("mxfp8", "ieee-fp32")
    assert plan.fp8_recipe == MXFP8_RECIPE == "mxfp8_rceil" and plan.fp8_layers is None
    assert plan.mx is not None
    assert (plan.mx.element_dtype, plan.mx.block_size, plan.mx.scale_dtype, plan.mx.scale_rounding) == (
        "float8_e4m3fn",
        32,
        "float8_e8m0fnu",
        "rceil",
    )
    # torchao's MXFP8 casts take bfloat16 operands: bfloat16 parameters, no float32 ones under autocast
    assert (plan.param_dtype, plan.autocast_dtype) == ("bfloat16", None)
    assert standard_plan("fp8-tensorwise", "ieee-fp32").mx is None


def test_a_record_without_mx_fields_still_loads() -> None:
    old = standard_plan("fp8-rowwise", "ieee-fp32").model_dump(mode="json")
    del old["mx"]  # a record written before MX training existed
    assert PrecisionPlan.model_validate(old).mx is None


@pytest.mark.usefixtures("torchao")
def test_the_llamas_linears_convert_and_the_record_says_which_ran_in_mxfp8() -> None:
    executor, job = mx_executor()
    model = executor.model
    for fqn in LLAMA_LINEARS:
        module = model.get_submodule(fqn)
        assert type(module) is torch.nn.Linear, fqn  # torchao wraps the parameters, not the module
        assert isinstance(module.weight, torchao_standin.MXFP8TrainingWeightWrapperTensor), fqn
    assert not isinstance(
        model.get_submodule("output").weight, torchao_standin.MXFP8TrainingWeightWrapperTensor
    )
    plan = executor.effective_precision(executor.request.precision)
    layers = plan.fp8_layers
    assert layers is not None and layers.recipe == "mxfp8_rceil"
    assert layers.converted == LLAMA_LINEARS and layers.kept == {"output": HEAD_REASON}
    assert layers.fp8_dtypes == dict.fromkeys(("input", "weight", "grad_output"), "float8_e4m3fn")
    # 6 x (4 x 32x32 + 3 x 32x64) FLOPs a token x 16 tokens, over the Llama's model FLOPs per sample
    assert layers.fp8_flop_share == pytest.approx(6 * (4 * 1024 + 3 * 2048) * 16 / job.flops_per_sample)
    record = plan.model_dump(mode="json")
    assert record["mx"]["block_size"] == 32 and record["fp8_layers"]["converted"] == LLAMA_LINEARS
    assert type(plan).model_validate(record) == plan


@pytest.mark.usefixtures("torchao")
def test_an_mxfp8_llama_trains_for_real() -> None:
    executor, job = mx_executor()
    inputs, targets = next(job.data.batches(0))
    weight = executor.model.get_submodule("layers.0.feed_forward.w1").weight
    before = weight.detach().as_subclass(torch.Tensor).clone()
    losses = [float(executor.train_step(inputs, targets)) for _ in range(3)]
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    assert weight.dtype == torch.bfloat16
    assert not torch.equal(before, weight.detach().as_subclass(torch.Tensor))


def test_linears_with_a_bias_or_dimensions_off_the_block_stay_in_bf16(torchao: object) -> None:
    model = torch.nn.ModuleDict(
        {
            "fc": torch.nn.Linear(32, 64, bias=False),
            "biased": torch.nn.Linear(64, 64),
            "narrow": torch.nn.Linear(64, 48, bias=False),
            "head": torch.nn.Linear(64, 32, bias=False),
        }
    )
    layers = convert_to_mx(model, "mxfp8_rceil", UNITS, flops_per_sample=1e6, tokens_per_sample=32)
    assert layers.converted == ["fc"]
    assert layers.kept == {
        "biased": MX_BIAS_REASON,
        "narrow": "in_features 64 x out_features 48: MXFP8 matmuls scale blocks of 32 along both, so both must be "
        "divisible by 32",
        "head": HEAD_REASON,
    }
    assert isinstance(model["fc"].weight, torchao_standin.MXFP8TrainingWeightWrapperTensor)
    assert type(model["biased"].weight) is torch.nn.Parameter
    assert layers.fp8_flop_share == pytest.approx(6 * 32 * 64 * 32 / 1e6)


def test_the_stand_in_keeps_torchaos_mx_rules(torchao: object) -> None:
    with pytest.raises(ValueError, match="is not a valid MXFP8TrainingRecipe"):
        torchao_standin.MXFP8TrainingRecipe("mxfp4")
    config = torchao_standin.MXFP8TrainingOpConfig.from_recipe(
        torchao_standin.MXFP8TrainingRecipe.MXFP8_RCEIL
    )
    seen: list[str] = []

    def spy(module: torch.nn.Module, fqn: str) -> bool:
        seen.append(fqn)
        return isinstance(module, torch.nn.Linear)

    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 48, bias=False)).bfloat16()
    torchao_standin.quantize_(model, config, filter_fn=spy)
    assert seen == ["", "0", "1"]  # pre-order from the root
    assert isinstance(model[0].bias, torchao_standin.MXFP8TrainingWeightWrapperTensor)  # every parameter
    x = torch.randn(32, 32, dtype=torch.bfloat16)
    # torchao 0.18's linear override drops the bias
    torch.nn.init.constant_(model[0].bias, 100.0)
    assert model[0](x).float().abs().mean() < 10
    with pytest.raises(AssertionError, match="must be divisible by block_size 32"):
        model[1](x).sum().backward()  # the backward casts along out_features 48
    with pytest.raises(AssertionError, match="only bfloat16 inputs are supported"):
        model[0](x.float())


@pytest.mark.usefixtures("torchao")
def test_a_model_with_no_convertible_linear_is_refused_naming_what_would_convert() -> None:
    host = get_host()
    config = host.resolve(tiny_config(precision="mxfp8", n_embd=32))  # the GPT: its linears have biases
    job = host.workload(config.workload).build(config)
    with pytest.raises(ConfigError, match="no linear of this model can run in MXFP8") as refused:
        convert_to_mx(job.model, "mxfp8_rceil", job.units, job.flops_per_sample, job.tokens_per_sample)
    assert "has a bias" in str(refused.value) and "--workload llama" in str(refused.value)


@pytest.mark.usefixtures("torchao")
def test_a_micro_batch_whose_rows_are_off_the_block_is_refused_before_converting() -> None:
    with pytest.raises(
        ConfigError, match=r"a micro-batch of 1 sample\(s\) x 16 token\(s\) puts 16 rows"
    ) as refused:
        mx_executor(batch_size=1)
    assert "a multiple of 2" in str(refused.value)


def test_a_missing_torchao_is_refused_naming_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    torchao_standin.remove(monkeypatch)
    with pytest.raises(ConfigError, match=r"install it with: pip install 'accelbench-cuda\[fp8\]'"):
        require_torchao_mx()


def test_a_torch_without_what_torchao_asserts_is_refused(
    torchao: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch.distributed.tensor import _ops

    monkeypatch.delattr(_ops, "scaled_mm_single_dim_strategy", raising=False)
    with pytest.raises(ConfigError, match="scaled_mm's single-dimension sharding strategy"):
        require_torchao_mx()


def test_the_cpu_backend_refuses_mxfp8_naming_what_would_work() -> None:
    backend = get_host().backends["cpu"]
    assert "mxfp8" not in backend.supported_precisions(torch.device("cpu"))
    with pytest.raises(ConfigError) as refused:
        backend.check_precision("mxfp8", torch.device("cpu"))
    message = str(refused.value)
    assert (
        "does not support precision 'mxfp8'" in message
        and "MX training needs an NVIDIA Blackwell GPU" in message
    )
    assert "B200, GB200, B300, GB300" in message and "pip install 'accelbench-cuda[fp8]'" in message
    assert "bf16-mixed" in message  # what runs here


@pytest.mark.parametrize(
    ("values", "refusal"),
    [
        ({"engine": "lightning"}, "--engine lightning: FP8 linears are converted by the native engine only"),
        ({"strategy": "ddp", "devices": 2}, "--strategy ddp: MX training runs with strategies single, fsdp"),
        ({"strategy": "tp", "devices": 2}, "--strategy tp: MX training runs with strategies single, fsdp"),
    ],
)
def test_strategies_and_engines_that_would_not_convert_are_refused(
    values: dict[str, object], refusal: str
) -> None:
    with pytest.raises(ConfigError, match=refusal):
        check_fp8_run(llama_config(precision="mxfp8", **values))
    check_fp8_run(llama_config(precision="mxfp8", strategy="fsdp", devices=2))


def test_an_estimate_plans_the_layers_on_a_meta_build_without_torchao(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torchao_standin.remove(monkeypatch)  # the estimate imports no torchao
    host = get_host()
    config = host.resolve(llama_config(precision="mxfp8"))
    plan = planned_fp8_layers(standard_plan("mxfp8", "ieee-fp32"), host.workload("llama"), config)
    assert plan.fp8_layers is not None and plan.fp8_layers.converted == LLAMA_LINEARS
    with pytest.raises(ConfigError, match="puts 16 rows"):
        planned_fp8_layers(
            standard_plan("mxfp8", "ieee-fp32"),
            host.workload("llama"),
            host.resolve(llama_config(batch_size=1)),
        )


@pytest.mark.slow  # a fresh interpreter: ~5 s on a shared host
def test_a_cpu_run_with_mxfp8_is_refused_before_anything_runs(tmp_path: object) -> None:
    from core_support import TINY, accelbench

    proc = accelbench("run", *TINY, "--precision", "mxfp8", "--output-dir", str(tmp_path))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "MX training needs an NVIDIA Blackwell GPU (compute capability >= 10.0" in proc.stderr
    assert not list(tmp_path.glob("*.json"))  # type: ignore[attr-defined]
