"""The executor: the one object the runner trains through, and what a backend gets to build one.

``Backend.executor`` returns an :class:`Executor`. It owns model wrapping, the optimizer step and any compile step,
so devices that compile a whole graph before running (IPUs) or replicate by themselves fit the same runner as eager
GPUs and CPUs. The core's executors (single device, DDP, FSDP, DeepSpeed ZeRO, tensor/pipeline/mesh, Lightning)
implement it; ``ExecutorRequest.default_executor`` builds the core's one for the request, so a backend can wrap it.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from accelbench.config import RunConfig
    from accelbench.contract.backend import Backend
    from accelbench.contract.precision import PrecisionPlan
    from accelbench.engine.metrics import RankLog
    from accelbench.workloads import ModelUnits, TrainingJob


@dataclass(frozen=True)
class World:
    """Where this process sits in a (possibly single-process) job, as the launcher set it up."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1  # processes on this node
    nnodes: int = 1


@dataclass(frozen=True)
class ExecutorRequest:
    """What a backend needs to build an executor."""

    config: RunConfig  # the whole run: strategy, devices, batch size, compile, backend_options, ...
    device: torch.device
    precision: PrecisionPlan
    world: World
    backend: (
        Backend  # the selected backend: step boundaries, clipping, compile and synchronisation go through it
    )
    units: ModelUnits | None = (
        None  # the workload's model parts for this config, known before the model is built
    )
    default_executor: Callable[[ExecutorRequest], Executor] | None = (
        None  # the core's executor for this request
    )

    @property
    def strategy(self) -> str:
        return self.config.strategy

    def synchronize(self, device: torch.device) -> None:
        """The backend's device synchronisation (before a clock is read)."""
        self.backend.synchronize(device)


@dataclass(frozen=True)
class DataShard:
    """Which share of each epoch's batches a process trains on (``index`` of ``count``), and whether its samples
    count toward the run's throughput. Data parallelism gives every rank its own share; the ranks that together
    hold one copy of the model (tensor- or pipeline-parallel) train on the same share, and one of them counts it."""

    index: int
    count: int
    counts_samples: bool = True


class Executor(ABC):
    """Trains a :class:`~accelbench.workloads.TrainingJob` one step at a time.

    The runner calls ``setup`` once, ``compile`` once on a sample batch (timed apart from training), then
    ``train_step`` for every batch, and ``close`` at the end, also after a failure. Every executor calls the
    backend's step boundaries (``Backend.after_backward`` after each backward pass, ``Backend.after_optimizer_step``
    after each optimizer step); the runner calls ``Backend.end_of_step`` after each ``train_step``.
    """

    @abstractmethod
    def setup(self, job: TrainingJob) -> None:
        """Wrap the model, place it on the device, build the optimizer."""

    def compile(self, inputs: torch.Tensor, targets: torch.Tensor) -> float | None:
        """Compile ahead of training if this executor compiles; return seconds spent, or None if it does not.

        Must leave the model's weights as they were (a compile may run a step, but not apply it).
        """
        return None

    @abstractmethod
    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """One optimizer step on a batch already on the device. Returns the loss as a detached device tensor.

        Must not synchronise the device (no ``.item()``): the runner synchronises once per epoch.
        """

    def evaluate(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """The loss of a held-out batch (on the device) without training: eval mode, no gradients, the weights
        unchanged; called on every rank after an epoch's timed region. Returns the loss as a detached device
        tensor, or None where this executor cannot evaluate (the run then records no validation loss)."""
        return None

    def norm_statistics_recomputed(
        self, batches: Iterable[tuple[torch.Tensor, torch.Tensor]]
    ) -> contextlib.AbstractContextManager[int | None]:
        """A context, entered on every rank before a held-out evaluation where the workload asks for precise batch
        norm (``TrainingJob.norm_statistics_batches``): inside it the model's batch-norm running statistics are
        those of ``batches`` (training batches on the device, forward only, no gradients, the batch norms in train
        mode and the rest as evaluation runs it), and on leaving they are the training's again. It yields how many
        batches it used, or None where this executor cannot recompute them (the evaluation then reads the
        training's running statistics, and the record says so). Since contract 3.1."""
        return contextlib.nullcontext(None)

    def gradient_norm(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """The total L2 norm of the gradients one forward and backward of a batch gives, as training computes them
        (train mode, the same precision and hooks), without an optimizer step: the weights unchanged and the
        gradients cleared after. Called on every rank after an epoch's timed region; None where this executor
        cannot probe its gradients."""
        return None

    def describe(self) -> dict[str, Any]:
        """What really ran (compiled or not, fused optimizer, ...), for the result record."""
        return {}

    @property
    def replays_graphs(self) -> bool:
        """True when steps replay captured device graphs (CUDA graphs). Their memory comes from a private pool that
        replays never allocate from, so the allocator's allocated-bytes peak does not see it (on an H200 it read
        0.5 GiB for a step that holds 19 GiB); the runner then records the reserved peak instead."""
        return False

    def effective_precision(self, requested: PrecisionPlan) -> PrecisionPlan:
        """The precision that really runs, recorded in place of the request (an engine with its own mixed
        precision, such as DeepSpeed's bf16 mode, keeps bf16 parameters with fp32 master weights)."""
        return requested

    def close(self) -> None:
        """Release the device (detach IPUs, destroy process groups the executor created)."""

    def data_shard(self, world: World) -> DataShard:
        """This process's share of the data (see :class:`DataShard`); every rank its own by default."""
        return DataShard(world.rank, world.world_size)

    def tensors_before_step(self) -> list[torch.nn.Module | torch.optim.Optimizer | torch.Tensor] | None:
        """What holds tensors before a training step begins: the modules (parameters, buffers), the optimizers (their
        state) and any tensor the executor keeps by itself. The tensor-peak step registers them with MemTracker
        (``track_external``) as alive when it starts; the step's own operators it sees. None where this executor
        cannot say (the run then records no tensor peak, with a note). By default its ``model`` and ``optimizer``
        attributes, where both are torch's."""
        import torch

        model, optimizer = getattr(self, "model", None), getattr(self, "optimizer", None)
        if isinstance(model, torch.nn.Module) and isinstance(optimizer, torch.optim.Optimizer):
            return [model, optimizer]
        return None

    def why_no_tensor_peak(self) -> str | None:
        """Why this executor's step cannot run under a tracker of the dispatcher and its module hooks as it ran
        timed (say, a schedule whose backward the tracker's hooks cannot follow), or None: it can. Said before the
        step runs, on every rank alike, so no rank waits in a collective its peers never reach."""
        return None

    def tensor_peak_caveat(self) -> str | None:
        """What this executor's step keeps that a dispatch-level tracker cannot attribute as such (an engine's own
        flat buffers made at set-up, say), recorded as a note beside its tensor peak; None where there is nothing
        beyond what every measurement leaves out."""
        return None

    def rank_facts(self) -> dict[str, Any]:
        """What this rank measured that the record needs from every rank (a pipeline rank's idle time), as plain
        data. The runner sends it to rank 0 with the rank's log, after training."""
        return {}

    def add_rank_logs(self, logs: list[RankLog]) -> None:
        """On rank 0, before :meth:`describe`: every rank's log (its measurements and ``executor_facts``, what
        :meth:`rank_facts` returned there), or rank 0's alone when another rank failed."""
