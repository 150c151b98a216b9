"""What a newcomer reads while a run goes (tests for the first hour's readings): the time left as a duration, and a
busy host said the moment an epoch finds it, not only in the final summary."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from accelbench.display import LogProgress, contention_text, fmt_left
from accelbench.results import EpochMetrics


def epoch(
    number: int, cpu_s: float | None = 1.0, cpu_wait_s: float | None = 0.0, steal: float | None = 0.0
) -> EpochMetrics:
    return EpochMetrics(epoch=number, wall_s=2.0, steps=4, samples=256, tokens=32768, samples_per_s=128.0,
                        tokens_per_s=16384.0, loss=3.0, peak_memory_bytes=None, cpu_s=cpu_s, cpu_wait_s=cpu_wait_s,
                        steal=steal)  # fmt: skip


def test_the_time_left_is_a_duration_never_a_clock_time() -> None:
    """`run ends in ~18:07` printed at 18:08 read as a time of day already past; it is a duration, in words."""
    assert fmt_left(42) == "about 42 s left"
    assert fmt_left(18 * 60 + 7) == "about 18 min left"
    assert fmt_left(2 * 3600 + 5 * 60) == "about 2 h 05 min left"
    assert fmt_left(-3) == "about 0 s left"


def test_a_busy_host_is_said_in_the_epochs_progress_line() -> None:
    quiet, waited, stolen = epoch(1), epoch(2, cpu_s=1.0, cpu_wait_s=0.5), epoch(3, steal=0.2)
    assert contention_text(quiet) == "" and contention_text(epoch(1, cpu_s=None, cpu_wait_s=None)) == ""
    assert contention_text(waited).startswith("contended: its threads waited 33% of the time for a core")
    assert "the hypervisor took 20% of the cores' time" in contention_text(stolen)
    stream = io.StringIO()
    progress = LogProgress(stream)
    for metrics in (quiet, waited):
        progress.start_epoch(metrics.epoch, 3, 4, 64)
        progress.end_epoch(metrics)
    first, busy = stream.getvalue().splitlines()[-2:]
    assert "contended" not in first and "about 4 s left" in first
    assert (
        "epoch 2/3 done" in busy
        and "contended: its threads waited 33%" in busy
        and "the record marks it" in busy
    )


def test_a_gradient_norm_limit_no_run_can_meet_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--grad-norm-limit 0 (no norm is at most 0: every run would end as diverged) is refused before anything runs;
    nothing is written."""
    from accelbench.cli import main

    code = main(["run", "--model", "gpt-nano", "--grad-norm-limit", "0", "--epochs", "1", "--steps-per-epoch", "2",
                 "--output-dir", str(tmp_path)])  # fmt: skip
    assert code == 2 and "--grad-norm-limit" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_a_cpu_nodes_memory_verdict_counts_every_process_on_the_host(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """8 worker processes share one host's memory: the verdict says per process and for the host, never "per
    device" as if each had the host's memory to itself."""
    from accelbench.cli import main

    args = ["estimate", "--model", "gpt-mini", "--strategy", "ddp", "--devices", "8", "--batch-size", "8"]
    assert main(args) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "per process; 8 processes:" in out and "of the host's" in out
    assert main([*args, "--json"]) == 0
    assert '"sharing_memory": 8' in capsys.readouterr().out


def test_the_precision_line_says_in_words_what_runs_in_which_type() -> None:
    """'bf16-mixed (matmul math: ieee-fp32)' read as if the matmuls ran in fp32: the line says what autocast runs
    and what stays float32."""
    from accelbench.contract import standard_plan
    from accelbench.display import precision_in_words

    mixed = precision_in_words(standard_plan("bf16-mixed", matmul_math="ieee-fp32"))
    assert "matmuls and convolutions in bfloat16 under autocast" in mixed
    assert "weights, gradients and optimizer in float32" in mixed and "ieee" not in mixed
    assert (
        precision_in_words(standard_plan("fp32", matmul_math="tf32"))
        == "fp32: everything in float32, matmuls as tf32"
    )
    assert "no autocast" in precision_in_words(standard_plan("bf16-true", matmul_math="ieee-fp32"))


def test_run_help_groups_its_options_and_shows_one_workloads_own_when_asked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from accelbench.cli import main

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    whole = capsys.readouterr().out
    for heading in ("what to train:", "data:", "several devices and nodes:", "measurement and prediction:",
                    "training quality:", "gpt options:", "llama options:", "moe options:"):  # fmt: skip
        assert f"\n{heading}\n" in whole, heading
    assert "--kv-lora-rank" in whole
    with pytest.raises(SystemExit):
        main(["run", "--help", "--workload", "gpt"])
    gpt = capsys.readouterr().out
    assert "gpt options:" in gpt and "moe options:" not in gpt and "--kv-lora-rank" not in gpt
    assert len(gpt.splitlines()) < len(whole.splitlines())


SWEEP = """[run]
model = "gpt-nano"
epochs = 5
steps_per_epoch = 40

[grid]
batch_size = [16, 32]
"""


def _sweep_interrupted(tmp_path: Path, signals: int) -> tuple[int, float, list[tuple[float, str]]]:
    """A sweep started, its first point running, then ``signals`` SIGINTs 0.3 s apart: (exit code, seconds from the
    first signal to the exit, stderr lines with the seconds after the first signal they came)."""
    import signal
    import subprocess
    import sys
    import threading
    import time

    (tmp_path / "sweep.toml").write_text(SWEEP)
    proc = subprocess.Popen(
        [sys.executable, "-m", "accelbench.cli", "sweep", str(tmp_path / "sweep.toml"), "--output-dir",
         str(tmp_path / "out")],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    lines: list[tuple[float, str]] = []
    started = threading.Event()
    sent = [0.0]

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append((time.monotonic() - sent[0] if sent[0] else -1.0, line.strip()))
            if "running batch_size=16" in line:
                started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert started.wait(120), lines
    time.sleep(6)  # the point's child is training
    sent[0] = time.monotonic()
    for _ in range(signals):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
    code = proc.wait(timeout=120)
    elapsed = time.monotonic() - sent[0]
    reader.join(10)
    return code, elapsed, lines


def test_an_interrupted_sweep_says_so_at_once_and_keeps_what_it_finished(tmp_path: Path) -> None:
    code, elapsed, lines = _sweep_interrupted(tmp_path, signals=1)
    said = [(t, line) for t, line in lines if line.startswith("Ctrl-C: stopping")]
    assert code == 130 and said and said[0][0] < 2.0, lines
    assert elapsed < 30, lines
    assert any("interrupted: every finished point is recorded" in line for _, line in lines)


def test_a_second_ctrl_c_stops_a_sweep_at_once(tmp_path: Path) -> None:
    code, elapsed, lines = _sweep_interrupted(tmp_path, signals=2)
    assert code == 130 and elapsed < 10, lines
    assert any("interrupted" in line for _, line in lines)


def test_info_shows_the_peak_a_run_measured_and_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No table has a CPU's peak; once a run has measured it (cached), `info` shows it, marked measured, not
    "unknown"; with nothing cached it measures nothing and says unknown."""
    import json

    import torch

    from accelbench.cli import main
    from accelbench.contract import standard_plan
    from accelbench.estimate.peak import measured_peak
    from accelbench.plugins import get_host

    monkeypatch.setenv("ACCELBENCH_CACHE_DIR", str(tmp_path))

    def cpu_peaks() -> dict[str, object]:
        assert main(["info", "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        return next(b["peaks"] for b in data["backends"] if b["backend"]["name"] == "cpu")

    assert cpu_peaks()["fp32"] is None
    backend = get_host().backends["cpu"]
    plan = standard_plan("fp32", matmul_math="ieee-fp32")
    assert measured_peak(backend, torch.device("cpu"), plan, budget_s=0.2) is not None
    fp32 = cpu_peaks()["fp32"]
    assert isinstance(fp32, dict) and str(fp32["source"]).startswith("measured: dense matmul")
