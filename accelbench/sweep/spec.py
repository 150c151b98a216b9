"""Sweep files: reading them (TOML, YAML, the built-in suites), applying a scale and ``--set``, expanding the grids
into points, and each point's RunConfig.

Every point is validated here as `accelbench run` would validate it, so a typo or an impossible combination is
refused before anything runs; the point then runs from that validated configuration (:meth:`Sweep.write_point`).
"""

from __future__ import annotations

import difflib
import itertools
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from accelbench.config import RunConfig, flag_of
from accelbench.contract import RunOption
from accelbench.errors import AccelbenchError
from accelbench.results import POINTS_FOLDER
from accelbench.sweep.options import check_options, option_name
from accelbench.sweep.resources import SlurmResources, check_resources

SUITES_PACKAGE = "accelbench"
SUITES_FOLDER = "suites"
BASE_SCALE = "seed"  # the sizes as written in the file; always available

_TOP_LEVEL = {"description", "repeats", "memory_cap", "run", "grid", "scales", "slurm"}
# A sweep's size, checked before any point is expanded: every point is at least one process that loads torch and
# trains (seconds to hours), so 10,000 points is weeks of a machine, and a larger grid is a typo in an axis (10 axes of
# 10 values are 10^10 points, whose mere listing never ends). Runs per point likewise: compare's noise test needs 4
# steady epochs a point; 1000 repeats is far beyond any use.
MAX_POINTS = 10_000
MAX_REPEATS = 1000
# A sweep file is a page of text: the built-in suites are a few KiB. More than 1 MiB is not one (and /dev/zero never
# ends).
MAX_SWEEP_FILE_BYTES = 2**20
# The largest memory cap: 1 PiB, beyond any host (a cap is an address-space limit; the bound keeps absurd text finite)
MAX_MEMORY_CAP = 2**50
_SCALE_KEYS = {"description", "run", "axes", "memory_cap", "grid"}

Grid = tuple[dict[str, Any], str | None]  # a grid's options (lists are axes) and its largest-fit axis


@dataclass(frozen=True)
class Point:
    """One benchmark configuration of a sweep, as run options keyed by RunConfig field name."""

    options: tuple[tuple[str, Any], ...]
    axes: tuple[str, ...]  # the options that vary in its grid, for display
    series: tuple[Any, ...] | None = None  # a largest-fit search this point belongs to (its other options)

    @property
    def values(self) -> dict[str, Any]:
        return dict(self.options)

    def label(self) -> str:
        shown = self.axes or tuple(k for k, _ in self.options)
        values = self.values
        return " ".join(f"{k}={values[k]}" for k in shown if k in values)


@dataclass
class Sweep:
    """A sweep file resolved for one scale: the points to run, in order."""

    name: str
    description: str
    points: list[Point]
    repeats: int = 1
    memory_cap: int | None = None
    plugin_options: dict[str, RunOption] = field(default_factory=dict)  # workload and backend options by name
    resolve: Callable[[RunConfig], RunConfig] | None = None  # completes workload options (the plugin host's)
    slurm: SlurmResources = field(default_factory=SlurmResources)  # the file's [slurm] table (--submit slurm)

    def config(self, point: Point, output_dir: Path) -> RunConfig:
        """The RunConfig of a point, as `accelbench run` resolves it (the workload's defaults filled in)."""
        values: dict[str, Any] = {"output_dir": output_dir, "workload_options": {}, "backend_options": {}}
        for name, value in point.values.items():
            option = self.plugin_options.get(name)
            if option is None:
                values[name] = value
            else:
                values["workload_options" if option.workload else "backend_options"][name] = value
        config = RunConfig(**values)
        return self.resolve(config) if self.resolve else config

    def argv(self, point: Point, output_dir: Path) -> list[str]:
        """The point as the `accelbench run` command a user would type (shown by --dry-run)."""
        args = ["run"]
        for name, value in point.options:
            option = self.plugin_options.get(name)
            flag = "--" + (option.cli_flag if option else flag_of(name))
            if isinstance(value, bool):
                if value:
                    args.append(flag)
                elif option is not None:  # declared booleans are --x / --no-x
                    args.append("--no-" + flag[2:])
            elif value is not None:
                args += [flag, str(value)]
        return [*args, "--output-dir", str(output_dir), "--quiet"]

    def write_point(self, point: Point, output_dir: Path) -> Path:
        """The point's configuration as JSON for its child ``accelbench run --config`` (what runs is exactly what
        was validated here, not flags parsed again)."""
        folder = output_dir / POINTS_FOLDER
        folder.mkdir(parents=True, exist_ok=True)
        config = self.config(point, output_dir)
        path = folder / f"{self.name}-{abs(hash(point.options)) % 10**12:012d}.json"
        path.write_text(config.model_dump_json(indent=2), encoding="utf-8")
        return path


# --------------------------------------------------------------------------------------------------------------
# Finding and reading sweep files
# --------------------------------------------------------------------------------------------------------------


def builtin_suites() -> dict[str, Path]:
    """Built-in suite name -> file (``accelbench/suites/*.toml``)."""
    folder = resources.files(SUITES_PACKAGE) / SUITES_FOLDER
    return {Path(str(p)).stem: Path(str(p)) for p in folder.iterdir() if str(p).endswith(".toml")}


def resolve_sweep_source(name_or_path: str) -> Path:
    """A sweep file path, or the file of a built-in suite of that name."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    suites = builtin_suites()
    if name_or_path in suites:
        return suites[name_or_path]
    close = difflib.get_close_matches(name_or_path, list(suites), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise AccelbenchError(
        f"{name_or_path!r} is neither a sweep file nor a built-in suite{hint} "
        f"(built-in suites: {', '.join(sorted(suites))}; `accelbench sweep --list` describes them)"
    )


def read_sweep_file(path: Path) -> dict[str, Any]:
    """Parse a TOML (``.toml``) or YAML (``.yaml``/``.yml``) sweep file into plain data."""
    try:
        if not path.is_file():
            raise AccelbenchError(f"{path}: not a regular file (a folder, device or pipe); give a sweep file")
        with open(path, "rb") as fh:
            data = fh.read(MAX_SWEEP_FILE_BYTES + 1)
        if len(data) > MAX_SWEEP_FILE_BYTES:
            raise AccelbenchError(
                f"{path}: more than {MAX_SWEEP_FILE_BYTES // 2**20} MiB, far too large to be a sweep file"
            )
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AccelbenchError(f"{path}: cannot read sweep file: {exc}") from exc
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise AccelbenchError(
                f"{path}: YAML sweep files need PyYAML (pip install 'accelbench[yaml]'), or write the file as TOML"
            ) from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise AccelbenchError(f"{path}: not valid YAML: {exc}") from exc
        except RecursionError:
            raise AccelbenchError(f"{path}: not a sweep file: nested too deeply to read") from None
        except ValueError as exc:  # a number of more digits than Python converts
            raise AccelbenchError(f"{path}: not a sweep file: {str(exc).split(';')[0]}") from None
    else:
        tomllib = _toml()
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise AccelbenchError(f"{path}: not valid TOML: {exc}") from exc
        except RecursionError:
            raise AccelbenchError(f"{path}: not a sweep file: nested too deeply to read") from None
        except ValueError as exc:  # a number of more digits than Python converts
            raise AccelbenchError(f"{path}: not a sweep file: {str(exc).split(';')[0]}") from None
    if not isinstance(data, dict):
        raise AccelbenchError(f"{path}: a sweep file is a table of keys (description, run, grid, ...)")
    return data


def _toml() -> Any:
    """The TOML reader: the standard library's from Python 3.11, the tomli package before."""
    try:
        import tomllib
    except ImportError:
        try:
            import tomli as tomllib  # type: ignore[no-redef,unused-ignore]  # Python 3.10 only
        except ImportError:
            raise AccelbenchError(
                "reading TOML sweep files on Python 3.10 needs the tomli package: pip install tomli"
            ) from None
    return tomllib


# --------------------------------------------------------------------------------------------------------------
# From a sweep file to its points
# --------------------------------------------------------------------------------------------------------------


def load_sweep(
    path: Path,
    scale: str = BASE_SCALE,
    overrides: Mapping[str, Any] | None = None,
    plugin_options: Sequence[RunOption] | None = None,
    output_dir: Path = Path("results"),
    resolve: Callable[[RunConfig], RunConfig] | None = None,
) -> Sweep:
    """Read a sweep file, apply a scale and ``--set`` overrides, expand its grids and check every point.

    Every point is validated as `accelbench run` would validate it, so a typo or an impossible combination is
    refused before anything runs, naming the file and the point. Without ``plugin_options``, the installed
    workloads' and backends' options are used and points are resolved as `run` resolves them (``host.resolve``).
    """
    if plugin_options is None:
        from accelbench.plugins import get_host  # here, not at the top: it may load plugins (and torch)

        host = get_host()
        plugin_options = [*host.run_options(), *host.workload_run_options()]
        resolve = resolve or host.resolve
    data = read_sweep_file(path)
    plugins = {o.name: o for o in plugin_options}  # workload and backend options
    where = str(path)
    _check_keys(data, _TOP_LEVEL, where, "top-level key")

    run = check_options(data.get("run", {}), plugins, f"{where} run table", allow_lists=False)
    grids = _read_grids(data.get("grid", [{}]), plugins, where)
    repeats = data.get("repeats", 1)
    memory_cap = data.get("memory_cap")
    scales = data.get("scales", {})
    if not isinstance(scales, dict):
        raise AccelbenchError(f"{where}: 'scales' must be a table of scale tables, e.g. scales.tiny")
    if scale != BASE_SCALE:
        memory_cap = _apply_scale(scales, scale, run, grids, plugins, where, memory_cap)
    if overrides:
        fixed = check_options(dict(overrides), plugins, "--set", allow_lists=False)
        run.update(fixed)
        for g, _ in grids:  # --set fixes an option everywhere, axes included
            for name in fixed:
                g.pop(name, None)
        grids = [(g, None if fit in fixed else fit) for g, fit in grids]  # a fixed search axis: no search
    if not isinstance(repeats, int) or isinstance(repeats, bool) or not 1 <= repeats <= MAX_REPEATS:
        raise AccelbenchError(
            f"{where}: repeats = {repeats!r}; give a whole number of runs per point, >= 1 (and at most "
            f"{MAX_REPEATS})"
        )
    try:
        cap = parse_memory(memory_cap) if memory_cap is not None else None
    except AccelbenchError as exc:
        raise AccelbenchError(f"{where}: {exc}") from None
    if not data.keys() & {"run", "grid", "scales"} and not overrides:
        raise AccelbenchError(
            f"{path}: defines no runs: give a [run] table of options and/or [[grid]] tables whose lists are the "
            "axes (see `accelbench sweep --help`, or a built-in suite: `accelbench sweep --list`)"
        )

    sweep = Sweep(
        name=path.stem,
        description=str(data.get("description", "")),
        points=[],
        repeats=repeats,
        memory_cap=cap,
        plugin_options=plugins,
        resolve=resolve,
        slurm=check_resources(data.get("slurm", {}), f"{where} [slurm] table"),
    )
    _check_size(run, grids, where)
    seen: set[tuple[tuple[str, Any], ...]] = set()
    for options, fit in grids:
        for point in _expand(run, options, fit):
            if point.options in seen:  # the same point in two grids runs once
                continue
            seen.add(point.options)
            _check_point(sweep, point, output_dir, where)
            sweep.points.append(point)
    if not sweep.points:
        raise AccelbenchError(f"{where}: the grids give no points")
    return sweep


def _read_grids(raw_grids: Any, plugins: Mapping[str, RunOption], where: str) -> list[Grid]:
    """The ``[[grid]]`` tables (or one ``[grid]`` table), each with its largest-fit axis checked."""
    if isinstance(raw_grids, dict):
        raw_grids = [raw_grids]
    if not isinstance(raw_grids, list) or not all(isinstance(g, dict) for g in raw_grids):
        raise AccelbenchError(f"{where}: 'grid' must be a table or an array of tables (one per grid)")
    grids: list[Grid] = []
    for i, raw in enumerate(raw_grids, 1):
        raw = dict(raw)
        fit = raw.pop("largest_fit", None)
        options = check_options(raw, plugins, f"{where} grid {i}", allow_lists=True)
        if fit is not None:
            fit = option_name(str(fit), plugins)
            if not isinstance(options.get(fit), list):
                raise AccelbenchError(
                    f"{where} grid {i}: largest_fit = {fit!r} must name a list axis of that grid, e.g. "
                    'model = ["gpt2", "gpt2-medium", "gpt2-large"]'
                )
        grids.append((options, fit))
    return grids


def _apply_scale(
    scales: Mapping[str, Any],
    scale: str,
    run: dict[str, Any],
    grids: list[Grid],
    plugins: Mapping[str, RunOption],
    where: str,
    memory_cap: Any,
) -> Any:
    """Apply ``scales.<scale>`` to the run options and the grids' axes in place; returns the memory cap. A scale
    with its own ``[[scales.<scale>.grid]]`` tables replaces the grids (where the file's grids are written point by
    point, e.g. a mesh shape with its own batch size, so no axis can be swapped)."""
    if scale not in scales:
        known = ", ".join([BASE_SCALE, *scales])
        raise AccelbenchError(f"--scale {scale!r}: {where} defines no such scale; it has: {known}")
    spec = scales[scale]
    if not isinstance(spec, dict):
        raise AccelbenchError(f"{where}: scales.{scale} must be a table")
    _check_keys(spec, _SCALE_KEYS, f"{where} scales.{scale}", "key")
    run.update(check_options(spec.get("run", {}), plugins, f"{where} scales.{scale}.run", allow_lists=False))
    if "grid" in spec:
        grids[:] = _read_grids(spec["grid"], plugins, f"{where} scales.{scale}")
    axes = check_options(spec.get("axes", {}), plugins, f"{where} scales.{scale}.axes", allow_lists=True)
    for name, value in axes.items():
        present = [g for g, _ in grids if name in g]
        if not present:
            raise AccelbenchError(f"{where} scales.{scale}.axes sets {name!r}, which no grid has")
        for g in present:
            g[name] = value
    return spec.get("memory_cap", memory_cap)


def _check_point(sweep: Sweep, point: Point, output_dir: Path, where: str) -> None:
    """Refuse a point `accelbench run` would refuse, naming the file and the point."""
    try:
        sweep.config(point, output_dir)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {str(e['msg']).removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        raise AccelbenchError(f"{where}: point {point.label()}: {problems}") from None
    except AccelbenchError as exc:  # the workload refused it (a bad option value, a size it lacks)
        raise AccelbenchError(f"{where}: point {point.label()}: {exc}") from None


def _check_keys(table: Mapping[str, Any], allowed: set[str], where: str, what: str) -> None:
    for key in table:
        if key not in allowed:
            close = difflib.get_close_matches(key, sorted(allowed), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; allowed: {', '.join(sorted(allowed))}"
            raise AccelbenchError(f"{where}: unknown {what} {key!r}{hint}")


def _check_size(run: Mapping[str, Any], grids: Sequence[Grid], where: str) -> None:
    """Refuse, before a point is expanded, grids whose axes multiply to more than :data:`MAX_POINTS` points."""
    total = 0
    for i, (grid, _) in enumerate(grids, 1):
        points = 1
        for values in grid.values():
            if isinstance(values, list):
                points *= max(1, len(values))
        total += points
        if total > MAX_POINTS:
            axes = " x ".join(
                f"{name} ({len(values)})" for name, values in grid.items() if isinstance(values, list)
            )
            raise AccelbenchError(
                f"{where}: grid {i}'s axes, {axes}, make {points} points, and a sweep may have at most {MAX_POINTS} "
                "in all (each is a run of its own); split it into smaller sweeps or shorten its axes"
            )


def _expand(run: Mapping[str, Any], grid: Mapping[str, Any], fit: str | None) -> Iterator[Point]:
    """The cartesian product of a grid's axes, the largest-fit axis innermost so a search runs in order."""
    axes = [k for k, v in grid.items() if isinstance(v, list) and k != fit]
    if fit:
        axes.append(fit)
    fixed = {k: v for k, v in grid.items() if not isinstance(v, list)}
    for combo in itertools.product(*(grid[a] for a in axes)):
        values = {**run, **fixed, **dict(zip(axes, combo, strict=True))}
        options = tuple(values.items())
        series = tuple((k, v) for k, v in options if k != fit) if fit else None
        yield Point(options=options, axes=tuple(axes) or tuple(fixed), series=series)


# --------------------------------------------------------------------------------------------------------------
# Values given as text: --set, memory caps
# --------------------------------------------------------------------------------------------------------------

_UNITS = {"": 1, "k": 1000, "kb": 1000, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20}
_UNITS.update({"g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40})


def parse_memory(value: Any) -> int:
    """``"3GiB"``, ``"512 MiB"``, ``"4G"`` or a number of bytes -> bytes."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value > MAX_MEMORY_CAP:
        raise AccelbenchError(
            f"memory cap {value!r}: more than any host has; give a size such as 3GiB or 512MiB"
        )
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(value)[:200])
    if match and match.group(2).lower() in _UNITS:
        amount = float(match.group(1)) * _UNITS[match.group(2).lower()]
        if not amount <= MAX_MEMORY_CAP:  # a number too long to be a float is inf
            raise AccelbenchError(
                f"memory cap {str(value)[:40]!r}: more than any host has; give a size such as 3GiB or 512MiB"
            )
        if int(amount) > 0:
            return int(amount)
    raise AccelbenchError(
        f"memory cap {str(value)[:40]!r}: give a size such as 3GiB, 512MiB or a number of bytes"
    )


def parse_set(items: Sequence[str]) -> dict[str, Any]:
    """``--set key=value`` pairs; values are read as TOML values when they parse (numbers, true/false), else text."""
    tomllib = _toml()
    result: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise AccelbenchError(
                f"--set {item!r}: write it as OPTION=VALUE, e.g. --set precision=bf16-mixed"
            )
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except (
            ValueError
        ):  # not a TOML value (TOMLDecodeError), or a number of more digits than Python converts
            value = raw
        if isinstance(value, (list, dict)):
            raise AccelbenchError(
                f"--set {item!r}: one value only; for several, write a sweep file with a grid"
            )
        result[key.strip()] = value
    return result
