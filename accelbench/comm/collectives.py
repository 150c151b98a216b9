"""The collectives `accelbench comm` measures, and what their figures mean: no torch, no device.

Each collective is described once here (its name, the variants torch offers, whether it reduces, its root, and its
bus-bandwidth factor), so the measurement, the table, the record and ``compare`` all agree. Conventions are
nccl-tests' (``doc/PERFORMANCE.md`` there):

- ``size`` (bytes) is the whole array: the buffer of all_reduce, broadcast, reduce and send/recv; the gathered
  output of all_gather; the input that reduce_scatter scatters; each rank's send buffer of all_to_all. ``count``
  is that array's elements (size / type size).
- algorithm bandwidth ``algbw = size / time``; bus bandwidth ``busbw = algbw x factor``, the factor making the
  figure comparable with the hardware's link speed whatever the rank count n: all_reduce 2(n-1)/n; all_gather,
  reduce_scatter and all_to_all (n-1)/n; broadcast, reduce and send/recv 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

OpName = Literal[
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "sendrecv"
]
DtypeName = Literal["fp32", "bf16", "fp16"]
Variant = Literal["out-of-place", "in-place"]

VARIANTS: tuple[Variant, ...] = ("out-of-place", "in-place")
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2}
DTYPE_ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}


@dataclass(frozen=True)
class Collective:
    """One collective as measured: how torch offers it and how its bandwidth is counted."""

    name: OpName
    torch_call: str  # the torch.distributed function measured
    variants: tuple[Variant, ...]  # what torch offers: all_reduce, broadcast and reduce work in place only
    reduces: bool  # sums across ranks (the redop column: sum)
    rooted: bool  # has a root rank (the root column: rank 0)
    sharded: bool  # the array is split into one equal part per rank: its count is a multiple of the ranks
    factor: Callable[[int], float]  # bus bandwidth / algorithm bandwidth for n ranks
    formula: str  # the factor, as docs and tables write it

    def bus_factor(self, ranks: int) -> float:
        return self.factor(ranks)

    def count(self, size_bytes: int, dtype: str, ranks: int) -> int:
        """Elements of the whole array for a requested size: whole elements, a multiple of the ranks for sharded
        collectives (rounded down, at least one element per rank), as nccl-tests rounds."""
        unit = ranks if self.sharded else 1
        return max(unit, size_bytes // DTYPE_BYTES[dtype] // unit * unit)


COLLECTIVES: dict[str, Collective] = {
    c.name: c
    for c in (
        Collective("all_reduce", "all_reduce", ("in-place",), True, False, False,
                   lambda n: 2 * (n - 1) / n, "2(n-1)/n"),
        Collective("all_gather", "all_gather_single (all_gather_into_tensor before torch 2.13)", VARIANTS, False, False, True,
                   lambda n: (n - 1) / n, "(n-1)/n"),
        Collective("reduce_scatter", "reduce_scatter_single (reduce_scatter_tensor before torch 2.13)", VARIANTS, True, False, True,
                   lambda n: (n - 1) / n, "(n-1)/n"),
        Collective("broadcast", "broadcast", ("in-place",), False, True, False, lambda n: 1.0, "1"),
        Collective("reduce", "reduce", ("in-place",), True, True, False, lambda n: 1.0, "1"),
        Collective("all_to_all", "all_to_all_single", ("out-of-place",), False, False, True,
                   lambda n: (n - 1) / n, "(n-1)/n"),
        Collective("sendrecv", "batch_isend_irecv: send to rank+1, receive from rank-1", ("out-of-place",),
                   False, False, False, lambda n: 1.0, "1"),
    )
}  # fmt: skip
OPS: tuple[str, ...] = tuple(COLLECTIVES)
DTYPES: tuple[str, ...] = tuple(DTYPE_BYTES)


def size_label(size: int) -> str:
    """A byte count as people write message sizes: ``8 B``, ``1 KiB``, ``64 MiB``, exact or with one decimal."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            value = size / scale
            return f"{value:g} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{size} B"
