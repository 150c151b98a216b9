"""`accelbench comm`: collective bandwidth over a real 2-process gloo job, the correctness check, the record, bad
input, and `compare`/`report` of comm records.

The second system in the compare and report tests is DERIVED from the measured record by editing its JSON (another
host name, bus bandwidth doubled): it is labelled as derived and is never presented as a measurement.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from core_support import TINY, accelbench

from accelbench.cli import main
from accelbench.comm.collectives import COLLECTIVES, OPS, size_label
from accelbench.comm.options import parse_size, size_series
from accelbench.comm.records import CommConfig, CommRecord, read_comm_record
from accelbench.comm.run import Case, Job, Measuring, count_wrong, measure, tolerance
from accelbench.errors import ConfigError, ResultFileError
from accelbench.launch import LaunchEnv
from accelbench.plugins import get_host

SIZES = "64,4KiB,1MiB"
DERIVED_HOST = "derived-from-measured-not-a-measurement"


# --------------------------------------------------------------------------------------------------------------
# A real job: 2 gloo processes through the same launcher as `run --devices 2`
# --------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    folder = tmp_path_factory.mktemp("comm")
    proc = accelbench(
        "comm", "--devices", "2", "--ops", "all", "--dtypes", "fp32,bf16", "--sizes", SIZES,
        "--warmup", "1", "--iters", "3", "--output-dir", str(folder),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (path,) = folder.glob("*.json")
    return path, proc


@pytest.mark.slow
def test_every_collective_is_measured_checked_and_recorded(
    measured: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    path, proc = measured
    record = read_comm_record(path)
    assert record.outcome.status == "ok", record.outcome
    assert (record.world_size, record.launcher, record.backend.collective_backend) == (2, "torchrun", "gloo")
    assert record.backend.info.name == "cpu" and record.system.torch_version == torch.__version__
    seen = {(m.op, m.dtype, m.variant) for m in record.measurements}
    expected = {(op, dtype, v) for op in OPS for dtype in ("fp32", "bf16") for v in COLLECTIVES[op].variants}
    assert seen == expected  # out-of-place and in-place wherever torch offers both
    for m in record.measurements:
        assert m.status == "ok" and m.wrong == 0, m  # every result checked, none wrong
        assert m.iters == 3 and m.time_us_min <= m.time_us <= m.time_us_max  # type: ignore[operator]
        assert m.algbw_gbps == pytest.approx(m.size_bytes / (m.time_us * 1e-6) / 1e9)  # type: ignore[operator]
        factor = {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "all_to_all": 0.5}.get(
            m.op, 1.0
        )
        assert m.bus_factor == factor  # nccl-tests' factors at n = 2
        assert m.busbw_gbps / m.algbw_gbps == pytest.approx(factor, rel=1e-12)  # type: ignore[operator]
    # sizes as asked, the array rounded to whole elements per rank
    assert sorted({m.requested_bytes for m in record.measurements}) == [64, 4096, 2**20]
    assert {m.count for m in record.measurements if m.op == "all_gather" and m.dtype == "bf16"} == {
        32,
        2048,
        2**19,
    }
    # the record round-trips and is what the schema says
    assert CommRecord.model_validate_json(record.to_json()) == record
    assert json.loads(path.read_text())["schema"] == "accelbench.comm"
    # nccl-tests' table on stdout: both variants' columns, a line per size, the peak per collective
    assert "#wrong" in proc.stdout and "busbw" in proc.stdout and "out-of-place" in proc.stdout
    assert proc.stdout.count("# peak bus bandwidth") == len(OPS) * 2
    assert f"{2**20:>12} {2**18:>12}   fp32    sum    -1" in proc.stdout  # all_reduce at 1 MiB


@pytest.mark.slow
def test_in_step_times_over_two_processes_price_the_estimates_collectives(tmp_path: Path) -> None:
    """A real 2-process job with --in-step: every size of the strategies' variant timed after each compute length,
    the compute near what was asked, the record saying how it was timed; `accelbench estimate --comm` then prices
    FSDP's gathers and reduce-scatters on this CPU at those times (the sibling all_gather's for reduce_scatter)."""
    folder = tmp_path / "comm"
    proc = accelbench(
        "comm", "--devices", "2", "--ops", "all_gather,all_reduce", "--sizes", "64KiB,1MiB", "--warmup", "1",
        "--iters", "3", "--in-step", "10,2", "--burst", "4", "--output-dir", str(folder),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (path,) = folder.glob("*.json")
    record = read_comm_record(path)
    assert record.config.in_step_ms == [2.0, 10.0] and "slower rank" in (record.in_step_timing or "")
    for m in record.measurements:
        if m.variant != COLLECTIVES[m.op].variants[0]:
            assert m.in_step == []
            continue
        ratios = [t.compute_ms / asked for t, asked in zip(m.in_step, (2.0, 10.0), strict=True)]
        assert all(0.3 < r < 3 for r in ratios), ratios  # sized from a probe; a shared host moves it
        assert all(t.time_us > 0 and t.alone_us == m.time_us for t in m.in_step)
        assert m.burst_us is not None and m.burst_us > 0
    assert record.config.burst == 4
    assert proc.stdout.count("in step (") == 4  # a line under each of the 4 rows (2 collectives x 2 sizes)
    assert proc.stdout.count("a call in a burst") == 4

    estimate = accelbench(
        "estimate", "--model", "gpt-nano", "--strategy", "fsdp", "--devices", "2", "--peak-tflops", "0.05",
        "--comm", str(folder), "--json",
    )  # fmt: skip
    assert estimate.returncode == 0, estimate.stderr
    prediction = json.loads(estimate.stdout)
    prediction = prediction.get("prediction", prediction)
    assert {op["op"] for op in prediction["comm"]} == {"all_gather", "reduce_scatter"}
    for op in prediction["comm"]:
        assert op["bandwidth_source"].startswith("in step: all_gather fp32 over 2 ranks"), op
    assert any("accelbench comm --in-step" in a for a in prediction["assumptions"])
    # ZeRO-3's gathers of its persistent tensors (every gpt-nano tensor): one burst, its calls after the first
    # priced at a call's time in the bursts measured
    estimate = accelbench(
        "estimate", "--model", "gpt-nano", "--strategy", "deepspeed-zero3", "--devices", "2", "--peak-tflops",
        "0.05", "--comm", str(folder), "--json",
    )  # fmt: skip
    assert estimate.returncode == 0, estimate.stderr
    prediction = json.loads(estimate.stdout)
    prediction = prediction.get("prediction", prediction)
    (burst,) = [op for op in prediction["comm"] if op["burst"]]
    assert "back to back, as a burst: all_gather fp32 over 2 ranks" in burst["bandwidth_source"], burst
    assert "measured in bursts of 4 calls" in burst["bandwidth_source"]


# --------------------------------------------------------------------------------------------------------------
# The correctness check: every collective's expected values, emulated in one process for 3 ranks
# --------------------------------------------------------------------------------------------------------------


def _emulate(op: str, cases: list[Case]) -> None:
    """Write into each rank's result buffer what the collective would leave there, from every rank's input."""
    inputs = [case.fills[0][0].clone() for case in cases]
    n = len(cases)
    for r, case in enumerate(cases):
        if case.checked is None:
            continue
        out = case.checked[0]
        c = out.numel() // n if op in ("all_gather", "all_to_all") else out.numel()
        if op in ("all_reduce", "reduce"):
            out.copy_(sum(inputs))
        elif op == "all_gather":
            out.copy_(torch.cat(inputs))
        elif op == "reduce_scatter":
            out.copy_(sum(inputs)[r * c : (r + 1) * c])
        elif op == "broadcast":
            out.copy_(inputs[0])
        elif op == "all_to_all":
            out.copy_(torch.cat([inp[r * c : (r + 1) * c] for inp in inputs]))
        elif op == "sendrecv":
            out.copy_(inputs[(r - 1) % n])


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_check_passes_a_right_result_and_counts_every_wrong_element(op: str, dtype: torch.dtype) -> None:
    collective, ranks = COLLECTIVES[op], 3
    for variant in collective.variants:
        count = collective.count(3 * 1000, "fp32", ranks)
        cases = [Case(collective, variant, dtype, count, r, ranks, torch.device("cpu")) for r in range(ranks)]
        for case in cases:
            case.fill()
        _emulate(op, cases)
        assert [case.wrong() for case in cases] == [0] * ranks, variant
        target = next(case for case in reversed(cases) if case.checked is not None)  # reduce: the root's
        assert target.checked is not None
        result = target.checked[0]
        result[7] += 1  # a deliberately wrong result: one element off by one
        result[-1] = float("nan")  # and one NaN
        assert target.wrong() == 2, variant


def test_count_wrong_and_the_tolerance_of_each_type() -> None:
    result = torch.arange(10, dtype=torch.float32)
    assert count_wrong(result, lambda k: k.to(torch.float32)) == 0
    result[3] = 100
    assert count_wrong(result, lambda k: k.to(torch.float32)) == 1
    assert tolerance(torch.bfloat16, 128, reduces=True) == 0.0  # sums up to 256: exact in bf16
    assert tolerance(torch.bfloat16, 256, reduces=True) > 0.0
    assert tolerance(torch.float16, 1024, reduces=True) == 0.0
    assert tolerance(torch.bfloat16, 4096, reduces=False) == 0.0  # copies are always exact


# --------------------------------------------------------------------------------------------------------------
# What a wrong result, a size too large and a refused collective become (one in-process rank: the decisions)
# --------------------------------------------------------------------------------------------------------------


@pytest.fixture
def one_rank() -> Iterator[Job]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    config = CommConfig(ops=["all_reduce"], dtypes=["fp32"], sizes=[64, 1024, 4096], warmup=1, iters=2, check=True,
                        devices=2, nnodes=1, collective_timeout=30)  # fmt: skip
    try:
        yield Job(config, get_host().select_backend("cpu"), torch.device("cpu"), LaunchEnv("none"))
    finally:
        dist.destroy_process_group()


def test_a_wrong_result_is_a_failure_with_no_bandwidth(
    one_rank: Job, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_run = Case.run

    def corrupting(self: Case) -> None:  # the collective "returns" one element off at 1 KiB
        real_run(self)
        if self.count == 256 and self.checked is not None:
            self.checked[0][5] += 3

    monkeypatch.setattr(Case, "run", corrupting)
    rows: list[object] = []
    measurements, outcome = measure(one_rank, rows.append)
    wrong = [m for m in measurements if m.status == "wrong"]
    assert [(m.op, m.size_bytes, m.wrong) for m in wrong] == [("all_reduce", 1024, 1)]
    assert wrong[0].busbw_gbps is None and wrong[0].algbw_gbps is None
    assert [m.status for m in measurements if m is not wrong[0]] == ["ok", "ok"]
    assert outcome.status == "error" and "wrong results: all_reduce fp32 1 KiB in-place (1 elements)" in (
        outcome.message or ""
    )
    assert len(rows) == 3  # every size was handed to the table as it finished


def test_sizes_that_do_not_fit_and_refused_collectives_are_recorded(
    one_rank: Job, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        Measuring, "host_room", lambda self: 2000
    )  # 64 B fits; 1 KiB with its scratch does not
    measurements, outcome = measure(one_rank, lambda row: None)
    assert [m.status for m in measurements] == ["ok", "oom", "oom"]
    assert "needs" in (measurements[1].message or "") and "not attempted" in (measurements[2].message or "")
    assert outcome.status == "ok" and "out of memory" in (outcome.message or "")

    monkeypatch.undo()
    monkeypatch.setattr(Case, "run", lambda self: (_ for _ in ()).throw(RuntimeError("type not supported")))
    measurements, outcome = measure(one_rank, lambda row: None)
    assert [m.status for m in measurements] == ["unsupported"] * 3
    assert "type not supported" in (measurements[0].message or "")


def test_an_interrupted_job_keeps_the_sizes_measured(one_rank: Job, monkeypatch: pytest.MonkeyPatch) -> None:
    from accelbench.engine.signals import RunInterrupted

    real_run = Case.run

    def stopped_at_4_kib(self: Case) -> None:  # SIGTERM arrives while the third size is measured
        if self.count == 1024:
            raise RunInterrupted()
        real_run(self)

    monkeypatch.setattr(Case, "run", stopped_at_4_kib)
    measurements, outcome = measure(one_rank, lambda row: None)
    assert [(m.size_bytes, m.status) for m in measurements] == [(64, "ok"), (1024, "ok")]
    assert outcome.status == "interrupted" and "after 2 measurement(s)" in (outcome.message or "")


def test_in_step_times_follow_the_asked_compute_and_only_the_strategies_variant(one_rank: Job) -> None:
    """--in-step times each size's call after about the asked milliseconds of products (measured, the same count on
    every rank), for the variant strategies run only (all_reduce's in-place; out-of-place where both are offered),
    with the call's time alone beside it; the record still validates, and the table prints the line."""
    import io

    from accelbench.comm.render import TablePrinter

    one_rank.config = one_rank.config.model_copy(
        update={"in_step_ms": [2.0, 8.0], "ops": ["all_reduce", "all_gather"]}
    )
    rows: list[Any] = []
    measurements, outcome = measure(one_rank, rows.append)
    assert outcome.status == "ok"
    for m in measurements:
        if m.variant != COLLECTIVES[m.op].variants[0]:
            assert m.in_step == []  # all_gather in place: not what a strategy runs
            continue
        short, long = m.in_step
        assert (
            0.5 < short.compute_ms < 8 and 2 < long.compute_ms < 32 and long.compute_ms > 2 * short.compute_ms
        )
        assert short.time_us >= 0 and long.time_us >= 0 and short.alone_us == m.time_us
    out = io.StringIO()
    printer = TablePrinter(out, 1)
    for row in rows:
        printer.row(row)
    assert out.getvalue().count("in step (") == len(rows)
    assert "ms of compute" in out.getvalue()


def test_a_burst_is_timed_for_the_strategies_variant_and_validates(one_rank: Job) -> None:
    """--burst N times each size's call within N calls issued back to back (async) and then waited for, as ZeRO-3
    gathers its persistent tensors, for the variant strategies run only, every collective (sendrecv's pair of
    calls too); the record validates, says so in its config, and the table prints the time under each row."""
    import io

    from hostile_support import comm_record

    from accelbench.comm.options import implausible
    from accelbench.comm.render import TablePrinter

    one_rank.config = one_rank.config.model_copy(update={"burst": 4, "ops": list(COLLECTIVES)})
    rows: list[Any] = []
    measurements, outcome = measure(one_rank, rows.append)
    assert outcome.status == "ok" and sum(m.burst_us is not None for m in measurements) >= 5
    for m in measurements:
        if m.variant != COLLECTIVES[m.op].variants[0] or m.status != "ok":  # sendrecv needs a peer
            assert m.burst_us is None
        else:
            assert m.burst_us is not None and m.burst_us > 0, m
    out = io.StringIO()
    printer = TablePrinter(out, 1)
    for row in rows:
        printer.row(row)
    assert out.getvalue().count("a call in a burst") == sum(any(m.burst_us for m in row) for row in rows)
    timed = next(m for m in measurements if m.burst_us is not None)
    assert implausible(comm_record([timed], [timed.size_bytes])) is None
    bad = timed.model_copy(update={"burst_us": float("inf")})
    assert "burst_us: inf is not a measured figure" in (
        implausible(comm_record([bad], [bad.size_bytes])) or ""
    )


# --------------------------------------------------------------------------------------------------------------
# Input: sizes, names, jobs that cannot measure; records that are not records
# --------------------------------------------------------------------------------------------------------------


def test_message_sizes_as_people_write_them() -> None:
    assert [parse_size(t) for t in ("8", "1KiB", "1K", "1KB", "64MiB", "1.5k", "2GiB")] == [
        8, 1024, 1024, 1000, 64 * 2**20, 1536, 2 * 2**30,
    ]  # fmt: skip
    assert size_series(8, 1024, 2) == [8, 16, 32, 64, 128, 256, 512, 1024]
    assert size_series(1000, 10000, 3) == [1000, 3000, 9000]  # the last size not above the maximum
    assert size_label(2**20) == "1 MiB" and size_label(1536) == "1.5 KiB"
    assert COLLECTIVES["all_gather"].count(8, "fp32", 4) == 4  # at least one element per rank
    with pytest.raises(ConfigError, match="larger than --max-bytes"):
        size_series(2048, 1024, 2)
    with pytest.raises(ConfigError, match="above 1"):
        size_series(8, 1024, 1.0)
    with pytest.raises(ConfigError, match="not a size"):
        parse_size("12 parsecs")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ops", "all_reduce,allreduce"], "unknown op 'allreduce'; choose from: all_reduce"),
        (["--dtypes", "fp8"], "unknown dtype 'fp8'; choose from: fp32, bf16, fp16"),
        (
            ["--min-bytes", "1MiB", "--max-bytes", "1KiB"],
            "--min-bytes 1 MiB is larger than --max-bytes 1 KiB",
        ),
        (["--iters", "0"], "--iters 0: at least 1 timed iteration"),
        (["--in-step", "0"], "--in-step 0: 0 ms is not a step's compute between two collectives"),
        (["--in-step", "5,-1"], "--in-step 5,-1: -1 ms is not a step's compute"),
        (["--in-step", "5,fast"], "'fast' is not a number of milliseconds; give e.g. --in-step 5,20,80"),
        (["--in-step", "nan"], "nan ms is not a step's compute"),
        (["--in-step", "1,2,3,4,5,6,7,8,9"], "at most 8 compute lengths"),
        (["--burst", "1"], "--burst 1: a burst is 2 to 1024 calls issued back to back"),
        (["--burst", "-3"], "--burst -3: a burst is 2 to 1024 calls"),
        (["--devices", "1"], "collective bandwidth needs 2 or more ranks, and this job has 1"),
        pytest.param(
            ["--backend", "ipu"],
            "backend 'ipu' has no torch.distributed collective backend",
            marks=pytest.mark.needs_plugin("accelbench-ipu", why="the refusal is of its backend"),
        ),
    ],
)
def test_bad_input_is_refused_before_anything_runs(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    devices = [] if "--devices" in args else ["--devices", "2"]
    code = main(["comm", *devices, *args, "--output-dir", str(tmp_path / "out")])
    assert code == 2
    assert message in " ".join(capsys.readouterr().err.split())
    assert not list(tmp_path.rglob("*.json"))


def test_help_imports_no_torch() -> None:
    code = (
        "import sys; from accelbench.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "False"


def test_malformed_and_hostile_files_are_refused(
    measured: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = json.loads(measured[0].read_text())
    cases = {
        "nested.json": "[" * 100_000 + "]" * 100_000,
        "notjson.json": "{not json",
        "result.json": json.dumps({"schema": "accelbench.result", "schema_version": 2}),
        "newer.json": json.dumps({**raw, "schema_version": 99}),
        "invalid.json": json.dumps({**raw, "world_size": "two"}),
        "large.json": json.dumps(raw) + " " * 2**20,
    }
    reasons = {
        "nested.json": "nested too deeply",
        "notjson.json": "not JSON",
        "result.json": "not an accelbench comm record",
        "newer.json": "newer than this accelbench reads",
        "invalid.json": "invalid comm record: world_size",
        "large.json": "far too large to be a comm record",
    }
    monkeypatch.setattr("accelbench.results.MAX_RECORD_BYTES", 2**20)  # a 1 MiB guard, for a small test file
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(ResultFileError, match=reasons[name]):
            read_comm_record(tmp_path / name)


# --------------------------------------------------------------------------------------------------------------
# compare and report: the measured record beside one DERIVED from it (twice the bus bandwidth, another host)
# --------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_systems(
    measured: tuple[Path, subprocess.CompletedProcess[str]], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    root = tmp_path_factory.mktemp("systems")
    (root / "a-measured").mkdir()  # first in path order: the baseline
    (root / "b-derived").mkdir()
    (root / "a-measured" / measured[0].name).write_text(measured[0].read_text())
    raw = json.loads(measured[0].read_text())
    raw["run_id"] = "derived0" + raw["run_id"][8:]
    raw["system"]["host"] = DERIVED_HOST  # DERIVED for the test, not measured
    for m in raw["measurements"]:
        if m["busbw_gbps"] is not None:
            m["busbw_gbps"] *= 2
            m["algbw_gbps"] *= 2
            m["time_us"] /= 2
    (root / "b-derived" / "derived.json").write_text(json.dumps(raw))
    return root


def test_compare_puts_bandwidth_curves_side_by_side_with_ratios(
    two_systems: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compare", str(two_systems), "--format", "json", "--label-by", "host"]) == 0
    data = json.loads(capsys.readouterr().out)["collectives"]
    assert len(data["systems"]) == 2 and data["baseline"] != f"{DERIVED_HOST} x2"
    derived = [p for p in data["points"] if p["system"] == f"{DERIVED_HOST} x2"]
    assert len(derived) == (len(OPS) + 2) * 2 * 3  # 7 collectives (2 in both variants) x 2 types x 3 sizes
    assert all(p["vs_baseline"] == pytest.approx(2.0) for p in derived)
    peaks = {t["op"]: t["peaks"][f"{DERIVED_HOST} x2"]["vs_baseline"] for t in data["tables"]}
    assert set(peaks) == set(OPS) and all(r == pytest.approx(2.0) for r in peaks.values())

    assert main(["compare", str(two_systems), "--label-by", "host"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "all_reduce · fp32 · in-place: bus bandwidth (GB/s)" in out and "×2.00" in out and "peak" in out
    assert "not an accelbench result record" not in out


@pytest.mark.slow
def test_comm_and_training_records_together(
    two_systems: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    proc = accelbench(
        "run", *TINY, "--epochs", "2", "--steps-per-epoch", "2", "--output-dir", str(tmp_path), "-q"
    )
    assert proc.returncode == 0, proc.stderr
    assert main(["compare", str(two_systems), str(tmp_path), "--format", "markdown"]) == 0
    captured = capsys.readouterr()
    assert "skipped" not in captured.err  # comm records are routed to their comparison, not skipped as noise
    assert "# accelbench comparison" in captured.out and "# Collective bandwidth" in captured.out
    assert main(["compare", str(two_systems), str(tmp_path), "--format", "csv"]) == 2
    assert "compare them apart" in capsys.readouterr().err
    pytest.importorskip("matplotlib")
    assert main(["report", str(two_systems), str(tmp_path), "-o", str(tmp_path / "mixed.html")]) == 0
    page = (tmp_path / "mixed.html").read_text()
    assert 'id="bandwidth"' in page and 'id="overview"' in page


@pytest.mark.slow
def test_report_draws_bus_bandwidth_against_message_size(two_systems: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from accelbench.report.html import build_comm_report

    out = tmp_path / "report.html"
    assert (
        main(
            [
                "report",
                str(two_systems),
                "-o",
                str(out),
                "--figures",
                str(tmp_path / "figs"),
                "--label-by",
                "host",
            ]
        )
        == 0
    )
    page = out.read_text()
    assert "Bus bandwidth against message size" in page and DERIVED_HOST in page
    assert (
        page.count("<h3>Bus bandwidth (GB/s):") == len(OPS) * 2 + 2 * 2
    )  # a table per collective x type x variant
    (figure,) = (tmp_path / "figs").glob("*.svg")
    svg = figure.read_text()
    assert "all_reduce" in svg and "message size" in svg and "1 MiB" in svg
    assert callable(build_comm_report)
