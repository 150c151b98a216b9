"""Plugin host: finds plugins through entry points, isolates broken ones, registers their backends and workloads,
selects the backend.

Discovery and registration go through pluggy (``accelbench.contract.hookspecs``): a plugin's
``accelbench_register_backends`` registers :class:`~accelbench.contract.Backend` subclasses, its
``accelbench_register_workloads`` workloads. The selected backend is then a plain object: the rest of accelbench calls
its methods.
"""

from __future__ import annotations

import difflib
import math
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Literal

import pluggy

from accelbench.config import RunConfig
from accelbench.contract import CONTRACT_VERSION, PROJECT, Backend, BackendInfo, RunOption, hookspecs
from accelbench.contract.options import resolve_options
from accelbench.errors import BackendError, ConfigError, PluginError
from accelbench.workloads import Workload

ENTRY_POINT_GROUP = "accelbench"
STRICT_ENV = "ACCELBENCH_STRICT_PLUGINS"
ONLY_ENV = "ACCELBENCH_PLUGINS"  # comma-separated entry-point names: load only these (plus the core defaults)
DEBUG_ENV = "ACCELBENCH_DEBUG"  # trace every hook call on stderr
CORE_WORKLOADS = "accelbench (core)"  # who registered the core's own workloads

_HOOK_NAMES = sorted(name for name in dir(hookspecs) if name.startswith("accelbench_"))


# the vendor plugins this project ships (backend name -> distribution), for the hint when one is asked for but absent
FIRST_PARTY_PLUGINS = {
    "cuda": "accelbench-cuda",
    "rocm": "accelbench-rocm",
    "xpu": "accelbench-xpu",
    "ipu": "accelbench-ipu",
    "gaudi": "accelbench-gaudi",
    "xla": "accelbench-xla",
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
    backends: list[BackendInfo] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    contract: str | None = None
    overrides: dict[str, list[str]] = field(
        default_factory=dict
    )  # backend name -> Backend methods it overrides

    @property
    def backend(self) -> BackendInfo | None:
        """The plugin's (first) backend; None for a workload-only plugin."""
        return self.backends[0] if self.backends else None

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
            "backends": [b.model_dump() for b in self.backends],
            "overrides": self.overrides,
            "warnings": self.warnings,
        }


class PluginHost:
    """Loads plugins once and hands out backends and workloads."""

    def __init__(self, strict: bool | None = None) -> None:
        self.strict = os.environ.get(STRICT_ENV, "") not in ("", "0") if strict is None else strict
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.debug = os.environ.get(DEBUG_ENV, "") not in ("", "0")
        if self.debug:
            self.pm.trace.root.setwriter(sys.stderr.write)
            self.pm.enable_tracing()
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
        """Every active plugin's ``accelbench_register_backends``: one instance of each Backend subclass."""
        for record, plugin in list(self._active()):
            classes: list[type[Backend]] = []
            try:
                self._only("accelbench_register_backends", plugin)(register=classes.append)
                made = [self._instantiate(cls) for cls in classes]
                for backend in made:
                    if backend.name in self._backends:
                        owner = next(
                            r for r in self.records if any(b.name == backend.name for b in r.backends)
                        )
                        raise PluginError(
                            f"backend name {backend.name!r} is already provided by distribution "
                            f"{owner.distribution} (plugin {owner.name!r}); uninstall one of the two"
                        )
            except Exception as exc:
                self.pm.unregister(plugin)
                self._fail(record, exc)
                continue
            for backend in made:
                if self.debug:
                    trace_calls(backend)
                self._backends[backend.name] = backend
                record.backends.append(backend.info)
                record.overrides[backend.name] = overridden_methods(type(backend))

    @staticmethod
    def _instantiate(cls: object) -> Backend:
        if not (isinstance(cls, type) and issubclass(cls, Backend)):
            raise PluginError(
                f"accelbench_register_backends registered {cls!r}, not a subclass of accelbench.contract.Backend"
            )
        info = getattr(cls, "info", None)
        if not isinstance(info, BackendInfo):
            raise PluginError(f"backend class {cls.__name__} sets no info = BackendInfo(...)")
        return cls()

    def _collect_workloads(self) -> None:
        from accelbench.workloads import register_all

        owners: list[tuple[str, object | None, PluginRecord | None]] = [(CORE_WORKLOADS, None, None)]
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
                if plugin is None:
                    register_all(register)  # the core's own workloads must register
                else:
                    self._only("accelbench_register_workloads", plugin)(register=register)
            except Exception as exc:
                if record is None:
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
        """Options the backends add to `accelbench run`; a backend whose method fails is reported and skipped.
        Collected once: the command line and the preflight check both need them."""
        if self._run_options is None:
            options: list[RunOption] = []
            for backend in list(self._backends.values()):
                try:
                    options.extend(backend.run_options())
                except Exception as exc:
                    self._fail(self._record_of(backend), exc)
            self._run_options = options
        return list(self._run_options)

    def _record_of(self, backend: Backend) -> PluginRecord:
        return next(r for r in self.records if any(b.name == backend.name for b in r.backends))

    def distribution_of(self, backend: Backend) -> PluginRecord:
        """The plugin record (distribution, version) that registered ``backend``."""
        return self._record_of(backend)

    def workload_run_options(self) -> list[RunOption]:
        """Every registered workload's options (one ``--flag`` may serve several workloads)."""
        return [option for workload in self.workloads.values() for option in workload.options()]

    def recorded_environment(self) -> list[str]:
        """Environment variable names (or ``PREFIX*``) the installed plugins want recorded."""
        names: list[str] = []
        for backend in self._backends.values():
            names.extend(n for n in backend.recorded_environment() if n not in names)
        return names

    def resolve(self, config: RunConfig) -> RunConfig:
        """``config`` with its workload's options checked and completed with their defaults (what the record
        keeps), its size defaulted to the workload's first size name when ``--model`` was not given, the batch
        checked against ``--grad-accum``, the workload's own checks passed, and ``--target NAME`` resolved to the
        validation loss it names (``target_loss``). Raises ConfigError naming the option."""
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
        if (
            resolved.target is not None
        ):  # --target NAME: the loss it names for this model, now that it is known
            resolved = resolved.model_copy(update={"target_loss": named_target(resolved)})
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


PORTING = "docs/writing-a-backend-plugin.md, 'Porting a 2.x plugin'"


def check_contract(plugin: object) -> str:
    """The contract version ``plugin`` declares, if this accelbench can load it; PluginError saying why not."""
    declared = getattr(plugin, "accelbench_contract", None)
    mine = tuple(int(p) for p in CONTRACT_VERSION.split("."))
    if declared is None:
        raise PluginError(
            f"written for plugin contract 1 (it declares no accelbench_contract); this accelbench implements "
            f"contract {CONTRACT_VERSION}: upgrade the plugin ({PORTING})"
        )
    try:
        major, minor = (int(p) for p in str(declared).split("."))
    except ValueError:
        raise PluginError(f"accelbench_contract = {declared!r} is not a MAJOR.MINOR version") from None
    if major != mine[0] or minor > mine[1]:
        if (major, minor) > mine:
            todo = "upgrade accelbench"
        elif major == 2:
            todo = (
                "upgrade the plugin: in 3.0 a backend is a subclass of accelbench.contract.Backend registered "
                f"through accelbench_register_backends, its hooks become methods ({PORTING})"
            )
        else:
            todo = f"upgrade the plugin ({PORTING})"
        raise PluginError(
            f"written for plugin contract {declared}; this accelbench implements contract {CONTRACT_VERSION}: {todo}"
        )
    return str(declared)


def trace_calls(backend: Backend) -> None:
    """``ACCELBENCH_DEBUG=1``: every call of ``backend``'s contract methods written to stderr with its arguments
    and answer, as pluggy traces the registration hooks."""
    import functools

    for name in dir(Backend):
        if name.startswith("_") or not callable(getattr(Backend, name, None)):
            continue
        method = getattr(backend, name)

        def traced(*args: Any, __name: str = name, __method: Any = method, **kwargs: Any) -> Any:
            shown = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
            answer = __method(*args, **kwargs)
            sys.stderr.write(f"accelbench: {backend.name}.{__name}({shown}) -> {answer!r}\n"[:1000])
            return answer

        setattr(backend, name, functools.wraps(method)(traced))


def overridden_methods(cls: type[Backend]) -> list[str]:
    """The public methods of ``cls`` that differ from :class:`Backend`'s stock ones (what `plugins` shows)."""
    out = []
    for name in dir(Backend):
        if name.startswith("_") or not callable(getattr(Backend, name, None)):
            continue
        if getattr(cls, name, None) is not getattr(Backend, name):
            out.append(name)
    return out


def _unknown_hook_message(name: str) -> str:
    close = difflib.get_close_matches(name, _HOOK_NAMES, n=1)
    suggestion = f" (did you mean {close[0]!r}?)" if close else ""
    moved = (
        f"; in contract 3.0 {name.removeprefix('accelbench_')} is a method of accelbench.contract.Backend"
        if not close and name.startswith("accelbench_")
        else ""
    )
    return f"unknown hook {name!r}{suggestion}{moved}; see accelbench.contract.hookspecs for the hook names"


_HOST: PluginHost | None = None


def get_host() -> PluginHost:
    """The process-wide plugin host, loaded once."""
    global _HOST
    if _HOST is None:
        _HOST = PluginHost()
    return _HOST


def named_target(config: RunConfig) -> float:
    """The validation loss ``--target NAME`` names for the run's model (:func:`accelbench.references.resolve_target`);
    a record repeated with ``--config`` carries the loss too, which must agree with it."""
    from accelbench.references import resolve_target

    assert config.target is not None
    try:
        loss = resolve_target(config.model, config.target)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if config.target_loss is not None and not math.isclose(config.target_loss, loss, rel_tol=1e-9):
        raise ConfigError(
            f"--target {config.target} is a validation loss of {loss:.4f} for {config.model}, but --target-loss "
            f"{config.target_loss:g} was given too; give one of them"
        )
    return loss
