"""Workloads: what is trained. The core ships the GPT reference workload; plugins may register more.

A workload is a first-class object (:class:`Workload`): it declares its own run options, the size names ``--model``
takes, what identifies a comparable run, the units a strategy may shard or pipeline, and builds a
:class:`TrainingJob` (model, data, optimizer recipe, FLOPs). Register one through the
``accelbench_register_workloads`` hook; ``accelbench compare``, ``report`` and ``sweep`` then work for it unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from accelbench.config import RunConfig
    from accelbench.contract import RunOption, Scalar

    Batch = tuple[torch.Tensor, torch.Tensor]


class BatchSource(Protocol):
    """Training data for one run. Batches are produced on the host; the runner moves them to the device."""

    samples_per_epoch: int

    def steps(self, rank: int, world_size: int) -> int:
        """How many batches ``batches`` yields for this rank."""
        ...

    def batches(self, epoch: int, rank: int, world_size: int) -> Iterator[Batch]:
        """This rank's share of one epoch, as (inputs, targets) host tensors. Deterministic per seed and epoch."""
        ...

    def describe(self) -> dict[str, Any]:
        """Facts for the result record (source, size, vocabulary, where batches are made)."""
        ...

    # Optional: ``to_device(device, placement) -> BatchSource | None``, the same batches made on an accelerator
    # (``placement`` is 'auto' or 'device'; None declines, for 'auto' only). The runner uses it when the run's
    # --data-placement allows; sources without it are copied to the device batch by batch.


@dataclass(frozen=True)
class ModelUnits:
    """The parts of a workload's model that strategies may shard, place or pipeline, by submodule path.

    In execution order: ``stem`` (before the repeated units, e.g. embeddings), ``units`` (the repeated blocks,
    e.g. transformer layers), ``head`` (after them). ``split_points`` optionally names, for each unit, the submodule
    where a finer placement may cut it in two (the GPT: its second LayerNorm, between attention and MLP).
    ``tied`` lists parameters shared between parts as (user, owner) paths, e.g. a head tied to the embedding.
    FSDP wraps each unit; pipeline and IPU mappings cut between them; none of them reach into model attributes.

    Tensor and pipeline parallelism (``accelbench.engine.parallel``) need a little more, all optional:
    ``tp_plan`` says how tensor parallelism splits a unit, as (submodule path within the unit, style): ``colwise``
    (output features sharded), ``colwise:N`` (the output packs N equal parts, e.g. a fused q/k/v projection, each
    part sharded on its own), ``rowwise`` (input features sharded, partial outputs summed) and ``norm`` (a
    normalisation, run on sequence shards with sequence parallelism); ``tp_divides`` names the sizes the
    tensor-parallel size must divide (the GPT's attention heads and width); ``sequence_length`` and ``hidden_size``
    are the shape of what flows between units (what pipeline stages send); ``stem_method``, ``head_method`` and
    ``loss_method`` name the model's methods that run the stem on the inputs, the head on the last unit's output
    and the loss on the head's output and the targets, so a pipeline can run the model in pieces:
    ``model(inputs, targets) == loss(head(units(stem(inputs))), targets)``. ``experts``: a mixture of experts'
    routed experts per layer, which an expert-parallel axis deals out (its model's MoE layers have
    ``shard_experts(group, rank, size)`` and ``expert_parameters()``, :mod:`accelbench.engine.parallel.ep`).
    ``unit_loss_methods``: a model whose units compute loss terms of their own (a mixture's balance losses), as
    (the method that makes the units add those terms' gradients in backward themselves, the method that returns and
    forgets their summed value since its last call, or None): a pipeline's stages hand on hidden states only, so the
    terms cannot reach the last stage's loss; it calls the first once and adds the second's value, over its stages,
    to the loss it reports. ``checkpointable``: a unit's forward may run again in backward with the same result and
    no side effect (``--activation-checkpointing``, :mod:`accelbench.engine.checkpointing`); not so for a unit that
    updates state as it runs (batch-norm statistics, a router's balancing bias).
    """

    stem: tuple[str, ...]
    units: tuple[str, ...]
    head: tuple[str, ...]
    split_points: tuple[str, ...] = ()
    tied: tuple[tuple[str, str], ...] = ()
    tp_plan: tuple[tuple[str, str], ...] = ()
    tp_divides: tuple[tuple[str, int], ...] = ()
    sequence_length: int | None = None
    hidden_size: int | None = None
    stem_method: str | None = None
    head_method: str | None = None
    loss_method: str | None = None
    # routed experts per mixture-of-experts layer (0: none): what an expert-parallel (ep) axis shards and must divide
    experts: int = 0
    unit_loss_methods: tuple[str, str] | None = None
    checkpointable: bool = False

    def modules(self, model: torch.nn.Module, paths: tuple[str, ...] | None = None) -> list[torch.nn.Module]:
        """The submodules of ``model`` at ``paths`` (default: the units), in order."""
        return [model.get_submodule(path) for path in (self.units if paths is None else paths)]

    def parameter_count(self, model: torch.nn.Module, paths: tuple[str, ...]) -> int:
        """The parameters of the submodules at ``paths``, each tensor once (a tied one included: the head's stage
        holds its own copy of a tensor tied to the embedding)."""
        tensors = {id(p): p.numel() for module in self.modules(model, paths) for p in module.parameters()}
        return sum(tensors.values())


class StepCounts(Protocol):
    """Counts a workload's model keeps while it trains, for the record: the mixture-of-experts' tokens per expert.
    The runner resets them before each timed epoch and reads them right after its last step, so they cover the timed
    steps only (not the untimed probes between epochs); every rank's are summed, element by element, for the record.
    """

    def reset(self) -> None:
        """Forget what was counted."""
        ...

    def read(self) -> list[list[int]]:
        """What this rank counted since the last reset (a host copy: called outside the timed region)."""
        ...

    def summarise(self, counts: list[list[int]]) -> dict[str, Any]:
        """The entries the record's workload summary gains from ``counts`` (summed over epochs and ranks)."""
        ...


@dataclass
class TrainingJob:
    """A workload built for one run: model, data, optimizer recipe and the FLOPs it costs."""

    model: torch.nn.Module  # forward(inputs, targets) -> scalar loss
    data: BatchSource
    # (model, device, kernels) -> optimizer; kernels is the backend's choice, 'fused', 'foreach' or 'plain'
    # (Backend.optimizer_implementation): pass optimizer_kernels(kernels) to the torch optimizer
    make_optimizer: Callable[[torch.nn.Module, torch.device, str], torch.optim.Optimizer]
    flops_per_sample: float
    flops_formula: str
    tokens_per_sample: int
    units: ModelUnits
    grad_clip_norm: float | None = 1.0
    summary: dict[str, Any] = field(default_factory=dict)
    # transformer workloads: one sample's training FLOPs by Megatron-LM's count (seed 002), for "achieved TFLOP/s
    # per device" as Megatron papers report it (accelbench.estimate.parallel.megatron_flops_per_iteration)
    megatron_flops_per_sample: float | None = None
    # held-out data, never trained on, evaluated after each timed epoch (accelbench.engine.quality); its batches
    # are split over ranks like the training data's, and ``describe()`` says how the split was chosen
    validation: BatchSource | None = None
    # where a workload has an accuracy (the image and BERT workloads): (the output of the last ``units.head``
    # module on a held-out batch, its targets) -> (predictions right, predictions made), as device tensors
    accuracy: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None
    # counts kept during the timed steps and added to the record's summary (the moe workload's routing balance)
    step_counts: StepCounts | None = None
    # precise batch norm: before each held-out evaluation, the batch-norm running statistics are recomputed over
    # this many training batches (Executor.norm_statistics_recomputed); 0: evaluate with the training's own
    norm_statistics_batches: int = 0


@runtime_checkable
class Workload(Protocol):
    """A named workload. Register instances through the ``accelbench_register_workloads`` hook.

    Every method that checks a request raises :class:`accelbench.errors.ConfigError` with an actionable message;
    nothing is measured before they all pass.
    """

    name: str
    description: str

    def options(self) -> list[RunOption]:
        """The run options this workload reads (``RunConfig.workload_options``), declared as plugins declare
        theirs: name, type, default, bounds, help. Names must not clash with core options."""
        ...

    def model_names(self) -> list[str]:
        """The size names ``--model`` accepts; the first is the default when ``--model`` is not given."""
        ...

    def check(self, config: RunConfig) -> None:
        """Refuse a configuration this workload cannot run (beyond each option's own bounds), before any device
        is touched: e.g. a custom size without all its dimensions. ``config.workload_options`` is resolved."""
        ...

    def identity(self, config: RunConfig) -> dict[str, Scalar]:
        """What, beyond the core's batch size, precision, strategy and data, makes two runs the same work: the
        key ``accelbench compare`` groups by. Recorded as ``workload_identity``; its ``model`` entry, if any, is
        how comparisons name the model (e.g. ``custom 1L/2H/16E``), else the config's ``--model`` is."""
        ...

    def units(self, config: RunConfig) -> ModelUnits:
        """The model's shardable/placeable parts for ``config``, known before the model is built."""
        ...

    def build(self, config: RunConfig) -> TrainingJob:
        """Build model and data for ``config``."""
        ...

    # Optional, not part of the protocol: ``parameters(config) -> int``, the parameters the model will have (or a
    # lower bound), known without building it. Where a workload defines it, `accelbench run` refuses up front a
    # model whose fp32 weights the host's memory cannot hold (:func:`accelbench.engine.runner.check_model_fits_host`).
    # Optional too: ``check_run(config) -> None``, what training needs beyond what a build for its shapes does (a
    # tokenizer package), refused by `accelbench run`'s preflight; `estimate` and `plan` do not ask it.
    # Optional too: ``prepare(config) -> None``, called once by the process that launches a multi-process job's
    # workers, before they start: work every worker would otherwise repeat at once (the llama's tokenizer cache).


def register_all(register: Callable[[Workload], None]) -> None:
    """The core's own workloads (called by the core's default ``accelbench_register_workloads``)."""
    from accelbench.workloads.bert import BertWorkload
    from accelbench.workloads.gpt import GPTWorkload
    from accelbench.workloads.llama import LlamaWorkload
    from accelbench.workloads.moe import MoEWorkload
    from accelbench.workloads.vision import MODELS, VisionWorkload

    register(GPTWorkload())
    for spec in MODELS.values():
        register(VisionWorkload(spec))
    register(BertWorkload())
    register(LlamaWorkload())
    register(MoEWorkload())


def optimizer_kernels(implementation: str) -> dict[str, bool]:
    """The keyword arguments that make a torch optimizer run ``implementation``'s kernels ('fused': one kernel
    for every parameter; 'foreach': grouped kernels; 'plain': a loop over parameters)."""
    if implementation == "fused":
        return {"fused": True}
    if implementation == "foreach":
        return {"foreach": True}
    if implementation == "plain":
        return {"foreach": False}
    raise ValueError(f"unknown optimizer implementation {implementation!r}; known: fused, foreach, plain")


# A build for its shapes alone (accelbench estimate's meta-device and fake-tensor builds): no values are drawn
_SHAPES_ONLY: ContextVar[bool] = ContextVar("accelbench_shapes_only", default=False)
# torch.nn.init's initialisers, which such a build skips
INITIALISERS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
                "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_",
                "sparse_")  # fmt: skip


@contextlib.contextmanager
def shapes_only() -> Iterator[None]:
    """Within it a workload is built for its shapes alone (on the meta device or under fake tensors: no values):
    torch.nn.init's initialisers return their tensor untouched (drawing a 128k-row, 8192-wide embedding under fake
    tensors runs torch's reference decomposition for seconds), and a workload may make its data without what only
    values need (:func:`building_shapes_only`: the llama's tokenizer)."""
    import torch.nn.init as init

    saved = {name: getattr(init, name) for name in INITIALISERS if hasattr(init, name)}

    def untouched(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        return tensor

    token = _SHAPES_ONLY.set(True)
    try:
        for name in saved:
            setattr(init, name, untouched)
        yield
    finally:
        for name, function in saved.items():
            setattr(init, name, function)
        _SHAPES_ONLY.reset(token)


def building_shapes_only() -> bool:
    """Whether the build under way is for its shapes alone (:func:`shapes_only`)."""
    return _SHAPES_ONLY.get()
