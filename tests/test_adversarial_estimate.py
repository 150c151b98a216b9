"""`accelbench estimate` fed the odd and the hostile: every numeric flag below, at and past its bound, sizes no model
can have, and malformed or foreign files for --config, --measured and --comm. Each bad value is refused (exit 2)
with a message naming the flag, the value and what works, before anything is built; nothing is printed on stdout.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from core_support import TINY
from hostile_support import comm_record_text, hostile_files

from accelbench.cli import main
from accelbench.estimate.command import MAX_BUS_GBPS, MAX_RUNTIME_MIB, MAX_SCALE_TO
from accelbench.results import ResultRecord


def refused(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code = main(["estimate", *TINY, *args])
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert captured.out == "" and "Traceback" not in captured.err
    return " ".join(captured.err.split())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--scale-to", "-4"],
            "--scale-to -4: give device counts from 1 to 1048576, e.g. --scale-to 8 16 64",
        ),
        (["--scale-to", "0", "--bus-bandwidth", "10"], "--scale-to 0: give device counts from 1 to 1048576"),
        (
            ["--scale-to", str(MAX_SCALE_TO + 1), "--bus-bandwidth", "10"],
            "--scale-to 1048577: give device counts",
        ),
        (["--scale-to", "9" * 30], f"--scale-to {'9' * 30}: give device counts from 1 to 1048576"),
        (["--scale-to", "4"], "--scale-to needs the collectives' bus bandwidth at both device counts"),
        (
            ["--runtime-mib", "-5"],
            "--runtime-mib -5.0: give the MiB a process holds before the model, from 0 to",
        ),
        (["--runtime-mib", "nan"], "--runtime-mib nan: give the MiB"),
        (["--runtime-mib", "inf"], "--runtime-mib inf: give the MiB"),
        (["--runtime-mib", str(MAX_RUNTIME_MIB + 1)], "--runtime-mib 16777217.0: give the MiB"),
        (["--bus-bandwidth", "nan"], "--bus-bandwidth nan: give GB/s from 0.001 to 100000, e.g. 450"),
        (["--bus-bandwidth", "inf"], "--bus-bandwidth inf: give GB/s from 0.001 to 100000"),
        (["--bus-bandwidth", "0"], "--bus-bandwidth 0.0: give GB/s from 0.001 to 100000"),
        (["--bus-bandwidth", "1e-300"], "--bus-bandwidth 1e-300: give GB/s from 0.001"),
        (["--bus-bandwidth", str(MAX_BUS_GBPS * 10)], "--bus-bandwidth 1000000.0: give GB/s from 0.001"),
        (["--efficiency", "0"], "--efficiency 0.0: give a fraction above 0 and at most 1, e.g. 0.4"),
        (["--efficiency", "1.5"], "--efficiency 1.5: give a fraction above 0 and at most 1"),
        (["--efficiency", "nan"], "--efficiency nan: give a fraction above 0 and at most 1"),
        (
            ["--measured", "x.json"],
            "--measured x.json: starts --scale-to's prediction from a measured step time",
        ),
        (["--refresh-peak"], "--refresh-peak measures the peak again: give it with --measure-peak"),
        (["--comm", "x", "--bus-bandwidth", "1"], "give either --comm (measured records) or --bus-bandwidth"),
        (["--device", "H100", "--measure-peak"], "--measure-peak times the device here"),
        # the run options estimate shares (RunConfig's bounds), with the value given
        (["--seed", "-1"], "--seed: Input should be greater than or equal to 0 (got -1)"),
        (["--seed", str(2**64)], "--seed: Input should be less than or equal to 18446744073709551615"),
        (["--lr", "inf"], "--lr: Input should be a finite number (got inf)"),
        (["--peak-tflops", "nan"], "--peak-tflops: Input should be a finite number (got nan)"),
        (
            ["--collective-timeout", "1e12"],
            "--collective-timeout: Input should be less than or equal to 1000000000",
        ),
        (["--batch-size", "0"], "--batch-size: Input should be greater than 0 (got 0)"),
        # sizes no model in use has: refused by the bound, before the model is built
        (["--embd", "99999999998"], "--embd: Input should be less than or equal to 65536 (got 99999999998)"),
    ],
)
def test_numeric_flags_past_their_bounds_are_refused(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in refused(args, capsys)


def test_values_at_the_bounds_are_predicted(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--json", "--scale-to", "1", str(MAX_SCALE_TO), "--bus-bandwidth", str(MAX_BUS_GBPS),
            "--runtime-mib", str(MAX_RUNTIME_MIB), "--efficiency", "1",
            "--peak-tflops", "1"]  # fmt: skip  # a step time to scale from, whatever the session's cache holds
    assert main(["estimate", *TINY, *args]) == 0
    prediction = json.loads(capsys.readouterr().out)
    assert [s["devices_to"] for s in prediction["scaling"]] == [1, MAX_SCALE_TO]
    assert prediction["memory"]["runtime_bytes"] == MAX_RUNTIME_MIB * 2**20


@pytest.fixture(scope="module")
def hostile(tiny_run: tuple[ResultRecord, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    good = tiny_run[1]
    folder = tmp_path_factory.mktemp("hostile") / "records"
    hostile_files(folder, good)
    return folder


CONFIG_REASONS = {
    "truncated.json": "not JSON",
    "deep-list.json": "its JSON is nested too deeply",
    "huge-int.json": "Exceeds the limit (4300 digits)",
    "binary.json": "not JSON",
    "empty.json": "not JSON",
    "list.json": "expected a JSON object of run options or a result record",
    "comm-good.json": "a record of another kind (schema 'accelbench.comm'), not a run configuration",
    "to-dev-zero.json": "far too large to be a run configuration",
    "loop-a.json": "cannot read it: Too many levels of symbolic links",
    "a-folder.json": "is a folder; give a run configuration or a result record file",
    "v1-broken.json": "expected a JSON object of run options or a result record",
}


@pytest.mark.parametrize("name", sorted(CONFIG_REASONS))
def test_hostile_config_files_are_refused(
    name: str, hostile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(["--config", str(hostile / name)], capsys)
    assert f"--config {hostile / name}: " in err and CONFIG_REASONS[name] in err


MEASURED_REASONS = {
    "truncated.json": "not JSON",
    "deep-object.json": "nested too deeply",
    "huge-int.json": "Exceeds the limit (4300 digits)",
    "binary.json": "not JSON (not UTF-8 text",
    "newer.json": "newer than this accelbench reads",
    "comm-good.json": 'not an accelbench result record (no "schema": "accelbench.result")',
    "pipe.json": "not a regular file (a device, pipe or socket)",
    "to-dev-zero.json": "not a regular file (a device, pipe or socket)",
    "loop-b.json": "Too many levels of symbolic links",
    "a-folder.json": "a folder, not a result record",
}


@pytest.mark.parametrize("name", sorted(MEASURED_REASONS))
def test_hostile_measured_records_are_refused(
    name: str, hostile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(["--scale-to", "2", "--bus-bandwidth", "10", "--measured", str(hostile / name)], capsys)
    assert str(hostile / name) in err and MEASURED_REASONS[name] in err


def test_a_folder_of_hostile_comm_files_is_refused_naming_the_bad_record(
    hostile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pipe, a device, a loop of links and other kinds of records in the folder are passed over without blocking;
    the comm record whose bandwidth is NaN is named."""
    err = refused(["--devices", "2", "--strategy", "ddp", "--comm", str(hostile)], capsys)
    assert f"--comm: {hostile / 'comm-broken.json'}: invalid comm record: world_size" in err


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"busbw_gbps": float("nan")}, "busbw_gbps: nan is not a measured figure"),
        ({"busbw_gbps": -3.0, "algbw_gbps": -3.0}, "algbw_gbps: -3.0 is not a measured figure"),
        ({"size_bytes": 10**30, "count": 10**30}, "is not a message size (1 B to 1 PiB)"),
    ],
)
def test_comm_records_with_impossible_figures_are_refused(
    change: dict[str, float], reason: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """These once reached the bandwidth table's validation and ended in a pydantic traceback."""
    record = json.loads(comm_record_text())
    record["measurements"] = [{**record["measurements"][0], **change}]
    path = tmp_path / "comm.json"
    path.write_text(json.dumps(record))
    err = refused(["--devices", "2", "--strategy", "ddp", "--comm", str(path)], capsys)
    assert f"--comm: {path}: invalid comm record: measurements.0" in err and reason in err


def test_a_good_comm_record_among_others_predicts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "comm.json").write_text(comm_record_text())
    (tmp_path / "other.json").write_text('{"schema": "accelbench.result"}')  # another kind: passed over
    args = ["estimate", *TINY, "--devices", "2", "--strategy", "ddp", "--comm", str(tmp_path), "--json"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["comm_s"] is not None
