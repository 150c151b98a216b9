"""``accelbench estimate``: the analytical model for a run configuration, without running it.

It takes every ``accelbench run`` option (the command line adds them, generated as for ``run``), plus its own: the
device (detected here, or ``--device NAME`` from the plugins' peak tables), comm records or a bus bandwidth, the
assumed efficiency, and ``--measure-peak`` (dense matmuls timed on this device, cached). It prints tables (or
``--json``: a :class:`~accelbench.estimate.schema.Prediction`).
"""

from __future__ import annotations

import argparse
import math
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelbench.config import RunConfig
from accelbench.contract import PRECISIONS, DeviceInfo, PeakFigures, PrecisionPlan, standard_plan
from accelbench.contract.strategies import MODEL_PARALLEL_STRATEGIES
from accelbench.engine.float8 import planned_fp8_layers
from accelbench.errors import ConfigError
from accelbench.estimate.arguments import DEFAULT_EFFICIENCY
from accelbench.estimate.hardware import Bandwidth
from accelbench.estimate.schema import Prediction, ScalingPrediction
from accelbench.exitcodes import ExitCode
from accelbench.parallel_dims import ParallelDims

if TYPE_CHECKING:
    from rich.console import Console

    from accelbench.contract import Backend
    from accelbench.estimate.calibration import Calibration
    from accelbench.estimate.catalog import KnownDevice
    from accelbench.estimate.profile import ResolvedProfile
    from accelbench.plugins import PluginHost


def estimate_command(config: RunConfig, args: argparse.Namespace, err: Console) -> int:
    """Run ``accelbench estimate`` for ``config`` (built from the run flags) and ``args`` (the estimate flags)."""
    from accelbench.estimate.facts import meta_facts
    from accelbench.estimate.predictor import predict, predict_scaling
    from accelbench.plugins import get_host

    check_estimate_flags(args)
    from accelbench.estimate.arguments import stack_of

    stack = stack_of(args, config)
    host = get_host()
    config = host.resolve(config)
    workload = host.workload(config.workload)
    if getattr(args, "trace", False):
        from accelbench.estimate.trace import check_traceable

        check_traceable(config)
    if config.mesh is not None:
        from accelbench.engine.parallel.mesh import check_model_split

        check_model_split(config, workload.units(config), config.workload)
    target = _target(host, config, args)
    bandwidth = resolve_bandwidth(args.comm, args.bus_bandwidth) or links_of(target, config)
    try:
        facts = meta_facts(workload, config)
    except (RuntimeError, ValueError, OverflowError, MemoryError) as exc:  # sizes no tensor can have
        raise ConfigError(
            f"the {config.workload} model {config.model!r} as configured cannot be built, even without memory "
            f"({type(exc).__name__}: {_first_line(exc)}); give smaller sizes"
        ) from None
    common: dict[str, Any] = {
        "device_type": target.device_type,
        "device": target.device,
        "peak": target.peak,
        "bandwidth": bandwidth,
        "efficiency": DEFAULT_EFFICIENCY if args.efficiency is None else args.efficiency,
        "overlap": args.overlap,
    }
    calibrated: dict[str, Any] = {}
    if target.calibration is not None:
        from accelbench.estimate.operators import UntraceableStep, operators_for

        try:
            kernels = (
                args.optimizer_kernels or target.kernels
            )  # --optimizer-kernels: the step traced with them
            operators = operators_for(workload, config, target.plan, target.device_type, kernels)
        except UntraceableStep as exc:  # priced at a fraction of the peak instead, and said why
            target.notes.append(f"not priced operator by operator: {exc}")
            target.profile = None
        else:
            if args.from_profile is not None:
                operators = operators.refined(*_profiled_times(args.from_profile, config))
            calibrated = {"calibration": target.calibration, "operators": operators}
    measured_step = _measured_step(args.measured, config) if args.measured else None
    try:
        prediction = predict(
            config, facts, runtime_bytes=args.runtime_mib * 2**20, stack=stack, **common, **calibrated
        )
        scaling: list[ScalingPrediction] = [
            predict_scaling(config, facts, n, measured_step_s=measured_step, **common, **calibrated)
            for n in args.scale_to or ()
        ]
    except (ValueError, OverflowError, ZeroDivisionError) as exc:  # the flags are checked: a model's limit
        raise ConfigError(f"cannot predict this configuration: {_first_line(exc)}") from None
    prediction = prediction.model_copy(
        update={
            "matmul_math": target.plan.matmul_math,
            "measured_peaks": target.measured,
            "scaling": scaling,
            "assumptions": [*target.notes, *prediction.assumptions],
            **rates_of(target.profile, prediction),
        }
    )
    if getattr(args, "trace", False):
        keeps_scores = stack.keeps_scores(target.device_type, facts.dropout)
        prediction = with_trace(prediction, host, workload, config, target.plan, keeps_scores=keeps_scores)
    if args.json:
        print(prediction.to_json(), flush=True)
        return ExitCode.OK
    from rich.console import Console

    show(prediction, Console())
    return ExitCode.OK


def links_of(target: Target, config: RunConfig) -> Bandwidth | None:
    """A catalogued device's link table (:mod:`accelbench.estimate.links`): what prices its collectives where no
    comm record or bus bandwidth was given; None for a device detected here (``accelbench comm`` measures it) or
    one whose plugin gives no links."""
    from accelbench.estimate.links import link_table

    if target.device is None or not target.catalogued:
        return None
    try:
        table = link_table(target.device.details, config.devices, config.nnodes)
    except ValueError as exc:
        raise ConfigError(f"the device table's links for {target.device.name}: {exc}") from None
    if table is not None and config.devices * config.nnodes > 1:
        where = table.link_name or table.link
        if config.nnodes > 1:
            where += f", across nodes {table.network_name or 'no network figure: communication time unknown'}"
        note = f"collectives: alpha-beta over the device table's links ({where})"
        if note not in target.notes:
            target.notes.append(note)
    return table


def rates_of(profile: ResolvedProfile | None, prediction: Prediction) -> dict[str, str]:
    """The prediction's rates' source and its error band (:mod:`accelbench.estimate.profile`): a profile's, or the
    efficiency model's where none priced it."""
    from accelbench.estimate.profile import EFFICIENCY_SOURCE, error_band

    if profile is not None and prediction.forward_s is not None:
        return {"rates_source": profile.source, "rates": profile.described, "error_band": profile.band}
    return {
        "rates_source": EFFICIENCY_SOURCE,
        "rates": f"{prediction.efficiency:g} of the peak FLOP/s ({prediction.peak_source or 'no peak'})",
        "error_band": error_band(EFFICIENCY_SOURCE),
    }


def with_trace(
    prediction: Prediction,
    host: PluginHost,
    workload: Any,
    config: RunConfig,
    plan: PrecisionPlan,
    keeps_scores: bool = True,
) -> Prediction:
    """``prediction`` with ``--trace``'s second opinion: the traced step's tensor peak, by kind, and whether it (with
    the runtime given) fits the device (:mod:`accelbench.estimate.trace`); ``keeps_scores``: whether the device
    predicted for keeps attention's scores for backward, as the formula assumed (the trace runs on a fake CPU)."""
    from accelbench.estimate.trace import trace_step

    traced = trace_step(host, workload, config, plan, keeps_scores=keeps_scores)
    capacity = prediction.device_memory_bytes
    fits = traced.peak_bytes + prediction.memory.runtime_bytes <= capacity if capacity else None
    return prediction.model_copy(
        update={
            "traced_peak_bytes": float(traced.peak_bytes),
            "traced_memory_bytes": {kind: float(size) for kind, size in traced.by_kind.items()},
            "traced_fits": fits,
            "traced_source": "; ".join([traced.source, *traced.notes]),
        }
    )


# --------------------------------------------------------------------------------------------------------------
# The estimate flags, checked before anything is built
# --------------------------------------------------------------------------------------------------------------

# the memory table's row for MemoryBreakdown.buffer_bytes (left out where it is zero)
BUFFERS_ROW = "buffers (DDP, DeepSpeed buckets; pipeline receives)"
# The largest job --scale-to predicts for: 2^20 devices, ten times the largest training jobs reported (about 10^5
# accelerators); a larger count is a typo, and the model's figures for it would mean nothing.
MAX_SCALE_TO = 2**20
# Bus bandwidth a --bus-bandwidth figure may claim, in GB/s: from 1 MB/s (below any network a job would run on) to
# 100 TB/s (some 50x today's fastest links, NVLink 5's 1.8 TB/s per GPU).
MIN_BUS_GBPS, MAX_BUS_GBPS = 1e-3, 1e5
# --runtime-mib: memory a process holds before the model, up to 16 TiB (more than any device or host has).
MAX_RUNTIME_MIB = 16 * 2**20


def check_estimate_flags(args: argparse.Namespace) -> None:
    """Refuse, before anything is loaded or built, an estimate flag no prediction can use; each ConfigError names the
    flag, the value given and what would work."""
    if args.efficiency is not None and not 0.0 < args.efficiency <= 1.0:  # NaN fails the comparison too
        raise ConfigError(f"--efficiency {args.efficiency}: give a fraction above 0 and at most 1, e.g. 0.4")
    if args.comm and args.bus_bandwidth is not None:
        raise ConfigError("give either --comm (measured records) or --bus-bandwidth (one figure), not both")
    if args.bus_bandwidth is not None and not MIN_BUS_GBPS <= args.bus_bandwidth <= MAX_BUS_GBPS:
        raise ConfigError(
            f"--bus-bandwidth {args.bus_bandwidth}: give GB/s from {MIN_BUS_GBPS:g} to {MAX_BUS_GBPS:g}, e.g. 450 "
            "(an H100's NVLink) or 12 (100 Gb/s Ethernet)"
        )
    if not 0.0 <= args.runtime_mib <= MAX_RUNTIME_MIB:
        raise ConfigError(
            f"--runtime-mib {args.runtime_mib}: give the MiB a process holds before the model, from 0 to "
            f"{MAX_RUNTIME_MIB} (16 TiB), e.g. 300 for a CPU process with torch loaded"
        )
    for n in args.scale_to or ():
        if not 1 <= n <= MAX_SCALE_TO:
            raise ConfigError(
                f"--scale-to {n}: give device counts from 1 to {MAX_SCALE_TO}, e.g. --scale-to 8 16 64"
            )
    scaled = any(n > 1 for n in args.scale_to or ())
    if scaled and not args.comm and args.bus_bandwidth is None and not getattr(args, "estimate_device", None):
        raise ConfigError(
            "--scale-to needs the collectives' bus bandwidth at both device counts: give --comm RECORDS (from "
            "`accelbench comm`) or --bus-bandwidth GB/s"
        )
    if args.measured is not None and not args.scale_to:
        raise ConfigError(
            f"--measured {args.measured}: starts --scale-to's prediction from a measured step time; give --scale-to "
            "N as well"
        )
    if args.refresh_peak and not args.measure_peak:
        raise ConfigError("--refresh-peak measures the peak again: give it with --measure-peak")
    # the calibration flags are estimate's own: a command sharing these checks (plan) may not have them
    calibrate = getattr(args, "calibrate", False)
    from_profile = getattr(args, "from_profile", None)
    if getattr(args, "refresh_calibration", False) and not calibrate:
        raise ConfigError("--refresh-calibration measures the calibration again: give it with --calibrate")
    if from_profile is not None and not calibrate:
        raise ConfigError(
            f"--from-profile {from_profile}: refines the calibrated step time; give --calibrate as well"
        )
    if calibrate and getattr(args, "estimate_device", None):
        raise ConfigError(
            f"--calibrate measures this machine's device; it cannot predict for --device {args.estimate_device} "
            "(a calibration is of the device it was measured on): drop --device to predict for the device here, "
            "or drop --calibrate to predict for that device at --efficiency"
        )


def resolve_bandwidth(comm: list[Path] | None, bus_bandwidth: float | None) -> Bandwidth | None:
    """The collectives' bus bandwidth from ``--comm`` records (checked: figures no measurement gives are refused,
    naming the file) or one ``--bus-bandwidth`` figure in GB/s; None without either (communication time unknown).
    Shared by ``estimate`` and ``plan``; the flags are checked first (:func:`check_estimate_flags`)."""
    from accelbench.estimate.comm import BusBandwidth, load_bus_bandwidth

    if comm:
        _check_comm_records(comm)
        bandwidth = load_bus_bandwidth(comm)
        _check_samples(bandwidth)
        return bandwidth
    if bus_bandwidth is not None:
        return BusBandwidth.constant(bus_bandwidth * 1e9, f"given: --bus-bandwidth {bus_bandwidth:g} GB/s")
    return None


def _check_comm_records(paths: list[Path]) -> None:
    """Refuse, naming the file, a comm record among ``paths`` (files, or folders of them) whose figures no
    measurement gives (:func:`accelbench.comm.options.implausible`)."""
    from accelbench.comm.options import implausible
    from accelbench.comm.records import comm_record_in
    from accelbench.errors import ResultFileError

    for path in paths:
        files = sorted(Path(path).glob("*.json")) if Path(path).is_dir() else [Path(path)]
        for file in files:
            try:
                record = comm_record_in(file)
            except ResultFileError as exc:
                raise ConfigError(f"--comm: {exc}") from None
            why = implausible(record) if record is not None else None
            if why is not None:
                raise ConfigError(
                    f"--comm: {file}: invalid comm record: {why}; give records written by `accelbench comm`"
                )


def _check_samples(bandwidth: Any) -> None:
    """Refuse comm records whose figures no measurement gives (made or edited by hand): a bandwidth that is not a
    positive finite number, a message size beyond any memory."""
    from accelbench.comm.options import MAX_MESSAGE_BYTES

    for s in bandwidth.samples:
        if not (math.isfinite(s.busbw_bytes_per_s) and s.busbw_bytes_per_s > 0):
            raise ConfigError(
                f"--comm: {s.source}: {s.op} at {s.size_bytes} B has bus bandwidth {s.busbw_bytes_per_s / 1e9} GB/s, "
                "which no measurement gives; give records written by `accelbench comm`"
            )
        if not 1 <= s.size_bytes <= MAX_MESSAGE_BYTES:
            raise ConfigError(
                f"--comm: {s.source}: a {s.op} message of {s.size_bytes} B is not a message size (1 B to 1 PiB); "
                "give records written by `accelbench comm`"
            )


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:300]


# --------------------------------------------------------------------------------------------------------------
# The device: detected here, or named
# --------------------------------------------------------------------------------------------------------------


class Target:
    """The device a prediction is for: its type ('cuda', 'cpu', ...), its description (name, memory), its peak for
    the run's precision, the peaks measured by ``--measure-peak`` (by precision), what was assumed in finding them,
    and the precision plan (the matmul math)."""

    def __init__(
        self,
        device_type: str,
        device: DeviceInfo | None,
        peak: PeakFigures | None,
        measured: dict[str, PeakFigures],
        notes: list[str],
        plan: PrecisionPlan,
        calibration: Calibration | None = None,
        kernels: str = "foreach",
        profile: ResolvedProfile | None = None,
    ) -> None:
        self.device_type, self.device, self.peak, self.measured, self.notes, self.plan = (
            device_type,
            device,
            peak,
            measured,
            notes,
            plan,
        )
        self.calibration, self.kernels = calibration, kernels
        # where the calibration's rates come from (measured here, a file, shipped, the datasheet), and its band
        self.profile = profile
        # named from a plugin's catalogue (--device), not detected here
        self.catalogued = False


def _target(host: PluginHost, config: RunConfig, args: argparse.Namespace) -> Target:
    """The device predicted for, from the estimate flags (:func:`resolve_target`)."""
    return resolve_target(
        host,
        config,
        device_name=args.estimate_device,
        measure_peak=args.measure_peak,
        refresh_peak=args.refresh_peak,
        calibrate=args.calibrate,
        refresh_calibration=args.refresh_calibration,
        profile_path=getattr(args, "device_profile", None),
        efficiency_given=args.efficiency is not None,
    )


def _planned_fp8_note(plan: PrecisionPlan) -> list[str]:
    layers = plan.fp8_layers
    if layers is None:
        return []
    return [
        f"FP8 ({layers.recipe}): {len(layers.converted)} linear(s) in FP8, {len(layers.kept)} kept in BF16, "
        f"{layers.fp8_flop_share:.1%} of the model FLOPs in FP8 (chosen on a meta-device build): the peak is "
        "FLOP-weighted over fp8 and bf16"
    ]


def resolve_target(
    host: PluginHost,
    config: RunConfig,
    *,
    device_name: str | None = None,
    measure_peak: bool = False,
    refresh_peak: bool = False,
    calibrate: bool = False,
    refresh_calibration: bool = False,
    zero3: bool = False,
    fresh_since: datetime | None = None,
    tensor_parallel: bool = False,
    fsdp: bool = False,
    peak_of_its_precision_only: bool = False,
    profile_path: Path | None = None,
    efficiency_given: bool = False,
) -> Target:
    """The device predicted for (``device_name`` from the plugins' peak tables, ``--device``; else the one this
    backend detects), its peak for the run's precision, and the peaks ``measure_peak`` measures here (cached);
    with ``calibrate`` this device's calibration too (cached, or measured now; ``refresh_calibration`` remeasures),
    carrying this host's DeepSpeed ZeRO-3 engine cost (:mod:`accelbench.estimate.engine_cost`) where the config's
    strategy is ZeRO-3, or ``zero3``, and the device a CPU, its FSDP2 hooks' cost likewise where it is FSDP, or
    ``fsdp``, and its DTensor dispatch cost where the config's layout has a tp axis, or ``tensor_parallel``. With ``refresh_calibration``, what was measured at or
    after ``fresh_since`` (the command's start: plan resolves one precision after another) is not measured again.
    ``measure_peak`` times every precision the device runs (estimate shows them all), or with
    ``peak_of_its_precision_only`` the config's alone (plan resolves each precision it considers in turn).
    Shared by ``estimate`` and ``plan``. A precision the device does not run is a ConfigError, as before a run.

    A device named from a catalogue is priced operator by operator from its device profile
    (:mod:`accelbench.estimate.profile`): ``profile_path`` (``--device-profile``), else one its plugin ships, else one
    derived from its datasheet; with ``efficiency_given`` (``--efficiency``) at that fraction of the peak instead.
    A ``profile_path`` for the device here prices it in place of a calibration measured here."""
    if device_name:
        target = _catalogued_target(host, config, device_name, measure_peak, profile_path, efficiency_given,
                                    zero3=zero3, fsdp=fsdp)  # fmt: skip
        target.catalogued = True
        return target
    return _detected_target(host, config, measure_peak=measure_peak, refresh_peak=refresh_peak,
                            calibrate=calibrate, refresh_calibration=refresh_calibration, zero3=zero3,
                            fresh_since=fresh_since, tensor_parallel=tensor_parallel, fsdp=fsdp,
                            peak_of_its_precision_only=peak_of_its_precision_only,
                            profile_path=profile_path)  # fmt: skip


def _catalogued_target(
    host: PluginHost,
    config: RunConfig,
    device_name: str,
    measure_peak: bool,
    profile_path: Path | None,
    efficiency_given: bool,
    *,
    zero3: bool = False,
    fsdp: bool = False,
) -> Target:
    """The device named from a plugin's catalogue (see :func:`resolve_target`). Its profile prices the device's
    work; an engine's hooks (ZeRO-3's, FSDP2's), which run on the host, are priced at this host's measured cost,
    standing in for that machine's host (cached once measured: :mod:`accelbench.estimate.engine_cost`)."""

    if measure_peak:
        raise ConfigError("--measure-peak times the device here; it cannot be combined with --device NAME")
    from accelbench.estimate.catalog import find_device

    known = find_device(host, device_name)
    # the run options as a run on that device would check them: another backend's option is refused here
    config = host.check_backend_options(config, known.backend)
    plan, note = _catalogue_plan(known, config, known.backend.device_kind())
    plan = planned_fp8_layers(plan, host.workload(config.workload), host.resolve(config))
    notes = [f"device: {known.shown}, from the {known.backend.name} plugin's table (not detected here)"]
    notes += [note] if note else [_plan_note(known.backend.name, plan)]
    notes += _planned_fp8_note(plan)
    peak = known.backend.peak_figures(known.device, plan)
    kind = known.backend.device_kind()
    kernels = known.backend.optimizer_implementation(kind)
    if efficiency_given:
        if profile_path is not None:
            raise ConfigError(
                f"--device-profile {profile_path} prices the step operator by operator; --efficiency prices it at a "
                "fraction of the peak: give one of them"
            )
        return Target(kind.type, known.device, peak, {}, notes, plan, kernels=kernels)
    from accelbench.estimate.profile import catalogue_profile

    profile = catalogue_profile(known.backend, known.device, plan, profile_path)
    if profile is None:
        notes.append(
            f"no device profile for {known.shown}: its plugin ships none and its table lacks the memory "
            "bandwidth a datasheet profile needs; compute at a fraction of the peak"
        )
        return Target(kind.type, known.device, peak, {}, notes, plan, kernels=kernels)
    notes.append(f"rates: {profile.described}")
    calibration = _with_host_hooks(profile.calibration, config, kernels, zero3=zero3, fsdp=fsdp)
    notes += [note for note in calibration.notes if note not in profile.calibration.notes]
    return Target(kind.type, known.device, peak, {}, notes, plan, calibration, kernels, profile)


def _with_host_hooks(
    calibration: Calibration, config: RunConfig, kernels: str, *, zero3: bool, fsdp: bool
) -> Calibration:
    """``calibration`` with this host's ZeRO-3 or FSDP2 hook costs attached where the strategy (or ``zero3``,
    ``fsdp``) runs them: what an accelerator's host spends beside its dispatching, measured on this host's CPU."""
    import torch

    if zero3 or config.strategy == "deepspeed-zero3":
        from accelbench.estimate.engine_cost import with_zero3_hooks

        calibration = with_zero3_hooks(calibration, torch.get_num_threads())
    if fsdp or config.strategy == "fsdp" or ParallelDims.of(config).shards_parameters:
        from accelbench.estimate.engine_cost import with_fsdp_hooks

        calibration = with_fsdp_hooks(calibration, torch.get_num_threads(), kernels)
    return calibration


def _detected_target(
    host: PluginHost,
    config: RunConfig,
    *,
    measure_peak: bool,
    refresh_peak: bool,
    calibrate: bool,
    refresh_calibration: bool,
    zero3: bool,
    fresh_since: datetime | None,
    tensor_parallel: bool,
    fsdp: bool,
    peak_of_its_precision_only: bool,
    profile_path: Path | None,
) -> Target:
    """The device this backend detects here (see :func:`resolve_target`)."""
    import torch

    backend = host.select_backend(config.backend)
    devices = backend.detect()
    if not devices:
        reason = f" (detection failed: {backend.detect_error})" if backend.detect_error else ""
        raise ConfigError(
            f"backend {backend.name!r} found no device here{reason}; predict for a device you do not have with "
            "--device NAME (e.g. --device H100)"
        )
    config = host.check_backend_options(config, backend)
    kind = backend.device_kind()
    backend.check_precision(config.precision, kind)
    if kind.type == "cpu":  # the runner's split of the cores over the node's worker processes
        from accelbench.hostinfo import usable_cores

        torch.set_num_threads(config.threads or max(1, usable_cores() // config.devices))
    plan = backend.precision_plan(config.precision, kind, config.backend_options)
    plan = planned_fp8_layers(plan, host.workload(config.workload), host.resolve(config))
    device = devices[0]
    notes = [f"device: {device.name} ({backend.name}, detected here)", _plan_note(backend.name, plan)]
    notes += _planned_fp8_note(plan)
    if kind.type == "cpu":
        notes.append(f"{torch.get_num_threads()} intra-op thread(s) per process, as a run of {config.devices} "
                     "process(es) gets")  # fmt: skip
    peak = backend.peak_figures(device, plan)
    measured: dict[str, PeakFigures] = {}
    if measure_peak:
        measured = _measure(backend, config, kind, device, refresh_peak, peak_of_its_precision_only)
        mine = measured.get(config.precision)
        if mine is not None:
            if peak is not None:
                notes.append(f"the measured rate replaces the table's ({peak.flops_per_s / 1e12:g} TFLOP/s)")
            peak = mine
    elif peak is None:
        from accelbench.estimate.peak import measured_peak

        peak = measured_peak(backend, kind, plan, device_name=device.name, cached_only=True)
        if peak is None:
            notes.append(
                "no peak table for this device: run with --measure-peak once (cached) or --peak-tflops"
            )
    calibration = None
    profile = None
    if profile_path is not None:
        from accelbench.estimate.profile import file_profile

        if calibrate:
            raise ConfigError(
                f"--device-profile {profile_path} gives this device's rates; --calibrate measures them here: give one of them"
            )
        profile = file_profile(profile_path, device, kind.type, plan, local=True)
        notes.append(f"rates: {profile.described}")
        calibration = profile.calibration
    if calibrate:
        from accelbench.estimate.profile import ResolvedProfile as Resolved

        calibration = _calibration(backend, config, kind, device, plan, refresh_calibration, fresh_since)
        profile = Resolved(calibration, "measured here", f"measured here ({calibration.measured_at})")
        if kind.type == "cpu" and (zero3 or config.strategy == "deepspeed-zero3"):
            from accelbench.estimate.engine_cost import with_zero3_hooks

            calibration = with_zero3_hooks(
                calibration, torch.get_num_threads(), refresh=refresh_calibration, fresh_since=fresh_since
            )
        if kind.type == "cpu" and (
            fsdp or config.strategy == "fsdp" or ParallelDims.of(config).shards_parameters
        ):
            from accelbench.estimate.engine_cost import with_fsdp_hooks

            calibration = with_fsdp_hooks(
                calibration,
                torch.get_num_threads(),
                backend.optimizer_implementation(kind),
                refresh=refresh_calibration,
                fresh_since=fresh_since,
            )
        from accelbench.estimate.operators import has_tensor_parallelism

        if tensor_parallel or has_tensor_parallelism(config):
            from accelbench.estimate.engine_cost import with_dtensor_dispatch

            calibration = with_dtensor_dispatch(
                calibration, torch.get_num_threads(), refresh=refresh_calibration, fresh_since=fresh_since
            )
        notes += calibration.notes
        profile = Resolved(calibration, "measured here", profile.described)
    kernels = backend.optimizer_implementation(kind)
    return Target(kind.type, device, peak, measured, notes, plan, calibration, kernels, profile)


def _calibration(
    backend: Backend,
    config: RunConfig,
    kind: Any,
    device: DeviceInfo,
    plan: PrecisionPlan,
    refresh: bool,
    fresh_since: datetime | None = None,
) -> Calibration:
    """This device's calibration for the plan's matmul dtype: cached, or measured now on the bound device."""
    from accelbench.contract import World
    from accelbench.estimate.calibration import calibrate
    from accelbench.estimate.peak import matmul_dtype

    bound = backend.setup_device(World(), config.backend_options)
    dtype = matmul_dtype(plan)
    try:
        calibration = calibrate(
            bound,
            backend.synchronize,
            backend=backend.name,
            device_name=device.name,
            dtype=dtype,
            refresh=refresh,
            fresh_since=fresh_since,
        )
    except (RuntimeError, TypeError, NotImplementedError) as exc:
        raise ConfigError(
            f"--calibrate: {backend.name}'s {device.name} cannot be calibrated in {dtype} "
            f"({type(exc).__name__}: {_first_line(exc)}); predict without --calibrate"
        ) from None
    assert calibration is not None  # measured, not only looked up
    return calibration


def _plan_note(backend: str, plan: PrecisionPlan) -> str:
    """What the plan says of the math, for the assumptions."""
    notes = f"; {plan.notes}" if plan.notes else ""
    return f"precision plan ({backend} plugin): {plan.name}, matmul math {plan.matmul_math}{notes}"


def _catalogue_plan(known: KnownDevice, config: RunConfig, kind: Any) -> tuple[PrecisionPlan, str | None]:
    """The plugin's precision plan for a catalogue device, with the run's backend options applied: made from the
    catalogue entry (:class:`~accelbench.estimate.catalog.CataloguePlanner`) where the plugin can, else by its
    ``precision_plan`` where that needs no device. A plugin that can do neither gets the standard plan (fp32
    matmuls as IEEE fp32, said in the note returned), unless backend options were given: they would be ignored, so
    that is refused. A ConfigError of the plugin's (a precision it does not run, options that cannot work together)
    is raised as it is, as a run raises it."""
    from accelbench.estimate.catalog import CataloguePlanner

    backend = known.backend
    options = config.backend_options
    if isinstance(backend, CataloguePlanner):
        return backend.catalogue_precision_plan(config.precision, known.device, options), None
    try:  # a precision the backend does not run is refused, as before a run
        backend.check_precision(config.precision, kind)
    except ConfigError:
        raise
    except Exception:  # noqa: BLE001, S110 - it asks the absent device which precisions it runs: the plan decides
        pass
    try:
        return backend.precision_plan(config.precision, kind, options), None
    except ConfigError:  # the plugin refuses the options as a run would (--partials half with fp32)
        raise
    except Exception as exc:  # noqa: BLE001 - a plugin asking its absent device
        if options:
            flags = ", ".join(f"--{name.replace('_', '-')} {value}" for name, value in options.items())
            raise ConfigError(
                f"{flags}: the {backend.name} plugin makes its precision plan only with the device present "
                f"({type(exc).__name__}: {_first_line(exc)}), so the prediction for {known.shown} cannot apply "
                "them; drop them to predict with the standard plan, or estimate on a host with the device"
            ) from None
        note = (
            f"precision plan: the standard {config.precision} plan (matmul math ieee-fp32): the {backend.name} "
            "plugin makes its plan only with the device present"
        )
        return standard_plan(config.precision, matmul_math="ieee-fp32"), note


def _measure(
    backend: Backend,
    config: RunConfig,
    kind: Any,
    device: DeviceInfo,
    refresh: bool,
    its_own_only: bool = False,
) -> dict[str, PeakFigures]:
    """The measured dense-matmul peak for each precision the device supports (one per matmul dtype), or with
    ``its_own_only`` for the config's precision alone."""
    from accelbench.contract import World
    from accelbench.estimate.peak import matmul_dtype, measured_peak

    bound = backend.setup_device(World(), config.backend_options)
    out: dict[str, PeakFigures] = {}
    by_dtype: dict[str, PeakFigures | None] = {}
    for name in [config.precision] if its_own_only else PRECISIONS:
        if name not in backend.supported_precisions(kind):
            continue
        plan = backend.precision_plan(name, kind, config.backend_options)
        dtype = matmul_dtype(plan) + (plan.matmul_math if matmul_dtype(plan) == "float32" else "")
        if dtype not in by_dtype:
            by_dtype[dtype] = measured_peak(backend, bound, plan, device_name=device.name, refresh=refresh)
        figures = by_dtype[dtype]
        if figures is not None:
            out[name] = figures
    return out


def _measured_step(path: Path, config: RunConfig) -> float:
    """The steady step time of a result record (median steady epoch / its steps), checked to be of this job's size."""
    from accelbench.results import read_record

    record = read_record(path)
    world = config.devices * config.nnodes
    if record.world_size != world:
        raise ConfigError(
            f"--measured {path}: a run on {record.world_size} device(s), but this estimate is for {world}; start "
            f"from its configuration with --config {path}"
        )
    metrics = record.metrics
    if metrics is None or metrics.steady is None or not metrics.epochs:
        raise ConfigError(f"--measured {path}: the record has no steady epochs to take a step time from")
    steps = metrics.epochs[-1].steps
    return metrics.steady.epoch_s_median / max(steps, 1)


def _profiled_times(path: Path, config: RunConfig) -> tuple[dict[str, float], str]:
    """The operators' measured seconds per step in a ``run --profile`` record of this configuration, and where
    from; refused, naming the flag, when the record is unreadable, has no profile or is of another configuration."""
    from accelbench.errors import ResultFileError
    from accelbench.estimate.operators import profiled_operator_times
    from accelbench.results import read_record

    try:
        record = read_record(path)
    except ResultFileError as exc:
        raise ConfigError(f"--from-profile: {exc}") from None
    if record.profile is None:
        raise ConfigError(
            f"--from-profile {path}: the record has no profile; give a record made with `accelbench run --profile`"
        )
    same = ("workload", "model", "batch_size", "grad_accum", "precision", "strategy", "devices", "nnodes")
    differ = [f"{k} {getattr(record.config, k)} (here {getattr(config, k)})" for k in same
              if getattr(record.config, k) != getattr(config, k)]  # fmt: skip
    if differ or record.config.workload_options != config.workload_options:
        differ += ["workload options"] if not differ else []
        raise ConfigError(
            f"--from-profile {path}: a profile of another configuration ({', '.join(differ)}); profile this one "
            f"(`accelbench run ... --profile`) or estimate that one with --config {path}"
        )
    times = profiled_operator_times((op.name, op.category, op.seconds) for op in record.profile.top_operators)
    return times, f"the profile in {path.name} ({record.profile.steps} steps)"


# --------------------------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------------------------


def _seconds(value: float | None) -> str:
    if value is None:
        return "unknown"
    if value >= 1:
        return f"{value:.3g} s"
    if value >= 1e-3:
        return f"{value * 1e3:.3g} ms"
    return f"{value * 1e6:.3g} µs"


def _count(n: int) -> str:
    """A count in thousands (k), millions (M) or billions (B), one decimal: 124.4 M."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return str(n)


def show(prediction: Prediction, out: Console) -> None:
    """The prediction as tables: memory per device, communication per step, time, scaling, assumptions."""
    from rich.markup import escape
    from rich.table import Table

    from accelbench.display import fmt_bytes

    p = prediction
    title = (
        f"{p.workload} {p.model}, {p.strategy} on {p.devices} device(s), {p.precision}, batch {p.batch_size} per "
        f"{'replica' if p.strategy in MODEL_PARALLEL_STRATEGIES else 'device'}"
    )
    out.print(f"[bold]accelbench estimate[/]: {escape(title)}", highlight=False, soft_wrap=True)
    out.print(f"device: {escape(p.device)}", highlight=False, soft_wrap=True)
    if p.matmul_math:
        out.print(f"matmul math: {escape(p.matmul_math)}", highlight=False, soft_wrap=True)
    stored = (
        f"; {p.stored_parameters:,} stored, padding included, tied once"
        if p.stored_parameters != p.parameters
        else ""
    )
    out.print(
        f"parameters: {_count(p.parameters)} ({p.parameters:,}{stored})", highlight=False, soft_wrap=True
    )
    if p.active_parameters is not None:  # a mixture of experts: what a token is computed with, what ep shards
        out.print(
            f"active parameters: {_count(p.active_parameters)} ({p.active_parameters:,}) per token; routed experts "
            f"{_count(p.expert_parameters)} ({p.expert_parameters:,}), all held in memory (sharded by an ep axis)",
            highlight=False,
            soft_wrap=True,
        )
    capacity = p.device_memory_bytes
    memory = Table(title="memory per device (predicted peak)")
    for column in ("kind", "bytes", "share"):
        memory.add_column(column, justify="left" if column == "kind" else "right")
    m = p.memory
    rows = [
        ("weights", m.weights_bytes),
        ("fp32 master weights", m.master_weights_bytes),
        ("gradients", m.gradients_bytes),
        ("optimizer state (AdamW)", m.optimizer_bytes),
        ("activations", m.activations_bytes),
        ("transient while computing (gathered, copies)", m.transient_bytes),
        (BUFFERS_ROW, m.buffer_bytes),
        ("start of backward (loss gradients, the layer backpropagated)", m.backward_transient_bytes),
        *(
            [
                (
                    "the last backward (a pipeline's, or the first layer's rebuilt), beside every gradient",
                    m.end_of_backward_bytes,
                )
            ]
            if m.end_of_backward_bytes is not None
            else []
        ),
        ("optimizer step temporaries", m.optimizer_transient_bytes),
        ("runtime (given)", m.runtime_bytes),
    ]
    total = p.peak_memory_bytes
    optional = (
        "fp32 master weights",
        "runtime (given)",
        BUFFERS_ROW,
        "optimizer step temporaries",
    )
    for kind, value in rows:
        if value == 0.0 and kind in optional:
            continue
        share = f"{value / total:.0%}" if value is not None and total else ""
        memory.add_row(kind, fmt_bytes(value), share)
    if p.phase_bytes:  # the peak is the largest phase, not the rows' sum
        for phase, value in p.phase_bytes.items():
            mark = " (the peak)" if phase == p.peak_phase else ""
            memory.add_row(f"during {phase}{mark}", fmt_bytes(value + m.runtime_bytes), "")
    memory.add_row("[bold]peak[/]", f"[bold]{fmt_bytes(total)}[/]", "")
    if p.traced_peak_bytes is not None:  # the second opinion, with the same runtime added
        memory.add_row(
            "[bold]traced step (--trace)[/]",
            f"[bold]{fmt_bytes(p.traced_peak_bytes + m.runtime_bytes)}[/]",
            "",
        )
    out.print(memory)
    if p.stack:
        chosen = ", ".join(f"{key}={value}" for key, value in p.stack.items())
        out.print(f"stack: {escape(chosen)}", highlight=False, soft_wrap=True)
    verdict = {True: "[green]fits[/]", False: "[bold red]predicted out of memory[/]", None: "fit unknown"}[
        p.fits
    ]
    if (
        capacity and p.sharing_memory > 1 and total is not None
    ):  # a CPU node's processes share the host's memory
        of = (
            f" per process; {p.sharing_memory} processes: {fmt_bytes(total * p.sharing_memory)} of the host's "
            f"{fmt_bytes(capacity)}"
        )
    else:
        of = f" in {fmt_bytes(capacity)} per device" if capacity else " (the device's memory is unknown)"
    out.print(f"{verdict}: {fmt_bytes(total)}{of}", highlight=False, soft_wrap=True)
    if p.traced_peak_bytes is not None:
        traced = {True: "[green]fits[/]", False: "[bold red]out of memory[/]", None: "fit unknown"}[
            p.traced_fits
        ]
        runtime = m.runtime_bytes
        plus = f" + runtime {fmt_bytes(runtime)}" if runtime else ""
        formula = total - runtime if total is not None else None
        against = (
            f"; the formula's tensors {fmt_bytes(formula)}, {formula / p.traced_peak_bytes - 1:+.0%}"
            if formula is not None and p.traced_peak_bytes
            else ""
        )
        kinds = ", ".join(f"{kind} {fmt_bytes(size)}" for kind, size in p.traced_memory_bytes.items())
        out.print(
            f"traced step (--trace): {traced}: {fmt_bytes(p.traced_peak_bytes)} live tensors{plus}{of}{against}"
            + (f" ({escape(kinds)})" if kinds else ""),
            highlight=False,
            soft_wrap=True,
        )
    if p.comm:
        comm = Table(title="communication per device per step (nccl-tests bus bytes)")
        for column in ("op", "group", "count", "message", "bus bytes", "busbw", "time", "overlaps"):
            comm.add_column(column, justify="left" if column in ("op", "group", "overlaps") else "right")
        for op in p.comm:
            busbw = f"{op.busbw_bytes_per_s / 1e9:.3g} GB/s" if op.busbw_bytes_per_s else "unknown"
            comm.add_row(
                f"{op.op} {op.dtype}",
                f"{op.axis} ({op.ranks})",
                str(op.count),
                fmt_bytes(op.message_bytes),
                fmt_bytes(op.bus_bytes),
                busbw,
                _seconds(op.time_s),
                "yes" if op.overlappable else "no",
            )
        out.print(comm)
        for op in p.comm:
            where = f"; bandwidth: {op.bandwidth_source}" if op.bandwidth_source else ""
            out.print(f"  {op.op} ({op.axis}): {escape(op.what + where)}", highlight=False, soft_wrap=True)
    timing = Table(title="time per step", show_header=False)
    timing.add_column("what")
    timing.add_column("value", justify="right")
    timing.add_row("FLOPs per device (workload's formula)", f"{p.flops_per_step:.4g}")
    if p.megatron_flops_per_step:  # the two forms' formulas are in the sources
        timing.add_row(
            "FLOPs per device (Megatron-LM 72-form, no recompute)", f"{p.megatron_flops_per_step:.4g}"
        )
    if p.megatron_recompute_flops_per_step:
        timing.add_row(
            "FLOPs per device (seed 002: Megatron-LM 96-form, full recompute)",
            f"{p.megatron_recompute_flops_per_step:.4g}",
        )
    if p.forward_s is not None and p.backward_s is not None:  # calibrated
        timing.add_row("time model", p.time_model or "calibrated")
        timing.add_row("compute: forward", _seconds(p.forward_s))
        timing.add_row("compute: backward", _seconds(p.backward_s))
        timing.add_row("of the compute, operator dispatch", _seconds(p.dispatch_s))
    else:
        peak = (
            f"{p.peak_flops_per_s / 1e12:.4g} TFLOP/s x {p.efficiency:g}" if p.peak_flops_per_s else "unknown"
        )
        timing.add_row("peak x efficiency", peak)
    timing.add_row("compute", _seconds(p.compute_s))
    if p.bubble:
        timing.add_row("of which pipeline bubble", f"{p.bubble:.1%}")
    timing.add_row(
        "optimizer step (calibrated)" if p.forward_s is not None else "optimizer update (memory-bound)",
        _seconds(p.optimizer_s) if p.optimizer_s else "not counted",
    )
    timing.add_row("communication", _seconds(p.comm_s))
    timing.add_row("communication exposed", _seconds(p.comm_exposed_s))
    timing.add_row("overlap", p.overlap)
    if p.engine_s is not None:
        timing.add_row("ZeRO-3 engine (hooks, gradient partitioning)", _seconds(p.engine_s))
    timing.add_row("[bold]step time[/]", f"[bold]{_seconds(p.step_time_s)}[/]")
    rate = f"{p.samples_per_s:.4g}" if p.samples_per_s else "unknown"
    timing.add_row("samples/s (whole job)", rate)
    out.print(timing)
    if p.measured_peaks:
        peaks = Table(title="measured peak (dense matmul, this device)")
        peaks.add_column("precision")
        peaks.add_column("TFLOP/s", justify="right")
        peaks.add_column("how")
        for name, figures in p.measured_peaks.items():
            peaks.add_row(name, f"{figures.flops_per_s / 1e12:.4g}", escape(figures.source))
        out.print(peaks)
    if p.scaling:
        scaling = Table(
            title="scaling (seed 001: speedup = (r_compute + r_comm) / (r_compute + r_comm / eff))"
        )
        for column in ("devices", "step", "comm exposed", "eff", "step ratio", "throughput speedup"):
            scaling.add_column(column, justify="right")
        for s in p.scaling:
            eff = f"{s.network_efficiency:.3g}" if s.network_efficiency is not None else "-"
            scaling.add_row(
                f"{s.devices_from} -> {s.devices_to}",
                f"{_seconds(s.step_s_from)} -> {_seconds(s.step_s_to)}",
                f"{_seconds(s.comm_s_from)} -> {_seconds(s.comm_s_to)}",
                eff,
                f"{s.step_ratio:.3g}",
                f"{s.throughput_speedup:.3g}x",
            )
        out.print(scaling)
        models = dict.fromkeys(s.time_model for s in p.scaling if s.time_model)
        for model in models:
            out.print(f"  step time at the starting count: {escape(model)}", highlight=False, soft_wrap=True)
    out.print("[bold]assumptions[/]", highlight=False)
    for line in p.assumptions:
        out.print(f"  - {escape(line)}", highlight=False, soft_wrap=True)
    out.print("[bold]sources[/]", highlight=False)
    for line in p.sources:
        out.print(f"  - {escape(line)}", highlight=False, soft_wrap=True)
