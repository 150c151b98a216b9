"""``accelbench plan``: the candidate configurations for a model on a job shape, priced by ``estimate``'s model,
ranked, shown as a table with the winner as a runnable command; ``--sweep-file`` writes the top K as a sweep,
``--json`` the whole plan, and ``--measure K`` runs the top K and compares (:mod:`accelbench.plan.measure`).

Every flag is checked before anything is loaded or built; every refusal is a ConfigError (exit status 2) naming
the flag, the value and what works."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
from collections import Counter
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelbench.contract import PRECISIONS
from accelbench.engine.checkpointing import check_activation_checkpointing
from accelbench.engine.float8 import check_fp8_run
from accelbench.errors import ConfigError
from accelbench.exitcodes import ExitCode
from accelbench.plan.arguments import PLANNED_SCHEDULES
from accelbench.plan.candidates import PLANNABLE, default_strategies, enumerate_candidates
from accelbench.plan.schema import Plan, PlannedRun

if TYPE_CHECKING:
    from rich.console import Console

    from accelbench.config import RunConfig
    from accelbench.estimate.command import Target
    from accelbench.estimate.schema import Prediction
    from accelbench.plugins import PluginHost

# The most devices a plan enumerates layouts for: the layouts grow with the divisors, the candidates with them; far
# beyond any job this tool launches (estimate's --scale-to speaks of larger ones).
MAX_DEVICES = 65536
MAX_MEASURE_STEPS = 10_000
MAX_MEASURE_EPOCHS = 100
NOT_OFFERED_SHOWN = 6  # reasons listed under the table; --json has every one


def plan_command(args: argparse.Namespace, err: Console) -> int:
    """Run ``accelbench plan``."""
    check_plan_flags(args)
    plan = make_plan(args)
    if args.sweep_file is not None:
        write_sweep_file(args.sweep_file, plan.ranked[: args.top], args, measured=False)
    if args.measure is not None:
        from accelbench.plan.measure import measure_top

        comparison, status = measure_top(plan, args, err)
        plan = plan.model_copy(update={"comparison": comparison})
    else:
        status = ExitCode.OK
    if not plan.ranked:  # nothing to choose from: said on stderr, and the exit status says it too
        reasons = Counter(r.reason for r in plan.unpriced if r.reason)
        why = "; ".join(reason for reason, _ in reasons.most_common(2)) or "every configuration was dropped"
        err.print(f"[bold red]nothing ranked[/]: {why}", highlight=False, soft_wrap=True)
        status = ExitCode.ERROR
    if args.json:
        print(plan.to_json(), flush=True)
        return status
    from rich.console import Console

    console = Console()
    if not console.is_terminal:  # a file or a pipe: wide enough for the table's columns, not rich's 80
        console = Console(width=max(console.width, 160))
    show(plan, args.top, console)
    return status


# --------------------------------------------------------------------------------------------------------------
# The flags, checked before anything is built
# --------------------------------------------------------------------------------------------------------------


def check_plan_flags(args: argparse.Namespace) -> None:
    """Refuse a flag no plan can use, before anything is loaded (estimate's device flags by estimate's checks)."""
    from accelbench.estimate.command import check_estimate_flags

    for flag, value in (("--devices", args.devices), ("--nnodes", args.nnodes)):
        if not 1 <= value <= MAX_DEVICES:
            raise ConfigError(f"{flag} {value}: give a count from 1 to {MAX_DEVICES}, e.g. {flag} 2")
    if args.devices * args.nnodes > MAX_DEVICES:
        raise ConfigError(
            f"--devices {args.devices} x --nnodes {args.nnodes}: more than {MAX_DEVICES} devices"
        )
    world = args.devices * args.nnodes
    if args.top < 1:
        raise ConfigError(f"--top {args.top}: give how many of the best configurations to show, 1 or more")
    for name in args.strategies or ():
        if name not in PLANNABLE:
            raise ConfigError(f"--strategies: unknown strategy {name!r}; choose from {', '.join(PLANNABLE)}")
        if name == "single" and world > 1:
            raise ConfigError(
                f"--strategies single: one device alone, but the job has {world} devices (--devices x --nnodes); "
                "choose ddp, fsdp, deepspeed-zero1/2/3, tp, pp or mesh, or plan for --devices 1"
            )
        if name != "single" and world == 1:
            raise ConfigError(
                f"--strategies {name}: spreads training over several devices, but the job has one; give --devices "
                "N (N > 1), or --strategies single"
            )
    for name in args.precisions or ():
        if name not in PRECISIONS:
            hint = f"; did you mean {name}-mixed?" if f"{name}-mixed" in PRECISIONS else ""
            raise ConfigError(
                f"--precisions: unknown precision {name!r}{hint}; choose from {', '.join(PRECISIONS)}"
            )
    from accelbench.parallel_dims import PP_SCHEDULES

    for name in args.pp_schedules or ():
        if name not in PP_SCHEDULES:
            raise ConfigError(
                f"--pp-schedules: unknown pipeline schedule {name!r}; choose from {', '.join(PP_SCHEDULES)}"
            )
    for size in args.batch_sizes or ():
        if size < 1:
            raise ConfigError(f"--batch-sizes {size}: give batch sizes of 1 sample or more, e.g. 8,16,32")
    if args.global_batch is not None and args.global_batch < 1:
        raise ConfigError(
            f"--global-batch {args.global_batch}: give the samples per optimizer step, 1 or more"
        )
    if args.token_budget is not None and not 0 < args.token_budget < float("inf"):  # NaN fails too
        raise ConfigError(f"--token-budget {args.token_budget}: give a number of tokens above 0, e.g. 1e9")
    if args.measure is not None and args.measure < 1:
        raise ConfigError(
            f"--measure {args.measure}: give how many of the top configurations to run, 1 or more"
        )
    if args.measure is not None and args.estimate_device:
        raise ConfigError(
            f"--measure {args.measure} runs the configurations on this host's device, but --device "
            f"{args.estimate_device} plans for another; leave --device out to plan for (and measure on) this one"
        )
    if args.measure is not None and args.nnodes > 1:
        raise ConfigError(
            f"--measure {args.measure} runs the configurations on this host, but --nnodes {args.nnodes} plans a "
            "multi-node job; measure with --nnodes 1, or run the --sweep-file on the nodes with your launcher"
        )
    if not 2 <= args.measure_epochs <= MAX_MEASURE_EPOCHS:
        raise ConfigError(
            f"--measure-epochs {args.measure_epochs}: give 2 to {MAX_MEASURE_EPOCHS} (a warm-up, then at least one "
            "steady epoch to measure)"
        )
    if not 1 <= args.measure_steps <= MAX_MEASURE_STEPS:
        raise ConfigError(
            f"--measure-steps {args.measure_steps}: give 1 to {MAX_MEASURE_STEPS} steps per epoch"
        )
    from accelbench.sweep.spec import MAX_REPEATS

    if not 1 <= args.measure_repeats <= MAX_REPEATS:
        raise ConfigError(
            f"--measure-repeats {args.measure_repeats}: give 1 to {MAX_REPEATS} runs per configuration"
        )
    if args.measure_repeats > 1 and args.measure is None:
        raise ConfigError(
            f"--measure-repeats {args.measure_repeats} repeats --measure's runs: add --measure K to run the top K"
        )
    if args.sweep_file is not None and args.sweep_file.suffix.lower() not in (".toml", ".yaml", ".yml"):
        raise ConfigError(
            f"--sweep-file {args.sweep_file}: give a .toml (or, with PyYAML, .yaml) file name: the sweep file "
            "formats accelbench sweep reads"
        )
    if (
        args.sweep_file is not None
        and args.sweep_file.suffix.lower() != ".toml"
        and importlib.util.find_spec("yaml") is None
    ):
        raise ConfigError(
            f"--sweep-file {args.sweep_file}: a YAML sweep file needs PyYAML (pip install 'accelbench[yaml]'); "
            f"or give a .toml name ({args.sweep_file.with_suffix('.toml').name}), which needs nothing more"
        )
    check_estimate_flags(argparse.Namespace(**{**vars(args), "scale_to": None, "measured": None}))


# --------------------------------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------------------------------


def make_plan(args: argparse.Namespace) -> Plan:
    """Enumerate, price and rank (nothing is built but the model on the meta device, nothing runs)."""
    from accelbench.cli import make_config
    from accelbench.estimate.arguments import DEFAULT_EFFICIENCY, stack_of
    from accelbench.estimate.command import links_of, rates_of, resolve_bandwidth
    from accelbench.estimate.facts import meta_facts
    from accelbench.estimate.predictor import predict
    from accelbench.plan.ranking import price, split
    from accelbench.plugins import get_host

    host = get_host()
    workload = host.workload(args.workload)
    world = args.devices * args.nnodes
    base: dict[str, Any] = {"workload": args.workload, "model": args.model, "devices": args.devices,
                            "nnodes": args.nnodes}  # fmt: skip
    if args.backend:
        base["backend"] = args.backend
    base_config = host.resolve(make_config(base))  # an unknown model is refused here, naming the sizes
    # the stack flags checked once, before anything is enumerated (a bad bucket size is the flag's fault, not a
    # candidate's)
    stack_of(args, base_config)
    bandwidth = resolve_bandwidth(args.comm, args.bus_bandwidth)
    deepspeed = importlib.util.find_spec("deepspeed") is not None
    strategies = args.strategies or default_strategies(world, deepspeed)
    targets, precision_notes = _targets(
        host,
        base,
        args,
        zero3="deepspeed-zero3" in strategies,
        tensor_parallel=bool({"tp", "mesh"} & set(strategies)),
        fsdp=bool({"fsdp", "mesh"} & set(strategies)),  # a mesh's data axis is FSDP2's
    )
    facts = meta_facts(workload, base_config)
    # the configurations over the flags' choices, with activation checkpointing as asked (off, on or both)
    candidates = partial(
        enumerate_candidates,
        base=base,
        world=world,
        strategies=strategies,
        precisions=list(targets),
        batch_sizes=args.batch_sizes or _default_batches(),
        global_batch=args.global_batch,
        units=workload.units(base_config),
        check=partial(_checked_as_a_run, host),
        schedules=args.pp_schedules or PLANNED_SCHEDULES,
    )
    found = candidates(checkpointing=CHECKPOINTING[args.activation_checkpointing])
    if not found.configs:
        reasons = "; ".join(f"{why} ({n}x)" for why, n in found.not_offered.most_common(3)) or "none offered"
        flag = f"--global-batch {args.global_batch}: " if args.global_batch is not None else ""
        raise ConfigError(
            f"{flag}no configuration of {args.model} on {world} device(s) can run ({reasons}); try other "
            "--strategies, --batch-sizes or --global-batch"
        )

    def predict_one(config: RunConfig) -> Prediction:
        target = targets[config.precision]
        resolved = host.resolve(config)
        stack = stack_of(args, resolved)
        kernels = args.optimizer_kernels or target.kernels
        calibrated: dict[str, Any] = {}
        if target.calibration is not None:  # a device profile: the step's traced operators at its rates
            from accelbench.estimate.operators import UntraceableStep, operators_for

            try:
                operators = operators_for(
                    workload, resolved, target.plan, target.device_type, kernels, by_batch=True
                )
            except UntraceableStep:  # at a fraction of the peak instead; the prediction's rates say so
                operators = None
            if operators is not None:
                calibrated = {"calibration": target.calibration, "operators": operators}
        efficiency = DEFAULT_EFFICIENCY if args.efficiency is None else args.efficiency
        links = bandwidth or links_of(target, base_config)
        prediction = predict(resolved, facts, device_type=target.device_type, device=target.device,
                             peak=target.peak, bandwidth=links, efficiency=efficiency, overlap=args.overlap,
                             runtime_bytes=args.runtime_mib * 2**20, stack=stack, **calibrated)  # fmt: skip
        return prediction.model_copy(update=rates_of(target.profile, prediction))

    runs: list[PlannedRun] = []
    for config, layout in zip(found.configs, found.layouts, strict=True):
        try:
            runs.append(price(config, layout, predict_one, facts.tokens_per_sample, args.token_budget))
        except ConfigError as exc:  # the model's own refusals (bf16-true under DeepSpeed), as a run's
            found.not_offered[f"{config.strategy} {layout.text()}: {str(exc).split('; ')[0]}"] += 1
    checkpointing_notes: list[str] = []
    # --activation-checkpointing auto: each configuration predicted not to fit, again with checkpointing
    tight = {_shape(r) for r in runs if r.fits is False} if args.activation_checkpointing == "auto" else set()
    if tight:
        twins = candidates(checkpointing=(True,))
        added = [
            price(config, layout, predict_one, facts.tokens_per_sample, args.token_budget)
            for config, layout in zip(twins.configs, twins.layouts, strict=True)
            if _shape(config) in tight
        ]
        runs += added
        checkpointing_notes.append(
            f"activation checkpointing: priced for the {len(tight)} configuration(s) predicted not to fit without "
            f"it, where they can run it ({len(added)}; {sum(r.fits is not False for r in added)} of them then fit); "
            "--activation-checkpointing both prices it for every configuration"
        )
    if not runs:
        raise ConfigError(
            f"no configuration of {args.model} on {world} device(s) can be priced: "
            + "; ".join(f"{why} ({n}x)" for why, n in found.not_offered.most_common(3))
        )
    ranked, dropped, unpriced = split(runs)
    first = next(iter(targets.values()))
    plan = Plan(
        workload=args.workload,
        model=args.model,
        devices=args.devices,
        nnodes=args.nnodes,
        device=first.device.name if first.device is not None else first.device_type,
        global_batch=args.global_batch,
        token_budget=args.token_budget,
        ranked_by="time to the token budget (lower first)" if args.token_budget else "samples/s (higher first)",
        candidates=len(runs),
        ranked=ranked,
        dropped=dropped,
        unpriced=unpriced,
        not_offered=dict(found.not_offered),
        assumptions=[*first.notes, *precision_notes, *checkpointing_notes, f"strategies considered: {', '.join(strategies)}"
                     + ("" if deepspeed or args.strategies else " (DeepSpeed is not installed: no ZeRO)")],
    )  # fmt: skip
    if args.measure is not None and args.measure > len(ranked):
        raise ConfigError(
            f"--measure {args.measure}: only {len(ranked)} configuration(s) are ranked (fit and priced); give "
            f"--measure 1 to {len(ranked)}"
            if ranked
            else f"--measure {args.measure}: no configuration is ranked "
            "(none fits and is priced); see `accelbench plan` without --measure for why"
        )
    return plan


def _checked_as_a_run(host: PluginHost, config: RunConfig) -> RunConfig:
    """A candidate checked as ``accelbench run`` checks it: FP8 with a strategy that would not convert the model is
    refused, so is activation checkpointing of a workload that cannot run a unit twice; then the plugin host
    resolves it."""
    check_fp8_run(config)
    resolved = host.resolve(config)
    if resolved.activation_checkpointing:
        check_activation_checkpointing(resolved, host.workload(resolved.workload).units(resolved))
    return resolved


# --activation-checkpointing: the choices enumerated for every configuration ("auto" adds "on" afterwards, for those
# predicted not to fit without it)
CHECKPOINTING: dict[str, tuple[bool, ...]] = {
    "auto": (False,),
    "off": (False,),
    "on": (True,),
    "both": (False, True),
}


def _shape(run: RunConfig | PlannedRun) -> tuple[object, ...]:
    """What a configuration is, activation checkpointing aside: its twin with checkpointing has the same shape."""
    return (run.strategy, run.mesh, run.batch_size, run.grad_accum, run.microbatches, run.precision,
            run.pp_schedule if run.microbatches else None)  # fmt: skip


def _default_batches() -> list[int]:
    from accelbench.plan.arguments import DEFAULT_BATCH_SIZES

    return list(DEFAULT_BATCH_SIZES)


def _targets(
    host: Any,
    base: dict[str, Any],
    args: argparse.Namespace,
    zero3: bool = False,
    tensor_parallel: bool = False,
    fsdp: bool = False,
) -> tuple[dict[str, Target], list[str]]:
    """The device for each precision considered (its peak differs by precision): those given with --precisions,
    each of which the device must run; else every precision it runs, the others noted. ``zero3``: ZeRO-3 is among
    the strategies, whose engine cost a calibration then carries; ``fsdp``: FSDP is, whose hooks' cost it carries;
    ``tensor_parallel``: tp or mesh layouts are, whose DTensor dispatch cost it carries."""
    from accelbench.cli import make_config
    from accelbench.estimate.command import resolve_target

    targets: dict[str, Target] = {}
    notes: list[str] = []
    if args.estimate_device:  # an unknown name is refused as estimate refuses it, listing the known devices
        from accelbench.estimate.catalog import find_device

        find_device(host, args.estimate_device)
    first: ConfigError | None = None
    # --refresh-calibration: what this command measured for one precision is not measured again for the next
    started = datetime.now(timezone.utc)
    for name in args.precisions or PRECISIONS:
        config = make_config({**base, "precision": name})
        try:
            targets[name] = resolve_target(host, config, device_name=args.estimate_device,
                                           measure_peak=args.measure_peak, refresh_peak=args.refresh_peak,
                                           calibrate=args.calibrate,
                                           refresh_calibration=args.refresh_calibration, zero3=zero3,
                                           fresh_since=started, tensor_parallel=tensor_parallel,
                                           fsdp=fsdp, peak_of_its_precision_only=True,
                                           profile_path=args.device_profile,
                                           efficiency_given=args.efficiency is not None)  # fmt: skip
        except ConfigError as exc:
            first = first or exc
            if args.precisions:
                raise ConfigError(f"--precisions {name}: {exc}") from None
            notes.append(f"precision {name} not considered: {str(exc).split('; ')[0]}")
    if not targets:  # the device itself is refused (none detected), or it runs none of them: the first reason
        raise ConfigError(str(first))
    return targets, notes


def write_sweep_file(path: Path, runs: list[PlannedRun], args: argparse.Namespace, measured: bool) -> Path:
    """The runs as a sweep file `accelbench sweep` runs (TOML, or YAML for a .yaml/.yml name): one grid of fixed
    options per configuration, in the predicted order; with ``measured``, the short length --measure runs them
    for."""
    data: dict[str, Any] = {
        "description": f"accelbench plan: the top {len(runs)} configuration(s) of {args.model} on {args.devices} "
        f"device(s) x {args.nnodes} node(s), predicted best first",
        "grid": [_plain(run.options) for run in runs],
    }
    if measured:
        data["run"] = {"epochs": args.measure_epochs, "steps_per_epoch": args.measure_steps}
        data["repeats"] = args.measure_repeats
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".toml":
        text = sweep_toml(data)
    else:
        import yaml

        text = yaml.safe_dump(data, sort_keys=False)
    path.write_text(text, encoding="utf-8")
    return path


def sweep_toml(data: dict[str, Any]) -> str:
    """A sweep file's data (scalars, the ``run`` table, the ``grid`` list of tables) as TOML; a None value is left
    out (TOML has none: the option keeps its default)."""

    def value(v: str | int | float | bool) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v) if math.isfinite(v) else ("inf" if v > 0 else "-inf" if v < 0 else "nan")
        return json.dumps(v)  # a JSON string is a TOML basic string

    def table(entries: dict[str, Any]) -> list[str]:
        return [f"{k} = {value(v)}" for k, v in entries.items() if v is not None]

    lines = table({k: v for k, v in data.items() if not isinstance(v, (dict, list))})
    for name, entries in data.items():
        if isinstance(entries, dict):
            lines += ["", f"[{name}]", *table(entries)]
    for name, entries in data.items():
        if isinstance(entries, list):
            for entry in entries:
                lines += ["", f"[[{name}]]", *table(entry)]
    return "\n".join(lines) + "\n"


def _plain(options: dict[str, Any]) -> dict[str, Any]:
    """Options as TOML or YAML scalars (a path as its text)."""
    return {
        k: v if isinstance(v, (str, int, float, bool)) or v is None else str(v) for k, v in options.items()
    }


# --------------------------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------------------------


def _seconds(value: float | None) -> str:
    if value is None:
        return "unknown"
    if value >= 3600:
        return f"{value / 3600:.3g} h"
    if value >= 1:
        return f"{value:.3g} s"
    return f"{value * 1e3:.3g} ms"


def show(plan: Plan, top: int, out: Console) -> None:
    """The top ``top`` as a table, what was dropped or unpriced and why, the winner's command, the comparison."""
    from rich.markup import escape
    from rich.table import Table

    from accelbench.display import fmt_bytes

    world = plan.devices * plan.nnodes
    out.print(f"[bold]accelbench plan[/]: {escape(plan.workload)} {escape(plan.model)} on {world} device(s) "
              f"({plan.devices} x {plan.nnodes} node(s)), {escape(plan.device)}", highlight=False, soft_wrap=True)  # fmt: skip
    table = Table(title=f"top {min(top, len(plan.ranked))} of {len(plan.ranked)} ranked by {plan.ranked_by}")
    shown = plan.ranked[:top]
    pipelined = any(run.microbatches for run in shown)
    checkpointed = any(run.activation_checkpointing for run in shown)
    columns = ["#", "strategy", "layout", "batch x accum"]
    columns += ["pipeline"] if pipelined else []
    columns += ["precision"]
    columns += ["act. ckpt"] if checkpointed else []
    columns += ["step", "samples/s"]
    columns += ["time to budget"] if plan.token_budget else []
    columns += ["peak memory", "fits"]
    for column in columns:
        left = column in ("strategy", "layout", "pipeline", "precision", "act. ckpt")
        table.add_column(column, justify="left" if left else "right")
    for i, run in enumerate(shown, 1):
        row = [str(i), run.strategy, run.layout, f"{run.batch_size} x {run.grad_accum}"]
        row += [f"{run.microbatches} mb, {run.pp_schedule}" if run.microbatches else ""] if pipelined else []
        row += [run.precision]
        row += ["on" if run.activation_checkpointing else ""] if checkpointed else []
        row += [_seconds(run.step_time_s), f"{run.samples_per_s:.4g}" if run.samples_per_s else "unknown"]
        row += [_seconds(run.time_to_budget_s)] if plan.token_budget else []
        row += [fmt_bytes(run.peak_memory_bytes), {True: "yes", None: "unknown"}.get(run.fits, "no")]
        table.add_row(*row)
    out.print(table)
    out.print(f"{plan.candidates} configuration(s) priced: {len(plan.ranked)} ranked, {len(plan.dropped)} dropped "
              f"(predicted not to fit), {len(plan.unpriced)} unpriced", highlight=False)  # fmt: skip
    if plan.dropped:
        memory = plan.dropped[0].device_memory_bytes
        smallest = min(plan.dropped, key=lambda r: r.peak_memory_bytes or 0.0)
        out.print(f"  dropped {len(plan.dropped)}: predicted peak above the device's {fmt_bytes(memory)} (smallest "
                  f"dropped: {escape(smallest.label)}, {fmt_bytes(smallest.peak_memory_bytes)})", highlight=False,
                  soft_wrap=True)  # fmt: skip
    for reason, count in Counter(r.reason or "" for r in plan.unpriced).most_common():
        out.print(
            f"  unpriced {count} (listed apart, not ranked): {escape(reason)}",
            highlight=False,
            soft_wrap=True,
        )
    offered = sorted(plan.not_offered.items(), key=lambda kv: -kv[1])
    if offered:
        out.print(f"{sum(plan.not_offered.values())} combination(s) not offered (refused before pricing):",
                  highlight=False)  # fmt: skip
    for reason, count in offered[:NOT_OFFERED_SHOWN]:
        out.print(f"  {count} x {escape(reason)}", highlight=False, soft_wrap=True)
    if len(offered) > NOT_OFFERED_SHOWN:
        out.print(
            f"  ... and {len(offered) - NOT_OFFERED_SHOWN} more reason(s): --json lists them all",
            highlight=False,
        )
    if plan.unpriced and not plan.ranked:
        out.print("[bold]unpriced configurations[/]:", highlight=False)
        for run in plan.unpriced[:top]:
            out.print(f"  {escape(run.label)}: {escape(run.reason or '')}", highlight=False, soft_wrap=True)
    if plan.ranked:
        out.print(f"[bold]winner[/]: {escape(plan.ranked[0].command)}", highlight=False, soft_wrap=True)
    for line in plan.assumptions:
        out.print(f"  - {escape(line)}", highlight=False, soft_wrap=True)
    if plan.comparison is not None:
        from accelbench.plan.measure import show_comparison

        show_comparison(plan.comparison, out)
