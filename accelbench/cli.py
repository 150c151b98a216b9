"""The `accelbench` command line.

The ``run`` options are generated: the core's from :class:`accelbench.config.RunConfig` (name, type, default,
bounds and help live there), the workloads' and backend plugins' from the :class:`~accelbench.config.RunOption` s they
declare. Nothing heavy is imported at module level: ``accelbench --help``, ``compare``, ``report``, ``schema`` and
``sweep --dry-run`` never import torch; ``run`` and the device queries load it when they need it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelbench import __version__
from accelbench.config import RunConfig, cli_fields, flag_of
from accelbench.contract import PRECISIONS, RunOption
from accelbench.errors import AccelbenchError, ConfigError
from accelbench.exitcodes import ExitCode

if TYPE_CHECKING:
    from rich.console import Console


EXIT_CODES_HELP = (
    "exit status: 0 ok; 1 error (record written); 2 refused before running (nothing written); "
    "3 out of memory (record written); 130 interrupted (record written with the completed epochs)"
)
_BACKEND = "backend_option:"
_WORKLOAD = "workload_option:"


# --------------------------------------------------------------------------------------------------------------
# The parser
# --------------------------------------------------------------------------------------------------------------


def build_parser(
    backend_options: Sequence[RunOption] = (),
    workload_options: Sequence[RunOption] = (),
    listed: Mapping[str, str] | None = None,
) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="accelbench", description="Benchmark AI training on any accelerator, with honest numbers."
    )
    parser.add_argument("--version", action="version", version=f"accelbench {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser(
        "run",
        help="train a workload and write a result record",
        epilog=EXIT_CODES_HELP,
    )
    run.add_argument(
        "--config",
        type=Path,
        default=argparse.SUPPRESS,
        metavar="FILE",
        help="start from a run configuration (JSON), or a result record to repeat its run; flags override it",
    )
    add_config_arguments(run, listed)
    _add_declared(run, workload_options, _WORKLOAD, "workload options")
    _add_declared(run, backend_options, _BACKEND, "backend options (from plugins)")
    run.add_argument("--quiet", "-q", action="store_true", help="no progress display or summary")
    run.add_argument("--json", action="store_true", help="print the result record as JSON on stdout")

    fleet = sub.add_parser(
        "fleet",
        help="inside an allocation: the same run on every node (one record each), then compare --fleet",
        allow_abbrev=False,  # its own options are taken out of the command line by their exact names
        epilog="run it in an sbatch script or a salloc shell; it starts one task per node through srun (or mpirun)",
    )
    fleet.add_argument("--config", type=Path, default=argparse.SUPPRESS, metavar="FILE",
                       help="start from a run configuration (JSON) or a result record; flags override it")  # fmt: skip
    add_config_arguments(fleet, listed)
    _add_declared(fleet, workload_options, _WORKLOAD, "workload options")
    _add_declared(fleet, backend_options, _BACKEND, "backend options (from plugins)")
    from accelbench.commands.fleet import add_fleet_arguments

    add_fleet_arguments(fleet)

    info = sub.add_parser("info", help="the system as accelbench sees it (what goes into result records)")
    info.add_argument("--json", action="store_true")
    plugins = sub.add_parser("plugins", help="installed plugins: status, hooks, devices detected")
    plugins.add_argument("--json", action="store_true")
    sub.add_parser("schema", help="print the JSON Schema of result records")

    from accelbench.compare import add_compare_arguments
    from accelbench.report import add_report_arguments
    from accelbench.sweep import add_sweep_arguments

    add_compare_arguments(sub.add_parser("compare", help="result records from many systems, side by side"))
    add_report_arguments(sub.add_parser("report", help="a self-contained HTML report with figures"))
    add_sweep_arguments(sub.add_parser("sweep", help="run a grid of points (or a built-in suite), resumably"))

    from accelbench.estimate.arguments import add_estimate_arguments

    estimate = sub.add_parser(
        "estimate", help="predict step time, memory and communication of a run without running it"
    )
    estimate.add_argument("--config", type=Path, default=argparse.SUPPRESS, metavar="FILE",
                          help="start from a run configuration (JSON) or a result record; flags override it")  # fmt: skip
    add_config_arguments(estimate, listed)
    _add_declared(estimate, workload_options, _WORKLOAD, "workload options")
    _add_declared(estimate, backend_options, _BACKEND, "backend options (from plugins)")
    add_estimate_arguments(estimate)
    from accelbench.plan.arguments import add_plan_arguments

    add_plan_arguments(
        sub.add_parser(
            "plan",
            help="choose a configuration: candidates ranked by predicted throughput, optionally measured",
        )
    )
    from accelbench.commands.calibrate import add_calibrate_arguments

    add_calibrate_arguments(
        sub.add_parser(
            "calibrate",
            help="measure this device's rates (what predictions are priced with); --export a device profile",
        )
    )
    from accelbench.commands.check_backend import add_check_backend_arguments

    add_check_backend_arguments(
        sub.add_parser(
            "check-backend",
            help="run the conformance kit against an installed backend plugin and report what it proved",
        )
    )
    from accelbench.comm.options import add_comm_arguments

    add_comm_arguments(
        sub.add_parser("comm", help="collective bandwidth (all_reduce, all_gather, ...) in nccl-tests' terms")
    )
    return parser


# The core run options by what they are about, as --help groups them (a field named in none: "other run options")
CORE_GROUPS: dict[str, tuple[str, ...]] = {
    "what to train": ("workload", "model", "batch_size", "grad_accum", "epochs", "steps_per_epoch", "precision",
                      "learning_rate", "seed", "backend", "engine", "compile", "compile_mode",
                      "activation_checkpointing", "output_dir"),
    "data": ("data", "data_placement"),
    "several devices and nodes": ("strategy", "devices", "nnodes", "node_rank", "rdzv_endpoint",
                                  "collective_timeout", "mesh", "placement", "pp_schedule", "microbatches",
                                  "virtual_stages", "pp_split", "sequence_parallel", "threads"),
    "measurement and prediction": ("peak_tflops", "profile", "profile_steps", "idle_baseline_s", "no_tensor_peak",
                                   "no_calibration", "comm_records"),
    "training quality": ("eval_batches", "target_loss", "target", "grad_norm_limit", "stall_epochs"),
}  # fmt: skip


def add_config_arguments(parser: argparse.ArgumentParser, listed: Mapping[str, str] | None = None) -> None:
    """One flag per core run option, generated from RunConfig's fields (defaults are RunConfig's: a flag the
    user does not give is absent from the namespace, so ``--config`` values are not overridden by defaults).
    ``listed``: the values to show for open-ended fields (``precision``, ``strategy``, ``model``) as installed."""
    from accelbench.references import describe_targets

    listed = {"precision": ", ".join(PRECISIONS), "target": describe_targets(), **(listed or {})}
    groups: dict[str, argparse._ArgumentGroup] = {}
    for name in cli_fields():
        title = next((t for t, names in CORE_GROUPS.items() if name in names), "other run options")
        if title not in groups:
            groups[title] = parser.add_argument_group(title)
        group = groups[title]
        info = RunConfig.model_fields[name]
        flag = "--" + flag_of(name)
        text = (info.description or "").replace("%", "%%")
        default = info.get_default(call_default_factory=True)
        help_text = f"{text} (default: {default})" if default is not None else text
        kind, choices = _kind(info.annotation)
        kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": help_text}
        if kind is bool:
            group.add_argument(flag, action="store_true", **kwargs)
            continue
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        if choices:
            kwargs["choices"] = choices
        else:
            kwargs["metavar"] = str(extra.get("metavar") or flag_of(name).upper().replace("-", "_"))
        if name in listed:  # shown, but RunConfig and the preflight judge them (with hints, not argparse's)
            kwargs["help"] = f"{kwargs['help']}; choices: {listed[name]}"
        group.add_argument(flag, type=kind, **kwargs)


def _kind(annotation: Any) -> tuple[Any, list[str] | None]:
    """(argparse type, choices) of a field's annotation: ``int | None`` -> int; ``Literal[...]`` -> choices."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return str, [str(a) for a in typing.get_args(annotation)]
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return _kind(args[0])
    if annotation is Path:
        return Path, None
    if annotation in (int, float, bool, str):
        return annotation, None
    return str, None


_TYPES: dict[str, Any] = {"str": str, "int": int, "float": float}


def _add_declared(
    parser: argparse.ArgumentParser, options: Sequence[RunOption], prefix: str, title: str
) -> None:
    """Workload and plugin options: stored only when given (the owner applies its default, recorded)."""
    if not options:
        return
    seen: dict[str, list[RunOption]] = {}
    for option in options:
        seen.setdefault(option.cli_flag, []).append(option)
    groups: dict[str, argparse._ArgumentGroup] = {}
    for flag, same in seen.items():
        option = same[0]
        owners = ", ".join(sorted({o.owner for o in same if o.owner}))
        # a workload's own options under its name ("llama options"); those several share, and plugins', together
        heading = f"{owners} options" if prefix == _WORKLOAD and owners and "," not in owners else title
        if heading not in groups:
            groups[heading] = parser.add_argument_group(heading)
        group = groups[heading]
        default = f" (default: {option.default})" if option.default is not None else ""
        choices = f" [{'|'.join(map(str, option.choices))}]" if option.choices else ""
        text = f"[{owners}] {option.help}{choices}{default}".replace("%", "%%")
        dest = prefix + option.name
        if option.type == "bool":
            group.add_argument(
                "--" + flag, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=text
            )
        else:
            metavar = flag.upper().replace("-", "_")
            group.add_argument(
                "--" + flag, dest=dest, metavar=metavar, type=_TYPES[option.type], default=None, help=text
            )


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The run configuration: ``--config FILE`` if given, with every flag the user gave on top."""
    values: dict[str, Any] = dict(_config_file(args.config)) if getattr(args, "config", None) else {}
    names = set(RunConfig.model_fields)
    for key, value in vars(args).items():
        if key.startswith(_WORKLOAD) and value is not None:
            values.setdefault("workload_options", {})
            values["workload_options"] = {**values["workload_options"], key.removeprefix(_WORKLOAD): value}
        elif key.startswith(_BACKEND) and value is not None:
            values["backend_options"] = {
                **values.get("backend_options", {}),
                key.removeprefix(_BACKEND): value,
            }
        elif key in names:
            values[key] = value
    return make_config(values)


def make_config(values: dict[str, Any]) -> RunConfig:
    """RunConfig from plain values, its validation errors told with the option names users type."""
    from pydantic import ValidationError

    try:
        return RunConfig(**values)
    except ValidationError as exc:
        problems = []
        for e in exc.errors():
            loc = str(e["loc"][0]) if e["loc"] else ""
            name = f"--{flag_of(loc) if loc in RunConfig.model_fields else loc}: " if loc else ""
            given = e.get("input")
            got = (  # a bound or type pydantic checked: the value given, as the workload options' messages say
                f" (got {given!r})"
                if e["type"] != "value_error"
                and isinstance(given, (int, float, str))
                and len(repr(given)) < 80
                else ""
            )
            problems.append(name + str(e["msg"]).removeprefix("Value error, ") + got)
        raise ConfigError("; ".join(problems)) from None


def _config_file(path: Path) -> dict[str, Any]:
    """The configuration in ``path``: a RunConfig as JSON, or a result record (its ``config``)."""
    from accelbench.results import MAX_RECORD_BYTES

    try:  # at most a record's worth: /dev/zero or a huge file is not a configuration (a pipe, <(...), is read)
        if Path(path).is_dir():
            raise ConfigError(
                f"--config {path}: is a folder; give a run configuration or a result record file"
            )
        with open(path, "rb") as fh:
            data = fh.read(MAX_RECORD_BYTES + 1)
        if len(data) > MAX_RECORD_BYTES:
            raise ConfigError(
                f"--config {path}: more than {MAX_RECORD_BYTES} bytes, far too large to be a run configuration"
            )
        raw = json.loads(data.decode("utf-8"))
    except OSError as exc:
        raise ConfigError(f"--config {path}: cannot read it: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--config {path}: not JSON ({exc})") from None
    except RecursionError:
        raise ConfigError(
            f"--config {path}: not a run configuration: its JSON is nested too deeply"
        ) from None
    except ValueError as exc:  # a number of more digits than Python converts
        raise ConfigError(f"--config {path}: not a run configuration: {str(exc).split(';')[0]}") from None
    if isinstance(raw, dict) and "schema" in raw and raw.get("schema") != "accelbench.result":
        raise ConfigError(
            f"--config {path}: a record of another kind (schema {str(raw.get('schema'))[:60]!r}), not a run "
            "configuration or a result record (schema 'accelbench.result')"
        )
    if isinstance(raw, dict) and raw.get("schema") == "accelbench.result":
        from accelbench.results import migrate

        raw = migrate(raw).get("config")
    if not isinstance(raw, dict):
        raise ConfigError(f"--config {path}: expected a JSON object of run options or a result record")
    return raw


# --------------------------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # the reader went away (`accelbench schema | head`): stop quietly, as `cat` does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's last flush does not fail again
        return ExitCode.CLOSED_PIPE


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        backend_options: list[RunOption] = []
        workload_options: list[RunOption] = []
        listed: dict[str, str] = {}
        # only these have plugin-made options: load plugins for them
        if argv[:1] in (["run"], ["estimate"], ["fleet"]):
            from accelbench.plugins import get_host

            host = get_host()
            backend_options, workload_options = host.run_options(), host.workload_run_options()
            asked = _help_for_workload(argv)
            if asked is not None:  # `run --help --workload moe`: that workload's own options, not every one's
                workload_options = [
                    o for o in workload_options if asked in {w.strip() for w in o.owner.split(",")}
                ]
            listed = {
                "strategy": ", ".join(sorted({s for b in host.backends.values() for s in b.strategies})),
                "model": "; ".join(
                    f"{name}: {', '.join(w.model_names())}" for name, w in host.workloads.items()
                ),
            }
        args = build_parser(backend_options, workload_options, listed).parse_args(argv)
    except AccelbenchError as exc:
        return _refused(exc)
    args.argv = argv
    try:
        return int(_command(args.command)(args, _stderr()))
    except AccelbenchError as exc:
        return _refused(exc)


def _help_for_workload(argv: Sequence[str]) -> str | None:
    """The workload named beside ``--help`` (``--workload NAME`` or ``--workload=NAME``), or None."""
    if not {"--help", "-h"} & set(argv):
        return None
    for i, arg in enumerate(argv):
        if arg == "--workload" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--workload="):
            return arg.split("=", 1)[1]
    return None


def _stderr() -> Console:
    from rich.console import Console

    return Console(stderr=True)


def _refused(exc: AccelbenchError) -> int:
    from rich.markup import escape

    _stderr().print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
    return ExitCode.REFUSED


# --------------------------------------------------------------------------------------------------------------
# the commands, each in its own module (imported when it runs)
# --------------------------------------------------------------------------------------------------------------


def _command(name: str) -> Callable[[argparse.Namespace, Console], int]:
    """The function that runs command ``name``: ``(args, stderr console) -> exit status``."""
    import importlib

    module, function = COMMANDS[name]
    handler: Callable[..., int] = getattr(importlib.import_module(module), function)
    if name == "estimate":  # estimate takes the run configuration the run options make
        return lambda args, err: handler(config_from_args(args), args, err)
    return handler


COMMANDS = {
    "run": ("accelbench.commands.run", "run_command"),
    "info": ("accelbench.commands.info", "info_command"),
    "plugins": ("accelbench.commands.info", "plugins_command"),
    "schema": ("accelbench.commands.info", "schema_command"),
    "compare": ("accelbench.compare", "compare_command"),
    "report": ("accelbench.report", "report_command"),
    "sweep": ("accelbench.sweep", "sweep_command"),
    "estimate": ("accelbench.estimate.command", "estimate_command"),
    "comm": ("accelbench.comm.command", "comm_command"),
    "plan": ("accelbench.plan.command", "plan_command"),
    "fleet": ("accelbench.commands.fleet", "fleet_command"),
    "calibrate": ("accelbench.commands.calibrate", "calibrate_command"),
    "check-backend": ("accelbench.commands.check_backend", "check_backend_command"),
}


if __name__ == "__main__":
    sys.exit(main())
