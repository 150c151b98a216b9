"""What differs between training stacks running the same model, as the memory model needs it: a
:class:`Stack`. Each choice defaults to what ``accelbench run`` itself does on the device type predicted for, and
``accelbench estimate`` takes a flag for each, so that the prediction can describe another stack's run (a seed
study's minGPT with torch's default foreach AdamW, DDP without bucket views, a DeepSpeed config with other bucket
sizes, FSDP with 16-bit parameters, activation checkpointing). The prediction records the stack it assumed.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from accelbench.errors import ConfigError

AttentionChoice = Literal["auto", "keeps-scores", "drops-scores"]
OptimizerKernels = Literal["fused", "foreach", "plain"]

# DeepSpeed's ZeRO defaults (deepspeed/runtime/zero/config.py, read in DeepSpeed 0.19.8), in elements
DS_REDUCE_BUCKET = 500_000_000  # reduce_bucket_size: the gradient bucket (allocated whole, filled as it goes)
DS_ALLGATHER_BUCKET = 500_000_000  # allgather_bucket_size: parameter all-gather after the step (ZeRO-1/2)
DS_PREFETCH_BUCKET = 50_000_000  # stage3_prefetch_bucket_size: ZeRO-3 parameters fetched ahead of use
# A bucket of more elements than this is a typo: 10^12 elements is 2 TB of 16-bit values, more than any device holds.
MAX_BUCKET_ELEMENTS = 10**12

# torch's fused AdamW kernels exist for these device types (torch.utils._foreach_utils.
# _get_fused_kernels_supported_devices in torch 2.13; the stock Backend.optimizer_implementation picks fused there)
FUSED_OPTIMIZER_DEVICES = frozenset({"cpu", "cuda", "xpu", "hpu", "mps", "mtia"})
# Device types whose dropout is torch's fused kernel (native_dropout), which keeps a 1-byte mask; elsewhere (the CPU)
# torch multiplies by a noise tensor of the activation's own type (aten/src/ATen/native/Dropout.cpp).
FUSED_DROPOUT_DEVICES = frozenset({"cuda", "xpu"})


class Stack(BaseModel):
    """The implementation choices the memory model depends on (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    attention: AttentionChoice = Field(
        default="auto",
        description="Whether attention keeps its a*s^2 scores for backward: keeps-scores (the math path, e.g. "
        "minGPT's explicit softmax), drops-scores (flash / memory-efficient kernels), auto (what torch's "
        "scaled_dot_product_attention picks on the device: the math path on a CPU with dropout).",
    )
    optimizer: OptimizerKernels | None = Field(
        default=None,
        description="AdamW's kernels: fused (no temporaries), foreach (one temporary the size of the parameters "
        "while stepping), plain (one tensor's); None: the backend's choice (fused where torch has fused kernels).",
    )
    ddp_bucket_view: bool = Field(
        default=True,
        description="DDP's gradient_as_bucket_view: the gradients are views into the buckets (accelbench's "
        "native DDP); off, the buckets are a second copy of the gradients (torch's default, which Lightning's DDP "
        "strategy keeps: :func:`run_stack` of ``--engine lightning``).",
    )
    ds_reduce_bucket: int = Field(default=DS_REDUCE_BUCKET, ge=1, le=MAX_BUCKET_ELEMENTS)
    ds_allgather_bucket: int = Field(default=DS_ALLGATHER_BUCKET, ge=1, le=MAX_BUCKET_ELEMENTS)
    ds_prefetch_bucket: int = Field(default=DS_PREFETCH_BUCKET, ge=0, le=MAX_BUCKET_ELEMENTS)
    fsdp_param_dtype: Literal["fp32", "bf16", "fp16"] | None = Field(
        default=None,
        description="FSDP2's MixedPrecisionPolicy param_dtype: the dtype units are gathered and computed in; "
        "None: the run's parameter dtype (accelbench's FSDP keeps fp32 parameters under autocast).",
    )
    activation_checkpointing: bool = Field(
        default=False,
        description="Each transformer layer keeps only its input and recomputes the rest in backward (one more "
        "forward pass of the layers): the run's --activation-checkpointing.",
    )

    def optimizer_kernels(self, device_type: str) -> OptimizerKernels:
        """The AdamW kernels a run on ``device_type`` uses."""
        if self.optimizer is not None:
            return self.optimizer
        return "fused" if device_type in FUSED_OPTIMIZER_DEVICES else "foreach"

    def keeps_scores(self, device_type: str, dropout: float) -> bool:
        """Whether attention keeps its scores (see :attr:`attention`)."""
        if self.attention == "auto":
            from accelbench.estimate.activations import attention_keeps_scores

            return attention_keeps_scores(device_type, dropout)
        return self.attention == "keeps-scores"

    def described(self, device_type: str, dropout: float) -> dict[str, object]:
        """The stack as resolved for ``device_type``: what the prediction records."""
        return {
            "attention": "keeps-scores" if self.keeps_scores(device_type, dropout) else "drops-scores",
            "optimizer": self.optimizer_kernels(device_type),
            "ddp_bucket_view": self.ddp_bucket_view,
            "ds_reduce_bucket": self.ds_reduce_bucket,
            "ds_allgather_bucket": self.ds_allgather_bucket,
            "ds_prefetch_bucket": self.ds_prefetch_bucket,
            "fsdp_param_dtype": self.fsdp_param_dtype,
            "activation_checkpointing": self.activation_checkpointing,
            "dropout_mask": "1 byte (fused dropout)"
            if device_type in FUSED_DROPOUT_DEVICES
            else "the activation's width (noise tensor)",
        }


def run_stack(engine: str, activation_checkpointing: bool = False) -> Stack:
    """The stack ``accelbench run`` uses under ``engine``: its own DDP wraps with gradient_as_bucket_view on;
    Lightning's DDP strategy (``--engine lightning``) passes torch's default, off; the layers checkpointed where the
    run asks (``--activation-checkpointing``)."""
    return Stack(ddp_bucket_view=engine != "lightning", activation_checkpointing=activation_checkpointing)


def dropout_mask_bytes(device_type: str, activation_width: int) -> int:
    """Bytes a dropout mask keeps per element: 1 where torch's fused dropout runs (a bool mask), else the noise
    tensor in the activation's type."""
    return 1 if device_type in FUSED_DROPOUT_DEVICES else activation_width


def stack_from_flags(
    *,
    attention: str = "auto",
    optimizer: str | None = None,
    ddp_bucket_view: str | None = None,
    ds_reduce_bucket: int | None = None,
    ds_allgather_bucket: int | None = None,
    ds_prefetch_bucket: int | None = None,
    fsdp_param_dtype: str | None = None,
    activation_checkpointing: bool = False,
    engine: str = "native",
) -> Stack:
    """The :class:`Stack` ``estimate``'s flags describe, the run's own (:func:`run_stack` of ``engine``) where a
    flag is not given; a ConfigError naming the flag for a value out of range."""
    buckets = {
        "--ds-reduce-bucket": (ds_reduce_bucket, DS_REDUCE_BUCKET, 1),
        "--ds-allgather-bucket": (ds_allgather_bucket, DS_ALLGATHER_BUCKET, 1),
        "--ds-prefetch-bucket": (ds_prefetch_bucket, DS_PREFETCH_BUCKET, 0),
    }
    values: dict[str, int] = {}
    for flag, (given, default, least) in buckets.items():
        value = default if given is None else given
        if not least <= value <= MAX_BUCKET_ELEMENTS:
            raise ConfigError(
                f"{flag} {value}: give a bucket size in elements from {least} to {MAX_BUCKET_ELEMENTS:.0e} "
                f"(DeepSpeed's default: {default:,})"
            )
        values[flag[2:].replace("-", "_")] = value
    bucket_view = run_stack(engine).ddp_bucket_view if ddp_bucket_view is None else ddp_bucket_view == "on"
    return Stack(
        attention=attention,  # type: ignore[arg-type]  # argparse's choices hold the literals
        optimizer=optimizer,  # type: ignore[arg-type]
        ddp_bucket_view=bucket_view,
        fsdp_param_dtype=fsdp_param_dtype,  # type: ignore[arg-type]
        activation_checkpointing=activation_checkpointing,
        **values,
    )
