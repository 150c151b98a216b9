"""Precision plans: what a requested precision really means on a device.

A plan is recorded verbatim in the result, so "fp32" that ran with TF32 matmuls says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    import torch

PRECISIONS: tuple[str, ...] = ("fp32", "fp16-mixed", "bf16-mixed", "bf16-true")


def _dtype(name: str) -> torch.dtype:
    import torch

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


class PrecisionPlan(BaseModel):
    """How a run computes. Returned by ``Backend.precision_plan``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="The precision asked for: fp32, fp16-mixed, bf16-mixed, bf16-true.")
    param_dtype: str = Field(description="dtype of the model parameters: float32, bfloat16, ...")
    autocast_dtype: str | None = Field(
        description="dtype of torch.autocast regions, None when autocast is off."
    )
    loss_scaling: Literal["dynamic", "none"] = "none"
    matmul_math: str = Field(
        description="The math mode really in effect for fp32 matmuls: 'ieee-fp32', 'tf32', 'bf16x3', 'bf32', ..."
    )
    notes: str = ""

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
    raise ValueError(f"unknown precision {name!r}; known: {', '.join(PRECISIONS)}")
