"""Precision plans: what a requested precision really means on a device.

A plan is recorded verbatim in the result, so "fp32" that ran with TF32 matmuls says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:
    import torch

# FP8 training (torchao's float8 recipes): the linears in FP8, everything else under bf16 autocast
FP8_PRECISIONS: tuple[str, ...] = ("fp8-tensorwise", "fp8-rowwise")
# MX training (torchao's MXFP8 training, OCP microscaling): the linears in MXFP8, everything else under bf16 autocast.
# mxfp4 is not offered: torchao 0.18's MX training (MXFP8TrainingOpConfig) casts every operand to float8_e4m3fn.
MX_PRECISIONS: tuple[str, ...] = ("mxfp8",)
PRECISIONS: tuple[str, ...] = (
    "fp32",
    "fp16-mixed",
    "bf16-mixed",
    "bf16-true",
    *FP8_PRECISIONS,
    *MX_PRECISIONS,
)
# torchao's MXFP8 training recipe accelbench runs (MXFP8TrainingRecipe.MXFP8_RCEIL, the one torchtitan's MX
# converter defaults to): block-scaled cuBLAS GEMMs for all three matmuls, E8M0 scales rounded up (RCEIL)
MXFP8_RECIPE = "mxfp8_rceil"

# What runs FP8 training, for refusals on devices that cannot: a backend without FP8 math names this
FP8_REQUIREMENT = (
    "an NVIDIA GPU with compute capability >= 8.9 (L4, L40S, H100, H200, B200; fp8-rowwise needs >= 9.0) with "
    "torchao installed (pip install 'accelbench-cuda[fp8]'), or an AMD Instinct MI300X, MI325X (gfx942) or MI355X "
    "(gfx950) on a ROCm build of torch with torchao installed (pip install 'accelbench-rocm[fp8]')"
)


# What runs MX training, for refusals on devices that cannot
MX_REQUIREMENT = (
    "an NVIDIA Blackwell GPU (compute capability >= 10.0: B200, GB200, B300, GB300; the 12.0 RTX PRO 6000 Blackwell "
    "and GeForce RTX 50 series), whose tensor cores take block-scaled MXFP8, with torchao installed (pip install "
    "'accelbench-cuda[fp8]'); Hopper and older have no MX matrix math, and AMD's MI355X (gfx950), which has, is not "
    "offered: torchao 0.18's MXFP8 training casts the backward's operands with a CUDA-only kernel"
)


def _dtype(name: str) -> torch.dtype:
    import torch

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


class Float8Layers(BaseModel):
    """Which linears of the model ran in FP8 and which stayed in BF16, and why: recorded in the plan once the model
    is converted, since MFU weighs each math's peak by its FLOPs and a reader must see what really ran in FP8."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    recipe: str = Field(
        description="torchao's training recipe: tensorwise or rowwise (float8), mxfp8_rceil (MXFP8)."
    )
    converted: list[str] = Field(
        description="Fully qualified names of the linears converted: swapped for torchao's Float8Linear (float8), "
        "or whose parameters torchao wrapped in its MXFP8 training tensor (MXFP8)."
    )
    kept: dict[str, str] = Field(
        description="Linears left in BF16 (under autocast), by fully qualified name, with the reason."
    )
    fp8_flop_share: float = Field(
        description="The share of the workload's model FLOPs per sample done by the converted linears: 6 x in x out "
        "multiply-add FLOPs (forward and backward) for each token of a sample; the rest is counted as BF16."
    )
    flop_share_basis: str = Field(description="How fp8_flop_share was counted, and what it assumes.")
    fp8_dtypes: dict[str, str] = Field(
        default_factory=dict,
        description="The FP8 dtype torchao's config casts each operand to (input, weight, grad_output: e.g. "
        "float8_e4m3fn, or float8_e4m3fnuz on an MI300-series GPU), read from the config the run converted with; "
        "empty where nothing was converted (a plan for an estimate).",
    )

    converted_count: int = Field(description="How many linears ran in FP8.")
    kept_count: int = Field(description="How many linears stayed in BF16.")

    @model_validator(mode="after")
    def _counts_agree(self) -> Float8Layers:
        if (self.converted_count, self.kept_count) != (len(self.converted), len(self.kept)):
            raise ValueError("converted_count and kept_count must count converted and kept")
        return self


class MXScaling(BaseModel):
    """The OCP microscaling (MX) format an MX run casts the linears' operands to: each block of ``block_size``
    consecutive elements along the matmul's reduction dimension shares one power-of-two scale."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    element_dtype: str = Field(
        description="dtype of the elements (torch's name): float8_e4m3fn for MXFP8, for input, weight and "
        "grad_output alike."
    )
    block_size: int = Field(
        description="Elements sharing one scale: 32, the OCP MX spec's and the hardware's."
    )
    scale_dtype: str = Field(description="dtype of the shared scales: float8_e8m0fnu (E8M0, a power of two).")
    scale_rounding: str = Field(
        description="How a block's scale is rounded from its absolute maximum (torchao's ScaleCalculationMode): "
        "rceil rounds up, so no element overflows."
    )


MXFP8_SCALING = MXScaling(
    element_dtype="float8_e4m3fn", block_size=32, scale_dtype="float8_e8m0fnu", scale_rounding="rceil"
)


class PrecisionPlan(BaseModel):
    """How a run computes. Returned by ``Backend.precision_plan``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(
        description="The precision asked for: fp32, fp16-mixed, bf16-mixed, bf16-true, fp8-tensorwise, fp8-rowwise, "
        "mxfp8."
    )
    param_dtype: str = Field(description="dtype of the model parameters: float32, bfloat16, ...")
    autocast_dtype: str | None = Field(
        description="dtype of torch.autocast regions, None when autocast is off."
    )
    loss_scaling: Literal["dynamic", "none"] = "none"
    matmul_math: str = Field(
        description="The math mode really in effect for fp32 matmuls: 'ieee-fp32', 'tf32', 'bf16x3', 'bf32', ..."
    )
    notes: str = ""
    fp8_recipe: str | None = Field(
        default=None,
        description="torchao's training recipe applied to the model's linears: a float8 recipe (tensorwise, "
        "rowwise) or an MXFP8 one (mxfp8_rceil); None: no FP8.",
    )
    mx: MXScaling | None = Field(
        default=None,
        description="The MX format of an MX run (element dtype, block size, scale dtype and rounding); None: not MX.",
    )
    fp8_e4m3_dtype: str | None = Field(
        default=None,
        description="The e4m3 FP8 dtype this device's matrix cores take, where the backend states it "
        "(float8_e4m3fnuz on gfx942, float8_e4m3fn on gfx950); a conversion casting to another is refused.",
    )
    fp8_layers: Float8Layers | None = Field(
        default=None,
        description="Which linears ran in FP8 and which did not (set once the model is converted).",
    )

    @property
    def torch_param_dtype(self) -> torch.dtype:
        return _dtype(self.param_dtype)

    @property
    def torch_autocast_dtype(self) -> torch.dtype | None:
        return _dtype(self.autocast_dtype) if self.autocast_dtype else None


def standard_plan(name: str, matmul_math: str) -> PrecisionPlan:
    """The plan every torch device follows for the standard names; vendors adjust ``matmul_math``/notes."""
    if name == "fp32":
        return PrecisionPlan(name=name, param_dtype="float32", autocast_dtype=None, matmul_math=matmul_math)
    if name == "fp16-mixed":
        return PrecisionPlan(
            name=name,
            param_dtype="float32",
            autocast_dtype="float16",
            loss_scaling="dynamic",
            matmul_math=matmul_math,
        )
    if name == "bf16-mixed":
        return PrecisionPlan(
            name=name, param_dtype="float32", autocast_dtype="bfloat16", matmul_math=matmul_math
        )
    if name == "bf16-true":
        return PrecisionPlan(
            name=name,
            param_dtype="bfloat16",
            autocast_dtype=None,
            matmul_math=matmul_math,
            notes="parameters, gradients and optimizer state in bfloat16",
        )
    if name in FP8_PRECISIONS:
        recipe = name.removeprefix("fp8-")
        scaling = {
            "tensorwise": "one dynamic scale per tensor",
            "rowwise": "dynamic per-row scales, powers of two",
        }
        return PrecisionPlan(
            name=name,
            param_dtype="float32",
            autocast_dtype="bfloat16",
            matmul_math=matmul_math,
            fp8_recipe=recipe,
            notes=f"linears in FP8 (torchao float8 training, recipe {recipe}: {scaling[recipe]}); "
            "everything else under bfloat16 autocast",
        )
    if name in MX_PRECISIONS:
        # bfloat16 parameters, not float32 ones under autocast: torchao's MXFP8 casts take bfloat16 operands only
        # (its Triton cast asserts it) and its override casts neither input nor weight to the autocast dtype
        return PrecisionPlan(
            name=name,
            param_dtype="bfloat16",
            autocast_dtype=None,
            matmul_math=matmul_math,
            fp8_recipe=MXFP8_RECIPE,
            mx=MXFP8_SCALING,
            notes=f"linears in MXFP8 (torchao MXFP8 training, recipe {MXFP8_RECIPE}: float8_e4m3fn elements in "
            "blocks of 32 along the reduction dimension, one E8M0 power-of-two scale a block, rounded up); "
            "everything else, and parameters, gradients and optimizer state, in bfloat16 (torchao's MXFP8 casts "
            "take bfloat16 operands only)",
        )
    raise ValueError(f"unknown precision {name!r}; known: {', '.join(PRECISIONS)}")
