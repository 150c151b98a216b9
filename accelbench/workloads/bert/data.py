"""Text for BERT: tokenisers, a tokenised corpus, and masked sequences as BERT's pre-training makes them.

Two tokenisers, neither downloaded:

- WordPiece from a local ``vocab.txt`` (``--tokenizer``; BERT's own files work): lower-cased words and punctuation,
  each split greedily into the longest pieces the vocabulary has (``##`` continuations), [UNK] where none fits;
- the built-in one (default): the same words, each hashed (CRC-32) into BERT's 30,522 ids above its reserved ones,
  so the model keeps BERT's shapes and costs with no vocabulary file. It is for benchmarking: unrelated words
  share ids.

A corpus (``--data``: a text file or a folder of ``.txt`` files) is tokenised once when the run builds its job.
A sequence is [CLS], a window of seq_len - 2 tokens at a random offset, [SEP] (an epoch is ceil(tokens /
(seq_len - 2)) windows, as the GPT workload samples its text); synthetic sequences draw Zipf-distributed ids.
Masking is BERT's: the chosen positions become [MASK] (80%), a random token (10%) or stay (10%).
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from accelbench.errors import ConfigError
from accelbench.workloads.bert import BERT_VOCAB
from accelbench.workloads.pipeline import sample_rng

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
BUILTIN_IDS = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}  # BERT uncased's
FIRST_WORD_ID = 999  # ids below are BERT's reserved and special tokens
MAX_WORD_CHARS = 100  # longer words are [UNK], as BERT's WordPiece does
_WORDS = re.compile(r"\w+|[^\w\s]")  # words and single punctuation characters


def basic_tokens(text: str) -> list[str]:
    """BERT's basic tokenisation, simplified: lower case, words and punctuation apart."""
    return _WORDS.findall(text.lower())


@dataclass
class HashingTokenizer:
    """The built-in tokeniser: each word's CRC-32 picks an id in [999, vocab_size)."""

    vocab_size: int = BERT_VOCAB
    ids: dict[str, int] = field(default_factory=lambda: dict(BUILTIN_IDS))
    name: str = f"built-in (words hashed into {BERT_VOCAB:,} ids)"
    first_word_id: int = FIRST_WORD_ID  # below: reserved and special ids

    def encode(self, text: str) -> list[int]:
        span = self.vocab_size - FIRST_WORD_ID
        return [FIRST_WORD_ID + zlib.crc32(w.encode()) % span for w in basic_tokens(text)]


class WordPieceTokenizer:
    """BERT's WordPiece over a local vocabulary file (one token per line, the line number is its id)."""

    def __init__(self, path: Path) -> None:
        try:
            tokens = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--tokenizer {path}: cannot read it as a vocabulary ({exc})") from None
        self.vocab = {token: i for i, token in enumerate(tokens)}
        missing = [s for s in SPECIALS if s not in self.vocab]
        if missing:
            raise ConfigError(
                f"--tokenizer {path}: the vocabulary lacks {', '.join(missing)}; give a BERT vocab.txt"
            )
        self.vocab_size = len(tokens)
        self.ids = {s: self.vocab[s] for s in SPECIALS}
        self.name = f"WordPiece ({path.name}, {self.vocab_size:,} tokens)"
        self.first_word_id = (
            0  # any id may replace a masked token, as Google's create_pretraining_data draws them
        )
        self._cache: dict[str, list[int]] = {}

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        for word in basic_tokens(text):
            pieces = self._cache.get(word)
            if pieces is None:
                pieces = self._cache[word] = self._pieces(word)
            out += pieces
        return out

    def _pieces(self, word: str) -> list[int]:
        if len(word) > MAX_WORD_CHARS:
            return [self.ids["[UNK]"]]
        pieces, start = [], 0
        while start < len(word):
            for end in range(len(word), start, -1):
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    pieces.append(self.vocab[piece])
                    start = end
                    break
            else:
                return [self.ids["[UNK]"]]
        return pieces


@dataclass
class TokenizedText:
    tokens: np.ndarray  # int32 token ids of the whole corpus
    ids: dict[str, int]  # the special tokens' ids
    vocab_size: int
    source: str
    tokenizer: str
    files: int
    first_word_id: int  # the lowest id a random replacement may take


def open_text(path: Path, tokenizer_file: Any, seq_len: int) -> TokenizedText:
    """``path`` (a text file, or every ``.txt`` file under a folder, in name order) tokenised."""
    files = [path] if path.is_file() else sorted(path.rglob("*.txt"))
    if not files:
        raise ConfigError(
            f"--data {path}: no .txt files in this folder; give a text file or a folder of them"
        )
    tokenizer: HashingTokenizer | WordPieceTokenizer = (
        WordPieceTokenizer(Path(str(tokenizer_file))) if tokenizer_file else HashingTokenizer()
    )
    parts = [
        np.asarray(tokenizer.encode(f.read_text(encoding="utf-8", errors="replace")), np.int32) for f in files
    ]
    tokens = np.concatenate(parts) if parts else np.zeros(0, np.int32)
    if len(tokens) < seq_len - 1:
        raise ConfigError(
            f"--data {path}: {len(tokens)} tokens, fewer than one sequence of {seq_len - 2} text tokens; give more "
            "text or a smaller --seq-len"
        )
    return TokenizedText(tokens, tokenizer.ids, tokenizer.vocab_size, f"text ({len(files)} file(s))", tokenizer.name,
                         len(files), tokenizer.first_word_id)  # fmt: skip


class MaskedSequences:
    """Masked sequences by ``(epoch, index)``: windows of a tokenised corpus, or synthetic ids when ``text`` is
    None. Returns (input ids (S,), targets (2, P): predicted positions and their original tokens)."""

    def __init__(
        self,
        text: TokenizedText | None,
        vocab_size: int,
        seq_len: int,
        predicted: int,
        seed: int,
        synthetic_samples: int,
    ) -> None:
        self.text = text
        self.vocab_size = vocab_size
        self.seq_len = seq_len
        self.predicted = predicted
        self.seed = seed
        self.ids = text.ids if text else dict(BUILTIN_IDS)
        self.random_low = (
            text.first_word_id if text else FIRST_WORD_ID
        )  # the 10% random replacements' lowest id
        body = seq_len - 2
        self.samples = math.ceil(len(text.tokens) / body) if text else synthetic_samples
        if text is None:  # Zipf over the word ids: a few frequent tokens, a long tail, as in text
            weights = 1.0 / np.arange(1, vocab_size - FIRST_WORD_ID + 1)
            self.cdf = np.cumsum(weights / weights.sum())

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        epoch, index = key
        rng = sample_rng(self.seed, epoch, index)
        body = self.seq_len - 2
        if self.text is not None:
            start = int(rng.integers(0, len(self.text.tokens) - body + 1))
            words = self.text.tokens[start : start + body].astype(np.int64)
        else:
            words = FIRST_WORD_ID + np.minimum(np.searchsorted(self.cdf, rng.random(body)), len(self.cdf) - 1)
        ids = np.concatenate([[self.ids["[CLS]"]], words, [self.ids["[SEP]"]]]).astype(np.int64)
        positions = np.sort(rng.choice(body, size=self.predicted, replace=False)) + 1
        labels = ids[positions]
        roll = rng.random(self.predicted)
        masked = np.where(roll < 0.8, self.ids["[MASK]"], labels)
        random = (roll >= 0.8) & (roll < 0.9)
        masked[random] = rng.integers(self.random_low, self.vocab_size, size=int(random.sum()))
        ids[positions] = masked
        return torch.from_numpy(ids), torch.from_numpy(np.stack([positions, labels]).astype(np.int64))

    def describe(self) -> dict[str, Any]:
        common = {
            "seq_len": self.seq_len,
            "predicted_per_sequence": self.predicted,
            "masking": "80% [MASK], 10% random token, 10% kept; positions and tokens seeded by (seed, epoch, index)",
        }
        if self.text is None:
            return {"source": "synthetic: Zipf-distributed token ids, masked on the host", **common}
        return {
            "source": self.text.source,
            "tokens": int(len(self.text.tokens)),
            "tokenizer": self.text.tokenizer,
            "vocab_size": self.text.vocab_size,
            "sampling": "[CLS] + a window of seq_len - 2 tokens at a random offset + [SEP]; epoch = ceil(tokens / "
            "(seq_len - 2)) sequences",
            **common,
        }


def random_masked(
    seq_len: int, predicted: int, vocab_size: int
) -> Callable[[torch.Generator, int, torch.device], tuple[torch.Tensor, torch.Tensor]]:
    """The batch maker of ``--synthetic device``: uniform ids, masked as BERT masks, all drawn on the device."""
    cls, sep, mask = BUILTIN_IDS["[CLS]"], BUILTIN_IDS["[SEP]"], BUILTIN_IDS["[MASK]"]

    def make(
        generator: torch.Generator, size: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(FIRST_WORD_ID, vocab_size, (size, seq_len), generator=generator, device=device)
        ids[:, 0], ids[:, -1] = cls, sep
        order = torch.rand(size, seq_len - 2, generator=generator, device=device).argsort(dim=1)
        positions = order[:, :predicted].sort(dim=1).values + 1
        labels = ids.gather(1, positions)
        roll = torch.rand(size, predicted, generator=generator, device=device)
        random = torch.randint(
            FIRST_WORD_ID, vocab_size, (size, predicted), generator=generator, device=device
        )
        masked = torch.where(
            roll < 0.8, torch.full_like(labels, mask), torch.where(roll < 0.9, random, labels)
        )
        ids.scatter_(1, positions, masked)
        return ids, torch.stack([positions, labels], dim=1)

    return make
