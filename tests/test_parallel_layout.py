"""Tensor/pipeline parallelism without processes: the analytical model against hand-computed numbers, the canonical
layout RunConfig makes of --mesh, the refusals before launch, rank placement, stage splits and compare's key."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from pydantic import ValidationError

from accelbench.compare.keys import WorkloadKey
from accelbench.config import RunConfig
from accelbench.engine.parallel.mesh import check_model_split
from accelbench.engine.parallel.pp import split_units
from accelbench.errors import ConfigError
from accelbench.estimate.parallel import (
    TransformerShape,
    activation_bytes_per_layer,
    allgather_bytes,
    allreduce_bytes,
    data_parallel_bytes,
    estimate_parallel,
    in_flight_microbatches,
    megatron_flops_per_iteration,
    pipeline_bubble,
    pipeline_bytes,
    tensor_parallel_bytes,
)
from accelbench.parallel_dims import ParallelDims, parse_mesh
from accelbench.workloads.gpt import gpt_units

# ---------------------------------------------------------------------------------------------------------------
# The analytical model, against numbers worked by hand
# ---------------------------------------------------------------------------------------------------------------


def test_megatron_flops_by_hand() -> None:
    # B=2, s=4, l=1, h=6, V=12: 72*2*4*1*36 = 20736; 1 + 4/36 + 12/(12*1*6) = 23/18 -> 26496
    assert megatron_flops_per_iteration(2, 4, 1, 6, 12) == pytest.approx(26496)
    # with recomputation: 96*288 = 27648; 1 + 1/9 + 12/96 = 89/72 -> 34176
    assert megatron_flops_per_iteration(2, 4, 1, 6, 12, recompute=True) == pytest.approx(34176)


def test_pipeline_bubble_by_schedule() -> None:
    assert pipeline_bubble("1f1b", 4, 8) == pytest.approx(3 / 11)  # (p-1)/(m+p-1)
    assert pipeline_bubble("gpipe", 4, 8, virtual_stages=2) == pytest.approx(3 / 11)  # one stage per rank
    assert pipeline_bubble("interleaved-1f1b", 4, 8, 2) == pytest.approx(3 / 19)  # (p-1)/(v m+p-1)
    assert pipeline_bubble("looped-bfs", 2, 4, 2) == pytest.approx(1 / 9)
    assert pipeline_bubble("zbv", 4, 8, 2) is None  # zero-bubble schedules: no closed form recorded
    assert pipeline_bubble("1f1b", 1, 8) == 0.0


def test_communication_volumes_by_hand() -> None:
    assert allreduce_bytes(100, 4) == pytest.approx(150)  # 2 (n-1)/n S
    assert allgather_bytes(100, 4) == pytest.approx(75)  # (n-1)/n S
    assert allreduce_bytes(100, 1) == allgather_bytes(100, 1) == 0
    # b s h bytes = 2*4*8*2 = 128; all-reduce over 2 moves 128; 4 per layer, 3 layers
    assert tensor_parallel_bytes(2, 4, 8, 3, 2, 2) == pytest.approx(1536)
    assert pipeline_bytes(2, 4, 8, 2, 1, 2) == pytest.approx(256)  # 2 v b s h bytes
    assert pipeline_bytes(2, 4, 8, 1, 1, 2) == 0
    assert data_parallel_bytes(1000, 4, "ddp", 4, 4) == pytest.approx(6000)  # all-reduce of 4000 bytes
    assert data_parallel_bytes(1000, 4, "fsdp", 4, 4) == pytest.approx(9000)  # 2 all-gathers + reduce-scatter


def test_activation_memory_by_hand() -> None:
    # s b h = 8*1*16 = 128; 5 a s / h = 5; one device: 34 + 5 -> 4992 bytes in 16-bit values
    assert activation_bytes_per_layer(1, 8, 16, 2) == pytest.approx(4992)
    # tensor-parallel 2: 10 + 24/2 + 5/2 = 24.5; with sequence parallelism 34/2 + 2.5 = 19.5; fp32 doubles
    assert activation_bytes_per_layer(1, 8, 16, 2, tp=2) == pytest.approx(3136)
    assert activation_bytes_per_layer(1, 8, 16, 2, tp=2, sequence_parallel=True) == pytest.approx(2496)
    assert activation_bytes_per_layer(1, 8, 16, 2, bytes_per_value=4) == pytest.approx(9984)
    assert in_flight_microbatches("gpipe", 0, 4, 8, 2) == 16
    assert in_flight_microbatches("1f1b", 0, 4, 8, 1) == 4 and in_flight_microbatches("1f1b", 3, 4, 8, 1) == 1
    # torch's interleaved 1F1B: (v-1) rounds of p microbatches + 2 a hop from the last rank warm up, then one forward
    assert in_flight_microbatches("interleaved-1f1b", 0, 4, 8, 2) == 4 + 2 * 3 + 1
    assert in_flight_microbatches("interleaved-1f1b", 3, 4, 8, 2) == 4 + 1
    assert (
        in_flight_microbatches("interleaved-1f1b", 0, 2, 4, 2) == 5
    )  # measured: gpt-micro's first rank held 5
    assert in_flight_microbatches("interleaved-1f1b", 0, 4, 4, 4) == 16  # no more than m v


def test_estimate_of_a_3d_layout_by_hand() -> None:
    shape = TransformerShape(layers=4, hidden=8, heads=2, sequence=4, vocab=0, layer_parameters=100,
                             other_parameters=50)  # fmt: skip
    mesh = ParallelDims(dp=2, tp=2, pp=2, data_parallel="fsdp", schedule="1f1b", microbatches=2)
    e = estimate_parallel(shape, mesh, batch=4)
    # the first stage: 2 layers of 100 parameters split over tp=2, plus 50 whole; FSDP halves it
    assert e.layers_per_stage == 2 and e.parameters_per_device == pytest.approx(75)
    assert (e.weights_bytes, e.gradients_bytes, e.optimizer_bytes) == pytest.approx((300, 300, 600))
    # microbatch 2, tp 2, fp32: 4*2*8*(10+12+2.5)*4/2 = 3136 per layer; 2 layers; 2 microbatches in flight
    assert e.activations_bytes == pytest.approx(12544)
    assert e.communication_bytes == pytest.approx({"tp": 4096, "pp": 1024, "dp": 900})
    assert e.bubble == pytest.approx(1 / 3)
    assert e.as_dict()["memory_bytes"] == pytest.approx(300 + 300 + 600 + 12544)


def test_each_pipeline_rank_holds_the_stem_or_the_head_it_runs() -> None:
    """The embeddings on the first rank, the final norm and output layer (a tied head's own copy) on the one holding
    the last stage: rank 1 of a looped pipeline, rank 0 of a V-shaped one; without the parts' counts every rank is
    taken to hold all of them, as before."""
    shape = TransformerShape(layers=4, hidden=8, heads=2, sequence=4, vocab=0, layer_parameters=100,
                             other_parameters=50, stem_parameters=30, head_parameters=40)  # fmt: skip
    looped = ParallelDims(pp=2, schedule="1f1b", microbatches=2)
    first, last = (estimate_parallel(shape, looped, batch=4, stage_rank=r) for r in (0, 1))
    assert (first.parameters_per_device, last.parameters_per_device) == (200 + 30, 200 + 40)
    v = ParallelDims(pp=2, schedule="zbv", microbatches=4, virtual_stages=2)
    assert estimate_parallel(shape, v, batch=4, stage_rank=0).parameters_per_device == 200 + 30 + 40
    assert estimate_parallel(shape, v, batch=4, stage_rank=1).parameters_per_device == 200
    # no pipeline: the model's whole outside (a tied tensor once)
    assert estimate_parallel(shape, ParallelDims(tp=2), batch=4).parameters_per_device == 400 / 2 + 50
    unknown = TransformerShape(layers=4, hidden=8, heads=2, sequence=4, vocab=0, layer_parameters=100,
                               other_parameters=50)  # fmt: skip
    assert estimate_parallel(unknown, looped, batch=4, stage_rank=1).parameters_per_device == 200 + 50


def test_each_stage_keeps_a_receive_buffer_a_microbatch_for_its_inputs_and_one_for_its_gradients() -> None:
    """torch.distributed.pipelining's stages allocate their receive buffers once and keep them: activations for
    every stage but the first, gradients for every stage but the last, one a microbatch, at the boundary's size."""
    from accelbench.estimate.activations import pipeline_receive_buffer_bytes
    from accelbench.estimate.facts import WorkloadFacts
    from accelbench.estimate.state import state_bytes

    shape = TransformerShape(layers=4, hidden=8, heads=2, sequence=4, vocab=16, layer_parameters=100,
                             other_parameters=50)  # fmt: skip
    facts = WorkloadFacts("gpt", "custom", 450, 450, 1.0, "", 4, transformer=shape)
    boundary = 4 * 2 * 8 * 4  # s b h float32 for a microbatch of 2
    state = state_bytes("fp32", "pp")

    def buffers(mesh: ParallelDims, rank: int) -> float:
        return pipeline_receive_buffer_bytes(facts, mesh, 2, state, rank) / boundary

    one = ParallelDims(pp=2, schedule="1f1b", microbatches=4)
    assert [buffers(one, r) for r in range(2)] == [4, 4]  # stage 0's gradients; stage 1's inputs
    looped = ParallelDims(pp=2, schedule="looped-bfs", microbatches=4, virtual_stages=2)
    assert [buffers(looped, r) for r in range(2)] == [12, 12]  # stages 0 and 2; 1 and 3
    deep = ParallelDims(pp=4, schedule="1f1b", microbatches=4)
    assert [buffers(deep, r) for r in range(4)] == [4, 8, 8, 4]
    sharded = ParallelDims(tp=2, pp=2, schedule="1f1b", microbatches=4, sequence_parallel=True)
    assert buffers(sharded, 0) == 2  # a sequence-parallel boundary is a shard


def test_the_last_stage_holds_one_microbatchs_logits_unless_every_forward_runs_first() -> None:
    from accelbench.estimate.activations import head_microbatches

    one = ParallelDims(pp=4, schedule="1f1b", microbatches=8)
    assert [head_microbatches(one, r) for r in range(4)] == [0, 0, 0, 1]
    assert head_microbatches(ParallelDims(pp=4, schedule="gpipe", microbatches=8), 3) == 8
    looped = ParallelDims(pp=2, schedule="looped-bfs", microbatches=4, virtual_stages=2)
    assert [head_microbatches(looped, r) for r in range(2)] == [0, 4]
    interleaved = ParallelDims(pp=2, schedule="interleaved-1f1b", microbatches=4, virtual_stages=2)
    assert [head_microbatches(interleaved, r) for r in range(2)] == [0, 1]
    v = ParallelDims(pp=2, schedule="zbv", microbatches=4, virtual_stages=2)
    assert [head_microbatches(v, r) for r in range(2)] == [1, 0]  # the V puts the last stage on rank 0


# ---------------------------------------------------------------------------------------------------------------
# --mesh as RunConfig makes it canonical
# ---------------------------------------------------------------------------------------------------------------


def layout_of(**options: object) -> dict[str, object]:
    c = RunConfig(**options)  # type: ignore[arg-type]
    return {k: getattr(c, k) for k in ("strategy", "mesh", "microbatches", "virtual_stages")}


def test_mesh_picks_the_strategy_and_fills_the_pipeline_defaults() -> None:
    assert parse_mesh("tp=2, DP=2,pp=1") == {"fsdp": 2, "tp": 2}  # data axis first, size-1 axes dropped
    assert layout_of(mesh="dp=2,tp=2", devices=4) == dict(strategy="mesh", mesh="fsdp=2,tp=2", microbatches=None,
                                                          virtual_stages=None)  # fmt: skip
    assert layout_of(strategy="pp", devices=4, batch_size=8) == dict(strategy="pp", mesh="pp=4", microbatches=4,
                                                                     virtual_stages=1)  # fmt: skip
    assert layout_of(mesh="tp=2,pp=2", devices=4, pp_schedule="zbv", batch_size=8)["virtual_stages"] == 2
    assert layout_of(mesh="ddp=4", devices=4) == dict(strategy="ddp", mesh=None, microbatches=None,
                                                      virtual_stages=None)  # fmt: skip
    # canonical, so a sweep's point and the record of its run are the same configuration
    config = RunConfig(mesh="pp=2,dp=2", devices=2, nnodes=2, placement="DP,pp")
    assert RunConfig(**config.model_dump()) == config and config.placement == "dp,pp"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(mesh="dp=2,tp=2", devices=2), "its sizes multiply to 4 device(s), but the job has 2"),
        (dict(mesh="tp=2,xp=2", devices=4), "'xp=2' is not AXIS=SIZE"),
        (dict(mesh="dp=2,ddp=2", devices=4), "the dp axis is given twice"),
        (dict(mesh="tp=2", strategy="ddp", devices=2), "that mesh runs as strategy 'tp'"),
        (dict(strategy="tp"), "tensor or pipeline parallelism needs at least 2 devices"),
        (dict(strategy="mesh", devices=2), "--strategy mesh needs --mesh"),
        (dict(mesh="ddp=2,tp=2", devices=4), "DDP cannot hold tensor-parallel (DTensor) parameters"),
        (
            dict(mesh="pp=2", devices=2, batch_size=8, microbatches=3),
            "--microbatches 3 does not divide --batch-size 8",
        ),
        (dict(mesh="pp=4", devices=4, batch_size=8, microbatches=2), "1f1b needs at least 4 microbatches"),
        (dict(mesh="pp=2", devices=2, pp_schedule="dualpipev", microbatches=2, batch_size=8), "at least 4"),
        (dict(mesh="pp=2", devices=2, virtual_stages=2), "1f1b holds one stage per rank"),
        (dict(mesh="pp=2", devices=2, pp_schedule="zbv", virtual_stages=3), "exactly 2 stages (V-shaped)"),
        (dict(mesh="tp=2", devices=2, microbatches=2), "they need a pp axis"),
        (dict(microbatches=2), "--microbatches describe(s) tensor or pipeline parallelism"),
        (dict(mesh="pp=2", devices=2, sequence_parallel=True), "--sequence-parallel shards along the tensor"),
        (dict(mesh="tp=2,pp=2", devices=4, placement="tp,dp"), "list the axes of --mesh tp=2,pp=2"),
        (dict(mesh="tp=2", devices=2, precision="fp16-mixed"), "does not support --precision fp16-mixed"),
        (dict(mesh="tp=2", devices=2, compile=True), "--compile"),
    ],
)
def test_layouts_that_cannot_run_are_refused_with_what_would(
    options: dict[str, object], message: str
) -> None:
    with pytest.raises(ValidationError) as info:
        RunConfig(**options)  # type: ignore[arg-type]
    assert message in str(info.value)


def gpt_config(**options: object) -> RunConfig:
    sizes = {"n_layer": 2, "n_head": 2, "n_embd": 16, "block_size": 16}
    return RunConfig(model="custom", workload_options=sizes, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            dict(mesh="tp=4", devices=4),
            "does not divide the model's 2 attention heads; a tp size must divide",
        ),
        (
            dict(mesh="pp=4", devices=4, batch_size=8),
            "4 pipeline stages (4 ranks x 1 stages each) for a model of 2",
        ),
        (dict(mesh="pp=2", devices=2, pp_schedule="zbv"), "4 pipeline stages (2 ranks x 2 stages each)"),
    ],
)
def test_layouts_the_model_cannot_take_are_refused(options: dict[str, object], message: str) -> None:
    config = gpt_config(**options)
    with pytest.raises(ConfigError, match=None) as info:
        check_model_split(config, gpt_units(2, 2, 16, 16), "gpt")
    assert message in str(info.value)


def test_sequence_parallelism_needs_a_divisible_sequence() -> None:
    config = gpt_config(mesh="tp=2", devices=2, sequence_parallel=True)
    check_model_split(config, gpt_units(2, 2, 16, 16), "gpt")  # 16 positions over 2: fine
    with pytest.raises(ConfigError, match="shards the sequence of 15 positions unevenly"):
        check_model_split(config, gpt_units(2, 2, 16, 15), "gpt")


# ---------------------------------------------------------------------------------------------------------------
# Where ranks sit, and how stages are dealt
# ---------------------------------------------------------------------------------------------------------------


def test_default_placement_keeps_tensor_parallelism_inside_a_node() -> None:
    # 8 ranks on 2 nodes of 4: auto order pp, dp, tp (outermost first)
    layout = ParallelDims.of(RunConfig(mesh="dp=2,tp=2,pp=2", devices=4, nnodes=2, batch_size=8))
    assert layout.order == ("pp", "dp", "tp")
    assert layout.coordinates(5) == {"pp": 1, "dp": 0, "tp": 1}
    assert layout.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]] and layout.within_node("tp")
    assert layout.groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]] and not layout.within_node("pp")
    given = ParallelDims.of(
        RunConfig(mesh="dp=2,tp=2,pp=2", devices=4, nnodes=2, batch_size=8, placement="tp,dp,pp")
    )
    assert given.groups("tp") == [[0, 4], [1, 5], [2, 6], [3, 7]] and not given.within_node("tp")
    assert given.describe()["axes"]["pp"]["within_node"] is True


def test_one_layout_object_for_every_strategy_and_for_the_estimate() -> None:
    from accelbench.estimate.predictor import run_shape

    # data parallelism alone: a dp axis over the whole job, run by the strategy
    ddp = ParallelDims.of(RunConfig(strategy="ddp", devices=2, nnodes=2))
    assert (ddp.dp, ddp.tp, ddp.pp, ddp.data_parallel, ddp.world, ddp.model_parallel) == (
        4,
        1,
        1,
        "ddp",
        4,
        1,
    )
    assert (
        not ddp.shards_parameters and ParallelDims.of(RunConfig(strategy="fsdp", devices=2)).shards_parameters
    )
    single = ParallelDims.of(RunConfig())
    assert (single.world, single.data_parallel, single.sizes) == (1, None, {})
    # a mesh: the pipeline's defaults as RunConfig filled them in; the estimate reads the very same object
    config = RunConfig(mesh="ddp=2,pp=2", devices=4, batch_size=8, pp_schedule="interleaved-1f1b")
    dims = ParallelDims.of(config)
    assert (dims.dp, dims.pp, dims.data_parallel, dims.virtual_stages, dims.microbatches) == (
        2,
        2,
        "ddp",
        2,
        4,
    )
    assert dims.sizes == {"pp": 2, "dp": 2} and dims.stages == 4 and not dims.shards_parameters
    shape = run_shape(config)
    assert shape.dims == dims and shape.devices == 4
    # a label read back from a record
    assert ParallelDims.from_mesh("fsdp=2,tp=4").sizes == {"dp": 2, "tp": 4}


def test_stages_per_rank_by_schedule() -> None:
    looped = ParallelDims.of(RunConfig(mesh="pp=2", devices=2, pp_schedule="interleaved-1f1b", virtual_stages=3,
                                 batch_size=12))  # fmt: skip
    assert looped.stage_ids(1) == [1, 3, 5] and [looped.stage_holder(s) for s in range(6)] == [
        0,
        1,
        0,
        1,
        0,
        1,
    ]
    v = ParallelDims.of(RunConfig(mesh="pp=2", devices=2, pp_schedule="zbv"))
    assert v.stage_ids(0) == [0, 3] and v.stage_ids(1) == [1, 2] and v.stage_holder(3) == 0


def test_units_are_dealt_by_layers_or_balanced_parameters() -> None:
    assert split_units([1] * 5, 2, "layers") == [range(0, 3), range(3, 5)]
    # the head (last_extra) weighs on the last stage: it takes fewer units when balanced by parameters
    assert split_units([10] * 4, 2, "parameters", first_extra=0, last_extra=20) == [range(0, 3), range(3, 4)]
    assert split_units([5, 1, 1, 5], 3, "parameters") == [range(0, 1), range(1, 3), range(3, 4)]
    with pytest.raises(ValueError):
        split_units([1, 1], 3, "layers")


def test_compare_groups_and_labels_by_mesh_schedule_and_microbatches() -> None:
    base = dict(workload="gpt", model="custom", batch_size=8, precision="fp32", data=None, steps_per_epoch=3,
                learning_rate=3e-4)  # fmt: skip
    pipelined = WorkloadKey.from_fields({**base, "strategy": "mesh", "mesh": "tp=2,pp=2", "pp_schedule":
                                         "interleaved-1f1b", "virtual_stages": 2, "microbatches": 4}, {})  # fmt: skip
    assert (pipelined.mesh, pipelined.pp_schedule, pipelined.microbatches) == (
        "tp=2,pp=2",
        "interleaved-1f1b v2",
        4,
    )
    assert "mesh tp=2,pp=2 · interleaved-1f1b v2 schedule · 4 microbatches" in pipelined.describe()
    tensor = WorkloadKey.from_fields({**base, "strategy": "tp", "mesh": "tp=2", "sequence_parallel": True,
                                      "pp_schedule": "1f1b"}, {})  # fmt: skip
    assert (tensor.mesh, tensor.pp_schedule, tensor.microbatches) == ("tp=2 sp", None, None)
    plain = WorkloadKey.from_fields({**base, "strategy": "ddp"}, {})
    assert (plain.mesh, plain.pp_schedule) == (None, None) and "mesh" not in plain.describe()
    assert pipelined.value("mesh") == "tp=2,pp=2"


def test_the_suite_holds_the_mesh_shapes_of_seed_003_figures_13_to_15() -> None:
    from accelbench.sweep.spec import builtin_suites, load_sweep

    path = builtin_suites()["seed-parallel-mesh"]
    seed = load_sweep(path).points
    meshes = [p.values["mesh"] for p in seed]
    assert {m for m in meshes if "tp" in m and "pp" in m} == {"tp=2,pp=32", "tp=4,pp=16", "tp=8,pp=8", "tp=16,pp=4",
                                                              "tp=32,pp=2"}  # fmt: skip
    # figures 14 and 15: three global batches (32, 128, 512) per mesh, microbatches of one sample
    for p in seed:
        dp = parse_mesh(p.values["mesh"]).get("fsdp", 1)
        if "tp" in p.values["mesh"] and "pp" in p.values["mesh"]:
            assert p.values["batch_size"] == 128 and p.values["n_layer"] == 40
        else:
            assert p.values["batch_size"] * dp in (32, 128, 512)
            assert p.values.get("microbatches", p.values["batch_size"]) == p.values["batch_size"]
    assert len(seed) == 5 + 15 + 15 and all(p.values["devices"] * p.values["nnodes"] == 64 for p in seed)
    tiny = load_sweep(path, scale="tiny").points
    assert all(p.values["devices"] == 4 and p.values["steps_per_epoch"] <= 8 for p in tiny)
    assert {p.values["mesh"] for p in tiny} >= {"tp=2,pp=2", "dp=2,pp=2", "tp=2,dp=2", "tp=4", "pp=4", "dp=4"}


_NORM_OVER_THE_MESH = textwrap.dedent(
    """
    import logging, io, sys
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.distributed.tensor import DTensor, Shard
    from accelbench.engine.parallel.mesh import build_device_mesh
    from accelbench.parallel_dims import ParallelDims

    dist.init_process_group("fake", rank=0, world_size=4, store=FakeStore())
    said = io.StringIO()
    logging.getLogger("torch.distributed.tensor._redistribute").addHandler(logging.StreamHandler(said))
    mesh = build_device_mesh(ParallelDims.from_mesh(sys.argv[1]), "cpu")
    gradient = DTensor.from_local(torch.ones(4, 4), mesh["dp", "tp"], [Shard(0), Shard(1)])
    torch.nn.utils.get_total_norm([gradient]).full_tensor()
    print(sorted(mesh._flatten_mapping), "sequential all_reduce" in said.getvalue())
    """
)


@pytest.mark.parametrize(("mesh", "flattened"), [("dp=2,tp=2", True), ("ddp=2,tp=2", False)])
def test_fsdp_beside_tp_reduces_a_gradients_norm_in_one_all_reduce(mesh: str, flattened: bool) -> None:
    """A gradient sharded over dp (FSDP2) and tp: the mesh flattens the two so that DTensor reduces its norm
    (clipping's) in one all-reduce; without it DTensor runs one per dimension and warns on every rank (as it does
    for this 2-D DTensor on a DDP mesh, whose gradients are never sharded over dp). torch's fake process group: four
    ranks, nothing moved."""
    done = subprocess.run(
        [sys.executable, "-c", _NORM_OVER_THE_MESH, mesh], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    names, warned = done.stdout.split("]")
    assert ("dp_tp" in names) is flattened
    assert warned.strip() == str(not flattened)
