"""``--grad-accum N``: a batch as N micro-batches and one optimizer step, in every executor; a batch it does not
divide is refused; it is recorded. And the host facts seed 004 needs (NUMA layout, CPU affinity)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from core_support import TINY, accelbench, accelbench_here, run_here

from accelbench.contract import ExecutorRequest, World, standard_plan
from accelbench.engine.executor import TorchExecutor
from accelbench.hostinfo import cpu_list, numa_nodes
from accelbench.plugins import get_host
from accelbench.results import read_record
from accelbench.testing import tiny_config


def one_step(grad_accum: int, batch: int = 8) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The loss and the parameters after one training step of the tiny GPT on its first batch."""
    host = get_host()
    config = host.resolve(tiny_config(batch_size=8, grad_accum=grad_accum, epochs=1))
    job = host.workload(config.workload).build(config)
    request = ExecutorRequest(
        config=config,
        device=torch.device("cpu"),
        precision=standard_plan("fp32", "ieee-fp32"),
        world=World(),
        backend=get_host().backends["cpu"],
        units=job.units,
    )
    executor = TorchExecutor(request)
    executor.setup(job)
    inputs, targets = next(job.data.batches(0))
    loss = executor.train_step(inputs[:batch], targets[:batch])
    assert executor.describe()["grad_accum"] == grad_accum
    return loss, [p.detach().clone() for p in executor.model.parameters()]


@pytest.mark.parametrize("grad_accum, batch", [(2, 8), (4, 8), (4, 6)], ids=["2x4", "4x2", "last-batch-of-6"])
def test_micro_batches_make_the_step_of_the_whole_batch(grad_accum: int, batch: int) -> None:
    whole_loss, whole = one_step(1, batch)
    loss, accumulated = one_step(grad_accum, batch)
    assert loss.item() == pytest.approx(whole_loss.item(), rel=1e-5)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(whole, accumulated, strict=True))


def test_a_batch_the_accumulation_does_not_divide_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, stderr = accelbench_here(capsys, "run", *TINY, "--batch-size", "10", "--grad-accum", "4",
                                   "--output-dir", str(tmp_path))  # fmt: skip
    assert code == 2 and not list(tmp_path.glob("*.json"))
    assert "--batch-size 10 is not divisible by --grad-accum 4" in stderr
    assert "use a batch size of 8 or 12" in stderr


def test_accumulation_is_recorded_and_separates_comparisons(tmp_path: Path) -> None:
    assert run_here(*TINY, "--epochs", "2", "--steps-per-epoch", "2", "--grad-accum", "2", "-q",
                    "--output-dir", str(tmp_path)) == 0  # fmt: skip
    record = read_record(next(tmp_path.glob("*.json")))
    assert record.config.grad_accum == 2 and record.executor["micro_batch"] == 4
    assert record.workload_identity["grad_accum"] == 2  # compare does not mix it with unaccumulated runs


needs_deepspeed = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None,
    reason="DeepSpeed not installed (pip install 'accelbench[deepspeed]')",
)
needs_lightning = pytest.mark.skipif(
    importlib.util.find_spec("lightning") is None,
    reason="Lightning not installed (pip install 'accelbench[lightning]')",
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["--strategy", "deepspeed-zero2"], marks=needs_deepspeed, id="deepspeed-zero2"),
        pytest.param(
            ["--strategy", "ddp", "--engine", "lightning"], marks=needs_lightning, id="lightning-ddp"
        ),
    ],
)
def test_other_engines_accumulate_on_two_processes(args: list[str], tmp_path: Path) -> None:
    proc = accelbench("run", *TINY, *args, "--devices", "2", "--grad-accum", "2", "--epochs", "2",
                      "--steps-per-epoch", "2", "-q", "--output-dir", str(tmp_path))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = read_record(next(tmp_path.glob("*.json")))
    assert record.outcome.status == "ok" and record.executor["grad_accum"] == 2
    if "deepspeed-zero2" in args:
        config = record.executor["deepspeed_config"]
        assert config["gradient_accumulation_steps"] == 2 and config["train_micro_batch_size_per_gpu"] == 4


def test_numa_layout_and_affinity_are_read_from_the_os(tmp_path: Path) -> None:
    for node, cpus in (("node0", "0-3,8-11"), ("node1", "4-7,12-15"), ("node10", "16")):
        (tmp_path / node).mkdir()
        (tmp_path / node / "cpulist").write_text(cpus + "\n")
    (tmp_path / "possible").write_text("0-10\n")
    assert numa_nodes(tmp_path) == {"node0": "0-3,8-11", "node1": "4-7,12-15", "node10": "16"}
    assert numa_nodes(tmp_path / "absent") == {}
    assert cpu_list({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11" and cpu_list([]) == ""
