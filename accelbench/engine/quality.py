"""Is it training right: what the runner checks after each timed epoch, outside its timed region.

A precision, strategy or backend that trains wrong can still be fast; these checks keep it from winning a
comparison. After every timed epoch (its timer stopped, its trackers stopped), on every rank:

1. **The training loss is finite** on every rank (one tiny all-reduce, so that every rank stops together and none
   is left waiting in a collective when one rank's loss is NaN).
2. **Validation**: ``--eval-batches`` batches (per rank) of the workload's held-out split (``TrainingJob.validation``,
   never trained on), evaluated through :meth:`Executor.evaluate` (eval mode, ``torch.no_grad``). The loss is
   averaged over every rank's samples (a sum of loss x samples and a sum of samples, all-reduced). Its time is
   recorded apart (``quality.epochs[].eval_s``) and is never part of an epoch's time or throughput.
3. **Gradient norm**: one forward and backward of the first held-out batch (:meth:`Executor.gradient_norm`: as a
   training step computes gradients, with every hook and the run's autocast, but no optimizer step), its total L2
   norm read by ``clip_grad_norm_`` with an infinite limit, or as the strategy reduces it (a pipeline's stages, ZeRO's
   ranks, expert shards: docs/quality.md). Measured outside the timed epoch, so it costs the timing
   nothing, and through the same model and hooks as training, so a backend or precision that corrupts gradients
   shows in it. An explosion is a norm that is not finite or above ``--grad-norm-limit``.
4. **Loss not decreasing** (``--stall-epochs K``, off by default: synthetic data with random labels has nothing to
   learn): from epoch K + 1 on, a loss (validation where measured, else training, averaged over ranks) not below the
   first epoch's.
5. **Target** (``--target-loss X``, or ``--target NAME``: a reference loss, :mod:`accelbench.references`): the run stops at the end of the first epoch whose validation loss is <= X and
   records the time, steps, samples and energy to it; a run that never reaches it says so.

A finding of 1, 3 or 4 ends the run with status ``diverged`` (its speed is no valid result: ``compare`` and
``report`` list it as a failure), naming the epoch and step. Every decision is made from values agreed over ranks,
so all ranks decide alike.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from accelbench.config import RunConfig
from accelbench.contract import Backend, DataShard, Executor
from accelbench.engine.executor import batch_norms
from accelbench.engine.metrics import RankLog
from accelbench.results import DIVERGED, STOPPED, EpochQuality, QualityRecord, TargetResult
from accelbench.workloads import BatchSource, TrainingJob
from accelbench.workloads.pipeline import HELD_OUT_EPOCH

# The training epoch whose first batches precise batch norm averages over: one no run reaches, as the held-out
# generated batches' (:data:`~accelbench.workloads.pipeline.HELD_OUT_EPOCH`) is
NORM_STATISTICS_EPOCH = HELD_OUT_EPOCH - 1


class TrainingDiverged(Exception):
    """Training stopped training: a loss that is not finite, a gradient norm exploding or a loss that does not
    fall. What trains from here trains nothing, and its speed is no result."""


def nonfinite_loss(step_losses: torch.Tensor, epoch: int, steps_per_epoch: int) -> str:
    """The sentence for an epoch whose training loss was NaN or infinite, naming the first step that had it."""
    bad = int((~torch.isfinite(step_losses)).nonzero()[0, 0])
    return (
        f"{DIVERGED}the loss was {float(step_losses[bad])} at step {bad + 1} of epoch {epoch + 1} (step "
        f"{epoch * steps_per_epoch + bad + 1} of the run){STOPPED}, whose time "
        "is kept with the others, and its speed is no valid result (a learning rate too high, a precision that "
        "overflows, or a broken backend: compare its loss with an fp32 run's)"
    )


def target_label(config: RunConfig) -> str:
    """How messages name the run's target: ``--target-loss 3.5``, or ``--target ref-epoch4 (3.2243)``."""
    if config.target is not None and config.target_loss is not None:
        return f"--target {config.target} ({config.target_loss:.4f})"
    return f"--target-loss {config.target_loss:g}"


@dataclass
class QualityChecks:
    """The checks of one rank's run, kept across its epochs; :meth:`record` is what rank 0 writes."""

    config: RunConfig
    job: TrainingJob
    executor: Executor
    backend: Backend
    device: torch.device
    shard: DataShard
    epochs: list[EpochQuality] = field(default_factory=list)
    target: TargetResult | None = None
    problem: str | None = None
    validation_note: str | None = None
    probe_note: str | None = None  # why the gradient probe measured nothing, where it failed
    norm_note: str | None = None  # how the evaluation's batch-norm statistics were had, where it was asked
    first_loss: float | None = None
    _right: list[float] = field(default_factory=lambda: [0.0, 0.0])  # held-out predictions right, made

    def __post_init__(self) -> None:
        if self.job.validation is None:
            self.validation_note = "none: this workload has no held-out split"
        elif self.config.eval_batches == 0:
            self.validation_note = "off (--eval-batches 0)"
        else:
            split = self.job.validation.describe().get("split", "the workload's held-out split")
            self.validation_note = f"{self.config.eval_batches} batch(es) per rank of {split}"

    # ----------------------------------------------------------------------------------------------------------

    def after_epoch(self, epoch: int, log: RankLog, step_losses: torch.Tensor, steps_per_epoch: int) -> bool:
        """Check the epoch just timed (index ``epoch``, its figures last in ``log``); True when the run should stop
        here because it reached ``--target-loss``. Raises :class:`TrainingDiverged` on every rank alike."""
        local_nan = not math.isfinite(log.epoch_loss[-1])
        if self._any_rank(local_nan):
            self.problem = (
                nonfinite_loss(step_losses, epoch, steps_per_epoch)
                if local_nan
                else f"{DIVERGED}another rank's loss was not finite in epoch {epoch + 1}{STOPPED} and its speed "
                "is no valid result"
            )
            self.epochs.append(EpochQuality(epoch=epoch + 1))
            raise TrainingDiverged(self.problem)
        self.backend.synchronize(self.device)
        start = time.perf_counter()
        loss_sum, count, norm = self._evaluate()
        train_loss = log.epoch_loss[-1]
        # one all-reduce of the sums (held-out loss x samples, samples, training loss, samples trained, held-out
        # predictions right and made) and one of the largest gradient norm: every rank decides from the same figures
        sums = self._reduce(
            [loss_sum, float(count), train_loss, float(sum(log.epoch_samples)), *self._right],
            dist.ReduceOp.SUM,
        )
        largest = self._reduce([norm if norm is not None else -1.0], dist.ReduceOp.MAX)[0]
        self.backend.synchronize(self.device)
        eval_s = time.perf_counter() - start
        world = self._world_size()
        val_loss = sums[0] / sums[1] if sums[1] > 0 else None
        accuracy = sums[4] / sums[5] if sums[5] > 0 else None
        grad_norm = largest if largest >= 0 else None
        self.epochs.append(
            EpochQuality(
                epoch=epoch + 1,
                val_loss=val_loss,
                val_accuracy=accuracy,
                val_samples=int(sums[1]),
                eval_s=eval_s,
                grad_norm=grad_norm,
            )
        )
        step = (epoch + 1) * steps_per_epoch
        if val_loss is not None and not math.isfinite(val_loss):
            self._diverged(
                f"the validation loss was {val_loss} after epoch {epoch + 1} (step {step})"
                + self._evaluation_hint(sums[2] / world)
            )
        limit = self.config.grad_norm_limit
        if grad_norm is not None and (not math.isfinite(grad_norm) or grad_norm > limit):
            self._diverged(
                f"the gradient norm exploded: {grad_norm:.4g} after epoch {epoch + 1} (step {step}), "
                + (f"above --grad-norm-limit {limit:g}" if math.isfinite(grad_norm) else "not finite")
            )
        watched = val_loss if val_loss is not None else sums[2] / world
        if self.first_loss is None:
            self.first_loss = watched
        stall = self.config.stall_epochs
        if stall and epoch >= stall and not watched < self.first_loss:
            what = "validation" if val_loss is not None else "training"
            self._diverged(
                f"the loss is not decreasing: the {what} loss of epoch {epoch + 1} (step {step}), {watched:.4f}, is "
                f"not below epoch 1's, {self.first_loss:.4f} (--stall-epochs {stall}; 0 turns the check off)"
            )
        target = self.config.target_loss
        if target is not None and val_loss is not None and val_loss <= target:
            energies = log.epoch_energy_j
            self.target = TargetResult(
                loss=target,
                name=self.config.target,
                reached=True,
                epoch=epoch + 1,
                time_to_target_s=sum(log.epoch_wall_s),
                steps=sum(log.epoch_steps),
                samples=int(sums[3]),
                energy_j=sum(e for e in energies if e is not None)
                if energies and all(e is not None for e in energies)
                else None,
                message=f"validation loss {val_loss:.4f} <= {target_label(self.config)} after epoch {epoch + 1}: "
                f"{sum(log.epoch_wall_s):.3f} s of training (evaluation excluded), {sum(log.epoch_steps)} steps",
            )
            return True
        return False

    def record(self, epochs_run: int) -> QualityRecord:
        """What the record keeps: every epoch's checks, the target's result (reached, or not in ``epochs_run``
        epochs) and the problem found, if any."""
        target = self.target
        if target is None and self.config.target_loss is not None:
            measured = [q for q in self.epochs if q.val_loss is not None]
            best = min(measured, key=lambda q: q.val_loss or math.inf) if measured else None
            why = (
                f"; the best validation loss was {best.val_loss:.4f} (epoch {best.epoch})"
                if best is not None and best.val_loss is not None
                else f"; no validation loss was measured ({self.validation_note})"
            )
            target = TargetResult(
                loss=self.config.target_loss,
                name=self.config.target,
                reached=False,
                message=f"{target_label(self.config)} not reached in {epochs_run} epoch(s){why}",
            )
        return QualityRecord(
            eval_batches=self.config.eval_batches,
            validation="; ".join(
                note for note in (self.validation_note, self.norm_note, self.probe_note) if note
            )
            or None,
            epochs=list(self.epochs),
            target=target,
            problem=self.problem,
        )

    # ----------------------------------------------------------------------------------------------------------

    def _evaluate(self) -> tuple[float, int, float | None]:
        """This rank's held-out loss x samples, its samples and the probe's gradient norm (None: not measured); its
        predictions right and made in :attr:`_right` where the workload has an accuracy."""
        self._right = [0.0, 0.0]
        validation = self.job.validation
        if validation is None:
            return 0.0, 0, None
        # the accuracy is read off the output of the model's last head module during evaluation's own forward
        # (a forward hook: the model runs once, as the executor runs it, wrapped or sharded)
        outputs: list[torch.Tensor] = []
        head = (
            self.job.model.get_submodule(self.job.units.head[-1])
            if self.job.accuracy and self.job.units.head
            else None
        )
        hook = head.register_forward_hook(lambda _m, _i, out: outputs.append(out)) if head else None
        try:
            # the probe's dropout draws random numbers: the generators are restored after, so validation on or off
            # trains the same model
            with self._own_random_numbers(), self._norm_statistics() as recomputed:
                if recomputed is None and self.job.norm_statistics_batches:
                    self.norm_note = (
                        f"the batch-norm statistics were not recomputed: this executor "
                        f"({type(self.executor).__name__}) cannot; evaluated with the training's own"
                    )
                elif recomputed:
                    self.norm_note = (
                        f"batch-norm statistics recomputed over {recomputed} training batch(es) per rank before "
                        "each evaluation (precise BN)"
                    )
                return self._held_out_batches(validation, outputs)
        finally:
            if hook is not None:
                hook.remove()

    def _norm_statistics(self) -> contextlib.AbstractContextManager[int | None]:
        """The executor's precise batch norm over the first ``job.norm_statistics_batches`` batches of a training
        epoch no run reaches (:data:`NORM_STATISTICS_EPOCH`), this rank's shard of them; 0 where not asked."""
        wanted = self.job.norm_statistics_batches
        if not wanted:
            return contextlib.nullcontext(0)
        source = self.job.data.batches(NORM_STATISTICS_EPOCH, self.shard.index, self.shard.count)
        batches = (
            (inputs.to(self.device), targets.to(self.device))
            for inputs, targets in itertools.islice(source, wanted)
        )
        return self.executor.norm_statistics_recomputed(batches)

    @contextlib.contextmanager
    def _norm_statistics_kept(self) -> Iterator[None]:
        """The model's batch-norm running statistics as they were, on leaving: the probe's forward runs in train
        mode on a held-out batch, which would otherwise fold that batch into the statistics evaluation reads."""
        kept = [
            (buffer, buffer.clone())
            for module in batch_norms(self.job.model)
            for buffer in module.buffers(recurse=False)
        ]
        try:
            yield
        finally:
            with torch.no_grad():
                for buffer, value in kept:
                    buffer.copy_(value)

    def _held_out_batches(
        self, validation: BatchSource, outputs: list[torch.Tensor]
    ) -> tuple[float, int, float | None]:
        batches = validation.batches(0, self.shard.index, self.shard.count)
        loss_sum, count, norm = 0.0, 0, None
        wanted = self.config.eval_batches
        for index, (inputs, targets) in enumerate(batches):
            x, y = inputs.to(self.device), targets.to(self.device)
            if (
                index == 0 and x.shape[0] > 1
            ):  # batch norm cannot train on one sample: no probe on so small a batch
                try:
                    with self._norm_statistics_kept():
                        probed = self.executor.gradient_norm(x, y)
                except (
                    RuntimeError,
                    ValueError,
                ) as exc:  # the probe is a check, untimed: it never fails a run
                    self.probe_note = f"no gradient norm: the probe failed ({type(exc).__name__}: {exc})"[
                        :300
                    ]
                    model = getattr(self.executor, "model", None)
                    for parameter in model.parameters() if model is not None else ():
                        parameter.grad = None  # nothing of a failed probe may reach the next training step
                    probed = None
                if probed is None and self.probe_note is None:
                    self.probe_note = f"no gradient norm: this executor ({type(self.executor).__name__}) cannot probe its gradients"
                norm = float(probed.item()) if probed is not None else None
                if norm is not None and not math.isfinite(norm):
                    norm = math.inf  # NaN is not ordered: an all-reduced maximum must see it
            if index >= wanted:
                break
            outputs.clear()  # the probe's forward ran the head too
            loss = self.executor.evaluate(x, y)
            if loss is None:
                self.validation_note = f"none: this executor ({type(self.executor).__name__}) cannot evaluate"
                wanted = 0
                break
            size = x.shape[0] if self.shard.counts_samples else 0
            loss_sum += float(loss.item()) * size
            count += size
            if outputs and self.job.accuracy is not None and size:
                right, made = self.job.accuracy(outputs[-1], y)
                self._right[0] += float(right.item())
                self._right[1] += float(made.item())
        return loss_sum, count, norm

    def _own_random_numbers(self) -> contextlib.AbstractContextManager[None]:
        """torch's generators (the host's, and the device's where it has its own) as they were, on leaving."""
        generators = getattr(torch, self.device.type, None)
        if self.device.type == "cpu" or not hasattr(
            generators, "get_rng_state"
        ):  # a device without torch's API
            return torch.random.fork_rng(devices=[])
        return torch.random.fork_rng(devices=[self.device.index or 0], device_type=self.device.type)

    def _evaluation_hint(self, train_loss: float) -> str:
        """Why a held-out loss may be non-finite while the training's is finite: evaluation normalises with the
        batch norms' running statistics, which a few steps at a small (micro-)batch leave far from the batches' own
        (at 1x1 spatial and 2 samples, train mode's output is +-1 whatever came in)."""
        if not math.isfinite(train_loss) or not batch_norms(self.job.model):
            return ""
        recompute = (
            "" if self.job.norm_statistics_batches else "; --precise-bn N recomputes them before evaluating"
        )
        return (
            f", while the training loss was finite ({train_loss:.4g}): evaluation normalises with the batch norms' "
            f"running statistics, which a few steps at a small micro-batch leave far from the batches' own{recompute}"
            ", a larger micro-batch or image gives each batch norm more values"
        )

    def _diverged(self, what: str) -> None:
        self.problem = (
            f"{DIVERGED}{what}{STOPPED}, whose time is kept with the others, and its speed is no valid result"
        )
        raise TrainingDiverged(self.problem)

    def _world_size(self) -> int:
        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1

    def _reduce(self, values: list[float], op: dist.ReduceOp.RedOpType) -> list[float]:
        """``values`` reduced over every rank (as they are where there is no process group)."""
        if self._world_size() == 1:
            return values
        dtype = torch.float64 if "float64" in self.backend.collective_dtypes(self.device) else torch.float32
        tensor = torch.tensor(values, dtype=dtype, device=self.device)
        dist.all_reduce(tensor, op=op)
        return [float(v) for v in tensor.tolist()]

    def _any_rank(self, flag: bool) -> bool:
        return self._reduce([1.0 if flag else 0.0], dist.ReduceOp.MAX)[0] > 0
