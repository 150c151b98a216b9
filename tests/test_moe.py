"""The mixture-of-experts workload: the routed feed-forward computes what its definition says (top-k, renormalised
gates, shared expert, Switch's balance loss), the published shapes have their published parameter counts, the FLOPs
count the active parameters (torch's counter agrees), and real CPU runs through `accelbench run`: single process with
the routing balance in the record, DDP and FSDP on two gloo processes, and expert parallelism (ep=2 on two processes,
ddp=2,ep=2 and FSDP's dp=2,ep=2 on four) training exactly the one-process model on the same global batch. Bad meshes are refused."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
from core_support import accelbench, accelbench_here, epoch_on_the_global_batch, run_ok

from accelbench.config import RunConfig
from accelbench.engine.parallel.mesh import check_model_split
from accelbench.errors import ConfigError
from accelbench.parallel_dims import ParallelDims, parse_mesh
from accelbench.plugins import get_host
from accelbench.results import ResultRecord, read_record
from accelbench.workloads.gpt.data import generate_corpus
from accelbench.workloads.moe import FLOPS_FORMULA, MLA_FLOPS_FORMULA, MODEL_SIZES, MoEShape, routing_balance

pytest.importorskip("tokenizers")

from accelbench.workloads.llama.model import FeedForward  # noqa: E402
from accelbench.workloads.moe import experts_kernel_ran  # noqa: E402
from accelbench.workloads.moe.model import (  # noqa: E402
    DeepSeekFeedForward,
    GroupedExperts,
    LatentAttention,
    MoE,
    MoEConfig,
    MoEFeedForward,
    SigmoidRouter,
    grouped_mm_support,
    padded_groups,
    swiglu,
)

VOCAB = 512
TEXT_BYTES = 200_000
# --no-calibration: each module's private cache (for its tokenizer) would have every run calibrate the host again
TINY = ["--workload", "moe", "--model", "moe-tiny", "--seq-len", "32", "--vocab-size", str(VOCAB),
        "--epochs", "2", "--steps-per-epoch", "2", "-q", "--no-calibration"]  # fmt: skip


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("moe")
    (root / "text.txt").write_bytes(generate_corpus()[:TEXT_BYTES].tobytes())
    (root / "cache").mkdir()
    return root


def cache_of(corpus_dir: Path) -> dict[str, str]:
    """The module's cache (its tokenizer), as the variable a run reads."""
    return {"ACCELBENCH_CACHE_DIR": str(corpus_dir / "cache")}


def env_of(corpus_dir: Path) -> dict[str, str]:
    return {**os.environ, **cache_of(corpus_dir)}


def run(corpus_dir: Path, out: Path, *args: str) -> ResultRecord:
    data = ["--data", str(corpus_dir / "text.txt")]
    run_ok(*TINY, *data, *args, "--output-dir", str(out), env=cache_of(corpus_dir), timeout=500)
    files = sorted(out.glob("*.json"))
    assert len(files) == 1, files
    record = read_record(files[0])
    assert record.outcome.status == "ok", record.outcome.message
    return record


def losses(record: ResultRecord) -> list[float]:
    assert record.metrics is not None
    return [e.loss for e in record.metrics.epochs if e.loss is not None]


def tiny_config(**kw: object) -> MoEConfig:
    values: dict[str, object] = {"n_layers": 2, "dim": 32, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 48,
                                 "vocab_size": 97, "seq_len": 16, "n_experts": 4, "top_k": 2, "shared_experts": 1}  # fmt: skip
    return MoEConfig(**{**values, **kw})  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------------------------------------------


def test_the_routed_feed_forward_is_top_k_experts_with_renormalised_gates_plus_the_shared_expert() -> None:
    """Token by token, by the definition: softmax over the router's scores, the top k kept and their gates scaled to
    sum to 1, each chosen expert's SwiGLU weighted by its gate, plus the shared expert."""
    torch.manual_seed(0)
    cfg = tiny_config()
    layer = MoEFeedForward(cfg)
    for w in (layer.experts.w1, layer.experts.w2, layer.experts.w3):
        torch.nn.init.normal_(w, std=0.1)
    x = torch.randn(3, 5, cfg.dim)
    y = layer(x)
    assert layer.shared_expert is not None
    for token, out in zip(x.reshape(-1, cfg.dim), y.reshape(-1, cfg.dim), strict=True):
        probs = layer.router(token).softmax(-1)
        top = probs.topk(cfg.top_k)
        gates = top.values / top.values.sum()
        expected = layer.shared_expert(token)
        for gate, e in zip(gates, top.indices.tolist(), strict=True):
            expected = (
                expected
                + gate * swiglu(token[None], layer.experts.w1[e], layer.experts.w3[e], layer.experts.w2[e])[0]
            )
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    assert (
        layer.routed is not None and layer.routed.sum().item() == 15 * cfg.top_k
    )  # counted: a training forward


def test_the_balance_loss_is_switchs_per_sequence_and_one_when_even() -> None:
    """E * sum_i f_i P_i per sequence, averaged over the batch; f the share of the top-k choices, P the mean
    probability. A router that scores every expert alike gives P = 1/E, so the loss is sum f_i = 1."""
    torch.manual_seed(1)
    cfg = tiny_config(shared_experts=0)
    layer = MoEFeedForward(cfg)
    torch.nn.init.normal_(layer.experts.w1)
    x = torch.randn(2, 6, cfg.dim)
    layer(x)
    probs = layer.router(x).softmax(-1)  # (batch, time, experts)
    chosen = probs.topk(cfg.top_k, dim=-1).indices
    expected = []
    for b in range(2):
        share = torch.stack([(chosen[b] == i).sum() for i in range(cfg.n_experts)]).float() / (cfg.top_k * 6)
        expected.append(cfg.n_experts * (share * probs[b].mean(0)).sum())
    assert layer.aux_loss is not None
    torch.testing.assert_close(layer.aux_loss, torch.stack(expected).mean())
    torch.nn.init.zeros_(layer.router.weight)
    layer(x)
    assert layer.aux_loss.item() == pytest.approx(1.0)


def test_the_model_adds_the_weighted_balance_loss_and_counts_only_training_steps() -> None:
    torch.manual_seed(2)
    with_aux, without = MoE(tiny_config(aux_loss_coef=0.5)), MoE(tiny_config(aux_loss_coef=0.0))
    without.load_state_dict(with_aux.state_dict())
    tokens = torch.randint(0, 97, (2, 16))
    gap = with_aux(tokens, tokens) - without(tokens, tokens)
    aux = sum(m.aux_loss.detach() for m in with_aux.moe_layers() if m.aux_loss is not None)
    assert gap.item() == pytest.approx(0.5 * float(aux), rel=1e-5)
    for m in with_aux.moe_layers():
        m.routed = None
    with torch.no_grad():
        with_aux(tokens, tokens)
    assert all(m.routed is None for m in with_aux.moe_layers())  # an evaluation is not a training step


@pytest.mark.parametrize(
    "name, total, active",
    [("mixtral-8x7b", 46.70, 12.88), ("gpt-oss-20b", 20.91, 4.19)],
)
def test_the_published_shapes_have_their_published_parameter_counts(
    name: str, total: float, active: float
) -> None:
    """Mixtral 8x7B: 46.7B parameters, 12.9B active (Mistral AI); gpt-oss-20b: 20.9B (OpenAI; its 3.6B active
    leaves out the embedding matrix we count with the active ones)."""
    shape = MODEL_SIZES[name]
    assert shape.parameters(shape.vocab_size) / 1e9 == pytest.approx(total, abs=0.01)
    assert shape.active_parameters(shape.vocab_size) / 1e9 == pytest.approx(active, abs=0.01)
    assert shape.parameters(shape.vocab_size) - shape.active_parameters(shape.vocab_size) == (
        shape.n_layers * (shape.n_experts - shape.top_k) * 3 * shape.dim * shape.ffn_dim
    )  # the experts a token does not visit


def test_the_model_has_the_shapes_parameters_and_flops_count_active_parameters_as_torch_does() -> None:
    """6*N_active + 12*L*q*s per token: torch's counter (every matmul that ran, the routed experts on the rows
    routed to them) times 3, within the norms' weights (in N, not matmuls). The loop kernel: torch 2.13's counter
    has no formula for torch._grouped_mm (it would count no expert's matmul)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    shape = MoEShape(2, 64, 4, 2, 96, 4, 2, 1, 500, 128, 10_000.0)
    seq_len, batch = 128, 2
    model = MoE(tiny_config(dim=64, ffn_dim=96, vocab_size=500, seq_len=seq_len, experts_kernel="loop"))
    assert model.num_parameters() == shape.parameters(500)
    tokens = torch.randint(0, 500, (batch, seq_len))
    counter = FlopCounterMode(display=False)
    with counter, sdpa_kernel(SDPBackend.MATH):
        model(tokens, tokens)
    per_token = 3 * counter.get_total_flops() / (batch * seq_len)
    assert shape.flops_per_token(500, seq_len) == pytest.approx(per_token, rel=0.002)


def test_padded_groups_pad_each_expert_to_the_alignment_without_moving_the_order() -> None:
    """Counts 3, 0, 5, 2 padded to 4 rows: groups at 0-3, (empty), 4-11, 12-15; offsets are the padded ends."""
    positions, offs, length = padded_groups(torch.tensor([3, 0, 5, 2]), 10, 4)
    assert positions.tolist() == [0, 1, 2, 4, 5, 6, 7, 8, 12, 13]
    assert offs.dtype == torch.int32 and offs.tolist() == [4, 4, 12, 16]
    assert length == 10 + 4 * 3  # the worst case, known without reading the counts
    positions, offs, length = padded_groups(torch.tensor([0, 0, 0]), 0, 8)
    assert positions.tolist() == [] and offs.tolist() == [0, 0, 0] and length == 21


def test_where_the_grouped_kernel_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch._grouped_mm's rules: CUDA sm90+ in bf16; CPU in fp32/bf16/fp16; rows of a multiple of 16 bytes."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert grouped_mm_support(cpu, torch.float32, (32, 48)) is None
    assert grouped_mm_support(cpu, torch.bfloat16, (32, 48)) is None
    assert "not torch.float64" in str(grouped_mm_support(cpu, torch.float64, (32, 48)))
    assert grouped_mm_support(cpu, torch.float32, (32, 50)) == (
        "torch._grouped_mm needs rows of a multiple of 16 bytes: width 50 is not a multiple of 4 torch.float32 "
        "elements"
    )
    assert "multiple of 8 torch.bfloat16" in str(grouped_mm_support(cpu, torch.bfloat16, (36, 48)))
    assert "device type 'xpu'" in str(grouped_mm_support(torch.device("xpu"), torch.bfloat16, (32, 48)))
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert "compute capability 9.0 or above, the device has 8.0" in str(
        grouped_mm_support(cuda, torch.bfloat16, (32, 48))
    )
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert grouped_mm_support(cuda, torch.bfloat16, (4096, 14336)) is None
    assert "bfloat16 only, not torch.float32" in str(grouped_mm_support(cuda, torch.float32, (4096, 14336)))
    monkeypatch.setattr(torch.version, "hip", "7.0")
    assert "ROCm" in str(grouped_mm_support(cuda, torch.bfloat16, (4096, 14336)))


def expert_pair(dtype: torch.dtype, experts: int = 4) -> tuple[GroupedExperts, GroupedExperts]:
    torch.manual_seed(0)
    grouped = GroupedExperts(experts, 32, 48, "grouped")
    for w in grouped.parameters():
        torch.nn.init.normal_(w, std=0.2)
    grouped = grouped.to(dtype)
    loop = GroupedExperts(experts, 32, 48, "loop").to(dtype)
    loop.load_state_dict(grouped.state_dict())
    return grouped, loop


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"])
@pytest.mark.parametrize("counts", [[5, 0, 9, 2], [0, 0, 0, 0], [0, 7, 0, 0]], ids=["uneven", "none", "one"])
def test_the_grouped_kernel_equals_the_loop_in_output_and_every_gradient(
    dtype: torch.dtype, tol: float, counts: list[int]
) -> None:
    """Uneven groups (an expert with no rows; no rows at all): the same rows out, the same gradient of the rows
    and of each expert's three weights, under a loss whose gradient is not all ones."""
    grouped, loop = expert_pair(dtype)
    rows = torch.randn(sum(counts), 32, dtype=dtype)
    weights = torch.randn(sum(counts), 32, dtype=dtype)
    results = []
    for experts in (grouped, loop):
        x = rows.clone().requires_grad_()
        out = experts(x, torch.tensor(counts))
        (out * weights).sum().backward()
        results.append((out.detach(), x.grad, *(p.grad for p in experts.parameters())))
    assert (grouped.ran, loop.ran) == ("grouped", "loop")
    for a, b in zip(*results, strict=True):
        assert a is not None and b is not None
        torch.testing.assert_close(a, b, atol=tol, rtol=tol)


def test_the_grouped_kernel_runs_an_expert_parallel_slice_and_casts_as_autocast_does() -> None:
    """A rank's slice of the experts (shard_experts' clone of a slice) runs grouped on its own counts; under CPU
    autocast both kernels compute in bf16 from fp32 weights."""
    torch.manual_seed(0)
    layer = MoEFeedForward(tiny_config(n_experts=4, experts_kernel="grouped"))
    for w in layer.experts.parameters():
        torch.nn.init.normal_(w, std=0.2)
    whole = [p.detach().clone() for p in layer.experts.parameters()]
    layer.shard_experts(None, 1, 2)  # experts 2 and 3; no exchange is run here
    rows, counts = torch.randn(7, 32), torch.tensor([4, 3])
    expected = torch.cat(
        [
            swiglu(r, whole[0][e], whole[1][e], whole[2][e])
            for r, e in zip(rows.split([4, 3]), (2, 3), strict=True)
        ]
    )
    torch.testing.assert_close(layer.experts(rows, counts), expected)
    grouped, loop = expert_pair(torch.float32)
    rows, counts = torch.randn(11, 32), torch.tensor([3, 0, 6, 2])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a, b = grouped(rows, counts), loop(rows, counts)
    assert a.dtype == b.dtype == torch.bfloat16
    torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)


def test_grouped_is_refused_where_it_cannot_run_and_auto_falls_back_to_the_loop() -> None:
    rows, counts = torch.randn(5, 32, dtype=torch.float64), torch.tensor([2, 3])
    with pytest.raises(ConfigError, match=r"--experts-kernel grouped cannot run here: torch._grouped_mm on CPU "
                       r"computes in float32, bfloat16 or float16, not torch.float64; use --experts-kernel auto"):  # fmt: skip
        GroupedExperts(2, 32, 48, "grouped").double()(rows, counts)
    model = MoE(tiny_config(ffn_dim=50))  # 50 fp32 elements: 200 bytes, not a multiple of 16
    assert experts_kernel_ran(model) == {"experts_kernel": None, "experts_kernel_not_grouped": None}
    model(torch.randint(0, 97, (2, 16)), torch.randint(0, 97, (2, 16)))
    assert experts_kernel_ran(model) == {
        "experts_kernel": "loop",
        "experts_kernel_not_grouped": "torch._grouped_mm needs rows of a multiple of 16 bytes: width 50 is not a "
        "multiple of 4 torch.float32 elements",
    }
    model = MoE(tiny_config())
    model(torch.randint(0, 97, (2, 16)), torch.randint(0, 97, (2, 16)))
    assert experts_kernel_ran(model) == {"experts_kernel": "grouped", "experts_kernel_not_grouped": None}


def test_the_model_trains_the_same_with_either_kernel() -> None:
    """Two AdamW steps of the whole model (router, shared expert, balance loss): the same losses and weights."""
    results = []
    for kernel in ("grouped", "loop"):
        torch.manual_seed(0)
        model = MoE(tiny_config(experts_kernel=kernel))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        tokens = torch.randint(0, 97, (4, 16), generator=torch.Generator().manual_seed(1))
        losses = []
        for _ in range(2):
            loss = model(tokens[:, :-1], tokens[:, 1:])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        results.append((losses, [p.detach().clone() for p in model.parameters()]))
    assert results[0][0] == pytest.approx(results[1][0], abs=1e-5)
    for a, b in zip(results[0][1], results[1][1], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_routing_balance_sums_layers_and_takes_max_over_mean() -> None:
    balance = routing_balance([[6, 2, 2, 2], [3, 3, 3, 3]], top_k=2)
    assert balance["tokens_per_expert"] == [9, 5, 5, 5]
    assert balance["imbalance_by_layer"] == [2.0, 1.0] and balance["worst_layer_imbalance"] == 2.0
    assert balance["imbalance"] == pytest.approx(9 / 6)


# ---------------------------------------------------------------------------------------------------------------
# the mesh
# ---------------------------------------------------------------------------------------------------------------


def test_the_expert_axis_in_the_mesh() -> None:
    assert parse_mesh("ep=2") == {"ep": 2} and parse_mesh("ep=2,ddp=2") == {"ddp": 2, "ep": 2}
    layout = ParallelDims.from_mesh("ddp=2,ep=2")
    assert (layout.world, layout.order) == (4, ("dp", "ep"))
    assert layout.groups("ep") == [[0, 1], [2, 3]] and layout.groups("dp") == [[0, 2], [1, 3]]
    assert layout.describe()["sizes"] == {"dp": 2, "tp": 1, "pp": 1, "ep": 2}
    assert "ep" not in ParallelDims.from_mesh("dp=2,tp=2").describe()["sizes"]
    config = RunConfig(workload="moe", model="moe-tiny", mesh="ep=2", devices=2)
    assert (config.strategy, config.mesh) == (
        "mesh",
        "ep=2",
    )  # an expert axis alone runs on the mesh executor
    # with a pipeline: each stage's ep group is the ranks holding that stage
    piped = ParallelDims.of(RunConfig(workload="moe", model="moe-tiny", mesh="pp=2,ep=2", devices=4))
    assert piped.groups("ep") == [[0, 1], [2, 3]] and piped.groups("pp") == [[0, 2], [1, 3]]


@pytest.mark.parametrize(
    "mesh, devices, workload, message",
    [
        ("ep=2", 2, "llama", "workload 'llama' has none; use --workload moe"),
        (
            "ep=3",
            3,
            "moe",
            "4 experts per layer do not divide over ep=3 ranks; an ep size must divide 4: 2, 4",
        ),
    ],
)
def test_bad_expert_meshes_are_refused(mesh: str, devices: int, workload: str, message: str) -> None:
    host = get_host()
    with pytest.raises((ConfigError, ValueError), match=message.replace("(", r"\(").replace(")", r"\)")):
        config = host.resolve(RunConfig(workload=workload, mesh=mesh, devices=devices))
        check_model_split(config, host.workload(workload).units(config), workload)


def test_bad_command_lines_exit_2(
    corpus_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCELBENCH_CACHE_DIR", str(corpus_dir / "cache"))
    for args, message in (
        (["--mesh", "ep=3", "--devices", "3"], "do not divide over ep=3"),
        (["--seq-len", "4096"], "above moe-tiny's context"),
        (["--aux-loss-coef", "2"], "--aux-loss-coef"),
    ):
        code, stderr = accelbench_here(capsys, "run", *TINY, "--data", str(corpus_dir / "text.txt"), *args,
                                       "--output-dir", str(tmp_path))  # fmt: skip
        assert code == 2, (args, stderr[-2000:])
        assert message in stderr, stderr[-2000:]
    assert not list(tmp_path.glob("*.json"))


# ---------------------------------------------------------------------------------------------------------------
# real runs
# ---------------------------------------------------------------------------------------------------------------


def test_a_published_shape_is_counted_from_its_shape_and_refused_where_it_cannot_fit(
    corpus_dir: Path, tmp_path: Path
) -> None:
    """mixtral-8x7b (46.4 B parameters at a 512-token vocabulary, 173 GiB of fp32 weights): counted from its shape
    by the preflight, every expert included, and refused (exit 2) on a host without the memory, before anything is
    built."""
    proc = accelbench("run", "--workload", "moe", "--model", "mixtral-8x7b", "--seq-len", "64", "--batch-size", "1",
                      "--vocab-size", str(VOCAB), "--data", str(corpus_dir / "text.txt"), "--output-dir",
                      str(tmp_path), "-q", env=env_of(corpus_dir))  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    counted = MODEL_SIZES["mixtral-8x7b"].parameters(VOCAB)  # its experts, with --vocab-size 512
    assert f"moe mixtral-8x7b: {counted:,} parameters" in proc.stderr, proc.stderr[-2000:]


def test_moe_trains_single_process_and_records_routing(corpus_dir: Path, tmp_path: Path) -> None:
    record = run(corpus_dir, tmp_path, "--batch-size", "8")
    m = record.metrics
    assert m is not None and [e.steps for e in m.epochs] == [2, 2]
    assert m.flops_formula == FLOPS_FORMULA and "N_active" in m.flops_formula
    shape = MODEL_SIZES["moe-tiny"]
    assert m.flops_per_sample == shape.flops_per_token(VOCAB, 32) * 32
    assert losses(record)[0] == pytest.approx(math.log(VOCAB), rel=0.05)
    w = record.workload
    assert w["parameters"] == shape.parameters(VOCAB) and w["active_parameters"] == shape.active_parameters(
        VOCAB
    )
    assert w["parameters"] > w["active_parameters"]
    assert (w["experts_kernel_option"], w["experts_kernel"]) == ("auto", "grouped")  # fp32, widths 64 and 128
    routing = w["routing"]
    per_layer = 4 * 8 * 32 * shape.top_k  # 4 timed steps of 8 sequences of 32 tokens, each to top-k experts
    assert [sum(layer) for layer in routing["tokens_per_expert_by_layer"]] == [per_layer] * shape.n_layers
    assert sum(routing["tokens_per_expert"]) == per_layer * shape.n_layers
    assert routing["imbalance"] == max(routing["tokens_per_expert"]) / (per_layer * shape.n_layers / 4)
    import io

    from rich.console import Console

    from accelbench.display import summary_table

    console = Console(width=200, record=True, file=io.StringIO())
    console.print(summary_table(record))
    counts = ", ".join(f"{n:,}" for n in routing["tokens_per_expert"])
    assert f"tokens per expert {counts}" in console.export_text()  # the run summary's routing row
    assert record.workload_identity == {"model": "moe-tiny", "seq_len": 32, "vocab_size": VOCAB,
                                        "aux_loss_coef": 0.01}  # fmt: skip


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
@pytest.mark.slow
def test_moe_trains_data_parallel_on_two_processes(corpus_dir: Path, tmp_path: Path, strategy: str) -> None:
    record = run(corpus_dir, tmp_path, "--strategy", strategy, "--devices", "2", "--batch-size", "8")
    assert record.world_size == 2 and record.executor["strategy"] == strategy
    routing = record.workload["routing"]  # both ranks' tokens
    assert sum(routing["tokens_per_expert_by_layer"][0]) == 2 * 4 * 8 * 32 * 2


def one_process_losses(record: ResultRecord) -> list[float]:
    """The epoch losses of one process training the same model (same seed) on the global batch: every rank's
    share of each step concatenated, the step a single device takes (clip to 1.0, the workload's AdamW)."""
    return one_process_run(record)[0]


def one_process_run(record: ResultRecord) -> tuple[list[float], torch.nn.Module]:
    """:func:`one_process_losses`, and the model trained."""
    host = get_host()
    config = record.config
    job = host.workload("moe").build(config)
    model = job.model.train()
    optimizer = job.make_optimizer(model, torch.device("cpu"), "foreach")
    out = [
        epoch_on_the_global_batch(job, model, optimizer, epoch, record.world_size)
        for epoch in range(len(record.metrics.epochs) if record.metrics else 0)
    ]
    return out, model


@pytest.mark.parametrize(
    "mesh, devices",
    [("ep=2", 2), ("ddp=2,ep=2", 4), ("dp=2,ep=2", 4)],
    ids=["ep=2", "ddp=2,ep=2", "fsdp=2,ep=2"],
)
@pytest.mark.slow
def test_expert_parallel_training_is_one_process_training_on_the_global_batch(
    corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mesh: str, devices: int
) -> None:
    """Each rank keeps half of every layer's experts and exchanges tokens by all_to_all: the losses are those of one
    process training the same model on the ranks' batches together (fp32, the same seed)."""
    record = run(corpus_dir, tmp_path, "--mesh", mesh, "--devices", str(devices), "--batch-size", "4")
    ep = record.executor["expert_parallel"]
    assert ep["size"] == 2 and ep["experts_per_rank"] == 2
    assert record.executor["mesh"]["sizes"]["ep"] == 2
    assert record.workload["experts_kernel"] == "grouped"  # each rank's slice of the experts, fp32 on a CPU
    assert sum(record.workload["routing"]["tokens_per_expert_by_layer"][0]) == devices * 4 * 4 * 32 * 2
    assert record.quality is not None and all(
        e.val_loss is not None and e.grad_norm is not None and math.isfinite(e.grad_norm)
        for e in record.quality.epochs
    )  # the held-out loss and the gradient probe exchange tokens too
    monkeypatch.setenv("ACCELBENCH_CACHE_DIR", str(corpus_dir / "cache"))  # the tokenizer the run trained
    assert losses(record) == pytest.approx(one_process_losses(record), abs=1e-5, rel=0)


# ---------------------------------------------------------------------------------------------------------------
# accelbench estimate
# ---------------------------------------------------------------------------------------------------------------


def test_estimate_counts_all_experts_in_memory_active_ones_in_flops_and_the_all_to_all_under_ep(
    corpus_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """moe-tiny (2 layers of 4 experts of width 64 x 128, top-2), batch 4 of 32 tokens, fp32 on --mesh ddp=2,ep=2:
    each device holds the replicated parameters and 2 of each layer's 4 experts; its exchange moves b*s*k rows of h
    fp32 values, 4 times per layer (2 forward, 2 backward), (n-1)/n of them over the link."""
    from accelbench.estimate import predict
    from accelbench.estimate.facts import meta_facts

    monkeypatch.setenv("ACCELBENCH_CACHE_DIR", str(corpus_dir / "cache"))
    host = get_host()
    options = {"seq_len": 32, "vocab_size": VOCAB}
    base = {"workload": "moe", "model": "moe-tiny", "batch_size": 4, "data": corpus_dir / "text.txt"}
    single = host.resolve(RunConfig(**base, workload_options=options))  # type: ignore[arg-type]
    facts = meta_facts(host.workload("moe"), single)
    shape = MODEL_SIZES["moe-tiny"]
    experts = shape.expert_parameters()
    assert experts == 2 * 4 * 3 * 64 * 128 and facts.expert_parameters == experts
    assert (
        facts.active_parameters == shape.active_parameters(VOCAB) and facts.megatron_flops_per_sample is None
    )
    one = predict(single, facts, device_type="cpu")
    assert one.active_parameters == shape.active_parameters(VOCAB) and one.expert_parameters == experts
    assert one.memory.weights_bytes == 4 * shape.parameters(VOCAB)  # every expert held
    assert one.flops_per_step == shape.flops_per_token(VOCAB, 32) * 32 * 4  # active ones counted

    mesh = host.resolve(RunConfig(**base, workload_options=options, mesh="ddp=2,ep=2", devices=4))  # type: ignore[arg-type]
    p = predict(mesh, meta_facts(host.workload("moe"), mesh), device_type="cpu")
    replicated = shape.parameters(VOCAB) - experts
    assert p.memory.weights_bytes == 4 * (replicated + experts // 2)
    assert p.flops_per_step == one.flops_per_step  # each rank its own batch
    ops = {(op.op, op.axis, op.ranks): op for op in p.comm}
    exchange = ops[("all_to_all", "ep", 2)]
    assert exchange.count == 4 * 2 and exchange.message_bytes == 4 * 32 * 2 * 64 * 4
    assert exchange.bus_bytes == exchange.count * exchange.message_bytes / 2
    assert ops[("all_reduce", "dp", 4)].message_bytes == 4 * replicated
    assert ops[("all_reduce", "dp", 2)].message_bytes == 4 * experts // 2

    sharded = host.resolve(RunConfig(**base, workload_options=options, mesh="dp=2,ep=2", devices=4))  # type: ignore[arg-type]
    f = predict(sharded, meta_facts(host.workload("moe"), sharded), device_type="cpu")
    assert f.memory.weights_bytes == 4 * shape.parameters(VOCAB) / 4  # 1/world of every parameter
    assert {(op.op, op.axis) for op in f.comm} == {
        ("all_gather", "dp"),
        ("reduce_scatter", "dp"),
        ("all_to_all", "ep"),
    }


def test_comm_measures_all_to_all_with_nccl_tests_bus_factor() -> None:
    from accelbench.comm.collectives import COLLECTIVES

    all_to_all = COLLECTIVES["all_to_all"]
    assert all_to_all.formula == "(n-1)/n" and all_to_all.bus_factor(4) == 0.75


# ---------------------------------------------------------------------------------------------------------------
# a custom size
# ---------------------------------------------------------------------------------------------------------------

# 1 layer of width 32, 2 heads (16 wide) sharing 2 kv heads, 6 experts of 48, top-3, a shared expert
CUSTOM = {"n_layer": 1, "n_head": 2, "n_embd": 32, "ffn_dim": 48, "n_experts": 6, "top_k": 3,
          "shared_expert": True, "seq_len": 16, "vocab_size": VOCAB}  # fmt: skip
CUSTOM_LABEL = "custom 1L/2H/2KV/32E/48F/6x top-3 +shared"


def closed_form(
    layers: int, d: int, heads: int, kv: int, f: int, experts: int, routed: int, shared: int, vocab: int
) -> int:
    """A decoder of ``layers`` blocks with ``routed`` of its ``experts`` SwiGLU experts (width f) and ``shared``
    shared ones counted: q and o (d x d), k and v (d x kv heads' width), the router (d x experts), 3 d f a
    counted expert, two RMSNorms a block, the final norm, the embedding and the untied head."""
    attention = 2 * d * d + 2 * d * kv * (d // heads)
    block = attention + d * experts + (routed + shared) * 3 * d * f + 2 * d
    return layers * block + d + 2 * vocab * d


def test_a_custom_size_trains_a_few_steps_and_is_named_by_its_dimensions(
    corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accelbench.engine.runner import run as run_in_process
    from accelbench.workloads.moe import label, shape_of

    monkeypatch.setenv("ACCELBENCH_CACHE_DIR", str(corpus_dir / "cache"))
    host = get_host()
    config = host.resolve(
        RunConfig(
            workload="moe",
            model="custom",
            backend="cpu",
            batch_size=4,
            epochs=2,
            steps_per_epoch=2,
            data=corpus_dir / "text.txt",
            output_dir=tmp_path,
            no_tensor_peak=True,
            peak_tflops=1.0,  # a stated peak: no matmul rate measured for MFU
            workload_options=CUSTOM,
        )  # fmt: skip
    )
    host.workload("moe").check(config)
    shape = shape_of(config)
    assert (shape.n_experts, shape.top_k, shape.shared_experts, shape.n_kv_heads) == (6, 3, 1, 2)
    assert label(config, shape) == CUSTOM_LABEL
    record, _, status = run_in_process(config, host)
    assert status == "ok" and record is not None, record and record.outcome
    assert all(math.isfinite(loss) for loss in losses(record))
    w = record.workload
    assert w["name"] == CUSTOM_LABEL and record.workload_identity["model"] == CUSTOM_LABEL
    assert (w["n_experts"], w["top_k"], w["shared_experts"], w["ffn_dim"]) == (6, 3, 1, 48)
    assert w["parameters"] == closed_form(1, 32, 2, 2, 48, 6, 6, 1, VOCAB)
    assert w["active_parameters"] == closed_form(1, 32, 2, 2, 48, 6, 3, 1, VOCAB)
    per_layer = 4 * 4 * 16 * 3  # 4 steps of 4 sequences of 16 tokens, each to 3 experts
    assert [sum(layer) for layer in w["routing"]["tokens_per_expert_by_layer"]] == [per_layer]


@pytest.mark.parametrize(
    "model, options, mesh, message",
    [
        ("custom", {"top_k": 7}, None, "--top-k 7 is more than the 6 experts a token can be routed to: use --top-k 1 to 6"),
        ("custom", {"n_experts": 1, "top_k": 1}, None, "--experts: Input should be greater than or equal to 2"),
        ("custom", {"n_embd": None}, None, "needs all of --layers, --heads and --embd (missing --embd"),
        ("custom", {"n_embd": 33}, None, "width 33 is not divisible by heads 2: use --heads that divides --embd"),
        ("custom", {"n_embd": 30}, None, "the head size 15 (--embd / --heads) must be even"),
        ("custom", {"n_head": 4, "n_kv_heads": 3}, None, "heads 4 are not divisible by key/value heads 3"),
        ("moe-tiny", {"n_experts": 8, "top_k": 2}, None, "--experts, --top-k describe a custom size: use them with --model custom"),
        ("custom", {}, "ep=4", "6 experts per layer do not divide over ep=4 ranks; an ep size must divide 6: 2, 3, 6"),
    ],
)  # fmt: skip
def test_bad_custom_sizes_are_refused_saying_what_would_work(
    model: str, options: dict[str, object], mesh: str | None, message: str
) -> None:
    host = get_host()
    given = {k: v for k, v in {**CUSTOM, **options}.items() if v is not None}
    if model != "custom":
        given = {k: v for k, v in given.items() if k in (*options, "seq_len", "vocab_size")}
    devices = {"mesh": mesh, "devices": 4} if mesh else {}
    with pytest.raises(
        ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")
    ):
        config = host.resolve(RunConfig(workload="moe", model=model, workload_options=given, **devices))  # type: ignore[arg-type]
        workload = host.workload("moe")
        workload.check(config)
        check_model_split(config, workload.units(config), "moe")


def test_estimate_counts_a_custom_sizes_total_and_active_parameters_by_the_closed_form(
    corpus_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`accelbench estimate --workload moe --model custom ...`: every expert in the parameters memory holds, top-k
    and the shared expert in the active ones the FLOPs count, each against the closed form, and the model built
    on the meta device agreeing."""
    from accelbench.estimate import predict
    from accelbench.estimate.facts import meta_facts

    monkeypatch.setenv("ACCELBENCH_CACHE_DIR", str(corpus_dir / "cache"))
    host = get_host()
    options = {**CUSTOM, "n_layer": 3, "n_head": 4, "n_kv_heads": 1, "n_embd": 64, "ffn_dim": 96,
               "n_experts": 8, "top_k": 2, "shared_expert": False, "seq_len": 32}  # fmt: skip
    config = host.resolve(
        RunConfig(
            workload="moe",
            model="custom",
            batch_size=2,
            data=corpus_dir / "text.txt",
            workload_options=options,
        )  # type: ignore[arg-type]
    )
    facts = meta_facts(host.workload("moe"), config)
    total = closed_form(3, 64, 4, 1, 96, 8, 8, 0, VOCAB)
    active = closed_form(3, 64, 4, 1, 96, 8, 2, 0, VOCAB)
    assert facts.parameters == total == host.workload("moe").parameters(config)
    assert facts.active_parameters == active and facts.expert_parameters == 3 * 8 * 3 * 64 * 96
    assert (facts.top_k, facts.moe_layers) == (2, 3)
    # training FLOPs per token: 6 x the active parameters but the embedding, and the attention's 12 L q s
    assert facts.flops_per_sample == (6 * (active - VOCAB * 64) + 12 * 3 * 64 * 32) * 32
    prediction = predict(config, facts, device_type="cpu")
    assert (prediction.parameters, prediction.active_parameters) == (total, active)
    assert prediction.flops_per_step == facts.flops_per_sample * 2  # batch 2, active parameters counted
    assert prediction.memory.weights_bytes == 4 * total  # fp32, every expert held


# ---------------------------------------------------------------------------------------------------------------
# DeepSeek-V3's shape: multi-head latent attention, sigmoid routing, dense first blocks
# ---------------------------------------------------------------------------------------------------------------


def deepseek_config(**kw: object) -> MoEConfig:
    values: dict[str, object] = {"n_layers": 3, "dim": 32, "n_heads": 4, "n_kv_heads": 4, "ffn_dim": 24,
                                 "vocab_size": 97, "seq_len": 16, "n_experts": 4, "top_k": 2, "shared_experts": 1,
                                 "kv_lora_rank": 16, "q_lora_rank": 24, "qk_nope_head_dim": 8,
                                 "qk_rope_head_dim": 4, "v_head_dim": 6, "router_scores": "sigmoid",
                                 "first_k_dense": 1, "dense_ffn_dim": 64}  # fmt: skip
    return MoEConfig(**{**values, **kw})  # type: ignore[arg-type]


def mla_closed_form(
    layers: int, dense: int, d: int, h: int, r_q: int, r_kv: int, nope: int, rope: int, v: int, f_dense: int,
    f: int, experts: int, routed: int, shared: int, vocab: int,
) -> int:  # fmt: skip
    """DeepSeek-V3's decoder, ``routed`` of each MoE block's ``experts`` counted. Latent attention: queries through
    a rank-r_q latent (d r_q, its norm r_q, r_q h (nope + rope); d h (nope + rope) without one), keys and values
    from a rank-r_kv latent plus one shared rotary key (d (r_kv + rope), its norm r_kv, r_kv h (nope + v)), the
    output h v d. ``dense`` blocks with a SwiGLU of f_dense, the rest with a router and routed + shared experts of
    f; two norms a block, the final norm, the embedding and the untied head."""
    query = d * r_q + r_q + r_q * h * (nope + rope) if r_q else d * h * (nope + rope)
    attention = query + d * (r_kv + rope) + r_kv + r_kv * h * (nope + v) + h * v * d
    dense_block = attention + 3 * d * f_dense + 2 * d
    moe_block = attention + d * experts + (routed + shared) * 3 * d * f + 2 * d
    return dense * dense_block + (layers - dense) * moe_block + d + 2 * vocab * d


def test_deepseek_v3_has_its_published_shape_and_parameter_counts() -> None:
    """DeepSeek-V3's config.json (61 layers, width 7,168, 128 heads, latent ranks 512/1,536, head widths 128 + 64
    and 128, 256 routed experts of 2,048 top-8 + 1 shared, the first 3 blocks dense of 18,432, vocabulary 129,280):
    671.0 B parameters without the multi-token-prediction module (DeepSeek-AI: 671 B), 37.6 B active with both
    embedding matrices, 36.6 B without the input embedding (DeepSeek-AI's 36.6 B, the output head included)."""
    s = MODEL_SIZES["deepseek-v3"]
    assert (s.n_layers, s.dim, s.n_heads, s.vocab_size) == (61, 7_168, 128, 129_280)
    assert (s.kv_lora_rank, s.q_lora_rank, s.qk_nope_head_dim, s.qk_rope_head_dim, s.v_head_dim) == (
        512, 1_536, 128, 64, 128,
    )  # fmt: skip
    assert (s.n_experts, s.top_k, s.shared_experts, s.ffn_dim) == (256, 8, 1, 2_048)
    assert (s.first_k_dense, s.dense_ffn_dim, s.router_scores, s.attention_kind) == (
        3,
        18_432,
        "sigmoid",
        "MLA",
    )
    shape_args = (61, 3, 7_168, 128, 1_536, 512, 128, 64, 128, 18_432, 2_048, 256)
    total = mla_closed_form(*shape_args, 256, 1, 129_280)
    active = mla_closed_form(*shape_args, 8, 1, 129_280)
    assert s.parameters(129_280) == total and s.active_parameters(129_280) == active
    assert total / 1e9 == pytest.approx(671.03, abs=0.01)
    assert active / 1e9 == pytest.approx(37.55, abs=0.01)
    assert (active - 129_280 * 7_168) / 1e9 == pytest.approx(36.6, abs=0.05)
    assert s.expert_parameters() == 58 * 256 * 3 * 7_168 * 2_048
    assert s.flops_per_token(129_280, 4_096) == 6 * (active - 129_280 * 7_168) + 6 * 61 * 4_096 * 128 * (
        192 + 128
    )


def test_the_deepseek_v3_estimate_counts_its_parameters_by_the_closed_form(
    corpus_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`accelbench estimate --workload moe --model deepseek-v3`: built on the meta device (no storage), its total
    and active parameters the closed form's, the experts of its 58 MoE blocks (not the 3 dense ones) those an ep
    axis shards, and the FLOPs the MLA formula's."""
    from accelbench.estimate import predict
    from accelbench.estimate.facts import meta_facts

    monkeypatch.setenv("ACCELBENCH_CACHE_DIR", str(corpus_dir / "cache"))
    host = get_host()
    options = {"seq_len": 64, "vocab_size": VOCAB}
    config = host.resolve(
        RunConfig(workload="moe", model="deepseek-v3", batch_size=2, data=corpus_dir / "text.txt",
                  workload_options=options)  # type: ignore[arg-type]
    )  # fmt: skip
    facts = meta_facts(host.workload("moe"), config)
    shape_args = (61, 3, 7_168, 128, 1_536, 512, 128, 64, 128, 18_432, 2_048, 256)
    total, active = mla_closed_form(*shape_args, 256, 1, VOCAB), mla_closed_form(*shape_args, 8, 1, VOCAB)
    assert facts.parameters == facts.stored_parameters == total == host.workload("moe").parameters(config)
    assert facts.active_parameters == active and facts.expert_parameters == 58 * 256 * 3 * 7_168 * 2_048
    assert (facts.top_k, facts.moe_layers) == (8, 58)
    assert facts.flops_formula == MLA_FLOPS_FORMULA
    assert facts.flops_per_sample == (6 * (active - VOCAB * 7_168) + 6 * 61 * 64 * 128 * (192 + 128)) * 64
    prediction = predict(config, facts, device_type="cpu")
    assert (prediction.parameters, prediction.active_parameters) == (total, active)


@pytest.mark.parametrize("q_lora_rank", [24, 0], ids=["query-latent", "direct-query"])
def test_latent_attention_is_causal(q_lora_rank: int) -> None:
    """Changing the input at position 9 changes no output before it, and changes the output at 9 and after."""
    torch.manual_seed(3)
    attention = LatentAttention(deepseek_config(q_lora_rank=q_lora_rank))
    x = torch.randn(2, 16, 32)
    changed = x.clone()
    changed[:, 9] += torch.randn(2, 32)
    with torch.no_grad():
        before, after = attention(x), attention(changed)
    torch.testing.assert_close(after[:, :9], before[:, :9], rtol=0, atol=0)
    assert (after[:, 9:] - before[:, 9:]).abs().amax(dim=-1).min() > 1e-4


def test_latent_attention_is_its_definition() -> None:
    """By the definition, one head at a time: keys and values expanded from the normed latent, the rotary parts of
    query and key (one rotary key for every head) turned, softmax(q k / sqrt(nope + rope)) with the causal mask,
    times the values, then the output projection."""
    from accelbench.workloads.llama.model import apply_rope

    torch.manual_seed(4)
    cfg = deepseek_config()
    attention = LatentAttention(cfg)
    x = torch.randn(1, 7, 32)
    nope, rope, v_dim, h = 8, 4, 6, 4
    q = attention.wq_b(attention.q_norm(attention.wq_a(x))).view(1, 7, h, nope + rope)
    kv_a = attention.wkv_a(x)
    kv = attention.wkv_b(attention.kv_norm(kv_a[..., :16])).view(1, 7, h, nope + v_dim)
    k_rope = apply_rope(kv_a[..., None, 16:], cfg.rope_theta)[:, :, 0]  # (1, time, rope)
    q_rope = apply_rope(q[..., nope:], cfg.rope_theta)
    mask = torch.ones(7, 7).tril().bool()
    heads = []
    for i in range(h):
        scores = q[0, :, i, :nope] @ kv[0, :, i, :nope].T + q_rope[0, :, i] @ k_rope[0].T
        weights = (scores / math.sqrt(nope + rope)).masked_fill(~mask, float("-inf")).softmax(-1)
        heads.append(weights @ kv[0, :, i, nope:])
    expected = attention.wo(torch.cat(heads, dim=-1))[None]
    torch.testing.assert_close(attention(x), expected, rtol=1e-5, atol=1e-6)


def test_deepseek_routing_gates_are_sigmoid_scores_renormalised_over_the_chosen() -> None:
    """DeepSeek-V3's gates: the top-k sigmoid scores, divided by their sum; the shared expert added."""
    torch.manual_seed(5)
    cfg = deepseek_config()
    model = MoE(cfg)
    layer = model.layers[1].feed_forward
    assert isinstance(layer, DeepSeekFeedForward) and isinstance(layer.router, SigmoidRouter)
    assert isinstance(model.layers[0].feed_forward, FeedForward)  # first_k_dense = 1
    assert len(model.moe_layers()) == 2 and isinstance(model.layers[0].attention, LatentAttention)
    for w in (layer.experts.w1, layer.experts.w2, layer.experts.w3):
        torch.nn.init.normal_(w, std=0.1)
    x = torch.randn(2, 3, cfg.dim)
    y = layer(x)
    assert layer.shared_expert is not None
    for token, out in zip(x.reshape(-1, cfg.dim), y.reshape(-1, cfg.dim), strict=True):
        scores = torch.sigmoid(token @ layer.router.weight.T)
        top = scores.topk(cfg.top_k)
        expected = layer.shared_expert(token)
        for gate, e in zip(top.values / top.values.sum(), top.indices.tolist(), strict=True):
            expected = (
                expected
                + gate * swiglu(token[None], layer.experts.w1[e], layer.experts.w3[e], layer.experts.w2[e])[0]
            )
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_the_mla_flops_formula_is_what_torch_counts() -> None:
    """6*N_active + 6*L*s*h*(qk + v) per token: torch's counter times 3, plus 6 x the norms' weights (in N, not
    matmuls)."""

    # the per-expert loop: torch's FlopCounterMode has no formula for torch._grouped_mm (it would count no experts)
    cfg = deepseek_config(vocab_size=500, seq_len=64, experts_kernel="loop")
    shape = MoEShape(3, 32, 4, 4, 24, 4, 2, 1, 500, 64, 10_000.0, kv_lora_rank=16, q_lora_rank=24,
                     qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, router_scores="sigmoid",
                     first_k_dense=1, dense_ffn_dim=64)  # fmt: skip
    model = MoE(cfg)
    assert model.num_parameters() == shape.parameters(500)
    assert shape.flops_per_token(500, 64) == counted_flops_per_token(model, 500, 64)


def test_deepseek_tiny_trains_on_cpu_and_its_loss_falls(
    corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accelbench.engine.runner import run as run_in_process

    monkeypatch.setenv("ACCELBENCH_CACHE_DIR", str(corpus_dir / "cache"))
    host = get_host()
    config = host.resolve(
        RunConfig(
            workload="moe",
            model="deepseek-tiny",
            backend="cpu",
            batch_size=8,
            epochs=2,
            steps_per_epoch=3,
            learning_rate=5e-3,
            data=corpus_dir / "text.txt",
            output_dir=tmp_path,
            no_tensor_peak=True,
            peak_tflops=1.0,
            workload_options={"seq_len": 32, "vocab_size": VOCAB},
        )  # fmt: skip
    )
    host.workload("moe").check(config)
    record, _, status = run_in_process(config, host)
    assert status == "ok" and record is not None, record and record.outcome
    epoch_losses = losses(record)
    assert epoch_losses[0] == pytest.approx(math.log(VOCAB), rel=0.05)
    assert epoch_losses[-1] < epoch_losses[0] - 0.3, epoch_losses
    shape = MODEL_SIZES["deepseek-tiny"]
    w = record.workload
    assert w["attention_kind"] == "MLA" and "multi-head latent attention" in w["attention"]
    assert (w["kv_lora_rank"], w["q_lora_rank"], w["moe_layers"]) == (32, 48, 2)
    assert w["parameters"] == shape.parameters(VOCAB) and w["active_parameters"] == shape.active_parameters(
        VOCAB
    )
    assert record.metrics is not None and record.metrics.flops_formula == MLA_FLOPS_FORMULA
    assert len(w["routing"]["tokens_per_expert_by_layer"]) == 2  # the dense first block routes nothing


@pytest.mark.parametrize(
    "change, message",
    [
        ({"kv_lora_rank": 0}, "shape multi-head latent attention: give a kv_lora_rank > 0"),
        ({"qk_rope_head_dim": 5}, "qk_rope_head_dim 5 must be even"),
        ({"v_head_dim": 0}, "needs positive qk_nope_head_dim, qk_rope_head_dim and v_head_dim"),
        ({"first_k_dense": 4}, "use 0 to 3 (the layers) dense blocks"),
        ({"dense_ffn_dim": 0}, "each with a positive dense_ffn_dim"),
        ({"router_scores": "softplus"}, "use 'softmax' or 'sigmoid'"),
    ],
)
def test_bad_latent_attention_and_routing_configurations_are_refused(
    change: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        MoE(deepseek_config(**change))


@pytest.mark.parametrize(
    "options, mesh, message",
    [
        ({"seq_len": 4_096}, None, "--seq-len 4096 is above deepseek-tiny's context of 2,048 tokens"),
        ({"n_kv_heads": 2}, None, "--kv-heads describe a custom size: use them with --model custom"),
        ({}, "ep=3", "8 experts per layer do not divide over ep=3 ranks; an ep size must divide 8: 2, 4, 8"),
    ],
)
def test_bad_deepseek_tiny_runs_are_refused(
    options: dict[str, object], mesh: str | None, message: str
) -> None:
    host = get_host()
    devices = {"mesh": mesh, "devices": 3 if mesh == "ep=3" else 2} if mesh else {}
    with pytest.raises(ConfigError, match=message):
        config = host.resolve(
            RunConfig(workload="moe", model="deepseek-tiny", workload_options=options, **devices)
        )  # type: ignore[arg-type]
        workload = host.workload("moe")
        workload.check(config)
        check_model_split(config, workload.units(config), "moe")


@pytest.mark.slow
def test_deepseek_tiny_expert_parallel_is_one_process_training(
    corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--mesh ep=2 on two gloo processes: each rank keeps 4 of the 8 routed experts of the 2 MoE blocks; the dense
    block, the shared experts and the latent attention are replicated. The losses are one process's on the global
    batch."""
    data = ["--data", str(corpus_dir / "text.txt")]
    args = ["--workload", "moe", "--model", "deepseek-tiny", "--seq-len", "32", "--vocab-size", str(VOCAB),
            "--epochs", "2", "--steps-per-epoch", "2", "-q", "--mesh", "ep=2", "--devices", "2", "--batch-size", "4"]  # fmt: skip
    proc = accelbench("run", *args, *data, "--output-dir", str(tmp_path), env=env_of(corpus_dir), timeout=500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = read_record(next(tmp_path.glob("*.json")))
    assert record.outcome.status == "ok", record.outcome.message
    assert record.executor["expert_parallel"]["experts_per_rank"] == 4
    monkeypatch.setenv("ACCELBENCH_CACHE_DIR", str(corpus_dir / "cache"))
    assert losses(record) == pytest.approx(one_process_losses(record), abs=1e-5, rel=0)


# ---------------------------------------------------------------------------------------------------------------
# DeepSeek-V3's auxiliary-loss-free balancing: per-expert biases on the scores the top-k is chosen by
# ---------------------------------------------------------------------------------------------------------------


def imbalanced(model: MoE) -> None:
    """Every MoE layer's router made to prefer experts 0 and 1 whatever the token: a router with a bias of +1.5 for
    them and -1.5 for the others (sigmoid 0.82 against 0.18), its weights small."""
    for layer in model.moe_layers():
        router = SigmoidRouter(layer.router.in_features, layer.n_experts, bias=True)
        torch.nn.init.normal_(router.weight, std=0.1)
        with torch.no_grad():
            router.bias.copy_(torch.tensor([1.5, 1.5, -1.5, -1.5]))
        layer.router = router


def train_steps(model: MoE, cfg: MoEConfig, steps: int) -> list[float]:
    """``steps`` real training steps (AdamW, the workload's recipe, with the bias hook where the config has biases)
    on random tokens; returns each step's load imbalance (max / mean tokens per expert, first MoE layer)."""
    from accelbench.workloads.moe.model import balance_by_expert_biases, configure_adamw

    optimizer = configure_adamw(model, "foreach", 1e-3)
    if cfg.expert_biases:
        balance_by_expert_biases(optimizer, model, cfg)
    generator = torch.Generator().manual_seed(7)
    imbalance = []
    for _ in range(steps):
        tokens = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len), generator=generator)
        first = model.moe_layers()[0]
        first.routed = None
        model(tokens, tokens).backward()
        assert first.routed is not None
        imbalance.append(float(first.routed.max() / first.routed.float().mean()))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return imbalance


def test_the_expert_bias_moves_an_imbalanced_router_toward_balance_and_gets_no_gradient() -> None:
    """A router sending every token to experts 0 and 1 (imbalance 2: half the experts idle), one dense block and one
    MoE block: with biases moving 0.03 a step the overloaded experts' biases fall, the idle ones' rise, and after 10
    steps the load is near even (the sign update then keeps it within a step of balance); the same model without
    biases stays at 2. The bias is a buffer, never a parameter, and never gets a gradient."""
    shape = {"n_layers": 2, "experts_kernel": "loop", "aux_loss_coef": 0.0}
    cfg = deepseek_config(balance="bias", bias_update_speed=0.03, **shape)
    torch.manual_seed(8)
    model = MoE(cfg)
    imbalanced(model)
    plain = MoE(deepseek_config(**shape))
    imbalanced(plain)
    plain.load_state_dict(model.state_dict(), strict=False)  # the same weights, no biases
    imbalance = train_steps(model, cfg, 16)
    assert imbalance[0] == 2.0 and max(imbalance[-6:]) < 1.7 and sum(imbalance[-6:]) / 6 < 1.5, imbalance
    assert min(train_steps(plain, deepseek_config(**shape), 16)) > 1.9
    for layer in model.moe_layers():
        bias = layer.expert_bias
        assert bias is not None and bias.grad is None and not bias.requires_grad
        assert bias[:2].max() < 0 < bias[2:].min(), bias
        assert all(p is not bias for p in model.parameters())
    assert list(dict(model.named_buffers())) == ["layers.1.feed_forward.expert_bias"]


def test_the_bias_update_is_minus_speed_times_the_sign_of_load_minus_its_mean() -> None:
    """Loads (10, 2, 4, 0), mean 4: the biases move by -speed x (1, -1, 0, -1); the loads are then forgotten."""
    from accelbench.workloads.moe.model import update_expert_biases

    cfg = deepseek_config(balance="bias", bias_update_speed=0.25)
    model = MoE(cfg)
    first, second = model.moe_layers()
    first.load = torch.tensor([10, 2, 4, 0])
    update_expert_biases(model, cfg.n_layers, cfg.n_experts, cfg.bias_update_speed)
    assert first.expert_bias is not None and second.expert_bias is not None
    assert first.expert_bias.tolist() == [-0.25, 0.25, 0.0, 0.25]
    assert second.expert_bias.tolist() == [0.0] * 4  # no load counted: no move
    assert first.load is None


def test_forwards_no_step_follows_leave_the_biases_alone() -> None:
    """A gradient-norm probe (zero_grad, forward, backward, zero_grad: no step) before a training step: the step
    moves the biases by its own loads only, as it would without the probe."""
    from accelbench.workloads.moe.model import balance_by_expert_biases, configure_adamw

    cfg = deepseek_config(balance="bias", bias_update_speed=0.5)
    torch.manual_seed(10)
    probed, plain = MoE(cfg), MoE(cfg)
    plain.load_state_dict(probed.state_dict())
    step, probe = torch.randint(0, 97, (2, 16)), torch.randint(0, 97, (2, 16))
    for model in (probed, plain):
        optimizer = configure_adamw(model, "foreach", 1e-3)
        balance_by_expert_biases(optimizer, model, cfg)
        if model is probed:
            optimizer.zero_grad(set_to_none=True)
            model(probe, probe).backward()
            optimizer.zero_grad(set_to_none=True)
        model(step, step).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    for a, b in zip(probed.moe_layers(), plain.moe_layers(), strict=True):
        assert a.expert_bias is not None and b.expert_bias is not None
        assert a.expert_bias.abs().sum() > 0
        torch.testing.assert_close(a.expert_bias, b.expert_bias, rtol=0, atol=0)


def test_the_biased_choice_is_gated_by_the_unbiased_sigmoid_scores() -> None:
    """Biases of +5 on experts 2 and 3 choose them for every token (sigmoid scores are below 1); their gates are
    the sigmoid scores of 2 and 3 renormalised over the two, the bias in none of them."""
    torch.manual_seed(9)
    cfg = deepseek_config(balance="bias")
    layer = MoE(cfg).layers[1].feed_forward
    assert isinstance(layer, DeepSeekFeedForward) and layer.expert_bias is not None
    for w in (layer.experts.w1, layer.experts.w2, layer.experts.w3):
        torch.nn.init.normal_(w, std=0.1)
    layer.expert_bias.copy_(torch.tensor([0.0, 0.0, 5.0, 5.0]))
    x = torch.randn(2, 3, cfg.dim)
    y = layer(x)
    assert layer.shared_expert is not None
    for token, out in zip(x.reshape(-1, cfg.dim), y.reshape(-1, cfg.dim), strict=True):
        scores = torch.sigmoid(token @ layer.router.weight.T)
        expected = layer.shared_expert(token)
        for e in (2, 3):
            gate = scores[e] / scores[2:].sum()
            expected = expected + gate * swiglu(token[None], layer.experts.w1[e], layer.experts.w3[e],
                                                layer.experts.w2[e])[0]  # fmt: skip
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_the_expert_bias_stays_float32_when_the_model_is_cast() -> None:
    """A bf16 model keeps its biases in float32: steps of 0.001 would round away in bf16 beside a bias of 0.25."""
    model = MoE(deepseek_config(balance="both", aux_loss_coef=1e-4)).to(torch.bfloat16)
    layer = model.moe_layers()[0]
    assert layer.router.weight.dtype == torch.bfloat16
    assert layer.expert_bias is not None and layer.expert_bias.dtype == torch.float32


def moe_config(model: str, **options: object) -> RunConfig:
    config = get_host().resolve(RunConfig(workload="moe", model=model, workload_options=options))  # type: ignore[arg-type]
    get_host().workload("moe").check(config)
    return config


def test_the_deepseek_sizes_balance_as_deepseek_v3_and_the_identity_says_how() -> None:
    """deepseek-tiny (and -v3): the biases at 0.001 and the sequence-wise loss at 0.0001 unless told otherwise;
    moe-tiny: the balance loss alone at 0.01, its identity as before the option existed."""
    workload = get_host().workload("moe")
    assert workload.identity(moe_config("deepseek-tiny")) == {
        "model": "deepseek-tiny", "seq_len": 256, "vocab_size": 8_192, "aux_loss_coef": 0.0001,
        "balance": "both", "bias_update_speed": 0.001,
    }  # fmt: skip
    bias_only = workload.identity(moe_config("deepseek-v3", balance="bias", bias_update_speed=0.01))
    assert (bias_only["aux_loss_coef"], bias_only["bias_update_speed"]) == (0.0, 0.01)
    assert workload.identity(moe_config("moe-tiny")) == {
        "model": "moe-tiny", "seq_len": 256, "vocab_size": 8_192, "aux_loss_coef": 0.01,
    }  # fmt: skip
    assert workload.identity(moe_config("moe-tiny", balance="bias"))["balance"] == "bias"
    assert workload.identity(moe_config("deepseek-tiny", balance="aux-loss")) == {
        "model": "deepseek-tiny", "seq_len": 256, "vocab_size": 8_192, "aux_loss_coef": 0.01,
    }  # fmt: skip


@pytest.mark.parametrize(
    "options, message",
    [
        ({"balance": "loss"}, "--balance"),
        ({"balance": "bias", "bias_update_speed": 0}, "--bias-update-speed: Input should be greater than 0"),
        ({"balance": "bias", "bias_update_speed": 2}, "--bias-update-speed: Input should be less than or equal to 1"),
        ({"balance": "aux-loss", "bias_update_speed": 0.01}, "with --balance aux-loss there are none: add --balance bias"),
        ({"balance": "bias", "aux_loss_coef": 0.01}, "would add the balance loss too; use --balance both"),
        ({"balance": "both", "aux_loss_coef": 0.0}, "--aux-loss-coef 0 leaves no loss; use --balance bias"),
    ],
)  # fmt: skip
def test_bad_balance_options_are_refused(options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        moe_config("deepseek-tiny", **options)


def test_a_bad_balance_is_refused_by_the_model() -> None:
    with pytest.raises(ValueError, match="balance 'none': use one of 'aux-loss', 'bias', 'both'"):
        MoE(tiny_config(balance="none"))
    with pytest.raises(ValueError, match=r"bias update speed 0.0: use a value in \(0, 1\]"):
        MoE(tiny_config(balance="bias", bias_update_speed=0.0))


def test_deepseek_tiny_trains_with_expert_biases_and_records_them(
    corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's optimizer (the workload's recipe, through the engine) moves the biases after each step: the
    record says which balancing ran and holds the biases at the end, each a multiple of the update speed."""
    from accelbench.engine.runner import run as run_in_process

    monkeypatch.setenv("ACCELBENCH_CACHE_DIR", str(corpus_dir / "cache"))
    host = get_host()
    config = host.resolve(
        RunConfig(workload="moe", model="deepseek-tiny", backend="cpu", batch_size=4, epochs=1, steps_per_epoch=3,
                  data=corpus_dir / "text.txt", output_dir=tmp_path, no_tensor_peak=True, peak_tflops=1.0,
                  workload_options={"seq_len": 16, "vocab_size": VOCAB, "bias_update_speed": 0.25})
    )  # fmt: skip
    host.workload("moe").check(config)
    record, _, status = run_in_process(config, host)
    assert status == "ok" and record is not None, record and record.outcome
    w = record.workload
    assert (w["balance"], w["bias_update_speed"], w["aux_loss_coef"]) == ("both", 0.25, 0.0001)
    assert record.workload_identity["balance"] == "both"
    biases = w["expert_bias_by_layer"]
    assert len(biases) == 2 and all(len(layer) == 8 for layer in biases)
    assert any(b != 0 for layer in biases for b in layer)
    assert all(b / 0.25 == round(b / 0.25) for layer in biases for b in layer)


def biased_two_process_run(corpus_dir: Path, out: Path, *parallel: str) -> ResultRecord:
    """deepseek-tiny on two gloo processes, --balance bias with biases moving 0.05 a step, no tensor-peak
    measurement (its extra step after the epochs would move the biases once more)."""
    data = ["--data", str(corpus_dir / "text.txt")]
    args = ["--workload", "moe", "--model", "deepseek-tiny", "--seq-len", "32", "--vocab-size", str(VOCAB),
            "--epochs", "2", "--steps-per-epoch", "3", "-q", *parallel, "--devices", "2", "--batch-size", "4",
            "--balance", "bias", "--bias-update-speed", "0.05", "--no-tensor-peak"]  # fmt: skip
    proc = accelbench("run", *args, *data, "--output-dir", str(out), env=env_of(corpus_dir), timeout=500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = read_record(next(out.glob("*.json")))
    assert record.outcome.status == "ok", record.outcome.message
    assert record.workload_identity["balance"] == "bias"
    return record


@pytest.mark.slow
def test_expert_biases_under_expert_parallelism_are_one_process_training(
    corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--mesh ep=2: each rank routes its own tokens by its own biases (nothing else makes them agree: no DDP
    buffer broadcast), so only biases updated from the loads of both ranks together (the all-reduce) keep the
    ranks' routing that of one process on the global batch: the losses and the final biases are the one
    process's."""
    record = biased_two_process_run(corpus_dir, tmp_path, "--mesh", "ep=2")
    monkeypatch.setenv("ACCELBENCH_CACHE_DIR", str(corpus_dir / "cache"))
    expected, model = one_process_run(record)
    assert losses(record) == pytest.approx(expected, abs=1e-5, rel=0)
    recorded = [b for layer in record.workload["expert_bias_by_layer"] for b in layer]
    assert recorded == pytest.approx(
        [b for m in model.moe_layers() for b in m.expert_bias.tolist()], abs=1e-6
    )
    assert any(b != 0 for b in recorded)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
@pytest.mark.slow
def test_expert_biases_train_under_ddp_and_fsdp(corpus_dir: Path, tmp_path: Path, strategy: str) -> None:
    """DDP (which broadcasts buffers) and FSDP2 (which leaves them whole) train with the biases: they moved, by
    whole steps of 0.05."""
    biases = biased_two_process_run(corpus_dir, tmp_path, "--strategy", strategy).workload[
        "expert_bias_by_layer"
    ]
    assert len(biases) == 2 and any(b != 0 for layer in biases for b in layer)
    assert all(abs(b / 0.05 - round(b / 0.05)) < 1e-4 for layer in biases for b in layer)


# ---------------------------------------------------------------------------------------------------------------
# a custom size with multi-head latent attention (--attention-kind mla)
# ---------------------------------------------------------------------------------------------------------------

CUSTOM_MLA = {**CUSTOM, "n_layer": 2, "n_head": 4, "n_embd": 64, "ffn_dim": 48, "n_experts": 4, "top_k": 2,
              "attention_kind": "mla", "kv_lora_rank": 24, "qk_nope_head_dim": 12, "qk_rope_head_dim": 6,
              "v_head_dim": 10}  # fmt: skip


def model_config_of(shape: MoEShape, vocab: int, seq_len: int) -> MoEConfig:
    return MoEConfig(n_layers=shape.n_layers, dim=shape.dim, n_heads=shape.n_heads, n_kv_heads=shape.n_kv_heads,
                     ffn_dim=shape.ffn_dim, vocab_size=vocab, seq_len=seq_len, n_experts=shape.n_experts,
                     top_k=shape.top_k, shared_experts=shape.shared_experts, experts_kernel="loop",
                     kv_lora_rank=shape.kv_lora_rank, q_lora_rank=shape.q_lora_rank,
                     qk_nope_head_dim=shape.qk_nope_head_dim, qk_rope_head_dim=shape.qk_rope_head_dim,
                     v_head_dim=shape.v_head_dim)  # fmt: skip


def test_a_custom_mla_size_has_its_options_widths_and_deepseeks_proportions_by_default() -> None:
    from accelbench.workloads.moe import label, shape_of

    config = moe_config("custom", **CUSTOM_MLA)
    s = shape_of(config)
    assert latent_widths(s) == (24, 0, 12, 6, 10)
    assert s.attention_kind == "MLA" and s.router_scores == "softmax"
    assert label(config, s) == "custom 2L/4H/MLA kv24 q0 qk12+6 v10/64E/48F/4x top-2 +shared"
    given = {k: v for k, v in CUSTOM_MLA.items() if k not in ("kv_lora_rank", "qk_nope_head_dim",
                                                              "qk_rope_head_dim", "v_head_dim")}  # fmt: skip
    # heads of 16: DeepSeek-V3's 512/128/64/128 for heads of 128, scaled
    assert latent_widths(shape_of(moe_config("custom", **given, q_lora_rank=32))) == (64, 32, 16, 8, 16)


def latent_widths(s: MoEShape) -> tuple[int, ...]:
    return (s.kv_lora_rank, s.q_lora_rank, s.qk_nope_head_dim, s.qk_rope_head_dim, s.v_head_dim)


@pytest.mark.parametrize("q_lora_rank", [0, 32], ids=["direct-query", "query-latent"])
def test_a_custom_mla_sizes_parameters_and_flops_are_what_torch_counts(q_lora_rank: int) -> None:
    """The custom MLA shape's parameters are the closed form's and the model's; its FLOPs (6*N_active +
    6*L*s*h*(qk + v)) torch's counter times 3 plus 6 x the norms' weights."""

    from accelbench.workloads.moe import shape_of

    shape = shape_of(moe_config("custom", **CUSTOM_MLA, q_lora_rank=q_lora_rank))
    model = MoE(model_config_of(shape, 500, 64))
    shape_args = (2, 0, 64, 4, q_lora_rank, 24, 12, 6, 10, 0, 48, 4)
    assert model.num_parameters() == shape.parameters(500) == mla_closed_form(*shape_args, 4, 1, 500)
    assert shape.active_parameters(500) == mla_closed_form(*shape_args, 2, 1, 500)
    assert shape.flops_per_token(500, 64) == pytest.approx(counted_flops_per_token(model, 500, 64), rel=0.002)


def test_the_estimate_counts_a_custom_mla_size_by_the_closed_form(
    corpus_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accelbench.estimate.facts import meta_facts

    monkeypatch.setenv("ACCELBENCH_CACHE_DIR", str(corpus_dir / "cache"))
    host = get_host()
    config = host.resolve(
        RunConfig(workload="moe", model="custom", batch_size=2, data=corpus_dir / "text.txt",
                  workload_options={**CUSTOM_MLA, "seq_len": 32})  # type: ignore[arg-type]
    )  # fmt: skip
    facts = meta_facts(host.workload("moe"), config)
    total = mla_closed_form(2, 0, 64, 4, 0, 24, 12, 6, 10, 0, 48, 4, 4, 1, VOCAB)
    active = mla_closed_form(2, 0, 64, 4, 0, 24, 12, 6, 10, 0, 48, 4, 2, 1, VOCAB)
    assert facts.parameters == total == host.workload("moe").parameters(config)
    assert facts.active_parameters == active and facts.flops_formula == MLA_FLOPS_FORMULA
    assert facts.flops_per_sample == (6 * (active - VOCAB * 64) + 6 * 2 * 32 * 4 * (18 + 10)) * 32


@pytest.mark.parametrize(
    "model, options, message",
    [
        ("custom", {"attention_kind": None}, "--kv-lora-rank, --qk-nope-head-dim, --qk-rope-head-dim, --v-head-dim shape multi-head latent attention: add --attention-kind mla"),
        ("custom", {"n_kv_heads": 2}, "--kv-heads is grouped-query attention's"),
        ("custom", {"qk_rope_head_dim": 5}, r"the rotary head width 5 \(--qk-rope-head-dim\) must be even"),
        ("custom", {"qk_rope_head_dim": None, "n_embd": 40}, r"the rotary head width 5 \(half the head width --embd / --heads\) must be even"),
        ("custom", {"v_head_dim": None, "n_embd": 66}, r"--v-head-dim default from the head width --embd / --heads, and 66 / 4 is not a whole number"),
        ("custom", {"kv_lora_rank": 0}, "--kv-lora-rank: Input should be greater than 0"),
        ("custom", {"q_lora_rank": -1}, "--q-lora-rank: Input should be greater than or equal to 0"),
        ("custom", {"attention_kind": "mha"}, "--attention-kind"),
        ("moe-tiny", {"attention_kind": "mla", "kv_lora_rank": 24}, "--attention-kind, --kv-lora-rank describe a custom size: use them with --model custom"),
    ],
)  # fmt: skip
def test_bad_custom_latent_attention_is_refused_saying_what_would_work(
    model: str, options: dict[str, object], message: str
) -> None:
    given = {k: v for k, v in {**CUSTOM_MLA, **options}.items() if v is not None}
    if model != "custom":
        given = options
    with pytest.raises(ConfigError, match=message):
        moe_config(model, **given)


def counted_flops_per_token(model: MoE, vocab: int, seq_len: int) -> float:
    """Training FLOPs per token of a batch of 2 as torch's counter counts them (3 x the forward's, math
    attention), plus 6 per RMSNorm weight, which the counter leaves out and the MLA formula counts."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    tokens = torch.randint(0, vocab, (2, seq_len))
    counter = FlopCounterMode(display=False)
    with counter, sdpa_kernel(SDPBackend.MATH):
        model(tokens, tokens)
    norms = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.RMSNorm))
    return 3 * counter.get_total_flops() / (2 * seq_len) + 6 * norms
