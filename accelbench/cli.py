"""The `accelbench` command line.

The ``run`` options are generated: the core's from :class:`accelbench.config.RunConfig` (name, type, default,
bounds and help live there), the workloads' and backend plugins' from the :class:`~accelbench.config.RunOption` s they
declare. Nothing heavy is imported at module level: ``accelbench --help``, ``compare``, ``report``, ``schema`` and
``sweep --dry-run`` never import torch; ``run`` and the device queries load it when they need it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelbench import __version__
from accelbench.config import RunConfig, cli_fields, flag_of
from accelbench.contract import PRECISIONS, RunOption
from accelbench.errors import AccelbenchError, ConfigError
from accelbench.exitcodes import ExitCode

if TYPE_CHECKING:
    from rich.console import Console

    from accelbench.launch import LaunchEnv

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
    from accelbench.comm.options import add_comm_arguments

    add_comm_arguments(
        sub.add_parser("comm", help="collective bandwidth (all_reduce, all_gather, ...) in nccl-tests' terms")
    )
    return parser


def add_config_arguments(parser: argparse.ArgumentParser, listed: Mapping[str, str] | None = None) -> None:
    """One flag per core run option, generated from RunConfig's fields (defaults are RunConfig's: a flag the
    user does not give is absent from the namespace, so ``--config`` values are not overridden by defaults).
    ``listed``: the values to show for open-ended fields (``precision``, ``strategy``, ``model``) as installed."""
    listed = {"precision": ", ".join(PRECISIONS), **(listed or {})}
    for name in cli_fields():
        info = RunConfig.model_fields[name]
        flag = "--" + flag_of(name)
        text = (info.description or "").replace("%", "%%")
        default = info.get_default(call_default_factory=True)
        help_text = f"{text} (default: {default})" if default is not None else text
        kind, choices = _kind(info.annotation)
        kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": help_text}
        if kind is bool:
            parser.add_argument(flag, action="store_true", **kwargs)
            continue
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        if choices:
            kwargs["choices"] = choices
        else:
            kwargs["metavar"] = str(extra.get("metavar") or flag_of(name).upper().replace("-", "_"))
        if name in listed:  # shown, but RunConfig and the preflight judge them (with hints, not argparse's)
            kwargs["help"] = f"{kwargs['help']}; choices: {listed[name]}"
        parser.add_argument(flag, type=kind, **kwargs)


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
    group = parser.add_argument_group(title)
    seen: dict[str, list[RunOption]] = {}
    for option in options:
        seen.setdefault(option.cli_flag, []).append(option)
    for flag, same in seen.items():
        option = same[0]
        owners = ", ".join(sorted({o.owner for o in same if o.owner}))
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
        if argv[:1] in (["run"], ["estimate"]):  # only these have plugin-made options: load plugins for them
            from accelbench.plugins import get_host

            host = get_host()
            backend_options, workload_options = host.run_options(), host.workload_run_options()
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
    handler = {
        "run": cmd_run,
        "info": cmd_info,
        "plugins": cmd_plugins,
        "schema": cmd_schema,
        "compare": cmd_compare,
        "report": cmd_report,
        "sweep": cmd_sweep,
        "estimate": cmd_estimate,
        "comm": cmd_comm,
    }[args.command]
    try:
        return int(handler(args, _stderr()))
    except AccelbenchError as exc:
        return _refused(exc)


def _stderr() -> Console:
    from rich.console import Console

    return Console(stderr=True)


def _refused(exc: AccelbenchError) -> int:
    from rich.markup import escape

    _stderr().print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
    return ExitCode.REFUSED


# --------------------------------------------------------------------------------------------------------------
# run
# --------------------------------------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace, err: Console) -> int:
    from accelbench.launcher import JobShape, Launcher, RecordKind
    from accelbench.plugins import get_host
    from accelbench.results import read_record, write_record

    launcher = Launcher(err, args.argv)
    if launcher.adopt_job_shape(getattr(args, "devices", None), getattr(args, "nnodes", None)):
        args.devices, args.nnodes = launcher.env.local_world_size, launcher.env.nnodes
        if hasattr(args, "node_rank"):
            del args.node_rank
    config = config_from_args(args)
    host = get_host()

    def preflight_once() -> bool:
        """Said once, by the process the user started; True where the job needs worker processes."""
        from accelbench.engine.runner import check_run_on_host, preflight

        checked = preflight(config, host)
        check_run_on_host(checked.config, spawning=launcher.env.launcher == "none")
        for warning in checked.warnings:
            err.print(f"[bold yellow]warning:[/] {_escape(warning)}", highlight=False, soft_wrap=True)
        return config.devices * config.nnodes > 1 and checked.collective is not None  # IPUs replicate in one

    shape = JobShape(config.devices, config.nnodes, config.node_rank, config.rdzv_endpoint, config.output_dir)
    records = RecordKind(
        "result record", read_record, lambda r, folder, path: write_record(r, folder, path=path)
    )
    return launcher.launch(shape, preflight_once, lambda env: _train_here(args, config, env, err), records)


def _train_here(args: argparse.Namespace, config: RunConfig, launch: LaunchEnv, err: Console) -> int:
    """This process's part of the run: train (as a rank, or alone); rank 0 writes and shows the record."""
    from accelbench.display import LiveProgress, LogProgress
    from accelbench.engine.runner import NoProgress, Progress, run
    from accelbench.plugins import get_host
    from accelbench.results import RecordNotSaved

    progress: Progress = NoProgress()
    if not args.quiet and launch.rank == 0:
        progress = LiveProgress(err) if err.is_terminal else LogProgress(sys.stderr)
    try:
        with _stdout_to_stderr() if args.json else contextlib.nullcontext():  # keep --json output clean
            record, path, status = run(config, get_host(), progress, launch)
    except RecordNotSaved as exc:  # measured, but the folder could not take it: the record goes to stdout
        print(exc.text, flush=True)
        err.print(f"[bold red]error:[/] {_escape(str(exc))}", highlight=False, soft_wrap=True)
        return ExitCode.ERROR
    if record is not None:
        if args.json:
            print(record.to_json(), flush=True)
        if not args.quiet:
            from accelbench.display import summary_table

            err.print(summary_table(record))
            err.print(f"result record: {path}", highlight=False, soft_wrap=True)
    return ExitCode.of_status(status)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Send everything written to stdout (by libraries, even from C++) to stderr while it lasts."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


# --------------------------------------------------------------------------------------------------------------
# info, plugins, schema
# --------------------------------------------------------------------------------------------------------------


def cmd_info(args: argparse.Namespace, err: Console) -> int:
    from accelbench.plugins import get_host
    from accelbench.system import collect_system_info

    host = get_host()
    system = collect_system_info(host.recorded_environment())
    backends: list[dict[str, Any]] = []
    for backend in host.backends.values():
        devices = backend.detect()
        backends.append(
            {
                "backend": backend.info.model_dump(),
                "devices": [d.model_dump() for d in devices],
                "detect_error": backend.detect_error,
                "runtime_versions": backend.runtime_versions() if devices else {},
                "peaks": _peaks(backend, devices[0]) if devices else {},
            }
        )
    data: dict[str, Any] = {"system": system.model_dump(), "backends": backends, "plugins": host.versions()}
    if args.json:
        print(json.dumps(data, indent=2))
        return ExitCode.OK
    from rich.console import Console
    from rich.table import Table

    out = Console()
    table = Table(title="system", show_header=False)
    for key, value in system.model_dump().items():
        table.add_row(key.removesuffix("_bytes").replace("_", " "), _shown(key, value))
    out.print(table)
    listing = Table(title="backends and devices (highest detection priority first)")
    for col in ("backend", "devices", "peak (dense, per device)", "runtime"):
        listing.add_column(col)
    for b in backends:
        names = "\n".join(_device_line(d) for d in b["devices"]) or (
            f"none ({b['detect_error']})" if b["detect_error"] else "none"
        )
        peaks = "\n".join(
            f"{name}: {p['flops_per_s'] / 1e12:g} TFLOP/s" for name, p in b["peaks"].items() if p
        )
        source = next((p["source"].split(",")[0] for p in b["peaks"].values() if p), "")
        bandwidth = next((p["memory_bandwidth_bytes_per_s"] for p in b["peaks"].values() if p), None)
        peaks += f"\nmemory {bandwidth / 1e12:g} TB/s" if bandwidth else ""
        peaks += f"\n({source})" if source else "" if peaks else "unknown"
        runtime = ", ".join(f"{k} {v}" for k, v in b["runtime_versions"].items())
        listing.add_row(b["backend"]["name"], names, peaks, runtime)
    out.print(listing)
    return ExitCode.OK


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _shown(key: str, value: Any) -> str:
    """A system fact as a person reads it: sizes in GiB, mappings as ``k: v`` lines, nothing as "none"."""
    if value is None or value == {} or value == "":
        return {"scheduler": "none (not in a batch job)", "job_id": "none", "torch_cuda": "none (not a CUDA build)",
                "torch_hip": "none (not a ROCm build)", "environment": "none recorded"}.get(key, "unknown")  # fmt: skip
    if key.endswith("_bytes") and isinstance(value, int):
        return _gib(value)
    if isinstance(value, dict):
        return "\n".join(f"{k}: {v}" for k, v in value.items())
    return str(value)


def _device_line(device: dict[str, Any]) -> str:
    extra = [device["arch"]] if device.get("arch") else []
    if device.get("memory_bytes"):
        extra.append(_gib(device["memory_bytes"]))
    return f"[{device['index']}] {device['name']}" + (f" ({', '.join(extra)})" if extra else "")


def _peaks(backend: Any, device: Any) -> dict[str, dict[str, Any] | None]:
    """The backend's peak figures for the first device, per math: what MFU is measured against."""
    from accelbench.contract import standard_plan

    out: dict[str, dict[str, Any] | None] = {}
    for label, precision in (("bf16", "bf16-mixed"), ("fp16", "fp16-mixed"), ("fp32", "fp32")):
        peak = backend.peak_figures(device, standard_plan(precision, matmul_math="ieee-fp32"))
        out[label] = peak.model_dump() if peak else None
    return out


def cmd_plugins(args: argparse.Namespace, err: Console) -> int:
    from accelbench.plugins import get_host

    host = get_host()
    rows = []
    for record in host.records:
        row = record.to_json()
        backend = host.backends.get(record.backend.name) if record.backend else None
        detected = backend.detect() if backend else []
        row["devices"] = [d.model_dump() for d in detected]
        row["strategies"] = _answer(functools.partial(_strategies, backend)) if backend else None
        row["precisions"] = _answer(functools.partial(_precisions, backend)) if backend and detected else None
        rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2))
        return ExitCode.OK
    from rich.console import Console
    from rich.markup import escape

    out = Console()
    for row in rows:
        dist = f"{row['distribution']} {row['version']}" if row["distribution"] else "no distribution"
        status = (
            "[green]active[/]"
            if row["status"] == "active"
            else f"[bold red]failed[/]: {escape(row['error'])}"
        )
        contract = f", contract {row['contract']}" if row["contract"] else ""
        out.print(f"[bold]{row['name']}[/] ({dist}{contract}): {status}", highlight=False, soft_wrap=True)
        if row["backend"]:
            about = f" ({row['backend']['description']})" if row["backend"]["description"] else ""
            names = ", ".join(d["name"] for d in row["devices"]) or f"none detected{about}"
            out.print(f"  backend {row['backend']['name']}: {names}", highlight=False, soft_wrap=True)
            precisions = row["precisions"] or "(the device decides; none detected here)"
            out.print(f"  precisions: {_listed(precisions)}", highlight=False, soft_wrap=True)
            out.print(f"  strategies: {_listed(row['strategies'])}", highlight=False, soft_wrap=True)
            for name, methods in row["overrides"].items():
                shown = ", ".join(methods) or "none (the stock torch behaviour throughout)"
                out.print(f"  {name} overrides: {shown}", highlight=False, soft_wrap=True)
        if row["hooks"]:
            hooks = ", ".join(h.removeprefix("accelbench_") for h in row["hooks"])
            out.print(f"  hooks: {hooks}", highlight=False, soft_wrap=True)
        for warning in row["warnings"]:
            out.print(f"  [yellow]warning[/]: {escape(warning)}", highlight=False, soft_wrap=True)
    return ExitCode.OK


def _answer(ask: Any) -> list[str] | str:
    """A backend's answer, or what went wrong asking (``plugins`` reports, it does not fail)."""
    try:
        return list(ask())
    except Exception as exc:  # noqa: BLE001 - a plugin's fault is shown, not raised
        return f"unknown ({type(exc).__name__}: {exc})"


def _precisions(backend: Any) -> list[str]:
    """Asked as the launcher asks, of the device type (no index): no device runtime is initialised for it."""
    import torch

    return list(backend.supported_precisions(torch.device(backend.info.device_type)))


def _strategies(backend: Any) -> list[str]:
    return list(backend.supported_strategies(_device_kind(backend)))


def _device_kind(backend: Any) -> Any:
    """A backend's device type as an index-less torch device: what is asked before a device is bound."""
    import torch

    return torch.device(backend.info.device_type)


def _listed(value: list[str] | str | None) -> str:
    return ", ".join(value) if isinstance(value, list) else str(value)


def cmd_schema(args: argparse.Namespace, err: Console) -> int:
    from accelbench.results import json_schema

    print(json.dumps(json_schema(), indent=2))
    return ExitCode.OK


def cmd_compare(args: argparse.Namespace, err: Console) -> int:
    from accelbench.compare import compare_command

    return compare_command(args, err)


def cmd_report(args: argparse.Namespace, err: Console) -> int:
    from accelbench.report import report_command

    return report_command(args, err)


def cmd_estimate(args: argparse.Namespace, err: Console) -> int:
    from accelbench.estimate.command import estimate_command

    return estimate_command(config_from_args(args), args, err)


def cmd_sweep(args: argparse.Namespace, err: Console) -> int:
    from accelbench.sweep import sweep_command

    return sweep_command(args, err)


def cmd_comm(args: argparse.Namespace, err: Console) -> int:
    from accelbench.comm.command import comm_command

    return comm_command(args, err)


if __name__ == "__main__":
    sys.exit(main())
