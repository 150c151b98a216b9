"""The host data pipeline of the image and BERT workloads: a torch DataLoader over a map-style dataset, and its
counterpart that makes batches on the device.

Seed 004 found the host's data loading to be what bounds ResNet-50 training, so the pipeline is part of what is
measured, built the way users feed these models:

- each rank gets its share of an epoch from one permutation per (seed, epoch), split as DistributedSampler splits
  it (padded by wrapping, so every rank takes the same number of steps);
- every sample's randomness (crop, flip, masked positions) comes from a generator seeded by (seed, epoch, index),
  so a batch is the same whichever worker made it and however many workers there are;
- ``--data-workers`` worker processes, persistent across epochs (starting them is part of epoch 1, the warm-up),
  each prefetching two batches; on accelerators the batches are pinned, so their copy to the device is asynchronous.
  Without ``--data-workers``: on an accelerator, the cores per training process less one (at most 8); on the CPU
  device none, since its training threads already use every core and worker processes would take cores from them
  (with OpenMP's barriers a descheduled thread stalls the whole step), so loading runs in the training process and
  its cost shows as waiting;
- the time the training loop waits for batches is measured every epoch; when it is a tenth of the epoch or more,
  the record (and the summary) says the host's data pipeline bounds the run.

:class:`GeneratedBatches` makes batches of the same shapes directly on the device (``--synthetic device``): the
model alone, with no host work, which is what the host pipeline's throughput is compared with.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from accelbench.hostinfo import usable_cores
from accelbench.workloads.heldout import HELD_OUT_FRACTION

Batch = tuple[torch.Tensor, torch.Tensor]
MAX_DEFAULT_WORKERS = 8
HOST_BOUND_FRACTION = 0.10  # waiting this share of an epoch for batches: the host pipeline bounds the run
PREFETCH_FACTOR = 2  # batches each worker prepares ahead (DataLoader's default)


def default_workers(local_processes: int) -> int:
    """Workers per training process on an accelerator when ``--data-workers`` is not given: the cores this process
    may use, shared by the processes on the node, less one for the training loop itself; at least 1, at most 8."""
    return max(1, min(MAX_DEFAULT_WORKERS, usable_cores() // max(1, local_processes) - 1))


CPU_DEFAULT = "default on the CPU device: none (its training threads use every core)"


class SampleDataset(Protocol):
    """A map-style dataset indexed by ``(epoch, index)``, returning one sample as (inputs, target) tensors."""

    def __len__(self) -> int: ...

    def __getitem__(self, key: tuple[int, int]) -> Batch: ...

    def describe(self) -> dict[str, Any]: ...


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator of one sample's randomness: a function of (seed, epoch, index) only."""
    return np.random.default_rng([seed, epoch, index])


class EpochSampler(Sampler[tuple[int, int]]):
    """One rank's share of an epoch as ``(epoch, index)`` keys: a permutation of the dataset per (seed, epoch),
    padded by wrapping to a multiple of the world size and dealt round-robin (DistributedSampler's split), cut to
    the samples this rank takes (``count``: its steps times the batch size, at most its share)."""

    def __init__(self, size: int, seed: int, rank: int, world_size: int, count: int) -> None:
        self.size, self.seed, self.rank, self.world_size, self.count = size, seed, rank, world_size, count
        self.epoch = 0

    def __iter__(self) -> Iterator[tuple[int, int]]:
        order = np.random.default_rng([self.seed, self.epoch]).permutation(self.size)
        padded = np.resize(order, math.ceil(self.size / self.world_size) * self.world_size)
        mine = padded[self.rank :: self.world_size][: self.count]
        epoch = self.epoch
        return ((epoch, int(i)) for i in mine)

    def __len__(self) -> int:
        return self.count


@dataclass
class EpochWait:
    """How long one epoch's loop waited for its batches (``wait_s``) out of the epoch (``span_s``, first request
    to last batch: the epoch as the training loop saw it)."""

    epoch: int
    wait_s: float
    span_s: float

    @property
    def fraction(self) -> float:
        return self.wait_s / self.span_s if self.span_s > 0 else 0.0


class LoaderSource:
    """A :class:`~accelbench.workloads.BatchSource` over a :class:`SampleDataset` through a torch DataLoader.

    One DataLoader per (rank, world size), kept for the whole run (persistent workers); ``to_device`` gives the same
    batches pinned for an accelerator.
    """

    def __init__(
        self,
        dataset: SampleDataset,
        batch_size: int,
        seed: int,
        max_steps: int | None,
        workers: int | None,
        local_processes: int = 1,
        pin_memory: bool = False,
    ) -> None:
        """``workers`` None: the default (none on the CPU device; :func:`default_workers` once ``to_device`` says
        the batches go to an accelerator). ``local_processes``: training processes on this node."""
        self.dataset = dataset
        self.batch_size = batch_size
        self.seed = seed
        self.max_steps = max_steps
        self.requested_workers = workers
        self.local_processes = local_processes
        self.workers = 0 if workers is None else workers
        self.workers_source = CPU_DEFAULT if workers is None else "--data-workers"
        self.pin_memory = pin_memory
        self.samples_per_epoch = len(dataset)
        self.waits: list[EpochWait] = []
        self._loaders: dict[tuple[int, int], tuple[DataLoader[Any], EpochSampler]] = {}

    def _rank_samples(self, world_size: int) -> int:
        return math.ceil(self.samples_per_epoch / world_size)

    def steps(self, rank: int = 0, world_size: int = 1) -> int:
        steps = math.ceil(self._rank_samples(world_size) / self.batch_size)
        return min(steps, self.max_steps) if self.max_steps else steps

    def _loader(self, rank: int, world_size: int) -> tuple[DataLoader[Any], EpochSampler]:
        key = (rank, world_size)
        if key not in self._loaders:
            count = min(self._rank_samples(world_size), self.steps(rank, world_size) * self.batch_size)
            sampler = EpochSampler(self.samples_per_epoch, self.seed, rank, world_size, count)
            loader: DataLoader[Any] = DataLoader(
                self.dataset,  # type: ignore[arg-type]  # a map-style dataset by (epoch, index) keys
                batch_size=self.batch_size,
                sampler=sampler,
                num_workers=self.workers,
                pin_memory=self.pin_memory,
                persistent_workers=self.workers > 0,
                prefetch_factor=PREFETCH_FACTOR if self.workers > 0 else None,
            )
            self._loaders[key] = (loader, sampler)
        return self._loaders[key]

    def batches(self, epoch: int, rank: int = 0, world_size: int = 1) -> Iterator[Batch]:
        loader, sampler = self._loader(rank, world_size)
        sampler.epoch = epoch
        start = time.perf_counter()
        waited = 0.0
        batches = iter(loader)
        for _ in range(self.steps(rank, world_size)):
            asked = time.perf_counter()
            batch = next(batches)
            waited += time.perf_counter() - asked
            yield batch[0], batch[1]
        # only complete epochs are kept (the runner's compile step takes one batch and leaves the rest)
        self.waits.append(EpochWait(epoch, waited, time.perf_counter() - start))

    def to_device(self, device: torch.device, placement: str) -> LoaderSource:
        """The same batches, pinned in host memory so that their copy to ``device`` is asynchronous, made by the
        accelerator's default number of workers unless ``--data-workers`` gave one."""
        placed = LoaderSource(
            self.dataset,
            self.batch_size,
            self.seed,
            self.max_steps,
            self.requested_workers,
            self.local_processes,
            pin_memory=True,
        )
        if self.requested_workers is None:
            placed.workers = default_workers(self.local_processes)
            placed.workers_source = "default on an accelerator: cores per process - 1, at most 8"
        return placed

    def bottleneck(self) -> str | None:
        """A sentence when the training loop waited for batches a tenth of the last measured epoch or more (the
        warm-up epoch, which starts the workers, only when it is the only one)."""
        if not self.waits:
            return None
        last = self.waits[-1]
        if last.fraction < HOST_BOUND_FRACTION:
            return None
        return (
            f"host-bound: the training loop waited for the data pipeline {last.fraction:.0%} of epoch "
            f"{last.epoch + 1} on rank 0 ({self.workers} worker(s)); more --data-workers (on a CPU device with "
            "--threads leaving them cores) may feed it faster, and --synthetic device measures the model without it"
        )

    def describe(self) -> dict[str, Any]:
        return {
            "placement": "host (batches made by a DataLoader, "
            + ("pinned, copied asynchronously)" if self.pin_memory else "copied from pageable memory)"),
            **self.dataset.describe(),
            "samples_per_epoch": self.samples_per_epoch,
            "steps_per_epoch_cap": self.max_steps,
            "pipeline": "torch DataLoader (persistent workers)"
            if self.workers
            else "torch DataLoader (in-process)",
            "workers": self.workers,
            "workers_source": self.workers_source,
            "prefetch_factor": PREFETCH_FACTOR if self.workers else None,
            "pin_memory": self.pin_memory,
            "rank0_wait_s": [round(w.wait_s, 6) for w in self.waits],
            "rank0_wait_fraction": [round(w.fraction, 4) for w in self.waits],
            "bottleneck": self.bottleneck(),
        }


MakeBatch = Callable[[torch.Generator, int, torch.device], Batch]


class GeneratedBatches:
    """Batches of the workload's shapes generated on the device each step (``--synthetic device``): no host work
    and no copy, so the run measures the model alone. Deterministic per (seed, epoch, rank)."""

    def __init__(
        self,
        make: MakeBatch,
        samples_per_epoch: int,
        batch_size: int,
        seed: int,
        max_steps: int | None,
        what: str,
        device: torch.device | None = None,
    ) -> None:
        self.make = make
        self.samples_per_epoch = samples_per_epoch
        self.batch_size = batch_size
        self.seed = seed
        self.max_steps = max_steps
        self.what = what
        self.device = device or torch.device("cpu")

    def steps(self, rank: int = 0, world_size: int = 1) -> int:
        steps = math.ceil(math.ceil(self.samples_per_epoch / world_size) / self.batch_size)
        return min(steps, self.max_steps) if self.max_steps else steps

    def batches(self, epoch: int, rank: int = 0, world_size: int = 1) -> Iterator[Batch]:
        generator = torch.Generator(device=self.device)
        generator.manual_seed(int(np.random.SeedSequence([self.seed, epoch, rank]).generate_state(1)[0]))
        remaining = math.ceil(self.samples_per_epoch / world_size)
        for _ in range(self.steps(rank, world_size)):
            size = min(self.batch_size, remaining)
            remaining -= size
            yield self.make(generator, size, self.device)

    def to_device(self, device: torch.device, placement: str) -> GeneratedBatches:
        return GeneratedBatches(
            self.make, self.samples_per_epoch, self.batch_size, self.seed, self.max_steps, self.what, device
        )

    def describe(self) -> dict[str, Any]:
        return {
            "placement": f"device (batches generated on {self.device.type} each step: the model alone, no host "
            "pipeline)",
            "source": f"synthetic on the device: {self.what}",
            "samples_per_epoch": self.samples_per_epoch,
            "steps_per_epoch_cap": self.max_steps,
            "bottleneck": None,
        }


class SampleRange:
    """Samples ``start`` to ``stop`` of a :class:`SampleDataset`, numbered from 0: one side of its held-out split
    (:func:`split_held_out`)."""

    def __init__(self, dataset: SampleDataset, start: int, stop: int, role: str) -> None:
        self.dataset, self.start, self.stop, self.role = dataset, start, stop, role

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, key: tuple[int, int]) -> Batch:
        epoch, index = key
        return self.dataset[(epoch, self.start + index)]

    def describe(self) -> dict[str, Any]:
        return {
            **self.dataset.describe(),
            "split": f"samples {self.start} to {self.stop} of {len(self.dataset)} ({self.role})",
        }


def split_held_out(dataset: SampleDataset) -> tuple[SampleDataset, SampleDataset | None]:
    """The training part and the held-out part of ``dataset``: its last tenth (:data:`HELD_OUT_FRACTION`) is held
    out, never trained on; None for a dataset too small to keep a sample apart and still train on one."""
    size = len(dataset)
    cut = size - math.ceil(size * HELD_OUT_FRACTION)
    if cut < 1:
        return dataset, None
    held = f"the last {HELD_OUT_FRACTION:.0%}, held out: never trained on"
    return SampleRange(dataset, 0, cut, "trained on"), SampleRange(dataset, cut, size, held)


class HeldOutLoader(LoaderSource):
    """The validation batches of a held-out split: read in the training process (no worker processes to start),
    with epoch 0's sample order and per-sample randomness whatever the epoch, so every epoch sees the same batches."""

    def batches(self, epoch: int, rank: int = 0, world_size: int = 1) -> Iterator[Batch]:
        return super().batches(0, rank, world_size)


def held_out_loader(dataset: SampleDataset, batch_size: int, seed: int) -> HeldOutLoader:
    """:class:`HeldOutLoader` over the held-out part of a dataset (:func:`split_held_out`)."""
    return HeldOutLoader(dataset, batch_size, seed, max_steps=None, workers=0)


# The epoch number whose generated batches are the held-out ones: no run trains for 2^31 - 1 epochs
HELD_OUT_EPOCH = 2**31 - 1


class HeldOutGenerated:
    """Validation batches for generated data (``--synthetic device``): the batches of epoch :data:`HELD_OUT_EPOCH`,
    a stream of the generator that training never draws, the same every epoch."""

    def __init__(self, generated: GeneratedBatches) -> None:
        self.generated = generated
        self.samples_per_epoch = generated.samples_per_epoch

    def steps(self, rank: int = 0, world_size: int = 1) -> int:
        return self.generated.steps(rank, world_size)

    def batches(self, epoch: int, rank: int = 0, world_size: int = 1) -> Iterator[Batch]:
        return self.generated.batches(HELD_OUT_EPOCH, rank, world_size)

    def describe(self) -> dict[str, Any]:
        return {
            "split": f"generated batches of epoch key {HELD_OUT_EPOCH}, a stream training never draws",
            "samples": self.samples_per_epoch,
        }
