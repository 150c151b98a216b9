"""The run configuration: one table of run options, validated before anything starts.

Every core option is a field of :class:`RunConfig`: its name, type, default, bounds and help live there and nowhere
else. The ``run`` command line (``accelbench.cli``), sweep files, ``--set`` and result records all use these names;
a field's command-line spelling is the field name with ``-`` for ``_`` unless its ``flag`` extra says otherwise
(``n_layer`` is ``--layers``). Options that belong to a workload (the GPT's sizes, context length, dropout) or to a
backend plugin (the CUDA plugin's TF32 policy) are declared by them as :class:`RunOption` s and stored in
``workload_options`` and ``backend_options``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from accelbench.contract import PRECISIONS, Scalar, Strategy
from accelbench.parallel_dims import (
    DATA_AXES,
    MESH_AXES,
    PP_SCHEDULES,
    SPLIT_BACKWARD_SCHEDULES,
    fewest_microbatches,
    format_mesh,
    generic_axis,
    parse_mesh,
)

# --epochs auto: a warm-up, then steady epochs until the last MIN_STEADY_EPOCHS agree within AUTO_TOLERANCE (at most
# AUTO_MAX_EPOCHS). MIN_STEADY_EPOCHS is also what compare's noise test needs per run: 4 against 4 epoch times can
# reach p < 0.05, 3 against 3 cannot.
MIN_STEADY_EPOCHS = 4
AUTO_TOLERANCE = 0.05
AUTO_MAX_EPOCHS = 12

# A rank's wait for its peers is handed to torch as a timedelta (and to the collective libraries in milliseconds):
# beyond about 10^13 s Python's timedelta overflows. 10^9 s (31 years) is "never" for any job, and far below that.
MAX_COLLECTIVE_TIMEOUT_S = 1e9

# Validation after each timed epoch (accelbench.engine.quality): a few held-out batches keep CPU runs fast and give a
# loss whose noise is small beside the falls a target is set by; more than 1000 a rank is a second training run.
DEFAULT_EVAL_BATCHES = 4
MAX_EVAL_BATCHES = 1000
# A total gradient norm (L2, before clipping) this large is an explosion: the workloads' norms are O(0.1-10) over
# training (measured on the CPU in fp32: gpt-nano 0.9-1.4, bert-tiny 4.5-4.9, mobilenet-v3-small 2.6-3.4), but an
# untrained ResNet-50 on 32-pixel images starts near 10^4 (its first probe, batch 4), which trains; 10^5 is an order
# of magnitude above that, and a gradient corrupted by 10^6 still crosses it.
DEFAULT_GRAD_NORM_LIMIT = 1e5


def _flag(flag: str | None = None, *, metavar: str | None = None, cli: bool = True) -> dict[str, Any]:
    """Command-line facts of a field, kept beside its type, default and help (``json_schema_extra``)."""
    extra: dict[str, Any] = {}
    if flag:
        extra["flag"] = flag
    if metavar:
        extra["metavar"] = metavar
    if not cli:
        extra["cli"] = False
    return extra


class RunConfig(BaseModel):
    """One benchmark run. Stored whole in the result record, so a run can be repeated from it
    (``accelbench run --config RECORD.json``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)  # resolved once (preflight), then read

    backend: str | None = Field(
        default=None, description="backend name (default: the highest-priority backend that detects a device)"
    )
    workload: str = Field(default="gpt", description="what is trained: a registered workload")
    engine: Literal["native", "lightning"] = Field(
        default="native",
        description="native: accelbench's loop; lightning: the same workload through Lightning Fabric",
    )
    model: str = Field(
        default="gpt-nano",
        description="the workload's size name (custom: the sizes given as workload options)",
    )
    batch_size: int = Field(default=64, gt=0, description="per-device batch size")
    grad_accum: int = Field(
        default=1,
        gt=0,
        description="gradient accumulation: each batch is split into this many micro-batches, one optimizer "
        "step per batch (the batch size must be a multiple of it)",
    )
    epochs: Annotated[int, Field(gt=0)] | Literal["auto"] = Field(
        default="auto",
        description="epochs (the first is reported apart as the warm-up), or auto: a warm-up, then steady epochs "
        "until the last 4 agree within 5% (at most 12); recorded with how it decided",
        json_schema_extra=_flag(metavar="N|auto"),
    )
    steps_per_epoch: int | None = Field(
        default=None, gt=0, description="cap the steps of each epoch (quick runs; recorded)"
    )
    precision: str = Field(
        default="fp32", description="numeric precision (mixed: autocast over fp32 weights)"
    )
    strategy: str = Field(
        default="single",
        description="how training is spread over devices (plugins may add strategies)",
    )
    devices: int = Field(
        default=1,
        gt=0,
        description="devices (one worker process each) per node; under srun/mpirun, what they started",
    )
    nnodes: int = Field(default=1, gt=0, description="nodes in the job (as torchrun's --nnodes)")
    node_rank: int = Field(default=0, ge=0, description="this node's rank (as torchrun's --node-rank)")
    rdzv_endpoint: str | None = Field(
        default=None, description="HOST:PORT of the rendezvous on the first node (multi-node)"
    )
    collective_timeout: float = Field(
        default=600.0,
        gt=0,
        le=MAX_COLLECTIVE_TIMEOUT_S,
        allow_inf_nan=False,
        description="seconds a rank waits for its peers before the run ends with an error",
    )
    mesh: str | None = Field(
        default=None,
        description="device mesh for tensor and pipeline parallelism, composed with data parallelism: AXIS=SIZE,... "
        "over dp (FSDP2; or fsdp, ddp), tp and pp, e.g. dp=2,tp=2; the sizes multiply to the device count; picks "
        "the strategy (mesh; tp or pp alone)",
    )
    placement: str = Field(
        default="auto",
        description="mesh axes from outermost to innermost, e.g. dp,pp,tp: the innermost takes consecutive ranks "
        "(one node); auto: pp,dp,tp (tensor parallelism inside a node, pipeline stages across nodes)",
        json_schema_extra=_flag(metavar="auto|AXES"),
    )
    pp_schedule: Literal[
        "gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "interleaved-zb", "zbv", "dualpipev"
    ] = Field(default="1f1b", description="pipeline schedule (torch.distributed.pipelining)")
    microbatches: int | None = Field(
        default=None,
        gt=0,
        description="pipeline microbatches per step, dividing --batch-size (default: the pipeline's stages)",
    )
    virtual_stages: int | None = Field(
        default=None,
        gt=0,
        description="pipeline stages per rank: interleaved-1f1b, looped-bfs, interleaved-zb (default 2); zbv and "
        "dualpipev: 2; gpipe and 1f1b: 1",
    )
    pp_split: Literal["layers", "parameters"] = Field(
        default="layers",
        description="how the workload's units are dealt to pipeline stages: equal layer counts, or balanced "
        "parameters (embeddings and head counted)",
    )
    sequence_parallel: bool = Field(
        default=False,
        description="with tensor parallelism, norms and dropouts on sequence shards (Megatron's sequence parallelism)",
    )
    activation_checkpointing: bool = Field(
        default=False,
        description="each transformer layer keeps only its input for backward and runs its forward again there "
        "(one more forward pass of the layers, for their activations' memory)",
    )
    seed: int = Field(
        default=0,
        ge=0,
        le=2**64 - 1,  # torch.manual_seed's range; numpy's generators take no negative seed
        description="seed of the model initialisation and the data order",
    )
    data: Path | None = Field(
        default=None, description="dataset path for the workload (GPT: a text file; default: generated data)"
    )
    learning_rate: float = Field(
        default=3e-4,
        gt=0.0,
        allow_inf_nan=False,
        description="optimizer learning rate",
        json_schema_extra=_flag("lr"),
    )
    compile: bool = Field(default=False, description="torch.compile the model (compile timed apart)")
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = Field(
        default="default",
        description="torch.compile mode with --compile; reduce-overhead replays steps as CUDA graphs",
    )
    data_placement: Literal["auto", "host", "device"] = Field(
        default="auto",
        description="device: corpus on the accelerator, batches gathered there; host: batches made by the host "
        "and copied each step; auto: device on accelerators for corpora up to 2 GiB",
    )
    threads: int | None = Field(default=None, gt=0, description="torch intra-op threads (CPU)")
    peak_tflops: float | None = Field(
        default=None,
        gt=0.0,
        allow_inf_nan=False,
        description="peak TFLOP/s per device for MFU (overrides the backend's table)",
    )
    profile: bool = Field(
        default=False,
        description="after the timed epochs, profile --profile-steps steady steps (torch.profiler): where a step's "
        "time goes, in the record and the summary, and a Chrome trace beside the record",
    )
    profile_steps: int = Field(default=8, gt=0, description="steps analysed by --profile")
    idle_baseline_s: float = Field(
        default=1.0,
        ge=0.0,
        le=60.0,
        allow_inf_nan=False,
        description="seconds the energy counters are read with nothing running, before the timed epochs and outside "
        "them, for the idle power beside the energy (0: skip; skipped anyway where no counter is readable)",
    )
    no_tensor_peak: bool = Field(
        default=False,
        description="skip the live tensor peak: one untimed training step after the timed epochs (and any --profile "
        "window) under torch's MemTracker, which measures the tensors the prediction compares with; it costs one "
        "step run a few times slower, never a timed epoch",
    )
    no_calibration: bool = Field(
        default=False,
        description="where this device has no cached calibration for the run's matmul dtype and threads, do not "
        "measure one after the timed epochs (seconds, once, cached; never inside a timed epoch): the stored "
        "prediction's step time then comes from the peak at a fixed efficiency",
    )
    eval_batches: int = Field(
        default=DEFAULT_EVAL_BATCHES,
        ge=0,
        le=MAX_EVAL_BATCHES,
        description="held-out batches evaluated (no_grad, eval mode) after each timed epoch, outside its time; "
        "the validation loss is recorded per epoch; 0 turns validation off",
    )
    target_loss: float | None = Field(
        default=None,
        gt=0.0,
        allow_inf_nan=False,
        description="stop at the end of the first epoch whose validation loss is at or below this, and record the "
        "time, steps, samples and energy to it (or that it was not reached)",
    )
    target: str | None = Field(
        default=None,
        description="a named target instead of --target-loss: the model's reference held-out loss, ref-epochN "
        "being the loss a run training as the shipped fp32 reference does reaches by epoch N (docs/quality.md)",
        json_schema_extra=_flag(metavar="NAME"),
    )
    grad_norm_limit: float = Field(
        default=DEFAULT_GRAD_NORM_LIMIT,
        gt=0.0,
        allow_inf_nan=False,
        description="the run ends as diverged when the gradient norm probed after an epoch is above this (or not "
        "finite); above 0 (no norm is at most 0: every run would diverge), e.g. 1e30 to check only that it is "
        "finite",
    )
    stall_epochs: int = Field(
        default=0,
        ge=0,
        le=1000,
        description="the run ends as diverged when, after this many epochs, the loss (validation where measured, "
        "else training) is not below the first epoch's; 0 (the default) turns the check off",
    )
    comm_records: Path | None = Field(
        default=None,
        description="comm records (a file or folder from `accelbench comm` on this system): the prediction stored "
        "in the record then has communication time, and so a step time, for multi-device runs",
    )
    output_dir: Path = Field(default=Path("results"), description="where result records go")
    workload_options: dict[str, Scalar] = Field(
        default_factory=dict,
        description="Options the workload declares (e.g. the GPT's n_layer, block_size, dropout), by name.",
        json_schema_extra=_flag(cli=False),
    )
    backend_options: dict[str, Scalar] = Field(
        default_factory=dict,
        description="Options declared by backend plugins (e.g. the CUDA plugin's tf32, the IPU's replicas), by name.",
        json_schema_extra=_flag(cli=False),
    )

    @field_validator("precision")
    @classmethod
    def _known_precision(cls, value: str) -> str:
        if value not in PRECISIONS:
            hint = f"; did you mean {value}-mixed?" if f"{value}-mixed" in PRECISIONS else ""
            raise ValueError(f"unknown precision {value!r}{hint}; choose one of: {', '.join(PRECISIONS)}")
        return value

    @field_validator("epochs", mode="before")
    @classmethod
    def _count_or_auto(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
            return value
        raise ValueError(f"{value!r} is neither a number of epochs (1 or more, e.g. 5) nor auto")

    @field_validator("rdzv_endpoint")
    @classmethod
    def _host_and_port(cls, value: str | None) -> str | None:
        if value is None:
            return value
        host, sep, port = value.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(
                f"{value!r} is not HOST:PORT with a port from 1 to 65535 (e.g. node01:29500: the first node's name "
                "and a free port, the same on every node)"
            )
        return value.strip()

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        if self.compile_mode != "default" and not self.compile:
            raise ValueError(f"--compile-mode {self.compile_mode} needs --compile")
        if self.node_rank >= self.nnodes:
            raise ValueError(
                f"--node-rank {self.node_rank} with --nnodes {self.nnodes}: node ranks count from 0, so the last "
                f"node is {self.nnodes - 1}"
            )
        if (self.target is not None or self.target_loss is not None) and self.eval_batches == 0:
            raise ValueError(
                f"{f'--target {self.target}' if self.target else f'--target-loss {self.target_loss:g}'} is judged "
                "on the validation loss, which --eval-batches 0 turns "
                "off; give --eval-batches 1 or more (or leave it out: 4)"
            )
        return self

    @model_validator(mode="after")
    def _parallel_layout(self) -> RunConfig:
        """``--mesh`` and ``--strategy tp/pp`` as one canonical layout (the mesh, the strategy it is, the pipeline's
        defaults filled in), so a sweep's point and the record of its run agree, and what cannot run is refused
        before anything starts. Checks that need the model (heads, layers) are the preflight's."""
        world = self.devices * self.nnodes
        if self.mesh is None and self.strategy in (Strategy.TP, Strategy.PP):
            self._normalise(mesh=f"{self.strategy}={world}")
        if self.mesh is None:
            if self.strategy == Strategy.MESH:
                raise ValueError("--strategy mesh needs --mesh AXIS=SIZE,..., e.g. --mesh dp=2,tp=2")
            self._no_layout_options("a tp or pp axis (--mesh, or --strategy tp/pp)")
            return self
        given = self.mesh
        sizes = parse_mesh(given)
        product = 1
        for size in sizes.values():
            product *= size
        if product != world:
            raise ValueError(
                f"--mesh {given}: its sizes multiply to {product} device(s), but the job has {world} (--devices "
                f"{self.devices} x --nnodes {self.nnodes}); give a mesh whose sizes multiply to {world}"
            )
        if not sizes:
            raise ValueError(
                f"--mesh {given} on {world} device(s): no axis larger than 1; tensor or pipeline parallelism needs at "
                "least 2 devices (--devices N)"
            )
        # an expert axis runs on the mesh executor even alone (its ranks are data-parallel for the rest)
        chosen = "mesh" if len(sizes) > 1 or "ep" in sizes else next(iter(sizes))
        if self.strategy == Strategy.SINGLE:
            self._normalise(strategy=chosen)
        elif self.strategy != chosen:
            raise ValueError(
                f"--strategy {self.strategy} with --mesh {given}: that mesh runs as strategy {chosen!r}; leave "
                f"--strategy out (or give --strategy {chosen})"
            )
        if chosen in DATA_AXES.values():  # data parallelism alone: the ddp/fsdp strategies, no mesh to record
            self._normalise(mesh=None)
            self._no_layout_options("a tp or pp axis in --mesh")
            return self
        self._normalise(mesh=format_mesh(sizes))
        generic = {generic_axis(axis) for axis in sizes}
        self._check_parallel_options(sizes, generic)
        return self

    def _normalise(self, **values: Any) -> None:
        """Set fields to their canonical form while the config is validated, as it is made (it is frozen: after
        that a config is only read)."""
        self.__dict__.update(values)

    def _no_layout_options(self, needs: str) -> None:
        given = [
            f"--{flag}"
            for flag, value, default in (
                ("microbatches", self.microbatches, None),
                ("virtual-stages", self.virtual_stages, None),
                ("sequence-parallel", self.sequence_parallel, False),
                ("placement", self.placement, "auto"),
            )
            if value != default
        ]
        if given:
            raise ValueError(
                f"{', '.join(given)} describe(s) tensor or pipeline parallelism: it needs {needs}"
            )

    def _check_parallel_options(self, sizes: dict[str, int], generic: set[str]) -> None:
        """The mesh's options against each other and against the rest of the run (``sizes``: canonical)."""
        if self.placement != "auto":
            order = [a.strip().lower() for a in self.placement.split(",")]
            if sorted(order) != sorted(generic):
                raise ValueError(
                    f"--placement {self.placement}: list the axes of --mesh {self.mesh} ({', '.join(sorted(generic))}) "
                    "once each, outermost first, e.g. --placement "
                    + ",".join(a for a in MESH_AXES if a in generic)
                )
            self._normalise(placement=",".join(order))
        # with ep the data axis is reduced by hand, not by DDP
        if "ddp" in sizes and "tp" in sizes and "ep" not in sizes:
            raise ValueError(
                f"--mesh {self.mesh}: DDP cannot hold tensor-parallel (DTensor) parameters; write the data axis as "
                "dp= (FSDP2) to compose data with tensor parallelism"
            )
        if self.sequence_parallel and "tp" not in sizes:
            raise ValueError("--sequence-parallel shards along the tensor-parallel group: it needs a tp axis")
        unsupported = [
            what
            for what, present in (
                (f"--precision {self.precision} (its dynamic loss scaling)", self.precision == "fp16-mixed"),
                ("--compile", self.compile),
                ("--engine lightning", self.engine != "native"),
                (f"--grad-accum {self.grad_accum} (use --microbatches with a pp axis)", self.grad_accum > 1),
            )
            if present
        ]
        if unsupported:
            raise ValueError(
                f"strategy {self.strategy} (--mesh {self.mesh}) does not support {', '.join(unsupported)} yet; "
                "bf16-mixed, bf16-true and fp32 run, eagerly, on the native engine"
            )
        pp = sizes.get("pp", 1)
        if pp == 1:
            if self.microbatches is not None or self.virtual_stages is not None:
                raise ValueError(
                    "--microbatches and --virtual-stages describe a pipeline: they need a pp axis"
                )
            return
        if self.activation_checkpointing and self.pp_schedule in SPLIT_BACKWARD_SCHEDULES:
            raise ValueError(
                f"--activation-checkpointing with --pp-schedule {self.pp_schedule}: its zero-bubble backward (input "
                "and weight gradients apart) does not compose with torch's checkpoint (pytorch/pytorch#136766); "
                "use gpipe, 1f1b, interleaved-1f1b or looped-bfs"
            )
        kind = PP_SCHEDULES[self.pp_schedule]
        virtual = self.virtual_stages or (1 if kind == "one" else 2)
        if (kind == "one" and virtual != 1) or (kind == "v" and virtual != 2):
            holds = "one stage" if kind == "one" else "exactly 2 stages (V-shaped)"
            raise ValueError(
                f"--pp-schedule {self.pp_schedule} holds {holds} per rank, not --virtual-stages {virtual}; for more "
                "stages per rank use interleaved-1f1b, looped-bfs or interleaved-zb"
            )
        self._normalise(virtual_stages=virtual)
        stages = pp * virtual
        microbatches = self.microbatches or stages
        self._normalise(microbatches=microbatches)
        if self.batch_size % microbatches:
            fits = [m for m in range(1, self.batch_size + 1) if self.batch_size % m == 0]
            raise ValueError(
                f"--microbatches {self.microbatches} does not divide --batch-size {self.batch_size} (per replica); "
                f"choose from {', '.join(map(str, fits))}, or another batch size"
            )
        fewest = fewest_microbatches(self.pp_schedule, pp, virtual)
        if microbatches < fewest:
            raise ValueError(
                f"--pp-schedule {self.pp_schedule} needs at least {fewest} microbatches on {pp} pipeline ranks, not "
                f"--microbatches {self.microbatches}"
            )


def flag_of(field: str) -> str:
    """The command-line spelling (without dashes) of a core field: ``learning_rate`` -> ``lr``."""
    extra = RunConfig.model_fields[field].json_schema_extra
    flag = extra.get("flag") if isinstance(extra, dict) else None
    return str(flag) if flag else field.replace("_", "-")


def cli_fields() -> list[str]:
    """The core fields that are ``run`` options, in table order."""
    out = []
    for name, info in RunConfig.model_fields.items():
        extra = info.json_schema_extra
        if not (isinstance(extra, dict) and extra.get("cli") is False):
            out.append(name)
    return out
