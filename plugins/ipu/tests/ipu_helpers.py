"""Helpers shared by the IPU plugin's tests (a module of its own: conftest modules are not importable by name)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from accelbench.config import RunConfig
from accelbench.contract import Backend, ExecutorRequest, World
from accelbench.workloads import TrainingJob
from accelbench.workloads.gpt import GPTWorkload, gpt_units, resolve_size
from accelbench.workloads.gpt.data import CharCorpus, RandomWindows
from accelbench.workloads.gpt.model import GPT, GPTConfig, configure_adamw

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
    gpt = {k: base.pop(k) for k in ("n_layer", "n_head", "n_embd", "block_size", "dropout") if k in base}
    gpt = {k: v for k, v in gpt.items() if v is not None}  # a named size: no custom dimensions
    from accelbench.plugins import get_host

    config = RunConfig(**base, backend_options=options, workload_options=gpt)  # type: ignore[arg-type]
    return get_host().resolve(config)  # the GPT's options completed, as a run has them


def request_for(config: RunConfig, backend: Backend | None = None) -> ExecutorRequest:
    """The request the runner makes for ``config``, from ``backend`` (a fresh IpuBackend by default)."""
    from accelbench_ipu.plugin import IpuBackend
    from accelbench_ipu.precision import ipu_precision_plan

    return ExecutorRequest(
        config=config,
        device=torch.device("cpu"),
        precision=ipu_precision_plan(config.precision),
        world=World(),
        backend=backend or IpuBackend(),
        units=GPTWorkload().units(config),
    )


def job_for(config: RunConfig, corpus: CharCorpus, model: GPT | None = None) -> TrainingJob:
    """The GPT workload's job for ``config`` (as GPTWorkload.build makes it), optionally around a prebuilt
    model so the large seed-study models are built once per test module."""
    options = config.workload_options
    block_size = int(options["block_size"])
    n_layer, n_head, n_embd = resolve_size(config)
    if model is None:
        torch.manual_seed(config.seed)
        model = GPT(
            GPTConfig(n_layer, n_head, n_embd, block_size, corpus.vocab_size, float(options["dropout"]))
        )
    data = RandomWindows(corpus, block_size, config.batch_size, config.seed, config.steps_per_epoch)
    lr = config.learning_rate
    return TrainingJob(
        model=model,
        data=data,
        make_optimizer=lambda m, device, kernels: configure_adamw(m, kernels, lr),
        flops_per_sample=model.flops_per_token() * block_size,
        flops_formula="test",
        tokens_per_sample=block_size,
        units=gpt_units(n_layer),
        grad_clip_norm=1.0,
    )
