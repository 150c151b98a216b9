"""The GPT reference workload and its character-level data, against the seed study's definitions."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from accelbench.config import RunConfig
from accelbench.workloads.chardata import SEED_CORPUS_BYTES, SHAKESPEARE_CHARSET, CharCorpus, RandomWindows
from accelbench.workloads.gpt import GPT, MODEL_SIZES, GPTConfig, GPTWorkload, configure_adamw


@pytest.mark.parametrize(
    ("name", "millions"),
    [("gpt2", 85.2), ("gpt2-medium", 302.5), ("ipu-384", 21.4), ("ipu-768", 85.2)],
)
def test_model_sizes_match_the_seed_study(name: str, millions: float) -> None:
    layers, heads, embd = MODEL_SIZES[name]
    with torch.device("meta"):  # no memory: count only
        model = GPT(GPTConfig(layers, heads, embd, block_size=128, vocab_size=65))
    assert model.num_parameters() / 1e6 == pytest.approx(millions, abs=0.1)


def test_flops_per_token_follows_the_stated_formula() -> None:
    model = GPT(GPTConfig(2, 2, 32, block_size=16, vocab_size=65))
    n = model.num_parameters() - 16 * 32  # without position embeddings
    assert model.flops_per_token() == 6 * n + 12 * 2 * 32 * 16


def test_head_is_tied_and_embeddings_are_not_decayed() -> None:
    model = GPT(GPTConfig(1, 2, 16, block_size=8, vocab_size=10))
    assert model.lm_head.weight is model.wte.weight
    opt = configure_adamw(model, torch.device("cpu"), 3e-4)
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert any(p is model.wte.weight for p in no_decay["params"])
    assert any(p is model.blocks[0].mlp.fc.weight for p in decay["params"])
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))
    assert opt.defaults["fused"] is True and opt.defaults["betas"] == (0.9, 0.95)


def test_generated_corpus_has_the_seed_size_and_character_set() -> None:
    corpus = CharCorpus.generated()
    assert len(corpus) == SEED_CORPUS_BYTES
    assert corpus.vocab_size == 65
    assert set(bytes(corpus.data).decode()) == set(SHAKESPEARE_CHARSET)
    assert np.array_equal(CharCorpus.generated().data, corpus.data)  # the same text every time


def test_epoch_is_ceil_n_over_block_plus_one_random_windows(tmp_path: Path) -> None:
    path = tmp_path / "text.txt"
    path.write_bytes(bytes(range(32, 127)) * 100)  # 9500 bytes, 95 symbols
    corpus = CharCorpus.from_file(path)
    assert isinstance(corpus.data, np.memmap)  # streamed from disk, never read whole
    windows = RandomWindows(corpus, block_size=16, batch_size=64, seed=3)
    assert windows.samples_per_epoch == math.ceil(9500 / 17)
    batches = list(windows.batches(epoch=0))
    assert len(batches) == windows.steps() == math.ceil(559 / 64)
    assert sum(x.shape[0] for x, _ in batches) == 559
    x, y = batches[0]
    assert x.shape == y.shape == (64, 16)
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one character
    # consecutive characters of this corpus have consecutive ids
    assert torch.all((y - x) % 95 == 1)
    # deterministic per (seed, epoch, rank); different across epochs and ranks
    again = next(RandomWindows(corpus, 16, 64, seed=3).batches(epoch=0))[0]
    assert torch.equal(again, x)
    assert not torch.equal(next(windows.batches(epoch=1))[0], x)
    assert not torch.equal(next(windows.batches(epoch=0, rank=1, world_size=2))[0], x)


def test_ranks_share_an_epoch_like_a_distributed_sampler(tmp_path: Path) -> None:
    corpus = CharCorpus(np.frombuffer(b"abcdefgh" * 1000, dtype=np.uint8), source="test")
    windows = RandomWindows(corpus, block_size=7, batch_size=10, seed=0)
    assert windows.samples_per_epoch == 1000
    per_rank = [sum(x.shape[0] for x, _ in windows.batches(0, rank, 3)) for rank in range(3)]
    assert per_rank == [334, 334, 334]
    assert windows.steps(0, 3) == 34


def test_step_cap_limits_each_epoch() -> None:
    corpus = CharCorpus(np.frombuffer(b"abcdefgh" * 1000, dtype=np.uint8), source="test")
    windows = RandomWindows(corpus, block_size=7, batch_size=10, seed=0, max_steps=4)
    assert windows.steps() == 4 and len(list(windows.batches(0))) == 4


def test_workload_builds_the_configured_model(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_text("hello world " * 100)
    job = GPTWorkload().build(
        RunConfig(model="custom", n_layer=2, n_head=4, n_embd=32, block_size=8, data=path)
    )
    assert job.summary["vocab_size"] == len(set("hello world "))
    assert len(job.model.blocks) == 2 and job.model.cfg.n_embd == 32
    assert job.flops_per_sample == job.model.flops_per_token() * 8
    loss = job.model(*next(job.data.batches(0)))
    assert loss.item() == pytest.approx(math.log(job.summary["vocab_size"]), rel=0.1)  # untrained: uniform
