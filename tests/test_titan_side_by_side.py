"""benchmarks/gpu/titan_side_by_side.py, the parts that must hold before a GPU call: accelbench's side describes the
model torchtitan trains, and torchtitan's log is read right."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
from core_support import load_script

from accelbench.cli import main

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "titan_side_by_side.py"
# what torchtitan 0.2.2's own count gives for the 1B flavor (`titan_side_by_side.py shape`, run with torchtitan
# installed): get_nparams_and_flops at 2,048 tokens
TITAN_PARAMETERS = 1_498_482_688
TITAN_FLOPS_PER_TOKEN = 8_220_192_768


@pytest.fixture(scope="module")
def script() -> ModuleType:
    return load_script(SCRIPT)


def test_accelbench_side_trains_the_model_torchtitan_counts(
    script: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    command = script.accelbench_command(tmp_path, 4, 2048, 80, compile_=False)
    assert command[1:4] == ["-m", "accelbench.cli", "run"] and "--backend" in command
    # the same flags through `estimate` (everything but --quiet, which only `run` has), for an H100
    flags = [arg for arg in command[4:] if arg != "--quiet"]
    assert main(["estimate", "--device", "H100", *flags, "--json"]) == 0
    estimate = json.loads(capsys.readouterr().out)
    assert estimate["parameters"] == TITAN_PARAMETERS
    assert estimate["flops_per_step"] == pytest.approx(TITAN_FLOPS_PER_TOKEN * 4 * 2048, rel=1e-12)
    assert estimate["precision"] == "bf16-mixed" and estimate["workload"] == "llama"


def test_torchtitan_runs_the_registered_flavor_with_the_same_batch(
    script: ModuleType, tmp_path: Path
) -> None:
    command = script.titan_command(tmp_path, tmp_path / "dump", 4, 2048, 80, compile_=True)
    assert command[1:3] == ["-m", "torch.distributed.run"]
    assert command[command.index(str(SCRIPT)) + 1] == "titan-train"  # the entry that registers the flavor
    pairs = dict(zip(command, command[1:], strict=False))  # each flag with the value after it
    assert pairs["--model.flavor"] == script.FLAVOR and pairs["--training.local_batch_size"] == "4"
    assert pairs["--training.seq_len"] == "2048" and pairs["--activation_checkpoint.mode"] == "none"
    assert command[-1] == "--compile.enable"


# torchtitan 0.2.2's metric lines, as its trainer logged them (colour off) in the CPU plumbing run
LOG = """\
[titan] 2026-11-27 07:54:49,471 - root - INFO - step:  1  loss: 12.15753  grad_norm:  1.1002  memory: 0.50GiB(0.6%)  tps: 59  tflops: 0.01  mfu: 0.00%
[titan] 2026-11-27 07:55:04,063 - root - INFO - step: 10  loss: 11.79829  grad_norm:  1.2458  memory: 0.50GiB(0.6%)  tps: 1,158  tflops: 0.02  mfu: 0.01%
[titan] 2026-11-27 07:55:20,723 - root - INFO - step: 20  loss: 10.37997  grad_norm:  1.7812  memory: 0.50GiB(0.6%)  tps: 2,154  tflops: 0.02  mfu: 0.01%
[titan] 2026-11-27 07:55:36,230 - root - INFO - step: 30  loss:  9.62098  grad_norm:  1.0441  memory: 0.50GiB(0.6%)  tps: 12,165  tflops: 100.02  mfu: 10.11%
[titan] 2026-11-27 07:55:49,762 - root - INFO - step: 40  loss:  9.03177  grad_norm:  1.1382  memory: 0.50GiB(0.6%)  tps: 12,189  tflops: 100.21  mfu: 10.13%
[titan] 2026-11-27 07:56:02,101 - root - INFO - step: 50  loss:  8.91000  grad_norm:  1.0102  memory: 0.50GiB(0.6%)  tps: 12,001  tflops: 98.65  mfu: 9.97%
"""


def test_torchtitan_figure_is_the_median_interval_after_warm_up(script: ModuleType) -> None:
    figures = script.titan_figures(LOG)
    assert [row["step"] for row in figures["intervals"]] == [1, 10, 20, 30, 40, 50]
    assert figures["intervals"][1]["tps"] == 1158.0  # thousands separators read
    assert figures["tokens_per_s"] == 12165.0  # median of steps 30-50: the first two intervals left out
    assert figures["mfu_pct"] == 10.11


def test_a_torchtitan_log_without_steady_intervals_is_an_error(script: ModuleType) -> None:
    short = "\n".join(LOG.splitlines()[:3])
    with pytest.raises(RuntimeError, match="no steady interval"):
        script.titan_figures(short)


def test_accelbench_figure_is_the_records_steady_tokens_per_second(
    script: ModuleType, tmp_path: Path
) -> None:
    # a real record of a custom llama trained on an H100 (docs/gpu/h100-2026-11-27), where `run` would find it
    (record,) = (SCRIPT.parents[2] / "docs" / "gpu" / "h100-2026-11-27").rglob(
        "*_cuda_custom_bf16-mixed_*.json"
    )
    (tmp_path / record.name).write_bytes(record.read_bytes())
    figures = script.accelbench_figures(tmp_path)
    steady = json.loads(record.read_text())["metrics"]["steady"]
    assert figures["record"] == record.name and figures["tokens_per_s"] == steady["tokens_per_s"] > 0
    with pytest.raises(RuntimeError, match="no record"):
        script.accelbench_figures(tmp_path / "empty")
