"""`accelbench sweep`: sweep files, built-in suites, and real sweeps that survive an OOM, a refused point and an
interrupt, then resume."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from core_support import accelbench

from accelbench.cli import main
from accelbench.config import RunConfig
from accelbench.contract import RunOption
from accelbench.errors import AccelbenchError
from accelbench.results import read_record
from accelbench.sweep import (
    SWEEP_LOG,
    builtin_suites,
    load_sweep,
    parse_memory,
    parse_set,
    point_done,
    resolve_sweep_source,
    same_point,
)

TINY_RUN = """
[run]
model = "custom"
layers = 1
heads = 2
embd = 16
block-size = 16
dropout = 0
epochs = 2
steps_per_epoch = 3
"""


def sweep_file(tmp_path: Path, body: str, name: str = "sweep.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def test_grids_expand_in_order_with_the_search_axis_innermost(tmp_path: Path) -> None:
    path = sweep_file(
        tmp_path,
        TINY_RUN
        + """
        [[grid]]
        batch_size = [1, 2, 4]
        precision = ["fp32", "bf16-mixed"]
        largest_fit = "batch_size"
        [[grid]]
        precision = "fp32"
        batch_size = [4, 8]   # batch 4 fp32 is also in the first grid: it runs once
        """,
    )
    sweep = load_sweep(path)
    got = [(p.values["precision"], p.values["batch_size"]) for p in sweep.points]
    assert got == [
        ("fp32", 1),
        ("fp32", 2),
        ("fp32", 4),
        ("bf16-mixed", 1),
        ("bf16-mixed", 2),
        ("bf16-mixed", 4),
        ("fp32", 8),
    ]
    first = sweep.points[0]
    assert first.values["n_layer"] == 1 and first.values["block_size"] == 16  # flag spellings normalised
    assert first.series == sweep.points[2].series != sweep.points[3].series  # one search per precision
    assert sweep.points[-1].series is None
    assert first.label() == "precision=fp32 batch_size=1"
    argv = sweep.argv(first, tmp_path / "out")
    assert argv[:9] == ["run", "--model", "custom", "--layers", "1", "--heads", "2", "--embd", "16"]
    assert argv[-3:] == ["--output-dir", str(tmp_path / "out"), "--quiet"]
    assert argv[argv.index("--block-size") + 1] == "16" and argv[argv.index("--batch-size") + 1] == "1"
    config = sweep.config(first, tmp_path / "out")
    options = config.workload_options
    assert (options["n_layer"], config.batch_size, options["dropout"], config.output_dir) == (
        1,
        1,
        0.0,
        tmp_path / "out",
    )


def test_scales_and_set_overrides(tmp_path: Path) -> None:
    path = sweep_file(
        tmp_path,
        """
        [run]
        epochs = 2
        [[grid]]
        model = ["gpt2", "gpt2-medium"]
        precision = ["fp16-mixed", "fp32"]
        [scales.tiny]
        run = { steps_per_epoch = 4 }
        axes = { model = ["gpt-nano"] }
        memory_cap = "2GiB"
        """,
    )
    seed = load_sweep(path)
    assert [p.values["model"] for p in seed.points] == ["gpt2", "gpt2", "gpt2-medium", "gpt2-medium"]
    assert seed.memory_cap is None
    tiny = load_sweep(path, scale="tiny")
    assert [p.values["model"] for p in tiny.points] == ["gpt-nano", "gpt-nano"]
    assert all(p.values["steps_per_epoch"] == 4 for p in tiny.points) and tiny.memory_cap == 2 * 2**30
    fixed = load_sweep(path, scale="tiny", overrides=parse_set(["precision=bf16-mixed", "epochs=3"]))
    assert [(p.values["precision"], p.values["epochs"]) for p in fixed.points] == [("bf16-mixed", 3)]
    yaml_path = sweep_file(
        tmp_path,
        """
        run: {epochs: 2}
        grid:
          - model: [gpt2, gpt2-medium]
            precision: [fp16-mixed, fp32]
        """,
        "sweep.yaml",
    )
    assert [p.options for p in load_sweep(yaml_path).points] == [p.options for p in seed.points]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("[run]\nbatchsize = 4\n", "unknown run option 'batchsize'; did you mean 'batch_size'?"),
        ("[run]\nbatch_size = [4, 8]\n", "batch_size = [4, 8]: a list is an axis; put it in a grid table"),
        ("[[grid]]\nmodel = []\n", "axis 'model' is empty"),
        ("[[grid]]\nmodel = 'gpt2'\nlargest_fit = 'model'\n", "largest_fit = 'model' must name a list axis"),
        ("[run]\noutput_dir = 'x'\n", "'output_dir' is set by the sweep (--output-dir)"),
        ("[grids]\nmodel = ['gpt2']\n", "unknown top-level key 'grids'; did you mean 'grid'?"),
        (
            "[[grid]]\nprecision = ['fp32', 'fp8']\n",
            "point precision=fp8: precision: unknown precision 'fp8'",
        ),
        ("[[grid]]\nmodel = ['custom']\n", "model 'custom' needs all of --layers, --heads and --embd"),
        ("repeats = 0\n", "repeats = 0; give a whole number of runs per point, >= 1"),
        ("memory_cap = 'lots'\n", "memory cap 'lots': give a size such as 3GiB"),
        ("[run\n", "not valid TOML"),
    ],
)
def test_bad_sweep_files_are_refused_with_the_reason(tmp_path: Path, body: str, message: str) -> None:
    path = sweep_file(tmp_path, body)
    with pytest.raises(AccelbenchError) as info:
        load_sweep(path)
    assert message in str(info.value) and str(path) in str(info.value)


def test_scale_and_suite_errors_name_what_exists(tmp_path: Path) -> None:
    path = sweep_file(tmp_path, "[[grid]]\nmodel = ['gpt2']\n")
    with pytest.raises(AccelbenchError, match="--scale 'tiny': .* defines no such scale; it has: seed"):
        load_sweep(path, scale="tiny")
    with pytest.raises(AccelbenchError, match="did you mean 'seed-single'"):
        resolve_sweep_source("seed-singel")
    with pytest.raises(AccelbenchError, match="--set 'precision': write it as OPTION=VALUE"):
        parse_set(["precision"])
    assert parse_set(["batch_size=4", "compile=true", "precision=bf16-mixed"]) == {
        "batch_size": 4,
        "compile": True,
        "precision": "bf16-mixed",
    }
    assert (
        parse_memory("3GiB") == 3 * 2**30
        and parse_memory("512 MiB") == 512 * 2**20
        and parse_memory(10) == 10
    )


def test_plugin_options_are_sweepable_and_matched_only_where_set(tmp_path: Path) -> None:
    replicas = RunOption(name="replicas", type="int", default=1, backend="ipu", help="replication factor")
    path = sweep_file(tmp_path, "[run]\nbackend = 'ipu'\n[[grid]]\nreplicas = [1, 2]\n")
    sweep = load_sweep(path, plugin_options=[replicas])
    config = sweep.config(sweep.points[1], tmp_path)
    assert config.backend_options == {"replicas": 2} and "--replicas" in sweep.argv(sweep.points[1], tmp_path)
    # a record holds every installed plugin's options; only the ones the point sets must agree
    recorded = config.model_copy(update={"backend_options": {"replicas": 2, "other_plugin_flag": True}})
    assert same_point(config, recorded)
    assert not same_point(config, recorded.model_copy(update={"backend_options": {"replicas": 1}}))
    assert not same_point(config, recorded.model_copy(update={"epochs": 3}))
    # how it was launched is not what it measured
    assert same_point(config, recorded.model_copy(update={"output_dir": Path("/elsewhere")}))
    with pytest.raises(AccelbenchError, match="unknown run option 'replica'; did you mean 'replicas'"):
        load_sweep(
            sweep_file(tmp_path, "[[grid]]\nreplica = [1, 2]\n", "typo.toml"), plugin_options=[replicas]
        )


def test_point_done_rules() -> None:
    assert point_done(["ok"], 1) and point_done(["oom"], 3) and point_done(["error", "ok", "ok"], 2)
    assert not point_done([], 1) and not point_done(["error"], 1) and not point_done(["interrupted"], 1)
    assert not point_done(["ok"], 2)


def test_builtin_suites_reproduce_the_seed_study_at_both_scales() -> None:
    suites = builtin_suites()
    assert set(suites) == {
        "seed-single",
        "seed-ddp-scaling",
        "seed-largest-model",
        "seed-model-parallel",
        "seed-ipu",
        "seed-parallel-mesh",  # checked in tests/test_parallel_layout.py
        "seed004-batch-size",  # seed 004's suites are checked in tests/test_seed004.py
        "seed004-scaling",
        "seed004-epochs",
        "seed004-models",
        "mlperf-proxy",  # checked in tests/test_mlperf_proxy.py
    }
    seed = {name: load_sweep(path) for name, path in suites.items()}
    tiny = {name: load_sweep(path, scale="tiny") for name, path in suites.items()}

    single = seed["seed-single"].points
    assert len(single) == 2 * 3 * 2
    assert {(p.values["model"], p.values["precision"], p.values["batch_size"]) for p in single} >= {
        ("gpt2", "fp16-mixed", 64),
        ("gpt2-medium", "fp32", 128),
    }
    scaling = seed["seed-ddp-scaling"].points
    assert {p.values["devices"] for p in scaling} == {1, 2, 4, 8, 16}
    assert {p.values["batch_size"] for p in scaling} == {16, 32, 64, 128, 256}
    largest = seed["seed-largest-model"].points
    assert [p.values["model"] for p in largest][-2:] == ["gpt2-xxxl", "gpt2-4xl"]
    assert len({p.series for p in largest}) == 1 and largest[0].values["batch_size"] == 1
    parallel = seed["seed-model-parallel"].points
    assert {p.values["strategy"] for p in parallel} == {
        "ddp",
        "deepspeed-zero1",
        "deepspeed-zero2",
        "deepspeed-zero3",
        "fsdp",
    }
    assert len({p.series for p in parallel}) == 5 * 5  # a largest-fit search per strategy and device count
    ipu = seed["seed-ipu"].points
    assert {p.values["strategy"] for p in ipu} == {"pipelined", "sharded", "serial-phased", "parallel-phased"}
    assert all(p.values["backend"] == "ipu" for p in ipu) and {p.values["model"] for p in ipu} == {
        "ipu-384",
        "ipu-768",
    }

    # tiny: the same experiments with small models and short epochs
    for name, sweep in tiny.items():
        assert sweep.points, name
        assert all(p.values.get("steps_per_epoch", 99) <= 8 for p in sweep.points), name
    assert {p.values["model"] for p in tiny["seed-single"].points} == {"gpt-nano", "gpt-micro"}
    assert tiny["seed-largest-model"].memory_cap == 4 * 2**30


def test_dry_run_lists_points_and_what_is_done(tmp_path: Path, capsys) -> None:
    assert main(["sweep", "seed-single", "--scale", "tiny", "--dry-run", "--output-dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 12 and all("to run" in line for line in lines)
    first = lines[0].split()
    assert first[first.index("--strategy") + 1] == "single"  # the tiny scale's settings
    assert (
        first[first.index("--steps-per-epoch") + 1] == "4" and first[first.index("--model") + 1] == "gpt-nano"
    )
    assert not tmp_path.exists() or not list(tmp_path.iterdir())  # nothing ran, nothing written
    assert main(["sweep", "--list"]) == 0
    assert "seed-largest-model (scales: seed, tiny)" in capsys.readouterr().out


IMPOSSIBLE = (
    TINY_RUN
    + """
    [[grid]]                       # the search: batch 8 fits, 2M does not (under the memory cap), 4M is not tried
    batch_size = [8, 2000000, 4000000]
    largest_fit = "batch_size"
    [[grid]]                       # two more points
    batch_size = 8
    threads = [1, 2]
    [[grid]]                       # refused before it runs: no such backend here
    batch_size = 8
    backend = "npu"
    """
)


def read_log(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / SWEEP_LOG).read_text().splitlines()]


@pytest.mark.slow
def test_a_sweep_survives_oom_and_refusal_and_resumes_after_an_interrupt(tmp_path: Path) -> None:
    path = sweep_file(tmp_path, IMPOSSIBLE)
    out = tmp_path / "results"
    command = [
        sys.executable,
        "-m",
        "accelbench.cli",
        "sweep",
        str(path),
        "--output-dir",
        str(out),
        "--memory-cap",
        "3GiB",
    ]

    # 1. interrupt the sweep (as a scheduler's time limit would) once the first point is recorded
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / SWEEP_LOG).exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)  # the second point's process is starting
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    err = " ".join(err.split())
    assert proc.returncode == 130, err
    assert "interrupted: every finished point is recorded; run the same command again to resume" in err
    # the first point's record (names start with the UTC time); the second point may have begun training and
    # written an interrupted record of its own when the signal came
    first = read_record(sorted(out.glob("*.json"))[0])
    assert first.outcome.status == "ok" and first.config.batch_size == 8 and first.config.threads is None
    assert [e["status"] for e in read_log(out)] == ["ok"]
    records_before = set(out.glob("*.json"))
    # the second point fails fast (its allocation is refused at once): on a loaded host the signal can come after
    # it wrote its out-of-memory record but before the sweep logged it; the resumed sweep must then take that record
    oom_before = [r for r in map(read_record, records_before) if r.outcome.status == "oom"]
    assert all(r.config.batch_size == 2000000 for r in oom_before)

    # 2. run it again: the recorded point is skipped, the rest run; the OOM ends the search, the refusal is reported
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr  # one point could not be done
    err = " ".join(proc.stderr.split())
    assert "[1/6] batch_size=8: already recorded: 1 ok" in err
    if oom_before:
        assert "[2/6] batch_size=2000000: already recorded: 1 oom" in err
    else:
        assert "[2/6] batch_size=2000000: out of memory" in err
    assert "[3/6] batch_size=4000000: not run: a smaller size already did not fit" in err
    assert "backend=npu: refused: unknown backend 'npu'" in err
    recorded = 2 if oom_before else 1
    assert (
        f"sweep sweep: 4 of 6 points done ({recorded} already recorded), 1 beyond the largest size that fits, "
        "1 not done" in err
    )

    records = [read_record(p) for p in sorted(set(out.glob("*.json")) - records_before)]
    done = {
        (r.config.batch_size, r.config.threads, r.outcome.status)
        for r in [*records, *oom_before]
        if r.outcome.status != "interrupted"
    }
    assert done == {(2000000, None, "oom"), (8, 1, "ok"), (8, 2, "ok")}
    assert not any(r.config.batch_size == 4000000 for r in records)
    log = read_log(out)
    refused = next(e for e in log if e["status"] == "refused")
    assert refused["exit_code"] == 2 and refused["record"] is None and "npu" in refused["message"]
    (oom,) = oom_before or [
        read_record(Path(e["record"]))
        for e in log
        if e["status"] == "oom" and e["exit_code"] == 3 and e["record"]
    ]
    assert "can't allocate memory" in (oom.outcome.message or "")

    # 3. and again: nothing left but the refused point, which is tried again (it may work after a fix)
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "4 of 6 points done (4 already recorded)" in " ".join(proc.stderr.split())
    assert [e["status"] for e in read_log(out)][-1] == "refused"


@pytest.mark.slow
def test_a_point_that_runs_too_long_is_stopped_and_the_sweep_goes_on(tmp_path: Path) -> None:
    # epochs of 30,000 steps (a minute or more each) against a 2-epoch, 3-step point
    grid = "\n[[grid]]\nbatch_size = 8\nsteps_per_epoch = 30000\n[[grid]]\nbatch_size = 8\n"
    path = sweep_file(tmp_path, TINY_RUN + grid)
    out = tmp_path / "results"
    proc = accelbench("sweep", str(path), "--output-dir", str(out), "--point-timeout", "12", timeout=240)
    assert proc.returncode == 1, proc.stderr
    first, second = read_log(out)
    assert first["status"] == "timeout" and first["point"]["steps_per_epoch"] == 30000
    assert "stopped at 12 s" in first["message"]
    if first["record"]:  # stopped while training: the epochs it finished are kept, marked interrupted
        assert read_record(Path(first["record"])).outcome.status == "interrupted"
    assert second["status"] == "ok" and second["point"]["steps_per_epoch"] == 3
    assert "steps_per_epoch=30000: timeout: stopped at 12 s" in " ".join(proc.stderr.split())


def test_unknown_sweep_and_missing_argument_are_usage_errors(capsys) -> None:
    assert main(["sweep", "no-such-suite"]) == 2
    assert "'no-such-suite' is neither a sweep file nor a built-in suite" in capsys.readouterr().err
    assert main(["sweep"]) == 2
    assert "name a sweep file or a built-in suite" in capsys.readouterr().err
    assert main(["sweep", "seed-single", "--repeats", "0"]) == 2
    assert "--repeats 0: give at least 1" in capsys.readouterr().err


def test_same_point_ignores_where_records_go() -> None:
    a = RunConfig(model="gpt-nano", output_dir=Path("a"))
    assert same_point(a, a.model_copy(update={"output_dir": Path("b")}))
    assert not same_point(a, a.model_copy(update={"precision": "bf16-mixed"}))


def test_diverged_cause_is_what_the_check_found() -> None:
    """The sweep's line for a diverged point is the finding of the record's sentence, without what every diverged
    run shares; a sentence of another form (an older record's) is kept whole."""
    from accelbench.engine.quality import nonfinite_loss
    from accelbench.results import diverged_cause

    losses = torch.tensor([4.0, 3.9, float("nan"), float("nan")])
    assert (
        diverged_cause(nonfinite_loss(losses, 1, 4))
        == "the loss was nan at step 3 of epoch 2 (step 7 of the run)"
    )
    assert diverged_cause("a loss not finite") == "a loss not finite"


@pytest.mark.slow
def test_a_diverged_point_says_what_the_quality_checks_found(tmp_path: Path) -> None:
    """Three real points that diverge for three reasons: each line of the sweep, and its log, names the cause the
    record holds (the NaN loss and its step, the gradient norm over the limit, the loss stalled), not one text for
    all."""
    grid = (
        "\n[[grid]]\nlearning_rate = 1e30\n"
        "[[grid]]\ngrad_norm_limit = 1e-9\n"
        "[[grid]]\nlearning_rate = 1e-12\nstall_epochs = 1\n"
    )
    path = sweep_file(tmp_path, TINY_RUN + grid)
    out = tmp_path / "results"
    proc = accelbench("sweep", str(path), "--output-dir", str(out), timeout=300)
    assert proc.returncode == 0, proc.stderr  # diverged points are done: their records say why
    err = " ".join(proc.stderr.split())
    assert "learning_rate=1e+30: diverged: the loss was " in err and " of the run) (" in err
    assert "grad_norm_limit=1e-09: diverged: the gradient norm exploded: " in err
    assert "above --grad-norm-limit 1e-09 (" in err
    assert (
        "stall_epochs=1: diverged: the loss is not decreasing: the validation loss of epoch 2 (step 6)" in err
    )
    assert "a loss not finite" not in err
    log = read_log(out)
    assert [e["status"] for e in log] == ["diverged"] * 3
    for entry in log:
        record = read_record(Path(entry["record"]))
        assert record.quality is not None and record.quality.problem is not None
        assert entry["message"] and entry["message"] in record.quality.problem
        assert not entry["message"].startswith("training diverged")
