"""The run configuration: one table of run options, validated before anything starts.

Every core option is a field of :class:`RunConfig`: its name, type, default, bounds and help live there and nowhere
else. The ``run`` command line (``accelbench.cli``), sweep files, ``--set`` and result records all use these names;
a field's command-line spelling is the field name with ``-`` for ``_`` unless its ``flag`` extra says otherwise
(``n_layer`` is ``--layers``). Options that belong to a workload (the GPT's sizes, context length, dropout) or to a
backend plugin (the CUDA plugin's TF32 policy) are declared by them as :class:`RunOption` s and stored in
``workload_options`` and ``backend_options``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from accelbench.errors import ConfigError
from accelbench.precision import PRECISIONS

Scalar = str | int | float | bool

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


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

    model_config = ConfigDict(extra="forbid")

    backend: str | None = Field(
        default=None, description="backend name (default: the highest-priority backend that detects a device)"
    )
    workload: str = Field(default="gpt", description="what is trained: a registered workload")
    engine: Literal["native", "lightning"] = Field(
        default="native",
        description="native: accelbench's loop; lightning: the same workload through Lightning Fabric",
    )
    model: str = Field(
        default="gpt-nano", description="the workload's size name (see --help of the workload)"
    )
    batch_size: int = Field(default=64, gt=0, description="per-device batch size")
    epochs: int = Field(default=2, gt=0, description="epochs; the first is reported apart as the warm-up")
    steps_per_epoch: int | None = Field(
        default=None, gt=0, description="cap the steps of each epoch (quick runs; recorded)"
    )
    precision: str = Field(default="fp32", description=f"one of {', '.join(PRECISIONS)}")
    strategy: str = Field(
        default="single",
        description="distribution strategy: single, ddp, fsdp, deepspeed-zero1/2/3, a plugin's",
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
        description="seconds a rank waits for its peers before the run ends with an error",
    )
    seed: int = Field(default=0, description="seed of the model initialisation and the data order")
    data: Path | None = Field(
        default=None, description="dataset path for the workload (GPT: a text file; default: generated data)"
    )
    learning_rate: float = Field(
        default=3e-4, gt=0.0, description="optimizer learning rate", json_schema_extra=_flag("lr")
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
        default=None, gt=0.0, description="peak TFLOP/s per device for MFU (overrides the backend's table)"
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

    @model_validator(mode="after")
    def _compile_mode_needs_compile(self) -> RunConfig:
        if self.compile_mode != "default" and not self.compile:
            raise ValueError(f"--compile-mode {self.compile_mode} needs --compile")
        return self


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


class RunOption(BaseModel):
    """A ``run`` option a workload or backend plugin declares (``Workload.options``, ``accelbench_run_options``).

    ``--FLAG VALUE`` lands in ``RunConfig.workload_options[name]`` or ``RunConfig.backend_options[name]``. The
    option's type, default and bounds are checked here (:meth:`check`) before a run starts.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Key in workload_options/backend_options, e.g. 'n_layer', 'replicas'.")
    flag: str | None = Field(
        default=None,
        description="Command-line spelling without dashes if not the name's ('layers' for n_layer).",
    )
    type: Literal["str", "int", "float", "bool"] = "str"
    default: Scalar | None = None
    help: str = ""
    choices: tuple[Scalar, ...] | None = None
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    backend: str = Field(default="", description="The backend that reads it (backend options).")
    workload: str = Field(default="", description="The workload that reads it (workload options).")

    @property
    def cli_flag(self) -> str:
        return (self.flag or self.name).replace("_", "-")

    @property
    def owner(self) -> str:
        return self.workload or self.backend

    def check(self, value: Any) -> Scalar:
        """``value`` converted to this option's type and checked against its bounds; ConfigError otherwise."""
        where = f"--{self.cli_flag}"
        try:
            if self.type == "bool":
                converted: Scalar = _as_bool(value)
            elif self.type == "int":
                if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                    raise ValueError
                converted = int(value)
            elif self.type == "float":
                if isinstance(value, bool):
                    raise ValueError
                converted = float(value)
            else:
                converted = str(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: Input should be {_A[self.type]} (got {value!r})") from None
        if self.choices is not None and converted not in self.choices:
            raise ConfigError(
                f"{where}: Input should be one of {', '.join(map(str, self.choices))} (got {value!r})"
            )
        if isinstance(converted, (int, float)) and not isinstance(converted, bool):
            number = float(converted)
            for bound, ok, words in (  # worded as pydantic words the core options' bounds
                (self.gt, number > (self.gt or 0.0), "greater than"),
                (self.ge, number >= (self.ge or 0.0), "greater than or equal to"),
                (self.lt, number < (self.lt or 0.0), "less than"),
            ):
                if bound is not None and not ok:
                    raise ConfigError(f"{where}: Input should be {words} {bound:g} (got {value!r})")
        return converted


_A = {"bool": "a valid boolean", "int": "a valid integer", "float": "a valid number", "str": "text"}


def _as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ValueError(value)


def resolve_options(
    given: Mapping[str, Any], declared: Iterable[RunOption], owner: str, kind: str
) -> dict[str, Scalar]:
    """``given`` checked against ``declared`` options, with their defaults filled in (what the record keeps).

    An unknown name is refused with the close matches; ``kind`` is 'workload' or 'backend' for the messages.
    """
    import difflib

    options = {o.name: o for o in declared}
    unknown = [name for name in given if name not in options]
    if unknown:
        name = unknown[0]
        close = difflib.get_close_matches(name, list(options), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        known = ", ".join(sorted(options)) or "none"
        raise ConfigError(f"{kind} {owner!r} has no option {name!r}{hint} (its options: {known})")
    out: dict[str, Scalar] = {}
    for name, option in options.items():
        if name in given and given[name] is not None:
            out[name] = option.check(given[name])
        elif option.default is not None:
            out[name] = option.default
    return out
