"""The Llama workload: a Llama-3-style decoder trained on real tokenized text.

The model is our own, in the GPT workload's nanoGPT style (:mod:`accelbench.workloads.llama.model`): RMSNorm,
rotary embeddings, SwiGLU, grouped-query attention through torch's fused ``scaled_dot_product_attention``, an output
head untied from the embedding. Sizes: ``llama-tiny``, ``-mini``, ``-small`` for CPUs and quick runs, and Llama 3's
published shapes ``llama3-8b``, ``llama3-70b``, ``llama3-405b`` (layers, width, heads, key/value heads, feed-forward
width, vocabulary 128,256, RoPE base 500,000; the 405B is Llama 3.1's), or ``custom`` (``--layers --heads --embd
--kv-heads --ffn-dim``).

Text: the corpus (the GPT workload's generated play-like text, or ``--data``) is tokenized by a byte-level BPE
trained offline on it and cached (:mod:`accelbench.workloads.llama.tokenizer`; never a download). The model's
vocabulary is ``--vocab-size``, by default the size's own: 128,256 for the published shapes (so a llama3-8b has its
published embedding and head, and costs what it costs), 8,192 for the small ones. The tokenizer is trained for the
same number of tokens and may stop short of it on a small corpus (the generated one gives about 9,400 ids): ids
are always below the model's vocabulary; the rows above the tokenizer's are never targets.

FLOPs, per token (training: forward and backward, 3 x the forward's 2 FLOPs per multiply-add)::

    6*N + 12*L*d*s

N = the parameters without the token embedding (a lookup; the untied output head is a matmul and counts; the norms'
weights are in it too, a rounding error), L layers, d = n_heads * head_dim = the width, s the sequence length.
The second term is attention's two matmuls (q·kᵀ and attention·v: 2 x 2*s*d forward per token per layer, x 3),
counted over the whole s x s score matrix, **not halved for the causal mask**, the convention of

- torchtitan (``get_num_flop_per_token``): ``6 * (params - embedding) + 12 * L * H * Q * T`` with H heads of
  size Q (H*Q = d) and T the sequence length: the same count ("we follow the convention and do not account for
  sparsity in causal attention");
- Megatron-LM's paper (Narayanan et al. 2021, appendix; seed 002's ``72*B*s*l*h^2*(1 + s/(6h) + V/(12hl))``),
  written for GQA (g kv heads of n) and SwiGLU: per token ``12*L*d^2*((1 + g/n + s/d) + 3/2 * ffn/d) + 6*d*V``,
  whose ``s/d`` term is the same ``12*L*d*s``, unhalved; it counts only matmul weights (no norms) and the head
  as ``6*d*V``. Recorded as ``megatron_flops_per_sample``;
- PaLM (appendix B) and the GPT workload here: ``6N + 12*l*d*s``, unhalved.

The halved form, ``6*N + 6*L*d*s``, is what current Megatron-LM code counts (``num_floating_point_operations`` in
``megatron/training/training.py`` has ``s/d/2``: "only half of the attention matrix is non-zero") and nearer the
work a causal kernel (flash attention) executes, as it skips the masked half; the summary records it too
(``flops_per_token_causal_halved``). Results use the unhalved one, comparable with torchtitan's, nanoGPT's and
the Megatron paper's MFU; an MFU from current Megatron-LM is lower by the attention term's half.

Units: tokens (``tokens_per_sample`` = ``seq_len``; a sample is one sequence).

This module is what the plugin host and the command line see (options, sizes, identity, units) and imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from accelbench.config import RunConfig
from accelbench.contract import RunOption, Scalar
from accelbench.errors import ConfigError
from accelbench.workloads import ModelUnits

if TYPE_CHECKING:
    from accelbench.workloads import TrainingJob

__all__ = ["FLOPS_FORMULA", "MODEL_SIZES", "LlamaShape", "LlamaWorkload", "llama_units"]

LLAMA3_VOCAB = 128_256
# bounds of a custom size, as the GPT's: far above any model in use, so a typo is refused before anything is built
MAX_LAYERS = 1024
MAX_HEADS = 1024
MAX_WIDTH = 65_536
LLAMA3_CONTEXT = 8_192  # Llama 3's pre-training context (3.1's 128K extension rescales RoPE: not modelled)
SMALL_VOCAB = 8_192
MIN_VOCAB = 258  # the byte-level BPE's 256 byte symbols and its 2 special tokens
MAX_VOCAB = 2**20


@dataclass(frozen=True)
class LlamaShape:
    """One named size: layers, width, query heads, key/value heads, feed-forward width, default vocabulary,
    longest sequence, RoPE base."""

    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    vocab_size: int
    max_seq_len: int
    rope_theta: float = 500_000.0

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def non_embedding_parameters(self, vocab_size: int) -> int:
        """N of the FLOPs formula: every parameter but the token embedding's (the model's count, analytically)."""
        kv = self.n_kv_heads * self.head_dim
        layer = 2 * self.dim * self.dim + 2 * self.dim * kv + 3 * self.dim * self.ffn_dim + 2 * self.dim
        return self.n_layers * layer + self.dim + self.dim * vocab_size

    def parameters(self, vocab_size: int) -> int:
        return self.non_embedding_parameters(vocab_size) + vocab_size * self.dim

    def flops_per_token(self, vocab_size: int, seq_len: int) -> float:
        """6N + 12*L*d*s: training FLOPs per token, causal attention counted whole (see the module docstring)."""
        return 6.0 * self.non_embedding_parameters(vocab_size) + 12.0 * self.n_layers * self.dim * seq_len

    def flops_per_token_causal_halved(self, vocab_size: int, seq_len: int) -> float:
        """6N + 6*L*d*s: the same with the causal mask's skipped half of the scores left out."""
        return 6.0 * self.non_embedding_parameters(vocab_size) + 6.0 * self.n_layers * self.dim * seq_len

    def megatron_flops_per_token(self, vocab_size: int, seq_len: int) -> float:
        """The Megatron-LM paper's count (Narayanan et al. 2021, appendix) for GQA and SwiGLU, per token: the
        form of Megatron-LM's ``num_floating_point_operations``, with its attention term unhalved as in the paper
        (current Megatron-LM code halves it)."""
        d, q = self.dim, self.n_heads * self.head_dim
        attention = (1 + self.n_kv_heads / self.n_heads + seq_len / d) * q / d
        mlp = self.ffn_dim / d * 3 / 2
        return 12.0 * self.n_layers * d * d * (attention + mlp) + 6.0 * d * vocab_size


# Llama 3 (Grattafiori et al. 2024, table 3; Meta's params.json) and small sizes of the same design for CPUs
MODEL_SIZES: dict[str, LlamaShape] = {
    "llama-tiny": LlamaShape(2, 64, 4, 2, 192, SMALL_VOCAB, 2_048),
    "llama-mini": LlamaShape(4, 256, 8, 4, 768, SMALL_VOCAB, 2_048),
    "llama-small": LlamaShape(8, 512, 8, 2, 1_536, SMALL_VOCAB, 4_096),
    "llama3-8b": LlamaShape(32, 4_096, 32, 8, 14_336, LLAMA3_VOCAB, LLAMA3_CONTEXT),
    "llama3-70b": LlamaShape(80, 8_192, 64, 8, 28_672, LLAMA3_VOCAB, LLAMA3_CONTEXT),
    "llama3-405b": LlamaShape(126, 16_384, 128, 8, 53_248, LLAMA3_VOCAB, LLAMA3_CONTEXT),
}

FLOPS_FORMULA = (
    "6N + 12*L*d*s per token (N = parameters without the token embedding, untied output head included; "
    "attention over the whole s x s scores, not halved for the causal mask, as torchtitan's 6N + 12*L*H*Q*T, the "
    "Megatron paper's and PaLM's; halved, as current Megatron-LM code counts: 6N + 6*L*d*s)"
)


def custom_shape_options(workload: str) -> tuple[RunOption, ...]:
    """A custom decoder size's --layers, --heads and --embd (the GPT's flags), declared for ``workload`` (llama and
    moe)."""
    return (
        RunOption(name="n_layer", flag="layers", type="int", gt=0, le=MAX_LAYERS,
                  help="custom size: transformer layers (with --model custom)", workload=workload),
        RunOption(name="n_head", flag="heads", type="int", gt=0, le=MAX_HEADS,
                  help="custom size: attention (query) heads", workload=workload),
        RunOption(name="n_embd", flag="embd", type="int", gt=0, le=MAX_WIDTH,
                  help="custom size: width", workload=workload),
    )  # fmt: skip


OPTIONS = (
    RunOption(name="seq_len", type="int", default=256, gt=1, le=LLAMA3_CONTEXT,
              help="tokens per sequence (at most the size's context: 2,048 for llama-tiny/-mini, 4,096 for "
              "llama-small, 8,192 for Llama 3)", workload="llama"),
    RunOption(name="vocab_size", type="int", ge=MIN_VOCAB, le=MAX_VOCAB,
              help="the model's vocabulary, and the tokens the byte-level BPE is trained for (default: the size's: "
              f"{LLAMA3_VOCAB:,} for llama3-*, {SMALL_VOCAB:,} for the small sizes)", workload="llama"),
    RunOption(name="rope_theta", type="float", gt=0.0,
              help="RoPE base (default: the size's, 500,000 as Llama 3)", workload="llama"),
    # a custom size (--model custom): the GPT's --layers/--heads/--embd, plus the key/value heads and feed-forward
    *custom_shape_options("llama"),
    RunOption(name="n_kv_heads", flag="kv-heads", type="int", gt=0, le=MAX_HEADS,
              help="custom size: key/value heads, each shared by heads / kv-heads query heads (default: --heads, "
              "plain multi-head attention)", workload="llama"),
    RunOption(name="ffn_dim", flag="ffn-dim", type="int", gt=0, le=4 * MAX_WIDTH,
              help="custom size: SwiGLU hidden width (default: 8/3 of the width, rounded up to a multiple of 64)",
              workload="llama"),
)  # fmt: skip
CUSTOM = ("n_layer", "n_head", "n_embd", "n_kv_heads", "ffn_dim")


def shape_of(config: RunConfig) -> LlamaShape:
    """``config``'s size: a named one, or ``custom``'s options (query heads must divide the width and key/value
    heads the query heads, checked by :meth:`LlamaWorkload.check`)."""
    if config.model == "custom":
        options = config.workload_options
        dim = int(options["n_embd"])
        heads = int(options["n_head"])
        kv = options.get("n_kv_heads")
        ffn = options.get("ffn_dim")
        return LlamaShape(
            n_layers=int(options["n_layer"]),
            dim=dim,
            n_heads=heads,
            n_kv_heads=int(kv) if kv is not None else heads,
            ffn_dim=int(ffn) if ffn is not None else -(-8 * dim // (3 * 64)) * 64,
            vocab_size=SMALL_VOCAB,
            max_seq_len=LLAMA3_CONTEXT,
        )
    if config.model not in MODEL_SIZES:
        raise ConfigError(f"unknown model {config.model!r}; choose one of: {', '.join(MODEL_SIZES)}, custom")
    return MODEL_SIZES[config.model]


def label(config: RunConfig, shape: LlamaShape) -> str:
    """How comparisons name the model: the size name, or a custom size by its dimensions."""
    if config.model != "custom":
        return config.model
    s = shape
    return f"custom {s.n_layers}L/{s.n_heads}H/{s.n_kv_heads}KV/{s.dim}E/{s.ffn_dim}F"


def resolved(config: RunConfig) -> tuple[LlamaShape, int, int, float]:
    """(shape, seq_len, vocab_size, rope_theta) of ``config``: the options given, else the size's own."""
    shape, options = shape_of(config), config.workload_options
    vocab = options.get("vocab_size")
    theta = options.get("rope_theta")
    return (
        shape,
        int(options.get("seq_len") or 256),
        int(vocab) if vocab is not None else shape.vocab_size,
        float(theta) if theta is not None else shape.rope_theta,
    )


class LlamaWorkload:
    """Registered by the core as workload ``llama``."""

    name = "llama"
    description = (
        "Llama-3-style decoder (RMSNorm, RoPE, SwiGLU, GQA), text tokenized by a cached byte-level BPE"
    )

    def options(self) -> list[RunOption]:
        return list(OPTIONS)

    def model_names(self) -> list[str]:
        return [*MODEL_SIZES, "custom"]

    def layers(self, config: RunConfig) -> int:
        """The model's decoder layers, all of one shape."""
        return shape_of(config).n_layers

    def with_layers(self, config: RunConfig, layers: int) -> RunConfig:
        """``config``'s model with ``layers`` layers, every other dimension and option its own (a custom size with
        the size's vocabulary and RoPE base): what a trace of a deep model extrapolates from
        (:mod:`accelbench.estimate.operators`)."""
        shape, seq_len, vocab, theta = resolved(config)
        options = {**config.workload_options, "n_layer": layers, "n_head": shape.n_heads, "n_embd": shape.dim,
                   "n_kv_heads": shape.n_kv_heads, "ffn_dim": shape.ffn_dim, "vocab_size": vocab,
                   "rope_theta": theta, "seq_len": seq_len}  # fmt: skip
        return config.model_copy(update={"model": "custom", "workload_options": options})

    def prepare(self, config: RunConfig) -> None:
        """Tokenize the run's text into the cache (trained once, then loaded), in the process that launches the
        workers, so that they load it rather than each train the same tokenizer at once."""
        from accelbench.workloads.llama.data import load_corpus

        load_corpus(config.data, resolved(config)[2])

    def parameters(self, config: RunConfig) -> int:
        """The parameters the model is built with, from its shape (without building it)."""
        shape, _, vocab, _ = resolved(config)
        return shape.parameters(vocab)

    def check(self, config: RunConfig) -> None:
        options = config.workload_options
        given = [n for n in CUSTOM if options.get(n) is not None]
        if config.model == "custom" and not all(options.get(n) is not None for n in CUSTOM[:3]):
            raise ConfigError("model 'custom' needs all of --layers, --heads and --embd (--kv-heads, --ffn-dim: "
                              "optional)")  # fmt: skip
        if given and config.model != "custom":
            raise ConfigError(
                "--layers/--heads/--embd/--kv-heads/--ffn-dim describe a custom size: use them with --model custom"
            )
        shape, seq_len, _, _ = resolved(config)
        if shape.dim % shape.n_heads:
            raise ConfigError(f"width {shape.dim} is not divisible by heads {shape.n_heads}")
        if shape.n_heads % shape.n_kv_heads:
            raise ConfigError(
                f"heads {shape.n_heads} are not divisible by key/value heads {shape.n_kv_heads}: each kv head "
                "serves a whole group of query heads"
            )
        if seq_len > shape.max_seq_len:
            raise ConfigError(
                f"--seq-len {seq_len} is above {config.model}'s context of {shape.max_seq_len:,} tokens"
            )
        if shape.head_dim % 2:
            raise ConfigError(f"rotary embeddings turn pairs: the head size {shape.head_dim} must be even")

    def check_run(self, config: RunConfig) -> None:
        """What training needs beyond the shapes an estimate builds: the tokenizer (``tokenizers``, the llama
        extra), refused before anything starts."""
        from accelbench.workloads.llama.tokenizer import require_tokenizers

        require_tokenizers()

    def identity(self, config: RunConfig) -> dict[str, Scalar]:
        shape, seq_len, vocab, theta = resolved(config)
        return {"model": label(config, shape), "seq_len": seq_len, "vocab_size": vocab, "rope_theta": theta}

    def units(self, config: RunConfig) -> ModelUnits:
        shape, seq_len, _, _ = resolved(config)
        return llama_units(shape, seq_len)

    def build(self, config: RunConfig) -> TrainingJob:
        import torch

        from accelbench.workloads import TrainingJob
        from accelbench.workloads.llama.data import token_sources
        from accelbench.workloads.llama.model import Llama, LlamaConfig, configure_adamw

        shape, seq_len, vocab, theta = resolved(config)
        corpus, data, validation = token_sources(
            config.data, vocab, seq_len, config.batch_size, config.seed, config.steps_per_epoch
        )
        torch.manual_seed(config.seed)
        cfg = LlamaConfig(
            shape.n_layers, shape.dim, shape.n_heads, shape.n_kv_heads, shape.ffn_dim, vocab, seq_len, theta
        )
        model = Llama(cfg)
        lr = config.learning_rate
        per_token = shape.flops_per_token(vocab, seq_len)
        summary: dict[str, Any] = {
            "name": config.model,
            # the keys the analytical model reads a transformer's shape from (accelbench.estimate.facts)
            "n_layer": shape.n_layers,
            "n_head": shape.n_heads,
            "n_embd": shape.dim,
            "seq_len": seq_len,
            "vocab_size": vocab,
            "n_kv_heads": shape.n_kv_heads,
            "ffn_dim": shape.ffn_dim,
            "head_dim": shape.head_dim,
            "rope_theta": theta,
            "tokenizer_vocab": corpus.vocab_size,
            "dropout": 0.0,
            "parameters": model.num_parameters(),
            "non_embedding_parameters": model.num_parameters(non_embedding=True),
            "flops_per_token": per_token,
            "flops_per_token_causal_halved": shape.flops_per_token_causal_halved(vocab, seq_len),
            "attention": "torch scaled_dot_product_attention (causal, grouped-query)",
            "tied_embedding_head": False,
        }
        return TrainingJob(
            model=model,
            data=data,
            validation=validation,
            make_optimizer=lambda m, device, kernels: configure_adamw(m, kernels, lr),
            flops_per_sample=per_token * seq_len,
            flops_formula=FLOPS_FORMULA,
            tokens_per_sample=seq_len,
            units=llama_units(shape, seq_len),
            grad_clip_norm=1.0,
            megatron_flops_per_sample=shape.megatron_flops_per_token(vocab, seq_len) * seq_len,
            summary=summary,
        )


# torchtitan's (and Megatron's) split of a block: wq/wk/wv and the feed-forward's w1/w3 column-parallel (each rank
# whole heads of q and of k/v, and a slice of the hidden width), wo and w2 row-parallel, the norms on sequence shards
LLAMA_TP_PLAN = (
    ("attention_norm", "norm"),
    ("attention.wq", "colwise"),
    ("attention.wk", "colwise"),
    ("attention.wv", "colwise"),
    ("attention.wo", "rowwise"),
    ("ffn_norm", "norm"),
    ("feed_forward.w1", "colwise"),
    ("feed_forward.w3", "colwise"),
    ("feed_forward.w2", "rowwise"),
)


def llama_units(shape: LlamaShape, seq_len: int | None = None) -> ModelUnits:
    """The Llama's parts: the token embedding, ``n_layers`` blocks (each splittable before its feed-forward half),
    the final norm and the untied head; how tensor parallelism splits a block and what it must divide (query heads,
    key/value heads, feed-forward width), and the methods a pipeline runs the stem, head and loss with."""
    n = shape.n_layers
    return ModelUnits(
        stem=("tok_embeddings",),
        units=tuple(f"layers.{i}" for i in range(n)),
        head=("norm", "output"),
        split_points=tuple(f"layers.{i}.ffn_norm" for i in range(n)),
        tp_plan=LLAMA_TP_PLAN,
        tp_divides=(
            ("attention heads", shape.n_heads),
            ("key/value heads", shape.n_kv_heads),
            ("feed-forward width", shape.ffn_dim),
        ),
        sequence_length=seq_len,
        hidden_size=shape.dim,
        stem_method="embed",
        head_method="head",
        loss_method="loss",
        checkpointable=True,
    )
