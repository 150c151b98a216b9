"""`accelbench compare` fed the odd and the hostile: malformed, foreign and hand-made records of every kind, things
named like records that are none (a folder, a pipe, a device, a loop of links), and outputs that cannot be written.
Every case ends with a reason or a comparison, never a traceback; nothing read is changed, nothing half-written.

The hostile files are made by hostile_support.py (shared with the report, estimate and sweep modules: the same
files, another reader).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path

import pytest
from hostile_support import HOSTILE_REASONS, IGNORED, hostile_files, listing

from accelbench.cli import main
from accelbench.results import ResultRecord


@pytest.fixture(scope="module")
def good(tiny_run: tuple[ResultRecord, Path]) -> Path:
    """One real record: a tiny run, 2 epochs of 2 steps, in this process (conftest's, shared)."""
    return tiny_run[1]


@pytest.fixture
def hostile(tmp_path: Path, good: Path) -> Path:
    folder = tmp_path / "records"
    hostile_files(folder, good)
    return folder


@pytest.mark.slow
def test_every_bad_file_is_skipped_with_its_reason_and_the_good_one_compared(
    hostile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = listing(hostile)
    assert main(["compare", str(hostile), "--format", "json"]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    err = " ".join(captured.err.split())
    for name, reason in HOSTILE_REASONS.items():
        assert f"skipped {hostile / name}: " in err, name
        said = err.split(f"skipped {hostile / name}: ")[1].split(" skipped ")[0]
        assert reason in said, (name, said)
    for name in IGNORED:  # not records yet (temporary files), or not files (a pipe, a device): left alone
        assert str(hostile / name) not in err
    data = json.loads(captured.out)
    ((cell,),) = [group["cells"] for group in data["groups"]]
    assert cell["outcomes"] == {"ok": 1} and cell["epoch_s"]["n"] == 1  # the good record, its steady epoch
    assert cell["records"] == [str(hostile / "good.json")]
    assert data["collectives"]["systems"]  # the well-formed comm record among them is compared too
    assert listing(hostile) == before  # nothing written where the records are


def test_strict_fails_on_the_first_bad_file_in_path_order(
    hostile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compare", str(hostile), "--strict"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"error: {hostile / 'binary.json'}: not JSON (not UTF-8 text" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("pipe.json", "not a regular file (a device, pipe or socket), not a result record"),
        ("to-dev-zero.json", "not a regular file (a device, pipe or socket), not a result record"),
        ("loop-a.json", "Too many levels of symbolic links"),
        ("a-folder.json", "no result records found"),  # a folder: searched, and it holds nothing
    ],
)
def test_things_named_like_records_are_refused_by_name_without_blocking(
    hostile: Path, name: str, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compare", str(hostile / name)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert reason in err and "Traceback" not in err


def test_a_missing_path_and_an_unlistable_folder_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compare", str(tmp_path / "nowhere")]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.scandir

    def no_permission(path: object) -> object:  # as a folder without read permission answers (root reads any)
        if str(path) == str(locked):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)  # type: ignore[call-overload]

    monkeypatch.setattr(os, "scandir", no_permission)
    assert main(["compare", str(tmp_path)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{locked}: cannot list this folder (Permission denied)" in err and "Traceback" not in err


def test_the_output_is_written_whole_or_not_at_all(
    good: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "comparison.csv"
    out.write_text("the previous comparison\n")

    def disk_full(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(os, "replace", disk_full)
        assert main(["compare", str(good), "--format", "csv", "--output", str(out)]) == 2
    assert "cannot write it (No space left on device)" in capsys.readouterr().err
    assert out.read_text() == "the previous comparison\n"  # the old file stands, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["comparison.csv"]  # no temporary file left behind
    assert main(["compare", str(good), "--format", "csv", "--output", str(out)]) == 0
    assert out.read_text().startswith("workload,model,")


def test_an_output_that_is_a_pipe_is_written_into_not_replaced(
    good: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--output /dev/stdout` or a named pipe: written into. (A rename onto /dev/null would replace the device.)"""
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(pipe.read_bytes()))
    reader.start()
    try:
        assert main(["compare", str(good), "--format", "csv", "--output", str(pipe)]) == 0
    finally:
        with contextlib.suppress(OSError):  # unblock the reader if compare never opened the pipe
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        reader.join(10)
    assert got and got[0].startswith(b"workload,model,")
    assert pipe.is_fifo()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--alpha", "nan"], "--alpha nan: must be between 0 and 1"),
        (["--alpha", "1"], "--alpha 1.0: must be between 0 and 1"),
        (["--output", "/"], "--output /: is a folder; give a file name"),
        (["--label-by", "host,,nope"], "unknown field(s) 'nope'"),
        (["--vs", "x" * 10_000], "not a workload field of these records"),
    ],
)
def test_bad_options_are_refused(
    good: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compare", str(good), *args]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("columns", ["-5", "abc", "0", "99999999"])
def test_a_terminal_width_that_makes_no_sense_is_ignored(
    good: Path, columns: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", columns)
    assert main(["compare", str(good)]) == 0
    assert "Traceback" not in capsys.readouterr().err
