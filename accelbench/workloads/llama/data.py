"""Text for the Llama workload: the corpus tokenized by the cached byte-level BPE, sampled as the GPT samples.

The corpus is the GPT workload's generated play-like text (:func:`accelbench.workloads.gpt.data.generate_corpus`) or
the ``--data`` text file, tokenized once (:mod:`accelbench.workloads.llama.tokenizer`). An epoch is
ceil(tokens / (seq_len + 1)) windows of seq_len + 1 tokens at random offsets, split over the ranks as a
DistributedSampler splits (every rank ceil(N / world)); inputs are a window's first seq_len tokens, targets its last.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from accelbench.errors import ConfigError
from accelbench.workloads import building_shapes_only
from accelbench.workloads.heldout import HeldOutWindows, held_out_start
from accelbench.workloads.llama.tokenizer import TokenizedCorpus, tokenized


def load_corpus(data: Path | None, vocab_size: int) -> TokenizedCorpus:
    """The run's text (``--data``, else the generated corpus) tokenized with the BPE trained on it."""
    if data is None:
        from accelbench.workloads.gpt.data import SEED_CORPUS_BYTES, generate_corpus

        text = generate_corpus().tobytes().decode("ascii")
        return tokenized(text, vocab_size, f"generated (seeded play-like text, {SEED_CORPUS_BYTES} bytes)")
    path = Path(data)
    if not path.is_file():
        what = "not a regular file" if path.exists() else "no such file"
        raise ConfigError(f"--data {path}: {what}; give a text file, or omit --data for the generated corpus")
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ConfigError(f"--data {path}: cannot read it ({exc.strerror or exc})") from None
    if not text.strip():
        raise ConfigError(f"--data {path}: the file has no text")
    return tokenized(text, vocab_size, "file", path)


def synthetic_corpus(vocab_size: int, seq_len: int, batch_size: int) -> TokenizedCorpus:
    """Token ids that only have the run's shapes, for a build of its shapes alone (``accelbench estimate``): no
    text read, no tokenizer trained or loaded, so estimating needs neither the corpus nor the ``tokenizers``
    package. Enough tokens for a batch of windows and a held-out share."""
    tokens = (np.arange(2 * (seq_len + 1) * (batch_size + 1), dtype=np.int64) % vocab_size).astype(np.uint32)
    return TokenizedCorpus(tokens=tokens, vocab_size=vocab_size, requested_vocab=vocab_size,
                           source="synthetic (a build for its shapes alone: no tokenizer)", path=None,
                           text_bytes=len(tokens), tokenizer_file=Path(), cached=True)  # fmt: skip


def token_sources(
    data: Path | None, vocab_size: int, seq_len: int, batch_size: int, seed: int, steps_per_epoch: int | None
) -> tuple[TokenizedCorpus, TokenWindows, HeldOutWindows | None]:
    """The run's tokenized corpus, its training windows and its held-out windows (the last share of the tokens,
    :func:`~accelbench.workloads.heldout.held_out_start`; None when the corpus is too short to spare one): what every
    decoder workload on this corpus (llama, moe) trains and evaluates on."""
    corpus = (
        synthetic_corpus(vocab_size, seq_len, batch_size)
        if building_shapes_only()
        else load_corpus(data, vocab_size)
    )
    held_out = held_out_start(len(corpus.tokens), seq_len + 1)
    windows = TokenWindows(corpus, seq_len, batch_size, seed, steps_per_epoch, end=held_out)
    tokens = corpus.tokens
    validation = (
        HeldOutWindows(lambda idx: tokens[idx], held_out, len(tokens), seq_len + 1, batch_size)
        if held_out is not None
        else None
    )
    return corpus, windows, validation


class TokenWindows:
    """Random windows of seq_len + 1 tokens, made on the host (numpy gathers), split over ranks."""

    def __init__(
        self,
        corpus: TokenizedCorpus,
        seq_len: int,
        batch_size: int,
        seed: int,
        max_steps: int | None = None,
        end: int | None = None,
    ) -> None:
        """``end``: where the training part of the tokens ends (the held-out split after it is never sampled); all
        of them by default. An epoch stays ceil(tokens / (seq_len + 1)) windows of the whole corpus."""
        if len(corpus.tokens) < seq_len + 2:
            raise ConfigError(
                f"the corpus is {len(corpus.tokens)} tokens, shorter than --seq-len + 1 ({seq_len + 1}); use a "
                "smaller --seq-len or a larger --data file"
            )
        self.corpus = corpus
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.seed = seed
        self.max_steps = max_steps
        self.end = len(corpus.tokens) if end is None else end
        self.samples_per_epoch = math.ceil(len(corpus.tokens) / (seq_len + 1))
        self._offsets = np.arange(seq_len + 1, dtype=np.int64)

    def _rank_samples(self, world_size: int) -> int:
        return math.ceil(self.samples_per_epoch / world_size)

    def steps(self, rank: int = 0, world_size: int = 1) -> int:
        steps = math.ceil(self._rank_samples(world_size) / self.batch_size)
        return min(steps, self.max_steps) if self.max_steps else steps

    def starts(self, epoch: int, rank: int, world_size: int) -> np.ndarray:
        """Where this rank's windows of ``epoch`` start (the same for the host and the device source)."""
        rng = np.random.default_rng([self.seed, epoch, rank])
        high = self.end - self.seq_len - 1
        return rng.integers(0, high, size=self._rank_samples(world_size))

    def batches(
        self, epoch: int, rank: int = 0, world_size: int = 1
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        starts, tokens = self.starts(epoch, rank, world_size), self.corpus.tokens
        for step in range(self.steps(rank, world_size)):
            idx = starts[step * self.batch_size : (step + 1) * self.batch_size]
            windows = torch.from_numpy(tokens[idx[:, None] + self._offsets].astype(np.int64))
            yield windows[:, :-1], windows[:, 1:]

    def to_device(self, device: torch.device, placement: str) -> DeviceTokenWindows:
        """The same windows gathered on ``device`` from a device copy of the tokens (4 bytes a token)."""
        return DeviceTokenWindows(self, device)

    def describe(self) -> dict[str, Any]:
        c = self.corpus
        return {
            "placement": "host (windows gathered by numpy, copied to the device each step)",
            "source": c.source,
            "path": str(c.path) if c.path else None,
            "bytes": c.text_bytes,
            "tokens": len(c.tokens),
            "vocab_size": c.vocab_size,
            "tokenizer": c.describe(),
            "seq_len": self.seq_len,
            "samples_per_epoch": self.samples_per_epoch,
            "sampling": "random windows of seq_len+1 tokens; epoch = ceil(tokens / (seq_len + 1)) samples",
            "trained_on": f"tokens 0 to {self.end}"
            + (" (the rest is held out for validation)" if self.end < len(c.tokens) else ""),
            "steps_per_epoch_cap": self.max_steps,
        }


class DeviceTokenWindows:
    """:class:`TokenWindows` with the tokens on the device: the same windows, one gather kernel a step."""

    def __init__(self, windows: TokenWindows, device: torch.device) -> None:
        self.windows = windows
        self.device = device
        self.samples_per_epoch = windows.samples_per_epoch
        self.tokens = torch.from_numpy(windows.corpus.tokens.astype(np.int32)).to(device)
        self.offsets = torch.arange(windows.seq_len + 1, device=device)

    def steps(self, rank: int = 0, world_size: int = 1) -> int:
        return self.windows.steps(rank, world_size)

    def batches(
        self, epoch: int, rank: int = 0, world_size: int = 1
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        w = self.windows
        starts = torch.from_numpy(w.starts(epoch, rank, world_size)).to(self.device)
        for step in range(self.steps(rank, world_size)):
            idx = starts[step * w.batch_size : (step + 1) * w.batch_size]
            windows = self.tokens[idx[:, None] + self.offsets].long()
            yield windows[:, :-1], windows[:, 1:]

    def describe(self) -> dict[str, Any]:
        return {
            **self.windows.describe(),
            "placement": f"device (tokens copied to {self.device.type} once; windows gathered there)",
        }
