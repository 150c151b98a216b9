"""`accelbench plan`: which configurations it offers (meshes whose product is the job, no tp for a model that cannot
split, expert axes for a mixture of experts), the fits filter, the ranking's order, the winner's command read back by accelbench's own parser, the sweep
file `accelbench sweep` loads, the JSON round trip, refusals before anything runs, and (slow) a real 2-process
measurement of the top 2 compared with the prediction."""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import pytest
from core_support import accelbench

from accelbench.cli import build_parser, config_from_args, main, make_config
from accelbench.estimate.peak import CACHE_FILE as PEAK_CACHE_FILE
from accelbench.plan.candidates import DATA_PARALLEL, MODEL_PARALLEL, batch_choices, layouts
from accelbench.plan.ranking import spearman
from accelbench.plan.schema import Plan
from accelbench.results import read_record

ROOT = Path(__file__).resolve().parents[1]
# an absent device from the plugins' tables and one bus bandwidth: the same prediction on every host
H100 = ["--device", "H100", "--bus-bandwidth", "400"]


def plan(capsys: pytest.CaptureFixture[str], *args: str, expect: int = 0) -> Plan:
    """``accelbench plan ARGS --json``, in this process, as a Plan (exit ``expect``: 1 where nothing is ranked)."""
    assert main(["plan", *args, "--json"]) == expect, capsys.readouterr().err
    return Plan.model_validate_json(capsys.readouterr().out)


def test_meshes_multiply_to_the_job_and_single_only_alone() -> None:
    every = ["single", *DATA_PARALLEL, *MODEL_PARALLEL]
    for world in (1, 2, 3, 4, 6, 8, 12):
        found = layouts(world, every)
        assert found, world
        for layout in found:
            assert layout.dp * layout.tp * layout.pp == world, (world, layout)
            axes = [size for size in (layout.dp, layout.tp, layout.pp) if size > 1]
            if layout.strategy == "mesh":
                assert len(axes) >= 2 and layout.mesh is not None
            elif layout.strategy in ("tp", "pp"):
                assert layout.mesh == f"{layout.strategy}={world}"
        assert ("single" in {lay.strategy for lay in found}) == (world == 1)
    # 8 devices: every (tp, pp) with tp * pp dividing 8 other than (1, 1) appears once
    model_parallel = {(lay.dp, lay.tp, lay.pp) for lay in layouts(8, MODEL_PARALLEL)}
    assert model_parallel == {(8 // (t * p), t, p) for t in (1, 2, 4, 8) for p in (1, 2, 4, 8)
                              if 8 % (t * p) == 0 and (t, p) != (1, 1)}  # fmt: skip


def test_a_mixture_of_experts_is_offered_expert_parallel_meshes(capsys: pytest.CaptureFixture[str]) -> None:
    """moe-tiny (4 experts a layer) on 4 devices: the plan offers the expert axis alone (ep=4) and beside a data,
    tensor or pipeline axis, each ep rank training its own share of the batch (the global batch counts it); a dense
    model gets no expert axis, and an ep size must divide the experts."""
    p = plan(capsys, "--workload", "moe", "--model", "moe-tiny", "--devices", "4", "--precisions", "fp32",
             "--batch-sizes", "4", *H100)  # fmt: skip
    runs = p.ranked + p.dropped + p.unpriced
    experts = {r.mesh: r for r in runs if r.mesh and "ep=" in r.mesh}
    assert set(experts) == {"ep=4", "fsdp=2,ep=2", "ep=2,tp=2", "ep=2,pp=2"}
    assert experts["ep=4"].global_batch == 16 and experts["ep=2,tp=2"].global_batch == 8
    assert experts["ep=2,tp=2"].layout == "dp1 tp2 pp1 ep2"
    assert all(r.strategy == "mesh" and r.samples_per_s for r in experts.values())
    assert not any(lay.ep > 1 for lay in layouts(8, MODEL_PARALLEL))  # no experts: no expert axis
    with_experts = layouts(8, MODEL_PARALLEL, experts=6)  # 6 experts: only ep=2 divides them of 2, 4, 8
    assert {lay.ep for lay in with_experts} == {1, 2}
    assert all(lay.dp * lay.tp * lay.pp * lay.ep == 8 for lay in with_experts)


def test_global_batch_is_split_into_micro_batches() -> None:
    assert batch_choices(2, [4, 8, 16], 32) == [(16, 4), (16, 2), (16, 1)]
    assert batch_choices(3, [4, 8], 32) == []  # 32 samples over 3 replicas: not a whole number each
    assert batch_choices(1, [8, 2], None) == [(2, 1), (8, 1)]


def test_spearman() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3], [1, 1, 1]) is None  # no order to correlate with
    assert spearman([1.0], [1.0]) is None
    # ties share their mean rank: x ranks (1, 2.5, 2.5, 4) against y's (1, 2, 3, 4), Pearson of the ranks
    assert spearman([4, 2, 2, 1], [4, 3, 2, 1]) == pytest.approx(0.9486832980505138)


def test_the_comparison_ranks_the_measured_and_judges_the_top_pick() -> None:
    from accelbench.plan.measure import compare
    from accelbench.plan.schema import MeasuredRun

    def run(rank: int, predicted: float, measured: float | None) -> MeasuredRun:
        status = "ok" if measured is not None else "error"
        return MeasuredRun(label=f"c{rank}", predicted_rank=rank, measured_rank=None,
                           predicted_samples_per_s=predicted, measured_samples_per_s=measured, status=status)  # fmt: skip

    # the predicted top measured 4% below the best: within 5%; a failed run is left out of the correlation
    c = compare(
        [run(1, 300, 96), run(2, 200, 100), run(3, 150, 96), run(4, 100, None), run(5, 50, 10)], "out"
    )
    assert [r.measured_rank for r in c.runs] == [2, 1, 2, None, 4]  # equal rates share the better rank
    assert c.top_pick_gap == pytest.approx(0.04) and c.top_pick_within_5pct is True
    assert c.spearman == pytest.approx(spearman([300, 200, 150, 50], [96, 100, 96, 10]))
    assert Plan.model_fields["comparison"] and c.model_validate_json(c.model_dump_json()) == c
    # the top pick's run failed: no verdict rather than a wrong one
    failed = compare([run(1, 300, None), run(2, 200, 100)], "out")
    assert failed.top_pick_gap is None and failed.top_pick_within_5pct is None and failed.spearman is None


def test_a_model_that_cannot_split_is_not_offered_tensor_parallelism(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # gpt-nano has 3 attention heads: no tp size of 2 or 4 divides them; on 4 devices dp x tp x pp meshes are tried
    p = plan(
        capsys, "--model", "gpt-nano", "--devices", "4", "--precisions", "fp32", "--batch-sizes", "8", *H100
    )
    assert p.ranked and all(" tp1 " in r.layout + " " for r in p.ranked + p.dropped + p.unpriced)
    assert any("does not divide the model's 3 attention heads" in why for why in p.not_offered)
    # its 3 layers: 4 pipeline stages do not split them, 2 (x dp=2) do
    assert any("4 pipeline stages" in why and "3 layers" in why for why in p.not_offered)
    assert {r.strategy for r in p.ranked} >= {"ddp", "fsdp", "mesh"}
    assert {r.layout for r in p.ranked if r.strategy == "mesh"} == {"dp2 tp1 pp2"}
    for r in p.ranked:
        assert r.options["devices"] == 4
        if r.strategy in ("pp", "mesh"):
            assert r.microbatches and r.batch_size % r.microbatches == 0


def test_ranked_by_throughput_and_by_time_to_a_token_budget(capsys: pytest.CaptureFixture[str]) -> None:
    p = plan(capsys, "--model", "gpt-mini", "--devices", "2", "--batch-sizes", "4,16,64", *H100)
    rates = [r.samples_per_s or 0.0 for r in p.ranked]
    assert len(rates) > 10 and rates == sorted(rates, reverse=True)
    assert p.candidates == len(p.ranked) + len(p.dropped) + len(p.unpriced)
    budget = plan(capsys, "--model", "gpt-mini", "--devices", "2", "--batch-sizes", "4,16,64", "--token-budget",
                  "1e9", *H100)  # fmt: skip
    times = [r.time_to_budget_s or math.inf for r in budget.ranked]
    assert times == sorted(times)
    top = budget.ranked[0]
    from accelbench.config import RunConfig
    from accelbench.estimate.facts import meta_facts
    from accelbench.plugins import get_host

    config = get_host().resolve(RunConfig(model="gpt-mini"))
    tokens_per_sample = meta_facts(get_host().workload("gpt"), config).tokens_per_sample  # its context
    assert tokens_per_sample > 1
    assert top.time_to_budget_s == pytest.approx(1e9 / (top.samples_per_s or 0) / tokens_per_sample)


def test_a_small_device_drops_the_big_batches(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--model", "gpt2-medium", "--precisions", "fp32", "--batch-sizes", "1,8,32,128"]
    small = plan(capsys, *args, "--device", "V100-16GB")
    large = plan(capsys, *args, "--device", "H200")
    assert small.dropped and not large.dropped
    plain = [r for r in small.ranked if not r.activation_checkpointing]
    assert max(r.batch_size for r in plain) < min(r.batch_size for r in small.dropped)
    # what does not fit is priced again with activation checkpointing, which fits batch 128 on 16 GB
    assert [r.batch_size for r in small.ranked if r.activation_checkpointing] == [128]
    assert not any(r.activation_checkpointing for r in large.ranked)  # all fit: nothing to checkpoint
    assert not any("activation checkpointing" in note for note in large.assumptions)
    for r in small.dropped:
        assert r.fits is False and (r.peak_memory_bytes or 0) > (r.device_memory_bytes or math.inf)
        assert r.reason and "predicted peak" in r.reason
    main(["plan", *args, "--device", "V100-16GB"])
    assert "dropped" in capsys.readouterr().out


def test_the_winner_is_a_command_accelbench_reads_back(capsys: pytest.CaptureFixture[str]) -> None:
    p = plan(capsys, "--model", "gpt-mini", "--devices", "4", "--global-batch", "64", "--batch-sizes", "8,16,64",
             "--precisions", "fp32,bf16-mixed", "--top", "40", *H100)  # fmt: skip
    # accumulation is free in the model: equal rates, and the tie goes to fewer accumulation steps
    for a, b in zip(p.ranked, p.ranked[1:], strict=False):
        if a.samples_per_s == b.samples_per_s and a.strategy == b.strategy and a.precision == b.precision:
            assert a.grad_accum <= b.grad_accum, (a.label, b.label)
    strategies = set()
    for run in p.ranked + p.dropped:  # every layout: meshes and pipelines (microbatches) too
        words = shlex.split(run.command)
        assert words[:2] == ["accelbench", "run"]
        parsed = config_from_args(build_parser().parse_args(words[1:]))
        assert parsed == make_config(run.options)
        assert (parsed.strategy, parsed.mesh, parsed.batch_size, parsed.grad_accum, parsed.precision) == (
            run.strategy, run.mesh, run.batch_size, run.grad_accum, run.precision)  # fmt: skip
        assert run.global_batch == 64  # the per-replica batch times the data-parallel replicas
        strategies.add(run.strategy)
    assert {
        "ddp",
        "fsdp",
        "pp",
        "mesh",
    } <= strategies  # tp=2 within meshes; tp=4 alone does not divide 6 heads
    assert any("4 devices does not divide the model's 6 attention heads" in why for why in p.not_offered)
    # tp and pp run no gradient accumulation (microbatches instead): those combinations are not offered, and said
    assert any("does not support --grad-accum" in why for why in p.not_offered)
    main(["plan", "--model", "gpt-mini", "--devices", "2", "--top", "3", *H100])
    out = capsys.readouterr().out
    assert f"winner: {shlex.join(['accelbench', 'run'])}" in out and "samples/s" in out


def test_the_sweep_file_is_one_accelbench_sweep_runs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The top K as a sweep file accelbench sweep runs, as TOML (the core reads it alone) or YAML."""
    for name in ("top.toml", "top.yaml"):  # TOML needs nothing more; YAML, PyYAML
        check_sweep_file(capsys, tmp_path, tmp_path / name)


def check_sweep_file(capsys: pytest.CaptureFixture[str], tmp_path: Path, path: Path) -> None:
    from accelbench.sweep.spec import load_sweep

    p = plan(capsys, "--model", "gpt-mini", "--devices", "2", "--top", "4", "--sweep-file", str(path), *H100)
    sweep = load_sweep(path, output_dir=tmp_path / "out")
    assert len(sweep.points) == 4
    for run, point in zip(p.ranked[:4], sweep.points, strict=True):
        config = sweep.config(point, tmp_path / "out")
        assert (config.strategy, config.batch_size, config.precision, config.devices) == (
            run.strategy, run.batch_size, run.precision, 2)  # fmt: skip
    assert main(["sweep", str(path), "--dry-run", "--output-dir", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.count("to run") == 4


def test_json_round_trips_and_unpriced_are_listed_apart(capsys: pytest.CaptureFixture[str]) -> None:
    # two nodes of PCIe cards (whose network the table does not assume) and no bus bandwidth given: no step time
    # for any data-parallel candidate; none is ranked silently
    args = [
        "--model",
        "gpt-nano",
        "--devices",
        "2",
        "--nnodes",
        "2",
        "--device",
        "H100 PCIe",
        "--strategies",
        "ddp,fsdp",
        "--batch-sizes",
        "8",
    ]
    assert main(["plan", *args, "--json"]) == 1  # nothing to choose from: not a success
    assert "nothing ranked: no bus bandwidth" in " ".join(capsys.readouterr().err.split())
    p = plan(capsys, *args, expect=1)
    assert p.schema_name == "accelbench.plan" and p.schema_version == 1
    assert not p.ranked and len(p.unpriced) == p.candidates > 0
    assert all(r.reason and "bus bandwidth" in r.reason for r in p.unpriced)
    assert Plan.model_validate_json(p.to_json()) == p
    assert json.loads(p.to_json())["schema"] == "accelbench.plan"
    main(["plan", "--model", "gpt-nano", "--devices", "2", "--nnodes", "2", "--device", "H100 PCIe", "--strategies",
          "ddp"])  # fmt: skip
    out = capsys.readouterr().out
    assert "unpriced" in out and "--bus-bandwidth" in out and "winner" not in out


def test_several_nodes_are_one_job(capsys: pytest.CaptureFixture[str]) -> None:
    p = plan(capsys, "--model", "gpt-mini", "--devices", "2", "--nnodes", "2", "--precisions", "bf16-mixed",
             "--batch-sizes", "16", *H100)  # fmt: skip
    assert p.ranked and all(r.options["nnodes"] == 2 and r.options["devices"] == 2 for r in p.ranked)
    for r in p.ranked:  # layouts over all 4 devices; the command names the node shape
        dp, tp, pp = (int(part[2:]) for part in r.layout.split())
        assert dp * tp * pp == 4 and "--nnodes 2" in r.command and "--devices 2" in r.command
        assert r.global_batch == 16 * dp


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--model", "gpt-huge"], "unknown model 'gpt-huge'"),
        (["--model", "gpt-nano", "--devices", "0"], "--devices 0"),
        (["--model", "gpt-nano", "--measure", "0"], "--measure 0"),
        # one configuration (ranked, or unpriced on a host whose peak is not measured yet): 2 cannot be measured
        (
            ["--model", "gpt-nano", "--precisions", "fp32", "--batch-sizes", "8", "--measure", "2"],
            "--measure 2: ",
        ),
        (["--model", "gpt-nano", "--top", "0"], "--top 0"),
        (
            ["--model", "gpt-nano", "--measure", "1", "--measure-repeats", "0"],
            "--measure-repeats 0: give 1 to",
        ),
        (["--model", "gpt-nano", "--measure-repeats", "3"], "add --measure K"),
        (
            ["--model", "gpt-nano", "--device", "H100", "--measure", "1"],
            "--measure 1 runs the configurations",
        ),
        (["--model", "gpt-nano", "--nnodes", "2", "--measure", "1"], "--nnodes 2 plans a multi-node job"),
        (["--model", "gpt-nano", "--workload", "nosuch"], "unknown workload 'nosuch'"),
        (["--model", "gpt-nano", "--nnodes", "0"], "--nnodes 0"),
        (
            ["--model", "gpt-nano", "--device", "nosuch"],
            "--device 'nosuch': no installed plugin's peak table",
        ),
        (
            ["--model", "gpt-nano", "--precisions", "bf16"],
            "unknown precision 'bf16'; did you mean bf16-mixed",
        ),
        (["--model", "gpt-nano", "--devices", "2", "--strategies", "zero"], "unknown strategy 'zero'"),
        (["--model", "gpt-nano", "--devices", "2", "--strategies", "single"], "--strategies single"),
        (
            ["--model", "gpt-nano", "--devices", "2", "--strategies", "ddp", "--global-batch", "3"],
            "--global-batch 3",
        ),
        (["--model", "gpt-nano", "--device", "H100", "--measure-peak"], "--measure-peak"),
        (["--model", "gpt-nano", "--sweep-file", "top.json"], "--sweep-file top.json"),
        (
            ["--model", "gpt-nano", "--devices", "2", "--pp-schedules", "1f1b,zb"],
            "unknown pipeline schedule 'zb'",
        ),
        # estimate's bandwidth checks, shared: both sources at once, an absurd figure, records that are not there
        (["--model", "gpt-nano", "--devices", "2", "--comm", "c"], "either --comm (measured records) or"),
        (["--model", "gpt-nano", "--devices", "2", "--bus-bandwidth", "1e9"], "--bus-bandwidth 1000000000.0"),
        (["--model", "gpt-nano", "--devices", "2", "--bus-bandwidth", "-1"], "--bus-bandwidth -1"),
        (["--model", "gpt-nano", "--efficiency", "0"], "--efficiency 0"),
    ],
)
def test_bad_input_is_refused_before_anything_runs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], says: str
) -> None:
    out = tmp_path / "out"
    # an absent device unless the case names one or measures (which runs on this host's device)
    device = [] if "--device" in args or "--measure" in args else ["--device", "H100"]
    bandwidth = [] if "--bus-bandwidth" in args else H100[2:]
    assert main(["plan", *args, *bandwidth, *device, "--out", str(out)]) == 2
    assert says in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.slow
def test_measure_the_top_two_for_real_over_gloo(tmp_path: Path) -> None:
    """Two real 2-process gloo runs of gpt-nano (2 epochs of 3 steps), then the same plan again: the records are
    reused, nothing runs twice."""
    out = tmp_path / "measured"
    args = ["plan", "--model", "gpt-nano", "--devices", "2", "--bus-bandwidth", "1", "--strategies", "ddp,fsdp",
            "--precisions", "fp32", "--batch-sizes", "8", "--measure", "2", "--measure-epochs", "2",
            "--measure-steps", "3", "--out", str(out),
            "--measure-peak"]  # fmt: skip  # its own peak to rank by (cached), whatever ran before in the session
    done = accelbench(*args, "--json", cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr
    p = Plan.model_validate_json(done.stdout)
    assert p.comparison is not None and len(p.comparison.runs) == 2
    for run in p.comparison.runs:
        assert run.status == "ok" and run.measured_samples_per_s and run.measured_samples_per_s > 0
        assert run.record and Path(run.record).is_file()
    assert {r.measured_rank for r in p.comparison.runs} == {1, 2}
    assert p.comparison.spearman in (-1.0, 1.0)  # two configurations: the orders agree or not
    assert p.comparison.top_pick_gap is not None and p.comparison.top_pick_gap >= 0
    records = sorted(out.glob("*.json"))
    assert len(records) == 2
    assert all(r.measured_runs == 1 and r.spread is None for r in p.comparison.runs)
    assert all(r.waited is None or 0 <= r.waited <= 1 for r in p.comparison.runs)
    # two repeats: pass 1 reuses both records, pass 2 runs each configuration once more
    again = accelbench(*args, "--measure-repeats", "2", cwd=ROOT, timeout=600)
    assert again.returncode == 0, again.stderr
    assert "pass 1 of 2" in again.stderr and "pass 2 of 2" in again.stderr
    assert again.stderr.index("already recorded") < again.stderr.index("pass 2 of 2")
    now = sorted(out.glob("*.json"))
    assert len(now) == 4 and set(records) < set(now)
    assert "Spearman's rank correlation" in again.stdout and "predicted against measured" in again.stdout
    assert (
        "spread" in again.stdout and "waited" in again.stdout
    )  # each run's host contention, from its record
    # the same command again runs nothing; each configuration's figure is the median of its two runs
    listed = accelbench(*args, "--measure-repeats", "2", "--json", cwd=ROOT, timeout=300)
    assert listed.returncode == 0, listed.stderr
    assert sorted(out.glob("*.json")) == now
    repeated = Plan.model_validate_json(listed.stdout).comparison
    assert repeated is not None
    for run in repeated.runs:
        rates = [
            read_record(f).metrics.steady.samples_per_s  # type: ignore[union-attr]
            for f in now
            if read_record(f).config.strategy == run.label.split()[0]
        ]
        assert run.measured_runs == 2 and len(rates) == 2
        assert run.measured_samples_per_s == pytest.approx(sum(rates) / 2)  # the median of two
        assert run.spread == pytest.approx(abs(rates[0] - rates[1]) / (sum(rates) / 2))


def test_plan_calibrate_prices_each_configuration_from_its_traced_operators(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --calibrate the ranking comes from this device's calibration over each candidate's own operators, so
    configurations of one model that a fixed efficiency prices alike (the same FLOPs a sample) are told apart."""
    from accelbench.cli import main
    from accelbench.estimate import calibration as module

    monkeypatch.setenv("ACCELBENCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(module, "MATMUL_SIZES", (16, 64))
    monkeypatch.setattr(module, "STREAM_BYTES", (3 * 2**12, 3 * 2**20))
    monkeypatch.setattr(module, "cold_memory_bytes", lambda device: 8 * 2**20)
    # one intra-op thread (a one-core host): on a busy host a second OpenMP thread descheduled at every matmul's
    # barrier made each 64^3 product wait a timeslice (8.8 ms, 0.06 GFLOP/s), a calibration that priced both alike
    monkeypatch.setattr("accelbench.hostinfo.usable_cores", lambda: 1)
    argv = ["plan", "--model", "gpt-nano", "--devices", "1", "--batch-sizes", "1,16", "--precisions", "fp32"]
    assert main([*argv, "--calibrate", "--json"]) == 0
    ranked = json.loads(capsys.readouterr().out)["ranked"]
    rates = {run["batch_size"]: run["samples_per_s"] for run in ranked}
    assert rates[16] > rates[1]  # per-operator dispatch weighs more on the smaller batch
    assert main([*argv, "--measure-peak", "--json"]) == 0  # the efficiency model: a measured matmul peak
    flat = {run["batch_size"]: run["samples_per_s"] for run in json.loads(capsys.readouterr().out)["ranked"]}
    for batch in (1, 16):  # priced by another model: the calibration's rates, not a fixed share of the peak
        assert rates[batch] != pytest.approx(flat[batch], rel=0.01)
    assert main([*argv, "--calibrate", "--device", "H100"]) == 2
    assert "--calibrate" in capsys.readouterr().err


def test_points_an_interrupted_measurement_did_not_reach_are_not_run_not_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """On the H200 (2026-11-28) the call's budget interrupted `plan --measure 12`: the point it had not reached
    was listed as 'failed (no record: see the sweep log)', where nothing had failed. It is 'not run
    (interrupted)', and the command exits as the interrupted sweep did (130), so that a script resumes it."""
    import accelbench.sweep.runner as runner
    from accelbench.cli import main
    from accelbench.sweep.runner import SweepSummary

    monkeypatch.setattr(runner, "run_sweep", lambda *args, **kwargs: SweepSummary(interrupted=True))
    monkeypatch.setenv("ACCELBENCH_CACHE_DIR", str(tmp_path / "cache"))
    # --measure-peak: a CPU has no peak table, and a peak cached by an earlier test is not this test's to count on
    argv = ["plan", "--model", "gpt-nano", "--devices", "1", "--backend", "cpu", "--precisions", "fp32",
            "--batch-sizes", "4,8", "--measure-peak", "--measure", "2", "--out", str(tmp_path / "plan"),
            "--json"]  # fmt: skip
    assert main(argv) == 130
    measured = json.loads(capsys.readouterr().out)["comparison"]["runs"]
    assert [run["status"] for run in measured] == ["not run (interrupted)"] * 2
    # the peak of the precision planned for, not of every one this CPU runs (estimate's table shows them all)
    (peak,) = json.loads((tmp_path / "cache" / PEAK_CACHE_FILE).read_text())
    assert ", float32, ieee-fp32," in peak


def test_a_sweep_file_needs_no_extra_and_a_yaml_one_without_pyyaml_is_refused_naming_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A newcomer's `plan --measure 3` ended in `ModuleNotFoundError: No module named 'yaml'` writing its sweep file:
    plan writes TOML, which the core reads alone (--measure's own file too), and a .yaml name without PyYAML is
    refused before anything is planned, naming the extra and the TOML name that needs none."""
    import importlib.util

    from accelbench.plan.measure import SWEEP_NAME

    assert SWEEP_NAME.endswith(".toml")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "yaml" else real(name, *a)
    )
    assert main(["plan", "--model", "gpt-nano", "--sweep-file", str(tmp_path / "top.yaml"), *H100]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "needs PyYAML (pip install 'accelbench[yaml]')" in err and "give a .toml name (top.toml)" in err
    assert not (tmp_path / "top.yaml").exists()
    plan(capsys, "--model", "gpt-nano", "--top", "2", "--sweep-file", str(tmp_path / "top.toml"), *H100)
    assert (tmp_path / "top.toml").read_text().count("[[grid]]") == 2


def test_plan_takes_estimates_stack_options(capsys: pytest.CaptureFixture[str]) -> None:
    """--fsdp-param-dtype bf16 gathers FSDP's units in bf16 (less memory a candidate, and its stack says so), as
    estimate prices it; a bucket size no DeepSpeed takes is refused before anything is planned."""
    args = ["--model", "gpt-mini", "--devices", "2", "--strategies", "fsdp", "--precisions", "bf16-mixed",
            "--batch-sizes", "8", *H100]  # fmt: skip
    default, bf16 = plan(capsys, *args), plan(capsys, *args, "--fsdp-param-dtype", "bf16")
    (a,), (b,) = default.ranked, bf16.ranked
    assert b.peak_memory_bytes < a.peak_memory_bytes
    assert main(["plan", *args, "--ds-reduce-bucket", "0"]) == 2
    assert "--ds-reduce-bucket 0" in capsys.readouterr().err
