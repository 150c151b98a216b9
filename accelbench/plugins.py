"""Plugin host: finds plugins through entry points, isolates broken ones, selects the backend.

The rest of accelbench talks to plugins only through :class:`PluginHost` and :class:`Backend`, never through
``pm.hook`` directly, so every hook call site is typed and in one place.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Literal

import pluggy
import torch

from accelbench import PROJECT, hookspecs
from accelbench.backends import defaults
from accelbench.config import RunOption
from accelbench.devices import BackendInfo, DeviceInfo, MemoryStats, PeakFigures
from accelbench.engine.executor import Executor, ExecutorRequest
from accelbench.errors import BackendError, ConfigError, PluginError
from accelbench.precision import PrecisionPlan
from accelbench.workloads import Workload

ENTRY_POINT_GROUP = "accelbench"
STRICT_ENV = "ACCELBENCH_STRICT_PLUGINS"
ONLY_ENV = "ACCELBENCH_PLUGINS"  # comma-separated entry-point names: load only these (plus the core defaults)

_HOOK_NAMES = sorted(name for name in dir(hookspecs) if name.startswith("accelbench_"))


@dataclass
class PluginRecord:
    """One plugin as `accelbench plugins` shows it."""

    name: str
    distribution: str | None
    version: str | None
    status: Literal["active", "failed"]
    error: str | None = None
    hooks: list[str] = field(default_factory=list)
    backend: BackendInfo | None = None
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "status": self.status,
            "error": self.error,
            "hooks": self.hooks,
            "backend": self.backend.model_dump() if self.backend else None,
            "warnings": self.warnings,
        }


class Backend:
    """Typed access to one backend's hooks: the selected plugin first, then the core defaults."""

    def __init__(
        self, pm: pluggy.PluginManager, info: BackendInfo, plugin: object, others: list[object]
    ) -> None:
        self.info = info
        self.name = info.name
        self.plugin = plugin
        self._pm = pm
        self._others = others
        self._callers: dict[str, pluggy.HookCaller] = {}
        self._devices: list[DeviceInfo] | None = None
        self.detect_error: str | None = None

    def _call(self, hook: str, **kwargs: Any) -> Any:
        caller = self._callers.get(hook)
        if caller is None:
            caller = self._callers[hook] = self._pm.subset_hook_caller(hook, self._others)
        return caller(**kwargs)

    # detection ------------------------------------------------------------------------------------------
    def detect(self) -> list[DeviceInfo]:
        """Devices present; [] when none or when detection itself failed (the failure is kept in ``detect_error``).

        Detected once per Backend: backend selection, preflight and the record all ask, and a probe may cost a
        subprocess.
        """
        if self._devices is None:
            try:
                self._devices = list(self._call("accelbench_detect_devices") or [])
            except Exception as exc:  # detection must never break a command
                self.detect_error = f"{type(exc).__name__}: {exc}"
                self._devices = []
        return list(self._devices)

    def runtime_versions(self) -> dict[str, str]:
        return dict(self._call("accelbench_runtime_versions") or {})

    # device setup / collectives -------------------------------------------------------------------------
    def setup_device(self, local_rank: int) -> torch.device:
        return self._call("accelbench_setup_device", device_type=self.info.device_type, local_rank=local_rank)

    def collective_backend(self, device: torch.device) -> str:
        return self._call("accelbench_collective_backend", device=device)

    # precision --------------------------------------------------------------------------------------------
    def supported_precisions(self, device: torch.device) -> list[str]:
        return list(self._call("accelbench_supported_precisions", device=device))

    def check_precision(self, precision: str, device: torch.device) -> None:
        supported = self.supported_precisions(device)
        if precision not in supported:
            raise ConfigError(
                f"backend {self.name!r} does not support precision {precision!r} on {device}; "
                f"it supports: {', '.join(supported)}"
            )

    def precision_plan(
        self, precision: str, device: torch.device, options: dict[str, str | int | float | bool] | None = None
    ) -> PrecisionPlan:
        self.check_precision(precision, device)
        return self._call(
            "accelbench_precision_plan", precision=precision, device=device, options=dict(options or {})
        )

    # strategies -------------------------------------------------------------------------------------------
    def supported_strategies(self) -> list[str]:
        return list(self._call("accelbench_supported_strategies"))

    def executor(self, request: ExecutorRequest) -> Executor:
        self.check_strategy(request.strategy)
        executor = self._call("accelbench_executor", request=request)
        if executor is None:
            raise BackendError(
                f"backend {self.name!r} declared strategy {request.strategy!r} but built no executor"
            )
        return executor

    def check_strategy(self, strategy: str) -> None:
        supported = self.supported_strategies()
        if strategy not in supported:
            raise ConfigError(
                f"backend {self.name!r} does not support strategy {strategy!r}; it supports: {', '.join(supported)}"
            )

    # timing / memory / peaks ------------------------------------------------------------------------------
    def synchronize(self, device: torch.device) -> None:
        self._call("accelbench_synchronize", device=device)

    def reset_peak_memory(self, device: torch.device) -> None:
        self._call("accelbench_reset_peak_memory", device=device)

    def memory_stats(self, device: torch.device) -> MemoryStats:
        return self._call("accelbench_memory_stats", device=device)

    def release_memory(self, device: torch.device) -> None:
        self._call("accelbench_release_memory", device=device)

    def telemetry(self, device: torch.device) -> dict[str, float]:
        return dict(self._call("accelbench_device_telemetry", device=device) or {})

    def peak_figures(self, device: DeviceInfo, precision: PrecisionPlan) -> PeakFigures | None:
        return self._call("accelbench_peak_figures", device=device, precision=precision)


class PluginHost:
    """Loads plugins once and hands out backends and workloads."""

    def __init__(self, strict: bool | None = None) -> None:
        self.strict = os.environ.get(STRICT_ENV, "") not in ("", "0") if strict is None else strict
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.pm.register(defaults, name="accelbench.defaults")
        self.records: list[PluginRecord] = []
        self._backends: dict[str, Backend] = {}
        self._workloads: dict[str, tuple[Workload, str]] = {}
        self._plugin_of: dict[str, object] = {}  # entry-point name -> registered plugin object
        self._run_options: list[RunOption] | None = None
        self._load_entry_points()
        self._collect_backends()
        self._collect_workloads()

    # loading ----------------------------------------------------------------------------------------------
    def _load_entry_points(self) -> None:
        only = {n.strip() for n in os.environ.get(ONLY_ENV, "").split(",") if n.strip()}
        for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            if only and ep.name not in only:
                continue
            dist = ep.dist.name if ep.dist else None
            version = ep.dist.version if ep.dist else None
            record = PluginRecord(name=ep.name, distribution=dist, version=version, status="active")
            self.records.append(record)
            try:
                plugin = self._register(ep)
            except Exception as exc:
                self._fail(record, exc)
                continue
            record.hooks = sorted(c.name for c in self.pm.get_hookcallers(plugin) or [])
            record.warnings = _undecorated_hooks(plugin)
            self._plugin_of[ep.name] = plugin

    def _register(self, ep: EntryPoint) -> object:
        plugin = ep.load()
        if self.pm.is_registered(plugin):
            raise PluginError(
                f"entry point {ep.name!r} points at an object another entry point already registered"
            )
        try:
            self.pm.register(plugin, name=ep.name)  # raises PluginValidationError on a bad signature
        except Exception:
            if self.pm.get_plugin(ep.name) is not None:  # pluggy may have added some hooks before failing
                self.pm.unregister(name=ep.name)
            raise
        unknown = [c.name for c in self.pm.get_hookcallers(plugin) or [] if c.spec is None]
        if unknown:
            self.pm.unregister(plugin)
            raise PluginError("; ".join(_unknown_hook_message(name) for name in unknown))
        return plugin

    def _fail(self, record: PluginRecord, exc: BaseException) -> None:
        record.status = "failed"
        record.error = f"{type(exc).__name__}: {exc}"
        if self.strict:
            raise PluginError(
                f"plugin {record.name!r} (distribution {record.distribution}) failed: {record.error}"
            ) from exc

    def _collect_backends(self) -> None:
        found: dict[str, tuple[BackendInfo, object]] = {}
        for record in self.records:
            plugin = self._plugin_of.get(record.name)
            impl = getattr(plugin, "accelbench_backend", None)
            if record.status != "active" or impl is None:
                continue
            try:
                info = impl()
                if info is None:
                    continue
                if not isinstance(info, BackendInfo):
                    raise PluginError(f"accelbench_backend returned {type(info).__name__}, not BackendInfo")
                if info.name in found:
                    owner = next(r for r in self.records if r.backend and r.backend.name == info.name)
                    raise PluginError(
                        f"backend name {info.name!r} is already provided by distribution {owner.distribution} "
                        f"(plugin {owner.name!r}); uninstall one of the two"
                    )
            except Exception as exc:
                self.pm.unregister(plugin)
                self._fail(record, exc)
                continue
            record.backend = info
            found[info.name] = (info, plugin)
        plugins = [plugin for _, plugin in found.values()]
        for name, (info, plugin) in found.items():
            self._backends[name] = Backend(self.pm, info, plugin, [p for p in plugins if p is not plugin])

    def _collect_workloads(self) -> None:
        for impl in self.pm.hook.accelbench_register_workloads.get_hookimpls():
            owner = impl.plugin_name

            def register(workload: Workload, owner: str = owner) -> None:
                if workload.name in self._workloads:
                    raise PluginError(
                        f"workload {workload.name!r} registered by both {self._workloads[workload.name][1]!r} "
                        f"and {owner!r}"
                    )
                self._workloads[workload.name] = (workload, owner)

            try:
                impl.function(register=register)
            except Exception as exc:
                record = next((r for r in self.records if r.name == owner), None)
                if record is None:  # the core's own workloads must register
                    raise
                self._fail(record, exc)

    # queries ----------------------------------------------------------------------------------------------
    @property
    def backends(self) -> dict[str, Backend]:
        """Active backends by name, highest detection priority first."""
        return dict(sorted(self._backends.items(), key=lambda kv: -kv[1].info.priority))

    @property
    def failed(self) -> list[PluginRecord]:
        return [r for r in self.records if r.status == "failed"]

    def select_backend(self, name: str | None) -> Backend:
        """The backend named, or the highest-priority one that detects a device."""
        if name is not None:
            if name not in self._backends:
                known = ", ".join(self.backends) or "none"
                hint = ""
                failed = [r for r in self.failed if r.name == name]
                if failed:
                    hint = f" (plugin {name!r} is installed but failed to load: {failed[0].error})"
                raise ConfigError(f"unknown backend {name!r}{hint}; installed backends: {known}")
            return self._backends[name]
        for backend in self.backends.values():
            if backend.detect():
                return backend
        raise BackendError("no backend detected a device; run `accelbench plugins` to see what is installed")

    def workload(self, name: str) -> Workload:
        if name not in self._workloads:
            raise ConfigError(f"unknown workload {name!r}; available: {', '.join(sorted(self._workloads))}")
        return self._workloads[name][0]

    @property
    def workloads(self) -> dict[str, Workload]:
        return {name: w for name, (w, _) in sorted(self._workloads.items())}

    def run_options(self) -> list[RunOption]:
        """Options plugins add to `accelbench run`; a plugin whose hook fails is reported and skipped.
        Collected once: the command line and the preflight check both need them."""
        if self._run_options is not None:
            return list(self._run_options)
        options: list[RunOption] = []
        for impl in self.pm.hook.accelbench_run_options.get_hookimpls():
            try:
                options.extend(impl.function() or [])
            except Exception as exc:
                record = next((r for r in self.records if r.name == impl.plugin_name), None)
                if record is None:
                    raise
                self._fail(record, exc)
        self._run_options = options
        return list(options)

    def versions(self) -> dict[str, str]:
        """Distribution versions of the active plugins, for result records."""
        return {
            r.distribution or r.name: r.version or "unknown" for r in self.records if r.status == "active"
        }


def _unknown_hook_message(name: str) -> str:
    close = difflib.get_close_matches(name, _HOOK_NAMES, n=1)
    suggestion = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown hook {name!r}{suggestion}; see accelbench.hookspecs for the hook names"


def _undecorated_hooks(plugin: object) -> list[str]:
    """Functions named like hooks but missing @hookimpl: pluggy ignores them silently, so say so."""
    out = []
    for attr in dir(plugin):
        if attr.startswith("accelbench_") and callable(getattr(plugin, attr, None)):
            opts = getattr(getattr(plugin, attr), PROJECT + "_impl", None)
            if opts is None:
                out.append(f"{attr} is not decorated with @accelbench.hookimpl and is ignored")
    return out


_HOST: PluginHost | None = None


def get_host() -> PluginHost:
    """The process-wide plugin host, loaded once."""
    global _HOST
    if _HOST is None:
        _HOST = PluginHost()
    return _HOST
