"""The live tensor peak: one untimed training step after the timed epochs under torch's MemTracker, recorded beside
the backend's reading, and what the summary, compare and report set the prediction against.

The measurement is checked against a peak worked out in closed form (a bias-free nn.Linear stack trained with
AdamW), then on real runs: one process in this one, and (slow) DDP and FSDP over two gloo processes.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import warnings
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
from core_support import accelbench
from torch import nn

from accelbench.display import summary_table
from accelbench.engine.runner import run
from accelbench.engine.tensor_peak import TOTAL, measure_step, measure_step_with, why_not_measurable
from accelbench.plugins import get_host
from accelbench.results import ResultRecord, check_prediction, predicted_tensor_bytes, read_record
from accelbench.testing import tiny_config


@pytest.mark.parametrize(("width", "layers", "batch"), [(256, 4, 32), (512, 3, 16), (128, 6, 64)])
def test_the_peak_of_an_adamw_step_is_the_one_worked_out_in_closed_form(
    width: int, layers: int, batch: int
) -> None:
    """A steady step (the moments exist) of ``layers`` bias-free ``width`` x ``width`` linears with single-tensor
    AdamW (the CPU's kernels). Its peak is in the optimizer step: the weights W, their gradients W and both moments
    2W, each layer's float32 ``step`` counter, the batch (x and y, registered as existing), and three weight-sized
    temporaries: ``denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt)`` makes two (the sqrt is freed once the
    division is made) while the previous parameter's ``denom`` is still referenced. Anything the tracker missed
    (the moments, the gradients) or counted twice would move it by a layer's worth or more."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    x, y = torch.randn(batch, width), torch.randn(batch, width)

    def step() -> None:
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # the moments exist from here on, as in a run's steps after the first
    peak = measure_step(step, model, optimizer, torch.device("cpu"), (x, y))

    weights = layers * width * width * 4
    assert peak[TOTAL] >= 4 * weights  # weights + gradients + both moments, at least
    exact = 4 * weights + 3 * width * width * 4 + 4 * layers + 2 * batch * width * 4
    assert peak[TOTAL] == pytest.approx(exact, rel=0.01)
    assert peak["parameters"] == weights and peak["gradients"] == weights
    assert sum(v for k, v in peak.items() if k != TOTAL) == peak[TOTAL]  # the kinds at the peak add up to it


def test_ddp_gradient_buckets_are_counted_once_the_backward_touches_them() -> None:
    """DDP keeps its gradients in buckets its reducer allocated when it wrapped the model; the tracker counts them
    from the first operator that touches them on (as temporaries or activations, not gradients), so the same stack's
    optimizer-step peak is the same under DDP (one gloo process) as alone, to the byte."""
    import torch.distributed as dist

    width, layers, batch = 256, 4, 32
    peaks = []
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for wrap in (False, True):
            torch.manual_seed(0)
            model: nn.Module = nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(layers)])
            if wrap:
                model = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
            x, y = torch.randn(batch, width), torch.randn(batch, width)

            def step() -> None:
                nn.functional.mse_loss(model(x), y).backward()  # noqa: B023 - called within this iteration
                optimizer.step()  # noqa: B023
                optimizer.zero_grad(set_to_none=True)  # noqa: B023

            step()
            peaks.append(measure_step(step, model, optimizer, torch.device("cpu"), (x, y)))
    finally:
        dist.destroy_process_group()
    alone, ddp = peaks
    assert ddp[TOTAL] == alone[TOTAL]
    # the bucket is there, under the kind of the phase whose operator first touched it (not "gradients")
    held = {
        kind: size for kind, size in ddp.items() if kind not in ("parameters", "optimizer", "other", TOTAL)
    }
    assert sum(held.values()) == alone["gradients"] == layers * width * width * 4


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> tuple[ResultRecord, Path]:
    """A real run (two-layer 64-wide GPT, 2 epochs of 3 steps) in this process, with its tensor peak."""
    out = tmp_path_factory.mktemp("tensor-peak")
    config = tiny_config(epochs=2, steps_per_epoch=3, output_dir=out, n_layer=2, n_embd=64, block_size=32)
    record, path, status = run(config, get_host())
    assert status == "ok" and record is not None and path is not None
    return record, path


def test_a_run_records_its_tensor_peak_and_the_summary_compares_tensors_with_tensors(
    measured: tuple[ResultRecord, Path],
) -> None:
    record, path = measured
    assert record.metrics is not None and record.prediction is not None
    peak = record.metrics.tensor_peak
    assert peak is not None and read_record(path).metrics.tensor_peak == peak  # type: ignore[union-attr]
    assert peak.ranks == [peak.peak_bytes] and peak.rank == 0 and "MemTracker" in peak.source
    assert sum(peak.by_kind.values()) == peak.peak_bytes
    weights = record.prediction.memory_bytes["weights"]
    assert (
        weights is not None and peak.by_kind["parameters"] == weights
    )  # the model's fp32 weights, all of them
    # the resident set holds the interpreter and torch besides: far more than the tensors
    assert (
        record.metrics.peak_memory_max_bytes is not None
        and record.metrics.peak_memory_max_bytes > 20 * peak.peak_bytes
    )

    check = check_prediction(record)
    assert check is not None and check.memory_basis == "tensors"
    assert check.measured_peak_bytes == peak.peak_bytes
    tensors = predicted_tensor_bytes(record.prediction)
    assert check.predicted_peak_bytes == tensors
    assert tensors is not None and tensors < record.prediction.peak_memory_bytes  # type: ignore[operator]
    assert (
        check.memory_error is not None and abs(check.memory_error) < 0.1
    )  # the formula, on what it predicts

    from rich.console import Console

    console = Console(width=300, record=True)
    console.print(summary_table(record))
    text = console.export_text()
    assert "tensor peak" in text and "(MemTracker)" in text


def test_without_the_step_or_in_an_old_record_the_prediction_is_against_the_reading(
    measured: tuple[ResultRecord, Path], tmp_path: Path
) -> None:
    """--no-tensor-peak records none, and a record written before the field existed still loads: both compare the
    whole prediction with the backend's reading, as before."""
    out = tmp_path / "skipped"
    record, _, status = run(
        tiny_config(epochs=1, steps_per_epoch=2, output_dir=out, no_tensor_peak=True), get_host()
    )
    assert status == "ok" and record is not None and record.metrics is not None
    assert record.metrics.tensor_peak is None
    check = check_prediction(record)
    assert check is not None and check.memory_basis == "reading"
    assert check.measured_peak_bytes == record.metrics.peak_memory_max_bytes

    _, path = measured
    old = json.loads(path.read_text())
    del old["metrics"]["tensor_peak"], old["config"]["no_tensor_peak"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    loaded = read_record(tmp_path / "old.json")
    check = check_prediction(loaded)
    assert check is not None and check.memory_basis == "reading"
    assert check.predicted_peak_bytes == loaded.prediction.peak_memory_bytes  # type: ignore[union-attr]


def test_compare_sets_tensors_against_tensors_and_old_records_against_the_reading(
    measured: tuple[ResultRecord, Path], tmp_path: Path
) -> None:
    """compare's predicted-against-measured table: 'tensors' for a cell whose runs measured a tensor peak, the
    backend's reading for one of old records (the same run, without the field, as another system)."""
    record, path = measured
    new, old = tmp_path / "new", tmp_path / "old"
    new.mkdir()
    old.mkdir()
    (new / path.name).write_text(path.read_text())
    before = json.loads(path.read_text())
    del before["metrics"]["tensor_peak"], before["config"]["no_tensor_peak"]
    before["run_id"] = "old-" + before["run_id"]
    before["system"]["host"] = "older-host"
    (old / "old.json").write_text(json.dumps(before))

    done = accelbench("compare", str(new), str(old), "--format", "json")
    assert done.returncode == 0, done.stderr
    cells = {c["system"]: c for g in json.loads(done.stdout)["groups"] for c in g["cells"]}
    assert len(cells) == 2
    (measured_cell,) = (c for c in cells.values() if c["tensor_peak_bytes"] is not None)
    (old_cell,) = (c for c in cells.values() if c["tensor_peak_bytes"] is None)
    assert record.metrics is not None and record.metrics.tensor_peak is not None
    assert measured_cell["tensor_peak_bytes"]["median"] == record.metrics.tensor_peak.peak_bytes
    assert measured_cell["predicted"]["tensor_bytes"]["median"] == predicted_tensor_bytes(record.prediction)  # type: ignore[arg-type]

    done = accelbench("compare", str(new), str(old), "--format", "markdown")
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "MiB" not in line]
    header = next(line for line in done.stdout.splitlines() if "peak of" in line)
    assert header
    assert any("| tensors |" in row for row in rows) and any("| reading |" in row for row in rows)


def test_the_epochs_are_on_disk_before_the_step_and_a_failed_step_leaves_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record of the timed epochs is written (a draft saying the process ended during the tensor-peak step)
    before the step runs, so a process killed in it leaves them; a step that fails leaves a note and no tensor
    peak, and the run is ok."""
    import accelbench.engine.tensor_peak as tensor_peak

    out = tmp_path / "out"
    drafts: list[dict[str, Any]] = []

    def broken(*args: Any, **kwargs: Any) -> dict[str, int]:
        drafts.extend(json.loads(p.read_text()) for p in out.glob("*.json"))
        raise RuntimeError("tracker broke")

    monkeypatch.setattr(tensor_peak, "measure_step_with", broken)
    record, path, status = run(tiny_config(epochs=2, steps_per_epoch=2, output_dir=out), get_host())
    assert status == "ok" and record is not None and record.metrics is not None
    ((draft,),) = [drafts]
    assert draft["outcome"]["status"] == "error"
    assert (
        "the process ended during the tensor-peak step, after the timed epochs" in draft["outcome"]["message"]
    )
    assert "the 2 epoch(s) here are complete" in draft["outcome"]["message"]  # the epochs it holds, no more
    assert (
        len(draft["metrics"]["epochs"]) == 2
        and draft["metrics"]["epochs"]
        == json.loads(
            path.read_text()  # type: ignore[union-attr]
        )["metrics"]["epochs"]
    )
    assert record.metrics.tensor_peak is None
    assert (
        "the tensor-peak step failed (RuntimeError: tracker broke); the timed epochs before it are complete"
        in (record.outcome.message or "")
    )


def test_a_measured_step_leaves_nothing_alive_once_its_model_and_optimizer_are_dropped() -> None:
    """MemTracker's ModTracker hooks every module's inputs with a multi-grad hook whose closure keeps their grad_fn
    nodes and hangs on those nodes: a cycle through C++ the collector cannot break. Without removing those hooks,
    the first linear's weight and bias (reached from the ReLU's input node through AccumulateGrad) outlived the
    model, in every process that ran more than one measured step."""
    parameters = _measured_once()
    gc.collect()
    assert [ref() is None for ref in parameters] == [True] * 4


def _measured_once() -> list[weakref.ref[nn.Parameter]]:
    """A small model measured once; weak references to its parameters, the model and optimizer dropped on return."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    x = torch.randn(4, 64)

    def step() -> None:
        model(x).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    peak = measure_step_with(step, [model, optimizer, x], torch.device("cpu"))
    assert peak[TOTAL] > 0
    return [weakref.ref(p) for p in model.parameters()]


def parameters_alive() -> int:
    gc.collect()
    with warnings.catch_warnings():  # the scan touches torch.distributed's deprecated reduce_op, which warns
        warnings.simplefilter("ignore", FutureWarning)
        return sum(isinstance(o, nn.Parameter) for o in gc.get_objects())


def test_a_run_in_this_process_leaves_none_of_its_parameters_alive(tmp_path: Path) -> None:
    """What a reference regeneration (every seed in one process) relies on: each run's model, optimizer and autograd
    graph are freed when it returns. Before the hooks were removed, gpt2's regeneration kept 320 MiB more a seed."""
    before = parameters_alive()
    config = tiny_config(
        epochs=1, steps_per_epoch=2, output_dir=tmp_path, n_layer=2, n_embd=64, block_size=32
    )
    record, _, status = run(config, get_host())
    assert status == "ok" and record is not None and record.metrics.tensor_peak is not None
    assert parameters_alive() == before


def test_a_step_it_cannot_trace_as_timed_is_skipped_with_the_reason() -> None:
    assert "--compile" in (why_not_measurable(object(), compiled=True) or "")
    assert "exposes no torch model and optimizer" in (why_not_measurable(object(), compiled=False) or "")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_every_rank_of_a_gloo_job_measures_its_tensor_peak(strategy: str, tmp_path: Path) -> None:
    """Two processes over gloo: each rank's peak is recorded, the largest is the headline. DDP holds the whole model
    and both moments on each rank; FSDP shards the moments (the prediction's per-device optimizer state), and each
    rank's parameters are its shard plus what it gathers to compute with."""
    tiny = ["--model", "custom", "--layers", "2", "--heads", "2", "--embd", "64", "--block-size", "32",
            "--batch-size", "8", "--dropout", "0", "--threads", "1", "--epochs", "1", "--steps-per-epoch", "2"]  # fmt: skip
    done = accelbench(
        "run", *tiny, "--strategy", strategy, "--devices", "2", "--output-dir", str(tmp_path), "-q"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = tmp_path.glob("*.json")
    record = read_record(path)
    assert record.outcome.status == "ok" and not record.outcome.message
    assert record.metrics is not None and record.prediction is not None
    peak = record.metrics.tensor_peak
    assert peak is not None and len(peak.ranks) == 2 and all(peak.ranks)
    assert peak.peak_bytes == max(r for r in peak.ranks if r)
    weights, moments = record.prediction.memory_bytes["weights"], record.prediction.memory_bytes["optimizer"]
    assert weights is not None and moments is not None  # per device: sharded under FSDP
    # AdamW's two moments per (local) parameter, and a float32 step counter per parameter tensor
    assert peak.by_kind["optimizer"] == pytest.approx(moments, rel=0.01)
    if strategy == "ddp":
        assert peak.by_kind["parameters"] == weights
    else:
        assert weights < peak.by_kind["parameters"] < 2 * weights + 0.1 * weights


# --------------------------------------------------------------------------------------------------------------
# estimate --trace: the same step traced without storage
# --------------------------------------------------------------------------------------------------------------

MEASURED_RUN = ["--model", "custom", "--layers", "2", "--heads", "2", "--embd", "64", "--block-size", "32",
                "--batch-size", "8", "--dropout", "0"]  # fmt: skip  # the `measured` fixture's configuration


def estimate_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    from accelbench.cli import main

    assert main(["estimate", *args, "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def test_the_traced_step_agrees_with_the_measured_tensor_peak_and_the_formula(
    measured: tuple[ResultRecord, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """The trace of the measured run's configuration (fake tensors, no storage) against that run's tensor peak
    (real tensors, one real step): the same step, so within a few per cent; and against the formula's tensors,
    which count the same weights, gradients, moments and activations."""
    record, _ = measured
    assert record.metrics is not None and record.metrics.tensor_peak is not None
    p = estimate_json([*MEASURED_RUN, "--trace"], capsys)
    real = record.metrics.tensor_peak
    assert p["traced_peak_bytes"] == pytest.approx(real.peak_bytes, rel=0.03)
    assert p["traced_memory_bytes"]["parameters"] == real.by_kind["parameters"]
    assert p["traced_memory_bytes"]["optimizer"] == pytest.approx(real.by_kind["optimizer"], rel=0.01)
    formula = p["peak_memory_bytes"] - p["memory"]["runtime_bytes"]
    assert p["traced_peak_bytes"] == pytest.approx(formula, rel=0.05)
    assert p["traced_fits"] is True and "FakeTensorMode" in p["traced_source"]

    plain = estimate_json(MEASURED_RUN, capsys)  # without --trace: the formula alone
    assert plain["traced_peak_bytes"] is None and plain["traced_fits"] is None


def test_the_trace_says_whether_the_step_fits_a_device(capsys: pytest.CaptureFixture[str]) -> None:
    """The device here (this host's memory): a traced step of a few MiB fits; with a runtime larger than the
    memory (--runtime-mib, counted as in the formula) it does not."""
    p = estimate_json([*MEASURED_RUN, "--trace"], capsys)
    assert p["device_memory_bytes"] and p["traced_fits"] is True
    runtime_mib = p["device_memory_bytes"] // 2**20 + 1
    p = estimate_json([*MEASURED_RUN, "--trace", "--runtime-mib", str(runtime_mib)], capsys)
    assert p["traced_fits"] is False and p["fits"] is False


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--strategy", "fsdp", "--devices", "2"], "--strategy fsdp shards or splits the model"),
        (["--strategy", "tp", "--devices", "2"], "--strategy tp shards or splits the model"),
    ],
)
def test_what_the_trace_cannot_build_is_refused_and_the_formula_still_answers(
    args: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from accelbench.cli import main

    assert main(["estimate", *MEASURED_RUN, *args, "--trace"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert said in err and "--trace traces single and ddp" in err and "Drop --trace" in err
    assert "Traceback" not in err
    assert main(["estimate", *MEASURED_RUN, *args, "--json"]) == 0  # the formula answers


@pytest.mark.slow
def test_tracing_gpt2_xl_costs_seconds_and_no_memory(capsys: pytest.CaptureFixture[str]) -> None:
    """1.6 B parameters traced in well under a minute (about 10 s of CPU here), the process growing by far less
    than the 22 GiB the step's tensors would hold (the device: this host's CPU, so no plugin's table is needed)."""
    import time

    import psutil

    before = psutil.Process().memory_info().rss
    start = time.perf_counter()
    p = estimate_json(
        ["--model", "gpt2-xl", "--batch-size", "4", "--precision", "bf16-mixed", "--trace"], capsys
    )
    assert time.perf_counter() - start < 120
    assert psutil.Process().memory_info().rss - before < 2 * 2**30
    weights = p["memory"]["weights_bytes"]
    assert p["traced_memory_bytes"]["parameters"] == weights  # fp32 parameters under bf16 autocast
    assert p["traced_peak_bytes"] > 3.9 * weights  # weights, gradients and both moments at least
    assert p["traced_fits"] is (
        p["traced_peak_bytes"] <= p["device_memory_bytes"]
    )  # against this host's memory


# --------------------------------------------------------------------------------------------------------------
# every executor: Lightning, tensor/pipeline parallelism, DeepSpeed
# --------------------------------------------------------------------------------------------------------------

EXECUTOR_RUN = [*MEASURED_RUN, "--threads", "1", "--epochs", "1", "--steps-per-epoch", "2"]
# the target for the tensor peak; the estimate measured here: tp -0.3%, pp -2.9%, Lightning +2.1% (DDP +1.9%),
# ZeRO-1/2/3 over two ranks +2.3%, +2.3%, +2.0% without DeepSpeed's 2 GB bucket
ESTIMATE_TOLERANCE = 0.05
# Where the first pipeline rank's peak depends on the schedule's order of forwards and backwards, and where a layer
# is rebuilt in backward, the model comes within 8% on this configuration (measured here, rank 0 against the
# estimate: tp checkpointed +3.5%, pp checkpointed +5.3% (the estimate gives the last rank's, +3.3% against it),
# interleaved 1F1B -2.6%, interleaved checkpointed -4.0%; it was 11% until the pipelines' receive buffers were
# counted, 2026-12-02: interleaved checkpointed -9.1%; docs/estimate.md)
SCHEDULED_TOLERANCE = 0.08
# Ranks that hold the same tensors can still differ by one activation: gloo's work object keeps a collective's input
# (a (batch, block, embd) float32 activation under tp) alive until its own thread lets go of it, which a busy host
# delays on one rank and not the other (CI saw 2,414,776 against 2,480,312 bytes: 65,536, that one activation).
ONE_ACTIVATION = 8 * 32 * 64 * 4


def run_peak(args: list[str], out: Path) -> Any:
    """The tensor peak of ``accelbench run ARGS`` (one thread, one epoch of two steps), from its record."""
    done = accelbench("run", *args, "--threads", "1", "--epochs", "1", "--steps-per-epoch", "2",
                      "--output-dir", str(out), "-q", timeout=400)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = out.glob("*.json")
    return read_record(path).metrics.tensor_peak  # type: ignore[union-attr]


def alike(first: int | None, second: int | None) -> bool:
    """Two ranks' peaks are those of the same tensors: equal, or one collective's activation apart."""
    assert first is not None and second is not None
    return abs(first - second) <= ONE_ACTIVATION


def run_record(args: list[str], out: Path) -> ResultRecord:
    done = accelbench("run", *EXECUTOR_RUN, *args, "--output-dir", str(out), "-q", timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = out.glob("*.json")
    return read_record(path)


def test_a_root_module_run_once_per_microbatch_is_measured_as_one_step() -> None:
    """A pipeline stage's module runs forward once per microbatch within one step; stock MemTracker takes a root
    module's second forward for a next iteration and refuses it. Two microbatches of half the batch, each
    backward before the next forward: the peak is one half-batch's activations on top of the weights, gradients and
    moments: less than the whole batch's at once (a batch large enough that its activations make the peak)."""
    torch.manual_seed(0)
    width, batch = 256, 2048
    model = nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(3)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    x, y = torch.randn(batch, width), torch.randn(batch, width)

    def step(parts: int) -> None:
        for xs, ys in zip(x.chunk(parts), y.chunk(parts), strict=True):
            nn.functional.mse_loss(model(xs), ys).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step(1)
    whole = measure_step_with(lambda: step(1), [model, optimizer, x, y], torch.device("cpu"))
    halves = measure_step_with(lambda: step(2), [model, optimizer, x, y], torch.device("cpu"))
    weights = 3 * width * width * 4
    assert halves["parameters"] == weights and halves[TOTAL] >= 4 * weights
    activations = 3 * batch * width * 4  # each layer's output, kept for backward
    # half the saved outputs, and half the loss's batch-sized temporaries, are not alive at once any more
    assert activations / 2 < whole[TOTAL] - halves[TOTAL] < activations


def test_each_executor_says_what_holds_tensors_before_its_step() -> None:
    """The contract's default: a ``model`` and an ``optimizer`` that are torch's; else None, and the run says why."""
    from accelbench.contract import Executor

    class Bare(Executor):
        def setup(self, job: Any) -> None: ...

        def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return inputs

    bare = Bare()
    assert bare.tensors_before_step() is None and bare.tensor_peak_caveat() is None
    assert "exposes no torch model and optimizer" in (why_not_measurable(bare, compiled=False) or "")
    bare.model = nn.Linear(2, 2)  # type: ignore[attr-defined]
    bare.optimizer = torch.optim.SGD(bare.model.parameters(), lr=0.1)  # type: ignore[attr-defined]
    assert bare.tensors_before_step() == [bare.model, bare.optimizer]  # type: ignore[attr-defined]
    assert why_not_measurable(bare, compiled=False) is None


@pytest.mark.slow
@pytest.mark.parametrize(
    ("layout", "ranks_alike"),
    [
        (["--strategy", "tp", "--devices", "2"], True),
        (["--strategy", "pp", "--devices", "2"], False),
        (["--strategy", "tp", "--devices", "2", "--activation-checkpointing"], True),
        # checkpointed, the first rank's microbatches in flight and the last's head come within one activation
        (["--strategy", "pp", "--devices", "2", "--activation-checkpointing"], None),
        (["--strategy", "pp", "--devices", "2", "--pp-schedule", "interleaved-1f1b", "--layers", "4"], False),
        (
            [
                "--strategy",
                "pp",
                "--devices",
                "2",
                "--pp-schedule",
                "interleaved-1f1b",
                "--layers",
                "4",
                "--activation-checkpointing",
            ],
            None,
        ),  # fmt: skip
    ],
    ids=["tp", "pp", "tp-checkpointed", "pp-checkpointed", "interleaved", "interleaved-checkpointed"],
)
def test_tensor_and_pipeline_parallel_ranks_measure_the_peak_the_estimate_predicts(
    layout: list[str], ranks_alike: bool | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two gloo processes: each rank measures its own step (DTensor shards under tp; its stage and the
    microbatches' activations under pp), and rank 0 (the first pipeline rank, which the estimate's per-device
    figures describe) is within 5% of `accelbench estimate` for the same configuration: with activation
    checkpointing too, and under interleaved 1F1B (five microbatch-stages in flight on the first rank)."""
    record = run_record(layout, tmp_path)
    assert record.outcome.status == "ok", record.outcome.message
    assert record.metrics is not None
    peak = record.metrics.tensor_peak
    assert peak is not None and len(peak.ranks) == 2 and all(peak.ranks)
    assert sum(peak.by_kind.values()) == peak.peak_bytes
    if ranks_alike is not None:  # pp: the stages differ (stem and head)
        assert alike(peak.ranks[0], peak.ranks[1]) is ranks_alike
    predicted = estimate_json([*MEASURED_RUN, *layout], capsys)
    tensors = predicted["peak_memory_bytes"] - predicted["memory"]["runtime_bytes"]
    scheduled = "--activation-checkpointing" in layout or "interleaved-1f1b" in layout
    assert peak.ranks[0] == pytest.approx(
        tensors, rel=SCHEDULED_TOLERANCE if scheduled else ESTIMATE_TOLERANCE
    )
    # half the weights per rank (the blocks' matrices split or the layers dealt), plus what stays whole
    layers = layout[layout.index("--layers") : layout.index("--layers") + 2] if "--layers" in layout else []
    weights = estimate_json([*MEASURED_RUN, *layers], capsys)["memory"]["weights_bytes"]
    assert weights / 2 < peak.by_kind["parameters"] < 0.7 * weights


@pytest.mark.slow
def test_a_looped_pipeline_rank_measures_its_receive_buffers_and_its_sends(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two gloo processes, gpt-micro under looped BFS (stages 0 and 2 on rank 0, four microbatches), checkpointed.
    The stages' receive buffers (four for stage 0's gradients, eight for stage 2's inputs and gradients, one
    ``s b h`` each) are real memory MemTracker never saw whole (the gradients' eight, 1 MiB, were missing: the
    measured peak now counts them, registered before the step), and the estimate counts them; its peak, in stage
    0's second backward with every gradient made, holds what stage 2 sent (its outputs and input gradients, kept by
    the sends until the step ends). Rank 0 within 5% (it was -8.3%)."""
    args = ["--model", "gpt-micro", "--batch-size", "8", "--mesh", "pp=2", "--devices", "2",
            "--pp-schedule", "looped-bfs", "--activation-checkpointing"]  # fmt: skip
    peak = run_peak(args, tmp_path)
    assert peak is not None and len(peak.ranks) == 2 and peak.rank == 0
    boundary = 128 * 2 * 128 * 4  # s b h float32, a microbatch of 2
    assert peak.by_kind["other"] >= 12 * boundary
    predicted = estimate_json(args, capsys)
    assert predicted["memory"]["buffer_bytes"] == 12 * boundary
    tensors = predicted["peak_memory_bytes"] - predicted["memory"]["runtime_bytes"]
    assert peak.peak_bytes == pytest.approx(tensors, rel=ESTIMATE_TOLERANCE)


# llama-tiny with a vocabulary of 512, so that its layers' activations, not its logits, make the peak
LLAMA_512 = ["--workload", "llama", "--model", "llama-tiny", "--seq-len", "64", "--vocab-size", "512",
             "--batch-size", "8"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    "layout",
    [
        [*LLAMA_512],
        [*LLAMA_512, "--precision", "bf16-mixed"],
        [*MEASURED_RUN, "--activation-checkpointing"],
    ],  # fmt: skip
    ids=["llama", "llama-bf16-mixed", "gpt-checkpointed"],
)
def test_sequence_parallel_ranks_keep_the_gathered_inputs_the_estimate_counts(
    layout: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two gloo processes, tp=2 with sequence parallelism: torch's column-parallel styles all-gather each linear's
    sequence-sharded input and the linear keeps the gathered tensor whole (Megatron keeps the shard: Korthikanti's
    34/t). Rank 0's tensor peak is within 5% of the estimate (it had counted shards: llama-tiny -13.8% in fp32,
    -6.8% under bf16-mixed; the 2-layer GPT checkpointed -12.2%, its peak in the first layer's backward)."""
    args = [*layout, "--mesh", "tp=2", "--devices", "2", "--sequence-parallel"]
    peak = run_peak(args, tmp_path)
    assert peak is not None and len(peak.ranks) == 2 and all(peak.ranks)
    predicted = estimate_json(args, capsys)
    assert any(
        a.startswith("sequence parallelism as torch's styles run it") for a in predicted["assumptions"]
    )
    tensors = predicted["peak_memory_bytes"] - predicted["memory"]["runtime_bytes"]
    # the ranks hold the same tensors; the larger can hold a collective's buffer more, which gloo's work object lets
    # go of late on a busy host (a rerun measured 30,336 and 519,424 bytes more on one rank of the two)
    assert min(r for r in peak.ranks if r) == pytest.approx(tensors, rel=ESTIMATE_TOLERANCE)


# llama-tiny (vocabulary 8,192) over two pipeline ranks: the last stage's logits outweigh the first rank's layers
LLAMA_PIPELINE = ["--workload", "llama", "--model", "llama-tiny", "--seq-len", "64", "--batch-size", "8",
                  "--strategy", "pp", "--devices", "2"]  # fmt: skip


def test_a_large_vocabulary_makes_the_last_pipeline_rank_the_busiest(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The estimate predicts both ends of the pipeline and gives the busier: here the last rank, holding a layer,
    the final norm and the untied output layer, and the logits; the first rank holds a layer and the embedding."""
    predicted = estimate_json(LLAMA_PIPELINE, capsys)
    layer, vocab_rows = 49_280, 8192 * 64  # llama-tiny's block; its embedding and its output layer
    assert predicted["memory"]["weights_bytes"] == (layer + 64 + vocab_rows) * 4
    busiest = [a for a in predicted["assumptions"] if "busiest rank" in a]
    assert len(busiest) == 1 and busiest[0].startswith("pipeline: the busiest rank is the last")
    assert any(
        a.startswith("pipeline: the last rank holds 1 microbatch-stage") for a in predicted["assumptions"]
    )
    # a character-level GPT's head is small: its first rank, with the deeper warm-up, is the busier
    gpt = estimate_json([*MEASURED_RUN, "--strategy", "pp", "--devices", "2"], capsys)
    assert any(a.startswith("pipeline: the busiest rank is the first") for a in gpt["assumptions"])


@pytest.mark.slow
@pytest.mark.parametrize(
    "schedule", [["--microbatches", "4"], ["--pp-schedule", "gpipe"]], ids=["1f1b", "gpipe"]
)
def test_the_last_pipeline_rank_holds_what_the_estimate_predicts(
    schedule: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two gloo processes: the last rank (one layer, the output layer, the logits of one microbatch under 1F1B and
    of every microbatch under GPipe, the loss's gradients) measures the larger peak, within 5% of the estimate.
    Under 1F1B it holds one microbatch's logits only because the schedule is asked for no outputs: torch's default
    keeps every microbatch's logits to concatenate them (measured: 42.9 MB, not 26.9, with four microbatches)."""
    args = [*LLAMA_PIPELINE, *schedule]
    peak = run_peak(args, tmp_path)
    assert peak is not None and len(peak.ranks) == 2 and peak.rank == 1
    assert peak.ranks[1] > 2 * (peak.ranks[0] or 0)
    predicted = estimate_json(args, capsys)
    tensors = predicted["peak_memory_bytes"] - predicted["memory"]["runtime_bytes"]
    assert peak.peak_bytes == pytest.approx(tensors, rel=ESTIMATE_TOLERANCE)
    assert peak.by_kind["parameters"] == predicted["memory"]["weights_bytes"]


@pytest.mark.slow
def test_a_schedule_that_splits_the_backward_records_why_it_has_no_tensor_peak(tmp_path: Path) -> None:
    """zbv computes each stage's input gradients with torch.autograd.grad, which MemTracker's module hooks cannot
    follow (torch raises): no rank runs the step, the run is ok, and its message says why."""
    # zbv puts two stages on each rank: four layers (the last --layers given wins)
    record = run_record(
        ["--layers", "4", "--strategy", "pp", "--devices", "2", "--pp-schedule", "zbv"], tmp_path
    )
    assert record.outcome.status == "ok"
    assert record.metrics is not None and record.metrics.tensor_peak is None
    message = " ".join((record.outcome.message or "").split())
    assert "no tensor peak: --pp-schedule zbv splits each backward" in message
    assert "_will_engine_execute_node" in message and "gpipe, 1f1b" in message


@pytest.mark.slow
def test_a_mesh_with_fsdp_and_a_pipeline_measures_every_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """dp=2 (FSDP2) x pp=2 on four gloo processes: every rank measures its step; the two ranks of each stage alike.
    A pipeline keeps each stage's FSDP parameters gathered between its microbatches (reshard_after_forward off),
    so a rank holds its shard and its stage whole, about three times the shard, and accumulates the stage's
    gradients unsharded: the estimate counts both, and rank 0 (the first stage) is within 5% of it."""
    record = run_record(["--mesh", "dp=2,pp=2", "--devices", "4", "--collective-timeout", "120"], tmp_path)
    assert record.outcome.status == "ok", record.outcome.message
    assert record.metrics is not None and record.metrics.tensor_peak is not None
    peak = record.metrics.tensor_peak
    assert len(peak.ranks) == 4 and all(peak.ranks)
    first, second = peak.ranks[:2], peak.ranks[2:]  # pp-major: ranks 0, 1 hold stage 0 (the mesh's order)
    assert alike(*first) and alike(*second) and not alike(first[0], second[0])
    predicted = estimate_json([*MEASURED_RUN, "--mesh", "dp=2,pp=2", "--devices", "4"], capsys)
    assert peak.by_kind["parameters"] == pytest.approx(3 * predicted["memory"]["weights_bytes"], rel=0.05)
    tensors = predicted["peak_memory_bytes"] - predicted["memory"]["runtime_bytes"]
    assert peak.ranks[0] == pytest.approx(tensors, rel=ESTIMATE_TOLERANCE)


@pytest.mark.slow
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_a_mesh_with_fsdp_and_tensor_parallelism_holds_the_gathered_blocks_the_estimate_counts(
    checkpointing: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """dp=2 (FSDP2) x tp=2 on four gloo processes: each rank holds, beside its shards, the root unit and two
    blocks' tensor-parallel slices gathered over the data axis, as FSDP alone gathers whole blocks; rank 0 is within
    5% of the estimate (which had counted none of them: -5.7%, checkpointed -11.8%; now +0.7% and +3.3%)."""
    checkpointed = ["--activation-checkpointing"] if checkpointing else []
    mesh = ["--mesh", "dp=2,tp=2", "--devices", "4", *checkpointed]
    record = run_record([*mesh, "--collective-timeout", "120"], tmp_path)
    assert record.outcome.status == "ok", record.outcome.message
    assert record.metrics is not None and record.metrics.tensor_peak is not None
    peak = record.metrics.tensor_peak
    assert len(peak.ranks) == 4 and all(peak.ranks)
    predicted = estimate_json([*MEASURED_RUN, *mesh], capsys)
    assert predicted["memory"]["transient_bytes"] > 0  # the gathered root and blocks
    tensors = predicted["peak_memory_bytes"] - predicted["memory"]["runtime_bytes"]
    assert peak.ranks[0] == pytest.approx(tensors, rel=ESTIMATE_TOLERANCE)


@pytest.mark.slow
def test_lightning_measures_the_peak_the_estimate_predicts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Fabric's wrapped module and optimizer are torch's types: registered as the native engine's are."""
    record = run_record(["--engine", "lightning"], tmp_path)
    assert record.outcome.status == "ok", record.outcome.message
    assert record.metrics is not None and record.metrics.tensor_peak is not None
    peak = record.metrics.tensor_peak
    assert len(peak.ranks) == 1 and peak.by_kind["optimizer"] > 0
    predicted = estimate_json(MEASURED_RUN, capsys)
    assert peak.by_kind["parameters"] == predicted["memory"]["weights_bytes"]
    tensors = predicted["peak_memory_bytes"] - predicted["memory"]["runtime_bytes"]
    assert peak.peak_bytes == pytest.approx(tensors, rel=ESTIMATE_TOLERANCE)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed not installed")
def test_deepspeed_measures_its_peak_and_says_what_the_tracker_sees_of_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ZeRO-2 on one process: the peak is measured with a note on ZeRO's own buffers. DeepSpeed allocates its
    contiguous gradient bucket whole at each backward (reduce_bucket_size, 5e8 elements: 2 GB in fp32), so the
    tensors alive are at least that, whatever the model's size (a CPU's resident set holds only what is written),
    and the estimate, which counts the bucket whole, agrees."""
    from accelbench.estimate.stack import DS_REDUCE_BUCKET

    record = run_record(["--strategy", "deepspeed-zero2"], tmp_path)
    assert record.outcome.status == "ok"
    assert record.metrics is not None and record.metrics.tensor_peak is not None
    peak = record.metrics.tensor_peak
    assert peak.ranks == [peak.peak_bytes]
    # the bucket, whole: the gradients live in it
    assert peak.by_kind["gradients"] >= DS_REDUCE_BUCKET * 4
    assert peak.by_kind["optimizer"] > 0 and peak.by_kind["parameters"] > 0
    assert "tensor peak: DeepSpeed ZeRO-2: the flat buffers" in (record.outcome.message or "")
    predicted = estimate_json([*MEASURED_RUN, "--strategy", "deepspeed-zero2"], capsys)
    tensors = predicted["peak_memory_bytes"] - predicted["memory"]["runtime_bytes"]
    assert peak.peak_bytes == pytest.approx(tensors, rel=ESTIMATE_TOLERANCE)
    # without the bucket, too (measured +1.9%; -18% when the estimate held the gradients and their fp32 partition
    # beside the bucket all step: ZeRO-2 makes them in backward, into the bucket, and drops them after the step)
    bucket = DS_REDUCE_BUCKET * 4
    assert peak.peak_bytes - bucket == pytest.approx(tensors - bucket, rel=ESTIMATE_TOLERANCE)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed not installed")
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_zero_ranks_measure_the_peak_the_estimate_predicts(
    stage: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ZeRO-1, -2 and -3 over two gloo processes: rank 0 within 5% of the estimate, with and without the 2 GB
    gradient bucket (which alone would make any estimate that counts it agree), and the kinds each rank holds.

    The peak is early in backward: the activations and the loss's gradients beside the state and the bucket, and
    no gradient outside the bucket: ZeRO-1/2 drop theirs after each step and make them again as backward frees
    the activations (the estimate holds the larger of the two, measured +2.3%; holding both, as it did, was
    +20% for ZeRO-1 and +14% for ZeRO-2). ZeRO-3 keeps every tensor of this model whole (each is under its
    persistence threshold) and, beside them, every parameter's partition and a gradient partition buffer, all
    held all step; its fp32 copy of that buffer exists only in the optimizer step (+2.0%)."""
    from accelbench.estimate.stack import DS_REDUCE_BUCKET

    layout = ["--strategy", f"deepspeed-zero{stage}", "--devices", "2"]
    record = run_record(layout, tmp_path)
    assert record.outcome.status == "ok", record.outcome.message
    assert record.metrics is not None and record.metrics.tensor_peak is not None
    peak = record.metrics.tensor_peak
    assert len(peak.ranks) == 2 and all(peak.ranks) and alike(peak.ranks[0], peak.ranks[1])
    assert sum(peak.by_kind.values()) == peak.peak_bytes
    predicted = estimate_json([*MEASURED_RUN, *layout], capsys)
    memory = predicted["memory"]
    tensors = predicted["peak_memory_bytes"] - memory["runtime_bytes"]
    assert predicted["peak_phase"] == "backward"
    assert peak.ranks[0] == pytest.approx(tensors, rel=ESTIMATE_TOLERANCE)
    bucket = DS_REDUCE_BUCKET * 4  # fp32: ZeRO-2/3's 16-bit bucket is the model's 4-byte type here
    assert memory["buffer_bytes"] == bucket
    assert peak.ranks[0] - bucket == pytest.approx(tensors - bucket, rel=ESTIMATE_TOLERANCE)

    kinds = peak.by_kind
    # the bucket, whole: the gradients are views into it under ZeRO-2/3; ZeRO-1 first touches it in backward
    assert kinds["gradients" if stage > 1 else "temporaries"] >= bucket
    # each rank's half of AdamW's moments (and the step counter)
    assert kinds["optimizer"] == pytest.approx(memory["optimizer_bytes"], rel=0.01)
    whole = estimate_json(MEASURED_RUN, capsys)["memory"]["weights_bytes"]
    assert kinds["parameters"] == whole  # the model, whole on each rank (ZeRO-3: every tensor is persistent)
    # ZeRO's own tensors: each rank's fp32 master partition (half the model), and under ZeRO-3 every parameter's
    # partition and the gradient partition buffer; beside them the batch (2 KiB)
    assert memory["master_weights_bytes"] == whole / 2
    own = memory["master_weights_bytes"]
    if stage == 3:
        own += memory["weights_bytes"] - whole + memory["gradients_bytes"]
    assert kinds["other"] == pytest.approx(own, rel=0.02)


@pytest.mark.slow
def test_lightning_ddp_ranks_measure_the_peak_the_estimate_predicts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Lightning's DDP strategy over two gloo processes. It keeps torch's gradient_as_bucket_view off, so its
    buckets are a second copy of the gradients, held all step, while the gradients themselves are freed each step
    (set_to_none) and made as backward frees the activations; the estimate of an --engine lightning run assumes
    that stack. Rank 0 within 5% (measured +1.9%), the buckets among the temporaries (the tracker counts them from
    the first operator that touches them, at the start of backward), no gradient made yet at the peak."""
    layout = ["--engine", "lightning", "--strategy", "ddp", "--devices", "2"]
    record = run_record(layout, tmp_path)
    assert record.outcome.status == "ok", record.outcome.message
    assert record.metrics is not None and record.metrics.tensor_peak is not None
    peak = record.metrics.tensor_peak
    assert len(peak.ranks) == 2 and all(peak.ranks) and alike(peak.ranks[0], peak.ranks[1])
    predicted = estimate_json([*MEASURED_RUN, *layout], capsys)
    memory = predicted["memory"]
    assert predicted["stack"]["ddp_bucket_view"] is False
    assert memory["buffer_bytes"] == memory["gradients_bytes"] == memory["weights_bytes"]
    tensors = predicted["peak_memory_bytes"] - memory["runtime_bytes"]
    assert peak.ranks[0] == pytest.approx(tensors, rel=ESTIMATE_TOLERANCE)
    kinds = peak.by_kind
    assert kinds["parameters"] == memory["weights_bytes"]  # replicated
    assert kinds["optimizer"] == pytest.approx(memory["optimizer_bytes"], rel=0.01)
    assert kinds["temporaries"] >= memory["buffer_bytes"]
    assert kinds.get("gradients", 0) < memory["gradients_bytes"] / 10


def test_for_a_gpu_the_trace_holds_attention_as_its_fused_kernel_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The trace runs on a fake CPU, where attention with dropout keeps its b a s^2 scores (the math path); a GPU's
    fused kernels do not. On an H100 gpt2-large bf16-mixed trained at batch 320 (77.1 GiB), where the trace said
    batch 256 needed 116 GB: for an H100 the trace now holds what the GPU's kernel holds, and agrees with the
    formula; for this CPU it still keeps the scores."""
    gpt = ["--model", "gpt-micro", "--batch-size", "16", "--precision", "bf16-mixed", "--trace"]
    gpu = estimate_json([*gpt, "--device", "H100"], capsys)
    gpu_no_dropout = estimate_json([*gpt, "--device", "H100", "--dropout", "0"], capsys)
    cpu = estimate_json([*gpt, "--backend", "cpu"], capsys)
    # the other dropouts' masks stay: more than without any dropout, far less than with the scores
    assert gpu_no_dropout["traced_memory_bytes"]["activations"] < gpu["traced_memory_bytes"]["activations"]
    assert "no scores kept" in gpu["traced_source"] and "no scores kept" not in cpu["traced_source"]
    # the scores' bytes (12 per score kept by the math path) make the CPU's trace larger
    assert cpu["traced_memory_bytes"]["activations"] > 1.3 * gpu["traced_memory_bytes"]["activations"]
    assert gpu["traced_peak_bytes"] == pytest.approx(gpu["peak_memory_bytes"], rel=0.08)


def test_a_masked_language_models_logits_are_of_its_predicted_positions(tmp_path: Path) -> None:
    """BERT's head computes vocabulary-wide logits at the masked positions only (15% of a sequence). The formula
    counted them at every position: bert-base on an H100 was predicted 53% (bf16-mixed) and 37% (fp32) over its
    measured tensor peak, bert-mini here 110%. A real step's tensor peak (BERT's picking of the masked positions
    cannot be traced without storage) against the run's own prediction."""
    from accelbench.cli import main

    for precision in ("bf16-mixed", "fp32"):
        out = tmp_path / precision
        args = ["run", "--workload", "bert", "--model", "bert-mini", "--seq-len", "128", "--batch-size", "8",
                "--precision", precision, "--epochs", "1", "--steps-per-epoch", "1", "--no-calibration",
                "--idle-baseline-s", "0", "--output-dir", str(out), "--quiet"]  # fmt: skip
        assert main(args) == 0
        (path,) = out.glob("*.json")
        check = check_prediction(read_record(path))
        assert check is not None and check.memory_basis == "tensors"
        assert check.memory_error is not None and abs(check.memory_error) < 0.05, (precision, check)


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true", "fp32"])
def test_a_llama_layers_activations_are_counted_as_its_own_tensors(
    precision: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Llama block is not GPT's: RMSNorm (whose CPU form keeps fp32 copies), a cast of each linear's input under
    autocast, grouped-query keys and values, and SwiGLU's four ffn-wide tensors. Counted with GPT's formula,
    llama-small's tensor peak was under-predicted by 7.5% here and by 13% on an H100; its own count agrees with the
    traced step (the same tensors a real step holds: test_the_traced_step_agrees_with_the_measured_tensor_peak)."""
    llama = [
        "--workload",
        "llama",
        "--model",
        "llama-small",
        "--batch-size",
        "2",
        "--backend",
        "cpu",
        "--trace",
    ]
    p = estimate_json([*llama, "--precision", precision], capsys)
    formula = p["peak_memory_bytes"] - p["memory"]["runtime_bytes"]
    assert formula == pytest.approx(p["traced_peak_bytes"], rel=0.02)


@pytest.mark.parametrize("precision", ["bf16-mixed", "fp32"])
def test_a_mixture_of_experts_layers_activations_are_its_routed_rows(precision: str, tmp_path: Path) -> None:
    """A mixture of experts' block holds its routed rows (top-k per token, padded per expert for the grouped
    matmuls), the shared expert's SwiGLU and the router's input, not a dense GPT layer's tensors; autocast copies
    the experts' weights too. Counted as a dense layer, moe-mini's tensor peak was under-predicted by 19% here and
    by 28% on an H100. Against a real step's tensor peak (routing cannot be traced without storage)."""
    from accelbench.cli import main

    args = ["run", "--workload", "moe", "--model", "moe-tiny", "--batch-size", "4", "--precision", precision,
            "--epochs", "1", "--steps-per-epoch", "1", "--no-calibration", "--idle-baseline-s", "0",
            "--output-dir", str(tmp_path), "--quiet"]  # fmt: skip
    assert main(args) == 0
    (path,) = tmp_path.glob("*.json")
    check = check_prediction(read_record(path))
    assert check is not None and check.memory_basis == "tensors"
    assert check.memory_error is not None and abs(check.memory_error) < 0.03, check
