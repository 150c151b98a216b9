"""`accelbench sweep` fed the odd and the hostile: grids that multiply past any machine's time, files that are not
sweep files (bombs, devices, loops, numbers too long to read), bounds past their limits, points the host cannot run,
and hostile files among the records it resumes from. Each is refused before any point runs (exit 2), and what is
in the output folder is left as it was.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from core_support import TINY
from hostile_support import hostile_files, listing

from accelbench.cli import main
from accelbench.sweep.spec import MAX_POINTS, MAX_REPEATS, MAX_SWEEP_FILE_BYTES

RUN = '[run]\nmodel = "custom"\nlayers = 1\nheads = 2\nembd = 16\nblock_size = 16\nepochs = 1\nsteps_per_epoch = 1\n'


def refused(args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    out = tmp_path / "out"
    started = time.monotonic()
    code = main(["sweep", *args, "--output-dir", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    assert time.monotonic() - started < 20  # refused at once, not after expanding or reading for ever
    assert not list(out.rglob("*.json")) if out.exists() else True  # no point ran, none was written
    return " ".join(err.split())


def sweep_file(tmp_path: Path, name: str, text: str | bytes) -> str:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        # 10 axes of 10 values: 10^10 points, whose mere listing never ended
        (
            "huge-grid.toml",
            RUN
            + "[[grid]]\n"
            + "".join(
                f"{k} = {list(range(1, 11))}\n"
                for k in ("batch_size", "seed", "epochs", "steps_per_epoch", "threads")
            )
            + "lr = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, "
            "0.7, 0.8, 0.9, 1.0]\n",
            f"make 1000000 points, and a sweep may have at most {MAX_POINTS} in all",
        ),  # fmt: skip
        # YAML's aliases make a small file a large grid
        (
            "alias-bomb.yaml",
            "run: {model: custom, layers: 1, heads: 2, embd: 16}\ngrid:\n  batch_size: &a "
            f"{list(range(1, 11))}\n  seed: *a\n  epochs: *a\n  steps_per_epoch: *a\n  threads: *a\n",
            "make 100000 points",
        ),  # fmt: skip
        ("deep.toml", "a = " + "[" * 100_000 + "]" * 100_000, "not a sweep file: nested too deeply to read"),
        ("deep.yaml", "a: " + "[" * 100_000 + "]" * 100_000, "nested too deeply to read"),
        (
            "digits.toml",
            RUN.replace("epochs = 1", "epochs = " + "9" * 5000),
            "Exceeds the limit (4300 digits)",
        ),
        ("digits.yaml", "run: {seed: " + "9" * 5000 + "}\n", "Exceeds the limit (4300 digits)"),
        ("binary.toml", bytes(range(256)) * 4, "cannot read sweep file"),
        ("big.toml", "# " + "x" * MAX_SWEEP_FILE_BYTES + "\n", "far too large to be a sweep file"),
        (
            "repeats.toml",
            f"repeats = {MAX_REPEATS + 1}\n" + RUN,
            "repeats = 1001; give a whole number of runs",
        ),
        ("repeats-bool.toml", "repeats = true\n" + RUN, "repeats = True; give a whole number of runs"),
        ("cap.toml", 'memory_cap = "' + "9" * 400 + 'GiB"\n' + RUN, "more than any host has"),
        ("seed.toml", RUN + "seed = -1\n", "seed: Input should be greater than or equal to 0"),
    ],
)
def test_sweep_files_that_cannot_be_run_are_refused_at_once(
    name: str, text: str | bytes, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in refused([sweep_file(tmp_path, name, text), "--dry-run"], tmp_path, capsys)


def test_things_named_like_sweep_files_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "folder.toml").mkdir()
    os.mkfifo(tmp_path / "pipe.toml")  # reading it would block for ever
    (tmp_path / "zero.toml").symlink_to("/dev/zero")  # reading it would never end
    (tmp_path / "loop.toml").symlink_to("loop.toml")
    for name in ("folder.toml", "pipe.toml", "zero.toml", "loop.toml"):
        err = refused([str(tmp_path / name), "--dry-run"], tmp_path, capsys)
        assert f"'{tmp_path / name}' is neither a sweep file nor a built-in suite" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--repeats", "0"], "--repeats 0: give at least 1 run per point, and at most 1000"),
        (["--repeats", "999999999999"], "--repeats 999999999999: give at least 1 run per point"),
        (["--point-timeout", "nan"], "--point-timeout nan: give a number of seconds above 0 and at most"),
        (["--point-timeout", "inf"], "--point-timeout inf: give a number of seconds above 0"),
        (["--point-timeout", "-1"], "--point-timeout -1.0: give a number of seconds above 0"),
        (["--memory-cap", "9" * 400], "more than any host has; give a size such as 3GiB"),
        (["--memory-cap", "0"], "memory cap '0': give a size such as 3GiB, 512MiB or a number of bytes"),
        (["--memory-cap=-1GiB"], "memory cap '-1GiB': give a size"),
        (
            ["--set", "seed=" + "9" * 5000],
            "seed: Unable to parse input string as an integer, exceeded maximum size",
        ),
        (["--set", "threads=100000"], "--devices 1 x --threads 100000 = 100000 threads on"),
        (
            ["--set", "profile=true", "--set", "profile_steps=100000"],
            "--profile-steps 100000: at most 1000 steps",
        ),
    ],
)
def test_bounds_past_their_limits_are_refused_before_any_point_runs(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = sweep_file(tmp_path, "tiny.toml", RUN)
    assert message in refused([path, *args], tmp_path, capsys)


def test_resuming_beside_hostile_files_neither_blocks_nor_changes_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The output folder holds a pipe, a device link, a loop of links, a folder and malformed records: the sweep's
    scan of what is recorded passes over them (the point is still to run) and leaves them as they were."""
    run = tmp_path / "run"
    assert (
        main(["run", *TINY, "--epochs", "1", "--steps-per-epoch", "1", "--output-dir", str(run), "-q"]) == 0
    )
    (good,) = run.glob("*.json")
    out = tmp_path / "out"
    hostile_files(out, good)
    before = listing(out)
    path = sweep_file(tmp_path, "tiny.toml", RUN.replace('model = "custom"', 'model = "custom"\nseed = 7'))
    assert main(["sweep", path, "--dry-run", "--output-dir", str(out)]) == 0
    captured = capsys.readouterr()
    assert "to run" in captured.out and "Traceback" not in captured.err
    assert listing(out) == before
