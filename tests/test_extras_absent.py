"""Every command and optional path with each extra absent: a clean refusal naming what to install (exit 2, nothing
written), never a traceback; what a core command needs (estimating a llama, writing plan's sweep file) needs none.

An extra is made absent by a ``sitecustomize`` that marks its modules as failed imports (``sys.modules[name] =
None``: ``import`` raises ImportError, ``importlib.util.find_spec`` answers None), as on a machine without them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BLOCK = """import os, sys
for name in filter(None, os.environ.get("ACCELBENCH_TEST_BLOCK", "").split(",")):
    sys.modules[name] = None
"""
TINY = ["--model", "gpt-nano", "--epochs", "1", "--steps-per-epoch", "1", "--quiet"]

CASES = [
    ("deepspeed", ["run", "--strategy", "deepspeed-zero2", *TINY], "pip install 'accelbench[deepspeed]'"),
    ("lightning,pytorch_lightning", ["run", "--engine", "lightning", *TINY], "pip install 'accelbench[lightning]'"),
    ("torchvision", ["run", "--workload", "resnet50", "--epochs", "1", "--steps-per-epoch", "1", "--quiet"],
     "pip install 'accelbench[vision]'"),
    ("torchvision", ["estimate", "--workload", "resnet50"], "pip install 'accelbench[vision]'"),
    ("tokenizers", ["run", "--workload", "llama", "--model", "llama-tiny", "--epochs", "1", "--steps-per-epoch", "1",
                    "--quiet"], "pip install 'accelbench[llama]'"),
    ("matplotlib", ["report", "{records}", "--output", "{tmp}/report.html"], "pip install 'accelbench[report]'"),
    ("yaml", ["sweep", "{tmp}/sweep.yaml", "--dry-run"], "pip install 'accelbench[yaml]'"),
]  # fmt: skip


def accelbench(tmp_path: Path, block: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "block").mkdir(exist_ok=True)
    (tmp_path / "block" / "sitecustomize.py").write_text(BLOCK)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "block"), "ACCELBENCH_TEST_BLOCK": block,
           "ACCELBENCH_CACHE_DIR": str(tmp_path / "cache")}  # fmt: skip
    return subprocess.run([sys.executable, "-m", "accelbench.cli", *argv], capture_output=True, text=True, env=env,
                          timeout=300, cwd=tmp_path)  # fmt: skip


@pytest.mark.parametrize(("block", "argv", "install"), CASES, ids=[f"{c[0]}-{c[1][0]}" for c in CASES])
def test_a_missing_extra_is_refused_naming_it(
    tmp_path: Path, block: str, argv: list[str], install: str
) -> None:
    records = tmp_path / "records"
    records.mkdir()
    (records / "not-a-record.json").write_text("{}")
    (tmp_path / "sweep.yaml").write_text("run:\n  model: gpt-nano\ngrid:\n  batch_size: [8]\n")
    argv = [a.format(tmp=tmp_path, records=records) for a in argv]
    out = tmp_path / "out"
    if argv[0] == "run":
        argv += ["--output-dir", str(out)]
    done = accelbench(tmp_path, block, argv)
    assert done.returncode == 2, done.stderr[-2000:]
    assert install in " ".join(done.stderr.split()) and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert not out.exists() or not list(out.iterdir())  # refused before anything ran: nothing written


def test_core_commands_need_no_extra(tmp_path: Path) -> None:
    """Estimating a llama needs no tokenizer; plan's sweep file is TOML, written without PyYAML; a plan whose
    strategies include ZeRO without DeepSpeed says so and plans the others."""
    everything = "deepspeed,lightning,pytorch_lightning,torchvision,tokenizers,matplotlib,yaml"
    llama = accelbench(tmp_path, everything, ["estimate", "--workload", "llama", "--model", "llama-tiny"])
    assert llama.returncode == 0 and "Traceback" not in llama.stderr, llama.stderr[-2000:]
    plan = accelbench(tmp_path, everything, ["plan", "--model", "gpt-nano", "--devices", "2", "--device", "H100",
                                             "--sweep-file", str(tmp_path / "plan.toml")])  # fmt: skip
    assert plan.returncode == 0 and "Traceback" not in plan.stderr, plan.stderr[-2000:]
    assert "DeepSpeed is not installed: no ZeRO" in " ".join(plan.stdout.split())
