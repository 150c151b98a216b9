"""`accelbench compare` fed the odd and the hostile: malformed, foreign and hand-made records of every kind, things
named like records that are none (a folder, a pipe, a device, a loop of links), and outputs that cannot be written.
Every case ends with a reason or a comparison, never a traceback; nothing read is changed, nothing half-written.

``hostile_files`` is shared with the report and estimate modules (the same files, another reader).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path

import pytest

from accelbench.cli import main
from accelbench.results import ResultRecord

# name -> (content, the reason compare gives when it skips the file). Made from a real record (``good``) where the
# file must look like one.
HOSTILE_REASONS = {
    "truncated.json": "not JSON",
    "deep-list.json": "nested too deeply",
    "deep-object.json": "nested too deeply",
    "huge-int.json": "Exceeds the limit (4300 digits)",
    "binary.json": "not JSON (not UTF-8 text",
    "empty.json": "not JSON",
    "list.json": 'not an accelbench result record (no "schema"',
    "newer.json": "newer than this accelbench reads",
    "nan-epoch.json": "finite number",
    "inf-epoch.json": "finite number",
    "negative-epoch.json": "greater than 0",
    "zero-devices.json": "greater than 0",
    "too-long-epoch.json": "metrics.epochs.0.wall_s: Input should be less than or equal to 10000000",
    "too-much-memory.json": "metrics.peak_memory_max_bytes: Input should be less than or equal to 1152921504606846976",
    "v1-broken.json": "invalid result record",
    "comm-broken.json": "invalid comm record: world_size",
    "comm-nan.json": "invalid comm record: measurements.0.busbw_gbps: nan",
    "loop-a.json": "Too many levels of symbolic links",
    "loop-b.json": "Too many levels of symbolic links",
}
IGNORED = (".tmp-half.json", ".trace-half.json", "pipe.json", "to-dev-zero.json", "dangling.json")


def comm_record_text(run_id: str = "c0mm" * 4) -> str:
    """A comm record as `accelbench comm` writes one (made here: a real one needs a 2-process job)."""
    from datetime import datetime, timezone

    from accelbench.comm.records import CommConfig, CommMeasurement, CommRecord
    from accelbench.contract import BackendInfo
    from accelbench.results import BackendRecord, Outcome
    from accelbench.system import collect_system_info

    measurement = CommMeasurement(
        op="all_reduce", dtype="fp32", variant="in-place", size_bytes=1024, count=256, requested_bytes=1024,
        status="ok", iters=1, time_us=10.0, algbw_gbps=0.1, busbw_gbps=0.1, bus_factor=1.0,
    )  # fmt: skip
    record = CommRecord(
        run_id=run_id,
        created_at=datetime.now(timezone.utc),
        outcome=Outcome(status="ok"),
        config=CommConfig(
            ops=["all_reduce"],
            dtypes=["fp32"],
            sizes=[1024],
            warmup=1,
            iters=1,
            check=True,
            devices=2,
            nnodes=1,
            collective_timeout=60.0,
        ),  # fmt: skip
        system=collect_system_info(),
        backend=BackendRecord(
            info=BackendInfo(name="cpu", device_type="cpu", device_unit="CPU"),
            distribution=None,
            version=None,
            devices=[],
            devices_used=2,
            collective_backend="gloo",
            runtime_versions={},
        ),  # fmt: skip
        plugins={},
        world_size=2,
        measurements=[measurement],
    )
    return record.to_json()


def hostile_files(folder: Path, good: Path) -> None:
    """Every kind of file that is not a readable record, beside which a real one (``good``) is copied."""
    folder.mkdir(parents=True, exist_ok=True)
    text = good.read_text()
    raw = json.loads(text)

    def edited(run_id: str, change: object) -> str:
        copy = json.loads(text)
        copy["run_id"] = run_id + copy["run_id"][len(run_id) :]
        change(copy)  # type: ignore[operator]
        return json.dumps(copy)  # NaN and Infinity as JSON's readers accept them

    def epochs(value: float) -> object:
        return lambda r: [e.update(wall_s=value) for e in r["metrics"]["epochs"]]

    files: dict[str, str | bytes] = {
        "good.json": text,
        "truncated.json": text[: len(text) // 2],
        "deep-list.json": "[" * 100_000 + "]" * 100_000,
        "deep-object.json": '{"a":' * 100_000 + "1" + "}" * 100_000,
        "huge-int.json": '{"schema": "accelbench.result", "schema_version": ' + "9" * 5000 + "}",
        "binary.json": bytes(range(256)) * 4,
        "empty.json": "",
        "list.json": "[1, 2, 3]",
        "newer.json": json.dumps({**raw, "schema_version": 99}),
        "nan-epoch.json": edited("a1", epochs(float("nan"))),
        "inf-epoch.json": edited("a2", epochs(float("inf"))),
        "negative-epoch.json": edited("a3", epochs(-1.0)),
        "zero-devices.json": edited("a4", lambda r: r["backend"].update(devices_used=0)),
        # finite, but no measurement gives them: an epoch of 10^308 s, a zettabyte of memory
        "too-long-epoch.json": edited("a5", epochs(1e308)),
        "too-much-memory.json": edited("a6", lambda r: r["metrics"].update(peak_memory_max_bytes=2**70)),
        "v1-broken.json": json.dumps({"schema": "accelbench.result", "schema_version": 1, "config": [1, 2]}),
        "comm-good.json": comm_record_text("c2" * 8),  # another kind of record, well formed: compared apart
        "comm-broken.json": json.dumps({**json.loads(comm_record_text()), "world_size": "two"}),
        "comm-nan.json": json.dumps(
            {
                **(c := json.loads(comm_record_text("c1" * 8))),
                "measurements": [{**c["measurements"][0], "busbw_gbps": float("nan")}],
            }  # fmt: skip
        ),
        ".tmp-half.json": text[:100],  # an atomic write in progress
        ".trace-half.json": "[",  # a profiled run's trace being exported
    }
    for name, content in files.items():
        if isinstance(content, bytes):
            (folder / name).write_bytes(content)
        else:
            (folder / name).write_text(content)
    (folder / "a-folder.json").mkdir()  # a folder named like a record: walked into, holds nothing
    (folder / "loop-a.json").symlink_to("loop-b.json")
    (folder / "loop-b.json").symlink_to("loop-a.json")
    (folder / "to-dev-zero.json").symlink_to("/dev/zero")  # reading it would never end
    (folder / "dangling.json").symlink_to("nowhere.json")
    (folder / "sub").mkdir()
    (folder / "sub" / "up").symlink_to("..")  # a link back up: not followed (a loop)
    os.mkfifo(folder / "pipe.json")  # reading it would block for ever


def listing(folder: Path) -> dict[str, int]:
    """Every entry under ``folder`` (not following links) with its size: to see that nothing was written there."""
    return {
        str(p.relative_to(folder)): (p.lstat().st_size if not p.is_dir() or p.is_symlink() else 0)
        for p in sorted(folder.rglob("*"))
        if "up" not in p.relative_to(folder).parts[1:]
    }


@pytest.fixture(scope="module")
def good(tiny_run: tuple[ResultRecord, Path]) -> Path:
    """One real record: a tiny run, 2 epochs of 2 steps, in this process (conftest's, shared)."""
    return tiny_run[1]


@pytest.fixture
def hostile(tmp_path: Path, good: Path) -> Path:
    folder = tmp_path / "records"
    hostile_files(folder, good)
    return folder


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
