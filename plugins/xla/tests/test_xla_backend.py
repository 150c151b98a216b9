"""The PyTorch/XLA backend. Where torch-xla is installed (CI builds a venv of its own for it: .ci/run), the tests
train for real, lazily, on XLA's CPU device (PJRT_DEVICE=CPU), through the contract's step boundary; elsewhere
those skip, saying why, and the rest checks what needs no torch-xla."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from accelbench_xla import peaks
from accelbench_xla.plugin import XlaBackend

from accelbench.contract import standard_plan
from accelbench.errors import ConfigError
from accelbench.plugins import PluginHost
from accelbench.testing import tiny_config
from accelbench.testing.contract import TINY_ARGS

HAS_XLA = importlib.util.find_spec("torch_xla") is not None
needs_xla = pytest.mark.skipif(
    not HAS_XLA,
    reason="torch-xla not installed here (it pins its own torch; .ci/run trains these in .venv-xla)",
)


def test_the_plugin_registers_a_contract_3_backend() -> None:
    host = PluginHost(strict=False)
    record = next(r for r in host.records if r.name == "xla")
    assert (record.status, record.contract, record.distribution) == ("active", "3.0", "accelbench-xla")
    assert {"end_of_step", "compile_backend", "clip_grad_norm", "optimizer_implementation"} <= set(
        record.overrides["xla"]
    )
    assert host.backends["xla"].strategies == ("single",)


def test_without_a_runtime_chosen_or_a_tpu_it_detects_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    backend = XlaBackend()
    assert backend.detect() == [] and backend.detect_error is None


def test_compile_modes_are_refused_up_front() -> None:
    with pytest.raises(ConfigError, match="openxla has no inductor modes"):
        XlaBackend().check_run(tiny_config(backend="xla", compile=True, compile_mode="reduce-overhead"))
    XlaBackend().check_run(tiny_config(backend="xla", compile=True))


def test_tpu_peaks_are_bf16_only_and_unknown_devices_have_none() -> None:
    bf16, fp32 = standard_plan("bf16-mixed", "x"), standard_plan("fp32", "x")
    assert peaks.peak_for("TPU v5p", bf16).flops_per_s == 459e12
    assert (
        peaks.peak_for("TPU v5p", fp32) is None and peaks.peak_for("XLA CPU (PJRT CPU client)", bf16) is None
    )
    assert {d.details["label"] for d in XlaBackend().known_devices()} >= {"TPU v4", "TPU v6e (Trillium)"}


def _run(tmp_path: Path, *extra: str) -> dict:
    command = [sys.executable, "-m", "accelbench.cli", "run", "--backend", "xla", *TINY_ARGS, "--epochs", "3",
               "--steps-per-epoch", "6", "--output-dir", str(tmp_path), "--json", "-q", *extra]  # fmt: skip
    proc = subprocess.run(
        command, capture_output=True, text=True, timeout=900, env={**_env(), "PJRT_DEVICE": "CPU"}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


@needs_xla
def test_trains_for_real_on_the_xla_cpu_device(tmp_path: Path) -> None:
    record = _run(tmp_path, "--grad-accum", "2")
    assert record["outcome"]["status"] == "ok"
    assert record["backend"]["info"]["name"] == "xla" and record["backend"]["runtime_versions"]["torch_xla"]
    losses = [e["loss"] for e in record["metrics"]["epochs"]]
    assert losses[-1] < losses[0], losses
    assert record["executor"]["optimizer_implementation"] == "foreach"
    assert record["metrics"]["memory"]["peak_bytes"] is None  # the CPU client keeps no statistics: unknown


STEP_GRAPHS = """
import json, os, sys
os.environ["PJRT_DEVICE"] = "CPU"
import torch_xla.debug.metrics as met
from accelbench.engine.runner import run
from accelbench.plugins import PluginHost
from accelbench.testing import tiny_config
host = PluginHost()
backend = host.backends["xla"]
if sys.argv[1] == "forget":  # a port that forgot the step boundary: the stock end_of_step does nothing
    backend.end_of_step = lambda device: None
# no calibration: a spot check or a fresh measurement of the device's rates (on a busy host) would add graphs of its own
config = tiny_config(backend="xla", epochs=1, steps_per_epoch=8, output_dir=sys.argv[2], no_calibration=True)
met.clear_all()
record, _, status = run(config, host)
executions = met.metric_data("ExecuteTime")
print(json.dumps({"status": status, "executions": executions[0] if executions else 0}))
"""


@needs_xla
def test_one_graph_runs_per_step_through_the_step_boundary_and_a_missing_one_shows(tmp_path: Path) -> None:
    """With ``end_of_step`` cutting the graph, XLA executes at least one graph per step (8 steps: >= 8 executions);
    without it the 8 steps pile up into the few graphs the epoch's end forces. This is what the backend's tests use
    to tell a missing step boundary, which would otherwise only make training slow."""
    counts = {}
    for mode in ("honour", "forget"):
        proc = subprocess.run(
            [sys.executable, "-c", STEP_GRAPHS, mode, str(tmp_path / mode)], capture_output=True, text=True,
            timeout=900, env=_env(),
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        answer = json.loads(proc.stdout.strip().splitlines()[-1])
        assert answer["status"] == "ok"
        counts[mode] = answer["executions"]
    assert counts["honour"] >= 8, counts
    assert counts["forget"] < 8, counts


def test_tpu_peaks_by_math_are_bf16_only_and_versioned() -> None:
    assert peaks.peaks_by_math("TPU v6e") == {"bf16": 918e12}  # no FP8 or FP4 on v4-v6e
    assert (
        peaks.peaks_by_math("TPU v7 (Ironwood)") == {}
        and peaks.peaks_by_math("XLA CPU (PJRT CPU client)") == {}
    )
    peak = peaks.peak_for("TPU v5e", standard_plan("bf16-mixed", "ieee-fp32"))
    assert peak is not None and peak.table_version == peaks.TABLE_VERSION
    assert peaks.peak_for("TPU v5e", standard_plan("fp8-rowwise", "ieee-fp32")) is None
