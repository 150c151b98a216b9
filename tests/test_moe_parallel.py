"""The mixture-of-experts workload under tensor and pipeline parallelism.

Tensor parallelism splits attention over its heads (grouped-query or latent), the shared expert and dense blocks
column/row-parallel and every routed expert over its hidden width (Megatron's expert tensor parallelism), the router
whole on every rank; a pipeline deals the blocks to stages, each block adding its balance loss's gradient in
backward itself. Both train the one-process model: the same gradients and weights after a step (two forked gloo
processes against one), the same epoch losses, routing counts and gradient norms through ``accelbench run``. Expert
parallelism inside a pipeline (``pp=2,ep=2``, four processes) trains one process's model on the pipelines' batches
together. Layouts the model cannot be split into are refused before launch, saying what would work."""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import traceback
from pathlib import Path
from typing import Any

import pytest
import torch
from core_support import accelbench, epoch_on_the_global_batch
from torch import nn

from accelbench.config import RunConfig
from accelbench.engine.parallel.mesh import check_model_split
from accelbench.errors import ConfigError
from accelbench.parallel_dims import ParallelDims
from accelbench.plugins import get_host
from accelbench.results import ResultRecord, read_record
from accelbench.workloads.gpt.data import generate_corpus
from accelbench.workloads.moe import MODEL_SIZES, moe_tp_plan

pytest.importorskip("tokenizers")

from accelbench.workloads.moe.model import MoE, MoEConfig, update_expert_biases  # noqa: E402

VOCAB = 512
TEXT_BYTES = 200_000


def gqa_config() -> MoEConfig:
    """Grouped-query attention (4 heads, 2 kv heads), 4 experts of 48 top-2 and a shared one: the balance loss
    weighted 1.0 so that its gradient is no rounding error of the step."""
    return MoEConfig(n_layers=2, dim=32, n_heads=4, n_kv_heads=2, ffn_dim=48, vocab_size=97, seq_len=16,
                     n_experts=4, top_k=2, shared_experts=1, aux_loss_coef=1.0)  # fmt: skip


def mla_config() -> MoEConfig:
    """DeepSeek-V3's architecture in miniature: latent attention (queries through a latent), sigmoid routing, the
    first block dense."""
    return MoEConfig(n_layers=3, dim=32, n_heads=4, n_kv_heads=4, ffn_dim=24, vocab_size=97, seq_len=16,
                     n_experts=4, top_k=2, shared_experts=1, aux_loss_coef=1.0, kv_lora_rank=16, q_lora_rank=24,
                     qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, router_scores="sigmoid",
                     first_k_dense=1, dense_ffn_dim=64)  # fmt: skip


def shape_of(cfg: MoEConfig) -> Any:
    """The workload's shape fields :func:`moe_tp_plan` reads, from a model configuration."""
    from accelbench.workloads.moe import MoEShape

    return MoEShape(cfg.n_layers, cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.ffn_dim, cfg.n_experts, cfg.top_k,
                    cfg.shared_experts, cfg.vocab_size, cfg.seq_len, cfg.rope_theta, kv_lora_rank=cfg.kv_lora_rank,
                    q_lora_rank=cfg.q_lora_rank, qk_nope_head_dim=cfg.qk_nope_head_dim,
                    qk_rope_head_dim=cfg.qk_rope_head_dim, v_head_dim=cfg.v_head_dim,
                    router_scores=cfg.router_scores, first_k_dense=cfg.first_k_dense,
                    dense_ffn_dim=cfg.dense_ffn_dim)  # fmt: skip


def one_step(
    model: MoE, tokens: torch.Tensor
) -> tuple[float, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One training step of ``model`` on ``tokens`` (next-token targets): the loss, every gradient, and every
    weight after the workload's AdamW step, all whole (tensor-parallel shards gathered)."""
    from torch.distributed.tensor import DTensor

    from accelbench.workloads.moe.model import configure_adamw

    def whole(t: torch.Tensor) -> torch.Tensor:
        return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()

    optimizer = configure_adamw(model, "plain", 1e-2)  # one tensor at a time: plain and DTensor weights mixed
    loss = model(tokens[:, :-1], tokens[:, 1:])
    loss.backward()
    grads = {n: whole(p.grad) for n, p in model.named_parameters() if p.grad is not None}
    optimizer.step()
    return loss.item(), grads, {n: whole(p) for n, p in model.named_parameters()}


def named(name: str) -> Any:
    """assert_close's message, the parameter's name first."""
    return lambda message: f"{name}: {message}"


def _tensor_parallel_rank(rank: int, store: str, cfg: MoEConfig, tokens: torch.Tensor, expected: Any) -> None:
    """One of two tensor-parallel ranks: the model split by the workload's plan, one step, compared with the
    one-process step (``expected``)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from accelbench.engine.parallel.tp import parallelize_units

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        model = MoE(cfg)
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
        parallelize_units(list(model.layers), moe_tp_plan(shape_of(cfg)), mesh, sequence_parallel=False)
        experts = model.moe_layers()[0].experts
        assert experts.w1.to_local().shape[2] == cfg.ffn_dim // 2  # each rank half of every expert's width
        loss, grads, weights = one_step(model, tokens)
        want_loss, want_grads, want_weights = expected
        assert abs(loss - want_loss) < 1e-5, (loss, want_loss)
        assert grads.keys() == want_grads.keys()
        for name, grad in grads.items():
            torch.testing.assert_close(grad, want_grads[name], atol=1e-6, rtol=1e-4, msg=named(name))
        # AdamW's first step moves a weight by about lr x sign(gradient), lr = 1e-2; where a gradient is near
        # Adam's eps (1e-8), its last bits (sums in another order) shift the step a little: 1% of it allowed
        for name, weight in weights.items():
            torch.testing.assert_close(weight, want_weights[name], atol=1e-4, rtol=0, msg=named(name))
    finally:
        dist.destroy_process_group()


def _run_rank(rank: int, *args: Any) -> None:
    try:
        _tensor_parallel_rank(rank, *args)
    except BaseException:
        traceback.print_exc()
        os._exit(1)


@pytest.mark.parametrize("cfg", [gqa_config(), mla_config()], ids=["grouped-query", "latent-attention"])
@pytest.mark.slow
def test_tensor_parallel_is_the_one_process_step_in_gradients_and_weights(
    tmp_path: Path, cfg: MoEConfig
) -> None:
    """Two forked gloo processes, tp=2: the loss, every parameter's gradient (router, latents, norms, experts,
    shared expert, embedding, head) and every weight after an AdamW step are the one-process step's."""
    import torch.multiprocessing as mp

    torch.manual_seed(0)
    reference = MoE(cfg)
    tokens = torch.randint(
        0, cfg.vocab_size, (4, cfg.seq_len + 1), generator=torch.Generator().manual_seed(1)
    )
    expected = one_step(reference, tokens)
    mp.start_processes(
        _run_rank, args=(str(tmp_path / "store"), cfg, tokens, expected), nprocs=2, start_method="spawn"
    )


@pytest.mark.parametrize("cfg", [gqa_config(), mla_config()], ids=["grouped-query", "latent-attention"])
def test_pipeline_blocks_add_their_balance_loss_in_backward(cfg: MoEConfig) -> None:
    """The model run as a pipeline runs it (embed, blocks cut into two stages by a detached boundary, head, the
    cross-entropy as the loss): with each layer adding its balance loss's gradient itself, the gradients are the
    model's own forward's (cross-entropy + coef x the summed balance losses), and the cross-entropy plus the taken
    balance losses is its loss."""
    torch.manual_seed(0)
    whole = MoE(cfg)
    staged = copy.deepcopy(whole)
    staged.add_balance_loss_in_backward()
    tokens = torch.randint(
        0, cfg.vocab_size, (4, cfg.seq_len + 1), generator=torch.Generator().manual_seed(1)
    )
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    want = whole(inputs, targets)
    want.backward()
    cut = len(staged.layers) - 1
    x = staged.embed(inputs)
    for layer in staged.layers[:cut]:
        x = layer(x)
    boundary = x.detach().requires_grad_()  # what the second stage receives
    y = boundary
    for layer in staged.layers[cut:]:
        y = layer(y)
    cross_entropy = staged.loss(staged.head(y), targets)
    cross_entropy.backward()
    x.backward(boundary.grad)  # the first stage's backward, from the gradient the second sent back
    taken = staged.take_balance_loss()
    assert taken is not None and staged.take_balance_loss() is None  # taken once, then forgotten
    assert (cross_entropy + taken).item() == pytest.approx(want.item(), abs=1e-6)
    mine = dict(staged.named_parameters())
    for name, p in whole.named_parameters():
        assert p.grad is not None, name
        torch.testing.assert_close(mine[name].grad, p.grad, atol=1e-7, rtol=1e-5, msg=name)
    router = whole.moe_layers()[0].router.weight.grad
    assert router is not None and router.abs().sum() > 0
    # a forward that did not happen (torch's metadata inference on empty tensors): its tokens taken back
    counted = [layer.routed.clone() for layer in staged.moe_layers()]  # type: ignore[union-attr]
    staged.layers[-1](torch.randn(4, cfg.seq_len, cfg.dim))
    assert staged.take_balance_loss(keep=False) is None
    assert all(torch.equal(layer.routed, c) for layer, c in zip(staged.moe_layers(), counted, strict=True))


def test_a_forward_taken_back_leaves_no_load_for_the_expert_biases() -> None:
    """The pipeline's metadata inference runs a stage with gradients on, in train mode, before the schedule's
    forwards: taken back (``keep`` False), its tokens leave the loads the expert biases move by as well as the
    routing counts, so the first step's bias update is one device's."""
    cfg = dataclasses.replace(mla_config(), balance="both", aux_loss_coef=0.0001)
    torch.manual_seed(0)
    model = MoE(cfg)
    model.add_balance_loss_in_backward()
    layer = model.moe_layers()[-1]
    x = torch.randn(2, cfg.seq_len, cfg.dim)
    model.layers[-1](x)  # a forward of the step
    model.take_balance_loss()
    load, routed = layer.load, layer.routed
    assert load is not None and routed is not None and int(load.sum()) == 2 * cfg.seq_len * cfg.top_k
    model.layers[-1](torch.randn(2, cfg.seq_len, cfg.dim))  # one that did not happen
    assert model.take_balance_loss(keep=False) is None
    assert torch.equal(layer.load, load) and torch.equal(layer.routed, routed)


def test_a_stage_updates_the_biases_of_layers_it_does_not_hold() -> None:
    """A pipeline rank's optimizer holds its stages only; every MoE layer of ``whole`` the stage does not hold
    (here a copy of the model, whose layers are all other objects) takes the same update from the summed loads,
    so the record's biases, rank 0's, are every layer's, not zeros for the other stages'."""
    cfg = dataclasses.replace(mla_config(), balance="bias", aux_loss_coef=0.0)
    model = MoE(cfg)
    whole = copy.deepcopy(model)
    held = model.moe_layers()[0]  # block 1's (block 0 is dense)
    held.load = torch.tensor([5, 1, 1, 1])
    update_expert_biases(nn.ModuleList([model.layers[1]]), cfg.n_layers, cfg.n_experts, 0.5, whole=whole)
    copied, unloaded = whole.moe_layers()
    assert (
        held.expert_bias is not None and copied.expert_bias is not None and unloaded.expert_bias is not None
    )
    assert held.expert_bias.tolist() == [-0.5, 0.5, 0.5, 0.5] == copied.expert_bias.tolist()
    assert unloaded.expert_bias.tolist() == [
        0.0,
        0.0,
        0.0,
        0.0,
    ]  # no tokens reached it: sign(0) moves nothing
    assert held.load is None


# ---------------------------------------------------------------------------------------------------------------
# refusals, before launch
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model, mesh, devices, options, message",
    [
        ("moe-tiny", "tp=4", 4, {}, "does not divide the model's 2 key/value heads; a tp size must divide "
         "4 attention heads and 2 key/value heads and 128 expert hidden width: 1, 2"),
        ("deepseek-tiny", "tp=8", 8, {}, "does not divide the model's 4 attention heads; a tp size must divide 4 "
         "attention heads and 64 expert hidden width and 192 dense feed-forward width: 1, 2, 4"),
        ("moe-tiny", "pp=4", 4, {}, "4 pipeline stages (4 ranks x 1 stages each) for a model of 2 layers"),
        ("moe-tiny", "tp=2", 2, {"sequence_parallel": True}, "routed experts take whole sequences"),
        ("moe-tiny", "tp=2,ep=2", 4, {"sequence_parallel": True}, "routed experts take whole sequences"),
    ],
)  # fmt: skip
def test_layouts_the_model_cannot_be_split_into_are_refused(
    model: str, mesh: str, devices: int, options: dict[str, object], message: str
) -> None:
    host = get_host()
    with pytest.raises((ConfigError, ValueError)) as refused:
        config = host.resolve(RunConfig(workload="moe", model=model, mesh=mesh, devices=devices, **options))  # type: ignore[arg-type]
        workload = host.workload("moe")
        workload.check(config)
        check_model_split(config, workload.units(config), "moe")
    assert message in str(refused.value)


def test_the_plan_splits_each_size_by_its_attention_and_experts() -> None:
    gqa, mla = moe_tp_plan(MODEL_SIZES["moe-tiny"]), dict(moe_tp_plan(MODEL_SIZES["deepseek-tiny"]))
    assert ("attention.wk", "colwise") in gqa and ("feed_forward.shared_expert.w2", "rowwise") in gqa
    assert ("feed_forward.w1", "colwise") not in gqa  # moe-tiny has no dense block
    assert mla["attention.wkv_b"] == "colwise" and mla["attention.wq_b"] == "colwise"
    assert "attention.wkv_a" not in mla and "attention.wq_a" not in mla  # the latents: whole on every rank
    assert mla["feed_forward.w1"] == "colwise" and mla["feed_forward.experts"] == "module"
    assert "feed_forward.router" not in mla  # every rank routes alike


# ---------------------------------------------------------------------------------------------------------------
# real runs: accelbench run, two gloo processes
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("moe-parallel")
    (root / "text.txt").write_bytes(generate_corpus()[:TEXT_BYTES].tobytes())
    (root / "cache").mkdir()
    return root


def run(corpus_dir: Path, out: Path, model: str, *args: str) -> ResultRecord:
    proc = accelbench(
        "run", "--workload", "moe", "--model", model, "--seq-len", "32", "--vocab-size", str(VOCAB),
        "--epochs", "2", "--steps-per-epoch", "2", "--batch-size", "4", "--aux-loss-coef", "1.0", "-q",
        "--no-calibration", "--data", str(corpus_dir / "text.txt"), "--output-dir", str(out), *args,
        env={**os.environ, "ACCELBENCH_CACHE_DIR": str(corpus_dir / "cache")}, timeout=500,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = read_record(next(out.glob("*.json")))
    assert record.outcome.status == "ok", record.outcome.message
    return record


def epoch_losses(record: ResultRecord) -> list[float]:
    assert record.metrics is not None
    return [e.loss for e in record.metrics.epochs if e.loss is not None]


@pytest.mark.parametrize("model", ["moe-tiny", "deepseek-tiny"])
@pytest.mark.parametrize("layout", ["tp", "pp"])
@pytest.mark.slow
def test_tensor_and_pipeline_parallel_moe_train_the_one_process_model(
    corpus_dir: Path, tmp_path: Path, model: str, layout: str
) -> None:
    """--strategy tp / pp on two gloo processes, balance loss weighted 1.0: the epoch losses, held-out losses and
    gradient norms are one process's (fp32), and so are the routing counts, exactly: every tensor-parallel rank
    routes the same tokens and its rank 0 counts them; each pipeline rank counts its own stage's layers. Where the
    experts carry biases (deepseek-tiny), the final biases of every layer are one process's, exactly."""
    reference = corpus_dir / f"single-{model}"
    if not reference.exists():  # one single-process run serves both layouts
        run(corpus_dir, reference, model)
    single = read_record(next(reference.glob("*.json")))
    record = run(corpus_dir, tmp_path, model, "--strategy", layout, "--devices", "2")
    if layout == "tp":
        plan = record.executor["tensor_parallel"]["plan"]
        assert ["feed_forward.experts", "module"] in plan
    else:
        stages = record.executor["pipeline"]["stage_units"]
        assert len(stages) == 2 and all(stage["units"] for stage in stages)
    assert epoch_losses(record) == pytest.approx(epoch_losses(single), abs=1e-5)
    assert record.quality is not None and single.quality is not None
    for mine, theirs in zip(record.quality.epochs, single.quality.epochs, strict=True):
        assert mine.val_loss == pytest.approx(theirs.val_loss, abs=1e-5)
        assert mine.grad_norm == pytest.approx(theirs.grad_norm, rel=1e-4)
    routing, want = record.workload["routing"], single.workload["routing"]
    assert routing["tokens_per_expert_by_layer"] == want["tokens_per_expert_by_layer"]
    # deepseek-tiny balances by expert biases too: every layer's final biases are one process's, exactly (each
    # step moves them by +-0.001, so a load counted wrongly, the pipeline's shape inference say, shows here)
    assert record.workload.get("expert_bias_by_layer") == single.workload.get("expert_bias_by_layer")


def test_estimate_splits_the_blocks_and_counts_expert_tensor_parallelisms_all_reduces(
    corpus_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """moe-tiny (2 layers of 4 experts, top-2, width 64), batch 4 of 32 tokens, fp32. tp=2: each device holds half
    of the blocks' parameters and the whole embedding and head; beside the dense count's b*s*h all-reduces, expert
    tensor parallelism sums b*s*k rows of h over the tp pair twice per MoE layer (forward, backward), 2(n-1)/n of
    each over the link. pp=2: the first rank holds a block and the embedding, the last a block, the final norm and
    the head: the same but for the norm, whose 64 parameters make the last the busier. deepseek-tiny's blocks are counted by their mean (its first block is dense), so the
    total is the model's (to the mean's rounding), not three dense blocks'."""
    from accelbench.estimate import predict
    from accelbench.estimate.facts import meta_facts

    monkeypatch.setenv("ACCELBENCH_CACHE_DIR", str(corpus_dir / "cache"))
    host = get_host()
    options = {"seq_len": 32, "vocab_size": VOCAB}
    base = {"workload": "moe", "model": "moe-tiny", "batch_size": 4, "data": corpus_dir / "text.txt"}
    shape = MODEL_SIZES["moe-tiny"]
    outside = 2 * VOCAB * shape.dim + shape.dim  # embedding, head, final norm
    blocks = shape.parameters(VOCAB) - outside
    tp = host.resolve(RunConfig(**base, workload_options=options, strategy="tp", devices=2))  # type: ignore[arg-type]
    p = predict(tp, meta_facts(host.workload("moe"), tp), device_type="cpu")
    assert p.memory.weights_bytes == 4 * (blocks / 2 + outside)
    experts = [op for op in p.comm if op.axis == "tp" and "routed rows" in op.what]
    assert len(experts) == 1 and experts[0].count == 2 * 2
    assert experts[0].message_bytes == 4 * 32 * 2 * 64 * 4  # b s k rows of h, fp32
    assert experts[0].bus_bytes == experts[0].count * experts[0].message_bytes  # 2 (n-1)/n = 1 at n = 2
    pp = host.resolve(RunConfig(**base, workload_options=options, strategy="pp", devices=2))  # type: ignore[arg-type]
    q = predict(pp, meta_facts(host.workload("moe"), pp), device_type="cpu")
    head = VOCAB * shape.dim + shape.dim
    assert q.memory.weights_bytes == 4 * (blocks / 2 + head)
    assert any(a.startswith("pipeline: the busiest rank is the last") for a in q.assumptions)
    assert {op.axis for op in q.comm} == {"pp"}
    deepseek = host.resolve(RunConfig(**{**base, "model": "deepseek-tiny"}, workload_options=options))  # type: ignore[arg-type]
    facts = meta_facts(host.workload("moe"), deepseek)
    assert facts.transformer is not None
    counted = facts.transformer.layers * facts.transformer.parameters_per_layer
    whole = MODEL_SIZES["deepseek-tiny"].parameters(VOCAB)
    assert counted + facts.transformer.parameters_outside_layers == pytest.approx(
        whole, abs=3
    )  # the mean, floored


def test_estimate_of_expert_parallelism_inside_a_pipeline(
    corpus_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """moe-tiny (2 layers of 4 experts, top-2, width 64), batch 4 of 32 tokens a replica, fp32, --mesh pp=2,ep=2:
    the busier pipeline rank, the last, holds a block with half its experts, the final norm and the head (the first
    the embedding instead); beside the pipeline's sends, its ep group all-reduces the stage's replicated gradients and
    exchanges the block's b*s*k routed rows of h per microbatch, twice in forward and twice in backward ((n-1)/n
    of each over the link). Each ep rank's pipeline is a replica: FLOPs per device are half a replica's. With
    ddp=2 as well the stage's replicas reduce the replicated gradients and the data axis the experts'."""
    from accelbench.estimate import predict
    from accelbench.estimate.facts import meta_facts

    monkeypatch.setenv("ACCELBENCH_CACHE_DIR", str(corpus_dir / "cache"))
    host = get_host()
    config = host.resolve(
        RunConfig(workload="moe", model="moe-tiny", batch_size=4, data=corpus_dir / "text.txt", mesh="pp=2,ep=2",
                  devices=4, workload_options={"seq_len": 32, "vocab_size": VOCAB})  # type: ignore[arg-type]
    )  # fmt: skip
    facts = meta_facts(host.workload("moe"), config)
    p = predict(config, facts, device_type="cpu")
    shape = MODEL_SIZES["moe-tiny"]
    outside = 2 * VOCAB * shape.dim + shape.dim  # embedding, head, final norm
    experts = shape.expert_parameters()
    blocks = shape.parameters(VOCAB) - outside
    held = (blocks - experts // 2) / 2 + VOCAB * shape.dim + shape.dim
    assert p.memory.weights_bytes == 4 * held
    assert sorted((op.op, op.axis) for op in p.comm) == [
        ("all_reduce", "ep"),
        ("all_to_all", "ep"),
        ("sendrecv", "pp"),
    ]
    gradients = next(op for op in p.comm if op.op == "all_reduce")
    assert (
        gradients.message_bytes == 4 * (held - experts // 2 // 2)
        and gradients.bus_bytes == gradients.message_bytes
    )
    exchange = next(op for op in p.comm if op.op == "all_to_all")
    microbatches = config.microbatches or 1
    assert exchange.count == 4 * microbatches  # one MoE block on the stage
    assert exchange.message_bytes == 4 // microbatches * 32 * 2 * 64 * 4  # b s k rows of h, fp32
    assert exchange.bus_bytes == exchange.count * exchange.message_bytes / 2
    assert p.flops_per_step == pytest.approx(facts.flops_per_sample * 4 / 2)
    # ddp=2 beside them: the replicated gradients over the stage's 4 replicas, the held experts' over the data axis
    # (no DDP all-reduce of the whole stage as well); the same sends and exchange. DDP's buckets hold the gradients
    # through the first rank's deeper warm-up: that rank is now the busier (the embedding, without the final norm)
    wider = host.resolve(config.model_copy(update={"mesh": "ddp=2,pp=2,ep=2", "devices": 8}))
    q = predict(wider, meta_facts(host.workload("moe"), wider), device_type="cpu")
    assert q.memory.weights_bytes == p.memory.weights_bytes - 4 * shape.dim
    assert any(a.startswith("pipeline: the busiest rank is the first") for a in q.assumptions)
    reduced = sorted((op.axis, op.ranks, op.message_bytes) for op in q.comm if op.op == "all_reduce")
    assert reduced == [("dp", 2, 4 * experts // 2 // 2), ("dp", 4, gradients.message_bytes - 4 * shape.dim)]
    assert [op for op in q.comm if op.op != "all_reduce"] == [op for op in p.comm if op.op != "all_reduce"]


def test_estimate_of_expert_parallelism_beside_tensor_parallelism(
    corpus_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """moe-tiny (2 layers of 4 experts, top-2, width 64), batch 4 of 32 tokens a replica, fp32, --mesh tp=2,ep=2:
    a device holds half of the blocks' replicated parameters, half of its ep rank's experts (a quarter of all) and
    the whole embedding, final norm and head; beside tensor parallelism's all-reduces (the dense count's b*s*h and
    the experts' routed rows), its ep group all-reduces the replicated gradients and exchanges each tp rank's copy of
    the b*s*k routed rows of h, twice per MoE layer in forward and twice in backward. Each ep rank's tp pair is a
    replica: FLOPs per device are half a replica's."""
    from accelbench.estimate import predict
    from accelbench.estimate.facts import meta_facts

    monkeypatch.setenv("ACCELBENCH_CACHE_DIR", str(corpus_dir / "cache"))
    host = get_host()
    config = host.resolve(
        RunConfig(workload="moe", model="moe-tiny", batch_size=4, data=corpus_dir / "text.txt", mesh="tp=2,ep=2",
                  devices=4, workload_options={"seq_len": 32, "vocab_size": VOCAB})  # type: ignore[arg-type]
    )  # fmt: skip
    facts = meta_facts(host.workload("moe"), config)
    p = predict(config, facts, device_type="cpu")
    shape = MODEL_SIZES["moe-tiny"]
    outside = 2 * VOCAB * shape.dim + shape.dim  # embedding, head, final norm
    experts = shape.expert_parameters()
    blocks = shape.parameters(VOCAB) - outside
    held = (blocks - experts) / 2 + experts / 4 + outside
    assert p.memory.weights_bytes == 4 * held
    assert sorted((op.op, op.axis) for op in p.comm) == [
        ("all_reduce", "ep"),
        ("all_reduce", "tp"),
        ("all_reduce", "tp"),
        ("all_to_all", "ep"),
    ]
    gradients = next(op for op in p.comm if op.op == "all_reduce" and op.axis == "ep")
    assert gradients.message_bytes == 4 * (held - experts / 4)
    exchange = next(op for op in p.comm if op.op == "all_to_all")
    assert exchange.count == 4 * 2 and exchange.message_bytes == 4 * 32 * 2 * 64 * 4  # b s k rows of h, fp32
    assert exchange.bus_bytes == exchange.count * exchange.message_bytes / 2
    assert p.flops_per_step == pytest.approx(facts.flops_per_sample * 4 / 2)
    # ddp=2 beside them: the replicated gradients over the 4 replicas of a tp coordinate, the held experts' over
    # the data axis; the same memory and exchange
    wider = host.resolve(config.model_copy(update={"mesh": "ddp=2,tp=2,ep=2", "devices": 8}))
    q = predict(wider, meta_facts(host.workload("moe"), wider), device_type="cpu")
    assert q.memory.weights_bytes == p.memory.weights_bytes
    reduced = sorted(
        (op.axis, op.ranks, op.message_bytes) for op in q.comm if op.op == "all_reduce" and op.axis != "tp"
    )
    assert reduced == [("dp", 2, 4 * experts / 4), ("dp", 4, gradients.message_bytes)]
    # fsdp=2 instead: 1/4 of every parameter of the tp slice (the replicated ones over the 4 replicas, the held
    # experts over the data axis), FSDP's gathers and reduce-scatters counted over the replicas; the same exchange
    sharded = host.resolve(config.model_copy(update={"mesh": "fsdp=2,tp=2,ep=2", "devices": 8}))
    f = predict(sharded, meta_facts(host.workload("moe"), sharded), device_type="cpu")
    assert f.memory.weights_bytes == 4 * (blocks / 2 + outside) / 4
    assert sorted((op.op, op.axis, op.ranks) for op in f.comm if op.axis != "tp") == [
        ("all_gather", "dp", 4),
        ("all_to_all", "ep", 2),
        ("reduce_scatter", "dp", 4),
    ]
    assert next(op for op in f.comm if op.op == "all_to_all") == exchange


def one_process_reference(record: ResultRecord, replicas: int) -> list[float]:
    """The epoch losses a data-parallel run of ``replicas`` replicas reports (its rank 0's share of each step),
    computed by one process training the same model on the replicas' shares together (the global batch, clipped
    to 1.0, the workload's AdamW)."""
    job = get_host().workload("moe").build(record.config)
    model = job.model.train()
    optimizer = job.make_optimizer(model, torch.device("cpu"), "foreach")
    out = []
    for epoch in range(len(epoch_losses(record))):
        reported = []
        for parts in zip(*(job.data.batches(epoch, r, replicas) for r in range(replicas)), strict=True):
            with torch.no_grad():
                reported.append(model(*parts[0]).item())
            model(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        out.append(sum(reported) / len(reported))
    return out


@pytest.mark.parametrize("mesh", ["dp=2,tp=2", "ddp=2,pp=2"])
@pytest.mark.slow
def test_tensor_and_pipeline_parallel_moe_compose_with_a_data_axis(
    corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mesh: str
) -> None:
    """Four gloo processes: FSDP2 over tp=2 (the experts' DTensor slices sharded again over the data axis), and DDP
    over two-stage pipelines. The losses are one process's on the two replicas' batches together, and the routing
    counts every replica's tokens once."""
    record = run(corpus_dir, tmp_path, "moe-tiny", "--mesh", mesh, "--devices", "4")
    monkeypatch.setenv("ACCELBENCH_CACHE_DIR", str(corpus_dir / "cache"))
    assert epoch_losses(record) == pytest.approx(one_process_reference(record, replicas=2), abs=1e-5)
    by_layer = record.workload["routing"]["tokens_per_expert_by_layer"]
    assert [sum(layer) for layer in by_layer] == [
        2 * 2 * 2 * 4 * 32 * 2
    ] * 2  # epochs, steps, replicas, b s k


def one_process_on_the_global_batch(
    record: ResultRecord, replicas: int
) -> tuple[list[float], list[float], list[list[int]], list[list[float]] | None]:
    """What one process training the same model on the ``replicas`` shares of each step together (the global
    batch, clipped to 1.0, the workload's AdamW) gives: the epoch losses (each step's loss on the global batch), the
    held-out losses after each epoch (every replica's held-out batches, as the run's quality checks take them) and
    the tokens routed to each expert of each layer by the training steps, and the final expert biases (None where
    the model has none)."""
    job = get_host().workload("moe").build(record.config)
    model = job.model.train()
    optimizer = job.make_optimizer(model, torch.device("cpu"), "foreach")
    assert job.validation is not None
    losses, held_out = [], []
    for epoch in range(len(epoch_losses(record))):
        losses.append(epoch_on_the_global_batch(job, model, optimizer, epoch, replicas))
        model.eval()
        total, samples = 0.0, 0
        with torch.no_grad():
            for r in range(replicas):
                for index, (x, y) in enumerate(job.validation.batches(0, r, replicas)):
                    if index >= record.config.eval_batches:
                        break
                    total, samples = total + model(x, y).item() * x.shape[0], samples + x.shape[0]
        model.train()
        held_out.append(total / samples)
    routed = [[int(c) for c in layer.routed.tolist()] for layer in model.moe_layers()]  # type: ignore[union-attr]
    biases = [
        [float(b) for b in layer.expert_bias.tolist()]
        for layer in model.moe_layers()
        if layer.expert_bias is not None
    ]
    return losses, held_out, routed, biases or None


def assert_trains_as_one_process(
    record: ResultRecord, corpus_dir: Path, monkeypatch: pytest.MonkeyPatch, replicas: int
) -> None:
    """The run's epoch and held-out losses are one process's on the ``replicas`` shares together (fp32, 1e-5), its
    gradient probe gave a finite norm every epoch, and its routing counts (every replica's tokens once) and final
    expert biases are that process's, exactly."""
    monkeypatch.setenv("ACCELBENCH_CACHE_DIR", str(corpus_dir / "cache"))  # the tokenizer the run trained
    losses, held_out, routed, biases = one_process_on_the_global_batch(record, replicas)
    assert epoch_losses(record) == pytest.approx(losses, abs=1e-5, rel=0)
    assert record.quality is not None
    assert [e.val_loss for e in record.quality.epochs] == pytest.approx(held_out, abs=1e-5, rel=0)
    assert all(e.grad_norm is not None and math.isfinite(e.grad_norm) for e in record.quality.epochs)
    assert record.workload["routing"]["tokens_per_expert_by_layer"] == routed
    top_k = record.workload["routing"]["top_k"]
    assert all(
        sum(layer) == 2 * 2 * replicas * 4 * 32 * top_k for layer in routed
    )  # epochs, steps, replicas, b s k
    assert record.workload.get("expert_bias_by_layer") == biases


@pytest.mark.parametrize(
    "model, mesh, replicas",
    [
        ("moe-tiny", "pp=2,ep=2", 2),
        ("deepseek-tiny", "pp=2,ep=2", 2),
        ("deepseek-tiny", "ddp=2,pp=2,ep=2", 4),
        ("deepseek-tiny", "fsdp=2,pp=2,ep=2", 4),
    ],
)
@pytest.mark.slow
def test_expert_parallelism_composes_with_a_pipeline(
    corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: str, mesh: str, replicas: int
) -> None:
    """--mesh pp=2,ep=2 on four gloo processes: two pipelines, each on its own share of the batch, whose stages
    each keep half of their MoE layers' experts and exchange tokens with the other pipeline's same stage (balance
    loss weighted 1.0, added in backward by each stage); with ddp=2 as well, eight processes and four pipelines, the
    experts' gradients summed over the data axis too. The epoch and held-out losses are one process's on the
    pipelines' batches together (fp32), and the routing counts are that process's, exactly; so are the final expert
    biases where the model balances by them too (deepseek-tiny: the loads summed over every rank). With fsdp=2 in
    place of ddp=2, FSDP2 shards each stage over its four replicas and the held experts over the data axis."""
    devices = str(ParallelDims.from_mesh(mesh).world)
    # no tensor-peak measurement: its extra step after the epochs would move the biases once more
    record = run(corpus_dir, tmp_path, model, "--mesh", mesh, "--devices", devices, "--no-tensor-peak")
    ep = record.executor["expert_parallel"]
    experts = MODEL_SIZES[model].n_experts
    assert ep["size"] == 2 and ep["experts_per_rank"] == experts // 2
    assert len(record.executor["pipeline"]["stage_units"]) == 2
    if mesh.startswith("fsdp"):  # FSDP2 beside ep: the units over the stage's replicas, the experts over dp
        assert "over the stage's dp x ep replicas" in record.executor["data_parallel"]["how"]
    assert_trains_as_one_process(record, corpus_dir, monkeypatch, replicas)


@pytest.mark.parametrize(
    "model, mesh, replicas",
    [
        ("moe-tiny", "tp=2,ep=2", 2),
        ("deepseek-tiny", "tp=2,ep=2", 2),
        ("moe-tiny", "ddp=2,tp=2,ep=2", 4),
        ("moe-tiny", "fsdp=2,tp=2,ep=2", 4),
        ("deepseek-tiny", "pp=2,tp=2,ep=2", 2),
    ],
)
@pytest.mark.slow
def test_expert_parallelism_composes_with_tensor_parallelism(
    corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: str, mesh: str, replicas: int
) -> None:
    """--mesh tp=2,ep=2 on four gloo processes: two ep ranks, each a tensor-parallel pair training its own share of
    the batch; every MoE layer keeps half its experts per ep rank, each of them split over the pair's hidden width,
    and each tp rank exchanges tokens with the other ep rank of its tp coordinate. With ddp=2 (eight processes) the
    replicated gradients are averaged over the four replicas of each tp coordinate and the experts' over the data
    axis (fsdp=2: FSDP2 shards the units over those replicas and the held experts over the data axis); with pp=2
    (eight) each replica is a two-stage pipeline of tensor-parallel pairs. The epoch and held-out
    losses are one process's on the replicas' batches together (fp32; clipping at 1.0 reads the global gradient norm,
    so a norm summed over the wrong ranks shows in the losses), the routing counts are its, exactly (each pair's tp
    rank 0 counts), and so are the final expert biases (deepseek-tiny)."""
    devices = str(ParallelDims.from_mesh(mesh).world)
    record = run(corpus_dir, tmp_path, model, "--mesh", mesh, "--devices", devices, "--no-tensor-peak")
    ep = record.executor["expert_parallel"]
    assert ep["size"] == 2 and ep["experts_per_rank"] == MODEL_SIZES[model].n_experts // 2
    assert "over the tp axis (2 ranks" in ep["tensor_parallel"]
    assert ["feed_forward.experts", "module"] in record.executor["tensor_parallel"]["plan"]
    if mesh.startswith("fsdp"):
        # FSDP2 beside ep: the units over the replicas of a tp coordinate, the experts over dp
        assert "over the stage's dp x ep replicas" in record.executor["data_parallel"]["how"]
    assert_trains_as_one_process(record, corpus_dir, monkeypatch, replicas)
