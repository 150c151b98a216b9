"""Character-level data exactly as in the seed study: random windows of block + 1 characters.

An epoch is ceil(N / (block + 1)) samples, each a window starting at a uniformly random offset. Characters are
bytes (the seed study reduced its large corpus to 8-bit characters); the vocabulary is the distinct bytes of the
corpus. A file is memory-mapped, so a multi-GiB corpus streams from disk instead of being loaded whole.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from accelbench.errors import ConfigError

# The 65 characters of the Shakespeare corpus used by the seed study (char-rnn / minGPT).
SHAKESPEARE_CHARSET = "\n !$&',-.3:;?" + "ABCDEFGHIJKLMNOPQRSTUVWXYZ" + "abcdefghijklmnopqrstuvwxyz"
SEED_CORPUS_BYTES = round(4.4 * 2**20)  # the seed study's 4.4 MiB
# the generator's output: bump it when its bytes change, so no cached corpus of the old is read
CORPUS_FORMAT = 1
_SCAN_CHUNK = 64 * 2**20
# --data-placement auto keeps corpora up to this size on the device (larger ones stream from host memory)
AUTO_DEVICE_BYTES = 2 * 2**30


@functools.lru_cache(maxsize=2)  # sweeps and repeated runs in one process generate it once
def generate_corpus(n_bytes: int = SEED_CORPUS_BYTES, seed: int = 1234) -> np.ndarray:
    """A deterministic play-like text of ``n_bytes`` over the Shakespeare character set.

    Speaker lines, sentences of Zipf-distributed pseudo-words and punctuation give the model structure to learn
    (so the loss falls as in the seed study) while the benchmark stays offline. Generating it takes about a second
    of pure Python, which every process of every run paid (each rank of a job, the launcher's preflight): the bytes
    are cached under ``$ACCELBENCH_CACHE_DIR/corpus`` and read back, checked against their SHA-256, in milliseconds
    (:func:`_cached_corpus`).
    """
    cached = _cached_corpus(n_bytes, seed)
    if cached is not None:
        return cached
    data = _generate(n_bytes, seed)
    _cache_corpus(data, n_bytes, seed)
    return data


def corpus_cache_file(n_bytes: int, seed: int) -> Path:
    """Where the generated corpus of ``n_bytes`` and ``seed`` is cached: the generator's format, seed and size in
    its name, so a change of the generator (a new ``CORPUS_FORMAT``) never reads an old file."""
    from accelbench.estimate.peak import cache_dir

    return cache_dir() / "corpus" / f"play-v{CORPUS_FORMAT}-seed{seed}-{n_bytes}.bin"


def _cached_corpus(n_bytes: int, seed: int) -> np.ndarray | None:
    """The cached bytes, or None where there are none, or they are not exactly what was written (the file holds
    the payload's SHA-256, then the payload: a truncated or altered file is regenerated, never trained on)."""
    try:
        raw = corpus_cache_file(n_bytes, seed).read_bytes()
    except OSError:
        return None
    digest, payload = raw[:32], raw[32:]
    if len(payload) != n_bytes or hashlib.sha256(payload).digest() != digest:
        return None
    return np.frombuffer(payload, dtype=np.uint8)


def _cache_corpus(data: np.ndarray, n_bytes: int, seed: int) -> None:
    """Write the cache file atomically (:func:`accelbench.results.write_output`: a concurrent rank reads all of it
    or none); best effort: an unwritable cache only means the next process generates the text again."""
    from accelbench.results import write_output

    payload = data.tobytes()
    with contextlib.suppress(OSError):
        write_output(hashlib.sha256(payload).digest() + payload, corpus_cache_file(n_bytes, seed))


def _generate(n_bytes: int, seed: int) -> np.ndarray:
    """The text itself (:func:`generate_corpus`); its bytes are ``CORPUS_FORMAT``'s: change them, bump it."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    letter_p = 1.0 / np.arange(1, 27) ** 0.9
    letter_p /= letter_p.sum()
    words = ["".join(rng.choice(letters, size=int(rng.integers(1, 10)), p=letter_p)) for _ in range(3000)]
    word_p = 1.0 / (np.arange(len(words)) + 2.7)
    word_p /= word_p.sum()
    speakers = [w.upper() for w in words[:40] if len(w) > 2][:25]
    marks = [".", ".", ".", ",", "?", "!", ";", ":", "'s", " &", " 3", " $"]
    parts: list[str] = [
        SHAKESPEARE_CHARSET.replace("\n", " ") + "\n\n"
    ]  # every character occurs at least once
    size = len(parts[0])
    word_ids = iter(rng.choice(len(words), size=n_bytes, p=word_p))
    while size < n_bytes:
        lines = []
        for _ in range(int(rng.integers(1, 5))):
            sentence = " ".join(words[next(word_ids)] for _ in range(int(rng.integers(3, 12))))
            mark = marks[int(rng.integers(len(marks)))]
            lines.append(sentence[0].upper() + sentence[1:] + mark + ("-" if rng.random() < 0.02 else ""))
        block = speakers[int(rng.integers(len(speakers)))] + ":\n" + "\n".join(lines) + "\n\n"
        parts.append(block)
        size += len(block)
    return np.frombuffer("".join(parts).encode("ascii")[:n_bytes], dtype=np.uint8)


class CharCorpus:
    """Bytes plus a byte -> token id table. Backed by a memory map for files, an array for generated text."""

    def __init__(self, data: np.ndarray, source: str, path: Path | None = None) -> None:
        self.data = data
        self.source = source
        self.path = path
        counts = np.zeros(256, dtype=np.int64)
        for start in range(
            0, len(data), _SCAN_CHUNK
        ):  # chunked, so a memory-mapped file is never loaded whole
            counts += np.bincount(data[start : start + _SCAN_CHUNK], minlength=256)
        present = np.flatnonzero(counts)
        self.vocab_size = int(len(present))
        self.lookup = np.zeros(256, dtype=np.int64)
        self.lookup[present] = np.arange(len(present))

    @classmethod
    def generated(cls) -> CharCorpus:
        return cls(generate_corpus(), source=f"generated (seeded play-like text, {SEED_CORPUS_BYTES} bytes)")

    @classmethod
    def from_file(cls, path: Path) -> CharCorpus:
        path = Path(path)
        if not path.is_file():
            what = "not a regular file" if path.exists() else "no such file"
            raise ConfigError(
                f"--data {path}: {what}; give a text file, or omit --data for the generated corpus"
            )
        if path.stat().st_size < 2:
            raise ConfigError(
                f"--data {path}: the file is empty; a corpus needs at least block size + 1 bytes"
            )
        return cls(np.memmap(path, dtype=np.uint8, mode="r"), source="file", path=path)

    def __len__(self) -> int:
        return len(self.data)


class RandomWindows:
    """The seed study's sampler: each epoch, ceil(N / (block + 1)) windows at random offsets, split over ranks."""

    def __init__(
        self,
        corpus: CharCorpus,
        block_size: int,
        batch_size: int,
        seed: int,
        max_steps: int | None = None,
        end: int | None = None,
    ) -> None:
        """``end``: where the training part of the corpus ends (the held-out split after it is never sampled);
        the whole corpus by default. An epoch stays ceil(N / (block + 1)) windows of the whole corpus (the seed
        study's definition, so epochs compare with earlier records)."""
        if len(corpus) < block_size + 2:
            raise ConfigError(
                f"corpus of {len(corpus)} bytes is shorter than block size + 1 ({block_size + 1}); "
                "use a smaller --block-size or a larger --data file"
            )
        self.corpus = corpus
        self.block_size = block_size
        self.batch_size = batch_size
        self.seed = seed
        self.max_steps = max_steps
        self.end = len(corpus) if end is None else end
        self.samples_per_epoch = math.ceil(len(corpus) / (block_size + 1))
        self._offsets = np.arange(block_size + 1, dtype=np.int64)

    def _rank_samples(self, rank: int, world_size: int) -> int:
        # like DistributedSampler: every rank gets ceil(N / world) samples
        return math.ceil(self.samples_per_epoch / world_size)

    def steps(self, rank: int = 0, world_size: int = 1) -> int:
        steps = math.ceil(self._rank_samples(rank, world_size) / self.batch_size)
        return min(steps, self.max_steps) if self.max_steps else steps

    def batches(
        self, epoch: int, rank: int = 0, world_size: int = 1
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        rng = np.random.default_rng([self.seed, epoch, rank])
        n = self._rank_samples(rank, world_size)
        starts = rng.integers(0, self.end - self.block_size - 1, size=n)
        lookup, data, offsets = self.corpus.lookup, self.corpus.data, self._offsets
        for step in range(self.steps(rank, world_size)):
            idx = starts[step * self.batch_size : (step + 1) * self.batch_size]
            windows = torch.from_numpy(lookup[data[idx[:, None] + offsets]])
            yield windows[:, :-1], windows[:, 1:]

    def to_device(self, device: torch.device, placement: str) -> DeviceWindows | None:
        """The same windows gathered on ``device`` from a device copy of the corpus, or None where ``placement``
        is ``auto`` and the corpus is larger than :data:`AUTO_DEVICE_BYTES`."""
        if placement == "auto" and len(self.corpus) > AUTO_DEVICE_BYTES:
            return None
        return DeviceWindows(self, device)

    def describe(self) -> dict[str, Any]:
        return {
            "placement": "host (windows gathered by numpy, copied to the device each step)",
            "source": self.corpus.source,
            "path": str(self.corpus.path) if self.corpus.path else None,
            "bytes": len(self.corpus),
            "vocab_size": self.corpus.vocab_size,
            "block_size": self.block_size,
            "samples_per_epoch": self.samples_per_epoch,
            "sampling": "random windows of block+1 bytes; epoch = ceil(bytes / (block + 1)) samples",
            "trained_on": f"bytes 0 to {self.end}"
            + (" (the rest is held out for validation)" if self.end < len(self.corpus) else ""),
            "steps_per_epoch_cap": self.max_steps,
        }


class DeviceWindows:
    """:class:`RandomWindows` with the corpus on the device: each step is one gather kernel, no host copy.

    Every epoch draws the same window offsets as the host sampler (the same numpy generator), uploads them once,
    and gathers token ids on the device, so the batches are identical to the host path's, bit for bit.
    """

    def __init__(self, windows: RandomWindows, device: torch.device) -> None:
        self.windows = windows
        self.device = device
        self.samples_per_epoch = windows.samples_per_epoch
        corpus = windows.corpus
        lookup = corpus.lookup.astype(np.uint8)  # byte -> token id; ids < 256 always
        tokens = torch.empty(len(corpus), dtype=torch.uint8, device=device)
        for start in range(
            0, len(corpus), _SCAN_CHUNK
        ):  # chunked: a memory-mapped corpus is never loaded whole
            chunk = lookup[corpus.data[start : start + _SCAN_CHUNK]]  # a new (writable) array
            tokens[start : start + len(chunk)] = torch.from_numpy(chunk).to(device)
        self.tokens = tokens
        self.offsets = torch.arange(windows.block_size + 1, device=device)

    def steps(self, rank: int = 0, world_size: int = 1) -> int:
        return self.windows.steps(rank, world_size)

    def batches(
        self, epoch: int, rank: int = 0, world_size: int = 1
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        w = self.windows
        rng = np.random.default_rng([w.seed, epoch, rank])
        starts = rng.integers(0, w.end - w.block_size - 1, size=w._rank_samples(rank, world_size))
        starts_on_device = torch.from_numpy(starts).to(self.device)
        for step in range(self.steps(rank, world_size)):
            idx = starts_on_device[step * w.batch_size : (step + 1) * w.batch_size]
            windows = self.tokens[idx[:, None] + self.offsets].long()
            yield windows[:, :-1], windows[:, 1:]

    def describe(self) -> dict[str, Any]:
        return {
            **self.windows.describe(),
            "placement": f"device (corpus copied to {self.device.type} once; windows gathered there)",
        }
