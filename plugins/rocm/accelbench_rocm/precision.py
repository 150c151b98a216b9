"""Precisions by gfx architecture. fp32 is IEEE fp32: the plugin keeps torch's TF32 switch off on ROCm.

bf16 is offered where the matrix cores run it (CDNA from MI100, RDNA 3 and newer); elsewhere torch would emulate
it, which measures the emulation, not the GPU. fp16 runs on every supported GPU.

FP8 training (``fp8-tensorwise``, ``fp8-rowwise``, through torchao's float8 training as on CUDA) is offered where the
matrix cores have FP8 (F8/BF8 need gfx942 or gfx950, AMD's hipBLASLt and rocWMMA documentation says): CDNA 3
(gfx940/941/942: MI300X, MI325X, MI300A) in the FNUZ formats (``float8_e4m3fnuz``, ``float8_e5m2fnuz``: no negative
zero, one NaN, exponent bias one more than OCP's), and CDNA 4 (gfx950: MI350X, MI355X) in the OCP formats
(``float8_e4m3fn``, ``float8_e5m2``). torchao picks the pair itself when ``torchao.float8.config`` is imported
(``Float8TypeConfig``: FNUZ when ``torch.version.hip`` is set and device 0 is gfx940/941/942, else OCP); the plan
records the pair the architecture needs, and the executor refuses a conversion whose dtype differs
(:func:`accelbench.engine.float8.convert_to_fp8`). RDNA 4 (gfx1200/1201) has OCP FP8 too but is not offered: it is
untested here and not one of torchao's float8 training targets. MX training (``mxfp8``) is not offered either,
though gfx950 has MX matrix cores and torch's block-scaled ``_scaled_mm`` runs there (ROCm 7): torchao 0.18's MXFP8
linear casts the backward's operands with ``MXFP8Dim1CastKernelChoice.CUDA``, a kernel it loads only on sm_100+.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from accelbench.contract import FP8_PRECISIONS, PrecisionPlan, standard_plan
from accelbench.errors import ConfigError

BF16_ARCH_PREFIXES = ("gfx908", "gfx90a", "gfx94", "gfx95", "gfx11", "gfx12")
TF32_ENV = "ACCELBENCH_TF32"
# The e4m3 dtype (forward operands; gradients use the e5m2 of the same family) by architecture, as torchao chooses it
FP8_E4M3_BY_ARCH = {
    "gfx940": "float8_e4m3fnuz",
    "gfx941": "float8_e4m3fnuz",
    "gfx942": "float8_e4m3fnuz",
    "gfx950": "float8_e4m3fn",
}
FP8_FORMATS = {
    "float8_e4m3fnuz": "FNUZ (float8_e4m3fnuz, float8_e5m2fnuz)",
    "float8_e4m3fn": "OCP (float8_e4m3fn, float8_e5m2)",
}
TORCHAO_INSTALL = "pip install 'accelbench-rocm[fp8]'"


def base_arch(gcn_arch_name: str) -> str:
    """``gfx90a:sramecc+:xnack-`` -> ``gfx90a`` (the target features after the colons do not change the math)."""
    return gcn_arch_name.split(":", 1)[0].strip()


def supported_precisions(arch: str) -> list[str]:
    names = ["fp32", "fp16-mixed"]
    if base_arch(arch).startswith(BF16_ARCH_PREFIXES):
        names += ["bf16-mixed", "bf16-true"]
    if base_arch(arch) in FP8_E4M3_BY_ARCH:
        names += list(FP8_PRECISIONS)
    return names


def check_tf32_policy(environ: Mapping[str, str] = os.environ) -> None:
    """Refuse a request for TF32 rather than ignore it: this plugin runs fp32 matmuls in IEEE fp32 on ROCm."""
    if environ.get(TF32_ENV, "off").strip().lower() != "off":
        raise ConfigError(
            f"{TF32_ENV}={environ[TF32_ENV]!r}: the ROCm plugin runs fp32 matmuls in IEEE fp32 only (no TF32/XF32); "
            f"unset {TF32_ENV}, or use bf16-mixed for matrix-core speed"
        )


def make_plan(precision: str, arch: str) -> PrecisionPlan:
    """The plan for ``precision`` on a GPU of ``arch``; sets torch's fp32 matmul switch to IEEE, as recorded."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False  # on ROCm builds this also governs hipBLASLt's XF32 path
    return plan_for(precision, arch)


def plan_for(precision: str, arch: str) -> PrecisionPlan:
    """The plan for ``precision`` on ``arch``, setting nothing (what a catalogue device that is not here gets)."""
    gfx = base_arch(arch)
    plan = standard_plan(precision, matmul_math="ieee-fp32")
    notes = [plan.notes] if plan.notes else []
    update: dict[str, object] = {}
    if plan.fp8_recipe is not None:
        e4m3 = FP8_E4M3_BY_ARCH.get(gfx)
        if e4m3 is None:
            raise ConfigError(
                f"--precision {precision}: {gfx} has no FP8 matrix cores; FP8 training runs on gfx942 (MI300X, "
                "MI325X) and gfx950 (MI355X)"
            )
        notes.append(f"{gfx}: FP8 in the {FP8_FORMATS[e4m3]} formats")
        update["fp8_e4m3_dtype"] = e4m3
    notes.append(f"{gfx}: fp32 matmuls in IEEE fp32 (TF32/XF32 kept off)")
    return plan.model_copy(update={**update, "notes": "; ".join(notes)})
