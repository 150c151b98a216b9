"""`accelbench run` fed the odd and the hostile, and failing after it measured: --profile windows no trace can hold,
jobs the host cannot run, hostile --config files, a launcher's environment that contradicts the flags, and the
steps after the timed epochs (the profiled window, the prediction, writing the record) failing, signalled, or
killed outright. A refusal comes before anything runs (exit 2, nothing written); once epochs are timed they are in
a record whatever happens next.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from core_support import TINY

import accelbench.engine.profile.capture as profile_capture
import accelbench.engine.runner as runner
from accelbench.cli import main
from accelbench.engine.profile import MAX_PROFILE_STEPS, MIN_EVENTS_PER_STEP, PROFILE_BYTES_PER_EVENT
from accelbench.hostinfo import usable_cores

RUN = [*TINY, "--epochs", "2", "--steps-per-epoch", "2"]  # a warm-up and one timed steady epoch, 2 steps each
DRAFT = "the process ended during the --profile window, after the timed epochs (killed, e.g. by the kernel's"


def refused(
    args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], base: tuple[str, ...] = tuple(RUN)
) -> str:
    out = tmp_path / "out"
    code = main(["run", *base, *args, "--output-dir", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    assert not out.exists() or not list(out.iterdir())  # refused before anything ran: nothing written
    return " ".join(err.split())


def records(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


# --------------------------------------------------------------------------------------------------------------
# Refused before anything runs
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # the case: 100,000 profiled steps of a tiny model grew to 24 GB and were killed, with no record
        (
            ["--profile", "--profile-steps", "100000"],
            "--profile-steps 100000: at most 1000 steps are profiled",
        ),
        (["--profile", "--profile-steps", str(MAX_PROFILE_STEPS + 1)], "--profile-steps 1001: at most 1000"),
        (["--profile", "--profile-steps", "0"], "--profile-steps: Input should be greater than 0 (got 0)"),
        (["--threads", "100000"], "--devices 1 x --threads 100000 = 100000 threads on"),
        (["--threads", "100000"], "give --threads"),
        (["--seed", str(2**64)], "--seed: Input should be less than or equal to 18446744073709551615"),
        (["--lr", "nan"], "--lr: Input should be a finite number (got nan)"),
        (["--collective-timeout", "inf"], "--collective-timeout: Input should be a finite number (got inf)"),
        # a model size typed wrong is refused before a single layer is built, not built until the host gives out
        (
            ["--model", "custom", "--layers", "99999999", "--heads", "2", "--embd", "64"],
            "--layers: Input should be less than or equal to 1024 (got 99999999)",
        ),
        (
            ["--model", "custom", "--layers", "2", "--heads", "2", "--embd", "10000000"],
            "--embd: Input should be less than or equal to 65536",
        ),
        (["--block-size", str(2**30)], "--block-size: Input should be less than or equal to 1048576"),
        (["--vocab-multiple", str(2**30)], "--vocab-multiple: Input should be less than or equal to 65536"),
    ],
)
def test_bad_values_are_refused_before_anything_runs(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in refused(args, tmp_path, capsys)


def test_more_worker_processes_than_the_host_can_run_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cores, per_core = usable_cores(), runner.MAX_THREADS_PER_CORE
    too_many = per_core * cores + 1
    err = refused(["--devices", str(too_many), "--strategy", "ddp"], tmp_path, capsys)
    assert (
        f"--devices {too_many} = {too_many} processes on {cores} usable core(s): more than {per_core} a core"
        in err
    )
    bert = ("--workload", "bert", "--model", "bert-tiny", "--seq-len", "16", "--epochs", "1")
    err = refused(["--data-workers", "99999"], tmp_path, capsys, bert)
    assert "--devices 1 x (1 + --data-workers 99999) = 100000 processes" in err
    # at the bound: as many threads as the limit runs (with the contention warning); one more does not
    runner.check_host_capacity(1, per_core * cores)
    with pytest.raises(runner.ConfigError, match=f"more than {per_core} a core"):
        runner.check_host_capacity(1, per_core * cores + 1)
    # memory: 1 GiB available, 80% of it for worker processes of ~256 MiB each before their model
    monkeypatch.setattr(psutil, "virtual_memory", lambda: types.SimpleNamespace(available=2**30))
    err = refused(["--devices", "4", "--strategy", "ddp"], tmp_path, capsys)
    assert "--devices 4: each worker process holds ~256 MiB before its model, 1.0 GiB in all" in err
    assert "give --devices 3 or fewer" in err


def test_a_model_whose_weights_the_host_cannot_hold_is_refused_before_it_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every rank builds the whole model in fp32 on the host first: counted on the meta device, refused when the
    worker processes of the node could not hold the weights (1 GiB available: 2 layers of width 3072 are ~0.8 GiB
    of weights, which one process holds and two do not)."""
    from accelbench.plugins import get_host
    from accelbench.testing import tiny_config

    monkeypatch.setattr(psutil, "virtual_memory", lambda: types.SimpleNamespace(available=2**30))
    size = ["--model", "custom", "--layers", "2", "--heads", "2", "--embd", "3072", "--block-size", "8"]
    err = refused([*size, "--devices", "2", "--strategy", "ddp"], tmp_path, capsys)
    assert (
        "gpt custom: 226," in err
        and "0.8 GiB of fp32 weights built in host memory on each of 2 worker" in err
    )
    assert "this host has 1.0 GiB available; choose a smaller model (or fewer --devices per node)" in err
    host = get_host()
    options = {"n_layer": 2, "n_head": 2, "n_embd": 3072, "block_size": 8}
    config = host.resolve(tiny_config(model="custom", workload_options=options))
    runner.check_model_fits_host(config, host.workload("gpt"), 2**30)  # one process holds it
    with pytest.raises(runner.ConfigError, match="0.8 GiB of fp32 weights built in host memory before"):
        runner.check_model_fits_host(config, host.workload("gpt"), 2**29)


def test_a_profile_window_the_memory_cannot_hold_is_refused_naming_what_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before the run, at the fewest events any training step makes; 1 GiB available, half of it for the window."""
    monkeypatch.setattr(psutil, "virtual_memory", lambda: types.SimpleNamespace(available=2**30))
    fits = 2**29 // (MIN_EVENTS_PER_STEP * PROFILE_BYTES_PER_EVENT)
    err = refused(["--profile", "--profile-steps", str(fits + 1)], tmp_path, capsys)
    assert (
        f"--profile-steps {fits + 1}: a profiled step makes {MIN_EVENTS_PER_STEP} profiler events or more"
        in err
    )
    assert f"give --profile-steps {fits} or fewer" in err
    runner.check_profile_window(
        runner.RunConfig(profile=True, profile_steps=fits), 2**30
    )  # at the bound: runs


CONFIG_REASONS = {
    "comm.json": "a record of another kind (schema 'accelbench.comm'), not a run configuration",
    "deep.json": "its JSON is nested too deeply",
    "digits.json": "Exceeds the limit (4300 digits)",
    "folder.json": "is a folder",
    "loop.json": "Too many levels of symbolic links",
    "zero.json": "far too large to be a run configuration",
}


@pytest.mark.parametrize("name", sorted(CONFIG_REASONS))
def test_hostile_config_files_are_refused(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = tmp_path / "files"
    files.mkdir()
    (files / "comm.json").write_text('{"schema": "accelbench.comm", "schema_version": 1}')
    (files / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (files / "digits.json").write_text('{"seed": ' + "9" * 5000 + "}")
    (files / "folder.json").mkdir()
    (files / "loop.json").symlink_to("loop.json")
    (files / "zero.json").symlink_to("/dev/zero")
    err = refused(["--config", str(files / name)], tmp_path, capsys)
    assert f"--config {files / name}: " in err and CONFIG_REASONS[name] in err


def test_a_launcher_environment_that_contradicts_the_flags_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        monkeypatch.setenv(name, value)
    err = refused(["--devices", "2", "--strategy", "ddp"], tmp_path, capsys)
    assert "--devices 2, but torchrun started 1 process(es) on this node" in err


# --------------------------------------------------------------------------------------------------------------
# After the timed epochs: the optional steps fail, are signalled, or end the process
# --------------------------------------------------------------------------------------------------------------


def profiled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, window: Callable[..., Any], *extra: str
) -> tuple[int, dict[str, Any], list[dict[str, Any]]]:
    """A profiled tiny run whose window is ``window``; the exit code, the record, and the records on disk when
    the window began (what a killed process would have left)."""
    out = tmp_path / "out"
    seen: list[dict[str, Any]] = []

    def instead(*args: Any, **kwargs: Any) -> Any:
        seen.extend(records(out))
        return window(*args, **kwargs)

    monkeypatch.setattr(runner, "profile_steps", instead)
    code = main(["run", *RUN, "--profile", "--profile-steps", "3", *extra, "--output-dir", str(out), "-q"])
    (record,) = records(out)
    assert not [
        p.name for p in out.iterdir() if p.name.startswith((".tmp-", ".trace-"))
    ]  # nothing half-written
    return code, record, seen


def epochs_of(record: dict[str, Any]) -> int:
    metrics = record["metrics"]
    return len(metrics["epochs"])


def test_the_epochs_are_on_disk_before_the_window_and_a_failed_profiler_leaves_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("profiler broke")

    code, record, seen = profiled(tmp_path, monkeypatch, broken)
    ((draft,),) = [seen]
    assert draft["outcome"]["status"] == "error" and DRAFT in draft["outcome"]["message"]
    assert (
        epochs_of(draft) == 2 and draft["profile"] is None
    )  # the warm-up and the timed epoch, before the window
    assert code == 0 and record["outcome"]["status"] == "ok"
    assert "the --profile window failed (RuntimeError: profiler broke); the 2 timed epoch(s) before it are " \
           "complete and unaffected" in record["outcome"]["message"]  # fmt: skip
    assert epochs_of(record) == 2 and record["profile"] is None and record["prediction"] is not None
    assert record["metrics"]["epochs"] == draft["metrics"]["epochs"]


def test_a_window_that_runs_out_of_memory_leaves_the_epochs_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def out_of_memory(*args: Any, **kwargs: Any) -> Any:
        raise MemoryError("the trace")

    code, record, _ = profiled(tmp_path, monkeypatch, out_of_memory)
    assert code == 0 and record["outcome"]["status"] == "ok" and epochs_of(record) == 2
    assert "the --profile window ran out of memory (MemoryError: the trace)" in record["outcome"]["message"]


@pytest.mark.parametrize(("signum", "said"), [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "Ctrl-C")])
def test_a_signal_during_the_window_keeps_every_timed_epoch(
    signum: int, said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def signalled(*args: Any, **kwargs: Any) -> Any:
        os.kill(os.getpid(), signum)  # a scheduler's SIGTERM, or Ctrl-C, arriving mid-window
        raise AssertionError("the signal did not stop the window")

    # Ctrl-C as a terminal delivers it, even where this process was started with SIGINT ignored (a background job)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code, record, _ = profiled(tmp_path, monkeypatch, signalled)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert code == 130 and record["outcome"]["status"] == "interrupted" and epochs_of(record) == 2
    assert record["outcome"]["message"] == (
        f"{said} during the --profile window, after the 2 timed epoch(s), which are all kept (no profile)"
    )


def test_a_window_the_memory_cannot_hold_is_cut_with_the_reason_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step of 1000 events; memory for 3 of them (the window takes half of what is available): 8 asked, 3 run."""
    monkeypatch.setattr(profile_capture, "_step_events", lambda *args: 1000)
    monkeypatch.setattr(runner, "_available_memory", lambda: 2 * 3 * 1000 * PROFILE_BYTES_PER_EVENT)
    out = tmp_path / "out"
    assert main(["run", *RUN, "--profile", "--profile-steps", "8", "--output-dir", str(out), "-q"]) == 0
    (record,) = records(out)
    cut = "--profile-steps 8 cut to 3: a step makes 1000 profiler events"
    assert record["profile"]["steps"] == 3 and cut in record["profile"]["window"]
    assert record["outcome"]["status"] == "ok" and cut in record["outcome"]["message"]
    assert (out / record["profile"]["trace"]).exists()


def test_a_window_of_which_not_one_step_fits_is_skipped_with_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(profile_capture, "_step_events", lambda *args: 1000)
    monkeypatch.setattr(runner, "_available_memory", lambda: 1000 * PROFILE_BYTES_PER_EVENT)
    out = tmp_path / "out"
    assert main(["run", *RUN, "--profile", "--output-dir", str(out), "-q"]) == 0
    (record,) = records(out)
    assert record["profile"] is None and epochs_of(record) == 2
    assert (
        "ran out of memory (MemoryError: a profiled step makes 1000 profiler events"
        in record["outcome"]["message"]
    )
    assert "not even one step fits" in record["outcome"]["message"]


@pytest.mark.parametrize("failure", [OverflowError("a figure too large"), KeyboardInterrupt()])
def test_a_prediction_that_fails_or_is_interrupted_never_costs_the_record(
    failure: BaseException, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    seen: list[dict[str, Any]] = []

    def predict(*args: Any, **kwargs: Any) -> Any:
        seen.extend(records(out))
        raise failure

    monkeypatch.setattr(runner, "predict_run", predict)
    assert main(["run", *RUN, "--output-dir", str(out), "-q"]) == 0
    ((draft,),) = [seen]  # written before the prediction: the epochs, and what a killed process would leave
    assert draft["outcome"]["status"] == "error" and epochs_of(draft) == 2
    assert (
        "the process ended while the prediction of this configuration was being made"
        in draft["outcome"]["message"]
    )
    (record,) = records(out)
    assert (
        record["outcome"] == {"status": "ok", "message": None, "traceback": None} and epochs_of(record) == 2
    )
    what = (
        "OverflowError: a figure too large" if isinstance(failure, OverflowError) else "interrupted (Ctrl-C)"
    )
    assert record["prediction"]["note"] == f"no prediction: it failed ({what})"


@pytest.mark.slow
def test_a_run_killed_during_the_window_leaves_its_timed_epochs(tmp_path: Path) -> None:
    """The kernel's out-of-memory killer (SIGKILL: nothing runs after it) during the profiled window: the record
    written before the window holds the timed epochs and says the process ended there."""
    out = tmp_path / "out"
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        import accelbench.engine.runner as runner
        runner.profile_steps = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
        from accelbench.cli import main
        sys.exit(main({["run", *RUN, "--profile", "--output-dir", str(out), "-q"]!r}))
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    (record,) = records(out)
    assert record["outcome"]["status"] == "error" and DRAFT in record["outcome"]["message"]
    assert epochs_of(record) == 2 and record["metrics"]["steady"] is not None
    assert not [p.name for p in out.iterdir() if p.name.startswith(".tmp-")]


def test_a_record_no_folder_can_take_reaches_stdout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The output folder fails after the run (a full disk) and ACCELBENCH_FALLBACK_DIR names a file, not a folder:
    the record, with its epochs, is printed on stdout, and the run ends with an error."""
    out = tmp_path / "out"
    (tmp_path / "not-a-folder").write_text("")
    monkeypatch.setenv("ACCELBENCH_FALLBACK_DIR", str(tmp_path / "not-a-folder"))
    import accelbench.results as results

    real = results._write_atomically

    def full(text: str, path: Path) -> None:
        if path.parent == out:
            raise OSError(28, "No space left on device")
        real(text, path)

    monkeypatch.setattr(results, "_write_atomically", full)
    assert main(["run", *RUN, "--output-dir", str(out), "-q"]) == 1
    captured = capsys.readouterr()
    record = json.loads(captured.out)
    assert record["outcome"]["status"] == "ok" and epochs_of(record) == 2
    assert (
        "could not be written" in captured.err and "no fallback folder could take it either" in captured.err
    )
