"""The core's training strategies by name, and what each is: one place, instead of names compared as bare strings.

A run's ``--strategy`` is a plain string in the configuration and the record (a backend plugin may build strategies
of its own: the IPU plugin's ``pipelined``, ``sharded``, ...); :class:`Strategy` names the ones the core builds for
any torch device, and :func:`strategy_of` says which of them a name is. Members compare equal to their names
(``Strategy.DDP == "ddp"``) and print as them.
"""

from __future__ import annotations

from enum import Enum


class Strategy(str, Enum):
    """A strategy the core builds (accelbench.engine): one device, data parallelism (DDP, FSDP2, DeepSpeed ZeRO 1-3),
    or tensor, pipeline and composed parallelism over a device mesh."""

    SINGLE = "single"
    DDP = "ddp"
    FSDP = "fsdp"
    ZERO1 = "deepspeed-zero1"
    ZERO2 = "deepspeed-zero2"
    ZERO3 = "deepspeed-zero3"
    TP = "tp"
    PP = "pp"
    MESH = "mesh"

    def __str__(self) -> str:  # "ddp", not "Strategy.DDP", in messages and f-strings
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def zero_stage(self) -> int | None:
        """DeepSpeed ZeRO's stage (1, 2, 3), None for the others."""
        return int(self.value[-1]) if self.value.startswith("deepspeed-zero") else None

    @property
    def model_parallel(self) -> bool:
        """Whether it splits one replica of the model over devices (tensor, pipeline or both: a mesh)."""
        return self in (Strategy.TP, Strategy.PP, Strategy.MESH)

    @property
    def data_parallel(self) -> bool:
        """Whether it is data parallelism alone (DDP, FSDP2, ZeRO): every device trains a whole replica's step."""
        return self in (Strategy.DDP, Strategy.FSDP) or self.zero_stage is not None

    @property
    def replicates_parameters(self) -> bool:
        """Whether every device holds every parameter whole (one device, DDP, ZeRO-1 and -2)."""
        return self in (Strategy.SINGLE, Strategy.DDP, Strategy.ZERO1, Strategy.ZERO2)


def strategy_of(name: str) -> Strategy | None:
    """The core strategy called ``name``, or None for a name the core does not build (a plugin's own)."""
    try:
        return Strategy(name)
    except ValueError:
        return None


STRATEGIES: tuple[str, ...] = tuple(s.value for s in Strategy)
ZERO_STRATEGIES: tuple[str, ...] = tuple(s.value for s in Strategy if s.zero_stage is not None)
MODEL_PARALLEL_STRATEGIES: tuple[str, ...] = tuple(s.value for s in Strategy if s.model_parallel)
DATA_PARALLEL_STRATEGIES: tuple[str, ...] = tuple(s.value for s in Strategy if s.data_parallel)
