"""The executor of the ``tp``, ``pp`` and ``mesh`` strategies: tensor, pipeline and data parallelism composed on a
device mesh, on PyTorch's own building blocks (DTensor's ``parallelize_module``, ``torch.distributed.pipelining``,
FSDP2's ``fully_shard`` or DDP on the data axis).

Order of construction, as torchtitan does it: cut the pipeline stages (when there is a pp axis), apply tensor
parallelism to each stage's units, then shard (FSDP2) or replicate (DDP) each stage over the data axis. The step is
single-device training's (same loss, same clipping of the global gradient norm, same AdamW), so for the same seed,
fp32 and no dropout the losses match single-device training up to the order of floating-point sums:

- the pipeline's microbatch gradients are summed and divided by the microbatch count once;
- gradients of a tied parameter untied across stages are summed (:mod:`accelbench.engine.parallel.pp`);
- the gradient norm is the norm over the whole model: DTensor shards reduced over their mesh, the pipeline's
  stages summed over the pp group, the untied copy counted once;
- the loss is computed on the last stage and broadcast to the pipeline's other ranks, so every rank reports it;
  loss terms the units compute themselves (a mixture of experts' balance losses, ``ModelUnits.unit_loss_methods``)
  add their gradients in backward on their own stage, and their values, summed over the stages, to that loss.

Expert parallelism inside the stages (``--mesh pp=P,ep=N``, or ``ddp=D,pp=P,ep=N``): the N ranks holding the same
stages (a stage's ep group) each run their own pipeline on their own share of the batch, as data-parallel
replicas; every MoE layer of a stage keeps its ep rank's E/N experts and exchanges tokens with the group
(:meth:`accelbench.workloads.moe.model.MoEFeedForward.shard_experts`). With a tp axis as well (``tp=T,ep=N``, with
pp or ddp too), each ep rank's replica is T ranks: the experts are dealt out over ep first, then every held expert
is split over its hidden width over tp (Megatron's expert tensor parallelism); the ep group is the ranks of the same
tp coordinate, which route the same tokens as their tp siblings, so each tp rank exchanges them with its peers and
computes its slice of the experts they reach, and the slices' partial outputs are summed over tp after they return.
The group's ranks run the same schedule on batches of the same size, so their exchanges (the schedule's shape
inference's too) pair up in the same order. As
under :mod:`accelbench.engine.parallel.ep`: the replicated gradients are averaged over the group, the experts'
(summed over the group's tokens by the backward exchange) divided by N, the experts' squares summed over the group in
the norm, and the reported loss is the mean of the group's pipelines' (the global batch's). A ddp axis is reduced
by hand with it (no DDP): the replicated gradients over the stage's D x N replicas, the experts' summed over the data
axis first.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import statistics
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.tensor import DTensor

from accelbench.contract import DataShard, ExecutorRequest, World
from accelbench.contract.strategies import Strategy
from accelbench.engine.parallel.mesh import MeshExecutor, build_device_mesh, check_model_split
from accelbench.engine.parallel.pp import (
    SPLIT_BACKWARD_SCHEDULES,
    TORCH_SCHEDULES,
    StageClock,
    StageModule,
    StagePlan,
    TiedCopy,
    build_stage,
    make_schedule,
    plan_stages,
    receive_buffers,
)
from accelbench.engine.parallel.tp import parallelize_units
from accelbench.errors import ConfigError
from accelbench.estimate.parallel import TransformerShape, estimate_parallel, pipeline_bubble
from accelbench.parallel_dims import PP_SCHEDULES, fewest_microbatches
from accelbench.workloads import ModelUnits, TrainingJob

if TYPE_CHECKING:
    from accelbench.engine.metrics import RankLog


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _no_outputs(schedule: Any) -> dict[str, bool]:
    """``return_outputs=False`` where torch's schedule takes it (torch >= 2.8): else the last stage keeps every
    microbatch's output (a language model's logits, ``b s V``) until the step ends and concatenates them into an
    output nobody reads. Measured on llama-tiny (vocabulary 8,192) over pp=2: the last rank's tensor peak held
    four microbatches' logits more than it needs."""
    kind: Any = type(schedule)
    return {"return_outputs": False} if _takes_return_outputs(kind) else {}


@functools.cache
def _takes_return_outputs(kind: Any) -> bool:
    """Whether a schedule class's ``step`` takes ``return_outputs``: read once per class, not every step."""
    return "return_outputs" in inspect.signature(kind.step).parameters


class _TiedPair:
    """A tied parameter untied across two pipeline stages: this rank's side(s) of it and the group that sums them."""

    def __init__(self, sides: list[tuple[nn.Module, str]], group: Any) -> None:
        self.sides = sides  # (module, attribute): the owner's and/or the copy's, on this rank
        self.group = group  # the two ranks' process group; None when this rank holds both sides

    def sum_gradients(self) -> None:
        grads = []
        for module, attribute in self.sides:
            param = getattr(module, attribute)
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            grads.append(_local(param.grad))
        if self.group is not None:
            dist.all_reduce(grads[0], group=self.group)
        else:
            total = grads[0] + grads[1]
            for grad in grads:
                grad.copy_(total)


class ParallelExecutor(MeshExecutor):
    """Tensor, pipeline and data parallelism composed on the run's mesh (``--mesh``, or ``--strategy tp``/``pp``)."""

    def __init__(self, request: ExecutorRequest) -> None:
        super().__init__(request)
        config = request.config
        if request.units is None:
            raise ConfigError(
                f"strategy {config.strategy!r} needs the workload's units (ExecutorRequest.units)"
            )
        check_model_split(config, request.units, config.workload)
        self._units: ModelUnits = request.units
        self.pipelined = self.layout.pp > 1
        self.clock = StageClock(self.device) if self.pipelined else None
        self._tied: list[_TiedPair] = []
        self._copies: list[TiedCopy] = []
        # (batch size, for evaluation) -> (schedule, microbatches)
        self._schedules: dict[tuple[int, bool], tuple[Any, int]] = {}
        # the training schedules' PipelineStages (their receive buffers, registered before a measured step)
        self._training_stages: list[Any] = []
        # the schedules whose first step (torch's shape inference) has run
        self._inferred: set[tuple[int, bool]] = set()
        self._logs: list[RankLog] = []
        self._stage_plan: StagePlan | None = None
        self._shape: TransformerShape | None = None
        self.modules: list[nn.Module] = []
        # a pipeline over a model whose units compute loss terms of their own: the model's method that takes them,
        # and this rank's of the last step
        self._take_unit_loss: Callable[[bool], torch.Tensor | None] | None = None
        self._unit_loss = torch.zeros(())
        self._unit_loss_sum: torch.Tensor | None = None
        # expert parallelism inside the stages (pp with ep): the group of ranks holding the same stages, and the
        # ids of this rank's expert parameters
        self._ep_group: Any = None
        self._moe_layers: list[Any] = []
        self._expert_ids: set[int] = set()
        # with a ddp axis as well: the stage's replicas (dp x ep ranks of one tp coordinate) and the ranks holding the
        # same experts (dp)
        self._replica_group: Any = None
        self._expert_dp_group: Any = None
        self._experts_per_rank = 0

    # ---------------------------------------------------------------------------------------------------------
    # set-up
    # ---------------------------------------------------------------------------------------------------------

    def setup(self, job: TrainingJob) -> None:
        layout, units = self.layout, job.units
        self._units, self._clip = units, job.grad_clip_norm
        self._shape = _shape_of(job.model, units)
        self.mesh = build_device_mesh(layout, self.device.type)
        dtype = self.request.precision.torch_param_dtype
        if self.pipelined:
            if (
                units.unit_loss_methods is not None
            ):  # a mixture's balance losses: added in backward by the layers
                enable, take = units.unit_loss_methods
                getattr(job.model, enable)()
                self._take_unit_loss = getattr(job.model, take)
            self._stage_plan = plan_stages(job.model, units, layout.stages, layout.split)
            self.stage_ids = layout.stage_ids(self.coordinates["pp"])
            built = [build_stage(job.model, units, self._stage_plan, s) for s in self.stage_ids]
            parts: list[nn.Module] = [module for module, _ in built]
            self._copies = [c for _, copies in built for c in copies]
        else:
            self.stage_ids = []
            parts = [job.model]
        if layout.ep > 1:
            self._shard_experts(parts)
        for part in parts:
            part.to(device=self.device, dtype=dtype).train()
            part_units = list(part.units) if isinstance(part, StageModule) else units.modules(part)
            if layout.tp > 1:
                parallelize_units(part_units, units.tp_plan, self.mesh["tp"], layout.sequence_parallel)
            self.modules.append(self._data_parallel(part, part_units))
        if layout.ep > 1:  # tensor parallelism made the held experts' slices new (DTensor) parameters
            self._expert_ids = {id(p) for layer in self._moe_layers for p in layer.expert_parameters()}
        self.optimizer = unmixed(
            job.make_optimizer(
                nn.ModuleList(self.modules), self.device, self.backend.optimizer_implementation(self.device)
            )
        )
        if self.pipelined:
            self._pp_group = self.mesh["pp"].get_group()
            self._loss_fn = getattr(job.model, str(units.loss_method))
            self._tied = self._tied_pairs(job.model, units)
            last = layout.stage_holder(layout.stages - 1)  # pp rank p-1, or 0 for the V-shaped schedules
            self._loss_source = layout.rank_of({**self.coordinates, "pp": last})

    def _shard_experts(self, parts: list[nn.Module]) -> None:
        """Every MoE layer of this rank's stages keeps its ep rank's share of the experts and exchanges tokens with
        the stage's ep group; the rest of each stage is replicated over the stage's replicas (its ep group, times the
        data axis where there is one), from the first one's weights (the same seed made them alike already: made
        sure, as DDP's broadcast does)."""
        group = self.mesh["ep"].get_group()
        layers: list[Any] = [m for part in parts for m in part.modules() if hasattr(m, "shard_experts")]
        for layer in layers:
            layer.shard_experts(group, self.coordinates["ep"], self.layout.ep)
        self._moe_layers = layers
        self._expert_ids = {id(p) for layer in layers for p in layer.expert_parameters()}
        self._experts_per_rank = layers[0].local_experts if layers else 0
        self._ep_group = self._replica_group = group
        if self.layout.dp > 1:
            self._expert_dp_group = self.mesh["dp"].get_group()
            self._replica_group = self._stage_replicas()
        source = min(dist.get_process_group_ranks(self._replica_group))
        for part in parts:
            for param in part.parameters():
                if id(param) not in self._expert_ids:
                    dist.broadcast(param.data, src=source, group=self._replica_group)

    def _stage_replicas(self) -> Any:
        """The process group of the ranks holding this rank's stages and tensor-parallel slices (every dp and ep
        coordinate of its pp and tp coordinates). Every rank makes every group, in the same order (``new_group`` is
        collective), and keeps its own."""
        layout, mine = self.layout, None

        def place(coordinates: dict[str, int]) -> tuple[int, int]:
            return coordinates["pp"], coordinates["tp"]

        for key in sorted({place(layout.coordinates(r)) for r in range(layout.world)}):
            group = dist.new_group([r for r in range(layout.world) if place(layout.coordinates(r)) == key])
            if key == place(self.coordinates):
                mine = group
        return mine

    def _average_over_expert_ranks(self) -> None:
        """Under pp with ep, after the backward: the replicated gradients averaged over the stage's replicas (one
        flat all-reduce: each rank's are of its own pipeline's loss); the experts', which the backward exchange
        already summed over the ep group's tokens on the rank holding them, summed over the data axis (the ranks
        holding the same experts) and divided by the replicas; so the step is one device's on the global batch (the
        mean of the replicas' equal-batch losses)."""
        if self._ep_group is None:
            return
        if self.layout.shards_parameters:
            # FSDP averaged both in backward, the experts' over the data axis only: they are left to divide by N
            for param in {id(p): p for m in self.modules for p in m.parameters()}.values():
                if id(param) in self._expert_ids and param.grad is not None:
                    _local(param.grad).div_(self.layout.ep)
            return
        replicas = self.layout.dp * self.layout.ep
        replicated: list[torch.Tensor] = []
        experts: list[torch.Tensor] = []
        for param in {id(p): p for m in self.modules for p in m.parameters() if p.requires_grad}.values():
            if param.grad is None:  # a parameter no token reached on this rank still takes part in the sum
                param.grad = torch.zeros_like(param)
            (experts if id(param) in self._expert_ids else replicated).append(_local(param.grad))
        for grads, group in ((replicated, self._replica_group), (experts, self._expert_dp_group)):
            if not grads:
                continue
            flat = _flatten_dense_tensors(grads)
            if group is not None:
                dist.all_reduce(flat, group=group)
            flat.div_(replicas)
            for grad, reduced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
                grad.copy_(reduced)

    def _data_parallel(self, part: nn.Module, part_units: list[nn.Module]) -> nn.Module:
        """``part`` sharded (FSDP2, one unit each plus the rest as the root) or replicated (DDP) over the dp axis."""
        kind = self.layout.data_parallel
        if self.layout.dp == 1 or kind is None:
            return part
        if self.layout.ep > 1:  # a ddp axis is reduced by hand with the expert axis
            return self._shard_beside_experts(part, part_units) if kind == Strategy.FSDP else part
        dp_mesh = self.mesh["dp"]
        if kind == Strategy.DDP:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type != "cpu" and self.device.index is not None else None
            # The pipeline runs a stage's microbatches under no_sync and hands DDP the last backward itself; plain
            # DDP then counts the parameters twice when it first rebuilds its buckets, and static_graph=True gave the
            # last stage wrong gradients (torch 2.13). Searching the graph for unused parameters gets them right.
            return DistributedDataParallel(
                part, process_group=dp_mesh.get_group(), device_ids=ids, find_unused_parameters=True
            )
        from torch.distributed.fsdp import fully_shard

        # a pipeline runs several microbatches through a stage per step: keep its parameters gathered between them
        reshard = not self.pipelined
        for unit in part_units:
            fully_shard(unit, mesh=dp_mesh, reshard_after_forward=reshard)
        fully_shard(part, mesh=dp_mesh, reshard_after_forward=reshard)
        return part

    def _shard_beside_experts(self, part: nn.Module, part_units: list[nn.Module]) -> nn.Module:
        """FSDP2 on a data axis beside ep (and pp or tp): each MoE layer's held experts sharded over the data axis
        (the ranks holding the same experts), each unit and the rest of ``part`` over the stage's dp x ep replicas of
        this tp coordinate (the dp and ep dimensions of the mesh flattened into one, as torchtitan flattens its data
        axes: ``DeviceMesh._flatten``, torch 2.13 having no public form of it). FSDP's reduce-scatter then averages
        the replicated gradients over the replicas and an expert's over the data axis, after the backward exchange
        summed it over the ep group; :meth:`_average_over_expert_ranks` divides the experts' by N. A pipeline keeps
        the parameters gathered between a stage's microbatches, as under FSDP alone."""
        from torch.distributed.fsdp import fully_shard

        reshard = not self.pipelined
        names = tuple(name for name in self.mesh.mesh_dim_names or () if name in ("dp", "ep"))
        replicas = self.mesh[names]._flatten("dp_ep")
        for layer in self._moe_layers:
            if any(layer is m for m in part.modules()):
                fully_shard(layer.experts, mesh=self.mesh["dp"], reshard_after_forward=reshard)
        for unit in part_units:
            fully_shard(unit, mesh=replicas, reshard_after_forward=reshard)
        fully_shard(part, mesh=replicas, reshard_after_forward=reshard)
        return part

    def _tied_pairs(self, model: nn.Module, units: ModelUnits) -> list[_TiedPair]:
        """The groups that sum the gradients of tied parameters untied across stages, one per pipeline (each
        (dp, tp) coordinate): the ranks holding the owner's stage and the user's. Every rank creates every group,
        in the same order (``new_group`` is collective), and keeps those it belongs to."""
        assert self._stage_plan is not None
        layout, me, mine = self.layout, self.request.world.rank, self.coordinates["pp"]
        pairs: list[_TiedPair] = []
        for user, owner in units.tied:
            owner_module, _, attribute = owner.rpartition(".")
            owner_stage = self._stage_plan.stage_of(units, owner_module)
            user_stage = self._stage_plan.stage_of(units, user.rpartition(".")[0])
            if owner_stage is None or user_stage is None or owner_stage == user_stage:
                continue  # tied within one stage: one parameter, as on one device
            owner_pp, user_pp = layout.stage_holder(owner_stage), layout.stage_holder(user_stage)
            for group in layout.groups("pp"):
                a, b = group[owner_pp], group[user_pp]
                made = dist.new_group([a, b]) if a != b else None
                if me not in (a, b):
                    continue
                sides: list[tuple[nn.Module, str]] = []
                if mine == owner_pp:
                    sides.append((model.get_submodule(owner_module), attribute))
                if mine == user_pp:
                    copy = next(c for c in self._copies if (c.user, c.owner) == (user, owner))
                    sides.append((copy.module, copy.attribute))
                pairs.append(_TiedPair(sides, made))
        return pairs

    # ---------------------------------------------------------------------------------------------------------
    # training
    # ---------------------------------------------------------------------------------------------------------

    def data_shard(self, world: World) -> DataShard:
        """One share of the batch per data-parallel replica; with an ep axis each ep rank's pipeline is a replica."""
        c, ep = self.coordinates, self.layout.ep
        return DataShard(
            c["dp"] * ep + c.get("ep", 0), self.layout.dp * ep, counts_samples=c["tp"] == 0 and c["pp"] == 0
        )

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.pipelined:
            loss = self._pipeline_step(inputs, targets)
        else:
            with self._autocast:
                loss = self.modules[0](inputs, targets)
            loss.backward()
            loss = loss.detach()
        self.backend.after_backward(self.device)
        self._average_over_expert_ranks()
        for pair in self._tied:
            pair.sum_gradients()
        if self._clip is not None:
            self._clip_gradients(self._clip)
        self.optimizer.step()
        self.backend.after_optimizer_step(self.device)
        self.optimizer.zero_grad(set_to_none=True)
        if self.pipelined:  # only the last stage computed the loss: every rank of the pipeline reports it
            loss = self._whole_pipeline_loss(loss)
        # with an ep axis, the global batch's loss: the mean of the stage replicas' pipelines' (equal batches)
        if self._ep_group is not None:
            dist.all_reduce(loss, group=self._replica_group)
            loss = loss / (self.layout.dp * self.layout.ep)
        return loss

    def _whole_pipeline_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The last stage's loss broadcast to the pipeline's ranks, plus, for a model whose units compute loss
        terms of their own (``ModelUnits.unit_loss_methods``: a mixture's balance losses), those of every stage:
        each rank's terms of the step (the mean over microbatches, as the loss), summed over the pp group."""
        loss = loss.float()
        dist.broadcast(loss, src=self._loss_source, group=self._pp_group)
        if self._take_unit_loss is None:
            return loss
        carried = self._unit_loss
        dist.all_reduce(carried, group=self._pp_group)
        return loss + carried

    def _take_unit_losses(self, microbatches: int) -> None:
        """This rank's stages' own loss terms of the step just run (:meth:`_collect_unit_losses`), the mean over
        its microbatches (zero where the model has none), kept for :meth:`_whole_pipeline_loss`."""
        taken, self._unit_loss_sum = self._unit_loss_sum, None
        self._unit_loss = (
            _local(taken).float().to(self.device) / microbatches
            if taken is not None
            else torch.zeros((), device=self.device)
        )

    def _collect_unit_losses(self, stage: Any) -> None:
        """Take the model's own loss terms after each of ``stage``'s microbatch forwards, and forget (``keep``
        False) whatever ran before it: a schedule's first step runs each stage once on empty tensors to learn the
        shapes it sends (torch's metadata inference), which is no training forward."""
        forward, take = stage.forward_one_chunk, self._take_unit_loss
        assert take is not None

        def collected(*args: Any, **kwargs: Any) -> Any:
            take(False)
            out = forward(*args, **kwargs)
            taken = take(True)
            if taken is not None:
                taken = taken.detach()
                self._unit_loss_sum = taken if self._unit_loss_sum is None else self._unit_loss_sum + taken
            return out

        stage.forward_one_chunk = collected

    def _pipeline_step(self, inputs: torch.Tensor, targets: torch.Tensor, timed: bool = True) -> torch.Tensor:
        """One forward and backward of the batch through the schedule, each gradient the mean over microbatches;
        the mean loss on the last stage (zeros elsewhere). ``timed``: a training step, which the stage clock
        counts; the gradient probe's step is not."""
        schedule, microbatches = self._schedule_for(inputs.shape[0])
        assert self.clock is not None
        losses: list[torch.Tensor] = []
        holds_first, holds_last = 0 in self.stage_ids, self.layout.stages - 1 in self.stage_ids
        if timed:
            self.clock.begin_step()
        with self._autocast, self._routing_agreed_while_inferring((inputs.shape[0], False)):
            schedule.step(
                *((inputs,) if holds_first else ()),
                **({"target": targets, "losses": losses} if holds_last else {}),
                **_no_outputs(schedule),
            )
        if timed:
            self.clock.end_step()
        self._take_unit_losses(microbatches)
        seen: set[int] = set()
        for module in self.modules:  # the mean over microbatches, each parameter once
            for param in module.parameters():
                if param.grad is not None and id(param) not in seen:
                    seen.add(id(param))
                    _local(param.grad).div_(microbatches)
        if losses:
            return torch.stack([loss.detach() for loss in losses]).mean()
        return torch.zeros((), device=self.device)

    @contextlib.contextmanager
    def _routing_agreed_while_inferring(self, key: tuple[int, bool]) -> Iterator[None]:
        """Around the first step of the schedule for ``key`` (see :meth:`_schedule_for`) under ep with tp: torch's
        pipelining infers a stage's shapes by running it once on uninitialised tensors, different on each
        tensor-parallel rank, which would route their tokens differently, receive different numbers of rows from
        the ep group and sum mismatched partial outputs over tp. So the MoE layers take the tp group's first rank's
        routing for that step (:attr:`accelbench.workloads.moe.model.MoEFeedForward.agree_routing`); on real
        inputs the tp ranks route alike anyway, and later steps skip the broadcast."""
        agree = key not in self._inferred and self._ep_group is not None and self.layout.tp > 1
        for layer in self._moe_layers if agree else ():
            layer.agree_routing = True
        try:
            yield
        finally:
            for layer in self._moe_layers if agree else ():
                layer.agree_routing = False
            self._inferred.add(key)

    def _schedule_for(self, batch: int, evaluation: bool = False) -> tuple[Any, int]:
        """The schedule for batches of ``batch`` samples. Stages fix their microbatch shapes at their first step,
        so an epoch's smaller last batch gets its own stages and schedule, with as many microbatches as divide it
        (equal microbatches keep the mean loss exact). The held-out evaluation gets stages and a schedule of its
        own (``evaluation``), not instrumented by the collective clock: a forward-only ``schedule.eval`` leaves
        state in its stages that a training step under MemTracker (the tensor peak) then fails on."""
        key = (batch, evaluation)
        if key in self._schedules:
            return self._schedules[key]
        from torch.distributed.pipelining import PipelineStage

        layout = self.layout
        microbatches = math.gcd(layout.microbatches, batch)
        fewest = fewest_microbatches(layout.schedule, layout.pp, layout.virtual_stages)
        if microbatches < fewest:
            raise RuntimeError(
                f"a batch of {batch} samples (an epoch's smaller last batch) cannot be cut into the {fewest} or more "
                f"equal microbatches --pp-schedule {layout.schedule} needs; cap the epoch with --steps-per-epoch, or "
                "choose a batch size that divides the epoch"
            )
        stages = [
            PipelineStage(module, stage, self.layout.stages, self.device, group=self._pp_group)
            for module, stage in zip(self.modules, self.stage_ids, strict=True)
        ]
        assert self.clock is not None
        for stage in stages if self._take_unit_loss is not None else ():
            self._collect_unit_losses(stage)
        for stage in stages if not evaluation else ():
            self.clock.instrument(stage)
        if not evaluation:
            self._training_stages.extend(stages)
        self._schedules[key] = (
            make_schedule(self.layout.schedule, stages, microbatches, self._loss_fn),
            microbatches,
        )
        return self._schedules[key]

    # ---------------------------------------------------------------------------------------------------------
    # quality checks (after an epoch, untimed)
    # ---------------------------------------------------------------------------------------------------------

    def evaluate(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """The held-out loss: every part in eval mode under ``torch.no_grad`` and the run's autocast. Tensor
        parallelism runs the sharded model forward as training does; a pipeline runs its schedule forward only
        (``schedule.eval``, the same microbatches as training), and the last stage's mean loss is broadcast to the
        pipeline's ranks, as a training step's is. Train mode is restored after. None under the V-shaped schedules
        (zbv, dualpipev): torch 2.13 runs no forward-only step of them (their action lists assume a backward)."""
        if PP_SCHEDULES.get(self.layout.schedule) == "v" and self.pipelined:
            return None
        for module in self.modules:
            module.eval()
        try:
            with torch.no_grad():
                if self.pipelined:
                    return self._pipeline_loss(inputs, targets)
                with self._autocast:
                    return _local(self.modules[0](inputs, targets).detach()).float()
        finally:
            for module in self.modules:
                module.train()

    def _pipeline_loss(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        schedule, microbatches = self._schedule_for(inputs.shape[0], evaluation=True)
        losses: list[torch.Tensor] = []
        holds_first, holds_last = 0 in self.stage_ids, self.layout.stages - 1 in self.stage_ids
        with self._autocast, self._routing_agreed_while_inferring((inputs.shape[0], True)):
            schedule.eval(
                *((inputs,) if holds_first else ()),
                **({"target": targets, "losses": losses} if holds_last else {}),
                **_no_outputs(schedule),
            )
        self._take_unit_losses(microbatches)
        loss = (
            torch.stack([_local(x.detach()).float() for x in losses]).mean()
            if losses
            else torch.zeros((), device=self.device)
        )
        return self._whole_pipeline_loss(loss)

    def gradient_norm(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """One forward and backward as a training step makes them, the total L2 norm of the gradients over the
        whole model (:meth:`_total_norm`, what clipping reads: tensor-parallel shards reduced over their mesh, the
        pipeline's stages summed over the pp group, an untied copy of a tied parameter counted once), and the
        gradients cleared; the optimizer never sees them. A pipeline runs one step of its training schedule on the
        batch (gradients the mean over microbatches, tied copies' gradients summed, as in training), which the stage
        clock does not count."""
        self.optimizer.zero_grad(set_to_none=True)
        if self.pipelined:
            self._pipeline_step(inputs, targets, timed=False)
        else:
            with self._autocast:
                loss = self.modules[0](inputs, targets)
            loss.backward()
        self.backend.after_backward(self.device)
        self._average_over_expert_ranks()
        for pair in self._tied:
            pair.sum_gradients()
        norm = self._total_norm()[0]
        self.optimizer.zero_grad(set_to_none=True)
        self.backend.end_of_step(self.device)
        return norm

    def _total_norm(self) -> tuple[torch.Tensor, list[nn.Parameter]]:
        """The global L2 norm of the gradients, as ``clip_grad_norm_`` computes it on one device: DTensor gradients
        reduced over their mesh (tensor- and data-parallel shards), the pipeline's ranks summed, an untied copy of
        a tied parameter counted once (its owner's gradient already holds the sum), the experts' squares summed over
        the stage's ep group (each expert counted once, the replicated gradients being alike there); and the
        parameters with one."""
        copies = {id(c.parameter) for c in self._copies}
        params = list({id(p): p for m in self.modules for p in m.parameters() if p.grad is not None}.values())
        grads: list[torch.Tensor] = []
        experts: list[torch.Tensor] = []
        for p in params:
            if id(p) in copies:
                continue
            assert p.grad is not None
            (experts if id(p) in self._expert_ids else grads).append(p.grad)
        self._foreach = self.backend.optimizer_implementation(self.device) != "plain"  # the backend's kernels
        squares = gradient_squares(grads, self._foreach, self.device)
        if self._ep_group is not None:  # every rank of the group takes part, whatever experts it holds
            # with tp, each expert's slices first reduced over the tp group
            held = gradient_squares(experts, self._foreach, self.device)
            dist.all_reduce(held, group=self._ep_group)
            squares += held
        if self.pipelined:
            dist.all_reduce(squares, group=self._pp_group)
        return squares.sqrt(), params

    def _clip_gradients(self, max_norm: float) -> None:
        """Clip to ``max_norm`` by the global gradient norm (:meth:`_total_norm`), as ``clip_grad_norm_`` does."""
        norm, params = self._total_norm()
        scale_gradients(params, norm, max_norm)

    def why_no_tensor_peak(self) -> str | None:
        """The zero-bubble schedules split each backward into the input's gradient (``torch.autograd.grad`` on the
        stage's inputs) and the weights' later; MemTracker's module hooks (multi-grad hooks on each module's
        tensors) cannot follow the first: torch raises "A leaf node was passed to _will_engine_execute_node but we
        are currently running autograd.grad()" (torch 2.13), and the other ranks would wait in the pipeline."""
        if self.pipelined and self.layout.schedule in SPLIT_BACKWARD_SCHEDULES:
            return (
                f"--pp-schedule {self.layout.schedule} splits each backward into the inputs' gradients "
                "(torch.autograd.grad) and the weights', which MemTracker's module hooks cannot follow (torch "
                "raises 'A leaf node was passed to _will_engine_execute_node'); the schedules that do not split it "
                "(gpipe, 1f1b, interleaved-1f1b, looped-bfs) measure one"
            )
        return None

    def tensors_before_step(self) -> list[nn.Module | torch.optim.Optimizer | torch.Tensor] | None:
        """This rank's stages (their parameters: a DTensor's local shard, FSDP2's sharded parameters; their buffers),
        the optimizer's state over them, the untied copies of tied parameters, and the training stages' receive
        buffers (one a microbatch for the activations a stage receives and one for the gradients sent back to it),
        made at the first step and kept: MemTracker sees a stage's inputs as it runs but never the gradients'
        buffers, which are real memory (measured: 8 of rank 0's 12 buffers, 1 MiB, missing on a looped-BFS
        gpt-micro)."""
        if not self.modules or not hasattr(self, "optimizer"):
            return None
        return [
            *self.modules,
            self.optimizer,
            *(copy.module for copy in self._copies),
            *receive_buffers(self._training_stages),
        ]

    # ---------------------------------------------------------------------------------------------------------
    # the record
    # ---------------------------------------------------------------------------------------------------------

    def rank_facts(self) -> dict[str, Any]:
        if self.clock is None:
            return {}
        return {"pp_rank": self.coordinates["pp"], "stages": self.stage_ids, "clock": self.clock.summary()}

    def add_rank_logs(self, logs: list[RankLog]) -> None:
        self._logs = list(logs)

    def describe(self) -> dict[str, Any]:
        config, layout = self.request.config, self.layout
        defaults = getattr(getattr(self, "optimizer", None), "defaults", {})
        out: dict[str, Any] = {
            "executor": type(self).__name__,
            "strategy": config.strategy,
            "torch_compile": False,  # refused with tensor/pipeline parallelism (RunConfig)
            "compile_mode": None,
            "cuda_graphs": False,
            "mesh": {"text": config.mesh, **layout.describe()},
            "optimizer": type(self.optimizer).__name__ if hasattr(self, "optimizer") else None,
            "fused_optimizer": bool(defaults.get("fused")),
            "grad_clip_norm": self._clip,
            "samples_counted": "once per data-parallel replica (by its tensor-parallel rank 0 of the first stage)",
        }
        if layout.ep > 1:
            out["expert_parallel"] = {
                "size": layout.ep,
                "experts_per_rank": self._experts_per_rank,
                "exchange": "torch.distributed._functional_collectives.all_to_all_single_autograd over each stage's "
                "ep group (the ranks holding the same stages): tokens to the rank holding their expert and back, "
                "twice per MoE layer forward and twice backward",
                "replicas": "each ep rank runs its own pipeline on its own share of the batch",
                "replicated_gradients": f"averaged over the stage's {layout.dp * layout.ep} replicas (its ep group"
                + (" times the data axis" if layout.dp > 1 else "")
                + (", FSDP's reduce-scatter)" if layout.shards_parameters else ", one flat all-reduce)"),
                "expert_gradients": "summed by the exchange over the ep group"
                + (
                    f", averaged over the data axis ({layout.dp} ranks, FSDP's reduce-scatter), divided by {layout.ep}"
                    if layout.shards_parameters
                    else (f", summed over the data axis ({layout.dp} ranks)" if layout.dp > 1 else "")
                    + f", divided by {layout.dp * layout.ep}"
                ),
                "reported_loss": "the global batch's: the mean of the stage replicas' pipelines' losses",
            }
            if not self.pipelined:
                out["expert_parallel"]["replicas"] = (
                    "each ep rank (with its tensor-parallel siblings) trains its own share of the batch"
                )
            if layout.tp > 1:
                out["expert_parallel"]["tensor_parallel"] = (
                    f"every held expert split over its hidden width over the tp axis ({layout.tp} ranks, Megatron's "
                    "expert tensor parallelism); the ep group is the ranks of one tp coordinate, each exchanging the "
                    "tokens its tp siblings route alike; the slices' partial outputs are summed over tp once back"
                )
        if layout.tp > 1:
            out["tensor_parallel"] = {
                "size": layout.tp,
                "sequence_parallel": layout.sequence_parallel,
                "plan": [list(entry) for entry in self._units.tp_plan],
                "whole_on_every_rank": "the stem and head (embeddings, final norm, LM head)",
            }
        if layout.dp > 1:
            out["data_parallel"] = {
                "kind": layout.data_parallel,
                "size": layout.dp,
                "how": "FSDP2 fully_shard per unit plus the rest as root, over the stage's dp x ep replicas; each "
                "MoE layer's held experts over the data axis"
                if layout.shards_parameters and layout.ep > 1
                else "FSDP2 fully_shard per unit plus the rest as root"
                if layout.data_parallel == Strategy.FSDP
                else "gradients all-reduced by hand with the expert axis's (see expert_parallel)"
                if layout.ep > 1
                else "DDP per pipeline stage",
            }
        if self.pipelined:
            out["pipeline"] = self._describe_pipeline()
        analytical = self._analytical()
        if analytical is not None:
            out["analytical"] = analytical
        return out

    def _describe_pipeline(self) -> dict[str, Any]:
        config, layout = self.request.config, self.layout
        p, v, m = layout.pp, layout.virtual_stages, layout.microbatches
        per_rank: dict[int, dict[str, Any]] = {}
        for log in self._logs:
            facts = log.executor_facts
            if "pp_rank" not in facts:
                continue
            entry = per_rank.setdefault(
                int(facts["pp_rank"]),
                {
                    "pp_rank": facts["pp_rank"],
                    "stages": facts["stages"],
                    "idle": [],
                    "ranks": [],
                    "peaks": [],
                },
            )
            entry["ranks"].append(log.rank)
            idle = facts["clock"].get("idle_fraction")
            if idle is not None:
                entry["idle"].append(idle)
            entry["peaks"].extend(
                b for b in log.epoch_peak_bytes[1:] or log.epoch_peak_bytes if b is not None
            )
        ranks = []
        for index in sorted(per_rank):
            e = per_rank[index]
            ranks.append(
                {
                    "pp_rank": index,
                    "stages": e["stages"],
                    "ranks": e["ranks"],
                    "idle_fraction": statistics.fmean(e["idle"]) if e["idle"] else None,
                    "peak_memory_bytes": max(e["peaks"]) if e["peaks"] else None,
                }
            )
        measured = [r["idle_fraction"] for r in ranks if r["idle_fraction"] is not None]
        units = self._units
        stages = self._stage_plan.describe(units) if self._stage_plan else []
        for stage in stages:
            stage["pp_rank"] = layout.stage_holder(stage["stage"])
        return {
            "schedule": layout.schedule,
            "torch_schedule": f"Schedule{TORCH_SCHEDULES[layout.schedule]}",
            "ranks": p,
            "virtual_stages": v,
            "stages": layout.stages,
            "microbatches": m,
            "microbatch_size": config.batch_size // m,
            "split": f"by {layout.split}"
            + (" (units dealt in equal counts)" if layout.split == "layers" else ""),
            "stage_units": stages,
            "tied": [
                f"{user} untied from {owner} on the stage that lacks it; gradients summed after each backward"
                for user, owner in units.tied
            ]
            if self._copies or self._tied
            else [],
            "bubble": {
                "analytical": pipeline_bubble(layout.schedule, p, m, v),
                "analytical_formula": "(p-1)/(v m + p-1); none for zero-bubble schedules",
                "measured": statistics.fmean(measured) if measured else None,
                "measured_how": "per pipeline rank, 1 - (time in the schedule's forward/backward actions) / (step "
                "time), over every step after the first; idle = bubble + communication not hidden by compute",
                "per_rank": ranks,
            },
        }

    def _analytical(self) -> dict[str, Any] | None:
        """The analytical model's figures for this layout (:func:`accelbench.estimate.parallel.estimate_parallel`)."""
        if self._shape is None or self.layout.ep > 1:  # the analytical model does not shard experts
            return None
        layout, plan = self.layout, self.request.precision
        param_bytes = torch.empty((), dtype=plan.torch_param_dtype).element_size()
        activation_dtype = plan.torch_autocast_dtype or plan.torch_param_dtype
        result = estimate_parallel(
            self._shape,
            layout,
            self.request.config.batch_size,
            param_bytes=param_bytes,
            grad_bytes=param_bytes,
            optimizer_bytes=2 * param_bytes,
            activation_bytes=torch.empty((), dtype=activation_dtype).element_size(),
        ).as_dict()
        result["note"] = (
            "estimates per device for the first pipeline rank (accelbench.estimate.parallel.estimate_parallel): memory by "
            "kind; communication per step by mesh axis in bytes moved (nccl-tests' bus bytes)"
        )
        return result


def gradient_squares(grads: list[torch.Tensor], foreach: bool, device: torch.device) -> torch.Tensor:
    """The sum of the squares of ``grads`` (their global L2 norm squared) as a float32 scalar on ``device``: each
    mesh's DTensor gradients reduced over it, then the plain ones (foreach kernels take one kind at a time). What
    the executor's clipping and the traced step's (:mod:`accelbench.estimate.operators`) compute."""
    by_mesh: dict[Any, list[torch.Tensor]] = {}
    plain: list[torch.Tensor] = []
    for grad in grads:
        if isinstance(grad, DTensor):
            by_mesh.setdefault(grad.device_mesh, []).append(grad)
        else:
            plain.append(grad)
    squares = torch.zeros((), device=device, dtype=torch.float32)
    for kind in (*by_mesh.values(), plain):
        if kind:
            norm = torch.nn.utils.get_total_norm(kind, foreach=foreach)
            squares += (norm.full_tensor() if isinstance(norm, DTensor) else norm).float() ** 2
    return squares


def scale_gradients(params: list[nn.Parameter], norm: torch.Tensor, max_norm: float) -> None:
    """Scale the gradients of ``params`` (DTensors' local shards in place) as ``clip_grad_norm_`` does for a
    global norm ``norm``: by ``min(1, max_norm / (norm + 1e-6))``."""
    coefficient = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for p in params:
        assert p.grad is not None
        grad = _local(p.grad)
        grad.mul_(coefficient.to(grad.dtype))


def unmixed(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The workload's optimizer with each parameter group split by kind (plain tensors, DTensors of each mesh):
    fused and foreach kernels take one kind at a time, and tensor parallelism leaves the stem and head plain. The
    groups keep their settings (weight decay, ...), so the updates are the workload's own. Done before any step."""
    groups = list(optimizer.param_groups)
    optimizer.param_groups.clear()
    for group in groups:
        kinds: dict[Any, list[torch.Tensor]] = {}
        for param in group["params"]:
            kinds.setdefault(param.device_mesh if isinstance(param, DTensor) else None, []).append(param)
        settings = {k: v for k, v in group.items() if k != "params"}
        for params in kinds.values():
            optimizer.add_param_group({**settings, "params": params})
    return optimizer


def _shape_of(model: nn.Module, units: ModelUnits) -> TransformerShape | None:
    """The model as the analytical model sees it: counted parameters of a unit and of the rest."""
    if units.hidden_size is None or units.sequence_length is None or not units.units:
        return None
    seen: set[int] = set()

    def count(paths: tuple[str, ...]) -> int:
        total = 0
        for module in units.modules(model, paths):
            for p in module.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    total += p.numel()
        return total

    # the mean block: a mixture's dense first blocks are smaller than its MoE blocks, and the total is right
    layer = sum(count((unit,)) for unit in units.units) // len(units.units)
    other = count(units.stem) + count(units.head)
    heads = dict(units.tp_divides).get("attention heads", 1)
    return TransformerShape(
        layers=len(units.units),
        hidden=units.hidden_size,
        heads=heads,
        sequence=units.sequence_length,
        vocab=0,
        layer_parameters=layer,
        other_parameters=other,
        stem_parameters=units.parameter_count(model, units.stem),
        head_parameters=units.parameter_count(model, units.head),
    )
