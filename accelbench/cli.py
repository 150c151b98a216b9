"""The `accelbench` command line."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from accelbench import __version__
from accelbench.config import RunConfig, RunOption
from accelbench.errors import AccelbenchError
from accelbench.precision import PRECISIONS

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_OOM, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
_EXIT_BY_STATUS = {"ok": EXIT_OK, "error": EXIT_ERROR, "oom": EXIT_OOM, "interrupted": EXIT_INTERRUPTED}

# CLI flag -> RunConfig field, for flags whose names differ
_FIELD_OF = {"layers": "n_layer", "heads": "n_head", "embd": "n_embd", "lr": "learning_rate"}


def build_parser(plugin_options: Sequence[RunOption] = ()) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="accelbench", description="Benchmark AI training on any accelerator, with honest numbers."
    )
    parser.add_argument("--version", action="version", version=f"accelbench {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="train the reference workload and write a result record")
    run.add_argument("--backend", help="backend name (default: detect; see `accelbench plugins`)")
    run.add_argument("--workload", default="gpt", help="workload name (default: gpt)")
    run.add_argument(
        "--engine",
        choices=["native", "lightning"],
        default="native",
        help="native: accelbench's loop; lightning: the same workload through Lightning Fabric",
    )
    run.add_argument(
        "--model", default="gpt-nano", help="model size, e.g. gpt-nano, gpt2, gpt2-medium, or custom"
    )
    run.add_argument("--layers", type=int, help="custom size: transformer layers (with --model custom)")
    run.add_argument("--heads", type=int, help="custom size: attention heads")
    run.add_argument("--embd", type=int, help="custom size: embedding width")
    run.add_argument("--block-size", type=int, default=128)
    run.add_argument("--batch-size", type=int, default=64, help="per-device batch size (default: 64)")
    run.add_argument("--epochs", type=int, default=2, help="epochs; the first is reported apart as warm-up")
    run.add_argument("--steps-per-epoch", type=int, help="cap the steps of each epoch (quick runs)")
    run.add_argument("--precision", default="fp32", help=f"one of {', '.join(PRECISIONS)} (default: fp32)")
    run.add_argument("--strategy", default="single", help="distribution strategy (default: single)")
    run.add_argument(
        "--devices",
        type=int,
        help="devices (one worker process each) per node; default 1, or what srun/mpirun started",
    )
    run.add_argument("--nnodes", type=int, help="nodes in the job (as torchrun's --nnodes)")
    run.add_argument("--node-rank", type=int, help="this node's rank (as torchrun's --node-rank)")
    run.add_argument("--rdzv-endpoint", help="HOST:PORT of the rendezvous on the first node (multi-node)")
    run.add_argument(
        "--collective-timeout",
        type=float,
        default=600.0,
        help="seconds a rank waits for its peers (default: 600)",
    )
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--data", type=Path, help="text file to train on (default: generated 4.4 MiB corpus)")
    run.add_argument("--dropout", type=float, default=0.1)
    run.add_argument("--lr", type=float, default=3e-4, help="AdamW learning rate")
    run.add_argument("--compile", action="store_true", help="torch.compile the model (compile timed apart)")
    run.add_argument(
        "--compile-mode",
        choices=["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"],
        default="default",
        help="torch.compile mode with --compile; reduce-overhead replays steps as CUDA graphs (default: default)",
    )
    run.add_argument(
        "--data-placement",
        choices=["auto", "host", "device"],
        default="auto",
        help="device: corpus on the accelerator, batches gathered there; host: numpy batches copied each "
        "step; auto: device on accelerators for corpora up to 2 GiB (default: auto)",
    )
    run.add_argument(
        "--vocab-multiple",
        type=int,
        default=64,
        help="pad embedding/head rows to a multiple of this for aligned matmuls; 1 = no padding (default: 64)",
    )
    run.add_argument("--threads", type=int, help="torch intra-op threads (CPU)")
    run.add_argument(
        "--peak-tflops", type=float, help="peak TFLOP/s per device for MFU (overrides the table)"
    )
    run.add_argument("--output-dir", type=Path, default=Path("results"), help="where result records go")
    run.add_argument("--quiet", "-q", action="store_true", help="no progress display or summary")
    run.add_argument("--json", action="store_true", help="print the result record as JSON on stdout")
    _add_plugin_options(run, plugin_options)

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
    return parser


_TYPES = {"str": str, "int": int, "float": float}


def _add_plugin_options(parser: argparse.ArgumentParser, options: Sequence[RunOption]) -> None:
    """Plugin options are stored only when given: the plugin applies its own default, and records what ran."""
    if not options:
        return
    group = parser.add_argument_group("backend options (from plugins)")
    for option in options:
        flag = "--" + option.name.replace("_", "-")
        dest = "backend_option:" + option.name.replace("-", "_")
        default = f" (default: {option.default})" if option.default is not None else ""
        text = f"[{option.backend}] {option.help}{default}"
        if option.type == "bool":
            group.add_argument(
                flag, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=text
            )
        else:
            metavar = option.name.upper()
            group.add_argument(
                flag, dest=dest, metavar=metavar, type=_TYPES[option.type], default=None, help=text
            )


def main(argv: Sequence[str] | None = None) -> int:
    err = Console(stderr=True)
    try:
        from accelbench.plugins import get_host

        argv = list(sys.argv[1:] if argv is None else argv)
        options = get_host().run_options() if argv[:1] == ["run"] else []
    except AccelbenchError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return EXIT_USAGE
    args = build_parser(options).parse_args(argv)
    args.argv = argv
    try:
        handler = {
            "run": cmd_run,
            "info": cmd_info,
            "plugins": cmd_plugins,
            "schema": cmd_schema,
            "compare": cmd_compare,
            "report": cmd_report,
            "sweep": cmd_sweep,
        }[args.command]
        return handler(args, err)
    except AccelbenchError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return EXIT_USAGE


def config_from_args(args: argparse.Namespace) -> RunConfig:
    names = set(RunConfig.model_fields)
    values: dict[str, Any] = {}
    backend_options = {
        key.removeprefix("backend_option:"): value
        for key, value in vars(args).items()
        if key.startswith("backend_option:") and value is not None
    }
    if backend_options:
        values["backend_options"] = backend_options
    for key, value in vars(args).items():
        field = _FIELD_OF.get(key, key)
        if field in names and value is not None:
            values[field] = value
    try:
        return RunConfig(**values)
    except ValidationError as exc:
        flag = {v: k for k, v in _FIELD_OF.items()}
        problems = []
        for e in exc.errors():
            loc = e["loc"][0] if e["loc"] else ""
            name = f"--{flag.get(str(loc), str(loc)).replace('_', '-')}: " if loc else ""
            problems.append(name + str(e["msg"]).removeprefix("Value error, "))
        raise AccelbenchError("; ".join(problems)) from None


def cmd_run(args: argparse.Namespace, err: Console) -> int:
    from accelbench.display import LiveProgress, summary_table
    from accelbench.engine.runner import NoProgress, install_sigterm_handler, preflight, run
    from accelbench.launch import check_launch, detect_launch
    from accelbench.plugins import get_host

    launch = detect_launch()
    if launch.launcher != "none":  # a worker of torchrun, srun or mpirun: the job's shape comes from there
        check_launch(launch, args.devices, args.nnodes)
        args.devices, args.nnodes, args.node_rank = launch.local_world_size, launch.nnodes, None
    config = config_from_args(args)
    host = get_host()
    install_sigterm_handler()
    needs_workers = launch.launcher == "none" and config.devices * config.nnodes > 1
    if needs_workers and preflight(config, host).collective != "none":  # IPUs replicate in one process
        return launch_and_wait(args, config, err)
    live = not args.quiet and err.is_terminal and launch.rank == 0
    with _stdout_to_stderr() if args.json else contextlib.nullcontext():  # keep --json output clean
        record, path, status = run(config, host, LiveProgress(err) if live else NoProgress(), launch)
    if record is not None:
        if args.json:
            print(record.to_json(), flush=True)
        if not args.quiet:
            err.print(summary_table(record))
            err.print(f"result record: {path}", highlight=False, soft_wrap=True)
    return _EXIT_BY_STATUS[status]


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


def launch_and_wait(args: argparse.Namespace, config: RunConfig, err: Console) -> int:
    """Start this same command as one worker per device through torch.distributed's launcher, and wait."""
    from accelbench.launch import launch_workers
    from accelbench.results import read_record, write_record

    argv = sys.argv[1:] if args.argv is None else args.argv
    run_id, failures = launch_workers(
        argv, config.devices, config.nnodes, config.node_rank, config.rdzv_endpoint
    )
    if config.node_rank != 0:
        return EXIT_ERROR if failures else EXIT_OK
    found = sorted(config.output_dir.glob(f"*_{run_id[:8]}.json"))
    if found:
        record = read_record(found[-1])
        if failures and record.outcome.status != "ok":  # add what only the launcher saw: exit codes
            seen = "; ".join(f"rank {r} exited with code {code}" for r, (code, _) in sorted(failures.items()))
            message = f"{record.outcome.message} [launcher: {seen}]"
            record = record.model_copy(
                update={"outcome": record.outcome.model_copy(update={"message": message})}
            )
            write_record(record, config.output_dir, path=found[-1])
        return _EXIT_BY_STATUS[record.outcome.status]
    for rank, (code, message) in sorted(failures.items()):
        err.print(
            f"[bold red]rank {rank} failed[/] (exit code {code}): {message}", highlight=False, soft_wrap=True
        )
    err.print("[bold red]error:[/] no result record was written (rank 0 ended before it could write one)")
    return EXIT_ERROR


def cmd_info(args: argparse.Namespace, err: Console) -> int:
    from accelbench.plugins import get_host
    from accelbench.system import collect_system_info

    host = get_host()
    system = collect_system_info()
    backends = []
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
    data = {"system": system.model_dump(), "backends": backends, "plugins": host.versions()}
    if args.json:
        print(json.dumps(data, indent=2))
        return EXIT_OK
    out = Console()
    table = Table(title="system", show_header=False)
    for key, value in system.model_dump().items():
        shown = _gib(value) if key == "memory_bytes" and value else value
        table.add_row(key, json.dumps(shown) if isinstance(shown, dict) else str(shown))
    out.print(table)
    devices = Table(title="backends and devices (highest detection priority first)")
    for col in ("backend", "device unit", "devices", "peak (dense, per device)", "runtime"):
        devices.add_column(col)
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
        devices.add_row(b["backend"]["name"], b["backend"]["device_unit"], names, peaks, runtime)
    out.print(devices)
    return EXIT_OK


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _device_line(device: dict[str, Any]) -> str:
    extra = [device["arch"]] if device.get("arch") else []
    if device.get("memory_bytes"):
        extra.append(_gib(device["memory_bytes"]))
    return f"[{device['index']}] {device['name']}" + (f" ({', '.join(extra)})" if extra else "")


def _peaks(backend: Any, device: Any) -> dict[str, dict[str, Any] | None]:
    """The backend's peak figures for the first device, per math: what MFU is measured against."""
    from accelbench.precision import standard_plan

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
        row["devices"] = [d.model_dump() for d in backend.detect()] if backend else []
        rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    out = Console()
    for row in rows:
        dist = f"{row['distribution']} {row['version']}" if row["distribution"] else "no distribution"
        if row["status"] == "active":
            status = "[green]active[/]"
        else:
            status = f"[bold red]failed[/]: {escape(row['error'])}"
        out.print(f"[bold]{row['name']}[/] ({dist}): {status}", highlight=False, soft_wrap=True)
        if row["backend"]:
            about = f" ({row['backend']['description']})" if row["backend"]["description"] else ""
            devices = ", ".join(d["name"] for d in row["devices"]) or f"none detected{about}"
            out.print(f"  backend {row['backend']['name']}: {devices}", highlight=False, soft_wrap=True)
        if row["hooks"]:
            hooks = ", ".join(h.removeprefix("accelbench_") for h in row["hooks"])
            out.print(f"  hooks: {hooks}", highlight=False, soft_wrap=True)
        for warning in row["warnings"]:
            out.print(f"  [yellow]warning[/]: {escape(warning)}", highlight=False, soft_wrap=True)
    return EXIT_OK


def cmd_schema(args: argparse.Namespace, err: Console) -> int:
    from accelbench.results import json_schema

    print(json.dumps(json_schema(), indent=2))
    return EXIT_OK


def cmd_compare(args: argparse.Namespace, err: Console) -> int:
    from accelbench.compare import compare_command

    return compare_command(args, err)


def cmd_report(args: argparse.Namespace, err: Console) -> int:
    from accelbench.report import report_command

    return report_command(args, err)


def cmd_sweep(args: argparse.Namespace, err: Console) -> int:
    from accelbench.sweep import sweep_command

    return sweep_command(args, err)


if __name__ == "__main__":
    sys.exit(main())
