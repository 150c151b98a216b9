"""The Llama workload's tokenizer: a byte-level BPE trained offline on the run's corpus, and cached.

Llama 3's own tokenizer (tiktoken's 128,256-token BPE) is a download; this benchmark never downloads at run time.
Instead a byte-level BPE of the same kind (GPT-2/Llama-3 style: text split into bytes mapped to 256 printable
symbols, frequent pairs merged) is trained with Hugging Face's ``tokenizers`` package (the ``[llama]`` extra) on
the corpus the run reads: the generated play-like text the GPT workload trains on (``accelbench.workloads.gpt.data``),
or the ``--data`` file. Training asks for ``vocab_size`` tokens; a small corpus runs out of pairs to merge earlier
(the generated corpus stops near 9,400), so the trained vocabulary may be smaller than the model's, whose extra rows
are never targets (as a published vocabulary's rare tokens are not, in a given corpus).

Both the tokenizer (its ``tokenizer.json``) and the corpus tokenized with it (a ``.npy`` of uint32 ids) are cached
under ``$ACCELBENCH_CACHE_DIR/llama`` (default ``~/.cache/accelbench/llama``), keyed by the corpus's SHA-256, the
vocabulary asked for and :data:`FORMAT`; written atomically, so ranks that start on a cold cache together each
write a whole file. Later runs load both: nothing is retrained or re-encoded.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from accelbench.errors import ConfigError

FORMAT = 1  # bump when the training recipe changes: old cache entries are then ignored
SPECIAL_TOKENS = ("<|begin_of_text|>", "<|end_of_text|>")  # Llama 3's names; ids 0 and 1
TRAIN_BYTES = (
    64 * 2**20
)  # a larger --data file trains the tokenizer on its first 64 MiB (all of it is encoded)
_CHUNK_CHARS = 1 << 16  # text is trained and encoded in pieces of about this size, cut at line ends
CACHE_ENV = (
    "ACCELBENCH_CACHE_DIR"  # the same folder the measured peak is cached in (accelbench.estimate.peak)
)
INSTALL_HINT = (
    "the llama workload's tokenizer needs the `tokenizers` package: pip install 'accelbench[llama]'"
)


def require_tokenizers() -> None:
    """Refuse (ConfigError) before anything is built when the ``tokenizers`` package is missing."""
    if importlib.util.find_spec("tokenizers") is None:
        raise ConfigError(INSTALL_HINT)


def cache_dir() -> Path:
    """``$ACCELBENCH_CACHE_DIR/llama``, else ``~/.cache/accelbench/llama``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "accelbench") / "llama"


def pieces(text: str, size: int = _CHUNK_CHARS) -> list[str]:
    """``text`` in consecutive pieces of about ``size`` characters, each ending at a line end where there is one
    (so no word is cut in two); joined, they are ``text``."""
    out, start = [], 0
    while start < len(text):
        end = min(len(text), start + size)
        if end < len(text):
            cut = text.rfind("\n", start, end)
            end = cut + 1 if cut > start else end
        out.append(text[start:end])
        start = end
    return out


@dataclass
class TokenizedCorpus:
    """A corpus as token ids, with what made them."""

    tokens: np.ndarray  # uint32 ids, the whole corpus
    vocab_size: int  # the trained tokenizer's vocabulary (at most what was asked for)
    requested_vocab: int
    source: str
    path: Path | None
    text_bytes: int
    tokenizer_file: Path
    cached: bool  # tokenizer and tokens loaded from the cache (nothing trained or encoded this run)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "byte-level BPE (Hugging Face tokenizers), trained offline on this corpus",
            "vocab_size": self.vocab_size,
            "requested_vocab": self.requested_vocab,
            "special_tokens": list(SPECIAL_TOKENS),
            "file": str(self.tokenizer_file),
            "from_cache": self.cached,
            "bytes_per_token": round(self.text_bytes / max(1, len(self.tokens)), 3),
        }


def _write_atomically(path: Path, write: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def train(text: str, vocab_size: int) -> Any:
    """A byte-level BPE of at most ``vocab_size`` tokens (the specials first), trained on ``text``."""
    require_tokenizers()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte is a token: no text is unknown
        show_progress=False,
    )
    tokenizer.train_from_iterator(pieces(text[:TRAIN_BYTES]), trainer)
    return tokenizer


def encode(tokenizer: Any, text: str) -> np.ndarray:
    """``text`` as uint32 token ids (encoded in pieces cut at line ends, in parallel)."""
    encoded = tokenizer.encode_batch(pieces(text), add_special_tokens=False)
    return np.fromiter((i for e in encoded for i in e.ids), dtype=np.uint32)


def tokenized(
    text: str, vocab_size: int, source: str, path: Path | None = None, folder: Path | None = None
) -> TokenizedCorpus:
    """``text`` tokenized by the BPE trained on it for ``vocab_size``: from the cache, or trained, encoded and
    cached now."""
    require_tokenizers()
    from tokenizers import Tokenizer

    raw = text.encode("utf-8")
    digest = hashlib.sha256(raw).hexdigest()[:20]
    folder = folder or cache_dir()
    stem = f"bpe{FORMAT}-v{vocab_size}-{digest}"
    tokenizer_file, tokens_file = folder / f"{stem}.tokenizer.json", folder / f"{stem}.tokens.npy"
    cached = tokenizer_file.is_file() and tokens_file.is_file()
    tokenizer = None
    if tokenizer_file.is_file():
        try:
            tokenizer = Tokenizer.from_file(str(tokenizer_file))
        except Exception:  # a damaged cache entry: train again
            tokenizer, cached = None, False
    if tokenizer is None:
        tokenizer = train(text, vocab_size)
        _write_atomically(tokenizer_file, tokenizer.save)
    tokens: np.ndarray | None = None
    if cached:
        try:
            tokens = np.load(tokens_file)
        except (OSError, ValueError):
            tokens, cached = None, False
    if tokens is None:
        tokens = encode(tokenizer, text)

        def save(tmp: str, ids: np.ndarray = tokens) -> None:
            with open(tmp, "wb") as fh:
                np.save(fh, ids)

        _write_atomically(tokens_file, save)
    return TokenizedCorpus(
        tokens=tokens,
        vocab_size=int(tokenizer.get_vocab_size()),
        requested_vocab=vocab_size,
        source=source,
        path=path,
        text_bytes=len(raw),
        tokenizer_file=tokenizer_file,
        cached=cached,
    )
