"""A stand-in for Graphcore's ``poptorch`` (3.x API), for testing accelbench-ipu where no Poplar SDK exists.

It implements the API surface the plugin uses and enforces the rules that real PopTorch/PopART enforce when
a model is annotated and compiled (see ``shared/notes/IPU.md`` and the PopTorch user guide):

- the annotation classes (``Block``, ``BeginBlock``, ``Stage``, ``Phase``, the four execution strategies)
  follow the real block-to-stage resolution: a block missing from an explicit strategy is an
  "Unknown Block", a block in two stages is refused, ``BeginBlock`` on an annotated module is refused;
- at compile: IPUs are reserved in powers of two (unless ``autoRoundNumIPUs``); pipeline stage ids must
  rise in execution order; pipelined training needs gradient accumulation >= 2S - 1; layers sharing
  weights must sit on one IPU (sharded, pipelined); phased execution needs an IPU on every stage, as many
  stages per phase as IPUs in the phase's group, rising phases, and (parallel) even phases on even IPUs,
  odd on odd; the IPU Model has no replication; hardware must have the IPUs asked for;
- every input's batch dimension must be a multiple of deviceIterations x replicationFactor x
  gradientAccumulation ("Invalid batch dimension"), and a compiled executable only takes its input shapes;
- a model can be wrapped by one ``trainingModel`` at a time.

Training runs for real on the CPU (micro-batches, mean-reduced gradient accumulation and replication,
device iterations, PopTorch's loss scaling and gradient clipping), so losses are real; its timings are
CPU timings and the module says so: ``__accelbench_stand_in__ = True``. It never claims IPU performance.

Test-only knobs (environment): ``FAKE_POPTORCH_IPUS`` (IPUs "attached", default 16, an IPU-POD16) and
``FAKE_POPTORCH_IPU_VERSION`` (default 2, a Mk2 IPU).
"""

from __future__ import annotations

import hashlib
import json
import os
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from . import enums, optim
from .enums import AutoStage, ConnectionType, Liveness, OutputMode, ReductionType

__version__ = "3.4.0+accelbench.stand.in"
__accelbench_stand_in__ = True

__all__ = [
    "AutoStage",
    "BeginBlock",
    "Block",
    "ConnectionType",
    "Liveness",
    "Options",
    "OutputMode",
    "ParallelPhasedExecution",
    "Phase",
    "PipelinedExecution",
    "PoplarExecutor",
    "ReductionType",
    "SerialPhasedExecution",
    "ShardedExecution",
    "Stage",
    "enums",
    "identity_loss",
    "ipuHardwareIsAvailable",
    "ipuHardwareVersion",
    "optim",
    "removeBlocks",
    "trainingModel",
]

TILES_PER_IPU = 1472
BYTES_PER_TILE = 624 * 1024


class Error(RuntimeError):
    """What poptorch raises for a model or option the IPU cannot run (poptorch.Error in 3.x)."""


def _attached_ipus() -> int:
    return int(os.environ.get("FAKE_POPTORCH_IPUS", "16"))


def ipuHardwareIsAvailable(num_ipus: int = 1) -> bool:  # noqa: N802 - PopTorch's name
    return 0 < num_ipus <= _attached_ipus()


def ipuHardwareVersion() -> int:  # noqa: N802
    return int(os.environ.get("FAKE_POPTORCH_IPU_VERSION", "2")) if _attached_ipus() > 0 else -1


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


# --------------------------------------------------------------------------------------------------------
# Options
# --------------------------------------------------------------------------------------------------------


class _OptionsDict:
    """As PopTorch's OptionsDict: only known keys, and values of the default's type."""

    def __init__(self, **defaults: Any) -> None:
        self._values = dict(defaults)

    def set(self, **kwargs: Any) -> None:
        for key, value in kwargs.items():
            assert key in self._values, f"Invalid option {key}, valid options are {self._values.keys()}"
            assert isinstance(value, type(self._values[key])), (
                f"Unexpected type {type(value)} for option {key}. Expected {type(self._values[key])}"
            )
            self._values[key] = value

    def createOrSet(self, **kwargs: Any) -> None:  # noqa: N802
        for key, value in kwargs.items():
            if key in self._values:
                self.set(**{key: value})
            else:
                self._values[key] = value

    def __getattr__(self, key: str) -> Any:
        values = self.__dict__.get("_values", {})
        if key in values:
            return values[key]
        raise AttributeError(key)


class _PopartOptions:
    def __init__(self) -> None:
        self.options: dict[str, Any] = {}

    def set(self, key: str, value: Any) -> _PopartOptions:
        self.options[key] = value
        return self


class _PrecisionOptions(_OptionsDict):
    def __init__(self, popart: _PopartOptions) -> None:
        super().__init__()
        self._popart = popart

    def setPartialsType(self, dtype: torch.dtype) -> _PrecisionOptions:  # noqa: N802
        if dtype in (torch.float, torch.float32):
            kind = "float"
        elif dtype in (torch.half, torch.float16):
            kind = "half"
        else:
            raise ValueError("parameter to setPartialsType should be either torch.float or torch.half")
        self._popart.set("partialsTypeMatMuls", kind)
        self._popart.set("convolutionOptions", {"partialsType": kind})
        return self

    def enableStochasticRounding(self, enabled: bool) -> _PrecisionOptions:  # noqa: N802
        self._popart.set("enableStochasticRounding", enabled)
        return self


class _TrainingOptions(_OptionsDict):
    def __init__(self) -> None:
        super().__init__(
            gradient_accumulation=1, accumulation_and_replication_reduction_type=ReductionType.Mean
        )

    def gradientAccumulation(self, gradient_accumulation: int) -> _TrainingOptions:  # noqa: N802
        self.set(gradient_accumulation=gradient_accumulation)
        return self

    def accumulationAndReplicationReductionType(self, reduction: ReductionType) -> _TrainingOptions:  # noqa: N802
        if not isinstance(reduction, ReductionType) or reduction == ReductionType.NoReduction:
            raise ValueError(
                "accumulationAndReplicationReductionType must be set to poptorch.ReductionType.Mean "
                "or poptorch.ReductionType.Sum"
            )
        self.set(accumulation_and_replication_reduction_type=reduction)
        return self


class Options(_OptionsDict):
    """poptorch.Options: every setter returns self, as in PopTorch."""

    def __init__(self) -> None:
        self._popart = _PopartOptions()
        self._precision = _PrecisionOptions(self._popart)
        self._training = _TrainingOptions()
        self._execution_strategy: _IExecutionStrategy = PipelinedExecution()
        super().__init__(
            replication_factor=1,
            device_iterations=1,
            auto_round_num_ipus=False,
            output_mode=OutputMode.Default,
            use_model=False,
            available_memory_proportion={},
            log_dir=".",
        )
        path = os.environ.get("POPTORCH_CACHE_DIR", "")
        if path:
            self.enableExecutableCaching(path)

    @property
    def Precision(self) -> _PrecisionOptions:  # noqa: N802
        return self._precision

    @property
    def Training(self) -> _TrainingOptions:  # noqa: N802
        return self._training

    @property
    def _Popart(self) -> _PopartOptions:  # noqa: N802
        return self._popart

    def deviceIterations(self, device_iterations: int) -> Options:  # noqa: N802
        self.set(device_iterations=device_iterations)
        return self

    def replicationFactor(self, replication_factor: int) -> Options:  # noqa: N802
        self.set(replication_factor=replication_factor)
        return self

    def autoRoundNumIPUs(self, auto_round_num_ipus: bool = True) -> Options:  # noqa: N802
        self.set(auto_round_num_ipus=auto_round_num_ipus)
        return self

    def useIpuModel(self, use_model: bool) -> Options:  # noqa: N802
        self.createOrSet(use_model=use_model)
        return self

    def randomSeed(self, random_seed: int) -> Options:  # noqa: N802
        assert isinstance(random_seed, int)
        torch.manual_seed(random_seed)
        self.createOrSet(random_seed=random_seed)
        return self

    def outputMode(self, output_mode: OutputMode, output_return_period: int | None = None) -> Options:  # noqa: N802
        assert isinstance(output_mode, OutputMode)
        self.set(output_mode=output_mode)
        return self

    def logDir(self, log_dir: str) -> Options:  # noqa: N802
        self.set(log_dir=log_dir)
        return self

    def modelName(self, name: str) -> Options:  # noqa: N802
        self.createOrSet(model_name=name)
        return self

    def showCompilationProgressBar(self, show: bool = True) -> Options:  # noqa: N802
        self._show_progress = show
        return self

    def enableExecutableCaching(self, path: str | None) -> Options:  # noqa: N802
        if path is None:
            self._popart.set("enableEngineCaching", False)
        else:
            self._popart.set("cachePath", path)
            self._popart.set("enableEngineCaching", True)
        return self

    def setAvailableMemoryProportion(self, proportions: dict[str, float]) -> Options:  # noqa: N802
        actual = {}
        for key, value in proportions.items():
            assert key.startswith("IPU"), f"Invalid key: {key}"
            actual[int(key[3:])] = value
        self.createOrSet(available_memory_proportion=actual)
        return self

    def setExecutionStrategy(self, strategy: _IExecutionStrategy) -> Options:  # noqa: N802
        assert isinstance(strategy, _IExecutionStrategy)
        self._execution_strategy = strategy
        return self

    # what the stand-in needs to know, by the environment variable PopTorch honours as well
    def _uses_ipu_model(self) -> bool:
        explicit = self._values.get("use_model")
        if explicit:
            return True
        return os.environ.get("POPTORCH_IPU_MODEL", "") == "1" and explicit is not False


# --------------------------------------------------------------------------------------------------------
# Blocks, stages, phases: the same resolution as PopTorch's options.py / _options_impl.py
# --------------------------------------------------------------------------------------------------------


class Stage:
    """One or more blocks running on one IPU."""

    def __init__(self, *block_ids: str) -> None:
        assert all(isinstance(b, str) for b in block_ids), (
            f"Block IDs are supposed to be strings but got {block_ids}"
        )
        self._blocks = block_ids
        self._stage_id = -1
        self._phase_id = -1
        self._ipu: int | None = None

    @property
    def blocks(self) -> tuple[str, ...]:
        return self._blocks

    def ipu(self, ipu: int) -> Stage:
        assert isinstance(ipu, int)
        self._ipu = ipu
        return self


class _StageManager:
    """Resolves each block entered during tracing to (stage, phase, IPU) and logs it for the checks."""

    def __init__(self) -> None:
        self._next_auto_id = 0
        self._current_ipu: int | None = None
        self.trace: list[tuple[str, int, int, int]] = []  # (block, stage id, phase id, ipu)
        self.current: tuple[str, int, int, int] | None = None

    def nextAutoId(self) -> str:  # noqa: N802
        self._next_auto_id += 1
        return str(self._next_auto_id - 1)

    def getStage(self, block_id: str) -> Stage:  # noqa: N802
        raise NotImplementedError

    def beginStage(self, user_id: str | None, ipu_id_from_block: int | None) -> None:  # noqa: N802
        user_id = user_id or self.nextAutoId()
        self._current_ipu = ipu_id_from_block
        stage = self.getStage(user_id)
        ipu = stage._ipu if stage._ipu is not None else ipu_id_from_block
        if ipu is None:
            ipu = stage._stage_id
        self.current = (user_id, stage._stage_id, stage._phase_id, ipu)
        self.trace.append(self.current)

    def reset(self) -> None:
        self._next_auto_id = 0
        self.trace = []
        self.current = None


class _DefaultStageManager(_StageManager):
    def __init__(self, auto_stage: AutoStage) -> None:
        super().__init__()
        self._next_id = 1
        self._block_map: dict[str, Stage] = {}
        self._auto_stage = auto_stage

    def getStage(self, block_id: str) -> Stage:  # noqa: N802
        if block_id not in self._block_map:
            stage = Stage(block_id)
            if self._auto_stage == AutoStage.SameAsIpu:
                assert self._current_ipu is not None, (
                    f"poptorch.AutoStage.SameAsIpu was selected but no IPU was specified for block {block_id}"
                )
                stage._stage_id = self._current_ipu
            else:
                stage._stage_id = self._next_id
                self._next_id += 1
            self._block_map[block_id] = stage
        return self._block_map[block_id]


class _MappedStageManager(_StageManager):
    def __init__(self, block_map: dict[str, Stage]) -> None:
        super().__init__()
        self._block_map = block_map

    def getStage(self, block_id: str) -> Stage:  # noqa: N802
        assert block_id in self._block_map, (
            f"Unknown Block '{block_id}' list of expected Blocks: {list(self._block_map.keys())}"
        )
        return self._block_map[block_id]


class _IExecutionStrategy:
    execution_mode = -1

    def __init__(self, stages_manager: _StageManager, block_map: dict[str, Stage]) -> None:
        self._block_map = block_map
        self._stages_manager = stages_manager

    def stage(self, block_id: str) -> Stage:
        assert block_id in self._block_map, f"Unknown block {block_id}"
        return self._block_map[block_id]


class PipelinedExecution(_IExecutionStrategy):
    execution_mode = 0

    def __init__(self, *args: Any) -> None:
        block_map: dict[str, Stage] = {}
        auto_stage = AutoStage.SameAsIpu
        if len(args) == 1 and isinstance(args[0], AutoStage):
            auto_stage = args[0]
        else:
            for stage_id, arg in enumerate(args):
                if isinstance(arg, Stage):
                    stage = arg
                elif isinstance(arg, str):
                    stage = Stage(arg)
                else:
                    assert all(isinstance(elt, str) for elt in arg)
                    stage = Stage(*arg)
                stage._stage_id = stage_id
                for block in stage.blocks:
                    assert block not in block_map, f"{block} associated with more than one stage"
                    block_map[block] = stage
        manager: _StageManager = (
            _MappedStageManager(block_map) if block_map else _DefaultStageManager(auto_stage)
        )
        super().__init__(manager, block_map)


class ShardedExecution(PipelinedExecution):
    execution_mode = 1


class Phase:
    def __init__(self, *arg: str | Stage) -> None:
        if all(isinstance(elt, Stage) for elt in arg):
            self.stages: tuple[Stage, ...] | list[Stage] = arg  # type: ignore[assignment]
        else:
            assert all(isinstance(elt, str) for elt in arg), (
                "All arguments must either be block IDs (strings) or Stages: "
                + str([type(elt) for elt in arg])
            )
            self.stages = [Stage(*arg)]  # type: ignore[arg-type]

    def stage(self, idx: int) -> Stage:
        return self.stages[idx]

    def ipus(self, *ipus: int) -> None:
        assert len(ipus) == len(self.stages), (
            f"Phase contains {len(self.stages)} stages but you provided {len(ipus)} ipus"
        )
        for stage, ipu in zip(self.stages, ipus, strict=True):
            stage.ipu(ipu)


class _IPhasedExecution(_IExecutionStrategy):
    execution_mode = 2
    serial = True

    def __init__(self, *phases: Any) -> None:
        self._tensors_liveness = Liveness.AlwaysLive
        self._separate_backward_phase = False
        self._phases: list[Phase] = []
        block_map: dict[str, Stage] = {}
        for phase_id, args in enumerate(phases):
            if isinstance(args, Phase):
                phase = args
            else:
                if not isinstance(args, list):
                    args = [args]
                phase = Phase(*args)
            self._phases.append(phase)
            for stage in phase.stages:
                stage._phase_id = phase_id
                for block in stage.blocks:
                    assert block not in block_map, f"{block} associated with more than one stage"
                    block_map[block] = stage
        assert phases, (
            "There is currently no AutoStage for PhasedExecution, please explicitly specify the phases"
        )
        super().__init__(_MappedStageManager(block_map), block_map)

    def phase(self, phase: int) -> Phase:
        assert isinstance(phase, int) and phase >= 0, "Phases are identified by positive integers"
        return self._phases[phase]

    def useSeparateBackwardPhase(self, use: bool = True) -> _IPhasedExecution:  # noqa: N802
        assert isinstance(use, bool)
        self._separate_backward_phase = use
        return self


class ParallelPhasedExecution(_IPhasedExecution):
    serial = False

    def sendTensorsOffChipAfterFwd(self, off_chip: bool = True) -> ParallelPhasedExecution:  # noqa: N802
        assert isinstance(off_chip, bool)
        self._tensors_liveness = Liveness.OffChipAfterFwd if off_chip else Liveness.AlwaysLive
        return self


class SerialPhasedExecution(_IPhasedExecution):
    serial = True

    def setTensorsLiveness(self, liveness: Liveness) -> SerialPhasedExecution:  # noqa: N802
        assert isinstance(liveness, Liveness)
        self._tensors_liveness = liveness
        return self


class Block(torch.nn.Module):
    """``with poptorch.Block(user_id, ipu_id):`` inside forward."""

    _stages_manager: _StageManager | None = None

    @staticmethod
    def useAutoId() -> None:  # noqa: N802
        if Block._stages_manager is not None:
            Block._stages_manager._next_auto_id = 0

    @staticmethod
    def start(user_id: str | None = None, ipu_id: int | None = None) -> None:
        if Block._stages_manager is not None:
            Block._stages_manager.beginStage(user_id, ipu_id)

    def __init__(self, user_id: str | None = None, ipu_id: int | None = None) -> None:
        super().__init__()
        self._user_id = user_id
        self._ipu_id = ipu_id

    def __enter__(self) -> None:
        Block.start(self._user_id, self._ipu_id)

    def __exit__(self, *exc: object) -> None:
        return None


class _BlockHook:
    def __init__(self, user_id: str | None, ipu_id: int | None) -> None:
        self._user_id = user_id
        self._ipu_id = ipu_id

    def __call__(self, module: torch.nn.Module, inputs: Any) -> None:
        if Block._stages_manager is not None:
            if self._user_id is None:
                self._user_id = Block._stages_manager.nextAutoId()
            Block._stages_manager.beginStage(self._user_id, self._ipu_id)

    def __repr__(self) -> str:
        return f"BeginBlock(user_id={self._user_id}, ipu_id={self._ipu_id})"


def BeginBlock(
    layer_to_call: torch.nn.Module, user_id: str | None = None, ipu_id: int | None = None
) -> torch.nn.Module:  # noqa: N802
    """Start a block at ``layer_to_call`` (a forward pre-hook), as PopTorch's BeginBlock."""
    if not isinstance(layer_to_call, torch.nn.Module):
        raise Error("module is not an instance of torch.nn.Module or function.")
    if any(isinstance(h, _BlockHook) for h in layer_to_call._forward_pre_hooks.values()):
        raise Error("module has already been assigned to a block.")
    layer_to_call.register_forward_pre_hook(_BlockHook(user_id, ipu_id))
    return layer_to_call


def removeBlocks(module: torch.nn.Module) -> None:  # noqa: N802
    assert isinstance(module, torch.nn.Module)
    for m in module.modules():
        m._forward_pre_hooks = OrderedDict(
            (k, v) for k, v in m._forward_pre_hooks.items() if not isinstance(v, _BlockHook)
        )


def identity_loss(x: torch.Tensor, reduction: str = "none") -> torch.Tensor:
    if reduction == "sum":
        return x.sum()
    if reduction == "mean":
        return x.mean()
    assert reduction == "none", "Unsupported reduction type!"
    return x


# --------------------------------------------------------------------------------------------------------
# Compilation checks and execution
# --------------------------------------------------------------------------------------------------------


class _Trace:
    """What tracing one micro-batch found: blocks in execution order and which IPUs use each parameter."""

    def __init__(self) -> None:
        self.blocks: list[tuple[str, int, int, int]] = []
        self.param_ipus: dict[int, set[int]] = {}
        self.param_names: dict[int, str] = {}
        self.param_bytes_per_ipu: dict[int, int] = {}


def _trace(model: torch.nn.Module, strategy: _IExecutionStrategy, args: tuple[Any, ...]) -> _Trace:
    manager = strategy._stages_manager
    manager.reset()
    result = _Trace()
    names = {id(p): n for n, p in model.named_parameters(remove_duplicate=False)}
    seen_bytes: set[tuple[int, int]] = set()

    def record(module: torch.nn.Module, inputs: Any) -> None:
        ipu = manager.current[3] if manager.current else 0
        for p in module.parameters(recurse=False):
            result.param_ipus.setdefault(id(p), set()).add(ipu)
            result.param_names[id(p)] = names.get(id(p), "?")
            if (id(p), ipu) not in seen_bytes:
                seen_bytes.add((id(p), ipu))
                result.param_bytes_per_ipu[ipu] = (
                    result.param_bytes_per_ipu.get(ipu, 0) + p.numel() * p.element_size()
                )

    handles = [m.register_forward_pre_hook(record) for m in model.modules()]
    Block._stages_manager = manager
    try:
        with torch.no_grad(), torch.random.fork_rng():
            model(*args)
    finally:
        Block._stages_manager = None
        for h in handles:
            h.remove()
    for entry in manager.trace:
        if not result.blocks or result.blocks[-1] != entry:
            result.blocks.append(entry)
    return result


def _check_annotation(trace: _Trace, options: Options, training: bool) -> tuple[int, int]:
    """Apply PopTorch/PopART's placement rules; return (IPUs per replica, pipeline stages)."""
    strategy = options._execution_strategy
    mode = strategy.execution_mode
    blocks = trace.blocks
    ipus = [b[3] for b in blocks] or [0]
    if mode == 2:
        for block, _, phase, ipu in blocks:
            if ipu < 0:
                raise Error(
                    f"Block '{block}' of phase {phase} has no IPU: phased execution needs Stage(...).ipu(n) or "
                    "Phase.ipus(...) on every stage"
                )
    if min(ipus) < 0:
        raise Error(f"Negative IPU id in the annotation: {sorted(set(ipus))}")
    ipus_per_replica = max(ipus) + 1
    stages = 1
    if mode in (0, 1):
        stage_ipus: dict[int, set[int]] = {}
        for _, stage, _, ipu in blocks:
            stage_ipus.setdefault(stage, set()).add(ipu)
        for stage, on in stage_ipus.items():
            if len(on) > 1:
                raise Error(f"Stage {stage} is placed on several IPUs {sorted(on)}: a stage runs on one IPU")
        stages = len(stage_ipus) or 1
        for pid, on in trace.param_ipus.items():
            if len(on) > 1:
                raise Error(
                    f"Parameter '{trace.param_names[pid]}' is used on IPUs {sorted(on)}: layers sharing "
                    "weights need to be placed on the same IPU"
                )
    if mode == 0 and blocks:
        highest = -1
        for block, stage, _, _ in blocks:
            if stage < highest:
                raise Error(
                    f"Block '{block}' is in pipeline stage {stage} but runs after stage {highest}: pipeline "
                    "stage ids must be ascending in execution order (use poptorch.AutoStage.AutoIncrement or "
                    "explicit rising Stages)"
                )
            highest = stage
        accumulation = options.Training.gradient_accumulation
        if training and stages > 1 and accumulation < 2 * stages - 1:
            raise Error(
                "poptorch.Options().Training.gradientAccumulation must be greater than or equal to the number "
                f"of pipeline stages ({2 * stages - 1}) when using poptorch.PipelinedExecution. Currently it "
                f"is set to {accumulation}."
            )
    if mode == 2:
        _check_phases(strategy, trace, ipus_per_replica)  # type: ignore[arg-type]
    return ipus_per_replica, stages


def _check_phases(strategy: _IPhasedExecution, trace: _Trace, n_ipus: int) -> None:
    highest = -1
    for block, _, phase, _ in trace.blocks:
        if phase < highest:
            raise Error(
                f"Block '{block}' of phase {phase} runs after phase {highest}: phases must be ascending"
            )
        highest = phase
    traced_ipu = {b[0]: b[3] for b in trace.blocks}
    for index, phase in enumerate(strategy._phases):
        on = []
        for stage in phase.stages:
            ipu = stage._ipu
            if ipu is None:
                ipu = next((traced_ipu[b] for b in stage.blocks if b in traced_ipu), None)
            if ipu is None:
                raise Error(f"A stage of phase {index} ({list(stage.blocks)}) has no IPU")
            on.append(ipu)
        if strategy.serial:
            group = list(range(n_ipus))
        else:
            if any(ipu % 2 != index % 2 for ipu in on):
                raise Error(
                    f"Phase {index} is placed on IPUs {on}: ParallelPhasedExecution runs even phases on even "
                    "IPUs and odd phases on odd IPUs"
                )
            group = list(range(index % 2, n_ipus, 2))
        if sorted(on) != group:
            raise Error(
                f"Phase {index} has stages on IPUs {on}, but its group of IPUs is {group}: each phase needs as "
                "many stages as IPUs in its group, one on each"
            )


def _batch_check(args: tuple[Any, ...], options: Options) -> int:
    di = options.device_iterations
    rf = options.replication_factor
    ga = options.Training.gradient_accumulation
    multiple = di * rf * ga
    for arg in args:
        if isinstance(arg, torch.Tensor):
            n = arg.shape[0]
            if n % multiple:
                raise Error(
                    f"Invalid batch dimension: In the input {arg.shape}, the batch dimension ({n}) must be a "
                    f"multiple of Options.deviceIterations({di}) * Options.replicationFactor({rf}) * "
                    f"Options.Training.gradientAccumulation({ga}) = {multiple}"
                )
    return multiple


_WRAPPER_ATTR = "_stand_in_poptorch_wrapper"


class PoplarExecutor:
    """The training wrapper ``trainingModel`` returns."""

    def __init__(
        self, model: torch.nn.Module, options: Options, optimizer: torch.optim.Optimizer | None
    ) -> None:
        self.model = model
        self.options = options
        self.optimizer = optimizer or optim.AdamW(model.parameters())
        self._compiled_shapes: list[torch.Size] | None = None
        self._attached = False
        self._destroyed = False
        self.ipus_per_replica = 1
        self.pipeline_stages = 1
        self.cache_hit: bool | None = None  # stand-in introspection for tests only

    # compile ----------------------------------------------------------------------------------------------
    def compile(self, *args: Any) -> None:
        self._check_alive()
        if self._compiled_shapes is not None:
            return
        options = self.options
        multiple = _batch_check(args, options)
        micro = tuple(a[: a.shape[0] // multiple] if isinstance(a, torch.Tensor) else a for a in args)
        trace = _trace(self.model, options._execution_strategy, micro)
        self.ipus_per_replica, self.pipeline_stages = _check_annotation(trace, options, training=True)
        total = self.ipus_per_replica * options.replication_factor
        if options._uses_ipu_model() and options.replication_factor > 1:
            raise Error("The IPU Model does not support replication: use replicationFactor(1)")
        if not _is_pow2(total) and not options.auto_round_num_ipus:
            raise Error(
                f"The model needs {total} IPUs ({self.ipus_per_replica} per replica x replicationFactor "
                f"{options.replication_factor}), but IPUs are reserved in powers of two: use "
                "poptorch.Options().autoRoundNumIPUs(True) to round up"
            )
        reserve = 1 << (total - 1).bit_length()
        if not options._uses_ipu_model() and not ipuHardwareIsAvailable(reserve):
            raise Error(f"Failed to acquire {reserve} IPU(s): {_attached_ipus()} available on this system")
        self.cache_hit = self._cache(trace, args)
        if not self.cache_hit:
            self._write_graph_profile(trace, total)
        self._compiled_shapes = [a.shape for a in args if isinstance(a, torch.Tensor)]
        self._attached = True

    def _cache(self, trace: _Trace, args: tuple[Any, ...]) -> bool:
        popart = self.options._popart.options
        if not popart.get("enableEngineCaching") or self.options._uses_ipu_model():
            return False
        key = hashlib.sha256(
            json.dumps(
                [
                    repr(self.model),
                    [list(a.shape) for a in args if isinstance(a, torch.Tensor)],
                    trace.blocks,
                    sorted((k, repr(v)) for k, v in self.options._values.items()),
                    sorted((k, repr(v)) for k, v in popart.items()),
                    self.options.Training.gradient_accumulation,
                    str(next(self.model.parameters()).dtype),
                ],
                default=str,
            ).encode()
        ).hexdigest()[:24]
        path = Path(popart["cachePath"]) / f"{key}.popef"
        if path.exists():
            return True
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("stand-in executable\n")
        return False

    def _write_graph_profile(self, trace: _Trace, total: int) -> None:
        """Where POPLAR_ENGINE_OPTIONS asks for a graph profile, write one the stand-in ``pva`` reads.

        Per-tile bytes are the stand-in's own estimate (weights x 4 for gradients and two Adam moments), spread
        over the tiles of each IPU: plumbing for tests, not a model of Poplar's memory use.
        """
        raw = os.environ.get("POPLAR_ENGINE_OPTIONS")
        if not raw:
            return
        engine = json.loads(raw)
        if str(engine.get("autoReport.outputGraphProfile", "")).lower() != "true":
            return
        directory = Path(engine.get("autoReport.directory", "."))
        per_ipu = [4 * trace.param_bytes_per_ipu.get(i % self.ipus_per_replica, 0) for i in range(total)]
        tiles = [per_ipu[t // TILES_PER_IPU] // TILES_PER_IPU for t in range(total * TILES_PER_IPU)]
        out = directory / "training"
        out.mkdir(parents=True, exist_ok=True)
        (out / "profile.pop").write_text(
            json.dumps(
                {
                    "numIPUs": total,
                    "tilesPerIpu": TILES_PER_IPU,
                    "bytesPerTile": BYTES_PER_TILE,
                    "tiles": tiles,
                }
            )
        )

    # run --------------------------------------------------------------------------------------------------
    def __call__(self, *args: Any) -> torch.Tensor:
        self._check_alive()
        if self._compiled_shapes is None:
            self.compile(*args)
        shapes = [a.shape for a in args if isinstance(a, torch.Tensor)]
        if shapes != self._compiled_shapes:
            raise Error(
                f"The executable was compiled for inputs {self._compiled_shapes} and was called with {shapes}: "
                "IPU executables have fixed input shapes"
            )
        opts = self.options
        di, rf, ga = opts.device_iterations, opts.replication_factor, opts.Training.gradient_accumulation
        micro = args[0].shape[0] // (di * rf * ga)
        mean = opts.Training.accumulation_and_replication_reduction_type == ReductionType.Mean
        scale = getattr(self.optimizer, "loss_scaling", 1.0)
        clip = getattr(self.optimizer, "max_grad_norm", float("inf"))
        losses = []
        self.model.train()
        for it in range(di):
            self.optimizer.zero_grad(set_to_none=True)
            for k in range(rf * ga):
                start = (it * rf * ga + k) * micro
                batch = tuple(a[start : start + micro] if isinstance(a, torch.Tensor) else a for a in args)
                loss = self.model(*batch)
                losses.append(loss.detach().float())
                ((loss * scale) / (rf * ga if mean else 1)).backward()
            params = [p for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
            if scale != 1.0:
                for p in params:
                    p.grad.div_(scale)
            if clip != float("inf"):
                torch.nn.utils.clip_grad_norm_(params, clip)
            self.optimizer.step()
        stacked = torch.stack(losses)
        mode = opts.output_mode
        if mode in (OutputMode.All,):
            return stacked
        if mode == OutputMode.Sum:
            return stacked.sum()
        return stacked[-rf:]  # Final (the training default): the last iteration's loss of each replica

    # device -----------------------------------------------------------------------------------------------
    def isCompiled(self) -> bool:  # noqa: N802
        return self._compiled_shapes is not None

    def isAttachedToDevice(self) -> bool:  # noqa: N802
        return self._attached

    def detachFromDevice(self) -> None:  # noqa: N802
        if not self._attached:
            raise Error("Device is not attached")
        self._attached = False

    def attachToDevice(self) -> None:  # noqa: N802
        self._attached = True

    def copyWeightsToHost(self) -> None:  # noqa: N802
        pass

    def setOptimizer(self, optimizer: torch.optim.Optimizer) -> None:  # noqa: N802
        self.optimizer = optimizer

    def destroy(self) -> None:
        self._attached = False
        self._destroyed = True
        if getattr(self.model, _WRAPPER_ATTR, lambda: None)() is self:
            delattr(self.model, _WRAPPER_ATTR)

    def _check_alive(self) -> None:
        if self._destroyed:
            raise Error("This PoplarExecutor has been destroyed")


def trainingModel(
    model: torch.nn.Module, options: Options | None = None, optimizer: torch.optim.Optimizer | None = None
) -> PoplarExecutor:  # noqa: N802
    """Wrap ``model`` for training; a model is wrapped by one executor at a time, as in PopTorch."""
    wrapper = getattr(model, _WRAPPER_ATTR, lambda: None)()
    if wrapper is not None and not wrapper._destroyed:
        raise Error(
            "Model has already been wrapped in 'poptorch.trainingModel'. Call model.destroy() on the model "
            "wrapper before wrapping again."
        )
    executor = PoplarExecutor(model, options or Options(), optimizer)
    object.__setattr__(model, _WRAPPER_ATTR, weakref.ref(executor))
    return executor
