"""`accelbench compare --vs AXIS`: runs that differ in one workload field side by side, from real CPU runs in fp32
and bf16-mixed (and copies of them changed where a CPU cannot produce the data: a second host, energy readings)."""

from __future__ import annotations

import csv
import io
import json
import statistics
from pathlib import Path

import pytest
from core_support import TINY, RealRuns, accelbench, derived

from accelbench.cli import main
from accelbench.compare import compare, load_records
from accelbench.errors import AccelbenchError

PRECISIONS = ("fp32", "bf16-mixed")


@pytest.fixture(scope="module")
def runs(real_runs: RealRuns) -> Path:
    """Two real runs of one workload on this CPU, in fp32 and in bf16-mixed."""
    return real_runs.folder(
        *(
            [*TINY, "--precision", precision, "--epochs", "4", "--steps-per-epoch", "2"]
            for precision in PRECISIONS
        )
    )


def record_of(folder: Path, precision: str) -> dict:
    return next(
        r
        for p in sorted(folder.glob("*.json"))
        if (r := json.loads(p.read_text()))["config"]["precision"] == precision
    )


def steady_walls(record: dict) -> list[float]:
    return [e["wall_s"] for e in record["metrics"]["epochs"][1:]]


@pytest.mark.slow
def test_precisions_share_one_table_with_ratios_against_the_baseline_precision(runs: Path) -> None:
    fp32, bf16 = (record_of(runs, p) for p in PRECISIONS)
    records = load_records([runs])
    assert len(compare(records).groups) == 2  # without --vs, each precision is a workload of its own

    comparison = compare(records, vs="precision")
    (group,) = comparison.groups
    assert comparison.axis == group.axis == "precision" and group.baseline_value == "fp32"
    assert group.values == ["fp32", "bf16-mixed"]  # the natural order, not the order the files were read in
    base, other = group.cells
    assert (base.value, other.value) == PRECISIONS and base.system == other.system
    assert base.baseline is None
    speedup = statistics.median(steady_walls(fp32)) / statistics.median(steady_walls(bf16))
    assert other.baseline.speedup == pytest.approx(speedup)
    assert other.baseline.memory_ratio == pytest.approx(
        bf16["metrics"]["peak_memory_max_bytes"] / fp32["metrics"]["peak_memory_max_bytes"]
    )
    assert other.baseline.verdict == "too few measurements"  # 3 vs 3 epochs can never reach p < 0.05
    assert "by precision" in group.describe() and "fp32" not in group.describe()

    flipped = compare(records, vs="precision", vs_baseline="bf16-mixed")
    fp32_cell = next(c for c in flipped.groups[0].cells if c.value == "fp32")
    assert fp32_cell.baseline.speedup == pytest.approx(1 / speedup)


def test_every_output_format_along_an_axis(runs: Path, capsys) -> None:
    assert main(["compare", str(runs), "--vs", "precision", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (group,) = data["groups"]
    assert data["vs"] == group["vs"] == "precision" and group["baseline"] == "precision=fp32"
    assert "precision" not in group["workload"]  # it varies within the group
    assert [c["value"] for c in group["cells"]] == list(PRECISIONS)
    assert group["cells"][0]["vs_baseline"] is None and group["cells"][1]["vs_baseline"]["speedup"] > 0
    speedup = group["cells"][1]["vs_baseline"]["speedup"]

    assert main(["compare", str(runs), "--vs", "precision", "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["compared_along"], r["value"], r["precision"]) for r in rows] == [
        ("precision", p, p) for p in PRECISIONS
    ]
    assert {r["baseline"] for r in rows} == {"precision=fp32"}
    assert rows[0]["speedup_vs_baseline"] == "" and float(rows[1]["speedup_vs_baseline"]) == pytest.approx(
        speedup
    )
    assert rows[0]["joules_per_sample"] == ""  # the CPU's energy is unknown: empty, never 0

    assert main(["compare", str(runs), "--vs", "precision", "--format", "markdown"]) == 0
    markdown = capsys.readouterr().out
    assert "| system | devices | precision | runs |" in markdown
    assert "| 1 | fp32 | 1 ok" in markdown and "| 1 | bf16-mixed | 1 ok" in markdown
    assert "J/sample" not in markdown and "vs baseline system" not in markdown  # no energy, one system

    assert main(["compare", str(runs), "--vs", "precision", "--vs-baseline", "bf16-mixed"]) == 0
    table = capsys.readouterr().out
    assert "by precision" in table and "baseline" in table and f"×{1 / speedup:.2f}" in table


def test_axis_choices_and_refusals(runs: Path, capsys) -> None:
    records = load_records([runs])
    assert compare(records, vs="batch-size").groups[0].axis == "batch_size"  # spelled as the flag, too
    assert compare(records, vs="block_size").groups[0].values == [16]  # a workload identity entry
    assert main(["compare", str(runs), "--vs", "colour"]) == 2
    err = capsys.readouterr().err
    assert "--vs 'colour': not a workload field" in err and "precision" in err and "block_size" in err
    assert main(["compare", str(runs), "--vs", "precision", "--vs-baseline", "fp16-mixed"]) == 2
    assert "the values are: fp32, bf16-mixed" in capsys.readouterr().err
    with pytest.raises(AccelbenchError, match="--vs-baseline needs --vs"):
        compare(records, vs_baseline="fp32")


def test_batch_sizes_on_two_systems(runs: Path, tmp_path: Path) -> None:
    """--vs batch_size over two hosts: numbers in numeric order, and each cell also against the baseline system."""
    fp32 = record_of(runs, "fp32")
    for host in ("alpha", "beta"):
        for batch in (16, 8, 128):  # written out of order
            (tmp_path / f"{host}-{batch}.json").write_text(
                json.dumps(derived(fp32, system__host=host, config__batch_size=batch))
            )
    comparison = compare(load_records([tmp_path]), label_by=("host",), baseline="beta", vs="batch_size")
    (group,) = comparison.groups
    assert group.values == [8, 16, 128] and group.baseline_value == 8
    assert [(c.system, c.value) for c in group.cells] == [
        (host, batch) for host in ("alpha", "beta") for batch in (8, 16, 128)
    ]
    # same epochs in every copy: every ratio is 1, against the value and against the system
    alpha_16 = group.cells[1]
    assert alpha_16.baseline.speedup == pytest.approx(1.0) and alpha_16.vs_system.speedup == pytest.approx(
        1.0
    )
    assert all(c.vs_system is None for c in group.cells if c.system == "beta")
    text = compare_text(tmp_path, "--label-by", "host", "--baseline", "beta", "--vs", "batch_size")
    assert "vs baseline system" in text


def test_energy_per_sample_is_a_column_when_known(runs: Path, tmp_path: Path, capsys) -> None:
    fp32 = record_of(runs, "fp32")
    epochs = [
        dict(e, energy_j=2.5 * e["samples"], joules_per_sample=2.5, samples_per_joule=0.4)
        for e in fp32["metrics"]["epochs"]
    ]
    (tmp_path / "metered.json").write_text(
        json.dumps(derived(fp32, system__host="metered", metrics__epochs=epochs))
    )
    (tmp_path / "unmetered.json").write_text(json.dumps(fp32))

    comparison = compare(load_records([tmp_path]), label_by=("host",))
    assert comparison.has_energy
    cells = {c.system: c for c in comparison.groups[0].cells}
    assert cells["metered"].joules_per_sample.median == pytest.approx(2.5)
    assert cells[fp32["system"]["host"]].joules_per_sample is None

    assert main(["compare", str(tmp_path), "--label-by", "host", "--format", "markdown"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("| system |")).split(" | ")
    metered = next(line for line in lines if line.startswith("| metered |")).split(" | ")
    unmetered = next(line for line in lines if line.startswith(f"| {fp32['system']['host']} |")).split(" | ")
    column = header.index("J/sample")
    assert metered[column].startswith("2.5 ") and unmetered[column] == "-"
    assert main(["compare", str(tmp_path / "unmetered.json"), "--format", "markdown"]) == 0
    assert "J/sample" not in capsys.readouterr().out  # shown only when some run has it


def compare_text(*args: object) -> str:
    proc = accelbench("compare", *map(str, args))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_files_given_one_by_one_that_differ_in_one_field_share_one_table(runs: Path, capsys) -> None:
    """`compare A.json B.json` of two precisions: one table along precision, one baseline, and a line saying why;
    the folder given whole keeps a table per workload (choose with --vs)."""
    files = sorted(str(p) for p in runs.glob("*.json"))
    assert main(["compare", *files, "--format", "json"]) == 0
    captured = capsys.readouterr()
    assert "the files given differ only in precision" in " ".join(captured.err.split())
    out = json.loads(captured.out)
    assert out["vs"] == "precision" and len(out["groups"]) == 1
    assert main(["compare", str(runs), "--format", "json"]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert whole["vs"] is None and len(whole["groups"]) == 2
