"""`accelbench sweep`: run a grid of benchmark points, each in its own process, resumably.

A sweep file (TOML or YAML) names run options for every point and one or more grids over them::

    description = "gpt2 and gpt2-medium in three precisions"
    repeats = 1                      # runs per point (more give compare a noise estimate)
    [run]                            # options of every point (the names of `accelbench run` flags)
    epochs = 2
    [[grid]]                         # a list is an axis; a scalar fixes the option for this grid
    model = ["gpt2", "gpt2-medium"]
    precision = ["fp16-mixed", "bf16-mixed", "fp32"]
    batch_size = [64, 128]
    [[grid]]
    model = ["gpt2", "gpt2-large", "gpt2-xl"]
    batch_size = 1
    largest_fit = "model"            # walk this axis in order; stop after the first point that runs out of memory
    [scales.tiny]                    # `--scale tiny`: the same experiment, small enough for a laptop CPU
    run = { steps_per_epoch = 4 }
    axes = { model = ["gpt-nano", "gpt-micro"] }
    memory_cap = "4GiB"

Every point runs as ``python -m accelbench.cli run ...`` in a child process (its own session, so a terminal's
Ctrl-C reaches only the sweep, which forwards it once), so a crash, an out-of-memory or a hard kill of one point
never ends the sweep. Result records are the source of truth: a point is done when the output folder holds an
``ok`` record of its configuration (``repeats`` of them) or an ``oom`` record; re-running the sweep skips done
points and retries the rest. Each attempt is also appended to ``accelbench-sweep.log.jsonl`` there, which is
where refused points and crashes (no record) are described.
"""

from __future__ import annotations

import argparse
import difflib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from accelbench.config import RunConfig, RunOption
from accelbench.errors import AccelbenchError, ResultFileError

SWEEP_LOG = "accelbench-sweep.log.jsonl"
SUITES_PACKAGE = "accelbench"
SUITES_FOLDER = "suites"
BASE_SCALE = "seed"  # the sizes as written in the file; always available

# `accelbench run` exit codes (accelbench.cli)
EXIT_OK, EXIT_ERROR, EXIT_REFUSED, EXIT_OOM, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
INTERRUPT_GRACE_S = 60.0  # how long an interrupted point may take to write its record before it is killed

# flag spellings of `accelbench run` that differ from RunConfig field names
_FIELD_OF = {"layers": "n_layer", "heads": "n_head", "embd": "n_embd", "lr": "learning_rate"}
_FLAG_OF = {field: flag for flag, field in _FIELD_OF.items()}
# fields the sweep itself owns
_OWNED = {"output_dir"}
# fields that say how a run was launched, not what it measured: a record matches a point whatever they were
_NOT_IDENTITY = {"output_dir", "backend_options", "node_rank", "rdzv_endpoint", "collective_timeout"}
_TOP_LEVEL = {"description", "repeats", "memory_cap", "run", "grid", "scales"}
_SCALE_KEYS = {"description", "run", "axes", "memory_cap"}


# --------------------------------------------------------------------------------------------------------------
# Sweep files
# --------------------------------------------------------------------------------------------------------------


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
    plugin_options: dict[str, RunOption] = field(default_factory=dict)

    def config(self, point: Point, output_dir: Path) -> RunConfig:
        """The RunConfig `accelbench run` builds from this point's flags (defaults filled in)."""
        core, plugin = _split_options(point.values, self.plugin_options)
        return RunConfig(**core, backend_options=plugin, output_dir=output_dir)

    def argv(self, point: Point, output_dir: Path) -> list[str]:
        """The `accelbench run` arguments of a point."""
        args = ["run"]
        for name, value in point.options:
            flag = "--" + _FLAG_OF.get(name, name).replace("_", "-")
            if isinstance(value, bool):
                if value:
                    args.append(flag)
                elif name in self.plugin_options:  # plugin booleans are --x / --no-x
                    args.append("--no-" + flag[2:])
            elif value is not None:
                args += [flag, str(value)]
        return [*args, "--output-dir", str(output_dir), "--quiet"]


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
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AccelbenchError(f"{path}: cannot read sweep file: {exc}") from exc
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise AccelbenchError(
                f"{path}: YAML sweep files need PyYAML (pip install pyyaml), or write the file as TOML"
            ) from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise AccelbenchError(f"{path}: not valid YAML: {exc}") from exc
    else:
        tomllib = _toml()
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise AccelbenchError(f"{path}: not valid TOML: {exc}") from exc
    if not isinstance(data, dict):
        raise AccelbenchError(f"{path}: a sweep file is a table of keys (description, run, grid, ...)")
    return data


def _toml() -> Any:
    """The TOML reader: the standard library's from Python 3.11, the tomli package before."""
    try:
        import tomllib
    except ImportError:
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError:
            raise AccelbenchError(
                "reading TOML sweep files on Python 3.10 needs the tomli package: pip install tomli"
            ) from None
    return tomllib


def load_sweep(
    path: Path,
    scale: str = BASE_SCALE,
    overrides: Mapping[str, Any] | None = None,
    plugin_options: Sequence[RunOption] = (),
    output_dir: Path = Path("results"),
) -> Sweep:
    """Read a sweep file, apply a scale and ``--set`` overrides, expand its grids and check every point.

    Every point is validated as `accelbench run` would validate it, so a typo or an impossible combination is
    refused before anything runs, naming the file and the point.
    """
    data = read_sweep_file(path)
    plugins = {o.name.replace("-", "_"): o for o in plugin_options}
    where = str(path)
    _check_keys(data, _TOP_LEVEL, where, "top-level key")

    run = _options(data.get("run", {}), plugins, f"{where} run table", allow_lists=False)
    grids_raw = data.get("grid", [{}])
    if isinstance(grids_raw, dict):
        grids_raw = [grids_raw]
    if not isinstance(grids_raw, list) or not all(isinstance(g, dict) for g in grids_raw):
        raise AccelbenchError(f"{where}: 'grid' must be a table or an array of tables (one per grid)")
    grids = []
    for i, raw in enumerate(grids_raw, 1):
        raw = dict(raw)
        fit = raw.pop("largest_fit", None)
        options = _options(raw, plugins, f"{where} grid {i}", allow_lists=True)
        if fit is not None:
            fit = _normalise(str(fit))
            if not isinstance(options.get(fit), list):
                raise AccelbenchError(
                    f"{where} grid {i}: largest_fit = {fit!r} must name a list axis of that grid, e.g. "
                    'model = ["gpt2", "gpt2-medium", "gpt2-large"]'
                )
        grids.append((options, fit))

    repeats = data.get("repeats", 1)
    memory_cap = data.get("memory_cap")
    scales = data.get("scales", {})
    if not isinstance(scales, dict):
        raise AccelbenchError(f"{where}: 'scales' must be a table of scale tables, e.g. scales.tiny")
    if scale != BASE_SCALE:
        if scale not in scales:
            known = ", ".join([BASE_SCALE, *scales])
            raise AccelbenchError(f"--scale {scale!r}: {where} defines no such scale; it has: {known}")
        spec = scales[scale]
        if not isinstance(spec, dict):
            raise AccelbenchError(f"{where}: scales.{scale} must be a table")
        _check_keys(spec, _SCALE_KEYS, f"{where} scales.{scale}", "key")
        run.update(_options(spec.get("run", {}), plugins, f"{where} scales.{scale}.run", allow_lists=False))
        axes = _options(spec.get("axes", {}), plugins, f"{where} scales.{scale}.axes", allow_lists=True)
        for name, value in axes.items():
            present = [g for g, _ in grids if name in g]
            if not present:
                raise AccelbenchError(f"{where} scales.{scale}.axes sets {name!r}, which no grid has")
            for g in present:
                g[name] = value
        memory_cap = spec.get("memory_cap", memory_cap)

    if overrides:
        fixed = _options(dict(overrides), plugins, "--set", allow_lists=False)
        run.update(fixed)
        for g, _ in grids:  # --set fixes an option everywhere, axes included
            for name in fixed:
                g.pop(name, None)
    if not isinstance(repeats, int) or repeats < 1:
        raise AccelbenchError(f"{where}: repeats = {repeats!r}; give a whole number of runs per point, >= 1")

    try:
        cap = parse_memory(memory_cap) if memory_cap is not None else None
    except AccelbenchError as exc:
        raise AccelbenchError(f"{where}: {exc}") from None
    sweep = Sweep(
        name=path.stem,
        description=str(data.get("description", "")),
        points=[],
        repeats=repeats,
        memory_cap=cap,
        plugin_options=plugins,
    )
    seen: set[tuple[tuple[str, Any], ...]] = set()
    for options, fit in grids:
        for point in _expand(run, options, fit):
            if point.options in seen:  # the same point in two grids runs once
                continue
            seen.add(point.options)
            try:
                sweep.config(point, output_dir)
            except ValidationError as exc:
                problems = "; ".join(
                    f"{'.'.join(str(p) for p in e['loc'])}: {str(e['msg']).removeprefix('Value error, ')}"
                    for e in exc.errors()
                )
                raise AccelbenchError(f"{where}: point {point.label()}: {problems}") from None
            sweep.points.append(point)
    if not sweep.points:
        raise AccelbenchError(f"{where}: the grids give no points")
    return sweep


def _check_keys(table: Mapping[str, Any], allowed: set[str], where: str, what: str) -> None:
    for key in table:
        if key not in allowed:
            close = difflib.get_close_matches(key, sorted(allowed), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; allowed: {', '.join(sorted(allowed))}"
            raise AccelbenchError(f"{where}: unknown {what} {key!r}{hint}")


def _normalise(name: str) -> str:
    name = name.replace("-", "_")
    return _FIELD_OF.get(name, name)


def _options(table: Any, plugins: Mapping[str, RunOption], where: str, allow_lists: bool) -> dict[str, Any]:
    """Check a table of run options: known names (RunConfig fields or plugin options), lists only on axes."""
    if not isinstance(table, dict):
        raise AccelbenchError(f"{where}: expected a table of run options, got {table!r}")
    fields = set(RunConfig.model_fields) - {"backend_options"}
    known = sorted((fields - _OWNED) | set(plugins) | set(_FIELD_OF))
    options: dict[str, Any] = {}
    for key, value in table.items():
        name = _normalise(str(key))
        if name in _OWNED:
            raise AccelbenchError(
                f"{where}: {key!r} is set by the sweep (--output-dir); remove it from the file"
            )
        if name not in fields and name not in plugins:
            close = difflib.get_close_matches(str(key).replace("-", "_"), known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise AccelbenchError(f"{where}: unknown run option {key!r}{hint} (see `accelbench run --help`)")
        if isinstance(value, list):
            if not allow_lists:
                raise AccelbenchError(
                    f"{where}: {key} = {value!r}: a list is an axis; put it in a grid table"
                )
            if not value:
                raise AccelbenchError(f"{where}: axis {key!r} is empty; give at least one value")
        elif isinstance(value, dict):
            raise AccelbenchError(f"{where}: {key!r} must be a value or a list of values, not a table")
        options[name] = value
    return options


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


_UNITS = {"": 1, "k": 1000, "kb": 1000, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20}
_UNITS.update({"g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40})


def parse_memory(value: Any) -> int:
    """``"3GiB"``, ``"512 MiB"``, ``"4G"`` or a number of bytes -> bytes."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(value))
    if match and match.group(2).lower() in _UNITS:
        amount = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
        if amount > 0:
            return amount
    raise AccelbenchError(f"memory cap {value!r}: give a size such as 3GiB, 512MiB or a number of bytes")


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
        except tomllib.TOMLDecodeError:
            value = raw
        if isinstance(value, (list, dict)):
            raise AccelbenchError(
                f"--set {item!r}: one value only; for several, write a sweep file with a grid"
            )
        result[key.strip()] = value
    return result


def _split_options(values: Mapping[str, Any], plugins: Mapping[str, RunOption]) -> tuple[dict, dict]:
    core = {k: v for k, v in values.items() if k not in plugins}
    plugin = {k: v for k, v in values.items() if k in plugins}
    return core, plugin


# --------------------------------------------------------------------------------------------------------------
# What is already recorded
# --------------------------------------------------------------------------------------------------------------


def same_point(point: RunConfig, recorded: RunConfig) -> bool:
    """Whether a record is a run of this point: every option that defines the measurement is equal (plugin
    options only where the point sets them: a record also holds the defaults of every plugin installed)."""
    fields = set(RunConfig.model_fields) - _NOT_IDENTITY
    if point.model_dump(include=fields) != recorded.model_dump(include=fields):
        return False
    return all(recorded.backend_options.get(k) == v for k, v in point.backend_options.items())


@dataclass
class Recorded:
    """The records of a sweep's output folder: configuration, outcome and file."""

    entries: list[tuple[RunConfig, str, Path]] = field(default_factory=list)

    @classmethod
    def scan(cls, folder: Path) -> Recorded:
        from accelbench.results import read_record

        found = cls()
        if folder.is_dir():
            for path in sorted(folder.glob("*.json")):
                found.add_file(path, read_record)
        return found

    def add_file(self, path: Path, read: Any = None) -> str | None:
        """Add one record file; returns its outcome status, or None if it is not a readable record."""
        if read is None:
            from accelbench.results import read_record as read
        try:
            record = read(path)
        except ResultFileError:
            return None  # not ours to judge here; `accelbench compare` reports such files
        self.entries.append((record.config, record.outcome.status, path))
        return record.outcome.status

    def outcomes(self, config: RunConfig) -> list[str]:
        return [status for recorded, status, _ in self.entries if same_point(config, recorded)]


def point_done(outcomes: Sequence[str], repeats: int) -> bool:
    """Done: it ran out of memory (an outcome, the same every time), or has ``repeats`` successful runs."""
    return "oom" in outcomes or outcomes.count("ok") >= repeats


# --------------------------------------------------------------------------------------------------------------
# Running points
# --------------------------------------------------------------------------------------------------------------


class SweepInterrupted(BaseException):  # noqa: N818 - an interruption, like KeyboardInterrupt
    """SIGTERM to the sweep (a scheduler's time limit): finish the current point's record, then stop."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@dataclass
class Attempt:
    """One run of one point: how it ended and where its record is (None: no record was written)."""

    status: (
        str  # ok, oom, error, interrupted (from the record); refused, crashed, timeout, failed (no record)
    )
    exit_code: int
    seconds: float
    record: Path | None = None
    message: str = ""


def child_command(argv: Sequence[str], memory_cap: int | None) -> list[str]:
    """The command that runs one point. With a memory cap, the address-space limit is set in the child itself
    (not through preexec_fn, which is unsafe while the progress display's thread runs); a CPU run that hits it
    fails its allocation and is recorded as out of memory. GPU runtimes reserve large address ranges, so a cap
    is for CPU runs."""
    if memory_cap is None:
        return [sys.executable, "-m", "accelbench.cli", *argv]
    code = (
        "import resource, sys; "
        f"resource.setrlimit(resource.RLIMIT_AS, ({memory_cap}, {memory_cap})); "
        "from accelbench.cli import main; sys.exit(main())"
    )
    return [sys.executable, "-c", code, *argv]


def _last_lines(text: str, n: int = 3) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " ".join(lines[-n:])[:1000]


def run_point(
    sweep: Sweep,
    point: Point,
    output_dir: Path,
    recorded: Recorded,
    timeout_s: float | None = None,
) -> Attempt:
    """Run one point in a child process and find the record it wrote.

    A SIGINT (KeyboardInterrupt) or SIGTERM (:class:`SweepInterrupted`) to the sweep is forwarded once to the
    child, which writes an ``interrupted`` record with its completed epochs; the exception is then re-raised.
    """
    config = sweep.config(point, output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    before = set(output_dir.glob("*.json"))
    start = time.monotonic()
    proc = subprocess.Popen(
        child_command(sweep.argv(point, output_dir), sweep.memory_cap),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a terminal's Ctrl-C reaches the sweep only; it forwards one signal
    )
    timed_out = False
    try:
        _, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        proc.send_signal(signal.SIGTERM)  # the child writes an interrupted record
        stderr = _finish(proc)
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        _finish(proc)
        _collect(recorded, before, output_dir, config)
        raise
    except SweepInterrupted as exc:
        proc.send_signal(exc.signum)
        _finish(proc)
        _collect(recorded, before, output_dir, config)
        raise
    seconds = time.monotonic() - start
    code = proc.returncode
    found = _collect(recorded, before, output_dir, config)
    if found is not None and not (timed_out and found[1] == "interrupted"):
        return Attempt(found[1], code, seconds, found[0])  # it ended by itself (perhaps just as time ran out)
    if timed_out:
        kept = (
            "its completed epochs are in an interrupted record"
            if found
            else "no record (training had not begun)"
        )
        return Attempt(
            "timeout", code, seconds, found[0] if found else None, f"stopped at {timeout_s:g} s; {kept}"
        )
    if code == EXIT_REFUSED:
        return Attempt("refused", code, seconds, message=_last_lines(stderr, 2).removeprefix("error: "))
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (on Linux, SIGKILL is often the kernel's out-of-memory killer)" if name == "SIGKILL" else ""
        return Attempt("crashed", code, seconds, message=f"killed by {name}{hint}; no record")
    return Attempt("failed", code, seconds, message=f"exit code {code} and no record: {_last_lines(stderr)}")


def _finish(proc: subprocess.Popen[str]) -> str:
    """Wait for an interrupted child to write its record; kill it (and its workers) after the grace period."""
    try:
        _, stderr = proc.communicate(timeout=INTERRUPT_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate()
    return stderr or ""


def _collect(
    recorded: Recorded, before: set[Path], output_dir: Path, config: RunConfig
) -> tuple[Path, str] | None:
    """Add the records a point wrote to ``recorded``; return the one that is this point's run."""
    mine = None
    for path in sorted(set(output_dir.glob("*.json")) - before):
        status = recorded.add_file(path)
        if status is not None and same_point(config, recorded.entries[-1][0]):
            mine = (path, status)
    return mine


def log_attempt(output_dir: Path, sweep: Sweep, point: Point, attempt: Attempt) -> None:
    """Append one line to the sweep log (JSON lines; one writer per sweep, so no locking)."""
    entry = {
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "sweep": sweep.name,
        "point": {k: str(v) if isinstance(v, Path) else v for k, v in point.options},
        "status": attempt.status,
        "exit_code": attempt.exit_code,
        "seconds": round(attempt.seconds, 3),
        "record": str(attempt.record) if attempt.record else None,
        "message": attempt.message,
    }
    with open(output_dir / SWEEP_LOG, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry) + "\n")


@dataclass
class SweepSummary:
    """How a sweep invocation ended, point by point."""

    done: int = 0  # points with their ok / oom records (including those done before)
    skipped_done: int = 0  # of which already done when the sweep started
    beyond_fit: int = 0  # points not run: larger than the first size that did not fit
    failed: list[tuple[Point, Attempt]] = field(default_factory=list)
    interrupted: bool = False

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return EXIT_INTERRUPTED
        return EXIT_ERROR if self.failed else EXIT_OK


class SweepDisplay:
    """Points done / left, the current point, and time so far: a live bar on a terminal, lines otherwise."""

    def __init__(self, console: Console, total: int, live: bool) -> None:
        self.console, self.total, self.finished = console, total, 0
        self.start = time.monotonic()
        self._progress: Progress | None = None
        if live:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("points"),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            )
            self._task = self._progress.add_task("starting", total=total)
            self._progress.start()

    def current(self, point: Point, run: int, runs: int) -> None:
        again = f" (run {run}/{runs})" if runs > 1 else ""
        if self._progress is not None:
            self._progress.update(self._task, description=Text(point.label() + again).plain)
        else:
            self.console.print(
                Text(f"[{self.finished + 1}/{self.total}] running {point.label()}{again}"), soft_wrap=True
            )

    def finish(self, point: Point, outcome: str, style: str = "") -> None:
        self.finished += 1
        elapsed = time.monotonic() - self.start
        left = self.total - self.finished
        line = Text(f"[{self.finished}/{self.total}] {point.label()}: ", style="bold")
        line.append(outcome, style=style)
        line.append(f"  ({left} left, {elapsed:,.0f} s so far)", style="dim")
        self.console.print(line, soft_wrap=True)
        if self._progress is not None:
            self._progress.update(self._task, completed=self.finished)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


def run_sweep(
    sweep: Sweep,
    output_dir: Path,
    console: Console,
    live: bool = False,
    timeout_s: float | None = None,
) -> SweepSummary:
    """Run every point not yet done, in order; a largest-fit series stops after its first out-of-memory."""
    recorded = Recorded.scan(output_dir)
    summary = SweepSummary()
    stopped: set[tuple[Any, ...]] = set()  # largest-fit series that found a size that does not fit
    display = SweepDisplay(console, len(sweep.points), live)

    def on_sigterm(signum: int, frame: object) -> None:
        raise SweepInterrupted(signum)

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        for point in sweep.points:
            if point.series in stopped:
                summary.beyond_fit += 1
                display.finish(point, "not run: a smaller size already did not fit", "dim")
                continue
            config = sweep.config(point, output_dir)
            outcomes = recorded.outcomes(config)
            if point_done(outcomes, sweep.repeats):
                summary.done += 1
                summary.skipped_done += 1
                if "oom" in outcomes and point.series is not None:
                    stopped.add(point.series)
                display.finish(point, "already recorded: " + _outcome_text(outcomes), "dim")
                continue
            attempt = None
            runs = sweep.repeats - outcomes.count("ok")
            for run in range(1, runs + 1):
                display.current(point, run, runs)
                attempt = run_point(sweep, point, output_dir, recorded, timeout_s)
                log_attempt(output_dir, sweep, point, attempt)
                if attempt.status != "ok":
                    break
            assert attempt is not None
            if attempt.status in ("ok", "oom"):
                summary.done += 1
                if attempt.status == "oom" and point.series is not None:
                    stopped.add(point.series)
                text = "out of memory" if attempt.status == "oom" else "ok"
                display.finish(
                    point, f"{text} ({attempt.seconds:.1f} s)", "green" if text == "ok" else "yellow"
                )
            else:
                summary.failed.append((point, attempt))
                if attempt.status == "crashed" and point.series is not None:
                    stopped.add(
                        point.series
                    )  # most likely the host ran out of memory: larger sizes would too
                reason = f": {attempt.message}" if attempt.message else ""
                display.finish(point, f"{attempt.status}{reason}", "red")
    except (KeyboardInterrupt, SweepInterrupted):
        summary.interrupted = True
    finally:
        signal.signal(signal.SIGTERM, previous)
        display.close()
    return summary


def _outcome_text(outcomes: Sequence[str]) -> str:
    counts = {s: outcomes.count(s) for s in dict.fromkeys(outcomes)}
    return ", ".join(f"{n} {s}" for s, n in counts.items())


# --------------------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------------------


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """The `sweep` subcommand's options."""
    parser.add_argument("sweep", nargs="?", help="a sweep file (.toml, .yaml) or a built-in suite name")
    parser.add_argument("--list", action="store_true", help="list the built-in suites and their scales")
    parser.add_argument(
        "--scale",
        default=BASE_SCALE,
        help=f"sizes: '{BASE_SCALE}' (as written: the seed study's) or a scale the file defines, e.g. 'tiny'",
    )
    parser.add_argument(
        "--output-dir", type=Path, default=Path("results"), help="where records go (default: results/)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="OPTION=VALUE",
        help="fix a run option for every point, e.g. --set precision=bf16-mixed --set backend=cuda (repeatable)",
    )
    parser.add_argument("--repeats", type=int, help="runs per point (overrides the file's 'repeats')")
    parser.add_argument(
        "--memory-cap",
        help="address-space limit per point, e.g. 4GiB (CPU runs only: emulates a device with that much memory)",
    )
    parser.add_argument("--point-timeout", type=float, help="seconds before a point is stopped (SIGTERM)")
    parser.add_argument(
        "--dry-run", action="store_true", help="list the points and which are done; run nothing"
    )
    parser.add_argument(
        "--quiet", "-q", action="store_true", help="no progress display; only the final summary"
    )


def list_suites(console: Console) -> None:
    for name, path in sorted(builtin_suites().items()):
        data = read_sweep_file(path)
        scales = ", ".join([BASE_SCALE, *data.get("scales", {})])
        console.print(Text(name, style="bold"), Text(f"(scales: {scales})"), soft_wrap=True)
        console.print(Text("  " + " ".join(str(data.get("description", "")).split())), soft_wrap=True)


def sweep_command(args: argparse.Namespace, err: Console) -> int:
    """`accelbench sweep`: resolve the sweep, then run it (or list it with --dry-run)."""
    if args.list:
        list_suites(Console())
        return EXIT_OK
    if not args.sweep:
        raise AccelbenchError(
            "name a sweep file or a built-in suite (`accelbench sweep --list` shows the suites)"
        )
    from accelbench.plugins import get_host

    path = resolve_sweep_source(args.sweep)
    sweep = load_sweep(path, args.scale, parse_set(args.set), get_host().run_options(), args.output_dir)
    if args.repeats is not None:
        if args.repeats < 1:
            raise AccelbenchError(f"--repeats {args.repeats}: give at least 1")
        sweep.repeats = args.repeats
    if args.memory_cap:
        sweep.memory_cap = parse_memory(args.memory_cap)
    if args.point_timeout is not None and args.point_timeout <= 0:
        raise AccelbenchError(f"--point-timeout {args.point_timeout}: give a positive number of seconds")

    if args.dry_run:
        return _dry_run(sweep, args.output_dir)
    cap = f", memory cap {sweep.memory_cap / 2**30:.2f} GiB per point" if sweep.memory_cap else ""
    err.print(
        Text(
            f"sweep {sweep.name} (scale {args.scale}): {len(sweep.points)} points x {sweep.repeats} run(s), "
            f"records in {args.output_dir}{cap}"
        ),
        soft_wrap=True,
    )
    live = not args.quiet and err.is_terminal
    console = err if not args.quiet else Console(stderr=True, quiet=True)
    summary = run_sweep(sweep, args.output_dir, console, live, args.point_timeout)
    left = len(sweep.points) - summary.done - summary.beyond_fit
    err.print(
        Text(
            f"sweep {sweep.name}: {summary.done} of {len(sweep.points)} points done "
            f"({summary.skipped_done} already recorded), {summary.beyond_fit} beyond the largest size that fits, "
            f"{left} not done"
        ),
        soft_wrap=True,
    )
    for point, attempt in summary.failed:
        err.print(
            Text(f"  {point.label()}: {attempt.status}: {attempt.message}", style="red"), soft_wrap=True
        )
    if summary.interrupted:
        err.print(
            Text("interrupted: every finished point is recorded; run the same command again to resume"),
            soft_wrap=True,
        )
    elif summary.failed:
        err.print(
            Text(f"details: {args.output_dir / SWEEP_LOG}; re-run the same command to retry them"),
            soft_wrap=True,
        )
    return summary.exit_code


def _dry_run(sweep: Sweep, output_dir: Path) -> int:
    recorded = Recorded.scan(output_dir)
    out = Console()
    stopped: set[tuple[Any, ...]] = set()
    for i, point in enumerate(sweep.points, 1):
        outcomes = recorded.outcomes(sweep.config(point, output_dir))
        if point.series in stopped:
            state = "skip (beyond the largest size that fits)"
        elif point_done(outcomes, sweep.repeats):
            state = "done (" + _outcome_text(outcomes) + ")"
            if "oom" in outcomes and point.series is not None:
                stopped.add(point.series)
        else:
            state = "to run" + (f" (recorded: {_outcome_text(outcomes)})" if outcomes else "")
        out.print(
            Text(f"{i:>4}  {state:<28}  accelbench {' '.join(sweep.argv(point, output_dir))}"), soft_wrap=True
        )
    return EXIT_OK
