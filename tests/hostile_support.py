"""Hostile files for the adversarial tests: every kind of file named like a record that is no readable one, beside
a real record, and the reasons compare gives for skipping each; a comm record made by hand; a listing to see that
nothing was written. Shared by the compare, report, estimate and sweep modules (the same files, another reader).

A module of its own (not a test module) so that test modules import it by a name no plugin's tests share.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

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


def comm_record(measurements: list[Any], sizes: list[int], run_id: str = "c0mm" * 4) -> Any:
    """A CommRecord of a 2-rank fp32 all_reduce run over gloo, as `accelbench comm` writes one, holding
    ``measurements`` (made here: a real one needs a 2-process job)."""
    from datetime import datetime, timezone

    from accelbench.comm.records import CommConfig, CommRecord
    from accelbench.contract import BackendInfo
    from accelbench.results import BackendRecord, Outcome
    from accelbench.system import collect_system_info

    return CommRecord(
        run_id=run_id,
        created_at=datetime.now(timezone.utc),
        outcome=Outcome(status="ok"),
        config=CommConfig(
            ops=["all_reduce"],
            dtypes=["fp32"],
            sizes=sizes,
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
        measurements=measurements,
    )


def comm_record_text(run_id: str = "c0mm" * 4) -> str:
    """A comm record's file text, one 1 KiB in-place all_reduce measured."""
    from accelbench.comm.records import CommMeasurement

    measurement = CommMeasurement(
        op="all_reduce", dtype="fp32", variant="in-place", size_bytes=1024, count=256, requested_bytes=1024,
        status="ok", iters=1, time_us=10.0, algbw_gbps=0.1, busbw_gbps=0.1, bus_factor=1.0,
    )  # fmt: skip
    return str(comm_record([measurement], [1024], run_id).to_json())


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
