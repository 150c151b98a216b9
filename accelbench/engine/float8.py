"""FP8 training (``--precision fp8-tensorwise`` / ``fp8-rowwise``) through torchao's float8 training recipes.

torchao swaps ``nn.Linear`` modules for its ``Float8Linear``, whose three matmuls (forward, input gradient, weight
gradient) cast their operands to FP8 with dynamic scales; everything else (attention's score and value products,
norms, embeddings, the loss) runs under the plan's bfloat16 autocast, as torchao's own recipes do. Which linears are
converted is decided here, before torchao is called, so the record can say exactly which ran in FP8 and why the
others did not: FP8 matmuls need both dimensions divisible by 16, and the output head stays in BF16 (torchtitan's
float8 converter leaves its ``output`` layer out by default: the logits are the most precision-sensitive matmul).

torchao is imported only here and only for an FP8 run; it is an optional extra of the plugins that declare FP8
precisions (``pip install 'accelbench-cuda[fp8]'``, ``pip install 'accelbench-rocm[fp8]'``). Which FP8 dtypes ran is
read off torchao's config (its cast configs' ``target_dtype``): the OCP ``float8_e4m3fn``/``float8_e5m2``, or on an
MI300-series GPU the FNUZ ``float8_e4m3fnuz``/``float8_e5m2fnuz``, which torchao picks when it is imported.

MX training (``--precision mxfp8``) runs through torchao 0.18's MXFP8 training, which works differently:
``quantize_(model, MXFP8TrainingOpConfig.from_recipe(MXFP8TrainingRecipe("mxfp8_rceil")), filter_fn=...)`` keeps
the ``nn.Linear`` modules and wraps each chosen module's parameters in ``MXFP8TrainingWeightWrapperTensor``, whose
``F.linear`` override casts input, weight and grad_output to float8_e4m3fn in blocks of 32 with E8M0 scales for the
three block-scaled GEMMs. Its rules shape the choice: every dimension a block runs along must be a multiple of 32
(in and out features, and the rows of a micro-batch, which the weight gradient reduces over), and the override
computes ``input @ weight.T`` only, dropping ``F.linear``'s bias, so a linear with a bias stays in BF16. (torchao
0.15 and 0.16 had ``torchao.prototype.mx_formats.MXLinearConfig`` instead; 0.17 replaced it.)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from accelbench.contract import (
    FP8_PRECISIONS,
    MX_PRECISIONS,
    Float8Layers,
    PrecisionPlan,
)
from accelbench.contract.precision import MXFP8_SCALING
from accelbench.contract.strategies import Strategy
from accelbench.errors import BackendError, ConfigError

if TYPE_CHECKING:
    import torch

    from accelbench.config import RunConfig
    from accelbench.workloads import ModelUnits, Workload

FP8_DIM_MULTIPLE = 16  # FP8 GEMMs (cuBLAS, CUTLASS) need both dimensions of the weight divisible by 16
TORCHAO_INSTALL = "pip install 'accelbench-cuda[fp8]'"
# The strategies that convert the model before wrapping it (torchao composes with DDP and FSDP2); tensor and
# pipeline parallelism would need torchao's float8 tensor-parallel styles, DeepSpeed and Lightning their own paths.
FP8_STRATEGIES = (Strategy.SINGLE, Strategy.DDP, Strategy.FSDP)
# torchao's MXFP8 training parameters compose with FSDP2 (they implement its all-gather hooks; torchtitan's path);
# DDP over them is not one of torchao's tested compositions
MX_STRATEGIES = (Strategy.SINGLE, Strategy.FSDP)
MX_BLOCK = MXFP8_SCALING.block_size
MX_BIAS_REASON = (
    "has a bias: torchao 0.18's MXFP8 training computes the linear as input @ weight.T and drops F.linear's bias, "
    "so it stays in BF16"
)
HEAD_REASON = "the output head stays in BF16, as torchtitan's float8 converter leaves its output layer"
FLOP_SHARE_BASIS = (
    "6 x in_features x out_features FLOPs (forward and backward, 2 a multiply-add) per token for each converted "
    "linear, times the workload's tokens per sample, over the workload's model FLOPs per sample (at most all of "
    "them): each token passes each converted linear once, as in a dense decoder (a routed expert sees only its "
    "tokens, so for a mixture of experts this overstates FP8's share)"
)


def is_fp8(precision: str) -> bool:
    """An FP8 precision: one of torchao's float8 recipes or MXFP8 (its elements are FP8 too)."""
    return precision in FP8_PRECISIONS or precision in MX_PRECISIONS


def is_mx_recipe(recipe: str) -> bool:
    """A plan's ``fp8_recipe`` that names torchao's MXFP8 training (mxfp8_rceil) rather than a float8 recipe."""
    return recipe.startswith("mxfp8")


def require_torchao(install: str = TORCHAO_INSTALL) -> Any:
    """torchao's ``torchao.float8`` module, or a ConfigError naming the install command (the backend's extra)."""
    try:
        import torchao.float8 as float8
    except ImportError as exc:
        raise ConfigError(
            f"FP8 training (--precision {'/'.join(FP8_PRECISIONS)}) runs through torchao's float8 training, and "
            f"torchao.float8 cannot be imported ({exc}); install it with: {install}"
        ) from None
    return float8


def require_torchao_mx(install: str = TORCHAO_INSTALL) -> tuple[Any, Any]:
    """torchao's MXFP8 training config module and ``quantize_``, or a ConfigError naming what is missing: torchao
    0.17 or newer (the install command), or a torch whose DTensor has what torchao asserts before it wraps a
    parameter (``scaled_mm_single_dim_strategy`` and ``is_pinned_handler``)."""
    try:
        import torchao.prototype.moe_training.config as mx_config
        from torchao.quantization import quantize_
    except ImportError as exc:
        raise ConfigError(
            f"MX training (--precision {'/'.join(MX_PRECISIONS)}) runs through torchao's MXFP8 training "
            f"(torchao.prototype.moe_training, torchao 0.17 or newer), and it cannot be imported ({exc}); install "
            f"it with: {install}"
        ) from None
    try:
        from torch.distributed.tensor import _dispatch, _ops

        supported = hasattr(_ops, "scaled_mm_single_dim_strategy") and hasattr(_dispatch, "is_pinned_handler")
    except ImportError:  # a torch built without distributed
        supported = False
    if not supported:
        import torch

        raise ConfigError(
            f"MX training: torchao's MXFP8 training needs a torch whose DTensor has scaled_mm's single-dimension "
            f"sharding strategy and the pinned-handler dispatch (torch {torch.__version__} has not: torchao asserts "
            "it before converting); use a newer torch (2.13 has both), or fp8-tensorwise / fp8-rowwise"
        )
    return mx_config, quantize_


def check_fp8_run(config: RunConfig) -> None:
    """Refuse, before anything starts, an FP8 or MX run whose strategy or engine would not convert the model."""
    if not is_fp8(config.precision):
        return
    if config.engine != "native":
        raise ConfigError(
            f"--precision {config.precision} with --engine {config.engine}: FP8 linears are converted by the "
            "native engine only; use --engine native"
        )
    if config.precision in MX_PRECISIONS and config.strategy not in MX_STRATEGIES:
        raise ConfigError(
            f"--precision {config.precision} with --strategy {config.strategy}: MX training runs with strategies "
            f"{', '.join(str(s) for s in MX_STRATEGIES)} (torchao's MXFP8 parameters implement FSDP2's all-gather "
            "hooks; DDP and the other strategies over them are not among torchao's tested compositions); use one of "
            "them, or fp8-tensorwise / fp8-rowwise with ddp"
        )
    if config.strategy not in FP8_STRATEGIES:
        raise ConfigError(
            f"--precision {config.precision} with --strategy {config.strategy}: FP8 training runs with strategies "
            f"{', '.join(str(s) for s in FP8_STRATEGIES)} (torchao's linears convert before DDP or FSDP2 wraps "
            "the model); use one of them, or a bf16 precision for this strategy"
        )


def fp8_layer_choice(
    model: torch.nn.Module, units: ModelUnits, recipe: str = "tensorwise"
) -> tuple[list[str], dict[str, str]]:
    """The linears to convert (fully qualified names) and those kept in BF16 with the reason, before converting
    with torchao's ``recipe``: an MX recipe needs both dimensions divisible by the block size and no bias."""
    import torch

    mx = is_mx_recipe(recipe)
    multiple = MX_BLOCK if mx else FP8_DIM_MULTIPLE
    rule = (
        f"MXFP8 matmuls scale blocks of {MX_BLOCK} along both, so both must be divisible by {MX_BLOCK}"
        if mx
        else f"FP8 matmuls need both divisible by {FP8_DIM_MULTIPLE}"
    )
    converted: list[str] = []
    kept: dict[str, str] = {}
    for fqn, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        in_features, out_features = module.in_features, module.out_features
        if type(module) is not torch.nn.Linear:
            kept[fqn] = (
                f"a {type(module).__name__}, not a plain nn.Linear: its owner may use the weight without its "
                "forward (nn.MultiheadAttention's out_proj does), so converting it could change nothing"
            )
        elif any(fqn == head or fqn.startswith(f"{head}.") for head in units.head):
            kept[fqn] = HEAD_REASON
        elif in_features % multiple or out_features % multiple:
            kept[fqn] = f"in_features {in_features} x out_features {out_features}: {rule}"
        elif mx and module.bias is not None:
            kept[fqn] = MX_BIAS_REASON
        else:
            converted.append(fqn)
    return converted, kept


def convert_to_fp8(
    model: torch.nn.Module,
    recipe: str,
    units: ModelUnits,
    flops_per_sample: float,
    tokens_per_sample: int,
    expected_e4m3: str | None = None,
    micro_batch: int | None = None,
) -> Float8Layers:
    """Swap the chosen linears of ``model`` (placed on its device, not yet wrapped or compiled) for torchao's
    Float8Linear in place, with torchao's recipe ``recipe``; return what ran in FP8 for the record.
    ``expected_e4m3`` (the plan's ``fp8_e4m3_dtype``): the e4m3 dtype the device's matrix cores take; a config
    casting the forward operands to another is refused before anything is converted. An MX recipe converts
    through :func:`convert_to_mx` (``micro_batch``: the samples of one forward, whose rows it checks)."""
    import torch

    if is_mx_recipe(recipe):
        return convert_to_mx(model, recipe, units, flops_per_sample, tokens_per_sample, micro_batch)
    float8 = require_torchao()
    config = float8.Float8LinearConfig.from_recipe_name(recipe)
    dtypes = fp8_dtypes(config)
    if expected_e4m3 is not None and dtypes.get("input", expected_e4m3) != expected_e4m3:
        raise BackendError(
            f"torchao's float8 config casts to {dtypes['input']} but this GPU's FP8 matrix cores take "
            f"{expected_e4m3}: torchao chooses the FNUZ dtypes on ROCm when device 0 is an MI300-series GPU "
            "(gfx940/941/942); use a torchao with torchao.float8.config.Float8TypeConfig (0.7 or newer), and the "
            "same GPU model for every visible device"
        )
    converted, kept = fp8_layer_choice(model, units)
    if not converted:
        raise ConfigError(
            f"--precision fp8-{recipe}: no linear of this model can run in FP8 ({len(kept)} kept: "
            + "; ".join(f"{fqn}: {why}" for fqn, why in kept.items())
            + "); choose a model with linears whose dimensions are multiples of 16, or a bf16 precision"
        )
    chosen = frozenset(converted)

    def module_filter_fn(module: torch.nn.Module, fqn: str) -> bool:
        return fqn in chosen

    result = float8.convert_to_float8_training(model, config=config, module_filter_fn=module_filter_fn)
    if result is not model:
        raise BackendError("torchao replaced the model itself rather than its linears; nothing was converted")
    unconverted = [fqn for fqn in converted if type(model.get_submodule(fqn)) is torch.nn.Linear]
    if unconverted:
        raise BackendError(
            f"torchao left {len(unconverted)} chosen linear(s) unconverted: {', '.join(unconverted)}"
        )
    layers = _layers_record(model, recipe, converted, kept, flops_per_sample, tokens_per_sample)
    return layers.model_copy(update={"fp8_dtypes": dtypes})


def check_mx_rows(micro_batch: int, tokens_per_sample: int) -> None:
    """Refuse a micro-batch whose rows (samples x tokens, what each linear multiplies) are not a multiple of the
    MX block: torchao's weight gradient scales blocks of 32 along them and asserts it mid-step otherwise."""
    rows = micro_batch * tokens_per_sample
    if rows % MX_BLOCK:
        step = MX_BLOCK // math.gcd(tokens_per_sample, MX_BLOCK)
        raise ConfigError(
            f"--precision mxfp8: a micro-batch of {micro_batch} sample(s) x {tokens_per_sample} token(s) puts {rows} "
            f"rows through each linear, and torchao's MXFP8 weight gradient scales blocks of {MX_BLOCK} along them: "
            f"choose a per-micro-batch size (--batch-size / --grad-accum) that is a multiple of {step}"
        )


def convert_to_mx(
    model: torch.nn.Module,
    recipe: str,
    units: ModelUnits,
    flops_per_sample: float,
    tokens_per_sample: int,
    micro_batch: int | None = None,
) -> Float8Layers:
    """Wrap the parameters of the chosen linears of ``model`` (placed on its device, not yet wrapped or compiled)
    in torchao's MXFP8 training tensor, in place, with torchao's recipe ``recipe`` (mxfp8_rceil); return what ran
    in MXFP8 for the record. Refused before anything is converted where no linear can, or where the rows of a
    micro-batch are not a multiple of the block."""
    import torch

    mx_config, quantize_ = require_torchao_mx()
    config = mx_config.MXFP8TrainingOpConfig.from_recipe(mx_config.MXFP8TrainingRecipe(recipe))
    rounding = getattr(getattr(config, "scale_calculation_mode", None), "value", None)
    if rounding != MXFP8_SCALING.scale_rounding:
        raise BackendError(
            f"torchao's {recipe} config rounds its E8M0 scales {rounding!r}, not {MXFP8_SCALING.scale_rounding!r} "
            "as the plan records"
        )
    if micro_batch is not None:
        check_mx_rows(micro_batch, tokens_per_sample)
    converted, kept = fp8_layer_choice(model, units, recipe)
    if not converted:
        raise ConfigError(
            f"--precision mxfp8: no linear of this model can run in MXFP8 ({len(kept)} kept: "
            + "; ".join(f"{fqn}: {why}" for fqn, why in kept.items())
            + f"); choose a model whose linears have no bias and dimensions that are multiples of {MX_BLOCK} "
            "(--workload llama), or fp8-tensorwise / fp8-rowwise"
        )
    chosen = frozenset(converted)

    def filter_fn(module: torch.nn.Module, fqn: str) -> bool:
        return fqn in chosen

    quantize_(model, config, filter_fn=filter_fn)
    unconverted = [fqn for fqn in converted if type(model.get_submodule(fqn).weight) is torch.nn.Parameter]
    if unconverted:
        raise BackendError(
            f"torchao left the weights of {len(unconverted)} chosen linear(s) unwrapped: {', '.join(unconverted)}"
        )
    layers = _layers_record(model, recipe, converted, kept, flops_per_sample, tokens_per_sample)
    dtype = MXFP8_SCALING.element_dtype  # torchao 0.18 casts all three operands to it (not in its config)
    return layers.model_copy(update={"fp8_dtypes": {"input": dtype, "weight": dtype, "grad_output": dtype}})


def fp8_dtypes(config: Any) -> dict[str, str]:
    """The FP8 dtype torchao's ``Float8LinearConfig`` casts each operand to in its forward (input, weight) and
    backward (grad_output), as torch names it without ``torch.``; an operand the config leaves in high precision,
    or a config without ``target_dtype``, is left out."""
    out: dict[str, str] = {}
    for operand in ("input", "weight", "grad_output"):
        dtype = getattr(getattr(config, f"cast_config_{operand}", None), "target_dtype", None)
        if dtype is not None:
            out[operand] = str(dtype).removeprefix("torch.")
    return out


def planned_fp8_layers(plan: PrecisionPlan, workload: Workload, config: RunConfig) -> PrecisionPlan:
    """``plan`` with the linears an FP8 run of ``workload`` would convert, chosen on a meta-device build (shapes,
    no storage, no torchao): what ``accelbench estimate`` and ``plan`` weigh the FP8 and BF16 peaks with, for a
    device that is not here. Any other plan is returned as it is."""
    import torch

    if plan.fp8_recipe is None or plan.fp8_layers is not None:
        return plan
    with torch.device("meta"):
        job = workload.build(config)
    if is_mx_recipe(plan.fp8_recipe):
        check_mx_rows(config.batch_size // config.grad_accum, job.tokens_per_sample)
    converted, kept = fp8_layer_choice(job.model, job.units, plan.fp8_recipe)
    layers = _layers_record(
        job.model, plan.fp8_recipe, converted, kept, job.flops_per_sample, job.tokens_per_sample
    )
    return plan.model_copy(update={"fp8_layers": layers})


def _layers_record(
    model: torch.nn.Module,
    recipe: str,
    converted: list[str],
    kept: dict[str, str],
    flops_per_sample: float,
    tokens_per_sample: int,
) -> Float8Layers:
    """The record of an FP8 conversion, with the converted linears' share of the model FLOPs per sample."""
    import torch

    multiply_adds = 0
    for fqn in converted:
        module = model.get_submodule(fqn)
        assert isinstance(module, torch.nn.Linear)
        multiply_adds += module.in_features * module.out_features
    fp8_flops = 6.0 * multiply_adds * tokens_per_sample
    share = min(1.0, fp8_flops / flops_per_sample) if flops_per_sample > 0 else 0.0
    return Float8Layers(
        recipe=recipe,
        converted=converted,
        kept=kept,
        converted_count=len(converted),
        kept_count=len(kept),
        fp8_flop_share=share,
        flop_share_basis=FLOP_SHARE_BASIS,
    )
