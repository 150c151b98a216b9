"""The MLPerf-era proxy suite (issue 23, point 5): Llama 3.1 8B's shape and a GPT-OSS-style mixture of experts at
full scale and at CPU sizes, and the views a user compares them in (tokens/s, MFU, routing balance)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from core_support import accelbench

from accelbench.compare import compare, load_records
from accelbench.sweep import builtin_suites, load_sweep


def test_the_suite_at_both_scales_is_what_accelbench_run_accepts() -> None:
    path = builtin_suites()["mlperf-proxy"]
    full, tiny = load_sweep(path), load_sweep(path, scale="tiny")
    configs = [full.config(p, Path("out")) for p in full.points]
    assert {(c.workload, c.model) for c in configs} == {
        ("llama", "custom"),
        ("llama", "llama3-8b"),
        ("moe", "gpt-oss-20b"),
    }
    proxy = [c for c in configs if c.model == "custom"]  # Llama 3.1 8B's layers, fewer of them
    assert {c.precision for c in proxy} == {"bf16-mixed", "fp8-tensorwise", "fp8-rowwise"}
    assert all(
        (o["n_layer"], o["n_embd"], o["n_head"], o["n_kv_heads"], o["ffn_dim"], o["vocab_size"], o["seq_len"])
        == (4, 4096, 32, 8, 14336, 128256, 8192)
        for o in (c.workload_options for c in proxy)
    )
    (moe,) = [c for c in configs if c.workload == "moe"]
    assert moe.devices == 8 and moe.mesh == "fsdp=2,ep=4"

    small = [tiny.config(p, Path("out")) for p in tiny.points]  # CPU sizes: fp32 (no FP8 math), a few steps
    assert {c.model for c in small} == {"llama-tiny", "moe-tiny"}
    assert all(c.precision == "fp32" and c.steps_per_epoch == 3 for c in small)


@pytest.mark.slow
def test_the_tiny_suite_runs_and_compares_in_tokens_and_routing_balance(tmp_path: Path) -> None:
    """The suite at CPU sizes, for real (llama-tiny on 1 and 2 processes under FSDP2, moe-tiny with ep=2 on two):
    every point a record; compare and report show tokens/s and the mixture's routing balance from its record."""
    proc = accelbench("sweep", "mlperf-proxy", "--scale", "tiny", "--output-dir", str(tmp_path / "out"), "-q")
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(p.read_text()) for p in (tmp_path / "out").glob("*.json")]
    assert sorted((r["config"]["workload"], r["config"]["devices"]) for r in records) == [
        ("llama", 1), ("llama", 2), ("moe", 2)
    ]  # fmt: skip
    assert all(r["outcome"]["status"] == "ok" for r in records)
    (moe,) = [r for r in records if r["config"]["workload"] == "moe"]
    routing = moe["workload"]["routing"]
    expected = max(routing["tokens_per_expert"]) / (
        sum(routing["tokens_per_expert"]) / len(routing["tokens_per_expert"])
    )
    assert routing["imbalance"] == pytest.approx(expected) and routing["imbalance"] >= 1

    loaded = load_records([tmp_path / "out"])
    assert not loaded.skipped  # the sweep's own folder of point configurations is not taken for records
    comparison = compare(loaded)
    (cell,) = [c for g in comparison.groups for c in g.cells if g.key.workload == "moe"]
    assert cell.spread("routing_imbalance").median == pytest.approx(routing["imbalance"])  # type: ignore[union-attr]
    assert comparison.counts_tokens

    text = accelbench("compare", str(tmp_path / "out"), "--format", "markdown")
    assert text.returncode == 0, text.stderr
    assert "| tokens/s |" in text.stdout and f"{routing['imbalance']:.2f}×" in text.stdout
    assert "skipped" not in text.stderr
    html = accelbench("report", str(tmp_path / "out"), "--output", str(tmp_path / "report.html"))
    assert html.returncode == 0, html.stderr
    page = (tmp_path / "report.html").read_text()
    assert "<th>routing</th>" in page and "<th>tokens/s</th>" in page
