"""Result records: schema round-trip, atomic writes, and rejection of malformed, foreign and newer files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from accelbench.errors import ResultFileError
from accelbench.results import (
    SCHEMA_VERSION,
    RecordNotSaved,
    ResultRecord,
    json_schema,
    read_record,
    write_record,
)


@pytest.fixture(scope="module")
def recorded(tiny_run: tuple[ResultRecord, Path]) -> tuple[ResultRecord, Path]:
    """A real run's record as the run returned it, and its file (conftest's tiny run, shared)."""
    return tiny_run


def test_round_trip_is_lossless(recorded) -> None:
    record, path = recorded
    again = read_record(path)
    assert again == record
    raw = json.loads(path.read_text())
    assert raw["schema"] == "accelbench.result" and raw["schema_version"] == SCHEMA_VERSION
    assert raw["config"]["workload_options"]["n_embd"] == 16


def test_schema_is_published_and_describes_the_record() -> None:
    schema = json_schema()
    assert schema["properties"]["schema"]["const"] == "accelbench.result"
    assert {"outcome", "config", "system", "backend", "precision", "metrics"} <= set(schema["required"])


def _write(tmp_path: Path, content: str | dict) -> Path:
    path = tmp_path / "record.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def test_truncated_file_is_rejected_with_its_position(recorded, tmp_path) -> None:
    text = recorded[1].read_text()
    with pytest.raises(ResultFileError, match=r"record.json: not JSON \(line \d+, column \d+"):
        read_record(_write(tmp_path, text[: len(text) // 2]))


def test_foreign_json_is_rejected(tmp_path) -> None:
    with pytest.raises(ResultFileError, match="not an accelbench result record"):
        read_record(_write(tmp_path, {"name": "some other tool", "results": []}))
    with pytest.raises(ResultFileError, match="not an accelbench result record"):
        read_record(_write(tmp_path, [1, 2, 3]))


def test_newer_schema_asks_for_an_upgrade(recorded, tmp_path) -> None:
    raw = json.loads(recorded[1].read_text())
    raw["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(ResultFileError, match=f"schema v{SCHEMA_VERSION + 1}, newer .* upgrade accelbench"):
        read_record(_write(tmp_path, raw))


def test_invalid_fields_are_named(recorded, tmp_path) -> None:
    raw = json.loads(recorded[1].read_text())
    raw["outcome"]["status"] = "great"
    del raw["system"]["host"]
    raw["metrics"]["epochs"][0]["wall_s"] = "fast"
    with pytest.raises(ResultFileError) as info:
        read_record(_write(tmp_path, raw))
    message = str(info.value)
    assert "outcome.status" in message and "system.host" in message and "metrics.epochs.0.wall_s" in message


def test_unknown_fields_are_rejected(recorded, tmp_path) -> None:
    raw = json.loads(recorded[1].read_text())
    raw["metrics"]["secret_sauce"] = 1
    with pytest.raises(ResultFileError, match="metrics.secret_sauce"):
        read_record(_write(tmp_path, raw))


def _disk_full_under(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes under ``folder`` fail as on a full disk (ENOSPC at fsync, where a full disk shows at the latest)."""
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(folder)):
            raise OSError(28, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def test_a_full_disk_leaves_no_partial_file_and_keeps_the_record_elsewhere(
    recorded, tmp_path, monkeypatch
) -> None:
    out, fallback = tmp_path / "out", tmp_path / "fallback"
    monkeypatch.setenv("ACCELBENCH_FALLBACK_DIR", str(fallback))
    _disk_full_under(out, monkeypatch)
    with pytest.raises(RecordNotSaved, match="No space left on device") as caught:
        write_record(recorded[0], out)
    assert list(out.iterdir()) == []  # no partial file, no temporary left behind
    kept = list(fallback.iterdir())
    assert caught.value.saved == kept[0] and str(kept[0]) in str(caught.value)
    assert ResultRecord.model_validate_json(kept[0].read_text()) == recorded[0]
    assert ResultRecord.model_validate_json(caught.value.text) == recorded[0]  # and the text, to print


def test_when_no_folder_takes_the_record_its_text_is_still_there(recorded, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ACCELBENCH_FALLBACK_DIR", str(tmp_path / "fallback"))
    _disk_full_under(tmp_path, monkeypatch)
    with pytest.raises(RecordNotSaved, match="no fallback folder could take it either") as caught:
        write_record(recorded[0], tmp_path / "out")
    assert caught.value.saved is None
    assert ResultRecord.model_validate_json(caught.value.text) == recorded[0]
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
