"""Seed 004's workloads on IPUs: BERT and the image models are placed by their own units (encoder layers split at
their feed-forward half; the CNNs' blocks), trained through PopTorch with their own optimizers (AdamW, SGD, RMSprop),
and the core's ``--grad-accum`` is PopTorch's gradient accumulation. On the stand-in here, the IPU Model with the SDK."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from accelbench_ipu.executor import PopTorchExecutor
from accelbench_ipu.plugin import IpuBackend
from accelbench_ipu.precision import ipu_precision_plan

from accelbench.config import RunConfig
from accelbench.contract import ExecutorRequest, World
from accelbench.errors import ConfigError
from accelbench.plugins import get_host

BACKEND = IpuBackend()


def start(workload: str, **fields: object) -> tuple[PopTorchExecutor, RunConfig]:
    options = fields.pop("workload_options", {})
    backend_options = fields.pop("backend_options", {})
    config = get_host().resolve(
        RunConfig(workload=workload, backend="ipu", steps_per_epoch=2, workload_options=options,  # type: ignore[arg-type]
                  backend_options=backend_options, **fields)  # type: ignore[arg-type]
    )  # fmt: skip
    host_workload = get_host().workload(workload)
    request = ExecutorRequest(
        config=config,
        device=torch.device("cpu"),
        precision=ipu_precision_plan(config.precision),
        world=World(),
        backend=BACKEND,
        units=host_workload.units(config),
    )
    executor = BACKEND.executor(request)
    executor.setup(host_workload.build(config))
    return executor, config


def train(executor: PopTorchExecutor, steps: int) -> list[float]:
    inputs, targets = next(executor._job.data.batches(0))  # type: ignore[union-attr]
    executor.compile(inputs, targets)
    return [executor.train_step(inputs, targets).item() for _ in range(steps)]


def test_bert_is_pipelined_by_its_layers_with_adamw() -> None:
    executor, _ = start("bert", model="bert-tiny", strategy="pipelined", devices=2, batch_size=5,
                        learning_rate=1e-3, workload_options={"seq_len": 16, "dropout": 0.0, "data_workers": 0,
                                                              "synthetic": "device"})  # fmt: skip
    try:
        losses = train(executor, 3)
        described = executor.describe()
    finally:
        executor.close()
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    blocks = list(described["layout"]["blocks"].values())
    assert blocks[0] == "embeddings" and blocks[-1] == "mlm_head"  # the tied head returns to IPU 0
    assert (
        "layers.1" in blocks and described["layout"]["stages"][1]["ipu"] == 1
    )  # the layers on the second IPU
    assert described["optimizer"] == "poptorch.optim.AdamW" and described["gradient_accumulation"] == 5


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is None, reason="torchvision not installed")
@pytest.mark.parametrize("workload, optimizer", [("resnet50", "SGD"), ("mobilenet-v3-small", "RMSprop")])
def test_image_models_are_pipelined_by_their_blocks(workload: str, optimizer: str) -> None:
    executor, _ = start(workload, strategy="pipelined", devices=2, batch_size=10, grad_accum=5,
                        workload_options={"image_size": 32, "data_workers": 0, "synthetic": "device"})  # fmt: skip
    try:
        losses = train(executor, 1)
        described = executor.describe()
    finally:
        executor.close()
    assert all(torch.isfinite(torch.tensor(losses)))
    assert described["optimizer"] == f"poptorch.optim.{optimizer}" and "momentum" in described
    assert (
        described["gradient_accumulation"] == 5
        and described["gradient_accumulation_source"] == "--grad-accum"
    )
    assert described["layout"]["blocks"]["layer0"].startswith("net.")  # the first block after the stem


def test_grad_accum_and_the_plugins_gradient_accumulation_must_agree() -> None:
    with pytest.raises(ConfigError, match="--grad-accum 2 and --gradient-accumulation 4 disagree"):
        start("bert", model="bert-tiny", strategy="single", devices=1, batch_size=8, grad_accum=2,
              backend_options={"gradient_accumulation": 4}, workload_options={"seq_len": 16})  # fmt: skip
