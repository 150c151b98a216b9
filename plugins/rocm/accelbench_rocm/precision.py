"""Precisions by gfx architecture. fp32 is IEEE fp32: the plugin keeps torch's TF32 switch off on ROCm.

bf16 is offered where the matrix cores run it (CDNA from MI100, RDNA 3 and newer); elsewhere torch would emulate
it, which measures the emulation, not the GPU. fp16 runs on every supported GPU.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from accelbench.contract import PrecisionPlan, standard_plan
from accelbench.errors import ConfigError

BF16_ARCH_PREFIXES = ("gfx908", "gfx90a", "gfx94", "gfx95", "gfx11", "gfx12")
TF32_ENV = "ACCELBENCH_TF32"


def base_arch(gcn_arch_name: str) -> str:
    """``gfx90a:sramecc+:xnack-`` -> ``gfx90a`` (the target features after the colons do not change the math)."""
    return gcn_arch_name.split(":", 1)[0].strip()


def supported_precisions(arch: str) -> list[str]:
    names = ["fp32", "fp16-mixed"]
    if base_arch(arch).startswith(BF16_ARCH_PREFIXES):
        names += ["bf16-mixed", "bf16-true"]
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
    plan = standard_plan(precision, matmul_math="ieee-fp32")
    notes = [plan.notes] if plan.notes else []
    notes.append(f"{base_arch(arch)}: fp32 matmuls in IEEE fp32 (TF32/XF32 kept off)")
    return plan.model_copy(update={"notes": "; ".join(notes)})
