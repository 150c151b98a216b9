"""Megatron-style tensor parallelism of the workload's units with DTensor (``parallelize_module``).

The workload says how a unit splits (``ModelUnits.tp_plan``); this module turns the plan into torch's parallel
styles. Within a unit, column-parallel linears shard their output features and the row-parallel linears after them
shard their input features, so a unit costs one all-reduce forward and one backward per column/row pair (Megatron's
``f`` and ``g``). With sequence parallelism the unit's input is split along the sequence, the norms (and dropouts)
run on sequence shards, each all-reduce becomes an all-gather before the column-parallel linear plus a reduce-scatter
after the row-parallel one, and the last unit gathers the sequence again.

The stem and head (embeddings, final norm, LM head) stay whole on every tensor-parallel rank: they see the same
inputs, compute the same values and get the same gradients there, so the maths is single-device training's (a
character vocabulary makes a vocabulary-parallel head pointless).

A plan entry of style ``module`` names a submodule that splits itself (:class:`ModuleTensorParallel`): a mixture of
experts' stacked experts, each expert's weights column- and row-parallel over its hidden width (Megatron's expert
tensor parallelism).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)


class PackedColwiseParallel(ColwiseParallel):
    """Column parallelism of a linear whose output packs ``parts`` equal blocks (a fused q/k/v projection): each
    block is sharded on its own, so every rank holds its own heads of q, of k and of v, and the module's local
    output is again ``parts`` equal blocks (``[q_r, k_r, v_r]``). Sharding the packed output as one block would
    give rank 0 all of q and half of k.

    The DTensor's logical (global) layout is the rank-major interleave ``[q_0 k_0 v_0 q_1 k_1 v_1 ...]``: a
    permutation of the rows, which changes neither the function nor the optimizer's element-wise updates.
    """

    def __init__(self, parts: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.parts = parts

    def _partition_linear_fn(self, name: str, module: nn.Module, device_mesh: DeviceMesh) -> None:
        rank, size = device_mesh.get_local_rank(), device_mesh.size()
        for pname, param in list(module.named_parameters(recurse=False)):
            local = torch.cat(
                [part.chunk(size, dim=0)[rank] for part in param.detach().chunk(self.parts, dim=0)]
            )
            shard = DTensor.from_local(local.contiguous(), device_mesh, [Shard(0)], run_check=False)
            module.register_parameter(pname, nn.Parameter(shard, requires_grad=param.requires_grad))


class ModuleTensorParallel(ParallelStyle):
    """A module that applies tensor parallelism to itself: its ``tensor_parallel(mesh)`` method shards its own
    parameters over the tp mesh (as DTensors) and does its own communication. For what torch's linear styles cannot
    express, a mixture of experts' stacked expert weights (:class:`accelbench.workloads.moe.model.GroupedExperts`)."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        apply = getattr(module, "tensor_parallel", None)
        if apply is None:
            raise ValueError(
                f"{type(module).__name__} has no tensor_parallel(mesh) method to split itself with"
            )
        apply(device_mesh)
        return module


def unit_styles(plan: Sequence[tuple[str, str]], sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """The parallel style of each submodule of a unit, from the workload's plan."""
    styles: dict[str, ParallelStyle] = {}
    sequence = Shard(1)
    for path, kind in plan:
        name, _, parts = kind.partition(":")
        if name == "colwise":
            layouts: dict[str, Any] = {"input_layouts": sequence} if sequence_parallel else {}
            styles[path] = (
                PackedColwiseParallel(int(parts), **layouts) if parts else ColwiseParallel(**layouts)
            )
        elif name == "rowwise":
            styles[path] = (
                RowwiseParallel(output_layouts=sequence, use_local_output=False)
                if sequence_parallel
                else RowwiseParallel()
            )
        elif name == "module":
            if sequence_parallel:
                raise ValueError(
                    f"tensor-parallel plan entry {path!r} splits itself and takes whole sequences: it cannot run "
                    "with sequence parallelism"
                )
            styles[path] = ModuleTensorParallel()
        elif name == "norm":
            if sequence_parallel:
                styles[path] = SequenceParallel()
        else:
            raise ValueError(f"tensor-parallel plan entry {path!r}: unknown style {kind!r}")
    return styles


def parallelize_units(
    units: Sequence[nn.Module], plan: Sequence[tuple[str, str]], mesh: DeviceMesh, sequence_parallel: bool
) -> None:
    """Apply tensor parallelism to ``units`` in place (those of one pipeline stage, or all of them). With sequence
    parallelism, each unit takes its input split along the sequence and the last one gives it back whole."""
    styles = unit_styles(plan, sequence_parallel)
    for unit in units:
        # an entry applies to the units that have its submodule (a mixture's dense first blocks lack the experts)
        parallelize_module(unit, mesh, {path: style for path, style in styles.items() if _has(unit, path)})
        if (
            sequence_parallel
        ):  # whole -> sequence shards at the unit's entry (a local slice, no communication)
            parallelize_module(
                unit,
                mesh,
                PrepareModuleInput(
                    input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_output=False
                ),
            )
    if sequence_parallel and units:  # the stage's output goes on whole (to the head, or the next stage)
        parallelize_module(
            units[-1],
            mesh,
            PrepareModuleOutput(
                output_layouts=(Shard(1),), desired_output_layouts=(Replicate(),), use_local_output=True
            ),
        )


def _has(unit: nn.Module, path: str) -> bool:
    try:
        unit.get_submodule(path)
    except AttributeError:
        return False
    return True
