"""Real short training runs on the CPU backend, through the CLI, checked through their result records."""

from __future__ import annotations

import json
import math
import os
import pty
import re
import resource
import select
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from core_support import TINY, accelbench, accelbench_here

from accelbench.cli import main
from accelbench.engine.runner import run
from accelbench.plugins import get_host
from accelbench.results import EpochMetrics, ResultRecord, read_record
from accelbench.testing import tiny_config


def only_record(directory: Path):
    files = sorted(directory.glob("*.json"))
    assert len(files) == 1, files
    assert not list(directory.glob(".tmp-*")), "a temporary file was left behind"
    return read_record(files[0])


def test_cpu_run_writes_a_complete_record(tmp_path: Path) -> None:
    code = main(
        ["run", *TINY, "--epochs", "3", "--steps-per-epoch", "6", "--output-dir", str(tmp_path), "-q"]
    )
    assert code == 0
    record = only_record(tmp_path)
    m = record.metrics
    assert record.outcome.status == "ok"
    assert record.backend.info.name == "cpu" and record.backend.devices_used == 1
    assert record.precision.name == "fp32" and record.precision.matmul_math == "ieee-fp32"
    assert record.system.torch_version.startswith("2.")
    assert record.plugins["accelbench"]
    # three epochs of six steps of eight samples, epoch 0 reported apart as the warm-up
    assert [e.steps for e in m.epochs] == [6, 6, 6]
    assert all(e.samples == 48 and e.tokens == 48 * 16 for e in m.epochs)
    assert m.warmup == m.epochs[0]
    assert m.steady.epochs == 2
    walls = [e.wall_s for e in m.epochs[1:]]
    assert m.steady.epoch_s_median == pytest.approx(sum(walls) / 2)
    assert m.steady.samples_per_s == pytest.approx(statistics.median(48 / w for w in walls))
    assert m.steady.tokens_per_s == pytest.approx(m.steady.samples_per_s * 16)
    assert m.steady.achieved_flops_per_s == pytest.approx(m.steady.samples_per_s * m.flops_per_sample)
    # no CPU peak table: MFU is against the dense-matmul rate measured on this host (cached), labelled as such
    assert m.peak is not None and m.peak.source.startswith("measured: dense matmul")
    assert m.steady.mfu == pytest.approx(m.steady.achieved_flops_per_s / m.peak.flops_per_s)
    # the analytical model's prediction for this very configuration, beside what was measured
    p = record.prediction
    assert p is not None and p.comm_bytes_per_step == 0  # one device: nothing to communicate
    # nothing missing; a calibration measured on a busy host is said (a lower bound, never cached)
    assert p.note is None or p.note.startswith("calibrated on a busy host"), p.note
    busy = p.note is not None  # a busy host's calibration: no band claimed for it
    assert p.rates_source == "measured here" and p.error_band
    assert ("no band" in p.error_band) if busy else ("16 CPU configurations" in p.error_band), p.error_band
    assert p.peak_flops_per_s == m.peak.flops_per_s and p.peak_source == m.peak.source
    assert p.step_time_s == pytest.approx(p.compute_s + p.optimizer_s)
    assert p.flops_per_step == pytest.approx(8 * m.flops_per_sample)
    parts = p.memory_bytes
    assert None not in parts.values()
    # set_to_none frees the gradients after each step: the peak holds the larger of them and the activations
    assert p.peak_memory_bytes == pytest.approx(
        sum(parts.values()) - min(parts["gradients"], parts["activations"])
    )
    assert p.memory_bytes["runtime"] > 10 * 2**20  # the process held torch before the model was built
    weights = p.memory_bytes["weights"]  # fp32 on one device: gradients as large, AdamW's two moments twice
    assert weights >= 4 * record.workload["parameters"] and p.memory_bytes["gradients"] == weights
    assert p.memory_bytes["optimizer"] == 2 * weights
    assert m.peak_memory_max_bytes > 10 * 2**20  # the process RSS holds at least torch itself
    assert "VmHWM" in m.memory.source
    assert all(math.isfinite(e.loss) for e in m.epochs)
    # the model that was recorded is the one that trained: 1 layer of width 16 over the 65-character corpus
    assert record.workload["parameters"] == sum([65 * 16, 16 * 16, 12 * 16 * 16 + 13 * 16, 2 * 16])
    assert record.data["vocab_size"] == 65 and record.data["samples_per_epoch"] == math.ceil(
        round(4.4 * 2**20) / 17
    )
    assert record.executor["fused_optimizer"] is True


def test_the_checks_run_once_in_a_run_that_trains_in_the_process_the_user_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import accelbench.engine.runner as runner

    calls: list[object] = []
    real = runner.preflight

    def counted(config: object, host: object) -> runner.Preflight:
        calls.append(config)
        return real(config, host)  # type: ignore[arg-type]

    monkeypatch.setattr(runner, "preflight", counted)
    assert (
        main(["run", *TINY, "--epochs", "2", "--steps-per-epoch", "2", "--output-dir", str(tmp_path), "-q"])
        == 0
    )
    assert len(calls) == 1 and only_record(tmp_path).outcome.status == "ok"
    # a run handed another configuration than the one checked checks its own
    calls.clear()
    checked = real(tiny_config(output_dir=tmp_path, steps_per_epoch=2), get_host())
    record, _, status = run(
        tiny_config(output_dir=tmp_path, epochs=2, steps_per_epoch=2),
        get_host(),
        launch=None,
        checked=checked,
    )
    assert status == "ok" and len(calls) == 1 and record is not None and record.config.epochs == 2


def test_training_really_learns_a_file(tmp_path: Path) -> None:
    text = tmp_path / "abc.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 400)
    out = tmp_path / "out"
    code = main(
        ["run", *TINY, "--data", str(text), "--lr", "3e-3", "--epochs", "3", "--output-dir", str(out), "-q"]
    )
    assert code == 0
    record = only_record(out)
    losses = [e.loss for e in record.metrics.epochs]
    assert record.data["vocab_size"] == len(set("the quick brown fox jumps over the lazy dog\n"))
    assert record.data["path"] == str(text)
    assert losses[-1] < 0.6 * losses[0], losses  # a repeated sentence is easy to learn


@pytest.mark.parametrize(
    ("precision", "param", "autocast", "scaling"),
    [
        ("bf16-mixed", "float32", "bfloat16", "none"),
        ("bf16-true", "bfloat16", None, "none"),
        ("fp16-mixed", "float32", "float16", "dynamic"),
    ],
)
def test_precision_plans_are_applied_and_recorded(tmp_path, precision, param, autocast, scaling) -> None:
    # the plan is the subject, not the prediction: no calibration of a new dtype (15 s each on a 2-core host)
    config = tiny_config(
        epochs=2, steps_per_epoch=3, precision=precision, output_dir=tmp_path, no_calibration=True
    )
    record, path, _ = run(config, get_host())
    assert record.outcome.status == "ok", record.outcome
    plan = record.precision
    assert (plan.name, plan.param_dtype, plan.autocast_dtype, plan.loss_scaling) == (
        precision,
        param,
        autocast,
        scaling,
    )
    assert record.executor["loss_scaler"] == ("GradScaler" if scaling == "dynamic" else None)
    assert read_record(path) == record


class InterruptAt:
    """A progress display that presses Ctrl-C at a given epoch (counted from 1) and step."""

    def __init__(self, epoch: int, step: int) -> None:
        self.target, self.epoch, self.steps = (epoch, step), 0, 0

    def start_epoch(self, epoch: int, epochs: int, steps: int, samples_per_step: int) -> None:
        self.epoch, self.steps = epoch, 0

    def step(self) -> None:
        self.steps += 1
        if (self.epoch, self.steps) == self.target:
            raise KeyboardInterrupt

    def end_epoch(self, metrics: EpochMetrics) -> None:
        pass

    def close(self) -> None:
        pass


def test_ctrl_c_keeps_the_completed_epochs(tmp_path: Path) -> None:
    config = tiny_config(epochs=4, steps_per_epoch=5, output_dir=tmp_path)
    record, path, status = run(config, get_host(), InterruptAt(epoch=3, step=3))
    assert status == "interrupted"
    assert record.outcome.status == "interrupted"
    assert "epoch 3 after 3 steps; 2 completed epoch(s) kept" in record.outcome.message
    assert [e.epoch for e in record.metrics.epochs] == [1, 2]  # counted from 1, as the message counts them
    assert record.metrics.epochs_decision == "ended early after 2 epoch(s) (1 steady)"
    assert record.metrics.steady.epochs == 1
    assert read_record(path).outcome.status == "interrupted"


def _ctrl_c_not_ignored() -> None:
    """In the child: Ctrl-C as a terminal delivers it, whatever this test process inherited (a shell's background job,
    nohup or cron start it with SIGINT ignored, and a child keeps that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_sigint_and_sigterm_to_a_running_process_write_an_interrupted_record(tmp_path: Path) -> None:
    """The record keeps the completed epochs and says interrupted; nothing is measured after the interrupt (a
    newcomer's Ctrl-C was followed by a minute's calibration on a busy host, cached 10^4 times too slow): with
    nothing cached, the prediction says why it has no calibrated step, and no calibration is written."""
    from accelbench.estimate.calibration import CACHE_FILE

    for sig in (signal.SIGINT, signal.SIGTERM):
        out, cache = tmp_path / sig.name, tmp_path / f"cache-{sig.name}"
        leader, follower = pty.openpty()  # on a terminal the progress display says when training has started
        proc = subprocess.Popen(
            [sys.executable, "-m", "accelbench.cli", "run", *TINY, "--epochs", "50", "--output-dir", str(out)],
            stdout=subprocess.DEVNULL, stderr=follower,
            env={**os.environ, "COLUMNS": "120", "ACCELBENCH_CACHE_DIR": str(cache)},
            preexec_fn=_ctrl_c_not_ignored,
        )  # fmt: skip
        os.close(follower)
        screen = read_until(leader, b"epoch 1/50", timeout=120)
        proc.send_signal(sig)
        read_until(leader, b"\x00", timeout=60)  # drain until the child closes the terminal
        assert proc.wait(timeout=60) == 130, screen[-2000:]
        record = only_record(out)
        assert record.outcome.status == "interrupted"
        assert ("Ctrl-C" if sig == signal.SIGINT else "SIGTERM") in record.outcome.message
        note = record.prediction.note if record.prediction is not None else None
        assert note and "nothing is measured after a run that ended interrupted" in note, note
        assert not (cache / CACHE_FILE).exists()


def read_until(fd: int, marker: bytes, timeout: float) -> bytes:
    """Read a pseudo-terminal until ``marker`` shows up, the child closes it, or ``timeout`` passes."""
    screen, deadline = b"", time.monotonic() + timeout
    while marker not in screen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        screen += chunk
    return screen


def test_out_of_memory_is_an_outcome_not_a_crash(tmp_path: Path) -> None:
    def cap_memory() -> None:  # a 3 GiB address-space cap: a huge batch cannot fit
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "accelbench.cli",
            "run",
            "--model",
            "gpt-nano",
            "--batch-size",
            "40000",
            "--epochs",
            "1",
            "--output-dir",
            str(tmp_path),
            "-q",
            "--no-calibration",  # the out-of-memory is under test, not the prediction beside it
        ],
        capture_output=True,
        text=True,
        preexec_fn=cap_memory,
        timeout=300,
    )
    assert proc.returncode == 3, proc.stderr
    record = only_record(tmp_path)
    assert record.outcome.status == "oom"
    assert "can't allocate memory" in record.outcome.message
    assert record.config.batch_size == 40000


@pytest.mark.parametrize(
    ("message", "oom"),
    [
        # what an H100 said one batch past the largest that fits (docs/gpu/h100-2026-11-27): an out-of-memory
        ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", True),
        ("cuDNN error: CUDNN_STATUS_ALLOC_FAILED", True),
        ("HIPBLAS_STATUS_ALLOC_FAILED when calling `hipblasCreate(handle)`", True),
        ("CUDA out of memory. Tried to allocate 800.00 MiB", True),
        # a library failing for another reason is an error, not an out-of-memory
        ("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx(...)`", False),
        ("CUDA error: an illegal memory access was encountered", False),
    ],
)
def test_a_library_that_cannot_allocate_its_workspace_is_an_out_of_memory(message: str, oom: bool) -> None:
    from accelbench.engine.runner import is_out_of_memory

    assert is_out_of_memory(RuntimeError(message)) is oom


def test_progress_lines_in_a_batch_log_and_none_when_quiet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Output that is no terminal (a Slurm log, `| tee`) gets one plain, timestamped line per epoch with the rate
    and the run's ETA, and no progress bar; --quiet gets neither (in a fresh interpreter: not a word, not even an
    import's warning)."""
    # this process's stderr, captured, is no terminal; --no-calibration: a first calibration would say so in a line
    code, logged = accelbench_here(capsys, "run", *TINY, "--epochs", "2", "--steps-per-epoch", "2", "--no-calibration",
                                   "--output-dir", str(tmp_path))  # fmt: skip
    assert code == 0
    lines = [line for line in logged.splitlines() if line.startswith("[accelbench ")]
    assert len(lines) == 3, logged  # training starts, epoch 1 done, epoch 2 done
    assert "epoch 1/2 (warm-up) done:" in lines[1] and "samples/s" in lines[1] and " s left" in lines[1]
    assert "epoch 2/2 done:" in lines[2] and "left" not in lines[2]
    assert "\x1b[" not in logged and "━" not in logged  # no bar, no terminal codes
    assert "result record:" in logged  # and the summary is there
    assert (
        json.loads(Path(logged.split("result record:")[1].split()[0]).read_text())["outcome"]["status"]
        == "ok"
    )
    quiet = accelbench(
        "run", *TINY, "--epochs", "1", "--steps-per-epoch", "2", "--output-dir", str(tmp_path), "-q"
    )
    assert quiet.returncode == 0 and quiet.stderr.strip() == "", quiet.stderr


def test_log_progress_reports_within_a_long_epoch() -> None:
    """Within an epoch longer than the interval, a line every interval with the step, rate and ETA."""
    import io

    from accelbench.display import LogProgress

    out = io.StringIO()
    progress = LogProgress(out, every_s=0.0)  # every step is "N seconds later"
    progress.start_epoch(1, 3, 4, 8)
    for _ in range(4):
        progress.step()
    lines = out.getvalue().splitlines()
    assert lines[0].endswith("training: 4 steps of 8 samples per epoch")
    assert (
        "epoch 1/3 (warm-up): step 2/4 (50%)" in lines[2]
        and "samples/s, about " in lines[2]
        and " left" in lines[2]
    )


def test_what_a_run_measures_after_its_epochs_is_said_as_its_progress_is() -> None:
    """A calibration measured for the prediction is a line of the run's progress: timestamped in a log, printed
    above a terminal's finished bar, and nothing under --quiet (whose progress is NoProgress)."""
    import io

    from rich.console import Console

    from accelbench.display import LiveProgress, LogProgress

    log = io.StringIO()
    LogProgress(log).note("measuring a calibration")
    assert re.fullmatch(r"\[accelbench \d\d:\d\d:\d\d\] measuring a calibration\n", log.getvalue())
    terminal = io.StringIO()
    live = LiveProgress(Console(file=terminal, force_terminal=True, width=100))
    live.close()
    live.note("measuring [bold]a[/] calibration")  # not read as markup
    assert "measuring [bold]a[/] calibration" in terminal.getvalue()


def test_progress_display_when_stderr_is_a_terminal(tmp_path: Path) -> None:
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "accelbench.cli",
            "run",
            *TINY,
            "--epochs",
            "2",
            "--steps-per-epoch",
            "3",
            "--output-dir",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=follower,
        env={**os.environ, "COLUMNS": "120"},
    )
    os.close(follower)
    screen = read_until(leader, b"\x00", timeout=120)  # everything until the child closes the terminal
    assert proc.wait(timeout=120) == 0
    text = screen.decode(errors="replace")
    assert "epoch 1/2 (warm-up)" in text and "epoch 2/2" in text
    assert "samples/s" in text and "3/3" in text


class OutOfMemoryAtStep:
    """A progress display that raises an out-of-memory error at step ``n``, as the allocator would."""

    def __init__(self, n: int) -> None:
        self.n, self.seen = n, 0

    def start_epoch(self, epoch: int, epochs: int, steps: int, samples_per_step: int) -> None:
        pass

    def step(self) -> None:
        self.seen += 1
        if self.seen == self.n:
            raise MemoryError("can't allocate memory (stand-in for the device allocator)")

    def end_epoch(self, metrics: object) -> None:
        pass

    def close(self) -> None:
        pass


def test_cached_memory_is_released_after_every_run_oom_included(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an H200 an out-of-memory left 139 GiB in the allocator's cache, so the next run in the same process
    recorded the whole GPU as in use. Every run now hands cached memory back once its figures are read."""
    import weakref

    from accelbench.contract import Backend
    from accelbench.workloads.gpt import GPTWorkload

    models: list[weakref.ref] = []
    build = GPTWorkload.build

    def build_and_watch(self: GPTWorkload, config: object):  # type: ignore[no-untyped-def]
        job = build(self, config)  # type: ignore[arg-type]
        models.append(weakref.ref(job.model))
        return job

    released = []

    def release(self: Backend, device: torch.device) -> None:
        # by now nothing of the run may hold its model (and with it the device memory to hand back)
        released.append([ref() is None for ref in models])

    monkeypatch.setattr(GPTWorkload, "build", build_and_watch)
    monkeypatch.setattr(Backend, "release_memory", release)
    host = get_host()
    config = tiny_config(output_dir=tmp_path, epochs=2, steps_per_epoch=3)
    record, _, status = run(config, host, OutOfMemoryAtStep(4))
    assert status == "oom" and len(record.metrics.epochs) == 1  # the completed epoch is kept
    # released once, when every model the run built is gone (the calibrated prediction traces a fake one too)
    assert len(released) == 1 and released[0] and all(released[0])
    record, _, status = run(config, host)  # the next run in the same process trains
    assert status == "ok" and len(released) == 2 and all(released[1])


def test_data_placement_on_the_cpu_backend_stays_on_the_host(tmp_path: Path) -> None:
    from accelbench.engine.runner import place_data
    from accelbench.errors import ConfigError

    config = tiny_config(output_dir=tmp_path, data_placement="device", epochs=1, steps_per_epoch=2)
    record, _, _ = run(config, get_host())
    assert record.data["placement"].startswith("host")  # a CPU tensor is already where it is used

    class HostOnly:
        samples_per_epoch = 1

    with pytest.raises(ConfigError, match="has no device-resident form"):
        place_data(HostOnly(), torch.device("meta"), "device")  # type: ignore[arg-type]
    source = HostOnly()
    assert place_data(source, torch.device("meta"), "auto") is source  # type: ignore[arg-type]


def test_compile_mode_needs_compile() -> None:
    code = main(["run", "--compile-mode", "reduce-overhead", "--epochs", "1"])
    assert code == 2


def test_graph_replaying_runs_record_the_reserved_peak(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an H200, gpt2 at batch 512 with CUDA graphs recorded a 0.5 GiB allocator peak for a step that holds
    19 GiB: replays use a private pool the allocated peak never sees. Such runs record the reserved peak."""
    from accelbench.backends.cpu import CpuBackend
    from accelbench.contract import EpochReadings, MemoryStats
    from accelbench.engine.executor import TorchExecutor

    reading = EpochReadings(
        memory=MemoryStats(peak_bytes=512, peak_reserved_bytes=19 * 2**30, source="allocator peak")
    )
    monkeypatch.setattr(CpuBackend, "epoch_end", lambda self, device: reading)
    monkeypatch.setattr(TorchExecutor, "replays_graphs", property(lambda self: True))
    record, _, _ = run(tiny_config(output_dir=tmp_path, epochs=2, steps_per_epoch=2), get_host())
    assert [e.peak_memory_bytes for e in record.metrics.epochs] == [19 * 2**30, 19 * 2**30]
    assert record.metrics.memory.peak_bytes == 19 * 2**30
    assert "CUDA graphs" in record.metrics.memory.source and "512" in record.metrics.memory.source
    monkeypatch.setattr(TorchExecutor, "replays_graphs", property(lambda self: False))
    record, _, _ = run(tiny_config(output_dir=tmp_path, epochs=1, steps_per_epoch=2), get_host())
    assert record.metrics.epochs[0].peak_memory_bytes == 512  # without graphs: the allocator's own peak


def test_epoch_side_measurements_enclose_the_timed_steps_and_stay_outside_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trackers (the backend's epoch readings, the host's load) start before the device is synchronised and
    the timer starts, and stop after the closing synchronisation: no reading is inside a timed epoch, and each
    epoch gets one of each. The idle baseline's readings (a probe, then the window over a counter that is there)
    come before the first epoch, outside it."""
    from test_energy_and_build import rapl_zone

    from accelbench.backends.cpu import CpuBackend, rapl_packages
    from accelbench.engine import trackers

    rapl_zone(tmp_path / "powercap", "intel-rapl:0", 1_000_000)  # a package counter, standing still
    # on the class: the host's backend object may be older than this test
    monkeypatch.setattr(CpuBackend, "packages", lambda self: rapl_packages(tmp_path / "powercap"))

    events: list[str] = []
    start, end, sync = CpuBackend.epoch_start, CpuBackend.epoch_end, CpuBackend.end_of_step
    usage = trackers.cpu_usage
    monkeypatch.setattr(
        CpuBackend, "epoch_start", lambda self, d: (events.append("start"), start(self, d))[1]
    )
    monkeypatch.setattr(CpuBackend, "epoch_end", lambda self, d: (events.append("end"), end(self, d))[1])
    monkeypatch.setattr(CpuBackend, "end_of_step", lambda self, d: (events.append("step"), sync(self, d))[1])
    monkeypatch.setattr(trackers, "cpu_usage", lambda: (events.append("cpu"), usage())[1])
    config = tiny_config(output_dir=tmp_path, epochs=2, steps_per_epoch=3, idle_baseline_s=0.05)
    record, _, _ = run(config, get_host())
    assert record is not None and record.outcome.status == "ok"
    idle = ["start", "end", "start", "end"]  # is a counter there? then the idle window, before any epoch
    # after each epoch's trackers stopped, the gradient probe's step boundary (accelbench.engine.quality), untimed
    epoch = ["start", "cpu", "step", "step", "step", "cpu", "end", "step"]
    tensor_peak = ["step"]  # then the untimed tensor-peak step, after the last epoch's readings
    assert events == idle + epoch * 2 + tensor_peak
    assert record.metrics.idle is not None and record.metrics.idle.window_s >= 0.05
    for e in record.metrics.epochs:
        assert e.cpu_s is not None and e.cpu_s >= 0


def test_a_loss_that_is_not_finite_ends_the_run_as_diverged_naming_the_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A learning rate of 10^30 makes the loss NaN within a few steps: the run stops after that epoch with status
    ``diverged`` (exit code 4) naming the first bad step, and compare gives it no speed."""
    code = main(["run", *TINY, "--epochs", "3", "--steps-per-epoch", "4", "--lr", "1e30",
                 "--output-dir", str(tmp_path), "-q"])  # fmt: skip
    assert code == 4
    record = only_record(tmp_path)
    assert record.outcome.status == "diverged"
    assert "training diverged: the loss was nan at step " in record.outcome.message
    assert "of epoch 1 " in record.outcome.message
    assert len(record.metrics.epochs) == 1  # it stopped after the epoch that diverged
    capsys.readouterr()
    assert main(["compare", str(tmp_path), "--format", "json"]) == 0
    ((cell,),) = [group["cells"] for group in json.loads(capsys.readouterr().out)["groups"]]
    assert cell["outcomes"] == {"diverged": 1} and cell["epoch_s"] is None


@pytest.mark.slow  # six runs, four of them calibrating
def test_a_first_run_on_a_device_calibrates_it_once_after_its_epochs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No calibration cached: the run measures one after its timed epochs, so its own prediction is already the
    calibrated one, and caches it; ``--no-calibration`` predicts from the peak instead and measures nothing; a
    later run reuses it, unless it is over an hour old and the device has drifted from it (a cached calibration 4x
    too fast is measured again). It says so, as its progress does: a quiet run measures it as well, in silence."""
    from accelbench.estimate.calibration import CACHE_FILE

    cache = tmp_path / "cache"
    monkeypatch.setenv("ACCELBENCH_CACHE_DIR", str(cache))
    argv = ["run", *TINY, "--epochs", "2", "--steps-per-epoch", "2", "--no-tensor-peak"]
    assert main([*argv, "-q", "--no-calibration", "--output-dir", str(tmp_path / "plain")]) == 0
    plain = only_record(tmp_path / "plain").prediction
    assert plain is not None and plain.time_model and plain.time_model.startswith("efficiency")
    assert not (cache / CACHE_FILE).exists()
    assert main([*argv, "--output-dir", str(tmp_path / "first")]) == 0
    assert "measuring one for the prediction" in capsys.readouterr().err
    first = only_record(tmp_path / "first")
    assert (
        first.prediction
        and first.prediction.time_model
        and first.prediction.time_model.startswith("calibrated")
    )
    if_busy_skip(first)
    stored = json.loads((cache / CACHE_FILE).read_text())
    assert len(stored) == 1
    # measured after the record's epochs: the record was stamped when the run began
    (measured_at,) = [entry["measured_at"] for entry in stored.values()]
    assert measured_at >= first.created_at.isoformat(timespec="seconds")
    assert main([*argv, "-q", "--output-dir", str(tmp_path / "second")]) == 0
    assert "measuring" not in capsys.readouterr().err  # cached: measured once
    assert json.loads((cache / CACHE_FILE).read_text()) == stored  # younger than an hour: not even checked
    # a calibration from two hours ago, when the device ran 4x faster: spot-checked, found out and measured again
    (key,) = stored
    fast = {**stored[key], "measured_at": "2026-01-01T00:00:00+00:00"}
    fast["matmul"] = [{**p, "best_flops_per_s": p["best_flops_per_s"] * 4} for p in fast["matmul"]]
    fast["stream"] = [{**p, "best_bytes_per_s": p["best_bytes_per_s"] * 4} for p in fast["stream"]]
    (cache / CACHE_FILE).write_text(json.dumps({key: fast}))
    assert main([*argv, "--output-dir", str(tmp_path / "third")]) == 0
    err = capsys.readouterr().err
    assert "this device runs -" in err and "against its cached calibration" in err
    if_busy_skip(only_record(tmp_path / "third"))
    again = json.loads((cache / CACHE_FILE).read_text())[key]
    assert again["measured_at"] >= measured_at and again["matmul"] != fast["matmul"]
    # one an older accelbench cached from a busy host, 4x too slow: a lower bound, never used: measured again
    busy = {**again, "contended": True}
    busy["matmul"] = [{**p, "best_flops_per_s": p["best_flops_per_s"] / 4} for p in again["matmul"]]
    busy["stream"] = [{**p, "best_bytes_per_s": p["best_bytes_per_s"] / 4} for p in again["stream"]]
    (cache / CACHE_FILE).write_text(json.dumps({key: busy}))
    assert main([*argv, "--output-dir", str(tmp_path / "fourth")]) == 0
    err = capsys.readouterr().err
    assert "no calibration of this device for float32 is cached: measuring one" in err
    if_busy_skip(only_record(tmp_path / "fourth"))
    assert json.loads((cache / CACHE_FILE).read_text())[key]["matmul"] != busy["matmul"]
    # --quiet: the busy calibration set aside and measured again as well, without a word
    (cache / CACHE_FILE).write_text(json.dumps({key: busy}))
    assert main([*argv, "-q", "--output-dir", str(tmp_path / "fifth")]) == 0
    assert capsys.readouterr().err == ""
    if_busy_skip(only_record(tmp_path / "fifth"))
    assert json.loads((cache / CACHE_FILE).read_text())[key]["matmul"] != busy["matmul"]


def if_busy_skip(record: ResultRecord) -> None:
    """Skip the rest where the run's calibration was measured on a busy host: such a one is never cached, so what
    the cache holds next cannot be checked here."""
    note = record.prediction.note if record.prediction is not None else None
    if note and "calibrated on a busy host" in note:
        pytest.skip("the host was busy while the run calibrated: a contended calibration is never cached")
