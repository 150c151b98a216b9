"""BERT masked-language-model pre-training (seed 004's language model): BERT-base and -large, and the smaller
sizes of Turc et al. (2019) for quick runs.

The encoder is our own, in the GPT workload's style (:mod:`accelbench.workloads.bert.model`): readable, fused
``scaled_dot_product_attention``, no dependency beyond torch and no download at run time. It is configuration-
compatible with Google's BERT (post-LayerNorm layers, learned positions up to 512, token types, GELU, an MLM head
with a transform and a decoder tied to the word embedding); next-sentence prediction is left out, as RoBERTa
showed it unnecessary (its head would add 2 x 768 weights).

Each sequence is a full window of ``--seq-len`` tokens ([CLS] text [SEP]; no padding, so no attention mask, as in
packed pre-training); ``round(mask_ratio x (seq_len - 2))`` positions are predicted, masked as BERT masks them
(80% [MASK], 10% a random token, 10% unchanged). The MLM head runs on those positions only, as NVIDIA's BERT does,
so the shapes stay static.

FLOPs per sequence: 6·N·s + 12·l·d·s² + 6·p·(d² + d·V): PaLM's 6N + 12·l·d·s per token over the s tokens (N = the
encoder layers' parameters), plus the MLM head's transform and decoder on the p predicted positions.

This module is what the plugin host and the command line see and imports no torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from accelbench.config import RunConfig
from accelbench.contract import RunOption, Scalar
from accelbench.errors import ConfigError
from accelbench.workloads import ModelUnits
from accelbench.workloads.dataoptions import check_data_options, data_label, data_options

if TYPE_CHECKING:
    from accelbench.workloads import TrainingJob

# layers, heads, hidden width (Devlin et al. 2019; the small sizes from Turc et al. 2019, "Well-Read Students")
MODEL_SIZES: dict[str, tuple[int, int, int]] = {
    "bert-base": (12, 12, 768),
    "bert-large": (24, 16, 1024),
    "bert-medium": (8, 8, 512),
    "bert-small": (4, 8, 512),
    "bert-mini": (4, 4, 256),
    "bert-tiny": (2, 2, 128),
}
MAX_POSITIONS = 512  # BERT's learned position embeddings
BERT_VOCAB = 30522  # BERT's uncased WordPiece vocabulary (the built-in tokenizer keeps its size)
SYNTHETIC_SEQUENCES = 1_000_000
FLOPS_FORMULA = (
    "6*N*s + 12*l*d*s^2 + 6*p*(d^2 + d*V) per sequence (PaLM's 6N + 12*l*d*s per token over s tokens, N = encoder "
    "layer parameters; the MLM head on the p predicted positions)"
)


def predicted_positions(seq_len: int, mask_ratio: float) -> int:
    """How many positions of a sequence are masked and predicted: the ratio of its text tokens, at least one."""
    return max(1, round(mask_ratio * (seq_len - 2)))


def vocab_size(config: RunConfig) -> int:
    """The vocabulary the model is built for: the tokenizer file's lines, or BERT's 30,522."""
    path = config.workload_options.get("tokenizer")
    if not path:
        return BERT_VOCAB
    try:
        with open(Path(str(path)), encoding="utf-8") as lines:
            return sum(1 for _ in lines)
    except OSError as exc:
        raise ConfigError(
            f"--tokenizer {path}: cannot read it ({exc.strerror or exc}); give a WordPiece vocab.txt"
        ) from None


class BertWorkload:
    """Registered by the core as workload ``bert``."""

    name = "bert"
    description = "BERT masked-language-model pre-training (our encoder, torch SDPA), synthetic or given text"

    def options(self) -> list[RunOption]:
        return [
            RunOption(name="seq_len", type="int", default=128, ge=8,
                      help=f"tokens per sequence, [CLS] and [SEP] included (at most {MAX_POSITIONS})",
                      workload=self.name),
            RunOption(name="mask_ratio", type="float", default=0.15, gt=0.0, lt=1.0,
                      help="share of a sequence's text tokens masked and predicted", workload=self.name),
            RunOption(name="dropout", type="float", default=0.1, ge=0.0, lt=1.0,
                      help="dropout of embeddings, attention and residuals", workload=self.name),
            RunOption(name="vocab_multiple", type="int", default=64, gt=0, le=65_536,
                      help="pad the embedding/head rows to a multiple of this for aligned matmuls; the padded "
                      "logits are dropped before the loss, so the model computes the same function (1 = no "
                      "padding)", workload=self.name),
            RunOption(name="tokenizer", type="str",
                      help="a WordPiece vocab.txt for --data text (default: the built-in tokenizer, words hashed "
                      f"into BERT's {BERT_VOCAB:,} ids)", workload=self.name),
            *data_options(self.name, f"{SYNTHETIC_SEQUENCES:,} sequences"),
        ]  # fmt: skip

    def model_names(self) -> list[str]:
        return list(MODEL_SIZES)

    def check(self, config: RunConfig) -> None:
        check_data_options(config)
        options = config.workload_options
        seq_len = int(options["seq_len"])
        if seq_len > MAX_POSITIONS:
            raise ConfigError(
                f"--seq-len {seq_len} is above {config.model}'s maximum of {MAX_POSITIONS} tokens (its learned "
                "position embeddings)"
            )
        predicted = predicted_positions(seq_len, float(options["mask_ratio"]))
        if predicted > seq_len - 2:
            raise ConfigError(f"--mask-ratio {options['mask_ratio']}: no text token would be left unmasked")
        if options.get("tokenizer") and config.data is None:
            raise ConfigError("--tokenizer tokenises --data text; synthetic sequences are token ids already")
        n_layer, n_head, n_embd = MODEL_SIZES[config.model]
        if n_embd % n_head:
            raise ConfigError(f"width {n_embd} is not divisible by heads {n_head}")
        vocab_size(config)  # a tokenizer file that cannot be read is refused now

    def identity(self, config: RunConfig) -> dict[str, Scalar]:
        options = config.workload_options
        return {
            "model": config.model,
            "seq_len": options["seq_len"],
            "mask_ratio": options["mask_ratio"],
            "dropout": options["dropout"],
            "vocab_size": vocab_size(config),
            "vocab_multiple": options["vocab_multiple"],
            "data_source": data_label(config),
            "data_workers": options.get("data_workers", "auto"),
        }

    def units(self, config: RunConfig) -> ModelUnits:
        n_layer, n_head, n_embd = MODEL_SIZES[config.model]
        return bert_units(n_layer, n_head, n_embd, int(config.workload_options.get("seq_len", 128)))

    def build(self, config: RunConfig) -> TrainingJob:
        from accelbench.workloads.bert.model import build_job

        return build_job(config, self.units(config))


# How tensor parallelism splits an encoder layer (Megatron's: q/k/v and the first feed-forward matmul by columns,
# the projections after them by rows; the post-attention and post-feed-forward LayerNorms on sequence shards)
BERT_TP_PLAN = (
    ("attn.qkv", "colwise:3"),
    ("attn.proj", "rowwise"),
    ("attn_norm", "norm"),
    ("mlp.fc", "colwise"),
    ("mlp.proj", "rowwise"),
    ("mlp_norm", "norm"),
)


def bert_units(
    n_layer: int, n_head: int | None = None, n_embd: int | None = None, seq_len: int | None = None
) -> ModelUnits:
    """BERT's parts: the embeddings, ``n_layer`` encoder layers (each splittable before its feed-forward half) and
    the MLM head, whose decoder is tied to the word embedding; with the sizes, how tensor parallelism splits a layer
    and what it must divide, and the methods a pipeline runs the stem, head and loss with."""
    return ModelUnits(
        stem=("embeddings",),
        units=tuple(f"layers.{i}" for i in range(n_layer)),
        head=("mlm_head",),
        split_points=tuple(f"layers.{i}.mlp" for i in range(n_layer)),
        tied=(("mlm_head.decoder.weight", "embeddings.word.weight"),),
        tp_plan=BERT_TP_PLAN,
        tp_divides=(("attention heads", n_head), ("width", n_embd)) if n_head and n_embd else (),
        sequence_length=seq_len,
        hidden_size=n_embd,
        stem_method="embed",
        head_method="head",
        loss_method="loss",
        checkpointable=True,
    )
