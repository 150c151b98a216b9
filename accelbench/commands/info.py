"""``accelbench info``, ``plugins`` and ``schema``: what this host, its plugins and the record format are."""

from __future__ import annotations

import argparse
import functools
import json
from typing import TYPE_CHECKING, Any

from accelbench.exitcodes import ExitCode

if TYPE_CHECKING:
    from rich.console import Console


def info_command(args: argparse.Namespace, err: Console) -> int:
    """``accelbench info``: this host, its backends and their devices, peaks and runtimes."""
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
        plan = standard_plan(precision, matmul_math="ieee-fp32")
        peak = backend.peak_figures(device, plan) or _cached_peak(backend, device, plan)
        out[label] = peak.model_dump() if peak else None
    return out


def _cached_peak(backend: Any, device: Any, plan: Any) -> Any:
    """Where the backend's table has no peak (a CPU), the dense-matmul rate a run measured and cached on this host
    (what its MFU was against), or None; nothing is measured here."""
    from accelbench.estimate.peak import measured_peak

    try:
        return measured_peak(backend, backend.device_kind(), plan, device_name=device.name, cached_only=True)
    except Exception:  # noqa: BLE001 - info reports, it does not fail for a cache it cannot read
        return None


def plugins_command(args: argparse.Namespace, err: Console) -> int:
    """``accelbench plugins``: every plugin found, its contract version, backends and what each answers."""
    from accelbench.plugins import get_host

    host = get_host()
    rows = []
    for record in host.records:
        row = record.to_json()
        backend = host.backends.get(record.backend.name) if record.backend else None
        detected = backend.detect() if backend else []
        row["devices"] = [d.model_dump() for d in detected]
        row["detect_error"] = backend.detect_error if backend else None
        row["strategies"] = _answer(functools.partial(_strategies, backend)) if backend else None
        row["precisions"] = _answer(functools.partial(_precisions, backend)) if backend and detected else None
        rows.append(row)
    from accelbench.vendors import IN_TREE

    installed = {row["backend"]["name"] for row in rows if row["backend"]}
    missing = [p for p in IN_TREE if p.backend not in installed]
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
            failed = f"detection failed: {escape(row['detect_error'])}" if row["detect_error"] else None
            names = ", ".join(d["name"] for d in row["devices"]) or failed or f"none detected{about}"
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
    if missing:
        out.print(
            "[bold]not loaded here[/] (vendor plugins in accelbench's plugins/ folder: not installed, or left out "
            "by ACCELBENCH_PLUGINS):",
            highlight=False,
        )
        for plugin in missing:
            out.print(
                f"  {plugin.distribution} ({plugin.hardware}): {plugin.install}",
                highlight=False,
                soft_wrap=True,
            )
    return ExitCode.OK


def _answer(ask: Any) -> list[str] | str:
    """A backend's answer, or what went wrong asking (``plugins`` reports, it does not fail)."""
    try:
        return list(ask())
    except Exception as exc:  # noqa: BLE001 - a plugin's fault is shown, not raised
        return f"unknown ({type(exc).__name__}: {exc})"


def _precisions(backend: Any) -> list[str]:
    """Asked as the launcher asks, of the device type (no index): no device runtime is initialised for it."""

    return list(backend.supported_precisions(backend.device_kind()))


def _strategies(backend: Any) -> list[str]:
    return list(backend.supported_strategies(_device_kind(backend)))


def _device_kind(backend: Any) -> Any:
    """A backend's device type as an index-less torch device: what is asked before a device is bound."""

    return backend.device_kind()


def _listed(value: list[str] | str | None) -> str:
    return ", ".join(value) if isinstance(value, list) else str(value)


def schema_command(args: argparse.Namespace, err: Console) -> int:
    """``accelbench schema``: the result record's JSON schema."""
    from accelbench.results import json_schema

    print(json.dumps(json_schema(), indent=2))
    return ExitCode.OK
