"""Activation checkpointing (``--activation-checkpointing``): each of the workload's units (its transformer layers)
keeps only its input for backward and runs its forward again there, trading one more forward pass of the layers
for their activations.

It is PyTorch's own non-reentrant ``torch.utils.checkpoint.checkpoint`` around each unit's ``forward``, applied to
the built model before any strategy wraps or shards it. The unit stays where it was (no wrapper module), so
parameter names, the units' paths and FSDP's units are those of a run without it; random numbers (dropout) are
replayed as in the forward, so the losses and gradients are those of a run without it too, and ``torch.compile``
traces it as its checkpoint operator. torch is imported inside the functions.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from accelbench.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from accelbench.config import RunConfig
    from accelbench.workloads import ModelUnits

FLAG = "--activation-checkpointing"


def check_activation_checkpointing(config: RunConfig, units: ModelUnits) -> None:
    """Refuse ``--activation-checkpointing`` for a workload whose units cannot be run twice (the config's own
    validation refuses it with the zero-bubble pipeline schedules)."""
    if config.activation_checkpointing and not units.checkpointable:
        raise ConfigError(
            f"{FLAG}: the {config.workload} workload's units cannot be run twice in a step (running a unit's forward "
            "again in backward would update its state twice: batch-norm statistics, a router's balancing); the "
            "transformer workloads gpt, llama and bert support it"
        )


def apply_activation_checkpointing(model: torch.nn.Module, units: ModelUnits) -> int:
    """Checkpoint each of ``units``' modules of ``model`` in place; how many."""
    modules = units.modules(model)
    for module in modules:
        module.forward = _checkpointed(module.forward)
    return len(modules)


def _checkpointed(forward: Callable[..., Any]) -> Callable[..., Any]:
    from torch.utils.checkpoint import checkpoint

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run
