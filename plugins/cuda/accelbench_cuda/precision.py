"""Precisions by compute capability, and the TF32 policy.

TF32 is a policy, never an accident: torch's defaults (TF32 off for matmuls, on for cuDNN convolutions) and any
library that flips them would otherwise decide what "fp32" means. The plugin sets both switches from one explicit
policy, ``--tf32 on|off`` or ``ACCELBENCH_TF32=on|off`` (default off), when it makes the plan, and the plan records the math in effect.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from accelbench.contract import DeviceInfo, PrecisionPlan, standard_plan
from accelbench.errors import BackendError, ConfigError

TF32_ENV = "ACCELBENCH_TF32"

FP16_MIN = (5, 3)  # native half arithmetic; tensor cores from (7, 0)
TENSOR_CORES_MIN = (7, 0)
BF16_MIN = (
    8,
    0,
)  # Ampere: bf16 and TF32 tensor cores (torch.cuda.is_bf16_supported(including_emulation=False))
TF32_MIN = (8, 0)
# FP8 tensor cores: Ada and Hopper on. torchao's tensorwise recipe (cuBLAS) needs sm_89; its rowwise recipe
# (CUTLASS rowwise-scaled GEMM) sm_90: torchao's own tests skip rowwise below sm_90.
FP8_MIN = {"fp8-tensorwise": (8, 9), "fp8-rowwise": (9, 0)}
# MX (block-scaled) tensor cores: Blackwell on (sm_100/103: B200, GB200, B300, GB300; sm_120/121: RTX PRO 6000
# Blackwell, RTX 50 series, GB10). The gate torchao's MXFP8 kernels and torch's cuBLAS MX GEMM share: torchao's Triton
# and CUDA casts load where is_sm_at_least_100() (its CUDA cast built for sm_100 and compute_120), and torch's tests
# take MX GEMMs as supported from SM 10.0 (PLATFORM_SUPPORTS_MX_GEMM).
MX_MIN = {"mxfp8": (10, 0)}


def tf32_policy(environ: Mapping[str, str] = os.environ) -> bool:
    """True when the user asked for TF32 (``ACCELBENCH_TF32=on``); False for ``off`` or unset."""
    raw = environ.get(TF32_ENV, "off")
    value = raw.strip().lower()
    if value not in ("on", "off"):
        raise ConfigError(
            f"{TF32_ENV}={raw!r} is not a TF32 policy: set it to 'on' (fp32 matmuls and convolutions in TF32 on "
            "Ampere and newer) or 'off' (IEEE fp32, the default)"
        )
    return value == "on"


def catalogue_capability(device: DeviceInfo) -> tuple[int, int]:
    """The compute capability of a device as detection or the catalogue reports it: ``compute_capability`` in its
    details ("8.0"), else its architecture ("sm_80", "sm_90a"). BackendError when it says neither."""
    given = device.details.get("compute_capability")
    if given:
        major, _, minor = str(given).partition(".")
        if major.isdigit() and minor.isdigit():
            return int(major), int(minor)
    arch = (device.arch or "").removeprefix("sm_").rstrip("abcdefghijklmnopqrstuvwxyz")
    if len(arch) >= 2 and arch.isdigit():
        return int(arch[:-1]), int(arch[-1])
    raise BackendError(f"{device.name}: no compute capability known (arch {device.arch!r})")


def supported_precisions(capability: tuple[int, int]) -> list[str]:
    """The precisions a GPU of this compute capability runs natively (emulated bf16 is not offered); FP8 and MX need
    torchao besides, checked before the run (:func:`accelbench.engine.float8.require_torchao`, ``require_torchao_mx``)."""
    names = ["fp32"]
    if capability >= FP16_MIN:
        names.append("fp16-mixed")
    if capability >= BF16_MIN:
        names += ["bf16-mixed", "bf16-true"]
    names += [name for name, floor in FP8_MIN.items() if capability >= floor]
    names += [name for name, floor in MX_MIN.items() if capability >= floor]
    return names


def apply_tf32(enabled: bool) -> None:
    """Set torch's TF32 switches for matmuls (cuBLAS) and convolutions (cuDNN) to the policy."""
    import torch

    # The legacy switches keep torch.get_float32_matmul_precision() readable; the newer per-backend
    # fp32_precision setters make it raise for any library that still asks (torch.compile among them).
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


def make_plan(precision: str, capability: tuple[int, int], tf32: bool) -> PrecisionPlan:
    """The plan for ``precision`` on a GPU of ``capability`` under the TF32 policy ``tf32``."""
    sm = f"sm_{capability[0]}{capability[1]}"
    if tf32 and capability >= TF32_MIN:
        math = "tf32"
        policy = f"TF32 policy on ({TF32_ENV}=on): fp32 matmuls and convolutions use TF32 tensor cores"
    elif tf32:
        math = "ieee-fp32"
        policy = f"TF32 policy on, but {sm} has no TF32: fp32 matmuls run in IEEE fp32"
    else:
        math = "ieee-fp32"
        policy = f"TF32 policy off ({TF32_ENV} unset or off): fp32 matmuls and convolutions in IEEE fp32"
    plan = standard_plan(precision, matmul_math=math)
    notes = [plan.notes] if plan.notes else []
    if precision == "fp16-mixed" and capability < TENSOR_CORES_MIN:
        notes.append(f"{sm} has no tensor cores: fp16 matmuls run on CUDA cores")
    notes.append(policy)
    return plan.model_copy(update={"notes": "; ".join(notes)})
