"""The Llama workload: the model computes what a Llama computes (GQA, RoPE, published sizes, FLOPs against torch's
counter), the byte-level BPE is trained once and cached, the loss falls on real tokenized text, and real CPU runs
through `accelbench run`: single process, DDP, FSDP and tensor parallelism on two gloo processes; bad requests
refused with exit code 2."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
from core_support import accelbench, accelbench_here, run_ok

from accelbench.config import RunConfig
from accelbench.errors import ConfigError
from accelbench.plugins import get_host
from accelbench.results import ResultRecord, read_record
from accelbench.workloads.gpt.data import generate_corpus
from accelbench.workloads.llama import FLOPS_FORMULA, MODEL_SIZES, LlamaShape, llama_units

pytest.importorskip("tokenizers")

from accelbench.workloads.llama import tokenizer as tok  # noqa: E402
from accelbench.workloads.llama.data import TokenWindows, load_corpus  # noqa: E402
from accelbench.workloads.llama.model import (  # noqa: E402
    Attention,
    Llama,
    LlamaConfig,
    apply_rope,
    configure_adamw,
)

VOCAB = 512
TEXT_BYTES = 200_000  # a slice of the generated corpus: the same text, tokenized in a second


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A text file and a tokenizer cache shared by this module's runs (each run then loads, not trains)."""
    root = tmp_path_factory.mktemp("llama")
    (root / "text.txt").write_bytes(generate_corpus()[:TEXT_BYTES].tobytes())
    (root / "cache").mkdir()
    return root


def run(corpus_dir: Path, out: Path, *args: str) -> ResultRecord:
    tiny = ["--workload", "llama", "--model", "llama-tiny", "--seq-len", "32", "--vocab-size", str(VOCAB),
            "--batch-size", "8", "--epochs", "2", "--steps-per-epoch", "2", "--data", str(corpus_dir / "text.txt"),
            "-q", "--no-calibration"]  # fmt: skip
    run_ok(*tiny, *args, "--output-dir", str(out), env={"ACCELBENCH_CACHE_DIR": str(corpus_dir / "cache")},
           timeout=400)  # fmt: skip
    files = sorted(out.glob("*.json"))
    assert len(files) == 1, files
    record = read_record(files[0])
    assert record.outcome.status == "ok", record.outcome.message
    return record


def losses(record: ResultRecord) -> list[float]:
    assert record.metrics is not None
    return [e.loss for e in record.metrics.epochs if e.loss is not None]


def small(n_heads: int = 4, n_kv_heads: int = 2, **kw: object) -> LlamaConfig:
    values: dict = dict(n_layers=2, dim=32, n_heads=n_heads, n_kv_heads=n_kv_heads, ffn_dim=48, vocab_size=64,  # type: ignore[type-arg]
                        seq_len=16)  # fmt: skip
    values.update(kw)
    return LlamaConfig(**values)


# ---------------------------------------------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------------------------------------------


def test_grouped_query_attention_is_multi_head_attention_with_shared_kv_heads() -> None:
    """GQA with 2 kv heads for 4 query heads computes what plain MHA computes when each kv head's weights are
    repeated for the query heads that share it; and a GQA model with kv heads == heads is MHA."""
    torch.manual_seed(0)
    gqa, mha = Attention(small(4, 2)), Attention(small(4, 4))
    head_dim = 8
    with torch.no_grad():
        mha.wq.weight.copy_(gqa.wq.weight)
        mha.wo.weight.copy_(gqa.wo.weight)
        for name in ("wk", "wv"):  # kv head j serves query heads 2j and 2j + 1
            w = getattr(gqa, name).weight.view(2, head_dim, -1)
            getattr(mha, name).weight.copy_(w.repeat_interleave(2, dim=0).reshape(4 * head_dim, -1))
    x = torch.randn(3, 16, 32)
    torch.testing.assert_close(gqa(x), mha(x))

    # MHA against attention written out: softmax(q k^T / sqrt(d) + causal mask) v, with RoPE on q and k
    b, t, _ = x.shape
    q, k, v = (getattr(mha, n)(x).view(b, t, 4, head_dim) for n in ("wq", "wk", "wv"))
    q, k = apply_rope(q, mha.rope_theta), apply_rope(k, mha.rope_theta)
    q, k, v = (z.transpose(1, 2) for z in (q, k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(head_dim)
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, 32)
    torch.testing.assert_close(mha(x), mha.wo(y))


def test_rotary_embedding_keeps_norms_and_depends_on_relative_position_only() -> None:
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)
    seq_q, seq_k = q.expand(1, 24, 1, 16), k.expand(1, 24, 1, 16)  # the same vector at every position
    rq, rk = apply_rope(seq_q, 10_000.0), apply_rope(seq_k, 10_000.0)
    assert rq.shape == seq_q.shape
    torch.testing.assert_close(rq.norm(dim=-1), seq_q.norm(dim=-1))  # a rotation
    torch.testing.assert_close(rq[:, 0], q[:, 0])  # position 0 is not turned
    dots = (rq[0, :, 0, None, :] * rk[0, None, :, 0, :]).sum(-1)  # <q_m, k_n> for all m, n
    for shift in (1, 5):  # equal along each diagonal: a function of m - n
        torch.testing.assert_close(dots[shift:, shift:], dots[:-shift, :-shift], rtol=1e-4, atol=1e-4)
    # the first pair turns by the position's angle (theta^0 = 1 radian per position)
    angle = torch.atan2(rq[0, 3, 0, 1], rq[0, 3, 0, 0]) - torch.atan2(q[0, 0, 0, 1], q[0, 0, 0, 0])
    assert math.remainder(float(angle) - 3.0, 2 * math.pi) == pytest.approx(0.0, abs=1e-4)


@pytest.mark.parametrize(
    "name, billions", [("llama3-8b", 8.03), ("llama3-70b", 70.55), ("llama3-405b", 405.85)]
)
def test_the_llama3_sizes_have_their_published_parameter_counts(name: str, billions: float) -> None:
    shape = MODEL_SIZES[name]
    with torch.device("meta"):
        model = Llama(LlamaConfig(shape.n_layers, shape.dim, shape.n_heads, shape.n_kv_heads, shape.ffn_dim,
                                  shape.vocab_size, 8192))  # fmt: skip
    assert model.num_parameters() == shape.parameters(shape.vocab_size)
    assert model.num_parameters(non_embedding=True) == shape.non_embedding_parameters(shape.vocab_size)
    assert model.num_parameters() / 1e9 == pytest.approx(billions, rel=0.002)


def test_flops_formula_is_three_forward_passes_counted_by_torch() -> None:
    """6N + 12*L*d*s per token: torch's counter (matmuls, the whole causal score matrix) times 3, within the
    norms' weights (in N, not matmuls)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    shape = LlamaShape(2, 64, 4, 2, 192, 500, 128)
    seq_len, batch = 128, 2
    model = Llama(LlamaConfig(2, 64, 4, 2, 192, 500, seq_len))
    tokens = torch.randint(0, 500, (batch, seq_len))
    counter = FlopCounterMode(display=False)
    with counter, sdpa_kernel(SDPBackend.MATH):  # the math kernel: the counter knows its matmuls
        model(tokens, tokens)
    per_token = 3 * counter.get_total_flops() / (batch * seq_len)
    assert shape.flops_per_token(500, seq_len) == pytest.approx(per_token, rel=0.002)
    assert shape.megatron_flops_per_token(500, seq_len) == pytest.approx(per_token, rel=1e-9)  # matmuls only
    halved = shape.flops_per_token_causal_halved(500, seq_len)
    assert halved == shape.flops_per_token(500, seq_len) - 6 * 2 * 64 * seq_len  # half of 12*L*d*s


def test_units_name_the_parts_of_the_model() -> None:
    model = Llama(small())
    units = llama_units(MODEL_SIZES["llama-tiny"])
    modules = dict(model.named_modules())
    assert all(p in modules for p in (*units.stem, *units.units, *units.head, *units.split_points))
    assert all(f"layers.0.{path}" in modules for path, _ in units.tp_plan)
    assert dict(units.tp_divides) == {"attention heads": 4, "key/value heads": 2, "feed-forward width": 192}
    x = torch.randint(0, 64, (2, 16))
    h = model.embed(x)
    for layer in model.layers:
        h = layer(h)
    torch.testing.assert_close(model.loss(model.head(h), x), model(x, x))


# ---------------------------------------------------------------------------------------------------------------
# tokenizer and data
# ---------------------------------------------------------------------------------------------------------------


def test_the_tokenizer_is_trained_once_then_loaded_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = generate_corpus()[:50_000].tobytes().decode("ascii")
    first = tok.tokenized(text, 300, "test", folder=tmp_path)
    assert not first.cached and first.vocab_size == 300 and first.tokens.max() < 300
    assert len(first.tokens) < len(text) / 1.3  # merges: fewer tokens than bytes
    from tokenizers import Tokenizer

    assert Tokenizer.from_file(str(first.tokenizer_file)).decode(first.tokens.tolist()) == text  # lossless
    # deterministic: the same corpus trains the same tokenizer (so hosts with cold caches tokenize alike)
    assert tok.train(text, 300).to_str() == Tokenizer.from_file(str(first.tokenizer_file)).to_str()

    def no_training(*args: object) -> None:
        raise AssertionError("retrained")

    monkeypatch.setattr(tok, "train", no_training)
    monkeypatch.setattr(tok, "encode", no_training)
    again = tok.tokenized(text, 300, "test", folder=tmp_path)
    assert again.cached and (again.tokens == first.tokens).all()
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".json", ".npy"]
    with pytest.raises(AssertionError, match="retrained"):  # another vocabulary is another tokenizer
        tok.tokenized(text, 400, "test", folder=tmp_path)


def test_the_loss_falls_on_real_tokenized_text(corpus_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELBENCH_CACHE_DIR", str(corpus_dir / "cache"))
    corpus = load_corpus(corpus_dir / "text.txt", VOCAB)
    windows = TokenWindows(corpus, seq_len=32, batch_size=16, seed=0)
    torch.manual_seed(0)
    model = Llama(small(vocab_size=VOCAB, seq_len=32, dim=64, ffn_dim=128))
    optimizer = configure_adamw(model, "foreach", 3e-3)
    seen = []
    for step, (x, y) in enumerate(windows.batches(0)):
        loss = model(x, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        seen.append(loss.item())
        if step == 40:
            break
    assert seen[0] == pytest.approx(math.log(VOCAB), rel=0.05)  # untrained: uniform over the vocabulary
    assert sum(seen[-5:]) / 5 < seen[0] - 1.0


def test_device_windows_are_the_host_windows(corpus_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELBENCH_CACHE_DIR", str(corpus_dir / "cache"))
    windows = TokenWindows(load_corpus(corpus_dir / "text.txt", VOCAB), seq_len=16, batch_size=4, seed=3,
                           max_steps=3)  # fmt: skip
    device = windows.to_device(torch.device("cpu"), "device")
    for epoch in (0, 1):
        for rank in (0, 1):
            host, placed = list(windows.batches(epoch, rank, 2)), list(device.batches(epoch, rank, 2))
            assert len(host) == len(placed) == 3
            for (x, y), (dx, dy) in zip(host, placed, strict=True):
                assert torch.equal(x, dx) and torch.equal(y, dy) and torch.equal(x[:, 1:], y[:, :-1])


# ---------------------------------------------------------------------------------------------------------------
# requests
# ---------------------------------------------------------------------------------------------------------------


def test_defaults() -> None:
    config = get_host().resolve(RunConfig(workload="llama"))
    assert config.model == "llama-tiny" and config.workload_options["seq_len"] == 256
    assert get_host().workload("llama").identity(config) == {
        "model": "llama-tiny", "seq_len": 256, "vocab_size": 8192, "rope_theta": 500_000.0
    }  # fmt: skip
    big = get_host().resolve(RunConfig(workload="llama", model="llama3-8b"))
    assert get_host().workload("llama").identity(big)["vocab_size"] == 128_256
    custom = get_host().resolve(
        RunConfig(
            workload="llama", model="custom", workload_options={"n_layer": 3, "n_head": 4, "n_embd": 96}
        )
    )  # no --kv-heads: multi-head attention; no --ffn-dim: 8/3 of the width up to a multiple of 64
    assert get_host().workload("llama").identity(custom)["model"] == "custom 3L/4H/4KV/96E/256F"


@pytest.mark.parametrize(
    "values, message",
    [
        ({"model": "llama-huge"}, "unknown model 'llama-huge' for workload 'llama'"),
        (
            {"workload_options": {"seq_len": 4096}},
            "--seq-len 4096 is above llama-tiny's context of 2,048 tokens",
        ),
        ({"workload_options": {"seq_len": 10_000}}, "--seq-len"),
        ({"workload_options": {"vocab_size": 100}}, "--vocab-size"),
        ({"workload_options": {"block_size": 16}}, "block_size"),
        ({"model": "custom", "workload_options": {"n_layer": 2, "n_head": 4}}, "model 'custom' needs all of"),
        ({"workload_options": {"n_kv_heads": 2}}, "describe a custom size: use them with --model custom"),
        (
            {"model": "custom", "workload_options": {"n_layer": 1, "n_head": 3, "n_embd": 64}},
            "width 64 is not divisible by heads 3",
        ),
        (
            {
                "model": "custom",
                "workload_options": {"n_layer": 1, "n_head": 4, "n_embd": 64, "n_kv_heads": 3},
            },
            "heads 4 are not divisible by key/value heads 3",
        ),
        (
            {"model": "custom", "workload_options": {"n_layer": 1, "n_head": 4, "n_embd": 36}},
            "the head size 9 must be even",
        ),
    ],
)
def test_bad_requests_are_refused(values: dict, message: str) -> None:  # type: ignore[type-arg]
    config = RunConfig(**{"workload": "llama", "model": "llama-tiny", **values})
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        get_host().resolve(config)


def test_bad_command_lines_exit_2(
    corpus_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCELBENCH_CACHE_DIR", str(corpus_dir / "cache"))
    data = ["--data", str(corpus_dir / "text.txt"), "--vocab-size", str(VOCAB)]
    for args, message in (
        (["--seq-len", "5000"], "above llama-tiny's context"),
        (["--mesh", "tp=4", "--devices", "4"], "does not divide"),  # 4 query heads but 2 kv heads
        (
            ["--model", "custom", "--layers", "1", "--heads", "4", "--kv-heads", "3", "--embd", "64"],
            "heads 4 are not divisible by key/value heads 3",
        ),
    ):
        code, stderr = accelbench_here(capsys, "run", "--workload", "llama", "--model", "llama-tiny", *data, *args,
                                       "--output-dir", str(tmp_path), "-q")  # fmt: skip
        assert code == 2, (args, stderr[-2000:])
        assert message in stderr, stderr[-2000:]
    assert not list(tmp_path.glob("*.json"))


# ---------------------------------------------------------------------------------------------------------------
# real runs
# ---------------------------------------------------------------------------------------------------------------


def test_llama_trains_single_process_and_records_tokens(corpus_dir: Path, tmp_path: Path) -> None:
    record = run(corpus_dir, tmp_path)
    m = record.metrics
    assert m is not None and m.steady is not None and [e.steps for e in m.epochs] == [2, 2]
    assert all(e.tokens == 32 * e.samples for e in m.epochs)  # units: tokens, seq_len a sample
    assert m.steady.tokens_per_s and m.steady.tokens_per_s == pytest.approx(32 * m.steady.samples_per_s)
    assert m.flops_formula == FLOPS_FORMULA and "not halved" in m.flops_formula
    shape = MODEL_SIZES["llama-tiny"]
    assert m.flops_per_sample == shape.flops_per_token(VOCAB, 32) * 32
    assert m.megatron_flops_per_sample == pytest.approx(shape.megatron_flops_per_token(VOCAB, 32) * 32)
    assert losses(record)[0] == pytest.approx(math.log(VOCAB), rel=0.05)
    w = record.workload
    assert (w["n_layer"], w["n_head"], w["n_embd"], w["seq_len"], w["n_kv_heads"]) == (2, 4, 64, 32, 2)
    assert w["parameters"] == shape.parameters(VOCAB) and w["tokenizer_vocab"] == VOCAB
    assert record.data["tokenizer"]["from_cache"] in (True, False) and record.data["tokens"] > 0
    assert record.workload_identity == {"model": "llama-tiny", "seq_len": 32, "vocab_size": VOCAB,
                                        "rope_theta": 500_000.0}  # fmt: skip


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
@pytest.mark.slow
def test_llama_trains_data_parallel_on_two_processes(corpus_dir: Path, tmp_path: Path, strategy: str) -> None:
    record = run(corpus_dir, tmp_path, "--strategy", strategy, "--devices", "2")
    assert record.world_size == 2 and record.executor["strategy"] == strategy
    assert record.metrics is not None and [r.epoch_samples for r in record.metrics.ranks] == [
        [16, 16],
        [16, 16],
    ]
    assert record.data["tokenizer"]["from_cache"]  # trained by an earlier run of this module, or rank 0's


@pytest.mark.parametrize(
    "layout",
    [("--strategy", "tp", "--devices", "2"), ("--strategy", "tp", "--devices", "2", "--sequence-parallel"),
     ("--strategy", "pp", "--devices", "2")],
    ids=["tp", "tp+sequence-parallel", "pp"],
)  # fmt: skip
@pytest.mark.slow
def test_tensor_and_pipeline_parallel_llama_train_the_same_model(
    corpus_dir: Path, tmp_path: Path, layout: tuple[str, ...]
) -> None:
    """tp=2 splits each block's heads (4 query, 2 kv: one kv head per rank) and feed-forward, with sequence
    parallelism its RMSNorms on sequence shards; pp=2 deals the blocks to two stages (stem, head and loss by the
    model's embed/head/loss). None changes the maths: the losses are single-device training's."""
    reference = corpus_dir / "single"
    if not reference.exists():  # one single-process run serves the three layouts
        run(corpus_dir, reference)
    single = read_record(next(reference.glob("*.json")))
    record = run(corpus_dir, tmp_path, *layout)
    if "tp" in layout:
        tp = record.executor["tensor_parallel"]
        assert tp["size"] == 2 and tp["sequence_parallel"] == ("--sequence-parallel" in layout)
        assert ["attention.wk", "colwise"] in tp["plan"]
    else:
        assert "pipeline" in record.executor
    assert losses(record) == pytest.approx(losses(single), abs=1e-5)


def test_a_published_shape_builds_on_the_meta_device_and_is_refused_where_it_cannot_fit(
    corpus_dir: Path, tmp_path: Path
) -> None:
    """llama3-70b (70.6 B parameters, 282 GB of fp32 weights) with its 128,256-token vocabulary: counted from its
    shape by the preflight and refused (exit 2) on a host without the memory, before anything is built."""
    env = {**os.environ, "ACCELBENCH_CACHE_DIR": str(corpus_dir / "cache")}
    proc = accelbench("run", "--workload", "llama", "--model", "llama3-70b", "--seq-len", "64", "--batch-size", "1",
                      "--data", str(corpus_dir / "text.txt"), "--output-dir", str(tmp_path), "-q", env=env)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "llama llama3-70b: 70,553,706,496 parameters" in proc.stderr, proc.stderr[-2000:]


def test_a_custom_size_with_multi_query_attention_trains(corpus_dir: Path, tmp_path: Path) -> None:
    record = run(corpus_dir, tmp_path, "--model", "custom", "--layers", "1", "--heads", "4", "--kv-heads", "1",
                 "--embd", "32", "--ffn-dim", "64")  # fmt: skip
    assert record.workload_identity["model"] == "custom 1L/4H/1KV/32E/64F"
    w = record.workload
    assert (w["n_layer"], w["n_head"], w["n_kv_heads"], w["n_embd"], w["ffn_dim"]) == (1, 4, 1, 32, 64)
    assert w["parameters"] == LlamaShape(1, 32, 4, 1, 64, VOCAB, 2048).parameters(VOCAB)
