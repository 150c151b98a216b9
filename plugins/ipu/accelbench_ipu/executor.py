"""The PopTorch executor: annotates the workload's model for the chosen strategy, compiles it on a sample batch (timed
apart, cold and cached), and trains through ``poptorch.trainingModel``.

PopTorch executors take host tensors and stream them to the IPUs themselves, so the runner's batches stay on
the host (the backend's ``setup_device`` returns the CPU device on purpose); the host-to-IPU copy is part of
each timed step, as the host-to-GPU copy is on GPUs.

Every backward pass and optimizer step of a ``train_step`` runs on the IPUs inside one PopTorch call; the backend's
step boundaries (``after_backward``, ``after_optimizer_step``) are called when it returns, in the order those passes
ran, so the executor keeps the contract every executor keeps.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from accelbench.contract import Executor, ExecutorRequest, PrecisionPlan
from accelbench.errors import BackendError, ConfigError
from accelbench.workloads import TrainingJob
from accelbench_ipu import memory
from accelbench_ipu.detect import SDK_NOTE
from accelbench_ipu.layout import Layout
from accelbench_ipu.precision import ipu_precision_plan
from accelbench_ipu.settings import IpuSettings, settings_from_config

_ACCUM_TYPES = (
    "accum_type",
    "first_order_momentum_accum_type",
    "second_order_momentum_accum_type",
    "velocity_accum_type",
)
# the hyper-parameters carried over from the workload's torch optimizer, by optimizer (weight decay is per group)
_HYPER_PARAMETERS = {
    "AdamW": ("lr", "betas", "eps"),
    "SGD": ("lr", "momentum", "nesterov"),
    "RMSprop": ("lr", "alpha", "eps", "momentum"),
}


def import_poptorch() -> ModuleType:
    """poptorch, or a BackendError saying where it comes from."""
    try:
        import poptorch
    except ImportError as exc:
        raise BackendError(SDK_NOTE) from exc
    return poptorch


def annotate(model: torch.nn.Module, layout: Layout, poptorch: ModuleType) -> Any:
    """Open every block of ``layout`` on its module (``poptorch.BeginBlock``) and return the execution
    strategy that maps the blocks to stages (and phases) on IPUs."""
    modules = dict(model.named_modules())
    for block in layout.blocks:
        if block.module not in modules:
            raise BackendError(
                f"the IPU layout needs module {block.module!r}, which this model does not have"
            )
        poptorch.BeginBlock(modules[block.module], block.block_id, block.ipu)

    def stage(spec: Any) -> Any:
        return poptorch.Stage(*spec.blocks).ipu(spec.ipu)

    if layout.phases is None:
        stages = [stage(s) for s in layout.stages]
        if layout.strategy == "sharded":
            return poptorch.ShardedExecution(*stages)
        return poptorch.PipelinedExecution(*stages)  # also "single": one stage on IPU 0
    phases = [poptorch.Phase(*[stage(s) for s in layout.phase_stages(p)]) for p in range(layout.phases)]
    # phases go in as separate arguments: the single-list form in PopTorch's docstring fails
    if layout.strategy == "serial-phased":
        return poptorch.SerialPhasedExecution(*phases)
    return poptorch.ParallelPhasedExecution(*phases)


def build_options(poptorch: ModuleType, settings: IpuSettings, strategy: Any) -> Any:
    """poptorch.Options for the run: layout, batch arithmetic, precision, cache, emulator."""
    opts = poptorch.Options()
    opts.deviceIterations(settings.device_iterations)
    opts.replicationFactor(settings.replicas)
    opts.Training.gradientAccumulation(settings.gradient_accumulation)
    opts.Training.accumulationAndReplicationReductionType(poptorch.ReductionType.Mean)
    opts.outputMode(poptorch.OutputMode.All)  # every micro-batch's loss: the epoch loss is their mean
    opts.randomSeed(settings.seed)
    opts.setExecutionStrategy(strategy)
    opts.Precision.setPartialsType(torch.half if settings.partials == "half" else torch.float)
    opts.Precision.enableStochasticRounding(settings.stochastic_rounding)
    opts.showCompilationProgressBar(False)
    if settings.auto_round:
        opts.autoRoundNumIPUs(True)
    if settings.executable_cache is not None:
        opts.enableExecutableCaching(str(settings.executable_cache))
    if settings.emulated:
        opts.useIpuModel(True)
    return opts


class PopTorchExecutor(Executor):
    """Pipelined, sharded, serial-phased, parallel-phased (or single-IPU) training through PopTorch, placed by the
    workload's units (the GPT's and BERT's layers, the image models' blocks)."""

    def __init__(
        self, request: ExecutorRequest, on_memory: Callable[[memory.GraphMemory], None] | None = None
    ) -> None:
        self.request = request
        self._on_memory = on_memory  # the backend's memory reading (its epoch_end reports it)
        if request.units is None:
            raise ConfigError("the IPU mapping needs the workload's model parts (ExecutorRequest.units)")
        self.settings = settings_from_config(
            request.config, request.units
        )  # refuses impossible requests up front
        s = self.settings
        self.plan = ipu_precision_plan(
            request.config.precision, s.partials, s.stochastic_rounding, s.loss_scaling
        )
        self._poptorch: ModuleType | None = None
        self._model: torch.nn.Module | None = None
        self._job: TrainingJob | None = None
        self._options: Any = None
        self._trainer: Any = None  # the poptorch.PoplarExecutor
        self._optimizer_info: dict[str, Any] = {}
        self._compile: dict[str, Any] = {
            "cache": "disabled" if s.executable_cache is None else "not compiled",
            "compile_cold_s": None,
            "compile_cached_s": None,
        }
        self._memory = memory.NOT_COMPILED

    # --------------------------------------------------------------------------------------------------
    def effective_precision(self, requested: PrecisionPlan) -> PrecisionPlan:
        """The plan with this run's partials, stochastic rounding and loss scaling (the backend's
        ``precision_plan`` makes the same one from the run's options)."""
        return self.plan

    @property
    def graph_memory(self) -> memory.GraphMemory:
        """Per-IPU memory from the last compile's graph profile (or why it is unknown)."""
        return self._memory

    def setup(self, job: TrainingJob) -> None:
        poptorch = self._poptorch = import_poptorch()
        model = job.model
        if len(job.units.units) != self.settings.layout.n_layer:
            raise BackendError(
                f"the layout was planned for {self.settings.layout.n_layer} units, the model has "
                f"{len(job.units.units)}"
            )
        self._check_fixed_batches(job)
        if self.plan.param_dtype == "float16":
            model = model.half()
        self._model = model.train()
        self._job = job
        self._options = build_options(
            poptorch, self.settings, annotate(model, self.settings.layout, poptorch)
        )
        self._trainer = self._wrap()

    def _check_fixed_batches(self, job: TrainingJob) -> None:
        """An IPU executable has fixed input shapes: a full epoch must not end with a partial batch."""
        world = self.request.world
        batch = self.settings.batch_size
        steps = job.data.steps(world.rank, world.world_size)
        samples = -(-job.data.samples_per_epoch // world.world_size)
        if steps * batch > samples:
            raise ConfigError(
                f"a full epoch has {samples} samples: {samples // batch} batches of {batch} and a last one of "
                f"{samples % batch}, which an IPU executable (fixed input shapes) cannot take; use "
                f"--steps-per-epoch {samples // batch} or fewer, or a --batch-size that divides {samples}"
            )

    def _wrap(self) -> Any:
        """A fresh poptorch.trainingModel with PopTorch's AdamW on the job's parameter groups."""
        assert self._poptorch is not None and self._model is not None and self._job is not None
        return self._poptorch.trainingModel(self._model, options=self._options, optimizer=self._optimizer())

    def _optimizer(self) -> torch.optim.Optimizer:
        """The PopTorch counterpart of the workload's optimizer (AdamW, SGD or RMSprop: ``poptorch.optim`` has the
        same class names) with its hyper-parameters and weight-decay groups (taken from the torch optimizer the job
        would build), plus PopTorch's loss scaling, fp32 optimizer state and gradient clipping."""
        assert self._poptorch is not None and self._model is not None and self._job is not None
        # only its parameter groups and hyper-parameters are used, never its kernels: built with plain kernels for
        # device type "ipu", which torch has no fused or foreach kernels for (the SDK's torch 2.0 fuses on CUDA only)
        reference = self._job.make_optimizer(self._model, torch.device("ipu"), "plain")
        kind = type(reference).__name__
        if kind not in _HYPER_PARAMETERS or not hasattr(self._poptorch.optim, kind):
            raise BackendError(
                f"the workload trains with {kind}, which the IPU mapping does not translate to poptorch.optim "
                f"(it translates {', '.join(_HYPER_PARAMETERS)})"
            )
        defaults = reference.defaults
        groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in reference.param_groups]
        optimizer_class = getattr(self._poptorch.optim, kind)
        accepted = inspect.signature(optimizer_class).parameters
        hyper = {name: defaults[name] for name in _HYPER_PARAMETERS[kind]}
        if "betas" in hyper:
            hyper["betas"] = tuple(hyper["betas"])
        extras: dict[str, Any] = {}
        if "loss_scaling" in accepted:
            extras["loss_scaling"] = self.settings.loss_scaling
        elif self.settings.loss_scaling != 1.0:
            raise BackendError(f"this poptorch's {kind} takes no loss_scaling; drop --ipu-loss-scaling")
        if self.plan.param_dtype == "float16":
            extras.update({name: torch.float32 for name in _ACCUM_TYPES if name in accepted})
        clip = self._job.grad_clip_norm
        clip_norm = float(clip) if clip is not None and "max_grad_norm" in accepted else None
        clipped = clip_norm is not None
        if clip_norm is not None:
            extras["max_grad_norm"] = clip_norm
        optimizer = optimizer_class(groups, weight_decay=0.0, **hyper, **extras)
        self._optimizer_info = {
            "optimizer": f"poptorch.optim.{kind}",
            **{k: list(v) if isinstance(v, tuple) else v for k, v in hyper.items()},
            "weight_decay_groups": [g["weight_decay"] for g in reference.param_groups],
            "loss_scaling": self.settings.loss_scaling,
            "moments_accum_type": "float32" if self.plan.param_dtype == "float16" else "as parameters",
            "grad_clip_norm": clip_norm,
            "grad_clip_note": None
            if clipped or clip is None
            else f"not applied: this poptorch's {kind} has no max_grad_norm (the workload asks for {clip})",
        }
        return optimizer

    # --------------------------------------------------------------------------------------------------
    def compile(self, inputs: torch.Tensor, targets: torch.Tensor) -> float | None:
        """Compile on the sample batch. With an executable cache, a cold compile is followed by a second
        wrapper loading the cached executable, so both times are in the record."""
        cache_dir = self.settings.executable_cache
        before = _cache_files(cache_dir)
        with memory.GraphProfile(self.settings.graph_profile) as profile:
            first = self._timed_compile(inputs, targets)
        after = _cache_files(cache_dir)
        if cache_dir is None:
            state, self._compile["compile_cold_s"] = "disabled", first
        elif after - before:
            state, self._compile["compile_cold_s"] = "miss", first
        elif before:
            state, self._compile["compile_cached_s"] = "hit", first
        else:
            state, self._compile["compile_cold_s"] = "unknown (no cache files seen)", first
        self._memory = profile.read(compiled=state != "hit")
        if self._on_memory is not None:
            self._on_memory(self._memory)
        if state == "miss":
            # load what was just cached: a second wrapper (PopTorch wraps a model once at a time)
            self._trainer.destroy()
            self._trainer = self._wrap()
            self._compile["compile_cached_s"] = self._timed_compile(inputs, targets)
            if _cache_files(cache_dir) != after:
                state = "miss; the second compile wrote to the cache again, so compile_cached_s is not a load"
        self._compile["cache"] = state
        seconds = getattr(self._trainer, "compilationTime", None)
        if callable(seconds):
            # informative only (PopTorch >= 3.3); the wall-clock figures above are the measurement
            with contextlib.suppress(Exception):
                self._compile["poptorch_compilation_time_s"] = float(seconds())
        cold = self._compile["compile_cold_s"]
        return cold if cold is not None else self._compile["compile_cached_s"]

    def _timed_compile(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        start = time.perf_counter()
        self._trainer.compile(inputs, targets)
        return time.perf_counter() - start

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if inputs.shape[0] != self.settings.batch_size:
            raise BackendError(
                f"a batch of {inputs.shape[0]} samples reached an executable compiled for {self.settings.batch_size}"
            )
        losses = self._trainer(inputs, targets)  # synchronous: returns when the IPUs are done
        self._step_boundaries()
        return losses.detach().float().mean()

    def _step_boundaries(self) -> None:
        """The backend's step boundaries for the passes the call just ran on the IPUs: per optimizer step
        (one per device iteration), one ``after_backward`` per accumulated micro-batch, then
        ``after_optimizer_step``."""
        backend, device = self.request.backend, self.request.device
        for _ in range(self.settings.device_iterations):
            for _ in range(self.settings.gradient_accumulation):
                backend.after_backward(device)
            backend.after_optimizer_step(device)

    # --------------------------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """The replica/IPU layout, batch arithmetic, precision options, compile times, memory and optimizer."""
        s = self.settings
        poptorch = self._poptorch
        stand_in = bool(getattr(poptorch, "__accelbench_stand_in__", False))
        if stand_in:
            timing = "stand-in poptorch on the CPU (a test double): these timings are not IPU measurements"
        elif s.emulated:
            timing = "IPU Model emulator: these timings are not IPU performance"
        else:
            timing = "IPU hardware"
        return {
            "executor": type(self).__name__,
            "strategy": s.strategy,
            "device": "IPU",
            "replicas": s.replicas,
            "ipus_per_replica": s.ipus,
            "ipus_total": s.total_ipus,
            "ipus_reserved": s.reserved_ipus if s.auto_round else s.total_ipus,
            "layout": s.layout.describe(),
            "pipeline_stages": s.layout.pipeline_stages if s.layout.phases is None else None,
            "phases": s.layout.phases,
            "device_iterations": s.device_iterations,
            "gradient_accumulation": s.gradient_accumulation,
            "gradient_accumulation_source": s.gradient_accumulation_source,
            "micro_batch": s.micro_batch,
            "samples_per_step": s.batch_size,
            "samples_per_optimizer_step": s.samples_per_optimizer_step,
            "optimizer_steps_per_step": s.device_iterations,
            "reduction": "mean over gradient accumulation and replicas",
            "partials": s.partials,
            "stochastic_rounding": s.stochastic_rounding,
            "emulated": s.emulated or stand_in,
            "timing": timing,
            "poptorch": getattr(poptorch, "__version__", None) if poptorch else None,
            "executable_cache": str(s.executable_cache) if s.executable_cache else None,
            **self._compile,
            "memory": self._memory.describe(),
            **self._optimizer_info,
        }

    def close(self) -> None:
        if self._trainer is not None:
            with contextlib.suppress(Exception):  # closing after a failure must not hide the failure
                self._trainer.destroy()  # detaches from the IPUs too
            self._trainer = None
        if self._poptorch is not None and self._model is not None:
            self._poptorch.removeBlocks(self._model)


def _cache_files(directory: Path | None) -> set[str]:
    if directory is None or not directory.is_dir():
        return set()
    return {str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file()}
