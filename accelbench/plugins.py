"""Plugin host: finds plugins through entry points, isolates broken ones, selects the backend.

The rest of accelbench talks to plugins only through :class:`PluginHost` and :class:`Backend`, never through
``pm.hook`` directly, so every hook call site is typed and in one place, and every call goes through pluggy's
public API (``subset_hook_caller``), so ``ACCELBENCH_DEBUG=1`` traces them all.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

import pluggy

from accelbench import CONTRACT_VERSION, PROJECT, hookspecs
from accelbench.config import RunConfig, RunOption, resolve_options
from accelbench.devices import NO_COLLECTIVE, BackendInfo, DeviceInfo, EpochReadings, PeakFigures
from accelbench.errors import BackendError, ConfigError, PluginError
from accelbench.workloads import Workload

if TYPE_CHECKING:
    import torch

    from accelbench.engine.executor import Executor, ExecutorRequest
    from accelbench.precision import PrecisionPlan

T = TypeVar("T")

ENTRY_POINT_GROUP = "accelbench"
STRICT_ENV = "ACCELBENCH_STRICT_PLUGINS"
ONLY_ENV = "ACCELBENCH_PLUGINS"  # comma-separated entry-point names: load only these (plus the core defaults)
DEBUG_ENV = "ACCELBENCH_DEBUG"  # trace every hook call on stderr
DEFAULTS_MODULE = (
    "accelbench.backends.defaults"  # the core's stock-PyTorch answers, loaded by name like a plugin
)
DEFAULTS_NAME = "accelbench.defaults"

_HOOK_NAMES = sorted(name for name in dir(hookspecs) if name.startswith("accelbench_"))


# the vendor plugins this project ships (backend name -> distribution), for the hint when one is asked for but absent
FIRST_PARTY_PLUGINS = {
    "cuda": "accelbench-cuda",
    "rocm": "accelbench-rocm",
    "xpu": "accelbench-xpu",
    "ipu": "accelbench-ipu",
}


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
    contract: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "status": self.status,
            "error": self.error,
            "contract": self.contract,
            "hooks": self.hooks,
            "backend": self.backend.model_dump() if self.backend else None,
            "warnings": self.warnings,
        }


class Backend:
    """Typed access to one backend's hooks: the selected plugin's implementation, else the core default."""

    def __init__(self, pm: pluggy.PluginManager, info: BackendInfo, plugin: object, defaults: object) -> None:
        self.info = info
        self.name = info.name
        self.plugin = plugin
        self._pm = pm
        self._defaults = defaults
        self._callers: dict[str, tuple[pluggy.HookCaller, pluggy.HookCaller]] = {}
        self._devices: list[DeviceInfo] | None = None
        self.detect_error: str | None = None

    def _pair(self, hook: str) -> tuple[pluggy.HookCaller, pluggy.HookCaller]:
        """(this plugin's caller, the defaults' caller) for ``hook``: every other plugin removed from each."""
        pair = self._callers.get(hook)
        if pair is None:
            plugins = self._pm.get_plugins()
            mine = self._pm.subset_hook_caller(hook, [p for p in plugins if p is not self.plugin])
            default = self._pm.subset_hook_caller(hook, [p for p in plugins if p is not self._defaults])
            pair = self._callers[hook] = (mine, default)
        return pair

    def _ask(self, hook: str, **kwargs: Any) -> Any:
        """A first-result hook: the plugin's answer, or the default's where it has none (or returns None)."""
        mine, default = self._pair(hook)
        answer = mine(**kwargs) if mine.get_hookimpls() else None
        if answer is None and default.get_hookimpls():
            answer = default(**kwargs)
        return answer

    def _act(self, hook: str, **kwargs: Any) -> None:
        """An action hook: the plugin's implementation replaces the default."""
        mine, default = self._pair(hook)
        (mine if mine.get_hookimpls() else default)(**kwargs)

    def _typed(self, hook: str, answer: object, kind: type[T]) -> T:
        """A plugin's answer, checked against the contract's return type (a wrong type is the plugin's bug)."""
        if not isinstance(answer, kind):
            raise BackendError(
                f"backend {self.name!r}: {hook} returned {type(answer).__name__}, not {kind.__name__} "
                "(see accelbench.hookspecs)"
            )
        return answer

    def implements(self, hook: str) -> bool:
        return bool(self._pair(hook)[0].get_hookimpls())

    # detection ------------------------------------------------------------------------------------------
    def detect(self) -> list[DeviceInfo]:
        """Devices present; [] when none or when detection itself failed (the failure is kept in ``detect_error``).

        Detected once per Backend: backend selection, preflight and the record all ask, and a probe may cost a
        subprocess.
        """
        if self._devices is None:
            try:
                self._devices = list(self._ask("accelbench_detect_devices") or [])
            except Exception as exc:  # detection must never break a command
                self.detect_error = f"{type(exc).__name__}: {exc}"
                self._devices = []
        return list(self._devices)

    def runtime_versions(self) -> dict[str, str]:
        return dict(self._ask("accelbench_runtime_versions") or {})

    # device setup / collectives -------------------------------------------------------------------------
    def setup_device(self, local_rank: int) -> torch.device:
        import torch

        hook = "accelbench_setup_device"
        answer = self._ask(hook, device_type=self.info.device_type, local_rank=local_rank)
        return self._typed(hook, answer, torch.device)

    def collective_backend(self, device: torch.device) -> str | None:
        """The torch.distributed backend name, or None where the backend replicates without torch.distributed."""
        answer = self._ask("accelbench_collective_backend", device=device)
        return None if answer is NO_COLLECTIVE else str(answer)

    # precision --------------------------------------------------------------------------------------------
    def supported_precisions(self, device: torch.device) -> list[str]:
        return list(self._ask("accelbench_supported_precisions", device=device))

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
        from accelbench.precision import PrecisionPlan

        self.check_precision(precision, device)
        hook = "accelbench_precision_plan"
        answer = self._ask(hook, precision=precision, device=device, options=dict(options or {}))
        return self._typed(hook, answer, PrecisionPlan)

    # strategies -------------------------------------------------------------------------------------------
    def supported_strategies(self) -> list[str]:
        return list(self._ask("accelbench_supported_strategies"))

    def executor(self, request: ExecutorRequest) -> Executor:
        self.check_strategy(request.strategy)
        executor = self._ask("accelbench_executor", request=request)
        if executor is None:
            raise BackendError(
                f"backend {self.name!r} declared strategy {request.strategy!r} but built no executor"
            )
        return cast("Executor", executor)  # its type is the engine's: the host imports no engine code

    def check_strategy(self, strategy: str) -> None:
        supported = self.supported_strategies()
        if strategy not in supported:
            raise ConfigError(
                f"backend {self.name!r} does not support strategy {strategy!r}; it supports: {', '.join(supported)}"
            )

    # timing / epochs / memory / peaks ---------------------------------------------------------------------
    def synchronize(self, device: torch.device) -> None:
        self._act("accelbench_synchronize", device=device)

    def epoch_start(self, device: torch.device) -> None:
        self._act("accelbench_epoch_start", device=device)

    def epoch_end(self, device: torch.device) -> EpochReadings:
        return self._typed(
            "accelbench_epoch_end", self._ask("accelbench_epoch_end", device=device), EpochReadings
        )

    def release_memory(self, device: torch.device) -> None:
        self._act("accelbench_release_memory", device=device)

    def peak_figures(self, device: DeviceInfo, precision: PrecisionPlan) -> PeakFigures | None:
        answer = self._ask("accelbench_peak_figures", device=device, precision=precision)
        return None if answer is None else self._typed("accelbench_peak_figures", answer, PeakFigures)

    def known_devices(self) -> list[DeviceInfo]:
        """The devices this backend's peak table knows (``accelbench_known_devices``), [] without a catalogue."""
        answer = self._ask("accelbench_known_devices")
        if answer is None:
            return []
        devices = self._typed("accelbench_known_devices", answer, list)
        return [self._typed("accelbench_known_devices", d, DeviceInfo) for d in devices]


class PluginHost:
    """Loads plugins once and hands out backends and workloads."""

    def __init__(self, strict: bool | None = None) -> None:
        self.strict = os.environ.get(STRICT_ENV, "") not in ("", "0") if strict is None else strict
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(hookspecs)
        if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            self.pm.trace.root.setwriter(sys.stderr.write)
            self.pm.enable_tracing()
        self.defaults = importlib.import_module(DEFAULTS_MODULE)
        self.pm.register(self.defaults, name=DEFAULTS_NAME)
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
                plugin = self._register(ep, record)
            except Exception as exc:
                self._fail(record, exc)
                continue
            record.hooks = sorted(c.name for c in self.pm.get_hookcallers(plugin) or [])
            record.warnings = self._undecorated_hooks(plugin)
            self._plugin_of[ep.name] = plugin

    def _register(self, ep: EntryPoint, record: PluginRecord) -> object:
        plugin = ep.load()
        if isinstance(plugin, type):  # a class: one instance holds the plugin's state
            plugin = plugin()
        record.contract = check_contract(plugin)
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

    def _only(self, hook: str, plugin: object) -> pluggy.HookCaller:
        """A caller of ``hook`` on ``plugin`` alone."""
        return self.pm.subset_hook_caller(hook, [p for p in self.pm.get_plugins() if p is not plugin])

    def _active(self) -> Iterable[tuple[PluginRecord, object]]:
        for record in self.records:
            plugin = self._plugin_of.get(record.name)
            if record.status == "active" and plugin is not None:
                yield record, plugin

    def _collect_backends(self) -> None:
        found: dict[str, tuple[BackendInfo, object]] = {}
        for record, plugin in list(self._active()):
            try:
                answers = [a for a in self._only("accelbench_backend", plugin)() if a is not None]
                if not answers:
                    continue
                info = answers[0]
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
        for name, (info, plugin) in found.items():
            self._backends[name] = Backend(self.pm, info, plugin, self.defaults)

    def _collect_workloads(self) -> None:
        owners: list[tuple[str, object, PluginRecord | None]] = [(DEFAULTS_NAME, self.defaults, None)]
        owners += [(record.name, plugin, record) for record, plugin in self._active()]
        for owner, plugin, record in owners:

            def register(workload: Workload, owner: str = owner) -> None:
                if workload.name in self._workloads:
                    raise PluginError(
                        f"workload {workload.name!r} registered by both {self._workloads[workload.name][1]!r} "
                        f"and {owner!r}"
                    )
                self._workloads[workload.name] = (workload, owner)

            try:
                self._only("accelbench_register_workloads", plugin)(register=register)
            except Exception as exc:
                if record is None:  # the core's own workloads must register
                    raise
                self._fail(record, exc)

    def _undecorated_hooks(self, plugin: object) -> list[str]:
        """Functions named like hooks but missing @hookimpl: pluggy ignores them silently, so say so."""
        out = []
        for attr in dir(plugin):
            hook_like = attr.startswith("accelbench_") and callable(getattr(plugin, attr, None))
            if hook_like and self.pm.parse_hookimpl_opts(plugin, attr) is None:
                out.append(f"{attr} is not decorated with @accelbench.hookimpl and is ignored")
        return out

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
                elif name in FIRST_PARTY_PLUGINS:
                    hint = (
                        f" (its plugin is not installed: pip install {FIRST_PARTY_PLUGINS[name]}, or from a checkout "
                        f"pip install ./plugins/{name})"
                    )
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
        """Options backend plugins add to `accelbench run`; a plugin whose hook fails is reported and skipped.
        Collected once: the command line and the preflight check both need them."""
        if self._run_options is None:
            options: list[RunOption] = []
            for record, plugin in list(self._active()):
                try:
                    for answer in self._only("accelbench_run_options", plugin)():
                        options.extend(answer or [])
                except Exception as exc:
                    self._fail(record, exc)
            self._run_options = options
        return list(self._run_options)

    def workload_run_options(self) -> list[RunOption]:
        """Every registered workload's options (one ``--flag`` may serve several workloads)."""
        return [option for workload in self.workloads.values() for option in workload.options()]

    def recorded_environment(self) -> list[str]:
        """Environment variable names (or ``PREFIX*``) the installed plugins want recorded."""
        names: list[str] = []
        for _, plugin in self._active():
            for answer in self._only("accelbench_recorded_environment", plugin)():
                names.extend(n for n in answer or [] if n not in names)
        return names

    def resolve(self, config: RunConfig) -> RunConfig:
        """``config`` with its workload's options checked and completed with their defaults (what the record
        keeps), its size defaulted to the workload's first size name when ``--model`` was not given, the batch
        checked against ``--grad-accum``, and the workload's own checks passed. Raises ConfigError naming the
        option."""
        workload = self.workload(config.workload)
        if "model" not in config.model_fields_set and config.model not in workload.model_names():
            # no --model given: the workload's own default size (the first it names), not the GPT's gpt-nano
            config = config.model_copy(update={"model": workload.model_names()[0]})
        if config.batch_size % config.grad_accum:
            lower = config.batch_size // config.grad_accum * config.grad_accum
            fits = " or ".join(str(b) for b in (lower, lower + config.grad_accum) if b > 0)
            raise ConfigError(
                f"--batch-size {config.batch_size} is not divisible by --grad-accum {config.grad_accum}: each batch "
                f"is split into {config.grad_accum} equal micro-batches; use a batch size of {fits}"
            )
        if config.model not in workload.model_names():
            raise ConfigError(
                f"unknown model {config.model!r} for workload {workload.name!r}; "
                f"choose one of: {', '.join(workload.model_names())}"
            )
        options = resolve_options(config.workload_options, workload.options(), workload.name, "workload")
        resolved = config.model_copy(update={"workload_options": options})
        workload.check(resolved)
        return resolved

    def check_backend_options(self, config: RunConfig, backend: Backend) -> RunConfig:
        """The given backend options checked against what ``backend`` declares (only the given ones are kept:
        the plugin applies and records its defaults)."""
        declared = {o.name: o for o in self.run_options()}
        checked: dict[str, str | int | float | bool] = {}
        for name, value in config.backend_options.items():
            option = declared.get(name)
            if option is not None and option.backend != backend.name:
                raise ConfigError(
                    f"--{option.cli_flag} is an option of backend {option.backend!r}, not of {backend.name!r}; "
                    f"drop it or add --backend {option.backend}"
                )
            if option is None:
                resolve_options({name: value}, [o for o in declared.values() if o.backend == backend.name],
                                backend.name, "backend")  # fmt: skip
            else:
                checked[name] = option.check(value)
        return config.model_copy(update={"backend_options": checked})

    def versions(self) -> dict[str, str]:
        """Distribution versions of the active plugins, for result records."""
        return {
            r.distribution or r.name: r.version or "unknown" for r in self.records if r.status == "active"
        }


def check_contract(plugin: object) -> str:
    """The contract version ``plugin`` declares, if this accelbench can load it; PluginError saying why not."""
    declared = getattr(plugin, "accelbench_contract", None)
    mine = tuple(int(p) for p in CONTRACT_VERSION.split("."))
    if declared is None:
        raise PluginError(
            f"written for plugin contract 1 (it declares no accelbench_contract); this accelbench implements "
            f"contract {CONTRACT_VERSION}: upgrade the plugin"
        )
    try:
        major, minor = (int(p) for p in str(declared).split("."))
    except ValueError:
        raise PluginError(f"accelbench_contract = {declared!r} is not a MAJOR.MINOR version") from None
    if major != mine[0] or minor > mine[1]:
        upgrade = "accelbench" if (major, minor) > mine else "the plugin"
        raise PluginError(
            f"written for plugin contract {declared}; this accelbench implements contract {CONTRACT_VERSION}: "
            f"upgrade {upgrade}"
        )
    return str(declared)


def _unknown_hook_message(name: str) -> str:
    close = difflib.get_close_matches(name, _HOOK_NAMES, n=1)
    suggestion = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown hook {name!r}{suggestion}; see accelbench.hookspecs for the hook names"


_HOST: PluginHost | None = None


def get_host() -> PluginHost:
    """The process-wide plugin host, loaded once."""
    global _HOST
    if _HOST is None:
        _HOST = PluginHost()
    return _HOST
