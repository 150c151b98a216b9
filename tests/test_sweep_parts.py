"""The sweep's parts one at a time: option spellings, the configuration a point runs from, the child's command,
largest-fit bookkeeping, the attempt log, exit codes, and that listing a sweep does not load torch."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from accelbench.config import RunConfig
from accelbench.exitcodes import ExitCode
from accelbench.sweep import (
    POINTS_FOLDER,
    SWEEP_LOG,
    Attempt,
    LargestFit,
    Sweep,
    SweepSummary,
    child_command,
    load_sweep,
    log_attempt,
    parse_set,
)

TINY = """
[run]
model = "custom"
layers = 1
heads = 2
embd = 16
block_size = 16
dropout = 0
epochs = 2
steps_per_epoch = 3
[[grid]]
batch_size = [1, 2, 4]
largest_fit = "batch_size"
[[grid]]
batch_size = 8
threads = [1, 2]
"""


def tiny_sweep(tmp_path: Path, overrides: list[str] | None = None) -> Sweep:
    path = tmp_path / "tiny.toml"
    path.write_text(textwrap.dedent(TINY))
    return load_sweep(path, overrides=parse_set(overrides or []))


@pytest.mark.parametrize(
    ("spelling", "name", "value"),
    [
        ("layers", "n_layer", 2),  # a workload option by its flag
        ("n_layer", "n_layer", 2),  # ... by its name
        ("block-size", "block_size", 32),
        ("block_size", "block_size", 32),
        ("lr", "learning_rate", 0.001),  # a core field by its flag
        ("learning_rate", "learning_rate", 0.001),
        ("batch-size", "batch_size", 3),
    ],
)
def test_every_spelling_of_a_run_option_sets_the_same_option(
    tmp_path: Path, spelling: str, name: str, value: object
) -> None:
    sweep = tiny_sweep(tmp_path, [f"{spelling}={value}"])
    assert all(p.values[name] == value for p in sweep.points)
    config = sweep.config(sweep.points[0], tmp_path)
    assert config.workload_options.get(name, getattr(config, name, None)) == value


def test_a_point_runs_from_the_configuration_the_sweep_validated(tmp_path: Path) -> None:
    sweep = tiny_sweep(tmp_path)
    out = tmp_path / "results"
    point = sweep.points[1]
    path = sweep.write_point(point, out)
    assert path.parent == out / POINTS_FOLDER
    assert RunConfig.model_validate_json(path.read_text()) == sweep.config(point, out)
    assert not list(out.glob("*.json"))  # beside the records, never taken for one


def test_set_on_a_search_axis_leaves_one_point_and_no_search(tmp_path: Path) -> None:
    points = tiny_sweep(tmp_path, ["batch_size=4"]).points
    assert [(p.values["batch_size"], p.values.get("threads"), p.series) for p in points] == [
        (4, None, None),
        (4, 1, None),
        (4, 2, None),
    ]


def test_the_child_command_runs_accelbench_with_the_memory_cap_set_in_the_child() -> None:
    argv = ["run", "--config", "point.json", "--quiet"]
    assert child_command(argv, None) == [sys.executable, "-m", "accelbench.cli", *argv]
    capped = child_command(argv, 2**30)
    assert capped[:2] == [sys.executable, "-c"] and capped[3:] == argv
    assert f"resource.setrlimit(resource.RLIMIT_AS, ({2**30}, {2**30}))" in capped[2]


def test_a_size_that_does_not_fit_stops_only_its_own_search(tmp_path: Path) -> None:
    points = tiny_sweep(tmp_path).points
    search, others = points[:3], points[3:]
    assert [p.values["batch_size"] for p in search] == [1, 2, 4] and all(p.series is None for p in others)
    fit = LargestFit()
    assert not any(fit.beyond(p) for p in points)
    fit.did_not_fit(search[1])
    assert all(fit.beyond(p) for p in search)  # the caller decides order: the smaller size ran already
    fit.did_not_fit(others[0])  # not in a search: nothing else is settled by it
    assert not any(fit.beyond(p) for p in others)


def test_each_attempt_is_one_json_line(tmp_path: Path) -> None:
    sweep = tiny_sweep(tmp_path)
    point = sweep.points[0]
    log_attempt(
        tmp_path, sweep, point, Attempt("refused", ExitCode.REFUSED, 0.12345, message="no such backend")
    )
    log_attempt(tmp_path, sweep, point, Attempt("ok", ExitCode.OK, 2.0, record=tmp_path / "r.json"))
    first, second = (json.loads(line) for line in (tmp_path / SWEEP_LOG).read_text().splitlines())
    assert first["sweep"] == "tiny" and first["point"] == point.values
    assert (first["status"], first["exit_code"], first["seconds"], first["record"]) == (
        "refused",
        2,
        0.123,
        None,
    )
    assert first["message"] == "no such backend"
    assert (second["status"], second["record"]) == ("ok", str(tmp_path / "r.json"))


def test_the_sweep_exit_code_says_whether_every_point_was_done(tmp_path: Path) -> None:
    point = tiny_sweep(tmp_path).points[0]
    assert SweepSummary(done=3).exit_code == ExitCode.OK
    assert SweepSummary(failed=[(point, Attempt("crashed", -9, 1.0))]).exit_code == ExitCode.ERROR
    assert SweepSummary(done=1, interrupted=True).exit_code == ExitCode.INTERRUPTED


@pytest.mark.parametrize(
    "code",
    [
        "import accelbench.sweep",
        "from accelbench.cli import main; main(['sweep', '--list'])",
    ],
)
def test_reading_and_listing_sweeps_does_not_load_torch(code: str) -> None:
    check = f"import sys; {code}; sys.exit('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr or "torch was imported"
