"""The IPU run options (``accelbench run --ipus 4 --replicas 2 ...``) and their validation.

Everything about the replica/IPU layout and the batch arithmetic is checked here, when the executor is
built, so an impossible request is refused before anything is compiled or measured.

Batch arithmetic: each ``train_step`` gets ``--batch-size`` samples; PopTorch consumes
micro-batch x device iterations x replicas x gradient accumulation samples per call, so the batch size must
be a multiple of device iterations x replicas x gradient accumulation, and the micro-batch is the quotient.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from accelbench.config import RunConfig
from accelbench.contract import RunOption
from accelbench.errors import ConfigError
from accelbench.workloads import ModelUnits
from accelbench_ipu.layout import MAX_IPUS, Layout, is_power_of_two, parse_layers_per_ipu, plan_layout

BACKEND = "ipu"


def run_options() -> list[RunOption]:
    """The ``accelbench run`` options this plugin reads (``backend_options`` keys use ``_`` for ``-``)."""

    def option(
        name: str, type_: Literal["str", "int", "float", "bool"], default: Any, text: str
    ) -> RunOption:
        return RunOption(name=name.replace("-", "_"), type=type_, default=default, help=text, backend=BACKEND)

    return [
        option("ipus", "int", None, "IPUs per replica (default: --devices / --replicas); a power of two"),
        option("replicas", "int", 1, "data-parallel replicas; --devices = replicas x IPUs per replica"),
        option(
            "device-iterations", "int", 1, "iterations the IPUs run per host call (poptorch deviceIterations)"
        ),
        option(
            "gradient-accumulation",
            "int",
            None,
            "micro-batches per optimizer step (default: 1; pipelined: the smallest >= 2 x stages - 1 that divides "
            "the batch)",
        ),
        option(
            "layers-per-ipu", "str", None, "pipelined/sharded: transformer layers on each IPU, e.g. 2,4,4,2"
        ),
        option("partials", "str", "float", "fp16 matmul partials: float (FP16.32) or half (FP16.16)"),
        option("stochastic-rounding", "bool", False, "IPU stochastic rounding of fp16 results"),
        option("ipu-loss-scaling", "float", 1.0, "static loss scaling factor of the PopTorch optimizer"),
        option(
            "executable-cache",
            "str",
            None,
            "directory for PopTorch's executable cache (cold vs cached compile)",
        ),
        option(
            "ipu-model", "bool", False, "run on the IPU Model emulator (no hardware; timings are emulated)"
        ),
        option(
            "auto-round-ipus", "bool", False, "reserve the next power of two of IPUs (extra ones stay idle)"
        ),
        option("ipu-graph-profile", "bool", True, "write the compile-time graph profile for per-IPU memory"),
    ]


@dataclass(frozen=True)
class IpuSettings:
    """One validated IPU run: layout, batch arithmetic, precision options."""

    strategy: str
    layout: Layout
    replicas: int
    device_iterations: int
    gradient_accumulation: int
    gradient_accumulation_source: str
    batch_size: int
    micro_batch: int
    partials: str
    stochastic_rounding: bool
    loss_scaling: float
    executable_cache: Path | None
    emulated: bool
    auto_round: bool
    graph_profile: bool
    seed: int

    @property
    def ipus(self) -> int:
        """IPUs per replica."""
        return self.layout.ipus

    @property
    def total_ipus(self) -> int:
        return self.ipus * self.replicas

    @property
    def reserved_ipus(self) -> int:
        """What PopTorch reserves: the total, or the next power of two with --auto-round-ipus."""
        return 1 << (self.total_ipus - 1).bit_length()

    @property
    def samples_per_optimizer_step(self) -> int:
        return self.micro_batch * self.replicas * self.gradient_accumulation


def settings_from_config(config: RunConfig, parts: ModelUnits) -> IpuSettings:
    """Validate the run for IPUs and work out the layout over the workload's model ``parts``; raise ConfigError
    saying what would work."""
    opts = config.backend_options
    replicas = _int(opts, "replicas", 1)
    device_iterations = _int(opts, "device_iterations", 1)
    requested_ga = _optional_int(opts, "gradient_accumulation")
    ga_flag = "--gradient-accumulation"
    if config.grad_accum > 1:  # the core's --grad-accum is PopTorch's gradient accumulation
        if requested_ga is not None and requested_ga != config.grad_accum:
            raise ConfigError(
                f"--grad-accum {config.grad_accum} and --gradient-accumulation {requested_ga} disagree; give one"
            )
        requested_ga, ga_flag = config.grad_accum, "--grad-accum"
    ipus = _optional_int(opts, "ipus")
    partials, stochastic_rounding, loss_scaling = precision_options(opts, config.precision)
    emulated = _bool(opts, "ipu_model", False) or os.environ.get("POPTORCH_IPU_MODEL", "") == "1"
    auto_round = _bool(opts, "auto_round_ipus", False)

    if config.nnodes > 1:
        raise ConfigError(
            f"--nnodes {config.nnodes}: IPU runs drive all their IPUs from one host process; multi-host IPU-PODs "
            "need Graphcore's poprun, which accelbench does not launch. Use --nnodes 1"
        )
    ipus = _ipus_per_replica(config.devices, replicas, ipus)
    total = ipus * replicas
    if total > MAX_IPUS:
        raise ConfigError(f"{total} IPUs asked for; PopTorch reserves at most {MAX_IPUS} in one partition")
    if not is_power_of_two(total) and not auto_round:
        below, above = 1 << (total.bit_length() - 1), 1 << total.bit_length()
        raise ConfigError(
            f"{ipus} IPUs per replica x {replicas} replicas = {total} IPUs, but IPUs are reserved in powers of "
            f"two: use {below} or {above} IPUs, or --auto-round-ipus to reserve {above} and leave "
            f"{above - total} idle"
        )
    if emulated and replicas > 1:
        raise ConfigError(
            f"--replicas {replicas} with the IPU Model: the emulator has no replication; use --replicas 1"
        )
    cache = opts.get("executable_cache")
    if emulated and cache:
        raise ConfigError(
            "--executable-cache with the IPU Model: the emulator has no executable cache; drop one"
        )

    layout = plan_layout(
        config.strategy,
        parts,
        ipus,
        parse_layers_per_ipu(_optional_str(opts, "layers_per_ipu")),
        model=config.model,
    )
    ga, source = _gradient_accumulation(
        config.batch_size, device_iterations, replicas, requested_ga, layout, ga_flag
    )
    return IpuSettings(
        strategy=config.strategy,
        layout=layout,
        replicas=replicas,
        device_iterations=device_iterations,
        gradient_accumulation=ga,
        gradient_accumulation_source=source,
        batch_size=config.batch_size,
        micro_batch=config.batch_size // (device_iterations * replicas * ga),
        partials=partials,
        stochastic_rounding=stochastic_rounding,
        loss_scaling=loss_scaling,
        executable_cache=Path(str(cache)).expanduser() if cache else None,
        emulated=emulated,
        auto_round=auto_round,
        graph_profile=_bool(opts, "ipu_graph_profile", True),
        seed=config.seed,
    )


def precision_options(opts: Mapping[str, Any], precision: str) -> tuple[str, bool, float]:
    """The run's PopTorch precision options (partials type, stochastic rounding, loss scaling), PopTorch's
    defaults where not given; ConfigError for values that cannot work with ``precision``."""
    loss_scaling = _float(opts, "ipu_loss_scaling", 1.0)
    if loss_scaling <= 0:
        raise ConfigError(f"--ipu-loss-scaling {loss_scaling}: the loss scaling factor must be positive")
    partials = str(opts.get("partials", "float"))
    if partials not in ("float", "half"):
        raise ConfigError(f"--partials {partials!r}: choose float (FP16.32) or half (FP16.16)")
    if partials == "half" and precision == "fp32":
        raise ConfigError(
            "--partials half applies to fp16 matmuls, but --precision is fp32; use --precision fp16-mixed, or "
            "--partials float"
        )
    return partials, _bool(opts, "stochastic_rounding", False), loss_scaling


def _ipus_per_replica(devices: int, replicas: int, ipus: int | None) -> int:
    """accelbench counts each IPU as a device (throughput per device, MFU), so --devices is the total."""
    if ipus is None:
        if devices % replicas:
            raise ConfigError(
                f"--devices {devices} is not a multiple of --replicas {replicas}: --devices counts every IPU "
                "(replicas x IPUs per replica)"
            )
        return devices // replicas
    if ipus * replicas != devices:
        raise ConfigError(
            f"--ipus {ipus} x --replicas {replicas} = {ipus * replicas} IPUs, but --devices is {devices}: "
            f"accelbench counts each IPU as a device (throughput per device, MFU); pass --devices "
            f"{ipus * replicas}"
        )
    return ipus


def _gradient_accumulation(
    batch: int,
    di: int,
    replicas: int,
    requested: int | None,
    layout: Layout,
    flag: str = "--gradient-accumulation",
) -> tuple[int, str]:
    minimum = layout.min_gradient_accumulation
    why = (
        f"pipelined training over {layout.pipeline_stages} stages needs gradient accumulation >= "
        f"2 x {layout.pipeline_stages} - 1 = {minimum}"
        if minimum > 1
        else ""
    )
    if requested is not None:
        if requested < minimum:
            raise ConfigError(f"{flag} {requested}: {why}; {_suggest(batch, di, replicas, minimum)}")
        if batch % (di * replicas * requested):
            raise ConfigError(
                f"--batch-size {batch} is not a multiple of device iterations {di} x replicas {replicas} x "
                f"gradient accumulation {requested} = {di * replicas * requested} (PopTorch's 'Invalid batch "
                f"dimension'); {_batches(batch, di * replicas * requested)}"
            )
        return requested, flag
    for ga in range(minimum, batch // (di * replicas) + 1):
        if batch % (di * replicas * ga) == 0:
            source = f"automatic: the smallest that divides the batch ({why})" if why else "default"
            return ga, source
    reason = f"{why}, and " if why else ""
    raise ConfigError(
        f"--batch-size {batch}: {reason}the batch must be a multiple of device iterations {di} x replicas "
        f"{replicas} x gradient accumulation; {_suggest(batch, di, replicas, minimum)}"
    )


def _suggest(batch: int, di: int, replicas: int, minimum: int) -> str:
    for ga in range(minimum, minimum + 64):
        if batch % (di * replicas * ga) == 0:
            return f"use --gradient-accumulation {ga} (micro-batch {batch // (di * replicas * ga)})"
    return _batches(batch, di * replicas * minimum, f" with --gradient-accumulation {minimum}")


def _batches(batch: int, multiple: int, suffix: str = "") -> str:
    lower = (batch // multiple) * multiple
    choices = [c for c in (lower, lower + multiple) if c > 0]
    return f"batch sizes that work{suffix}: multiples of {multiple}, e.g. {' or '.join(map(str, choices))}"


def _optional_str(opts: Mapping[str, Any], key: str) -> str | None:
    value = opts.get(key)
    return None if value is None else str(value)


def _int(opts: Mapping[str, Any], key: str, default: int) -> int:
    value = _optional_int(opts, key)
    return default if value is None else value


def _optional_int(opts: Mapping[str, Any], key: str) -> int | None:
    value = opts.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = int(str(value))
        except ValueError:
            raise ConfigError(f"--{key.replace('_', '-')} {value!r}: a whole number is needed") from None
    if value < 1:
        raise ConfigError(f"--{key.replace('_', '-')} {value}: must be at least 1")
    return value


def _float(opts: Mapping[str, Any], key: str, default: float) -> float:
    value = opts.get(key, default)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"--{key.replace('_', '-')} {value!r}: a number is needed") from None


def _bool(opts: Mapping[str, Any], key: str, default: bool) -> bool:
    value = opts.get(key, default)
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("1", "true", "yes", "on"):
        return True
    if str(value).lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"--{key.replace('_', '-')} {value!r}: true or false")
