"""The issue's acceptance matrix: every strategy at 1, 2, 4, 8 and 16 IPUs for both seed-study model sizes
(12 layers, embedding 384 / 768: 21M / 85M parameters), annotated by the executor and compiled against
poptorch (the stand-in here, the real one on the IPU Model where the SDK is installed).

Each model is built once per size and re-annotated per case (the executor removes its blocks on close).
Batches are as in the seed study: micro-batch 1; pipelines accumulate 2S - 1 micro-batches.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from accelbench_ipu.executor import PopTorchExecutor
from ipu_helpers import REAL_POPTORCH, ipu_config, job_for, request_for

from accelbench.errors import ConfigError
from accelbench.workloads.gpt import GPT, GPTConfig
from accelbench.workloads.gpt.data import CharCorpus

IPU_COUNTS = [1, 2, 4, 8, 16]
STRATEGIES = ["pipelined", "sharded", "serial-phased", "parallel-phased"]
SIZES = {"ipu-384": 384, "ipu-768": 768}
BLOCK = 16  # a short context keeps the CPU trace fast; the parameter count does not depend on it


@pytest.fixture(scope="module", params=sorted(SIZES))
def seed_model(request: pytest.FixtureRequest, corpus: CharCorpus) -> Iterator[tuple[str, GPT]]:
    torch.manual_seed(0)
    model = GPT(GPTConfig(12, 12, SIZES[request.param], BLOCK, corpus.vocab_size, 0.0))
    yield request.param, model


@pytest.mark.parametrize("ipus", IPU_COUNTS)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_strategy_compiles_for_seed_models(
    strategy: str, ipus: int, seed_model: tuple[str, GPT], corpus: CharCorpus
) -> None:
    name, model = seed_model
    batch = 2 * (ipus + 1) - 1 if strategy == "pipelined" and ipus > 1 else 1
    config = ipu_config(
        model=name, n_layer=None, n_head=None, n_embd=None, block_size=BLOCK, batch_size=batch,
        steps_per_epoch=1, strategy=strategy, devices=ipus,
    )  # fmt: skip
    executor = PopTorchExecutor(request_for(config))
    try:
        executor.setup(job_for(config, corpus, model))
        inputs, targets = next(executor._job.data.batches(0))  # type: ignore[union-attr]
        seconds = executor.compile(inputs, targets)
        assert seconds is not None and seconds >= 0
        described = executor.describe()
        layout = executor.settings.layout
        assert described["ipus_per_replica"] == ipus and described["strategy"] == strategy
        assert described["micro_batch"] == 1
        if strategy == "pipelined":
            assert described["gradient_accumulation"] == layout.min_gradient_accumulation == batch
        kind = {"pipelined": "Pipelined", "sharded": "Sharded", "serial-phased": "SerialPhased"}.get(strategy)
        assert type(executor._options._execution_strategy).__name__ == f"{kind or 'ParallelPhased'}Execution"
        if not REAL_POPTORCH:  # what the stand-in's compile saw matches the plan
            trainer = executor._trainer
            assert trainer.ipus_per_replica == ipus
            if strategy in ("pipelined", "sharded"):
                assert trainer.pipeline_stages == layout.pipeline_stages
    finally:
        executor.close()
    assert not any(m._forward_pre_hooks for m in model.modules()), "close() removes the annotation"


@pytest.mark.parametrize(("strategy", "ipus"), [(s, n) for s in STRATEGIES for n in (8, 16)])
def test_gpt_nano_is_refused_where_it_cannot_fill_the_ipus(strategy: str, ipus: int) -> None:
    config = ipu_config(
        model="gpt-nano", n_layer=None, n_head=None, n_embd=None, strategy=strategy, devices=ipus,
        batch_size=2 * (ipus + 1) - 1,
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"gpt-nano has 3 transformer layers.*use --ipus 4 or fewer"):
        PopTorchExecutor(request_for(config))
