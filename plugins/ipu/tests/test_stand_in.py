"""The stand-in poptorch refuses what real PopTorch refuses (IPU.md's rules), so the mapping tests mean
something. Run against the real poptorch (on the IPU Model) the same calls must fail too; the exact
messages are checked only against the stand-in."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from ipu_helpers import REAL_POPTORCH, stand_in_only
from torch import nn


class Chain(nn.Module):
    """Three linear layers and a loss; ``tied``: the last reuses the first's weight (like an LM head)."""

    def __init__(self, tied: bool = False) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)
        if tied:
            self.c.weight = self.a.weight

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(self.c(self.b(self.a(x))), y)


def fails(match: str):  # type: ignore[no-untyped-def]
    """pytest.raises for a refusal; the message is checked against the stand-in only."""
    return pytest.raises(Exception, match=None if REAL_POPTORCH else match)


def compile_chain(
    strategy_for,  # type: ignore[no-untyped-def]
    ipus: tuple[int, int, int],
    batch: int = 4,
    tied: bool = False,
    configure=None,  # type: ignore[no-untyped-def]
):
    import poptorch

    model = Chain(tied)
    for name, ipu in zip("abc", ipus, strict=True):
        poptorch.BeginBlock(getattr(model, name), name, ipu)
    opts = poptorch.Options()
    opts.setExecutionStrategy(strategy_for(poptorch))
    if configure:
        configure(opts)
    trainer = poptorch.trainingModel(model, opts, poptorch.optim.AdamW(model.parameters(), lr=0.01))
    try:
        trainer.compile(torch.randn(batch, 4), torch.randn(batch, 4))
    finally:
        trainer.destroy()
    return trainer


def test_options_setters_return_self_and_check_types() -> None:
    import poptorch

    opts = poptorch.Options()
    assert opts.deviceIterations(2) is opts and opts.replicationFactor(1) is opts
    assert opts.Training.gradientAccumulation(4) is opts.Training
    assert opts.Precision.setPartialsType(torch.half) is opts.Precision
    with pytest.raises((AssertionError, ValueError)):
        opts.replicationFactor("2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="torch.float or torch.half"):
        opts.Precision.setPartialsType(torch.bfloat16)


def test_a_block_outside_the_strategy_is_an_unknown_block() -> None:
    with fails(r"Unknown Block 'c'"):
        compile_chain(
            lambda p: p.PipelinedExecution(p.Stage("a").ipu(0), p.Stage("b").ipu(1)), (0, 1, 1), batch=3
        )


def test_a_block_in_two_stages_is_refused() -> None:
    import poptorch

    with pytest.raises(AssertionError, match="associated with more than one stage"):
        poptorch.PipelinedExecution(poptorch.Stage("a", "b"), poptorch.Stage("b"))


def test_a_module_opens_one_block_only() -> None:
    import poptorch

    layer = nn.Linear(2, 2)
    poptorch.BeginBlock(layer, "x", 0)
    with pytest.raises(Exception, match="already been assigned to a block"):
        poptorch.BeginBlock(layer, "y", 1)
    poptorch.removeBlocks(layer)
    poptorch.BeginBlock(layer, "y", 1)  # allowed again once removed


def test_pipeline_stage_ids_must_rise() -> None:
    def backwards(p):  # type: ignore[no-untyped-def]
        return p.PipelinedExecution(p.Stage("c").ipu(0), p.Stage("a").ipu(1), p.Stage("b").ipu(2))

    with fails("pipeline stage ids must be ascending"):
        compile_chain(backwards, (0, 1, 2), batch=5, configure=lambda o: o.Training.gradientAccumulation(5))


def test_pipelined_training_needs_accumulation_of_2s_minus_1() -> None:
    def three(p):  # type: ignore[no-untyped-def]
        return p.PipelinedExecution(p.Stage("a").ipu(0), p.Stage("b").ipu(1), p.Stage("c").ipu(2))

    def auto_round_with(ga: int):  # type: ignore[no-untyped-def]
        return lambda o: (o.Training.gradientAccumulation(ga), o.autoRoundNumIPUs(True))

    with fails(re.escape("greater than or equal to the number of pipeline stages (5)")):
        compile_chain(three, (0, 1, 2), batch=4, configure=auto_round_with(4))
    trainer = compile_chain(three, (0, 1, 2), batch=5, configure=auto_round_with(5))
    if not REAL_POPTORCH:
        assert trainer.pipeline_stages == 3


def test_weights_shared_across_ipus_are_refused_when_sharded() -> None:
    def sharded(p):  # type: ignore[no-untyped-def]
        return p.ShardedExecution(p.Stage("a").ipu(0), p.Stage("b").ipu(1), p.Stage("c").ipu(1))

    with fails("layers sharing weights need to be placed on the same IPU"):
        compile_chain(sharded, (0, 1, 1), tied=True)
    compile_chain(sharded, (0, 1, 1), tied=False)

    def tied_on_one(p):  # type: ignore[no-untyped-def]
        return p.ShardedExecution(p.Stage("a").ipu(0), p.Stage("b").ipu(1), p.Stage("c").ipu(0))

    compile_chain(tied_on_one, (0, 1, 0), tied=True)  # the head back on the first IPU, as accelbench does


def test_parallel_phases_alternate_even_and_odd_ipus() -> None:
    def wrong(p):  # type: ignore[no-untyped-def]
        return p.ParallelPhasedExecution(
            p.Phase(p.Stage("a").ipu(0)), p.Phase(p.Stage("b").ipu(0)), p.Phase(p.Stage("c").ipu(0))
        )

    with fails("even phases on even IPUs and odd phases on odd IPUs"):
        compile_chain(wrong, (0, 0, 0))

    def right(p):  # type: ignore[no-untyped-def]
        return p.ParallelPhasedExecution(
            p.Phase(p.Stage("a").ipu(0)), p.Phase(p.Stage("b").ipu(1)), p.Phase(p.Stage("c").ipu(0))
        )

    compile_chain(right, (0, 1, 0))


def test_serial_phases_need_a_stage_on_every_ipu() -> None:
    def short(p):  # type: ignore[no-untyped-def]
        return p.SerialPhasedExecution(
            p.Phase(p.Stage("a").ipu(0), p.Stage("b").ipu(1)), p.Phase(p.Stage("c").ipu(0))
        )

    with fails("each phase needs as many stages as IPUs in its group"):
        compile_chain(short, (0, 1, 0))


def test_ipus_are_reserved_in_powers_of_two() -> None:
    def three(p):  # type: ignore[no-untyped-def]
        return p.ShardedExecution(p.Stage("a").ipu(0), p.Stage("b").ipu(1), p.Stage("c").ipu(2))

    with fails("reserved in powers of two"):
        compile_chain(three, (0, 1, 2))
    compile_chain(three, (0, 1, 2), configure=lambda o: o.autoRoundNumIPUs(True))


def test_batch_must_divide_by_iterations_replicas_accumulation() -> None:
    def one(p):  # type: ignore[no-untyped-def]
        return p.ShardedExecution(p.Stage("a", "b", "c").ipu(0))

    with fails(re.escape("Invalid batch dimension")):
        compile_chain(one, (0, 0, 0), batch=6, configure=lambda o: o.deviceIterations(4))
    compile_chain(one, (0, 0, 0), batch=8, configure=lambda o: o.deviceIterations(4))


def test_a_model_is_wrapped_once_at_a_time() -> None:
    import poptorch

    model = Chain()
    first = poptorch.trainingModel(model, poptorch.Options())
    with fails("already been wrapped"):
        poptorch.trainingModel(model, poptorch.Options())
    first.destroy()
    poptorch.trainingModel(model, poptorch.Options()).destroy()


@stand_in_only
def test_the_ipu_model_has_no_replication(monkeypatch: pytest.MonkeyPatch) -> None:
    def one(p):  # type: ignore[no-untyped-def]
        return p.ShardedExecution(p.Stage("a", "b", "c").ipu(0))

    with fails("does not support replication"):
        compile_chain(one, (0, 0, 0), configure=lambda o: (o.useIpuModel(True), o.replicationFactor(2)))


@stand_in_only
def test_hardware_must_have_the_ipus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_POPTORCH_IPUS", "2")

    def four(p):  # type: ignore[no-untyped-def]
        return p.ShardedExecution(p.Stage("a").ipu(0), p.Stage("b").ipu(1), p.Stage("c").ipu(3))

    with fails("Failed to acquire 4 IPU"):
        compile_chain(four, (0, 1, 3))


def test_an_executable_takes_only_its_input_shapes() -> None:
    import poptorch

    model = Chain()
    trainer = poptorch.trainingModel(
        model, poptorch.Options(), poptorch.optim.AdamW(model.parameters(), lr=0.01)
    )
    trainer(torch.randn(4, 4), torch.randn(4, 4))
    with fails("fixed input shapes"):
        trainer(torch.randn(3, 4), torch.randn(3, 4))
    trainer.destroy()


@stand_in_only
def test_training_is_real_and_follows_the_batch_arithmetic() -> None:
    """Mean-reduced accumulation over micro-batches gives the full-batch gradient: same losses either way."""
    import poptorch

    def train(ga: int, di: int) -> list[float]:
        torch.manual_seed(0)
        model = Chain()
        opts = poptorch.Options().deviceIterations(di).outputMode(poptorch.OutputMode.All)
        opts.Training.gradientAccumulation(ga)
        trainer = poptorch.trainingModel(model, opts, poptorch.optim.AdamW(model.parameters(), lr=0.05))
        x, y = torch.randn(8 * di, 4), torch.randn(8 * di, 4)
        losses = [trainer(x, y).mean().item() for _ in range(5)]
        steps = trainer.optimizer.state[model.a.weight]["step"]
        trainer.destroy()
        assert int(steps) == 5 * di  # device iterations = optimizer steps per call
        return losses

    one, four = train(1, 1), train(4, 1)
    assert one == pytest.approx(four, rel=1e-5)
    assert one[-1] < one[0]
    train(2, 3)
