"""`accelbench check-backend NAME`: the conformance kit against an installed plugin, reported without a test file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "accelbench.cli", "check-backend", *args], capture_output=True,
                          text=True, timeout=600)  # fmt: skip


def test_the_kits_fast_tier_reports_what_it_proved_and_what_it_could_not(tmp_path: Path) -> None:
    done = check("cpu", "--json", str(tmp_path / "report.json"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    results = {row["test"]: row for row in report["results"]}
    assert report["backend"] == "cpu" and not report["all_tiers"]
    assert results["memory peak covers an allocation and resets"]["result"] == "passed"
    assert results["local ranks get devices of their own"]["result"] == "not proven"
    assert "two ranks cannot be given two" in results["local ranks get devices of their own"]["why"]
    assert not any(row["result"] == "failed" for row in report["results"])
    assert "not proven" in done.stdout and "passed" in done.stdout


def test_an_unknown_backend_is_refused_naming_the_installed_ones() -> None:
    done = check("no-such-backend")
    assert done.returncode == 2
    assert "no installed backend 'no-such-backend'" in done.stderr and "cpu" in done.stderr
