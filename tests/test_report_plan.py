"""`accelbench report` on a plan (`accelbench plan --json`): told from result records by its schema, a section with
the candidates ranked, predicted peak memory against the device's, what was dropped and why, and (slow, real
2-process runs) the predicted against measured throughput with Spearman's correlation; a file that says it is a
plan but is not a valid one is refused with what is wrong."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from core_support import accelbench, run_here

from accelbench.cli import main
from accelbench.plan.schema import Plan

ROOT = Path(__file__).resolve().parents[1]
# a device from the plugins' tables, too small for gpt2-medium's larger fp32 batches: some ranked, some dropped
SMALL_DEVICE = ["--model", "gpt2-medium", "--precisions", "fp32,fp16-mixed", "--batch-sizes", "1,8,32,128",
                "--device", "V100-16GB"]  # fmt: skip


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`accelbench plan ... --json > plan.json`, as a user writes it."""
    done = accelbench("plan", *SMALL_DEVICE, "--json", cwd=ROOT)
    assert done.returncode == 0, done.stderr
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    path.write_text(done.stdout)
    return path


def text_of(page: str) -> str:
    """The page's text, figures left out, entities undone."""
    return html.unescape(re.sub(r'src="data:[^"]+"', "", page))


def table(page: str, css: str) -> list[list[str]]:
    """The rows (cells' text) of the table with class ``css``."""
    body = re.search(rf'<table class="{css}">.*?<tbody>(.*?)</tbody>', page, re.S)
    assert body, css
    return [
        [html.unescape(cell) for cell in re.findall(r"<td>(.*?)</td>", row)]
        for row in re.findall(r"<tr>(.*?)</tr>", body.group(1))
    ]


def test_a_plan_alone_is_a_page_of_its_ranking(plan_file: Path, tmp_path: Path) -> None:
    plan = Plan.model_validate_json(plan_file.read_text())
    assert plan.ranked and plan.dropped  # the configuration makes both
    out = tmp_path / "report.html"
    assert main(["report", str(plan_file), "-o", str(out)]) == 0
    page = out.read_text()
    ranked = table(page, "plan-ranked")
    assert [row[1] for row in ranked] == [r.label for r in plan.ranked]  # best first, every one
    assert [row[0] for row in ranked] == [str(i) for i in range(1, len(plan.ranked) + 1)]
    assert all(row[-1].startswith("accelbench run ") for row in ranked)  # each a runnable command
    assert ranked[0][-1] == plan.ranked[0].command
    # the predicted peak against the device's memory, as a share
    top = plan.ranked[0]
    assert top.peak_memory_bytes and top.device_memory_bytes
    assert ranked[0][5] == f"{top.peak_memory_bytes / top.device_memory_bytes:.0%}"
    dropped = table(page, "plan-dropped")
    assert [row[0] for row in dropped] == [r.label for r in plan.dropped]
    assert all("predicted peak" in row[3] and row[2] == "16.0 GiB" for row in dropped)
    text = text_of(page)
    assert "Plan for gpt2-medium: predicted throughput against predicted peak memory" in text
    assert "device memory" in text and text.count("<figure") == 1  # nothing measured: no second figure
    assert "Predicted against measured" not in text


def test_a_plan_beside_records_is_a_section_of_their_report(plan_file: Path, tmp_path: Path) -> None:
    """A real run's record and the plan: the records' report, with the plan's section and its link."""
    records = tmp_path / "records"
    assert run_here("--model", "custom", "--layers", "1", "--embd", "16", "--heads", "2", "--block-size", "16",
                    "--batch-size", "8", "--epochs", "1", "--steps-per-epoch", "2", "--no-tensor-peak",
                    "--output-dir", str(records), "-q") == 0  # fmt: skip
    out = tmp_path / "report.html"
    assert main(["report", str(records), str(plan_file), "-o", str(out)]) == 0
    page = out.read_text()
    assert '<a href="#plan-1">Plan: gpt2-medium (plan.json)</a>' in page
    assert '<h2 id="records">' in page and '<h2 id="plan-1">' in page
    assert len(table(page, "plan-ranked")) == len(Plan.model_validate_json(plan_file.read_text()).ranked)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda text: text[: len(text) // 2], "not valid JSON ("),
        (lambda text: text.replace('"ranked_by"', '"ranked_by_what"'), "ranked_by: Field required"),
        (
            lambda text: text.replace('"schema_version": 1', '"schema_version": 9'),
            "schema_version 9 is newer",
        ),
        (
            lambda text: text.replace('"candidates": ', '"candidates": "many", "x": ', 1),
            "candidates: Input should be a valid integer",
        ),
    ],
    ids=["truncated", "missing-field", "newer", "wrong-type"],
)
def test_a_bad_plan_file_is_refused_with_what_is_wrong(
    plan_file: Path,
    tmp_path: Path,
    change: Callable[[str], str],
    said: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(change(plan_file.read_text()))
    out = tmp_path / "report.html"
    assert main(["report", str(bad), "-o", str(out)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"plan file {bad}" in err and said in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.slow
def test_a_measured_plan_shows_predicted_against_measured_with_spearman(tmp_path: Path) -> None:
    """`plan --measure 3`: three real 2-process gloo runs of gpt-nano; the report draws the predicted against the
    measured throughput, titled with the Spearman figure, and lists each run's ranks and record."""
    out = tmp_path / "measured"
    done = accelbench("plan", "--model", "gpt-nano", "--devices", "2", "--bus-bandwidth", "1", "--strategies",
                      "ddp,fsdp", "--precisions", "fp32", "--batch-sizes", "4,8", "--measure", "3",
                      "--measure-epochs", "2", "--measure-steps", "3", "--out", str(out), "--json", "--measure-peak",
                      cwd=ROOT, timeout=900)  # fmt: skip  # --measure-peak: its own peak to rank by (cached)
    assert done.returncode == 0, done.stderr[-3000:]
    path = tmp_path / "plan.json"
    path.write_text(done.stdout)
    plan = Plan.model_validate_json(done.stdout)
    assert plan.comparison is not None and plan.comparison.spearman is not None
    report = tmp_path / "report.html"
    assert main(["report", str(path), "-o", str(report)]) == 0
    page = report.read_text()
    rho = f"{plan.comparison.spearman:+.2f}"
    text = text_of(page)
    assert f"predicted against measured throughput (Spearman {rho})" in text
    assert f"Spearman's rank correlation of predicted and measured throughput: {rho}" in text
    assert text.count("<figure") == 2
    measured = table(page, "plan-measured")
    assert [row[0] for row in measured] == [r.label for r in plan.comparison.runs]
    assert [row[1] for row in measured] == ["1", "2", "3"]
    assert sorted(row[2] for row in measured) == sorted(str(r.measured_rank) for r in plan.comparison.runs)
    assert all(row[5] == "ok" and Path(row[7]).is_file() for row in measured)
    assert json.loads(path.read_text())["schema"] == "accelbench.plan"
