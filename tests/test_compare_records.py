"""Reading result files for compare: the summary of a real record agrees with the fully validated record, files
whose fields compare uses are missing or mistyped are refused, older schema versions are migrated, runs share
what they have in common, and neither compare nor report imports torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from core_support import TINY, RealRuns, derived

from accelbench.compare import WorkloadKey, compare, load_records
from accelbench.errors import ResultFileError
from accelbench.results import read_record


@pytest.fixture(scope="module")
def record_file(real_runs: RealRuns) -> Path:
    return real_runs.record(*TINY, "--epochs", "3", "--steps-per-epoch", "2")


@pytest.mark.slow
def test_the_summary_agrees_with_the_fully_validated_record(record_file: Path) -> None:
    full = read_record(record_file)
    (summary,) = load_records([record_file]).records
    assert summary.path == record_file and summary.run_id == full.run_id
    assert summary.created_at == full.created_at and summary.status == full.outcome.status == "ok"
    assert summary.key == WorkloadKey.of(full) and summary.key.model == "custom 1L/2H/16E"
    assert summary.devices == full.backend.devices_used and summary.model_name == "custom"
    assert summary.parameters == full.workload["parameters"]
    figures, metrics = summary.figures, full.metrics
    assert figures.epoch_s == tuple(e.wall_s for e in metrics.epochs[1:])
    assert figures.samples_per_s == tuple(e.samples_per_s for e in metrics.epochs[1:])
    assert figures.peak_memory_bytes == metrics.peak_memory_max_bytes
    assert (
        figures.warmup_s == metrics.warmup.wall_s
        and figures.mfu == metrics.steady.mfu
        and figures.compile_s is None
    )
    assert figures.joules_per_sample == (None, None)  # no energy counter on this CPU
    env = dict(summary.environment)
    assert env["torch"] == full.system.torch_version and env["device unit"] == full.backend.info.device_unit


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"config__batch_size": "eight"}, "config.batch_size"),
        ({"outcome__status": "fine"}, "outcome.status"),
        ({"system__torch_threads": None}, "system.torch_threads"),
        ({"created_at": "yesterday"}, "created_at"),
    ],
)
def test_a_field_compare_uses_missing_or_mistyped_is_refused(
    record_file: Path, tmp_path: Path, change: dict, field: str
) -> None:
    record = json.loads(record_file.read_text())
    (tmp_path / "bad.json").write_text(json.dumps(derived(record, **change)))
    broken = derived(record)
    broken["metrics"]["epochs"][1]["wall_s"] = "fast"
    del broken["backend"]["devices_used"]
    (tmp_path / "worse.json").write_text(json.dumps(broken))

    loaded = load_records([tmp_path])
    assert not loaded.records
    reasons = {p.name: reason for p, reason in loaded.skipped}
    assert reasons["bad.json"].startswith("invalid result record") and field in reasons["bad.json"]
    assert (
        "metrics.epochs.1.wall_s" in reasons["worse.json"] and "backend.devices_used" in reasons["worse.json"]
    )
    with pytest.raises(ResultFileError, match="bad.json: invalid result record"):
        load_records([tmp_path], strict=True)


def test_an_older_schema_version_is_migrated_and_groups_with_the_current_one(
    record_file: Path, tmp_path: Path
) -> None:
    record = json.loads(record_file.read_text())
    v1 = derived(record, schema_version=1)
    v1["config"].update(v1["config"].pop("workload_options"))  # v1 kept the GPT's options as config fields
    del v1["workload_identity"]
    for index, epoch in enumerate(v1["metrics"]["epochs"]):  # and counted epochs from 0
        epoch["epoch"] = index
    v1["metrics"]["warmup"]["epoch"] = 0
    (tmp_path / "v1.json").write_text(json.dumps(v1))
    (tmp_path / "v2.json").write_text(json.dumps(record))
    migrated = read_record(tmp_path / "v1.json").metrics
    assert [e.epoch for e in migrated.epochs] == [1, 2, 3] and migrated.warmup.epoch == 1  # numbered one way

    loaded = load_records([tmp_path])
    assert not loaded.skipped and len(loaded.records) == 2
    old, new = loaded.records
    assert old.key == new.key
    (group,) = compare(loaded).groups
    assert len(group.cells[0].runs) == 2


def test_runs_share_their_key_system_and_environment(record_file: Path, tmp_path: Path) -> None:
    """At 100,000 records memory is the summaries': what runs have in common is kept once."""
    record = json.loads(record_file.read_text())
    for i in range(50):
        (tmp_path / f"{i}.json").write_text(json.dumps(derived(record, system__host=f"node{i % 2}")))
    records = load_records([tmp_path]).records
    assert len(records) == 50
    assert len({id(r.key) for r in records}) == 1 and len({id(r.environment) for r in records}) == 1
    assert len({id(r.system) for r in records}) == 2


def test_records_read_by_several_processes_are_those_one_process_reads(
    record_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From PARALLEL_FROM files, forked readers share the reading: the same summaries in the same order, the same
    duplicates (the first copy in path order wins), malformed and older files handled as one process does, and what
    runs share still kept once."""
    from accelbench.compare import records as module

    record = json.loads(record_file.read_text())
    for i in range(40):
        (tmp_path / f"{i:02d}.json").write_text(json.dumps(derived(record, system__host=f"node{i % 2}")))
    (tmp_path / "05-copy.json").write_text((tmp_path / "05.json").read_text())  # the same run twice
    (tmp_path / "17-bad.json").write_text(json.dumps(derived(record, metrics="fast")))
    v1 = derived(record, schema_version=1)
    v1["config"].update(v1["config"].pop("workload_options"))
    del v1["workload_identity"]
    for index, epoch in enumerate(v1["metrics"]["epochs"]):
        epoch["epoch"] = index
    v1["metrics"]["warmup"]["epoch"] = 0
    (tmp_path / "30-v1.json").write_text(json.dumps(v1))

    read = module._read_in_parallel(
        module.result_files([tmp_path]), 2
    )  # the readers summarise all but the bad one
    assert len(read) == 43 and [i for i, summary in enumerate(read) if summary is None] == [18]
    alone = load_records([tmp_path])
    monkeypatch.setattr(module, "PARALLEL_FROM", 1)
    monkeypatch.setattr(module, "_readers", lambda: 2)
    shared = load_records([tmp_path])
    assert [r.run_id for r in shared.records] == [r.run_id for r in alone.records] and len(
        alone.records
    ) == 41
    assert shared.records == alone.records
    assert shared.duplicates == alone.duplicates == [tmp_path / "05.json"]  # 05-copy.json sorts first
    assert shared.skipped == alone.skipped and [p.name for p, _ in shared.skipped] == ["17-bad.json"]
    for field in ("key", "system", "environment", "node_facts"):  # one copy of each distinct value, as alone
        values = [getattr(r, field) for r in shared.records]
        assert len({id(v) for v in values}) == len(set(values)), field
    with pytest.raises(ResultFileError, match="17-bad.json: invalid result record"):
        load_records([tmp_path], strict=True)


@pytest.mark.parametrize("command", ["compare", "report"])
@pytest.mark.slow
def test_compare_and_report_never_import_torch(record_file: Path, tmp_path: Path, command: str) -> None:
    if command == "report":
        pytest.importorskip("matplotlib")
    args = [str(record_file.parent)] + (["-o", str(tmp_path / "r.html")] if command == "report" else [])
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "accelbench.cli", command, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    imported = [
        line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if "import time:" in line
    ]
    assert "accelbench.compare" in imported
    heavy = ("accelbench.plugins", "accelbench.engine", "accelbench.workloads", "accelbench.backends")
    assert not [m for m in imported if m.split(".")[0] == "torch" or m.startswith(heavy)]
