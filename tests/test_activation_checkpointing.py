"""Activation checkpointing (``--activation-checkpointing``): each unit's forward runs again in backward, leaving
the parameters' names, the losses and the gradients as they were; a run records it, keeps fewer activations and
predicts that (the traced step holds the recomputed forward); workloads and layouts that cannot run it are refused
before anything runs; ``plan`` prices pipeline schedules and checkpointing as a run would run them; (slow) real
two-process DDP, FSDP, ZeRO-3, tensor- and pipeline-parallel runs train the same losses with it as without."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from core_support import accelbench

from accelbench.cli import main
from accelbench.config import RunConfig
from accelbench.contract import standard_plan
from accelbench.engine.checkpointing import apply_activation_checkpointing, check_activation_checkpointing
from accelbench.engine.runner import run
from accelbench.errors import ConfigError
from accelbench.estimate.operators import step_operators
from accelbench.plan.schema import Plan
from accelbench.plugins import get_host
from accelbench.results import check_prediction, read_record
from accelbench.testing import tiny_config

H100 = ["--device", "H100", "--bus-bandwidth", "400"]


def _gpt(checkpointed: bool, dropout: float = 0.1) -> tuple[torch.nn.Module, Any]:
    host = get_host()
    config = host.resolve(tiny_config(n_layer=2, n_embd=32, block_size=16, dropout=dropout))
    torch.manual_seed(0)
    job = host.workload("gpt").build(config)
    if checkpointed:
        assert apply_activation_checkpointing(job.model, job.units) == 2
    return job.model, job.units


def test_a_checkpointed_unit_runs_its_forward_again_in_backward_with_the_same_gradients() -> None:
    plain, _ = _gpt(checkpointed=False)
    checkpointed, units = _gpt(checkpointed=True)
    assert [n for n, _ in plain.named_parameters()] == [n for n, _ in checkpointed.named_parameters()]
    calls: list[str] = []
    for path in units.units:  # the attention inside each unit: called once in forward, once more in backward
        checkpointed.get_submodule(path).attn.register_forward_hook(lambda *_, p=path: calls.append(p))
    inputs = torch.randint(0, 60, (4, 16))
    targets = torch.randint(0, 60, (4, 16))
    losses = []
    for model in (plain, checkpointed):
        torch.manual_seed(1)  # the same dropout masks: the recomputation replays them
        loss = model(inputs, targets)
        loss.backward()
        losses.append(loss.item())
    assert calls == [
        *units.units,
        *reversed(units.units),
    ]  # forward, then again as backward reaches each unit
    assert losses[0] == losses[1]
    for (name, a), (_, b) in zip(plain.named_parameters(), checkpointed.named_parameters(), strict=True):
        assert a.grad is not None and b.grad is not None
        torch.testing.assert_close(a.grad, b.grad, msg=name)


def test_the_recomputation_is_in_backward() -> None:
    checkpointed, units = _gpt(checkpointed=True)
    calls: list[bool] = []
    for path in units.units:
        checkpointed.get_submodule(path).attn.register_forward_hook(
            lambda *_: calls.append(torch.is_grad_enabled() and torch._C._current_graph_task_id() != -1)
        )
    loss = checkpointed(torch.randint(0, 60, (2, 16)), torch.randint(0, 60, (2, 16)))
    assert calls == [False, False]
    loss.backward()
    assert calls == [False, False, True, True]  # each unit once more, inside the backward pass


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, Path]:
    """The same four-layer GPT trained twice in this process (2 epochs of 3 steps), without and with checkpointing:
    the records' files."""
    out: dict[bool, Path] = {}
    for checkpointed in (False, True):
        folder = tmp_path_factory.mktemp(f"ac-{checkpointed}")
        config = tiny_config(epochs=2, steps_per_epoch=3, output_dir=folder, n_layer=4, n_embd=64, block_size=64,
                             batch_size=8, activation_checkpointing=checkpointed)  # fmt: skip
        record, path, status = run(config, get_host())
        assert status == "ok" and record is not None and path is not None
        out[checkpointed] = path
    return out


def test_a_run_records_it_trains_the_same_losses_and_keeps_fewer_activations(runs: dict[bool, Path]) -> None:
    plain, checkpointed = read_record(runs[False]), read_record(runs[True])
    assert checkpointed.config.activation_checkpointing and not plain.config.activation_checkpointing
    assert [e.loss for e in plain.metrics.epochs] == [e.loss for e in checkpointed.metrics.epochs]  # type: ignore[union-attr]
    peaks = [r.metrics.tensor_peak.peak_bytes for r in (plain, checkpointed)]  # type: ignore[union-attr]
    assert peaks[1] < 0.7 * peaks[0]
    # the prediction is of the run it describes: fewer activations kept, one more forward pass of the layers
    assert checkpointed.prediction is not None and plain.prediction is not None
    assert checkpointed.prediction.flops_per_step > plain.prediction.flops_per_step
    assert checkpointed.prediction.memory_bytes["activations"] < plain.prediction.memory_bytes["activations"]
    check = check_prediction(checkpointed)
    assert check is not None and check.memory_basis == "tensors"
    assert check.memory_error is not None and abs(check.memory_error) < 0.15


def test_the_first_layers_backward_is_the_peak_where_the_layers_inputs_are_small(tmp_path: Path) -> None:
    """Checkpointed, a short sequence: each layer keeps an input of 8 x 16 x 64 values, and its gradients weigh 3
    times that. The last backward, of the first layer rebuilt, then holds the later layers' gradients where their
    inputs were: the step's high point, which the estimate now predicts (it had taken the last layer's backward,
    before any gradient: -12.0% here; now -1.2%)."""
    config = tiny_config(epochs=1, steps_per_epoch=2, output_dir=tmp_path, n_layer=3, n_embd=64, block_size=16,
                         batch_size=8, activation_checkpointing=True)  # fmt: skip
    record, path, status = run(config, get_host())
    assert status == "ok" and path is not None
    check = check_prediction(read_record(path))
    assert check is not None and check.memory_basis == "tensors"
    assert check.memory_error is not None and abs(check.memory_error) < 0.03


def test_compare_names_the_checkpointed_run_as_its_own_system(runs: dict[bool, Path]) -> None:
    from accelbench.compare import load_records, system_label

    loaded = load_records(list(runs.values()))
    labels = {r.system.activation_checkpointing: system_label(r) for r in loaded.records}
    assert labels[True] == labels[False] + " · activation checkpointing"


def test_estimate_trace_checkpoints_as_the_run_did(
    runs: dict[bool, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """``estimate --trace`` of the checkpointed run's configuration (fake tensors) against that run's tensor peak."""
    import json

    args = ["estimate", "--model", "custom", "--layers", "4", "--heads", "2", "--embd", "64", "--block-size", "64",
            "--batch-size", "8", "--dropout", "0", "--trace", "--json"]  # fmt: skip
    traced = {}
    for checkpointed in (False, True):
        assert main([*args, *(["--activation-checkpointing"] if checkpointed else [])]) == 0
        traced[checkpointed] = json.loads(capsys.readouterr().out)["traced_peak_bytes"]
    measured = read_record(runs[True]).metrics.tensor_peak  # type: ignore[union-attr]
    assert measured is not None
    assert traced[True] == pytest.approx(measured.peak_bytes, rel=0.03)
    assert traced[True] < 0.7 * traced[False]


@pytest.mark.parametrize(
    ("layout", "tp_calls_a_layer"),
    [
        (["--strategy", "tp"], 4),
        (["--mesh", "tp=2", "--sequence-parallel"], 4),
        (["--strategy", "pp"], 0),
        (["--mesh", "pp=2", "--pp-schedule", "interleaved-1f1b"], 0),
    ],  # fmt: skip
)
def test_estimate_checkpoints_tensor_and_pipeline_parallel_layouts(
    capsys: pytest.CaptureFixture[str], layout: list[str], tp_calls_a_layer: int
) -> None:
    """Each layer keeps its input for each microbatch in flight and one layer is rebuilt in backward; tensor
    parallelism's forward all-reduces run again in the recomputed forward; one more forward pass of FLOPs."""
    import json

    args = ["estimate", "--model", "gpt-micro", "--devices", "2", "--batch-size", "8", "--json", *layout]
    found = {}
    for checkpointed in (False, True):
        assert main([*args, *(["--activation-checkpointing"] if checkpointed else [])]) == 0
        found[checkpointed] = json.loads(capsys.readouterr().out)
    plain, checkpointed = found[False], found[True]
    assert checkpointed["memory"]["activations_bytes"] < 0.25 * plain["memory"]["activations_bytes"]
    assert checkpointed["memory"]["backward_transient_bytes"] > plain["memory"]["backward_transient_bytes"]
    assert checkpointed["peak_memory_bytes"] < plain["peak_memory_bytes"]
    assert checkpointed["flops_per_step"] > plain["flops_per_step"]
    assert not any("not modelled" in a for a in checkpointed["assumptions"])
    tp = [(c["count"], c["bus_bytes"]) for f in (plain, checkpointed) for c in f["comm"] if c["axis"] == "tp"]
    if tp_calls_a_layer:  # gpt-micro: 4 layers; 4 all-reduces a layer, 6 with the forward run again
        assert tp == [(4 * 4, tp[0][1]), (6 * 4, pytest.approx(1.5 * tp[0][1]))]
    else:
        assert tp == []


def test_the_traced_step_holds_the_recomputed_forward() -> None:
    host = get_host()
    plan = standard_plan("fp32", "ieee-fp32")
    matmuls = {}
    for checkpointed in (False, True):
        config = host.resolve(
            tiny_config(n_layer=2, n_embd=32, block_size=16, activation_checkpointing=checkpointed)
        )
        traced = step_operators(host.workload("gpt"), config, plan, "cpu")
        matmuls[checkpointed] = {
            phase: sum(op.flops for op in traced.operators if op.phase == phase and op.matmul is not None)
            for phase in ("forward", "backward")
        }
    assert matmuls[True]["forward"] == matmuls[False]["forward"]
    assert matmuls[True]["backward"] > matmuls[False]["backward"]  # the layers' forward matmuls, again


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--workload", "moe", "--model", "moe-tiny"], "the moe workload's units cannot be run twice"),
        (["--workload", "resnet50"], "the resnet50 workload's units cannot be run twice"),
        (
            ["--model", "gpt-nano", "--mesh", "pp=2", "--pp-schedule", "zbv", "--devices", "2"],
            "does not compose with torch's checkpoint (pytorch/pytorch#136766)",
        ),
    ],
)
def test_what_cannot_run_it_is_refused_before_anything_runs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], says: str
) -> None:
    assert main(["run", *args, "--activation-checkpointing", "--output-dir", str(tmp_path / "out")]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_check_reads_the_workloads_own_declaration() -> None:
    host = get_host()
    for name, allowed in (
        ("gpt", True),
        ("llama", True),
        ("bert", True),
        ("moe", False),
        ("resnet50", False),
    ):
        config = host.resolve(RunConfig(workload=name, model=host.workload(name).model_names()[0],
                                         activation_checkpointing=True))  # fmt: skip
        units = host.workload(name).units(config)
        if allowed:
            check_activation_checkpointing(config, units)
        else:
            with pytest.raises(ConfigError, match="cannot be run twice"):
                check_activation_checkpointing(config, units)


def _plan(capsys: pytest.CaptureFixture[str], *args: str) -> Plan:
    assert main(["plan", *args, "--json"]) == 0, capsys.readouterr().err
    return Plan.model_validate_json(capsys.readouterr().out)


def test_plan_prices_pipeline_schedules_and_says_which(capsys: pytest.CaptureFixture[str]) -> None:
    p = _plan(capsys, "--model", "gpt2-medium", "--devices", "2", "--strategies", "pp", "--batch-sizes", "8",
              "--precisions", "bf16-mixed", "--top", "40", *H100)  # fmt: skip
    by_schedule = {(r.microbatches, r.pp_schedule): r for r in p.ranked}
    assert {s for _, s in by_schedule} == {"gpipe", "1f1b", "interleaved-1f1b"}
    gpipe, one_f_one_b, interleaved = (by_schedule[(8, s)] for s in ("gpipe", "1f1b", "interleaved-1f1b"))
    # the same bubble, but GPipe keeps every microbatch's activations in flight; interleaving shrinks the bubble
    assert gpipe.step_time_s == one_f_one_b.step_time_s
    assert (gpipe.peak_memory_bytes or 0) > (one_f_one_b.peak_memory_bytes or 0)
    assert (interleaved.step_time_s or 0) < (one_f_one_b.step_time_s or 0)
    assert (
        "--pp-schedule interleaved-1f1b" in interleaved.command and "/interleaved-1f1b" in interleaved.label
    )
    only = _plan(capsys, "--model", "gpt-mini", "--devices", "2", "--strategies", "pp", "--batch-sizes", "8",
                 "--precisions", "bf16-mixed", "--pp-schedules", "gpipe", *H100)  # fmt: skip
    assert {r.pp_schedule for r in only.ranked} == {"gpipe"}


def test_plan_checkpoints_what_does_not_fit_without_it(capsys: pytest.CaptureFixture[str]) -> None:
    # priced at a fraction of the peak: what is checkpointed, not the rates, is the subject (a gpt2-xl step traced
    # for the A100's profile costs seconds a shape)
    args = ["--model", "gpt2-xl", "--devices", "4", "--device", "A100-40GB", "--bus-bandwidth", "100",
            "--precisions", "bf16-mixed", "--strategies", "ddp,fsdp,pp", "--batch-sizes", "32,64", "--top", "50",
            "--efficiency", "0.4"]  # fmt: skip
    auto = _plan(capsys, *args)
    (too_big,) = [
        r for r in auto.dropped if r.strategy == "ddp"
    ]  # ddp at batch 64 holds too many activations
    (twin,) = [r for r in auto.ranked if r.activation_checkpointing]
    assert (twin.strategy, twin.batch_size, twin.precision) == (
        too_big.strategy,
        too_big.batch_size,
        too_big.precision,
    )
    assert twin.fits and (twin.peak_memory_bytes or 0) < (too_big.peak_memory_bytes or 0)
    assert (twin.step_time_s or 0) > (too_big.step_time_s or 0)  # one more forward pass
    assert twin.command.endswith("--activation-checkpointing") and twin.label.endswith("+ac")
    assert any(
        "priced for the 1 configuration(s) predicted not to fit without it" in a for a in auto.assumptions
    )
    off = _plan(capsys, *args, "--activation-checkpointing", "off")
    assert not any(r.activation_checkpointing for r in off.ranked + off.dropped)
    both = _plan(capsys, *args, "--activation-checkpointing", "both")
    plain = [r for r in both.ranked + both.dropped if not r.activation_checkpointing]
    checkpointed = [r for r in both.ranked + both.dropped if r.activation_checkpointing]
    # data parallelism and pipelines checkpoint alike, a pipeline's peak as its schedule holds microbatches
    assert {r.strategy for r in checkpointed} == {"ddp", "fsdp", "pp"}
    assert len(plain) == len(off.ranked) + len(off.dropped)
    for r in checkpointed:
        (twin,) = [p for p in plain if _shape_of(p) == _shape_of(r)]
        assert (r.peak_memory_bytes or 0) < (twin.peak_memory_bytes or 0), r.label
    # a zero-bubble schedule cannot checkpoint: said not to be offered, with the reason
    zero_bubble = _plan(capsys, *args, "--strategies", "pp", "--pp-schedules", "1f1b,zbv", "--activation-checkpointing",
                        "both")  # fmt: skip
    assert {
        r.pp_schedule for r in zero_bubble.ranked + zero_bubble.dropped if r.activation_checkpointing
    } == {"1f1b"}
    assert any("pytorch/pytorch#136766" in why for why in zero_bubble.not_offered)


def _shape_of(run: Any) -> tuple[Any, ...]:
    return (
        run.strategy,
        run.batch_size,
        run.grad_accum,
        run.precision,
        run.mesh,
        run.microbatches,
        run.pp_schedule,
    )


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "deepspeed-zero3", "tp", "pp"])
def test_two_gloo_processes_train_the_same_losses_with_it(strategy: str, tmp_path: Path) -> None:
    if strategy.startswith("deepspeed"):
        pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (the [deepspeed] extra)")
    tiny = ["--model", "custom", "--layers", "2", "--heads", "2", "--embd", "64", "--block-size", "32",
            "--batch-size", "8", "--dropout", "0.1", "--threads", "1", "--epochs", "2", "--steps-per-epoch", "3",
            "--strategy", strategy, "--devices", "2", "-q"]  # fmt: skip
    records = []
    for checkpointed in ([], ["--activation-checkpointing"]):
        out = tmp_path / ("ac" if checkpointed else "plain")
        done = accelbench("run", *tiny, *checkpointed, "--output-dir", str(out))
        assert done.returncode == 0, done.stderr[-3000:]
        (path,) = out.glob("*.json")
        records.append(read_record(path))
    plain, checkpointed = records
    assert checkpointed.config.activation_checkpointing
    assert [e.loss for e in plain.metrics.epochs] == [e.loss for e in checkpointed.metrics.epochs]  # type: ignore[union-attr]
    peaks = [r.metrics.tensor_peak.peak_bytes for r in records]  # type: ignore[union-attr]
    assert peaks[1] < peaks[0]
