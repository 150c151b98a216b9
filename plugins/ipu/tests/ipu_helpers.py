"""Helpers shared by the IPU plugin's tests (a module of its own: conftest modules are not importable by name)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from accelbench.config import RunConfig
from accelbench.engine.executor import ExecutorRequest, World
from accelbench.workloads import TrainingJob
from accelbench.workloads.chardata import CharCorpus, RandomWindows
from accelbench.workloads.gpt import GPT, GPTConfig, configure_adamw

HERE = Path(__file__).parent
FAKE_POPTORCH = HERE / "fake_poptorch"
FAKE_PVA = HERE / "fake_pva"
# decided before the stand-in is put on sys.path: where the Poplar SDK is installed, tests use it
REAL_POPTORCH = importlib.util.find_spec("poptorch") is not None

stand_in_only = pytest.mark.skipif(
    REAL_POPTORCH, reason="exercises the stand-in's own knobs or messages; the real poptorch is installed"
)


def ipu_config(**fields: object) -> RunConfig:
    """A RunConfig for the IPU backend: a tiny GPT, short epochs, no dropout (deterministic losses)."""
    base: dict[str, object] = {
        "backend": "ipu",
        "model": "custom",
        "n_layer": 4,
        "n_head": 2,
        "n_embd": 16,
        "block_size": 16,
        "batch_size": 8,
        "steps_per_epoch": 2,
        "dropout": 0.0,
    }
    options = fields.pop("backend_options", {})
    base.update(fields)
    return RunConfig(**base, backend_options=options)  # type: ignore[arg-type]


def request_for(config: RunConfig) -> ExecutorRequest:
    from accelbench_ipu.precision import ipu_precision_plan

    return ExecutorRequest(
        config=config,
        device=torch.device("cpu"),
        precision=ipu_precision_plan(config.precision),
        world=World(),
        synchronize=lambda device: None,
    )


def job_for(config: RunConfig, corpus: CharCorpus, model: GPT | None = None) -> TrainingJob:
    """The GPT workload's job for ``config`` (as GPTWorkload.build makes it), optionally around a prebuilt
    model so the large seed-study models are built once per test module."""
    if model is None:
        torch.manual_seed(config.seed)
        n_layer, n_head, n_embd = config.n_layer, config.n_head, config.n_embd
        model = GPT(GPTConfig(n_layer, n_head, n_embd, config.block_size, corpus.vocab_size, config.dropout))  # type: ignore[arg-type]
    data = RandomWindows(corpus, config.block_size, config.batch_size, config.seed, config.steps_per_epoch)
    lr = config.learning_rate
    return TrainingJob(
        model=model,
        data=data,
        make_optimizer=lambda m, device: configure_adamw(m, device, lr),
        flops_per_sample=model.flops_per_token() * config.block_size,
        flops_formula="test",
        tokens_per_sample=config.block_size,
        grad_clip_norm=1.0,
    )
