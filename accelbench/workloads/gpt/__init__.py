"""The GPT reference workload: a GPT-2 family model, trained character-level as in the seed study.

This module is what the plugin host and the command line see (options, sizes, identity, units) and imports no torch;
the model itself is in :mod:`accelbench.workloads.gpt.model`, imported when a run builds it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from accelbench.config import RunConfig
from accelbench.contract import RunOption, Scalar
from accelbench.errors import ConfigError
from accelbench.workloads import ModelUnits, TrainingJob

if TYPE_CHECKING:
    from accelbench.workloads.gpt.model import GPT, GPTConfig, configure_adamw

__all__ = ["FLOPS_FORMULA", "GPT", "MODEL_SIZES", "GPTConfig", "GPTWorkload", "configure_adamw", "gpt_units"]

# layers, heads, embedding (minGPT's table and the seed study's larger sizes and IPU sizes)
MODEL_SIZES: dict[str, tuple[int, int, int]] = {
    "gpt-nano": (3, 3, 48),
    "gpt-micro": (4, 4, 128),
    "gpt-mini": (6, 6, 192),
    "gopher-44m": (8, 16, 512),
    "gpt2": (12, 12, 768),
    "gpt2-medium": (24, 16, 1024),
    "gpt2-large": (36, 20, 1280),
    "gpt2-xl": (48, 25, 1600),
    "gpt2-xxl": (96, 25, 1600),
    "gpt2-xxxl": (100, 30, 1920),
    "gpt2-4xl": (190, 30, 1920),
    "ipu-384": (12, 12, 384),
    "ipu-768": (12, 12, 768),
}

# Bounds of a custom size, far above any model trained today (the largest published dense transformers have ~126
# layers, 128 heads, a width of 16,384 and contexts of ~10^6 tokens): a typo (--layers 99999999) is refused before
# anything is built, rather than building layers until the host runs out of memory.
MAX_LAYERS = 1024
MAX_HEADS = 1024
MAX_WIDTH = 65_536
MAX_BLOCK = 2**20
MAX_VOCAB_MULTIPLE = 65_536

FLOPS_FORMULA = "6N + 12*l*d*s per token (PaLM appendix B; N = parameters without position embeddings)"


def _option(
    name: str,
    type_: Literal["str", "int", "float", "bool"],
    default: Scalar | None,
    text: str,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
) -> RunOption:
    flag = {"n_layer": "layers", "n_head": "heads", "n_embd": "embd"}.get(name)
    return RunOption(
        name=name,
        flag=flag,
        type=type_,
        default=default,
        help=text,
        workload="gpt",
        gt=gt,
        ge=ge,
        lt=lt,
        le=le,
    )


OPTIONS = (
    _option(
        "n_layer", "int", None, "custom size: transformer layers (with --model custom)", gt=0, le=MAX_LAYERS
    ),
    _option("n_head", "int", None, "custom size: attention heads", gt=0, le=MAX_HEADS),
    _option("n_embd", "int", None, "custom size: embedding width", gt=0, le=MAX_WIDTH),
    _option("block_size", "int", 128, "context length in characters", gt=0, le=MAX_BLOCK),
    _option("dropout", "float", 0.1, "dropout of embeddings, attention and residuals", ge=0.0, lt=1.0),
    _option(
        "vocab_multiple",
        "int",
        64,
        "pad the embedding/head rows to a multiple of this for aligned matmuls; the padded logits are dropped "
        "before the loss, so the model computes the same function (1 = no padding)",
        gt=0,
        le=MAX_VOCAB_MULTIPLE,
    ),
)


def resolve_size(config: RunConfig) -> tuple[int, int, int]:
    """(layers, heads, width) of ``config``'s model: a named size from the table, or ``custom``'s options."""
    options = config.workload_options
    if config.model == "custom":
        return int(options["n_layer"]), int(options["n_head"]), int(options["n_embd"])
    if config.model not in MODEL_SIZES:
        raise ConfigError(
            f"unknown model {config.model!r}; choose one of: {', '.join(MODEL_SIZES)}, "
            "or --model custom --layers L --heads H --embd D"
        )
    return MODEL_SIZES[config.model]


class GPTWorkload:
    """Registered by the core as workload ``gpt``."""

    name = "gpt"
    description = "GPT-2 family, character-level, random windows (the seed study's lightning-GPT setup)"

    def options(self) -> list[RunOption]:
        return list(OPTIONS)

    def model_names(self) -> list[str]:
        return [*MODEL_SIZES, "custom"]

    def check(self, config: RunConfig) -> None:
        options = config.workload_options
        given = [options.get(n) is not None for n in ("n_layer", "n_head", "n_embd")]
        if config.model == "custom" and not all(given):
            raise ConfigError("model 'custom' needs all of --layers, --heads and --embd")
        if any(given) and config.model != "custom":
            raise ConfigError("--layers/--heads/--embd describe a custom size: use them with --model custom")
        n_layer, n_head, n_embd = resolve_size(config)
        if n_embd % n_head:
            raise ConfigError(f"embedding {n_embd} is not divisible by heads {n_head}")

    def parameters(self, config: RunConfig) -> int:
        """A lower bound of the parameters the model is built with, known without building it: the blocks'
        12*L*d^2 and embedding rows for one vocabulary multiple and the context (the corpus's characters, read
        when the data is built, pad to at least one multiple)."""
        n_layer, _, n_embd = resolve_size(config)
        options = config.workload_options
        return (
            12 * n_layer * n_embd**2 + (int(options["vocab_multiple"]) + int(options["block_size"])) * n_embd
        )

    def identity(self, config: RunConfig) -> dict[str, Scalar]:
        n_layer, n_head, n_embd = resolve_size(config)
        options = config.workload_options
        # a size name fixes the dimensions; a custom size is named by them
        label = f"custom {n_layer}L/{n_head}H/{n_embd}E" if config.model == "custom" else config.model
        return {
            "model": label,
            "block_size": options["block_size"],
            "dropout": options["dropout"],
            "vocab_multiple": options["vocab_multiple"],
        }

    def layers(self, config: RunConfig) -> int:
        """The model's transformer blocks, all of one shape."""
        return resolve_size(config)[0]

    def with_layers(self, config: RunConfig, layers: int) -> RunConfig:
        """``config``'s model with ``layers`` blocks, every other dimension and option its own (a custom size):
        what a trace of a deep model extrapolates from (:mod:`accelbench.estimate.operators`)."""
        _, n_head, n_embd = resolve_size(config)
        options = {**config.workload_options, "n_layer": layers, "n_head": n_head, "n_embd": n_embd}
        return config.model_copy(update={"model": "custom", "workload_options": options})

    def units(self, config: RunConfig) -> ModelUnits:
        n_layer, n_head, n_embd = resolve_size(config)
        return gpt_units(n_layer, n_head, n_embd, int(config.workload_options["block_size"]))

    def build(self, config: RunConfig) -> TrainingJob:
        import torch

        from accelbench.workloads.gpt.data import CharCorpus, RandomWindows
        from accelbench.workloads.gpt.model import GPT, GPTConfig, configure_adamw
        from accelbench.workloads.heldout import HeldOutWindows, held_out_start

        n_layer, n_head, n_embd = resolve_size(config)
        options = config.workload_options
        block_size = int(options["block_size"])
        corpus = CharCorpus.from_file(config.data) if config.data else CharCorpus.generated()
        held_out = held_out_start(len(corpus), block_size + 1)
        data = RandomWindows(
            corpus, block_size, config.batch_size, config.seed, config.steps_per_epoch, end=held_out
        )
        validation = (
            HeldOutWindows(
                lambda idx: corpus.lookup[corpus.data[idx]],
                held_out,
                len(corpus),
                block_size + 1,
                config.batch_size,
            )
            if held_out is not None
            else None
        )
        torch.manual_seed(config.seed)
        cfg = GPTConfig(
            n_layer,
            n_head,
            n_embd,
            block_size,
            corpus.vocab_size,
            float(options["dropout"]),
            int(options["vocab_multiple"]),
        )
        model = GPT(cfg)
        lr = config.learning_rate
        return TrainingJob(
            model=model,
            data=data,
            validation=validation,
            make_optimizer=lambda m, device, kernels: configure_adamw(m, kernels, lr),
            flops_per_sample=model.flops_per_token() * block_size,
            flops_formula=FLOPS_FORMULA,
            tokens_per_sample=block_size,
            units=gpt_units(n_layer, n_head, n_embd, block_size),
            grad_clip_norm=1.0,
            megatron_flops_per_sample=model.megatron_flops_per_sample(),
            summary={
                "name": config.model,
                "n_layer": n_layer,
                "n_head": n_head,
                "n_embd": n_embd,
                "block_size": block_size,
                "vocab_size": corpus.vocab_size,
                "vocab_padded_to": cfg.padded_vocab_size,
                "dropout": cfg.dropout,
                "parameters": model.num_parameters(),
                "flops_per_token": model.flops_per_token(),  # of the unpadded model: padding is not useful work
                "attention": "torch scaled_dot_product_attention (causal)",
                "tied_embedding_head": True,
            },
        )


# Megatron's split of a block: q/k/v and the MLP's first layer column-parallel (the fused qkv as three parts, so each
# rank holds whole heads of q, k and v), the projections after them row-parallel, the norms on sequence shards.
GPT_TP_PLAN = (
    ("ln_1", "norm"),
    ("attn.qkv", "colwise:3"),
    ("attn.proj", "rowwise"),
    ("ln_2", "norm"),
    ("mlp.fc", "colwise"),
    ("mlp.proj", "rowwise"),
)


def gpt_units(
    n_layer: int, n_head: int | None = None, n_embd: int | None = None, block_size: int | None = None
) -> ModelUnits:
    """The GPT's parts: embeddings, ``n_layer`` blocks (each splittable at its second LayerNorm), final norm and
    the head tied to the token embedding; with the sizes, how tensor parallelism splits a block and what it must
    divide, and the methods a pipeline runs the stem, head and loss with."""
    return ModelUnits(
        stem=("wte", "wpe", "drop"),
        units=tuple(f"blocks.{i}" for i in range(n_layer)),
        head=("ln_f", "lm_head"),
        split_points=tuple(f"blocks.{i}.ln_2" for i in range(n_layer)),
        tied=(("lm_head.weight", "wte.weight"),),
        tp_plan=GPT_TP_PLAN,
        tp_divides=(("attention heads", n_head), ("width", n_embd)) if n_head and n_embd else (),
        sequence_length=block_size,
        hidden_size=n_embd,
        stem_method="embed",
        head_method="head",
        loss_method="loss",
        checkpointable=True,
    )


def __getattr__(name: str) -> Any:
    """The model classes, imported (with torch) only when asked for."""
    if name in ("GPT", "GPTConfig", "configure_adamw"):
        from accelbench.workloads.gpt import model

        return getattr(model, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
