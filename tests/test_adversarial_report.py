"""`accelbench report` fed the odd and the hostile: the malformed and hand-made records `compare` is fed
(hostile_support.hostile_files), comm records whose figures no measurement gives, a hostile title, and
places a report cannot go. A report is written whole or not at all, and nothing read is changed.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path

import pytest
from hostile_support import HOSTILE_REASONS, comm_record_text, hostile_files, listing

from accelbench.cli import main
from accelbench.results import ResultRecord


@pytest.fixture(scope="module")
def records(tiny_run: tuple[ResultRecord, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real record (conftest's tiny run, in this process) among every kind of bad file."""
    good = tiny_run[1]
    folder = tmp_path_factory.mktemp("hostile") / "records"
    hostile_files(folder, good)
    return folder


def test_a_report_of_every_bad_file_names_each_and_draws_the_good(
    records: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = listing(records)
    out = tmp_path / "report.html"
    assert main(["report", str(records), "-o", str(out)]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "Traceback" not in err
    for name, reason in HOSTILE_REASONS.items():
        said = err.split(f"skipped {records / name}: ")[1].split(" skipped ")[0]
        assert reason in said, (name, said)
    html = out.read_text()
    assert html.rstrip().endswith("</html>") and "<figure" in html
    assert listing(records) == before  # nothing written where the records are
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "report.html"
    ]  # and no temporary file beside the report


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (
            {"size_bytes": 10**30, "count": 10**30},
            "size_bytes 1000000000000000000000000000000 is not a message size",
        ),
        ({"size_bytes": 0, "count": 0}, "size_bytes 0 is not a message size"),
        ({"busbw_gbps": -1.0}, "busbw_gbps: -1.0 is not a measured figure"),
        ({"time_us": float("inf")}, "time_us: inf is not a measured figure"),
    ],
)
def test_comm_records_with_figures_no_measurement_gives_are_skipped(
    change: dict[str, float], reason: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 10^30-byte message once reached the figure's logarithmic axis and ended in a numpy TypeError."""
    good = json.loads(comm_record_text())
    bad = {**good, "run_id": "bad" + good["run_id"][3:]}
    bad["measurements"] = [{**good["measurements"][0], **change}]
    (tmp_path / "good.json").write_text(json.dumps(good))
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    out = tmp_path / "out" / "report.html"
    assert main(["report", str(tmp_path / "good.json"), str(tmp_path / "bad.json"), "-o", str(out)]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert f"skipped {tmp_path / 'bad.json'}: invalid comm record: measurements.0" in err and reason in err
    assert "Traceback" not in err and out.read_text().rstrip().endswith("</html>")


def test_a_hostile_title_is_text_not_markup(records: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    title = "<script>alert('x')</script>" + "é" * 10_000
    assert main(["report", str(records / "good.json"), "-o", str(out), "--title", title]) == 0
    html = out.read_text()
    assert "<script>alert" not in html and "&lt;script&gt;alert(" in html


def test_a_report_that_cannot_be_written_leaves_the_old_one_whole(
    records: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report.html"
    out.write_text("<html>the previous report</html>")

    def disk_full(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(os, "replace", disk_full)
        assert main(["report", str(records / "good.json"), "-o", str(out)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"the report could not be written: No space left on device ({out})" in err
    assert out.read_text() == "<html>the previous report</html>"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]


def test_a_report_into_a_pipe_is_written_into_it(records: Path, tmp_path: Path) -> None:
    """`-o /dev/stdout`, a named pipe, a device: written into; a rename onto /dev/null would replace the device."""
    pipe = tmp_path / "pipe.html"
    os.mkfifo(pipe)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(pipe.read_bytes()))
    reader.start()
    try:
        assert main(["report", str(records / "good.json"), "-o", str(pipe)]) == 0
    finally:
        with contextlib.suppress(OSError):
            os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(10)
    assert got and got[0].rstrip().endswith(b"</html>") and pipe.is_fifo()


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ({"-o": "FOLDER"}, "is a folder; give the HTML file's name"),
        ({"-o": "FILE/report.html"}, "--output's folder"),
        ({"--figures": "FILE"}, "--figures"),
        ({"--figures": "FILE/figures"}, "--figures"),
    ],
)
def test_places_a_report_cannot_go_are_refused_before_drawing(
    records: Path, tmp_path: Path, where: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "FOLDER").mkdir()
    (tmp_path / "FILE").write_text("a file")
    args = ["report", str(records / "good.json"), "-o", str(tmp_path / "report.html")]
    for flag, place in where.items():
        args += [flag, str(tmp_path / place)]
    assert main(args) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert message in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["FILE", "FOLDER"]  # nothing written anywhere
