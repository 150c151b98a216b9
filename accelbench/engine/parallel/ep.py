"""The executor of an expert-parallel mesh (``--mesh ep=N``, ``--mesh ddp=D,ep=N`` or ``--mesh dp=D,ep=N``): a
mixture of experts' routed experts dealt out over the ep ranks, everything else replicated (``ddp``) or sharded by
FSDP2 (``dp``/``fsdp``: the experts over the data axis, the rest over every rank).

Every rank trains its own share of the batch, as under DDP (the ep ranks are data-parallel for the rest of the
model). Each MoE layer keeps ``experts / ep`` of its experts (slices of the weights the one-device model was
initialised with) and exchanges tokens with its ep group: each token goes to the rank holding its expert and its
output comes back, by torch's differentiable ``all_to_all_single_autograd``, whose backward is the reverse exchange
(:meth:`accelbench.workloads.moe.model.MoEFeedForward.shard_experts`).

Gradients, so that a step is the one-device step on the whole (global) batch, whose loss is the mean of the ranks'
losses (equal batches):

- replicated parameters: each rank's gradient is of its own loss; they are averaged over every rank (DDP's all-reduce,
  one flat buffer);
- an expert's weights: the backward exchange already summed, on the rank holding it, the gradients of every ep rank's
  tokens (each of its own loss); these sums are summed over the data axis (the ranks holding the same experts) and
  divided by the number of ranks, the same 1/world the replicated average applies;
- clipping: the global norm, the replicated gradients' (the same on every rank) with the experts' squares summed over
  the ep group (each expert counted once).

The reported loss is the global batch's (the mean over ranks), so it is the one-device run's. The held-out loss and
the gradient-norm probe run the exchanges too: every rank takes part in each, as the held-out sources give every rank
as many batches of the same sizes.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.tensor import DTensor

from accelbench.contract import DataShard, ExecutorRequest, World
from accelbench.contract.strategies import Strategy
from accelbench.engine.parallel.executor import unmixed
from accelbench.engine.parallel.mesh import MeshExecutor, build_device_mesh
from accelbench.errors import ConfigError
from accelbench.workloads import TrainingJob


class ExpertParallelExecutor(MeshExecutor):
    """Experts sharded over the ep axis, the rest replicated over every rank (``--mesh ep=N`` / ``ddp=D,ep=N``)."""

    def __init__(self, request: ExecutorRequest) -> None:
        super().__init__(request)
        self.model: nn.Module
        self.optimizer: torch.optim.Optimizer
        self._expert_params: list[nn.Parameter] = []
        self._replicated: list[nn.Parameter] = []
        self._experts_per_rank = 0

    def setup(self, job: TrainingJob) -> None:
        layout = self.layout
        model = job.model.to(device=self.device, dtype=self.request.precision.torch_param_dtype).train()
        layers: list[Any] = [m for m in model.modules() if hasattr(m, "shard_experts")]
        if not layers:
            raise ConfigError(
                f"--mesh {self.request.config.mesh}: workload {self.request.config.workload!r} has no expert layers "
                "to shard over the ep axis; use --workload moe"
            )
        # every rank makes every group, in the same order (new_group is collective), and keeps its own
        self._ep_group = self._my_group("ep")
        self._dp_group = self._my_group("dp") if layout.dp > 1 else None
        for layer in layers:
            layer.shard_experts(self._ep_group, self.coordinates["ep"], layout.ep)
        experts = {id(p) for layer in layers for p in layer.expert_parameters()}
        self._expert_params = [p for p in model.parameters() if id(p) in experts]
        self._replicated = [p for p in model.parameters() if id(p) not in experts]
        self._experts_per_rank = layers[0].local_experts
        # the ranks start from the same weights (the same seed): made sure, as DDP does, by rank 0's broadcast
        for p in self._replicated:
            dist.broadcast(p.data, src=0)
        self.sharded = layout.data_parallel == Strategy.FSDP
        if self.sharded:
            self._fully_shard(model, layers, job)
        self.model = model
        self.optimizer = unmixed(
            job.make_optimizer(model, self.device, self.backend.optimizer_implementation(self.device))
        )
        self._clip = job.grad_clip_norm

    def _fully_shard(self, model: nn.Module, layers: list[Any], job: TrainingJob) -> None:
        """FSDP2 on an fsdp data axis: each layer's experts sharded over the data axis (the ranks holding the same
        experts), each unit and the root over every rank. FSDP's reduce-scatter then does what the DDP path's
        all-reduces do: the replicated gradients averaged over every rank, an expert's averaged over the data axis
        (after the exchange summed it over the ep group), then divided by ep in :meth:`_reduce_gradients` (FSDP's own
        divide factor would need NCCL's PreMulSum, which gloo lacks)."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        dp_mesh = build_device_mesh(self.layout, self.device.type)["dp"]
        world_mesh = init_device_mesh(self.device.type, (self.world,), mesh_dim_names=("world",))
        for layer in layers:
            fully_shard(layer.experts, mesh=dp_mesh)
        for unit in job.units.modules(model):
            fully_shard(unit, mesh=world_mesh)
        fully_shard(model, mesh=world_mesh)
        experts = {id(p) for layer in layers for p in layer.expert_parameters()}
        self._expert_params = [p for p in model.parameters() if id(p) in experts]
        self._replicated = [p for p in model.parameters() if id(p) not in experts]

    def _my_group(self, axis: str) -> Any:
        mine = None
        for ranks in self.layout.groups(axis):
            group = dist.new_group(ranks)
            if self.rank in ranks:
                mine = group
        return mine

    def data_shard(self, world: World) -> DataShard:
        return DataShard(world.rank, world.world_size)  # every rank its own share of the batch

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with self._autocast:
            loss = self.model(inputs, targets)
        loss.backward()
        self.backend.after_backward(self.device)
        self._reduce_gradients()
        if self._clip is not None:
            self._clip_gradients(self._clip)
        self.optimizer.step()
        self.backend.after_optimizer_step(self.device)
        self.optimizer.zero_grad(set_to_none=True)
        reported = loss.detach().float()
        dist.all_reduce(reported)  # the global batch's loss: the mean of the ranks' (equal batches)
        return reported / self.world

    def _reduce_gradients(self) -> None:
        """Replicated gradients averaged over every rank; experts' summed over the data axis and divided by the
        ranks (see the module docstring), one flat buffer each. Under FSDP, which reduced them in backward (each
        over its mesh, averaged), only the experts' are left to divide by ep."""
        if self.sharded:
            for p in self._expert_params:
                if p.grad is not None:
                    _local(p.grad).div_(self.layout.ep)
            return
        self._sum_then_scale(self._replicated, dist.group.WORLD)
        self._sum_then_scale(self._expert_params, self._dp_group)

    def _sum_then_scale(self, params: list[nn.Parameter], group: Any) -> None:
        """The gradients of ``params`` summed over ``group`` (None: not reduced) and divided by the ranks."""
        grads = []
        for p in params:
            if p.grad is None:  # a parameter no token reached on this rank still takes part in the sum
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        if not grads:
            return
        flat = _flatten_dense_tensors(grads)
        if group is not None:
            dist.all_reduce(flat, group=group)
        flat.div_(self.world)
        for grad, reduced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
            grad.copy_(reduced)

    def _global_norm(self) -> torch.Tensor:
        """The norm of the whole model's gradient, as on one device: the replicated gradients (the same on every
        rank after the reduction) and the experts', whose squares are summed over the ep group (each counted once)."""
        foreach = self.backend.optimizer_implementation(self.device) != "plain"
        replicated = [p.grad for p in self._replicated if p.grad is not None]
        experts = [p.grad for p in self._expert_params if p.grad is not None]
        squares = torch.zeros((), device=self.device, dtype=torch.float32)
        if experts:
            squares += _whole(torch.nn.utils.get_total_norm(experts, foreach=foreach)).float() ** 2
        dist.all_reduce(squares, group=self._ep_group)
        if replicated:
            squares += _whole(torch.nn.utils.get_total_norm(replicated, foreach=foreach)).float() ** 2
        return squares.sqrt()

    def _clip_gradients(self, max_norm: float) -> None:
        """Clip by the global norm, as ``clip_grad_norm_`` on one device."""
        coefficient = torch.clamp(max_norm / (self._global_norm() + 1e-6), max=1.0)
        for p in self.model.parameters():
            if p.grad is not None:  # each shard's local gradient (FSDP's DTensors of two meshes)
                grad = _local(p.grad)
                grad.mul_(coefficient.to(grad.dtype))

    def evaluate(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """This rank's held-out loss (eval mode, no gradients; the exchanges run as in training: every rank
        evaluates as many equal batches, which the held-out sources give each rank)."""
        self.model.eval()
        try:
            with torch.no_grad(), self._autocast:
                return self.model(inputs, targets).detach().float()
        finally:
            self.model.train()

    def gradient_norm(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """The global gradient norm of one training forward and backward on every rank's batch, reduced as a step
        reduces it, then cleared: no optimizer step."""
        self.optimizer.zero_grad(set_to_none=True)
        with self._autocast:
            loss = self.model(inputs, targets)
        loss.backward()
        self.backend.after_backward(self.device)
        self._reduce_gradients()
        norm = self._global_norm().detach()
        self.optimizer.zero_grad(set_to_none=True)
        self.backend.end_of_step(self.device)
        return norm

    def describe(self) -> dict[str, Any]:
        config, layout = self.request.config, self.layout
        defaults = getattr(getattr(self, "optimizer", None), "defaults", {})
        return {
            "executor": type(self).__name__,
            "strategy": config.strategy,
            "torch_compile": False,
            "compile_mode": None,
            "cuda_graphs": False,
            "mesh": {"text": config.mesh, **layout.describe()},
            "optimizer": type(self.optimizer).__name__ if hasattr(self, "optimizer") else None,
            "fused_optimizer": bool(defaults.get("fused")),
            "grad_clip_norm": self._clip,
            "expert_parallel": {
                "size": layout.ep,
                "experts_per_rank": self._experts_per_rank,
                "exchange": "torch.distributed._functional_collectives.all_to_all_single_autograd over each ep group: tokens to the "
                "rank holding their expert and back, twice per MoE layer forward and twice backward",
                "sharding": f"FSDP2: each layer's experts over the data axis ({layout.dp} ranks), each unit and the "
                f"root over all {self.world} ranks"
                if self.sharded
                else "none: the replicated parameters whole on every rank (DDP-style)",
                "replicated_gradients": f"averaged over all {self.world} ranks ("
                + ("FSDP's reduce-scatter)" if self.sharded else "one flat all-reduce)"),
                "expert_gradients": "summed by the exchange over the ep group"
                + (
                    f", reduced over the data axis ({layout.dp} ranks"
                    + (", FSDP's reduce-scatter)" if self.sharded else ")")
                    if layout.dp > 1
                    else ""
                )
                + f", divided by {self.world} in all",
                "reported_loss": "the global batch's: the mean of the ranks' losses",
            },
            "samples_counted": "on every rank (each trains its own share of the batch)",
        }


def _whole(norm: torch.Tensor) -> torch.Tensor:
    """A norm over sharded (DTensor) gradients made whole over their mesh; a plain tensor as it is."""
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (FSDP's), or the tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor
