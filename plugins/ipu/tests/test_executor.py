"""The PopTorch executor trains for real (tiny GPT, on the stand-in's CPU execution): every strategy, the
batch arithmetic, precision options, the optimizer, compile timing with the executable cache, per-IPU
memory from the graph profile, and honest labels on what ran."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from accelbench_ipu.executor import PopTorchExecutor
from accelbench_ipu.plugin import IpuBackend
from ipu_helpers import REAL_POPTORCH, ipu_config, job_for, request_for, stand_in_only

from accelbench.errors import BackendError, ConfigError
from accelbench.workloads.gpt.data import CharCorpus

BACKEND = IpuBackend()  # the backend; the executors it builds report their memory to it


def start(corpus: CharCorpus, **fields: object) -> PopTorchExecutor:
    config = ipu_config(**fields)
    executor = BACKEND.executor(request_for(config, BACKEND))
    executor.setup(job_for(config, corpus))
    return executor


def first_batch(executor: PopTorchExecutor) -> tuple[torch.Tensor, torch.Tensor]:
    return next(executor._job.data.batches(0))  # type: ignore[union-attr]


def train(executor: PopTorchExecutor, steps: int) -> list[float]:
    inputs, targets = first_batch(executor)
    executor.compile(inputs, targets)
    return [executor.train_step(inputs, targets).item() for _ in range(steps)]


@pytest.mark.parametrize(
    ("strategy", "devices", "batch"),
    [
        ("single", 1, 8),
        ("pipelined", 4, 18),
        ("sharded", 4, 8),
        ("serial-phased", 2, 8),
        ("parallel-phased", 4, 8),
    ],
)
def test_every_strategy_trains(strategy: str, devices: int, batch: int, corpus: CharCorpus) -> None:
    executor = start(corpus, strategy=strategy, devices=devices, batch_size=batch, learning_rate=1e-2)
    try:
        losses = train(executor, 8)
    finally:
        executor.close()
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0] - 0.05, losses  # it learns (overfits one batch)


@stand_in_only
def test_accumulation_and_replication_keep_the_batch_gradient(corpus: CharCorpus) -> None:
    """Mean reduction over micro-batches and replicas: the same losses as one full batch."""

    def losses(**options: object) -> list[float]:
        devices = int(options.get("replicas", 1))  # type: ignore[arg-type]
        executor = start(corpus, strategy="single", devices=devices, batch_size=8, backend_options=options)
        try:
            return train(executor, 4)
        finally:
            executor.close()

    whole = losses()
    assert losses(gradient_accumulation=4) == pytest.approx(whole, rel=1e-4)
    assert losses(replicas=2, gradient_accumulation=2) == pytest.approx(whole, rel=1e-4)


@stand_in_only
def test_device_iterations_are_optimizer_steps_per_call(corpus: CharCorpus) -> None:
    executor = start(
        corpus, strategy="sharded", devices=2, batch_size=12, backend_options={"device_iterations": 3}
    )
    try:
        train(executor, 2)
        optimizer = executor._trainer.optimizer
        state = optimizer.state[executor._model.wte.weight]  # type: ignore[union-attr]
        assert int(state["step"]) == 6
        assert executor.describe()["optimizer_steps_per_step"] == 3
    finally:
        executor.close()


def test_the_optimizer_is_poptorch_adamw_with_the_workload_hyperparameters(corpus: CharCorpus) -> None:
    executor = start(corpus, strategy="single", learning_rate=3e-4)
    try:
        import poptorch

        optimizer = executor._trainer.optimizer
        assert isinstance(optimizer, poptorch.optim.AdamW)
        decay = {g["weight_decay"] for g in optimizer.param_groups}
        assert decay == {0.0, 0.1}  # decay on matmul weights only, as the core's AdamW
        assert optimizer.defaults["lr"] == 3e-4 and tuple(optimizer.defaults["betas"]) == (0.9, 0.95)
        described = executor.describe()
        assert described["optimizer"] == "poptorch.optim.AdamW" and described["grad_clip_norm"] == 1.0
        if not REAL_POPTORCH:
            assert optimizer.max_grad_norm == 1.0
    finally:
        executor.close()


def test_fp16_runs_half_with_the_recorded_partials_and_rounding(corpus: CharCorpus) -> None:
    executor = start(
        corpus,
        strategy="pipelined",
        devices=2,
        batch_size=6,
        precision="fp16-mixed",
        backend_options={"partials": "half", "stochastic_rounding": True, "ipu_loss_scaling": 64.0},
    )
    try:
        losses = train(executor, 3)
        assert all(p.dtype == torch.float16 for p in executor._model.parameters())  # type: ignore[union-attr]
        plan = executor.effective_precision(executor.request.precision)
        assert plan.param_dtype == "float16" and plan.matmul_math.startswith("FP16.16")
        assert "stochastic rounding on" in plan.notes and "static loss scaling x64" in plan.notes
        assert executor.describe()["moments_accum_type"] == "float32"
        if not REAL_POPTORCH:
            assert executor._trainer.optimizer.accum_types == (torch.float32,) * 3
            assert executor._trainer.optimizer.loss_scaling == 64.0
        assert all(torch.isfinite(torch.tensor(losses)))
    finally:
        executor.close()


@stand_in_only
def test_executable_cache_records_cold_and_cached_compiles(corpus: CharCorpus, tmp_path: Path) -> None:
    options = {"executable_cache": str(tmp_path / "cache")}
    first = start(corpus, strategy="pipelined", devices=2, batch_size=6, backend_options=options)
    try:
        cold = train(first, 1) and first.describe()
    finally:
        first.close()
    assert cold["cache"] == "miss"
    assert cold["compile_cold_s"] > 0 and cold["compile_cached_s"] > 0
    assert any((tmp_path / "cache").iterdir())

    again = start(corpus, strategy="pipelined", devices=2, batch_size=6, backend_options=options)
    try:
        inputs, targets = first_batch(again)
        seconds = again.compile(inputs, targets)
        warm = again.describe()
    finally:
        again.close()
    assert warm["cache"] == "hit" and warm["compile_cold_s"] is None
    assert seconds == warm["compile_cached_s"]
    assert warm["memory"]["per_ipu_bytes"] is None  # nothing compiled, so no profile: unknown, not guessed


def test_without_cache_the_compile_is_cold(corpus: CharCorpus) -> None:
    executor = start(corpus, strategy="sharded", devices=2)
    try:
        inputs, targets = first_batch(executor)
        seconds = executor.compile(inputs, targets)
        described = executor.describe()
    finally:
        executor.close()
    assert described["cache"] == "disabled" and described["compile_cold_s"] == seconds
    assert described["compile_cached_s"] is None


def test_memory_from_the_graph_profile_per_ipu(corpus: CharCorpus, with_pva: None) -> None:
    executor = start(corpus, strategy="pipelined", devices=4, batch_size=9)
    try:
        train(executor, 1)
        per_ipu = executor.describe()["memory"]["per_ipu_bytes"]
        stats = BACKEND.epoch_end(torch.device("cpu")).memory
    finally:
        executor.close()
    assert len(per_ipu) == 4 and all(b > 0 for b in per_ipu)
    assert stats.peak_bytes == max(per_ipu) and stats.total_bytes == 1472 * 624 * 1024
    assert "graph profile (pva)" in stats.source


def test_memory_is_unknown_without_pva(corpus: CharCorpus, without_pva: None) -> None:
    executor = start(corpus, strategy="sharded", devices=2)
    try:
        train(executor, 1)
        stats = BACKEND.epoch_end(torch.device("cpu")).memory
    finally:
        executor.close()
    assert stats.peak_bytes is None and "pva" in stats.source and "not importable" in stats.source


def test_memory_unknown_when_profile_turned_off(corpus: CharCorpus, with_pva: None) -> None:
    executor = start(corpus, strategy="single", backend_options={"ipu_graph_profile": False})
    try:
        train(executor, 1)
    finally:
        executor.close()
    assert BACKEND.graph_memory.stats().peak_bytes is None
    assert "turned off" in BACKEND.graph_memory.source


def test_a_partial_last_batch_is_refused_before_compiling(corpus: CharCorpus) -> None:
    config = ipu_config(strategy="single", batch_size=64, steps_per_epoch=None)
    executor = PopTorchExecutor(request_for(config))
    with pytest.raises(ConfigError, match=r"a last one of \d+, which an IPU executable .*--steps-per-epoch"):
        executor.setup(job_for(config, corpus))
    executor.close()


def test_a_batch_of_another_size_is_refused(corpus: CharCorpus) -> None:
    executor = start(corpus, strategy="single")
    try:
        inputs, targets = first_batch(executor)
        executor.compile(inputs, targets)
        with pytest.raises(BackendError, match="compiled for 8"):
            executor.train_step(inputs[:4], targets[:4])
    finally:
        executor.close()


def test_describe_names_the_device_layout_and_what_the_timings_are(corpus: CharCorpus) -> None:
    executor = start(
        corpus, strategy="pipelined", devices=4, batch_size=18, backend_options={"replicas": 2, "ipus": 2}
    )
    try:
        train(executor, 1)
        described = executor.describe()
    finally:
        executor.close()
    assert described["device"] == "IPU"
    assert (described["replicas"], described["ipus_per_replica"], described["ipus_total"]) == (2, 2, 4)
    assert described["layout"]["stages"][-1] == {"stage": 2, "ipu": 0, "blocks": ["head"]}
    assert described["pipeline_stages"] == 3 and described["gradient_accumulation"] == 9
    assert described["emulated"] is True  # the stand-in, or the IPU Model where the SDK is installed
    assert "not IPU" in described["timing"]


def test_close_removes_the_annotation(corpus: CharCorpus) -> None:
    executor = start(corpus, strategy="serial-phased", devices=2)
    model = executor._model
    assert any(m._forward_pre_hooks for m in model.modules())  # type: ignore[union-attr]
    executor.close()
    assert not any(m._forward_pre_hooks for m in model.modules())  # type: ignore[union-attr]
    executor.close()  # twice is harmless


def test_without_poptorch_setup_says_where_it_comes_from(
    corpus: CharCorpus, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "poptorch", None)  # as if not installed
    config = ipu_config()
    executor = PopTorchExecutor(request_for(config))
    with pytest.raises(BackendError, match="ships as a wheel inside Graphcore's Poplar SDK"):
        executor.setup(job_for(config, corpus))


def test_the_graph_profile_keeps_the_users_engine_options(
    corpus: CharCorpus, with_pva: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    mine = json.dumps({"autoReport.directory": str(tmp_path / "reports"), "debug.instrument": "false"})
    monkeypatch.setenv("POPLAR_ENGINE_OPTIONS", mine)
    executor = start(corpus, strategy="sharded", devices=2)
    try:
        train(executor, 1)
    finally:
        executor.close()
    assert os.environ["POPLAR_ENGINE_OPTIONS"] == mine  # restored as it was
    assert list((tmp_path / "reports").rglob("profile.pop"))  # written where the user asked
    assert executor.describe()["memory"]["per_ipu_bytes"] is not None
    monkeypatch.delenv("POPLAR_ENGINE_OPTIONS")
    again = start(corpus, strategy="single")
    try:
        train(again, 1)
    finally:
        again.close()
    assert "POPLAR_ENGINE_OPTIONS" not in os.environ


def test_the_step_boundaries_follow_the_passes_each_call_ran(corpus: CharCorpus) -> None:
    """One PopTorch call runs device-iterations optimizer steps of gradient-accumulation micro-batches each; the
    backend hears of them when the call returns, in that order (the compile runs no step)."""
    calls: list[str] = []

    class Recording(IpuBackend):
        def after_backward(self, device: torch.device) -> None:
            calls.append("after_backward")

        def after_optimizer_step(self, device: torch.device) -> None:
            calls.append("after_optimizer_step")

    recording = Recording()
    config = ipu_config(
        strategy="single", batch_size=8, backend_options={"device_iterations": 2, "gradient_accumulation": 2}
    )
    executor = recording.executor(request_for(config, recording))
    try:
        executor.setup(job_for(config, corpus))
        inputs, targets = first_batch(executor)
        executor.compile(inputs, targets)
        assert calls == []
        executor.train_step(inputs, targets)
    finally:
        executor.close()
    assert calls == (["after_backward"] * 2 + ["after_optimizer_step"]) * 2
