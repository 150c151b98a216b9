"""Precision plans on the IPU: what "fp32" and "fp16-mixed" really compute.

The IPU's matrix units (AMPs) come in three modes, named multiplicand.partials: FP32.32, FP16.32 (fp16
inputs, fp32 partial sums) and FP16.16 (fp16 partial sums, half the memory of FP16.32 partials). PopTorch
picks the partials with ``Options.Precision.setPartialsType`` and can round fp16 results stochastically
(``enableStochasticRounding``). 16-bit training is done as the seed study (through Lightning's IPU
support) did it: ``model.half()``, so weights, activations and gradients are fp16, with the optimizer's
moments accumulated in fp32. The plan names all of this, so a record says what ran.
"""

from __future__ import annotations

from accelbench.contract import PrecisionPlan

SUPPORTED = ["fp32", "fp16-mixed"]

_AMP = {
    ("fp32", "float"): "FP32.32",
    ("fp16-mixed", "float"): "FP16.32",
    ("fp16-mixed", "half"): "FP16.16",
}
_AMP_TEXT = {
    "FP32.32": "FP32.32: IPU AMP with fp32 multiplicands and fp32 partial sums",
    "FP16.32": "FP16.32: IPU AMP with fp16 multiplicands and fp32 partial sums (partials type float)",
    "FP16.16": "FP16.16: IPU AMP with fp16 multiplicands and fp16 partial sums (partials type half)",
}


def ipu_precision_plan(
    precision: str, partials: str = "float", stochastic_rounding: bool = False, loss_scaling: float = 1.0
) -> PrecisionPlan:
    """The plan for ``precision`` with the given PopTorch precision options."""
    amp = _AMP.get((precision, partials))
    if amp is None:
        raise ValueError(f"no IPU plan for precision {precision!r} with {partials} partials")
    rounding = f"stochastic rounding {'on' if stochastic_rounding else 'off'}"
    if precision == "fp32":
        return PrecisionPlan(
            name="fp32",
            param_dtype="float32",
            autocast_dtype=None,
            matmul_math=_AMP_TEXT[amp],
            notes=rounding,
        )
    scaling = "no loss scaling" if loss_scaling == 1.0 else f"static loss scaling x{loss_scaling:g}"
    return PrecisionPlan(
        name=precision,
        param_dtype="float16",
        autocast_dtype=None,
        loss_scaling="none",
        matmul_math=_AMP_TEXT[amp],
        notes=(
            "IPU 16-bit as in the seed study: model.half() (weights, activations, gradients fp16); AdamW moments "
            f"accumulated in fp32 (poptorch accum types); {scaling}; {rounding}"
        ),
    )


def amp_mode(plan: PrecisionPlan) -> str | None:
    """'FP32.32', 'FP16.32' or 'FP16.16' for a plan made here; None for any other plan."""
    head = plan.matmul_math.split(":", 1)[0]
    return head if head in _AMP_TEXT else None
