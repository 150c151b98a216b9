"""The mixture-of-experts workload: a decoder whose feed-forwards are top-k routed SwiGLU experts, on the Llama
workload's text.

The model (:mod:`accelbench.workloads.moe.model`) is the Llama decoder (RMSNorm, rotary embeddings, grouped-query
attention) with each block's feed-forward a softmax router choosing ``top_k`` of ``n_experts`` SwiGLU experts (gates
renormalised over the chosen), an optional shared expert, and Switch's load-balancing loss (per sequence, as
DeepSeek-V3's) times ``--aux-loss-coef`` (default 0.01, Switch's and GShard's) added to the cross-entropy. The text and
tokenizer are the Llama workload's (:mod:`accelbench.workloads.llama.data`): the cached byte-level BPE, never a
download.

Sizes: ``moe-tiny`` and ``moe-mini`` for CPUs and quick runs, and two published shapes:

- ``mixtral-8x7b`` (Mistral's params.json): 32 layers, width 4,096, 32 heads, 8 key/value heads, 8 experts of
  14,336, top-2, vocabulary 32,000, RoPE base 10^6: 46.7B parameters, 12.9B active, as published;
- ``gpt-oss-20b`` (OpenAI's config.json): 24 layers, width 2,880, 64 heads of 64 (q width 4,096), 8 key/value heads,
  32 experts of 2,880, top-4, vocabulary 201,088, RoPE base 150,000: 20.9B parameters (published 20.9B), 4.2B active
  with both embedding matrices (OpenAI's 3.6B counts the unembedding only); its attention sinks, alternate
  sliding-window layers and biases are not modelled;
- ``deepseek-v3`` (DeepSeek-AI's config.json), with **multi-head latent attention** (MLA) in place of grouped-query
  attention: 61 layers, the first 3 dense (SwiGLU of 18,432), width 7,168, 128 heads, key/value latent 512, query
  latent 1,536, head widths 128 (no rotary) + 64 (rotary) for queries and keys and 128 for values; 256 experts of
  2,048, top-8 by sigmoid scores renormalised over the chosen, 1 shared; vocabulary 129,280, RoPE base 10,000,
  context 4,096 (its pretraining length): 671.0B parameters without its multi-token-prediction module (published
  671B), 37.6B active with both embedding matrices (36.6B without the input embedding, as published); balanced as
  DeepSeek-V3 is (``--balance both``, below); node-limited routing, the routed output's 2.5 scale and YaRN are not
  modelled;
- ``deepseek-tiny``: the same architecture for CPUs (3 layers, the first dense, width 64, 4 heads, 8 experts of 64
  top-2 plus a shared one).

Or ``custom``: the Llama workload's ``--layers --heads --embd`` (``--kv-heads``, ``--ffn-dim`` optional, ``--ffn-dim``
each expert's hidden width) and the experts' ``--experts`` (default 8), ``--top-k`` (default 2) and
``--shared-expert``/``--no-shared-expert`` (default off: one shared expert of the routed experts' width); vocabulary
8,192 and RoPE base 500,000 unless given, context 32,768. ``--attention-kind mla`` gives it multi-head latent attention
instead of grouped-query: ``--kv-lora-rank`` (default 4 x the head width ``--embd / --heads``), ``--q-lora-rank``
(0, the default: queries projected directly, as DeepSeek-V2-Lite), ``--qk-nope-head-dim`` (default: the head
width), ``--qk-rope-head-dim`` (even; default: half the head width) and ``--v-head-dim`` (default: the head width),
DeepSeek-V3's proportions. Comparisons name it by its dimensions (``custom 2L/4H/2KV/64E/128F/8x top-2 +shared``, or with
``MLA kv64 q0 qk16+8 v16`` in place of ``2KV``).

Load balancing (``--balance``): ``aux-loss`` (the balance loss alone, the default but for the deepseek sizes), ``bias``
(DeepSeek-V3's auxiliary-loss-free balancing, arXiv 2412.19437 section 2.1.2: a per-expert bias on the router's
affinity scores for the top-k choice only, the gates unbiased, moved by ``-gamma * sign(load - mean load)`` after each
optimizer step; ``--bias-update-speed`` gamma, default 0.001, DeepSeek-V3's) or ``both`` (the biases and the loss at
``--aux-loss-coef``, default 0.0001: DeepSeek-V3's, and the deepseek sizes' default). The loads are summed over every
rank before the sign, so every rank keeps the same biases. The identity records ``balance`` and
``bias_update_speed`` where biases ran; the summary ``balance`` and the final ``expert_bias_by_layer``.

FLOPs per token count the **active** parameters (what one token is multiplied by), training = 3 x forward::

    6*N_active + 12*L*q*s             (grouped-query attention)
    6*N_active + 6*L*s*h*(qk + v)     (MLA: qk = qk_nope_head_dim + qk_rope_head_dim, v = v_head_dim)

N_active = the attention weights, the router, ``top_k`` routed experts, the shared expert, the norms, the final norm
and the untied head (not the token embedding, a lookup); q = heads x head width, L layers, s the sequence length: the
attention term unhalved for the causal mask, as the Llama workload's (torchtitan's convention). The summary records
the total and active parameter counts (``parameters``, ``active_parameters``) and the routing balance measured.

Routing balance: the tokens each expert was sent, summed over the timed steps of every rank (each rank counts what
its router chose), per layer and over all layers, and the imbalance max/mean (1 = perfectly even; with expert
parallelism the busiest expert's rank sets the step's time).

Experts kernel: ``--experts-kernel`` ``grouped`` (``torch._grouped_mm`` over all experts, torchtitan's), ``loop``
(one SwiGLU per expert) or ``auto`` (default: grouped where the op runs, CUDA sm90+ in bf16 or a CPU, else the loop;
:func:`accelbench.workloads.moe.model.grouped_mm_support`). The record's ``experts_kernel`` says which ran.

Expert parallelism: ``--mesh ep=N`` (with a data axis: ``--mesh ddp=D,ep=N``) shards the experts over N ranks
(:mod:`accelbench.engine.parallel.ep`); ``--mesh pp=P,ep=N`` shards them inside each pipeline stage
(:mod:`accelbench.engine.parallel.executor`). Tensor parallelism (a tp axis) splits attention over its heads, the shared
expert and dense blocks column/row-parallel and every routed expert over its hidden width, the router whole
(:func:`moe_tp_plan`); pipeline parallelism (a pp axis) cuts stages between blocks, each block adding its balance
loss's gradient in backward itself (:meth:`accelbench.workloads.moe.model.MoE.add_balance_loss_in_backward`), and every
rank moving every layer's expert biases, its stages' or not. Units:
tokens (``tokens_per_sample`` = ``seq_len``).

This module is what the plugin host and the command line see and imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from accelbench.config import RunConfig
from accelbench.contract import RunOption, Scalar
from accelbench.errors import ConfigError
from accelbench.workloads import ModelUnits
from accelbench.workloads.llama import (
    MAX_HEADS,
    MAX_WIDTH,
    MIN_VOCAB,
    SMALL_VOCAB,
    custom_shape_options,
)

if TYPE_CHECKING:
    from accelbench.workloads import TrainingJob

__all__ = ["FLOPS_FORMULA", "MLA_FLOPS_FORMULA", "MODEL_SIZES", "MoEShape", "MoEWorkload", "routing_balance"]

MAX_VOCAB = 2**20
MAX_EXPERTS = 1024  # far above any published mixture (DeepSeek-V3 routes over 256), so a typo is refused
CUSTOM_CONTEXT = 32_768  # the longest --seq-len the workload takes
CUSTOM_ROPE_THETA = 500_000.0
BALANCES = ("aux-loss", "bias", "both")  # accelbench.workloads.moe.model.BALANCES, without importing torch
BIAS_UPDATE_SPEED = 0.001  # DeepSeek-V3's gamma for all but its last 500B tokens
AUX_LOSS_COEF = {
    "aux-loss": 0.01,
    "bias": 0.0,
    "both": 0.0001,
}  # Switch's and GShard's; none; DeepSeek-V3's alpha


@dataclass(frozen=True)
class MoEShape:
    """One named size: the Llama's shape (``ffn_dim`` is each expert's hidden width) plus the experts', and for
    DeepSeek-V3's shape its latent attention (``kv_lora_rank`` > 0), sigmoid router and dense first blocks (the
    fields of :class:`accelbench.workloads.moe.model.MoEConfig` of the same names)."""

    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    n_experts: int
    top_k: int
    shared_experts: int
    vocab_size: int
    max_seq_len: int
    rope_theta: float
    head_dim: int = 0  # 0: dim // n_heads
    kv_lora_rank: int = 0  # > 0: multi-head latent attention (n_kv_heads and head_dim unused)
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    router_scores: str = "softmax"
    first_k_dense: int = 0
    dense_ffn_dim: int = 0

    @property
    def attention_head_dim(self) -> int:
        return self.head_dim or self.dim // self.n_heads

    @property
    def latent_attention(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def attention_kind(self) -> str:
        return "MLA" if self.latent_attention else "GQA"

    @property
    def qk_head_dim(self) -> int:
        """Each head's query/key width: what the scores are a dot product over."""
        return (
            self.qk_nope_head_dim + self.qk_rope_head_dim
            if self.latent_attention
            else self.attention_head_dim
        )

    @property
    def value_head_dim(self) -> int:
        return self.v_head_dim if self.latent_attention else self.attention_head_dim

    @property
    def moe_layers(self) -> int:
        """The blocks with routed experts (the first ``first_k_dense`` are dense)."""
        return self.n_layers - self.first_k_dense

    def attention_parameters(self) -> int:
        """One block's attention. Grouped-query: ``2 d q + 2 d kv`` (q = heads x head width, kv = key/value heads x
        head width). Latent (MLA), with h heads, r_q = q_lora_rank, r_kv = kv_lora_rank and the head widths
        nope, rope, v: queries ``d r_q + r_q + r_q h (nope + rope)`` (a norm between two projections; ``d h (nope +
        rope)`` without a query latent), keys and values ``d (r_kv + rope) + r_kv + r_kv h (nope + v)``, output
        ``h v d``."""
        d, h = self.dim, self.n_heads
        if not self.latent_attention:
            q = h * self.attention_head_dim
            kv = self.n_kv_heads * self.attention_head_dim
            return 2 * d * q + 2 * d * kv
        qk, r_q, r_kv = self.qk_head_dim, self.q_lora_rank, self.kv_lora_rank
        query = d * r_q + r_q + r_q * h * qk if r_q else d * h * qk
        key_value = (
            d * (r_kv + self.qk_rope_head_dim) + r_kv + r_kv * h * (self.qk_nope_head_dim + self.v_head_dim)
        )
        return query + key_value + h * self.v_head_dim * d

    def _layer(self, experts: int) -> int:
        """A block with routed experts, ``experts`` of them counted: attention, router, experts, shared expert,
        two norms."""
        expert = 3 * self.dim * self.ffn_dim
        return (
            self.attention_parameters()
            + self.dim * self.n_experts
            + (experts + self.shared_experts) * expert
            + 2 * self.dim
        )

    def _dense_layer(self) -> int:
        """One of the first ``first_k_dense`` blocks: attention, a SwiGLU of ``dense_ffn_dim``, two norms."""
        return self.attention_parameters() + 3 * self.dim * self.dense_ffn_dim + 2 * self.dim

    def _layers(self, experts: int) -> int:
        return self.first_k_dense * self._dense_layer() + self.moe_layers * self._layer(experts)

    def parameters(self, vocab_size: int) -> int:
        """Every parameter, all experts included (what memory holds)."""
        return self._layers(self.n_experts) + self.dim + 2 * vocab_size * self.dim

    def expert_parameters(self) -> int:
        """The routed experts' parameters, all layers (what expert parallelism shards)."""
        return self.moe_layers * self.n_experts * 3 * self.dim * self.ffn_dim

    def active_parameters(self, vocab_size: int) -> int:
        """The parameters one token is computed with: top-k experts of each layer, the embedding row included."""
        return self._layers(self.top_k) + self.dim + 2 * vocab_size * self.dim

    def active_non_embedding_parameters(self, vocab_size: int) -> int:
        """N_active of the FLOPs formula: the active parameters without the token embedding (a lookup)."""
        return self.active_parameters(vocab_size) - vocab_size * self.dim

    def flops_per_token(self, vocab_size: int, seq_len: int) -> float:
        """6*N_active + 6*L*s*h*(qk + v): training FLOPs per token, causal attention counted whole (the scores
        ``q k^T`` over qk = the query/key head width, their product with the values over v = the value head width;
        for grouped-query attention qk = v = the head width, so ``12*L*q*s``)."""
        attention = 6.0 * self.n_layers * seq_len * self.n_heads * (self.qk_head_dim + self.value_head_dim)
        return 6.0 * self.active_non_embedding_parameters(vocab_size) + attention


MODEL_SIZES: dict[str, MoEShape] = {
    "moe-tiny": MoEShape(2, 64, 4, 2, 128, 4, 2, 1, SMALL_VOCAB, 2_048, 500_000.0),
    "moe-mini": MoEShape(4, 256, 8, 4, 512, 8, 2, 1, SMALL_VOCAB, 2_048, 500_000.0),
    # Mistral AI's Mixtral 8x7B (params.json)
    "mixtral-8x7b": MoEShape(32, 4_096, 32, 8, 14_336, 8, 2, 0, 32_000, 32_768, 1_000_000.0),
    # OpenAI's gpt-oss-20b (config.json): 64 heads of 64 on a width of 2,880
    "gpt-oss-20b": MoEShape(24, 2_880, 64, 8, 2_880, 32, 4, 0, 201_088, 4_096, 150_000.0, head_dim=64),
    # DeepSeek-V3 in miniature for CPUs: latent attention, sigmoid routing, 1 shared + 8 routed experts top-2, the
    # first block dense
    "deepseek-tiny": MoEShape(
        n_layers=3,
        dim=64,
        n_heads=4,
        n_kv_heads=4,
        ffn_dim=64,
        n_experts=8,
        top_k=2,
        shared_experts=1,
        vocab_size=SMALL_VOCAB,
        max_seq_len=2_048,
        rope_theta=10_000.0,
        kv_lora_rank=32,
        q_lora_rank=48,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        router_scores="sigmoid",
        first_k_dense=1,
        dense_ffn_dim=192,
    ),
    # DeepSeek-AI's DeepSeek-V3 (config.json), without its multi-token-prediction module; context: its 4,096-token
    # pretraining length (163,840 after YaRN, not modelled)
    "deepseek-v3": MoEShape(
        n_layers=61,
        dim=7_168,
        n_heads=128,
        n_kv_heads=128,
        ffn_dim=2_048,  # moe_intermediate_size
        n_experts=256,  # n_routed_experts
        top_k=8,  # num_experts_per_tok
        shared_experts=1,  # n_shared_experts
        vocab_size=129_280,
        max_seq_len=4_096,
        rope_theta=10_000.0,
        kv_lora_rank=512,
        q_lora_rank=1_536,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        router_scores="sigmoid",  # scoring_func
        first_k_dense=3,  # first_k_dense_replace
        dense_ffn_dim=18_432,  # intermediate_size
    ),
}

MLA_FLOPS_FORMULA = (
    "6*N_active + 6*L*s*h*(qk + v) per token, multi-head latent attention (N_active = parameters one token is "
    "computed with, without the token embedding: latent attention, router, top-k routed experts, shared expert, "
    "dense first blocks, norms, untied head; h heads, qk = qk_nope_head_dim + qk_rope_head_dim, v = v_head_dim; "
    "attention over the whole s x s scores, not halved for the causal mask)"
)
FLOPS_FORMULA = (
    "6*N_active + 12*L*q*s per token (N_active = parameters one token is computed with, without the token "
    "embedding: attention, router, top-k routed experts, shared expert, norms, untied head; q = heads x head "
    "width; attention over the whole s x s scores, not halved for the causal mask, as the llama workload's)"
)

OPTIONS = (
    RunOption(name="seq_len", type="int", default=256, gt=1, le=32_768,
              help="tokens per sequence (at most the size's context: 2,048 for moe-tiny/-mini and deepseek-tiny, "
              "4,096 for gpt-oss-20b and deepseek-v3, 32,768 for mixtral-8x7b)", workload="moe"),
    RunOption(name="vocab_size", type="int", ge=MIN_VOCAB, le=MAX_VOCAB,
              help="the model's vocabulary, and the tokens the byte-level BPE is trained for (default: the size's)",
              workload="moe"),
    RunOption(name="aux_loss_coef", type="float", ge=0.0, le=1.0,
              help="weight of the load-balancing loss (Switch's E * sum f_i P_i per sequence) added to the "
              "cross-entropy; 0 turns it off (default 0.01, Switch's and GShard's, with --balance aux-loss; "
              "0.0001, DeepSeek-V3's, with --balance both)", workload="moe"),
    RunOption(name="balance", type="str", choices=BALANCES,
              help="how the experts' load is balanced: aux-loss (the balance loss at --aux-loss-coef), bias "
              "(DeepSeek-V3's auxiliary-loss-free per-expert score biases) or both (the biases and the loss; "
              "default for deepseek-v3 and deepseek-tiny, aux-loss for the others)", workload="moe"),
    RunOption(name="bias_update_speed", flag="bias-update-speed", type="float", gt=0.0, le=1.0,
              help="with --balance bias or both: how far each expert bias moves per step, toward balance "
              f"(default {BIAS_UPDATE_SPEED}, DeepSeek-V3's gamma)", workload="moe"),
    RunOption(name="experts_kernel", flag="experts-kernel", type="str", default="auto",
              choices=("auto", "grouped", "loop"),
              help="how the routed experts run: grouped (torch._grouped_mm over all experts at once, as torchtitan; "
              "CUDA sm90+ in bf16, or CPU, widths a multiple of 16 bytes), loop (one SwiGLU per expert), or auto "
              "(grouped where it can run, else the loop; default)", workload="moe"),
    # a custom size (--model custom): the Llama's shape options, each expert's width, and the experts'
    *custom_shape_options("moe"),
    RunOption(name="n_kv_heads", flag="kv-heads", type="int", gt=0, le=MAX_HEADS,
              help="custom size: key/value heads (default: --heads)", workload="moe"),
    RunOption(name="ffn_dim", flag="ffn-dim", type="int", gt=0, le=4 * MAX_WIDTH,
              help="custom size: each expert's SwiGLU hidden width (default: 8/3 of the width, rounded up to a "
              "multiple of 64)", workload="moe"),
    RunOption(name="n_experts", flag="experts", type="int", ge=2, le=MAX_EXPERTS,
              help="custom size: routed experts per layer (default 8)", workload="moe"),
    RunOption(name="top_k", flag="top-k", type="int", gt=0, le=MAX_EXPERTS,
              help="custom size: experts each token is routed to, at most --experts (default 2)", workload="moe"),
    RunOption(name="shared_expert", flag="shared-expert", type="bool",
              help="custom size: a shared expert every token passes, as wide as a routed one (default: off)",
              workload="moe"),
    # a custom size's multi-head latent attention (--attention-kind mla), DeepSeek-V2/V3's
    RunOption(name="attention_kind", flag="attention-kind", type="str", choices=("gqa", "mla"),
              help="custom size: grouped-query attention (gqa, default) or DeepSeek's multi-head latent attention "
              "(mla, shaped by --kv-lora-rank, --q-lora-rank and the head widths)", workload="moe"),
    RunOption(name="kv_lora_rank", flag="kv-lora-rank", type="int", gt=0, le=MAX_WIDTH,
              help="custom size, mla: the key/value latent's width (default: 4 x the head width --embd / --heads, "
              "DeepSeek-V3's 512 for heads of 128)", workload="moe"),
    RunOption(name="q_lora_rank", flag="q-lora-rank", type="int", ge=0, le=MAX_WIDTH,
              help="custom size, mla: the query latent's width; 0 projects queries directly, as DeepSeek-V2-Lite "
              "(default 0)", workload="moe"),
    RunOption(name="qk_nope_head_dim", flag="qk-nope-head-dim", type="int", gt=0, le=MAX_WIDTH,
              help="custom size, mla: each head's query/key width without rotary embedding (default: the head "
              "width --embd / --heads)", workload="moe"),
    RunOption(name="qk_rope_head_dim", flag="qk-rope-head-dim", type="int", gt=0, le=MAX_WIDTH,
              help="custom size, mla: each head's rotary query/key width, even (default: half the head width)",
              workload="moe"),
    RunOption(name="v_head_dim", flag="v-head-dim", type="int", gt=0, le=MAX_WIDTH,
              help="custom size, mla: each head's value width (default: the head width)", workload="moe"),
)  # fmt: skip
MLA_OPTIONS = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
CUSTOM = (
    "n_layer", "n_head", "n_embd", "n_kv_heads", "ffn_dim", "n_experts", "top_k", "shared_expert", "attention_kind",
    *MLA_OPTIONS,
)  # fmt: skip


def shape_of(config: RunConfig) -> MoEShape:
    """``config``'s size: a named one, or ``custom``'s options (checked by :meth:`MoEWorkload.check`)."""
    if config.model == "custom":
        options = config.workload_options
        dim, heads = int(options["n_embd"]), int(options["n_head"])
        kv, ffn = options.get("n_kv_heads"), options.get("ffn_dim")
        experts, top_k = options.get("n_experts"), options.get("top_k")
        mla = latent_attention_of(options, dim, heads) if options.get("attention_kind") == "mla" else {}
        return MoEShape(
            n_layers=int(options["n_layer"]),
            dim=dim,
            n_heads=heads,
            n_kv_heads=int(kv) if kv is not None and not mla else heads,
            ffn_dim=int(ffn) if ffn is not None else -(-8 * dim // (3 * 64)) * 64,
            n_experts=int(experts) if experts is not None else 8,
            top_k=int(top_k) if top_k is not None else 2,
            shared_experts=1 if options.get("shared_expert") else 0,
            vocab_size=SMALL_VOCAB,
            max_seq_len=CUSTOM_CONTEXT,
            rope_theta=CUSTOM_ROPE_THETA,
            kv_lora_rank=mla.get("kv_lora_rank", 0),
            q_lora_rank=mla.get("q_lora_rank", 0),
            qk_nope_head_dim=mla.get("qk_nope_head_dim", 0),
            qk_rope_head_dim=mla.get("qk_rope_head_dim", 0),
            v_head_dim=mla.get("v_head_dim", 0),
        )
    if config.model not in MODEL_SIZES:
        raise ConfigError(f"unknown model {config.model!r}; choose one of: {', '.join(MODEL_SIZES)}, custom")
    return MODEL_SIZES[config.model]


def latent_attention_of(options: dict[str, Any], dim: int, heads: int) -> dict[str, int]:
    """A custom size's latent attention (``--attention-kind mla``): the widths given, else DeepSeek-V3's in proportion
    to the head width ``dim // heads`` (its 128-wide heads: latent 512, no-rope 128, rope 64, values 128), and no
    query latent (DeepSeek-V2-Lite's). Checked by :func:`check_custom`."""
    head = dim // heads

    def given(name: str, default: int) -> int:
        value = options.get(name)
        return int(value) if value is not None else default

    return {
        "kv_lora_rank": given("kv_lora_rank", 4 * head),
        "q_lora_rank": given("q_lora_rank", 0),
        "qk_nope_head_dim": given("qk_nope_head_dim", head),
        "qk_rope_head_dim": given("qk_rope_head_dim", head // 2),
        "v_head_dim": given("v_head_dim", head),
    }


def label(config: RunConfig, shape: MoEShape) -> str:
    """How comparisons and the record name the model: the size name, or a custom size by its dimensions."""
    if config.model != "custom":
        return config.model
    s = shape
    shared = " +shared" if s.shared_experts else ""
    attention = (
        f"MLA kv{s.kv_lora_rank} q{s.q_lora_rank} qk{s.qk_nope_head_dim}+{s.qk_rope_head_dim} v{s.v_head_dim}"
        if s.latent_attention
        else f"{s.n_kv_heads}KV"
    )
    return (
        f"custom {s.n_layers}L/{s.n_heads}H/{attention}/{s.dim}E/{s.ffn_dim}F/{s.n_experts}x top-{s.top_k}"
        f"{shared}"
    )


def check_custom(config: RunConfig) -> None:
    """Refuse custom-size options without ``--model custom``, a custom size missing its shape, and a shape the
    model cannot be built with, each saying what would work."""
    options = config.workload_options
    given = [name for name in CUSTOM if options.get(name) is not None]
    if config.model != "custom":
        if given:
            raise ConfigError(
                f"{', '.join(_flags(given))} describe a custom size: use them with --model custom"
            )
        return
    missing = [name for name in CUSTOM[:3] if options.get(name) is None]
    if missing:
        raise ConfigError(
            f"model 'custom' needs all of --layers, --heads and --embd (missing {', '.join(_flags(missing))}; "
            "--kv-heads, --ffn-dim, --experts, --top-k, --shared-expert, --attention-kind: optional)"
        )
    if options.get("attention_kind") == "mla":
        check_latent_attention(options)
    else:
        mla = [name for name in MLA_OPTIONS if options.get(name) is not None]
        if mla:
            raise ConfigError(
                f"{', '.join(_flags(mla))} shape multi-head latent attention: add --attention-kind mla, or leave them "
                "out for grouped-query attention"
            )
    s = shape_of(config)
    if s.top_k > s.n_experts:
        raise ConfigError(
            f"--top-k {s.top_k} is more than the {s.n_experts} experts a token can be routed to: use --top-k "
            f"1 to {s.n_experts}, or more --experts"
        )
    if s.latent_attention:
        return  # checked by check_latent_attention: the head widths are their own, not --embd / --heads
    if s.dim % s.n_heads:
        raise ConfigError(
            f"width {s.dim} is not divisible by heads {s.n_heads}: use --heads that divides --embd"
        )
    if s.n_heads % s.n_kv_heads:
        raise ConfigError(
            f"heads {s.n_heads} are not divisible by key/value heads {s.n_kv_heads}: each kv head serves a "
            "whole group of query heads; use --kv-heads that divides --heads"
        )
    if s.attention_head_dim % 2:
        raise ConfigError(
            f"rotary embeddings turn pairs: the head size {s.attention_head_dim} (--embd / --heads) must be even"
        )


def check_latent_attention(options: dict[str, Any]) -> None:
    """Refuse a custom latent attention the model cannot be built with: --kv-heads (latent attention has no
    key/value heads), head widths defaulted from a head width --embd / --heads that is not whole or too narrow, an
    odd rotary width."""
    if options.get("n_kv_heads") is not None:
        raise ConfigError(
            "--kv-heads is grouped-query attention's: multi-head latent attention expands every head's keys and "
            "values from one --kv-lora-rank latent; leave --kv-heads out with --attention-kind mla"
        )
    dim, heads = int(options["n_embd"]), int(options["n_head"])
    defaulted = [name for name in ("kv_lora_rank", *MLA_OPTIONS[2:]) if options.get(name) is None]
    if defaulted and (dim % heads or dim // heads < 2):
        raise ConfigError(
            f"{', '.join(_flags(defaulted))} default from the head width --embd / --heads, and {dim} / {heads} is "
            "not a whole number of 2 or more: give them, or --heads that divides --embd"
        )
    rope = latent_attention_of(options, dim, heads)["qk_rope_head_dim"]
    if rope % 2:
        given = options.get("qk_rope_head_dim") is not None
        raise ConfigError(
            f"rotary embeddings turn pairs: the rotary head width {rope} "
            + ("(--qk-rope-head-dim)" if given else "(half the head width --embd / --heads)")
            + " must be even; give an even --qk-rope-head-dim"
        )


def _flags(names: list[str]) -> list[str]:
    by_name = {option.name: option.cli_flag for option in OPTIONS}
    return [f"--{by_name[name]}" for name in names]


def resolved(config: RunConfig) -> tuple[MoEShape, int, int, float]:
    """(shape, seq_len, vocab_size, aux_loss_coef) of ``config``: the options given, else the size's own."""
    shape, options = shape_of(config), config.workload_options
    vocab = options.get("vocab_size")
    coef = options.get("aux_loss_coef")
    return (
        shape,
        int(options.get("seq_len") or 256),
        int(vocab) if vocab is not None else shape.vocab_size,
        float(coef) if coef is not None else AUX_LOSS_COEF[balance_of(config)],
    )


def balance_of(config: RunConfig) -> str:
    """``--balance``: given, else the size's own: DeepSeek-V3's (both, the biases and a tiny sequence-wise loss)
    for the sigmoid-routed sizes, the balance loss alone for the others."""
    given = config.workload_options.get("balance")
    if given is not None:
        return str(given)
    return (
        "both"
        if config.model in MODEL_SIZES and MODEL_SIZES[config.model].router_scores == "sigmoid"
        else "aux-loss"
    )


def bias_update_speed_of(config: RunConfig) -> float:
    """``--bias-update-speed``: given, else DeepSeek-V3's 0.001."""
    speed = config.workload_options.get("bias_update_speed")
    return float(speed) if speed is not None else BIAS_UPDATE_SPEED


def check_balance(config: RunConfig) -> None:
    """Refuse balancing options that contradict each other, saying which would do what was asked."""
    options, balance = config.workload_options, balance_of(config)
    coef, speed = options.get("aux_loss_coef"), options.get("bias_update_speed")
    if balance == "aux-loss" and speed is not None:
        raise ConfigError(
            "--bias-update-speed moves the per-expert biases of --balance bias or both; with --balance aux-loss "
            "there are none: add --balance bias (or both), or leave --bias-update-speed out"
        )
    if balance == "bias" and coef:
        raise ConfigError(
            f"--balance bias balances by the expert biases alone: --aux-loss-coef {coef} would add the balance "
            "loss too; use --balance both for the biases and the loss, or leave --aux-loss-coef out"
        )
    if balance == "both" and coef is not None and not coef:
        raise ConfigError(
            "--balance both adds the balance loss to the expert biases: --aux-loss-coef 0 leaves no loss; use "
            "--balance bias for the biases alone, or a positive --aux-loss-coef (DeepSeek-V3's: 0.0001)"
        )


def experts_kernel_option(config: RunConfig) -> str:
    """``--experts-kernel``: auto (the default), grouped or loop."""
    return str(config.workload_options.get("experts_kernel") or "auto")


def routing_balance(tokens_per_expert: list[list[int]], top_k: int) -> dict[str, Any]:
    """The record's routing balance from tokens per expert per layer (summed over steps and ranks): per layer and
    over all layers, with imbalance = max / mean (1 = even; the busiest expert is what the step waits for)."""

    def imbalance(counts: list[int]) -> float | None:
        mean = sum(counts) / len(counts) if counts else 0.0
        return max(counts) / mean if mean else None

    summed = [sum(column) for column in zip(*tokens_per_expert, strict=True)] if tokens_per_expert else []
    return {
        "tokens_per_expert": summed,
        "tokens_per_expert_by_layer": tokens_per_expert,
        "imbalance": imbalance(summed),
        "imbalance_by_layer": [imbalance(layer) for layer in tokens_per_expert],
        "worst_layer_imbalance": max(
            (i for i in (imbalance(layer) for layer in tokens_per_expert) if i is not None), default=None
        ),
        "top_k": top_k,
        "how": "tokens routed to each expert (each token counted once per expert of its top-k), summed over the "
        "timed steps of every rank; imbalance = max / mean over experts (1 = even)",
    }


class RoutingCounts:
    """The job's step counts (:class:`accelbench.workloads.StepCounts`): tokens per expert per layer, read off the
    model's MoE layers."""

    def __init__(self, model: Any, top_k: int) -> None:
        self.model, self.top_k = model, top_k

    def reset(self) -> None:
        for layer in self.model.moe_layers():
            layer.routed = None

    def read(self) -> list[list[int]]:
        """Under tensor parallelism every rank of a tp group routes the same tokens: its rank 0 counts them (the
        others read zeros). A pipeline's ranks count their own stages' layers (the others read zeros)."""
        out = []
        for layer in self.model.moe_layers():
            routed = layer.routed if layer.experts.tp_rank == 0 else None
            out.append([int(c) for c in routed.tolist()] if routed is not None else [0] * layer.n_experts)
        return out

    def summarise(self, counts: list[list[int]]) -> dict[str, Any]:
        return {
            "routing": routing_balance(counts, self.top_k),
            **experts_kernel_ran(self.model),
            **expert_biases(self.model),
        }


def expert_biases(model: Any) -> dict[str, Any]:
    """The record's ``expert_bias_by_layer``: each MoE layer's expert biases at the end (this rank's; every rank
    keeps the same), where the run balanced by them."""
    biases = [layer.expert_bias for layer in model.moe_layers() if layer.expert_bias is not None]
    return {"expert_bias_by_layer": [[float(b) for b in bias.tolist()] for bias in biases]} if biases else {}


def experts_kernel_ran(model: Any) -> dict[str, Any]:
    """The record's ``experts_kernel``: how this process's routed experts last ran ('grouped' or 'loop', None
    before any forward), and why not grouped where the loop ran (every rank decides alike: same device type,
    dtype and widths)."""
    experts = [layer.experts for layer in model.moe_layers()]
    ran = experts[0].ran if experts else None
    return {
        "experts_kernel": ran,
        "experts_kernel_not_grouped": experts[0].not_grouped if ran == "loop" else None,
    }


class MoEWorkload:
    """Registered by the core as workload ``moe``."""

    name = "moe"
    description = (
        "mixture-of-experts decoder (grouped-query attention, or multi-head latent attention (MLA), sigmoid routing "
        "and dense first blocks for the deepseek sizes; top-k routed SwiGLU experts, shared expert, balance loss); "
        "expert parallelism with --mesh ep=N, tensor and pipeline parallelism with --strategy tp/pp"
    )

    def options(self) -> list[RunOption]:
        return list(OPTIONS)

    def model_names(self) -> list[str]:
        return [*MODEL_SIZES, "custom"]

    def prepare(self, config: RunConfig) -> None:
        """Tokenize the run's text into the cache once, before the workers start (as the Llama workload does)."""
        from accelbench.workloads.llama.data import load_corpus

        load_corpus(config.data, resolved(config)[2])

    def parameters(self, config: RunConfig) -> int:
        shape, _, vocab, _ = resolved(config)
        return shape.parameters(vocab)

    def check(self, config: RunConfig) -> None:
        check_custom(config)
        check_balance(config)
        shape, seq_len, _, _ = resolved(config)
        if seq_len > shape.max_seq_len:
            raise ConfigError(
                f"--seq-len {seq_len} is above {config.model}'s context of {shape.max_seq_len:,} tokens"
            )
        if config.sequence_parallel:
            raise ConfigError(
                "--sequence-parallel: the moe workload's routed experts take whole sequences (every tensor-parallel "
                "rank routes the same tokens); run its tp axis without sequence parallelism"
            )

    def check_run(self, config: RunConfig) -> None:
        """What training needs beyond the shapes an estimate builds: the tokenizer (``tokenizers``, the llama
        extra), refused before anything starts."""
        from accelbench.workloads.llama.tokenizer import require_tokenizers

        require_tokenizers()

    def identity(self, config: RunConfig) -> dict[str, Scalar]:
        shape, seq_len, vocab, coef = resolved(config)
        identity: dict[str, Scalar] = {
            "model": label(config, shape),
            "seq_len": seq_len,
            "vocab_size": vocab,
            "aux_loss_coef": coef,
        }
        balance = balance_of(config)
        if balance != "aux-loss":  # left out for the balance loss alone, so records from before compare
            identity.update(balance=balance, bias_update_speed=bias_update_speed_of(config))
        return identity

    def units(self, config: RunConfig) -> ModelUnits:
        shape, seq_len, _, _ = resolved(config)
        return moe_units(shape, seq_len)

    def build(self, config: RunConfig) -> TrainingJob:
        import torch

        from accelbench.workloads import TrainingJob
        from accelbench.workloads.llama.data import token_sources
        from accelbench.workloads.moe.model import MoE, MoEConfig, balance_by_expert_biases, configure_adamw

        shape, seq_len, vocab, coef = resolved(config)
        corpus, data, validation = token_sources(
            config.data, vocab, seq_len, config.batch_size, config.seed, config.steps_per_epoch
        )
        torch.manual_seed(config.seed)
        cfg = MoEConfig(
            n_layers=shape.n_layers,
            dim=shape.dim,
            n_heads=shape.n_heads,
            n_kv_heads=shape.n_kv_heads,
            ffn_dim=shape.ffn_dim,
            vocab_size=vocab,
            seq_len=seq_len,
            rope_theta=shape.rope_theta,
            n_experts=shape.n_experts,
            top_k=shape.top_k,
            shared_experts=shape.shared_experts,
            aux_loss_coef=coef,
            attention_head_dim=shape.head_dim,
            experts_kernel=experts_kernel_option(config),
            kv_lora_rank=shape.kv_lora_rank,
            q_lora_rank=shape.q_lora_rank,
            qk_nope_head_dim=shape.qk_nope_head_dim,
            qk_rope_head_dim=shape.qk_rope_head_dim,
            v_head_dim=shape.v_head_dim,
            router_scores=shape.router_scores,
            first_k_dense=shape.first_k_dense,
            dense_ffn_dim=shape.dense_ffn_dim,
            balance=balance_of(config),
            bias_update_speed=bias_update_speed_of(config),
        )
        model = MoE(cfg)
        lr = config.learning_rate

        def make_optimizer(m: torch.nn.Module, device: torch.device, kernels: str) -> torch.optim.Optimizer:
            """The AdamW, and where the experts carry biases, their update after each of its steps (of every layer
            of the model: a pipeline rank's ``m`` holds only its stages')."""
            optimizer = configure_adamw(m, kernels, lr)
            if cfg.expert_biases:
                balance_by_expert_biases(optimizer, m, cfg, whole=model)
            return optimizer

        per_token = shape.flops_per_token(vocab, seq_len)
        summary: dict[str, Any] = {
            "name": label(config, shape),
            # the keys the analytical model reads a transformer's shape from (accelbench.estimate.facts)
            "n_layer": shape.n_layers,
            "n_head": shape.n_heads,
            "n_embd": shape.dim,
            "seq_len": seq_len,
            "vocab_size": vocab,
            "n_kv_heads": shape.n_kv_heads,
            "ffn_dim": shape.ffn_dim,
            "head_dim": shape.qk_head_dim,  # MLA: the query/key width, qk_nope_head_dim + qk_rope_head_dim
            "rope_theta": shape.rope_theta,
            "n_experts": shape.n_experts,
            "top_k": shape.top_k,
            "shared_experts": shape.shared_experts,
            "moe_layers": shape.moe_layers,
            "first_k_dense": shape.first_k_dense,
            "dense_ffn_dim": shape.dense_ffn_dim,
            "router_scores": f"{shape.router_scores}, top-{shape.top_k} gates renormalised to sum to 1",
            "attention_kind": shape.attention_kind,
            **latent_attention_summary(shape),
            "aux_loss_coef": coef,
            "aux_loss": "Switch's E * sum_i f_i * P_i per sequence, averaged over the batch (DeepSeek-V3's "
            "sequence-wise form), added to the cross-entropy times aux_loss_coef",
            **balance_summary(cfg.balance, cfg.bias_update_speed),
            "tokenizer_vocab": corpus.vocab_size,
            "dropout": 0.0,
            "parameters": model.num_parameters(),
            "non_embedding_parameters": model.num_parameters(non_embedding=True),
            "active_parameters": shape.active_parameters(vocab),
            "active_non_embedding_parameters": shape.active_non_embedding_parameters(vocab),
            "expert_parameters": shape.expert_parameters(),
            "flops_per_token": per_token,
            "flops_count": "active parameters (top-k routed experts + shared expert + attention + router + head)",
            "attention": "torch scaled_dot_product_attention (causal, "
            + ("multi-head latent attention)" if shape.latent_attention else "grouped-query)"),
            # what was asked; the record's experts_kernel (RoutingCounts.summarise) says what ran
            "experts_kernel_option": experts_kernel_option(config),
            "tied_embedding_head": False,
        }
        return TrainingJob(
            model=model,
            data=data,
            validation=validation,
            make_optimizer=make_optimizer,
            flops_per_sample=per_token * seq_len,
            flops_formula=MLA_FLOPS_FORMULA if shape.latent_attention else FLOPS_FORMULA,
            tokens_per_sample=seq_len,
            units=moe_units(shape, seq_len),
            grad_clip_norm=1.0,
            summary=summary,
            step_counts=RoutingCounts(model, shape.top_k),
        )


def balance_summary(balance: str, speed: float) -> dict[str, Any]:
    """The record's load balancing: which ran and how."""
    how = {
        "aux-loss": "the balance loss alone, at aux_loss_coef",
        "bias": "DeepSeek-V3's auxiliary-loss-free balancing: a per-expert bias on the router's affinity scores "
        "for the top-k choice only (gates unbiased), moved by -bias_update_speed * sign(load - mean load) after "
        "each optimizer step, the loads summed over every rank",
    }
    how["both"] = how["bias"] + ", and the balance loss at aux_loss_coef"
    summary: dict[str, Any] = {"balance": balance, "balance_how": how[balance]}
    if balance != "aux-loss":
        summary["bias_update_speed"] = speed
    return summary


def latent_attention_summary(shape: MoEShape) -> dict[str, Any]:
    """The record's multi-head latent attention dimensions (none for grouped-query attention)."""
    if not shape.latent_attention:
        return {}
    return {
        "kv_lora_rank": shape.kv_lora_rank,
        "q_lora_rank": shape.q_lora_rank,
        "qk_nope_head_dim": shape.qk_nope_head_dim,
        "qk_rope_head_dim": shape.qk_rope_head_dim,
        "v_head_dim": shape.v_head_dim,
    }


def moe_tp_plan(shape: MoEShape) -> tuple[tuple[str, str], ...]:
    """How tensor parallelism splits a block (Megatron's): attention over its heads (grouped-query: ``wq``, ``wk``,
    ``wv`` column-parallel; latent: the per-head expansions ``wq``/``wq_b`` and ``wkv_b`` column-parallel, the
    latents ``wq_a``, ``wkv_a`` and their norms whole on every rank), ``wo`` row-parallel; the shared expert and the
    dense first blocks' feed-forward column/row-parallel; each routed expert over its hidden width (``module``:
    :meth:`accelbench.workloads.moe.model.GroupedExperts.tensor_parallel`). The router is whole on every rank, so
    every rank routes its tokens alike. Entries a block lacks are skipped (dense blocks have no experts)."""
    attention = (
        (("attention.wq", "colwise"), ("attention.wq_b", "colwise"), ("attention.wkv_b", "colwise"))
        if shape.latent_attention
        else (("attention.wq", "colwise"), ("attention.wk", "colwise"), ("attention.wv", "colwise"))
    )
    swiglu = ("feed_forward.w1", "colwise"), ("feed_forward.w3", "colwise"), ("feed_forward.w2", "rowwise")
    shared = tuple(
        (path.replace("feed_forward.", "feed_forward.shared_expert."), kind) for path, kind in swiglu
    )
    return (
        *attention,
        ("attention.wo", "rowwise"),
        *(swiglu if shape.first_k_dense else ()),
        *(shared if shape.shared_experts else ()),
        ("feed_forward.experts", "module"),
    )


def moe_tp_divides(shape: MoEShape) -> tuple[tuple[str, int], ...]:
    """The sizes a tensor-parallel size must divide: the heads (and grouped-query attention's key/value heads), each
    expert's hidden width (the shared expert's is a multiple of it) and the dense blocks' width."""
    return (
        ("attention heads", shape.n_heads),
        *(() if shape.latent_attention else (("key/value heads", shape.n_kv_heads),)),
        ("expert hidden width", shape.ffn_dim),
        *((("dense feed-forward width", shape.dense_ffn_dim),) if shape.first_k_dense else ()),
    )


def moe_units(shape: MoEShape, seq_len: int | None = None) -> ModelUnits:
    """The model's parts: the token embedding, ``n_layers`` blocks (FSDP's units, pipeline stages' share), the
    final norm and the head; how tensor parallelism splits a block (:func:`moe_tp_plan`) and what it must divide;
    the methods a pipeline runs the stem, head and loss with, and those by which each block's balance loss reaches
    backward and the reported loss on its own stage (:meth:`accelbench.workloads.moe.model.MoE.add_balance_loss_in_backward`).
    The experts are split by the ep axis (expert parallelism) or over their hidden width by the tp axis."""
    return ModelUnits(
        stem=("tok_embeddings",),
        units=tuple(f"layers.{i}" for i in range(shape.n_layers)),
        head=("norm", "output"),
        split_points=tuple(f"layers.{i}.ffn_norm" for i in range(shape.n_layers)),
        tp_plan=moe_tp_plan(shape),
        tp_divides=moe_tp_divides(shape),
        sequence_length=seq_len,
        hidden_size=shape.dim,
        stem_method="embed",
        head_method="head",
        loss_method="loss",
        experts=shape.n_experts,
        unit_loss_methods=("add_balance_loss_in_backward", "take_balance_loss"),
    )
