"""The layout planner: blocks, stages and phases of every strategy, for the seed study's model sizes and
1..16 IPUs, checked against PopTorch's placement rules, and the refusals of what cannot be placed."""

from __future__ import annotations

import pytest
from accelbench_ipu.layout import Layout, parse_layers_per_ipu, plan_layout

from accelbench.errors import ConfigError
from accelbench.workloads.gpt import gpt_units

IPU_COUNTS = [1, 2, 4, 8, 16]
SPLIT_STRATEGIES = ["pipelined", "sharded", "serial-phased", "parallel-phased"]
# the seed study's IPU models (12 layers, embedding 384 or 768) and minGPT's smallest sizes
SEED_MODELS = {"ipu-384": 12, "ipu-768": 12}


def check_rules(layout: Layout) -> None:
    """What PopTorch demands of an annotation, and what the GPT mapping promises."""
    blocks = [b.block_id for b in layout.blocks]
    assert blocks[0] == "embedding" and blocks[-1] == "head"
    # every transformer layer appears once, in order, whole or as its two halves
    units = blocks[1:-1]
    expected = (
        [f"layer{i}" for i in range(layout.n_layer)]
        if layout.granularity == "layer"
        else [f"layer{i}.{half}" for i in range(layout.n_layer) for half in ("attn", "mlp")]
    )
    assert units == expected
    # every block in exactly one stage, and the stage says the block's IPU
    owners = [s for s in layout.stages for b in s.blocks]
    assert sorted(b for s in layout.stages for b in s.blocks) == sorted(blocks)
    assert len(owners) == len(blocks)
    for block in layout.blocks:
        stage = layout.stages[block.stage]
        assert block.block_id in stage.blocks and stage.ipu == block.ipu and stage.phase == block.phase
    # the tied embedding/head weight stays on IPU 0
    by_id = {b.block_id: b for b in layout.blocks}
    assert by_id["embedding"].ipu == 0 and by_id["head"].ipu == 0
    # every IPU of the replica is used
    assert {s.ipu for s in layout.stages} == set(range(layout.ipus))
    if layout.phases is None:
        order = [b.stage for b in layout.blocks]
        assert order == sorted(order), "stage ids must rise in execution order"
        assert all(s.blocks for s in layout.stages)
    else:
        order = [b.phase for b in layout.blocks]
        assert order == sorted(order), "phases must rise in execution order"
        for p in range(layout.phases):
            on = sorted(s.ipu for s in layout.phase_stages(p))
            if layout.strategy == "serial-phased":
                assert on == list(range(layout.ipus)), "a stage on every IPU of the group"
            else:
                assert on == list(range(p % 2, layout.ipus, 2)), "even phases on even IPUs, odd on odd"


@pytest.mark.parametrize("model", sorted(SEED_MODELS))
@pytest.mark.parametrize("ipus", IPU_COUNTS)
@pytest.mark.parametrize("strategy", SPLIT_STRATEGIES)
def test_seed_models_place_on_every_ipu_count(strategy: str, ipus: int, model: str) -> None:
    layout = plan_layout(strategy, gpt_units(SEED_MODELS[model]), ipus, model=model)
    check_rules(layout)
    assert layout.ipus == ipus
    if strategy in ("pipelined", "sharded"):
        assert layout.pipeline_stages == (1 if ipus == 1 else ipus + 1)
    if strategy == "pipelined" and ipus > 1:
        assert layout.min_gradient_accumulation == 2 * (ipus + 1) - 1
    if strategy == "parallel-phased" and ipus > 1:
        assert layout.phases is not None and layout.phases >= 3 and layout.phases % 2 == 1


@pytest.mark.parametrize(
    ("strategy", "ipus", "granularity", "per_ipu_units"),
    [
        ("pipelined", 4, "layer", [3, 3, 3, 3]),  # 12 layers split evenly
        ("pipelined", 8, "half-layer", [3] * 8),  # 1.5 layers each beats 1 or 2 whole layers
        ("pipelined", 16, "half-layer", [1] * 8 + [2] * 8),  # more IPUs than layers
        ("sharded", 2, "layer", [6, 6]),
    ],
)
def test_pipeline_splits_layers_evenly(
    strategy: str, ipus: int, granularity: str, per_ipu_units: list[int]
) -> None:
    layout = plan_layout(strategy, gpt_units(12), ipus)
    assert layout.granularity == granularity
    units = [
        sum(1 for b in layout.blocks if b.ipu == i and b.block_id.startswith("layer")) for i in range(ipus)
    ]
    assert units == per_ipu_units
    assert layout.stages[-1].blocks == ("head",) and layout.stages[-1].ipu == 0
    assert layout.stages[0].blocks[0] == "embedding"


def test_layers_per_ipu_list_is_followed() -> None:
    layout = plan_layout("pipelined", gpt_units(12), 4, [0, 4, 4, 4])
    check_rules(layout)
    assert [s.blocks for s in layout.stages] == [
        ("embedding",),
        ("layer0", "layer1", "layer2", "layer3"),
        ("layer4", "layer5", "layer6", "layer7"),
        ("layer8", "layer9", "layer10", "layer11"),
        ("head",),
    ]


@pytest.mark.parametrize(
    ("counts", "message"),
    [
        ([4, 4, 4], "has 3 entries for 4 IPUs"),
        ([3, 3, 3, 4], "places 13 layers, but the model has 12"),
        ([6, 0, 3, 3], "leaves IPU 1 without a layer"),
    ],
)
def test_bad_layers_per_ipu_say_what_works(counts: list[int], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        plan_layout("pipelined", gpt_units(12), 4, counts)
    assert "3,3,3,3" in str(info.value)


def test_layers_per_ipu_text() -> None:
    assert parse_layers_per_ipu("2, 4,4,2") == [2, 4, 4, 2]
    assert parse_layers_per_ipu(None) is None
    with pytest.raises(ConfigError, match="whole numbers"):
        parse_layers_per_ipu("2;4")
    with pytest.raises(ConfigError, match="negative"):
        parse_layers_per_ipu("4,-1")
    with pytest.raises(ConfigError, match="applies to pipelined and sharded"):
        plan_layout("serial-phased", gpt_units(12), 4, [3, 3, 3, 3])


def test_phased_layouts_one_layer_per_stage() -> None:
    serial = plan_layout("serial-phased", gpt_units(12), 4)
    assert serial.phases == 3 and serial.granularity == "layer"
    assert [s.blocks for s in serial.phase_stages(0)] == [
        ("embedding", "layer0"),
        ("layer1",),
        ("layer2",),
        ("layer3",),
    ]
    assert serial.phase_stages(2)[0].blocks == ("layer8", "head")
    one = plan_layout("serial-phased", gpt_units(12), 1)
    assert one.phases == 12  # one IPU: each layer's weights stream in for its own phase
    parallel = plan_layout("parallel-phased", gpt_units(12), 8)
    assert parallel.phases == 3 and [s.ipu for s in parallel.phase_stages(1)] == [1, 3, 5, 7]
    single_ipu = plan_layout("parallel-phased", gpt_units(12), 1)
    assert single_ipu.phases == 1 and single_ipu.stages[0].blocks[-1] == "head"


def test_parallel_phased_keeps_an_odd_phase_count_for_the_tied_head() -> None:
    layout = plan_layout(
        "parallel-phased", gpt_units(12), 2
    )  # 12 layers over 1-IPU groups: 12 phases would end odd
    check_rules(layout)
    assert layout.phases == 11
    assert layout.stages[-1].ipu == 0 and layout.stages[-1].blocks[-1] == "head"


@pytest.mark.parametrize("ipus", IPU_COUNTS)
@pytest.mark.parametrize("strategy", SPLIT_STRATEGIES)
def test_gpt_nano_fits_or_is_refused_with_what_works(strategy: str, ipus: int) -> None:
    """gpt-nano's 3 layers (6 half layers) cannot fill 8 or 16 IPUs (nor 8 for parallel phased)."""
    fits = {"pipelined": 4, "sharded": 4, "serial-phased": 4, "parallel-phased": 4}[strategy]
    if ipus <= fits:
        check_rules(plan_layout(strategy, gpt_units(3), ipus, model="gpt-nano"))
        return
    with pytest.raises(ConfigError) as info:
        plan_layout(strategy, gpt_units(3), ipus, model="gpt-nano")
    text = str(info.value)
    assert "gpt-nano has 3 transformer layers" in text
    assert f"--ipus {fits} or fewer" in text


def test_other_refusals() -> None:
    with pytest.raises(ConfigError, match="strategy 'single' runs a whole replica on one IPU"):
        plan_layout("single", gpt_units(12), 2)
    with pytest.raises(ConfigError, match="two groups must be equally large; use an even number"):
        plan_layout("parallel-phased", gpt_units(12), 3)
    with pytest.raises(ConfigError, match="unknown IPU strategy 'ddp'"):
        plan_layout("ddp", gpt_units(12), 2)


def test_describe_records_the_layout() -> None:
    pipelined = plan_layout("pipelined", gpt_units(12), 2).describe()
    assert pipelined["stages"][-1] == {"stage": 2, "ipu": 0, "blocks": ["head"]}
    assert pipelined["blocks"]["layer0"] == "blocks.0" and pipelined["blocks"]["head"] == "ln_f"
    phased = plan_layout("serial-phased", gpt_units(12), 4).describe()
    assert len(phased["phases"]) == 3 and phased["phases"][0][0]["blocks"] == ["embedding", "layer0"]
    halves = plan_layout("pipelined", gpt_units(12), 8).describe()
    assert halves["blocks"]["layer0.mlp"] == "blocks.0.ln_2"
