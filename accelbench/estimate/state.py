"""Bytes per parameter of each kind of training state (weights, gradients, AdamW's moments, master copies,
activations), by precision and engine, and the element type a value of a given width travels as."""

from __future__ import annotations

from dataclasses import dataclass

from accelbench.contract.strategies import ZERO_STRATEGIES, Strategy
from accelbench.errors import ConfigError


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of each kind of training state, for one precision under one engine."""

    param: int
    grad: int
    optimizer: int  # AdamW's two moments
    master: int  # an fp32 copy of the parameters beside 16-bit ones (0 where the parameters are the master)
    autocast_copy: int  # autocast's 16-bit copy of each linear layer's weights, kept from forward to backward
    activation: int  # bytes of an activation value (Korthikanti's count is for 2)
    reduction: int  # bytes of a gradient in DeepSpeed's reduction bucket


def state_bytes(precision: str, strategy: str) -> StateBytes:
    """Bytes per parameter by precision (``accelbench.precision``) and engine.

    torch's own loop (single, DDP, FSDP2, tp/pp): fp32 keeps fp32 weights, gradients and AdamW's two fp32 moments
    (4 + 4 + 8); ``*-mixed`` is autocast over those same fp32 weights (they are the master copy), with a 16-bit
    copy of every linear weight that autocast makes in forward and backward keeps; ``bf16-true`` keeps everything in
    bf16 (2 + 2 + 4). DeepSpeed (ZeRO 1-3) runs the model in 16 bits in its bf16/fp16 modes and always keeps an fp32
    master partition and fp32 moments (2 + 2, + 4 + 8 per rank's share); in fp32 it still clones the partition as
    its "fp32" master copy (``stage_1_and_2.py``: ``.detach().clone().to(master dtype)``).
    """
    mixed = precision in ("bf16-mixed", "fp16-mixed")
    if strategy in ZERO_STRATEGIES:
        if precision == "bf16-true":
            raise ConfigError(
                "DeepSpeed keeps fp32 master weights: use bf16-mixed, not bf16-true, with deepspeed"
            )
        sixteen = 2 if mixed else 4
        # "ZeRO-1 stages the fp32 accumulator; ZeRO-2 keeps low-precision staging" (stage_1_and_2.py)
        reduction = 4 if strategy == Strategy.ZERO1 else sixteen
        return StateBytes(
            param=sixteen,
            grad=sixteen,
            optimizer=8,
            master=4,
            autocast_copy=0,
            activation=sixteen,
            reduction=reduction,
        )
    if precision == "bf16-true":
        return StateBytes(param=2, grad=2, optimizer=4, master=0, autocast_copy=0, activation=2, reduction=2)
    if mixed:
        return StateBytes(param=4, grad=4, optimizer=8, master=0, autocast_copy=2, activation=2, reduction=4)
    return StateBytes(param=4, grad=4, optimizer=8, master=0, autocast_copy=0, activation=4, reduction=4)


def element_type(width: int, precision: str) -> str:
    """The element type of a ``width``-byte value under ``precision``, as comm records name types."""
    if width == 4:
        return "fp32"
    return "fp16" if precision.startswith("fp16") else "bf16"
