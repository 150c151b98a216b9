"""Runs a user can read and trust: how many epochs and why, how busy the host was, summaries, `info`, `plugins`, and
compare tables that fit the terminal, pick a baseline per workload and keep environment variants apart."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from core_support import TINY, RealRuns, accelbench, derived

from accelbench.cli import main
from accelbench.compare import compare, load_records
from accelbench.display import summary_table
from accelbench.engine.metrics import AUTO_MAX_EPOCHS, EpochPlan, host_contention
from accelbench.engine.runner import run
from accelbench.hostinfo import CpuUsage, core_ticks, cpu_usage
from accelbench.plugins import get_host
from accelbench.results import EpochMetrics, read_record
from accelbench.testing import tiny_config

# --------------------------------------------------------------------------------------------------------------
# How many epochs, and why
# --------------------------------------------------------------------------------------------------------------


def test_auto_epochs_stop_once_four_steady_epochs_agree() -> None:
    plan = EpochPlan.of("auto")
    walls = [9.0, 1.00, 1.20, 1.01]
    assert not plan.stop_after(walls)  # 3 steady epochs: too few to decide anything
    walls.append(0.99)
    assert not plan.stop_after(walls)  # 4, but 1.20 is 10% off
    walls.append(1.00)
    assert not plan.stop_after(walls)  # the last 4 still include 1.20
    walls.append(1.00)
    assert plan.stop_after(walls)  # the last 4 agree within 1%
    assert plan.decision(walls, ended_early=False).startswith(
        "auto: the last 4 steady epochs agreed within +-1.0% (tolerance +-5%) after 7 epochs"
    )


def test_auto_epochs_give_up_at_the_limit_and_say_the_timing_was_noisy() -> None:
    plan = EpochPlan.of("auto")
    walls = [5.0] + [1.0, 1.5] * 20
    stops = next(n for n in range(1, len(walls) + 1) if plan.stop_after(walls[:n]))
    assert stops == AUTO_MAX_EPOCHS
    assert "stopped at the limit of 12 epochs" in plan.decision(walls[:stops], ended_early=False)
    assert "noisy" in plan.decision(walls[:stops], ended_early=False)


def test_fixed_epochs_say_when_they_are_too_few_for_a_verdict() -> None:
    assert EpochPlan.of(2).decision([2.0, 1.0], ended_early=False) == (
        "fixed: --epochs 2; 1 steady epoch(s) are too few for compare's noise test, which needs 4 per run (or "
        "repeats) to tell two runs apart"
    )
    assert EpochPlan.of(5).decision([1.0] * 5, ended_early=False) == "fixed: --epochs 5"
    assert EpochPlan.of(5).stop_after([1.0] * 5) and not EpochPlan.of(5).stop_after([1.0] * 4)


def test_a_default_run_decides_its_epochs_and_records_how(tmp_path: Path) -> None:
    record, _, status = run(tiny_config(epochs="auto", steps_per_epoch=3, output_dir=tmp_path), get_host())
    assert status == "ok" and record.config.epochs == "auto"
    m = record.metrics
    assert 5 <= len(m.epochs) <= AUTO_MAX_EPOCHS  # a warm-up and at least 4 steady epochs for the noise test
    assert m.steady.epochs == len(m.epochs) - 1 and m.epochs_decision.startswith("auto: ")
    assert [e.epoch for e in m.epochs] == list(range(1, len(m.epochs) + 1))
    if Path("/proc/stat").exists():  # each epoch's steal is recorded, and the run's (0 on bare metal)
        assert all(e.steal is not None and 0 <= e.steal < 1 for e in m.epochs)
        assert m.host is not None and m.host.steal is not None


# --------------------------------------------------------------------------------------------------------------
# How busy the host was
# --------------------------------------------------------------------------------------------------------------


def _epoch(n: int, cpu: float, wait: float | None, steal: float | None = None) -> EpochMetrics:
    return EpochMetrics(
        epoch=n, wall_s=1.0, steps=1, samples=1, tokens=1, samples_per_s=1.0, tokens_per_s=1.0, loss=None,
        peak_memory_bytes=None, cpu_s=cpu, cpu_wait_s=wait, load_avg=1.0, steal=steal,
    )  # fmt: skip


def test_host_contention_is_the_share_of_ready_time_spent_waiting_for_a_core() -> None:
    epochs = [_epoch(1, 2.0, 1.0), _epoch(2, 2.0, 0.01), _epoch(3, 2.0, 0.9), _epoch(4, 2.0, 0.02)]
    quiet = host_contention(epochs, cores=2)  # the warm-up's waiting does not count
    assert quiet is not None and not quiet.contended
    assert quiet.waiting == pytest.approx(0.02 / 2.02)  # the median over the steady epochs
    assert quiet.contended_epochs == [3] and "epoch(s) 3 waited up to 31%" in quiet.note
    busy = host_contention([_epoch(1, 2.0, 0.0), _epoch(2, 1.0, 1.0), _epoch(3, 1.0, 0.5)], cores=2)
    assert busy is not None and busy.contended and busy.note.startswith("contended: ")
    unknown = host_contention([_epoch(1, 2.0, None), _epoch(2, 2.0, None)], cores=2)
    assert unknown is not None and unknown.waiting is None and not unknown.contended


def test_steal_is_read_from_the_usable_cores_lines_of_proc_stat(tmp_path: Path) -> None:
    """/proc/stat's per-core lines (user nice system idle iowait irq softirq steal guest guest_nice): the cores the
    process may run on are summed, others and the all-cores line left out; a kernel without the steal column
    gives no figure rather than a wrong one."""
    import os

    mine = sorted(os.sched_getaffinity(0))[:2]
    stat = tmp_path / "stat"
    stat.write_text(
        "cpu  900 0 900 900 0 0 0 900 0 0\n"  # the all-cores line: never read
        + "".join(f"cpu{c} 10 1 5 80 2 0 1 {c + 1} 3 0\n" for c in mine)
        + "cpu99999 1000 0 0 0 0 0 0 1000 0 0\n"  # a core outside the affinity
        + "intr 12345 6 7\nctxt 999\n"
    )
    steal, ticks = core_ticks(stat)
    assert steal == sum(c + 1 for c in mine) and ticks == sum(
        99 + c + 1 for c in mine
    )  # guest is inside user
    short = tmp_path / "short"
    short.write_text(f"cpu  1 2 3 4\ncpu{mine[0]} 1 2 3 4 5 6 7\n")
    assert core_ticks(short) == (None, None) and core_ticks(tmp_path / "absent") == (None, None)
    before = CpuUsage(1.0, 0.5, None, steal_ticks=100, ticks=1000)
    after = CpuUsage(3.0, 1.0, None, steal_ticks=150, ticks=1500)
    assert after.steal_since(before) == pytest.approx(0.1) and after.waiting_since(before) == pytest.approx(
        0.2
    )
    assert (
        after.steal_since(CpuUsage(1.0, None, None)) is None
        and after.waiting_since(CpuUsage(1.0, None, None)) is None
    )
    here = cpu_usage()
    if Path("/proc/stat").exists():  # Linux: the figure is there, on bare metal or in a virtual machine
        assert here.steal_ticks is not None and here.ticks is not None and here.ticks > here.steal_ticks >= 0


def test_a_virtual_machine_whose_hypervisor_stole_its_cores_is_contended() -> None:
    """A guest's threads never wait in its own scheduler for a core the hypervisor gave to another guest: steal is
    judged apart from waiting, and said in the note."""
    stolen = host_contention(
        [_epoch(1, 2.0, 0.0, 0.3), _epoch(2, 2.0, 0.01, 0.2), _epoch(3, 2.0, 0.0, 0.25)], cores=2
    )
    assert stolen is not None and stolen.contended and stolen.steal == pytest.approx(0.225)
    assert stolen.note.startswith("contended: ") and "hypervisor gave 22% of the cores' time" in stolen.note
    assert "other guests on its cores" in stolen.note
    spike = host_contention([_epoch(1, 2.0, 0.0, 0.0), _epoch(2, 2.0, 0.0, 0.0), _epoch(3, 2.0, 0.0, 0.4),
                             _epoch(4, 2.0, 0.0, 0.005)], cores=2)  # fmt: skip
    assert spike is not None and not spike.contended and spike.contended_epochs == [3]
    assert (
        "epoch(s) 3 had up to 40% of the cores' time stolen" in spike.note
        and "waited up to" not in spike.note
    )
    assert "hypervisor" not in spike.note  # a median steal of 0.5% is not worth saying
    bare = host_contention([_epoch(1, 2.0, 0.0, 0.0), _epoch(2, 2.0, 0.0, 0.0)], cores=2)
    assert bare is not None and bare.steal == 0.0 and not bare.contended and "steal" not in bare.note


def test_a_run_beside_busy_processes_is_recorded_as_contended(tmp_path: Path) -> None:
    """Two processes spinning on this two-core machine while a two-thread run trains: the run's threads wait for
    a core most of the time, and the record says so (a quiet run is checked in the unit test above)."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        time.sleep(0.5)
        config = tiny_config(epochs=3, steps_per_epoch=15, threads=2, output_dir=tmp_path)
        record, _, _ = run(config, get_host())
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    host = record.metrics.host
    assert host is not None and host.contended, host
    assert host.waiting >= 0.1 and all(e.cpu_wait_s > 0 for e in record.metrics.epochs)


# --------------------------------------------------------------------------------------------------------------
# What a person reads: the summary, info, plugins
# --------------------------------------------------------------------------------------------------------------


def _render(table: object, width: int = 100) -> str:
    from rich.console import Console

    console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(table)
    return console.export_text()


@pytest.fixture(scope="module")
def record_file(real_runs: RealRuns) -> Path:
    return real_runs.record(*TINY, "--epochs", "5", "--steps-per-epoch", "2")


def test_the_summary_names_the_strategy_world_size_and_a_short_formula(record_file: Path) -> None:
    record = read_record(record_file)
    text = _render(summary_table(record))
    assert "epoch 1 (warm-up)" in text and "epoch 5 " in text  # counted from 1, as in the record and messages
    assert "6N + 12*l*d*s per token)" in text and "PaLM" not in text  # the record keeps the source
    assert "PaLM" in record.metrics.flops_formula
    assert "strategy" not in text  # one process, one device: nothing to say
    two = record.model_copy(
        update={
            "world_size": 2,
            "launcher": "torchrun",
            "config": record.config.model_copy(update={"strategy": "ddp"}),
        }
    )
    assert "ddp over 2 process(es)" in _render(summary_table(two))
    assert "host" in text and ("quiet" in text or "contended" in text)


def test_the_summary_shows_a_message_with_brackets_as_written(record_file: Path) -> None:
    """A library's error in the outcome (gloo's "[/__w/pytorch/.../pair.cc:553] Connection closed") is shown as
    text, not read as console markup (a closing tag that matches nothing would crash the summary of a finished run)."""
    record = read_record(record_file)
    message = "the tensor-peak step failed (RuntimeError: [/__w/gloo/pair.cc:553] Connection closed by peer)"
    odd = record.model_copy(update={"outcome": record.outcome.model_copy(update={"message": message})})
    assert "[/__w/gloo/pair.cc:553]" in _render(summary_table(odd), width=300)


def test_info_shows_sizes_and_absent_things_in_words() -> None:
    proc = accelbench("info")
    assert proc.returncode == 0, proc.stderr
    assert "None" not in proc.stdout and "memory_bytes" not in proc.stdout
    assert "GiB" in proc.stdout and "none (not a CUDA build)" in proc.stdout


def test_plugins_show_each_backends_precisions_and_strategies() -> None:
    proc = accelbench("plugins")
    assert proc.returncode == 0, proc.stderr
    block = proc.stdout.split("cpu (accelbench")[1].split("\n\n")[0]
    assert "precisions: fp32, bf16-mixed, bf16-true, fp16-mixed" in block
    assert "strategies: single, ddp, fsdp" in block
    rows = json.loads(accelbench("plugins", "--json").stdout)
    cpu = next(r for r in rows if r["name"] == "cpu")
    assert "fp32" in cpu["precisions"] and "ddp" in cpu["strategies"]


def test_run_help_lists_the_choices_and_exit_codes() -> None:
    import os

    proc = subprocess.run(
        [sys.executable, "-m", "accelbench.cli", "run", "--help"],
        capture_output=True, text=True, env={**os.environ, "COLUMNS": "400"}, timeout=60,
    )  # fmt: skip
    text = " ".join(proc.stdout.split())
    assert "choices: fp32, fp16-mixed, bf16-mixed, bf16-true" in text
    assert "gpt: gpt-nano, gpt-micro" in text and "ddp" in text.split("--strategy")[2]
    assert "(default: auto)" in text and "(default: 64)" in text
    assert "130 interrupted" in text


# --------------------------------------------------------------------------------------------------------------
# Compare that answers the question
# --------------------------------------------------------------------------------------------------------------


@pytest.fixture
def systems(record_file: Path, tmp_path: Path) -> Path:
    """Records of two systems (derived from one real run, never shown as measurements): A ran gpt-nano and a
    custom model; B ran gpt-nano only, and once more with another thread count (an environment variant)."""
    record = json.loads(record_file.read_text())
    folder = tmp_path / "records"
    folder.mkdir()
    plain = derived(record, metrics__host=dict(record["metrics"]["host"], contended=False))  # a quiet host

    def put(name: str, **changes: object) -> None:
        (folder / f"{name}.json").write_text(json.dumps(derived(plain, **changes)))

    put("a-custom", system__host="node-a")
    put("a-nano", system__host="node-a", config__model="gpt-nano", workload_identity__model="gpt-nano")
    put("b-nano", system__host="node-b", config__model="gpt-nano", workload_identity__model="gpt-nano")
    put(
        "b-nano-2t",
        system__host="node-b",
        config__model="gpt-nano",
        workload_identity__model="gpt-nano",
        system__torch_threads=7,
    )
    return folder


def test_runs_of_one_label_in_different_environments_are_separate_variants(systems: Path) -> None:
    comparison = compare(load_records([systems]), label_by=("host",))
    assert set(comparison.systems) >= {"node-a", "node-b [torch threads 7]"}
    assert any(
        s.startswith("node-b [torch threads ") and s != "node-b [torch threads 7]" for s in comparison.systems
    )
    for group in comparison.groups:  # never pooled into one cell
        assert all(len({r.system.host for r in c.runs}) == 1 and len(c.runs) == 1 for c in group.cells)


def test_each_workload_falls_back_to_its_own_baseline_and_says_so(systems: Path, capsys) -> None:
    comparison = compare(load_records([systems]), label_by=("host",), baseline="node-b [torch threads 7]")
    custom = next(g for g in comparison.groups if "custom" in g.describe())
    nano = next(g for g in comparison.groups if "gpt-nano" in g.describe())
    assert nano.baseline_system == "node-b [torch threads 7]" and nano.baseline_note is None
    assert custom.baseline_system == "node-a"
    assert (
        custom.baseline_note == "node-b [torch threads 7] has no run of this workload: ratios against node-a"
    )
    assert (
        main(
            ["compare", str(systems), "--label-by", "host", "--baseline", "threads 7", "--format", "markdown"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "has no run of this workload: ratios against node-a" in out
    assert "| node-a | 1 | 1 ok" in out and "| baseline |" in out


def test_the_table_fits_the_terminal_and_says_what_it_left_out(systems: Path) -> None:
    import os

    env = {**os.environ, "COLUMNS": "80"}
    narrow = subprocess.run(
        [sys.executable, "-m", "accelbench.cli", "compare", str(systems), "--label-by", "host"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert narrow.returncode == 0, narrow.stderr
    assert max(len(line) for line in narrow.stdout.splitlines()) <= 80
    assert (
        "speed ×" in narrow.stdout and "steady epoch s" in narrow.stdout and "beyond noise?" in narrow.stdout
    )
    assert "left out to fit 80 columns: " in " ".join(narrow.stdout.split())
    wide = subprocess.run(
        [sys.executable, "-m", "accelbench.cli", "compare", str(systems), "--label-by", "host", "--wide"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert "left out" not in wide.stdout and "scaling" in wide.stdout and "peak memory" in wide.stdout
    roomy = subprocess.run(
        [sys.executable, "-m", "accelbench.cli", "compare", str(systems), "--label-by", "host"],
        capture_output=True, text=True, env={**env, "COLUMNS": "200"}, timeout=60,
    )  # fmt: skip
    assert "left out" not in roomy.stdout and max(len(line) for line in roomy.stdout.splitlines()) <= 200


def test_compare_flags_runs_whose_host_was_contended(systems: Path, capsys) -> None:
    busy = json.loads((systems / "a-nano.json").read_text())
    busy["metrics"]["host"] = dict(busy["metrics"]["host"], contended=True, waiting=0.4)
    (systems / "a-nano.json").write_text(json.dumps(busy))
    assert main(["compare", str(systems), "--label-by", "host", "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "1 ok (1 contended)" in out and " ⚠" in out and "⚠ / contended = the host was busy" in out
    assert main(["compare", str(systems), "--label-by", "host", "--format", "json"]) == 0
    cells = [c for g in json.loads(capsys.readouterr().out)["groups"] for c in g["cells"]]
    assert sorted(c["contended_runs"] for c in cells) == [0, 0, 0, 1]


# --------------------------------------------------------------------------------------------------------------
# Sweeps: an ETA, and enough epochs for a verdict
# --------------------------------------------------------------------------------------------------------------


def test_a_sweep_shows_its_eta_once_a_point_has_run() -> None:
    import io

    from rich.console import Console

    from accelbench.sweep.display import SweepDisplay
    from accelbench.sweep.spec import Point

    out = io.StringIO()
    display = SweepDisplay(Console(file=out, width=200), total=4, live=False)
    display.finish(Point((("model", "gpt2"),), ("model",)), "already recorded: 1 ok")
    assert "ends in" not in out.getvalue()  # nothing has run yet: no guess
    display.finish(Point((("model", "gpt2-medium"),), ("model",)), "ok (60.0 s)", seconds=60.0)
    display.finish(Point((("model", "gpt2-large"),), ("model",)), "ok (120.0 s)", seconds=120.0)
    assert "1 left" in out.getvalue() and "ends in ~1:30)" in out.getvalue()  # the median point, once more


def test_a_sweep_warns_when_its_points_are_too_few_epochs_for_a_verdict(tmp_path: Path, capsys) -> None:
    sweep = tmp_path / "short.toml"
    sweep.write_text('[run]\nepochs = 2\nmodel = "gpt-nano"\n[[grid]]\nbatch_size = [8, 16]\n')
    assert main(["sweep", str(sweep), "--dry-run", "--output-dir", str(tmp_path / "out")]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert (
        "note: some points measure 1 steady epoch(s) over their repeats: too few for compare's noise test"
        in err
    )
    assert "use --repeats 4, --set epochs=auto or more epochs" in err
    assert (
        main(["sweep", str(sweep), "--dry-run", "--repeats", "4", "--output-dir", str(tmp_path / "out")]) == 0
    )
    assert "note:" not in capsys.readouterr().err
    assert main(["sweep", "seed-single", "--dry-run", "--output-dir", str(tmp_path / "out")]) == 0
    assert "note:" not in capsys.readouterr().err  # the built-in suites decide their epochs (auto)


def test_the_summary_shows_a_profiled_steps_device_timeline(record_file: Path) -> None:
    """A CUDA/ROCm profile read by Holistic Trace Analysis (the hta extra): its idle/compute split in the summary."""
    from accelbench.engine.profile import CATEGORIES, StepAnalysis, step_profile

    analysis = StepAnalysis(
        wall_s=0.002, seconds=dict.fromkeys(CATEGORIES, 0.002 / len(CATEGORIES)), overlapped_s=0
    )
    figures = {"steps": 2.0, "span_s": 0.00175, "idle_fraction": 0.25, "compute_fraction": 0.5,
               "non_compute_fraction": 0.25, "comm_comp_overlap_pct": 33.33}  # fmt: skip
    profile = step_profile([analysis], "2 steps", None, None, "torch.profiler", figures, "HTA 0.5.0")
    text = _render(summary_table(read_record(record_file).model_copy(update={"profile": profile})), width=160)
    assert "idle 25%, compute 50%, non-compute 25% of 1.8 ms a step" in text
    assert "communication overlapped with compute 33%" in text
