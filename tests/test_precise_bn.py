"""Precise batch norm before a held-out evaluation (the image workloads' ``--precise-bn N``), and synthetic images
whose class can be seen in any crop of them."""

from __future__ import annotations

import importlib.util
import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from core_support import accelbench

from accelbench.config import RunConfig
from accelbench.contract import DataShard, Executor, ExecutorRequest, World
from accelbench.engine.executor import TorchExecutor
from accelbench.engine.metrics import RankLog
from accelbench.engine.quality import QualityChecks
from accelbench.plugins import get_host
from accelbench.results import read_record

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torchvision") is None,
    reason="the image workloads need torchvision (the [vision] extra)",
)


def mobilenet(**options: object) -> tuple[RunConfig, object, TorchExecutor]:
    host = get_host()
    config = host.resolve(
        RunConfig(
            workload="mobilenet-v3-small",
            batch_size=8,
            steps_per_epoch=4,
            epochs=1,
            threads=1,
            eval_batches=2,
            workload_options={"image_size": 32, "num_classes": 8, "data_workers": 0, **options},
        )
    )
    job = host.workload(config.workload).build(config)
    backend, device = host.select_backend("cpu"), torch.device("cpu")
    plan = backend.precision_plan(config.precision, device, config.backend_options)
    executor = TorchExecutor(ExecutorRequest(config, device, plan, World(), backend, job.units))
    executor.setup(job)
    return config, job, executor


def batch_norms(model: torch.nn.Module) -> list[torch.nn.modules.batchnorm._BatchNorm]:
    return [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]


def test_precise_bn_averages_the_given_batches_and_puts_the_training_statistics_back() -> None:
    _, job, executor = mobilenet()
    batches = list(itertools.islice(job.data.batches(5), 3))
    for x, y in job.data.batches(0):  # a step, so that the training's statistics are not the initial ones
        executor.train_step(x, y)
    norms = batch_norms(executor.model)
    before = [{n: b.clone() for n, b in m.named_buffers(recurse=False)} for m in norms]
    first = norms[0]
    dropouts = [m for m in executor.model.modules() if isinstance(m, torch.nn.Dropout)]
    seen: list[torch.Tensor] = []  # what the first batch norm is given, batch by batch
    modes: list[tuple[bool, list[bool]]] = []  # its mode and the dropouts' while it is given them

    def given(_m: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        seen.append(args[0].detach().clone())
        modes.append((first.training, [d.training for d in dropouts]))

    hook = first.register_forward_pre_hook(given)
    with executor.norm_statistics_recomputed(iter(batches)) as used:
        hook.remove()
        assert used == 3 and dropouts
        # recomputed under the forward evaluation runs (dropout off), the batch norms normalising by each batch
        assert all(norm_mode and not any(drop) for norm_mode, drop in modes)
        # momentum None: the plain average of each batch's mean and (unbiased) variance
        means = torch.stack([s.mean(dim=(0, 2, 3)) for s in seen])
        variances = torch.stack([s.var(dim=(0, 2, 3), unbiased=True) for s in seen])
        assert torch.allclose(first.running_mean, means.mean(0), atol=1e-5, rtol=1e-4)
        assert torch.allclose(first.running_var, variances.mean(0), atol=1e-5, rtol=1e-4)
        assert int(first.num_batches_tracked) == 3
        assert not torch.equal(first.running_mean, before[0]["running_mean"])
        # inside, the model is as training left it, and a train-mode forward (the gradient probe's, on a held-out
        # batch) leaves the new statistics as they are
        assert all(m.training for m in executor.model.modules())
        recomputed = first.running_mean.clone()
        executor.gradient_norm(*batches[0])
        assert torch.equal(first.running_mean, recomputed)
    for m, kept in zip(norms, before, strict=True):
        assert m.momentum == pytest.approx(0.01)  # torchvision's MobileNetV3
        for name, value in kept.items():
            assert torch.equal(getattr(m, name), value), name
    assert executor.model.training


def test_an_evaluation_with_precise_bn_says_so_and_one_whose_executor_cannot_says_that() -> None:
    config, job, executor = mobilenet(precise_bn=2)
    assert job.norm_statistics_batches == 2
    log = RankLog(0, "host", [0.1], [32], [4], epoch_loss=[2.0])
    checks = QualityChecks(config, job, executor, executor.backend, torch.device("cpu"), DataShard(0, 1))
    checks.after_epoch(0, log, torch.tensor([2.0] * 4), 4)
    record = checks.record(1)
    assert "recomputed over 2 training batch(es) per rank before each evaluation (precise BN)" in (
        record.validation or ""
    )
    assert record.epochs[0].val_loss is not None and math.isfinite(record.epochs[0].val_loss)

    class Plain(Executor):  # a plugin's executor written before contract 3.1: it cannot
        def setup(self, job: object) -> None: ...

        def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            raise AssertionError("not trained here")

        def evaluate(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
            return executor.evaluate(inputs, targets)

    checks = QualityChecks(config, job, Plain(), executor.backend, torch.device("cpu"), DataShard(0, 1))
    checks.after_epoch(0, log, torch.tensor([2.0] * 4), 4)
    assert "were not recomputed: this executor (Plain) cannot" in (checks.record(1).validation or "")


def test_the_gradient_probe_leaves_the_batch_norm_statistics_as_training_left_them() -> None:
    """The probe's forward runs in train mode on a held-out batch: without the statistics put back, that batch would
    be folded into the statistics evaluation reads (with or without precise batch norm)."""
    config, job, executor = mobilenet()
    for x, y in job.data.batches(0):
        executor.train_step(x, y)
    norms = batch_norms(executor.model)
    before = [b.clone() for m in norms for b in m.buffers(recurse=False)]
    log = RankLog(0, "host", [0.1], [32], [4], epoch_loss=[2.0])
    checks = QualityChecks(config, job, executor, executor.backend, torch.device("cpu"), DataShard(0, 1))
    checks.after_epoch(0, log, torch.tensor([2.0] * 4), 4)
    assert checks.epochs[0].grad_norm is not None  # the probe ran
    after = [b for m in norms for b in m.buffers(recurse=False)]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_a_held_out_loss_that_overflows_on_the_running_statistics_is_a_divergence_that_says_why() -> None:
    """Evaluation normalises with the running statistics, training with each batch's own: where only the former
    are wrong, the held-out loss is not finite while the training's is, and the run is stopped saying what to try."""
    from accelbench.engine.quality import TrainingDiverged

    config, job, executor = mobilenet()
    for x, y in job.data.batches(0):
        executor.train_step(x, y)
    with torch.no_grad():
        # the square root of a negative variance: NaN in evaluation
        batch_norms(executor.model)[-1].running_var.fill_(-1.0)
    log = RankLog(0, "host", [0.1], [32], [4], epoch_loss=[2.0])
    checks = QualityChecks(config, job, executor, executor.backend, torch.device("cpu"), DataShard(0, 1))
    with pytest.raises(TrainingDiverged) as caught:
        checks.after_epoch(0, log, torch.tensor([2.0] * 4), 4)
    message = str(caught.value)
    assert "validation loss was nan after epoch 1 (step 4), while the training loss was finite (2)" in message
    assert "--precise-bn N recomputes them" in message


def test_precise_bn_is_part_of_the_identity_only_where_asked_and_bounded() -> None:
    host = get_host()
    workload = host.workload("mobilenet-v3-small")
    plain = host.resolve(RunConfig(workload="mobilenet-v3-small"))
    asked = host.resolve(RunConfig(workload="mobilenet-v3-small", workload_options={"precise_bn": 20}))
    assert "precise_bn" not in workload.identity(plain)  # records made before it keep their identity
    assert workload.identity(asked)["precise_bn"] == 20
    refused = accelbench("run", "--workload", "resnet50", "--precise-bn", "-1")
    assert refused.returncode == 2 and "precise" in refused.stderr.replace("_", "-").lower()


def test_each_synthetic_image_shows_its_class_in_its_colour() -> None:
    from accelbench.workloads.vision.data import SYNTHETIC_POOL, SyntheticImages, class_colour, decode

    images = SyntheticImages(samples=1000, num_classes=8, image_size=32, seed=3)
    # the label is the pool image's, whichever sample shows it
    for index in range(0, 1000, 37):
        assert images.label(index) == images.label(index % SYNTHETIC_POOL)
    assert len({images.label(i) for i in range(SYNTHETIC_POOL)}) == 8
    # the nearest class colour to an image's mean colour is its class's, for most images (the random field
    # under the tint moves some)
    right = 0
    for index in range(SYNTHETIC_POOL):
        pixels = np.asarray(decode(images.encoded(index)[0], "test"), dtype=np.float32).reshape(-1, 3)
        mean = pixels.mean(0)
        nearest = min(range(8), key=lambda c: float(np.abs(mean - class_colour(c, 8) * 0.5 - 63.75).sum()))
        right += nearest == images.label(index)
    assert right >= SYNTHETIC_POOL * 0.75


@pytest.mark.slow
def test_precise_bn_gives_a_short_run_a_held_out_loss_that_falls_and_trains_the_same(tmp_path: Path) -> None:
    """A real run of MobileNetV3-Small at the image references' recipe, with and without precise batch norm."""
    recipe = (
        "run", "--workload", "mobilenet-v3-small", "--image-size", "32", "--num-classes", "8",
        "--data-workers", "0", "--batch-size", "16", "--steps-per-epoch", "20", "--epochs", "2",
        "--eval-batches", "4", "--threads", "1", "--no-calibration",
    )  # fmt: skip
    records = {}
    for precise in ("0", "20"):
        out = tmp_path / precise
        done = accelbench(*recipe, "--precise-bn", precise, "--output-dir", str(out))
        assert done.returncode == 0, done.stderr[-2000:]
        records[precise] = read_record(next(out.glob("*.json")))
    plain, precise = records["0"], records["20"]
    # the training is the same, loss for loss: only the evaluation's statistics differ
    assert [e.loss for e in plain.metrics.epochs] == [e.loss for e in precise.metrics.epochs]
    assert plain.quality is not None and precise.quality is not None
    # with the training's statistics (momentum 0.01, 40 steps) the held-out loss stays at ln 8 = 2.079
    assert all(abs(e.val_loss - math.log(8)) < 0.02 for e in plain.quality.epochs if e.val_loss is not None)
    losses = [e.val_loss for e in precise.quality.epochs]
    assert losses[0] is not None and losses[1] is not None
    assert losses[1] < losses[0] < math.log(8) - 0.05
    assert (precise.quality.epochs[-1].val_accuracy or 0) > 0.5  # chance: 1/8
