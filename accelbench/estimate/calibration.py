"""Calibration: the rates this device really reaches for the kinds of work a training step is made of.

A fixed fraction of the peak cannot follow a step whose matrix multiplies are small and skinny, whose elementwise
and normalisation work is bound by memory, and whose many small operators each cost a dispatch. A
:class:`Calibration` measures each of these once per host, backend, device, torch version, matmul dtype and (on a
CPU) thread count:

- dense matrix multiplies over a small grid of shapes (m, n, k each from :data:`MATMUL_SIZES`: skinny and small
  ones too, as a transformer's are at small batch), in the precision's matmul dtype and in fp32 (what autocast
  leaves in fp32); :meth:`Calibration.matmul_rate` interpolates log(rate) linearly in log(m), log(n), log(k). On an
  accelerator each timed repeat queues products back to back (:data:`ACCELERATOR_QUEUED_MULTIPLY_ADDS`), as a
  step runs them;
- the bandwidth of an elementwise operator (``add``: two streams read, one written) over sizes from 48 KiB to far
  larger than any cache (:data:`STREAM_BYTES`), each call on buffers the previous calls did not touch (so read from
  memory, as a step's backward reads forward's activations), interpolated in log(bytes);
- the rate (elements/s) of elementwise work that its arithmetic bounds on a CPU, not its memory traffic: random
  numbers (dropout's ``bernoulli_``), softmax and its gradient, exp-like activations and theirs, layer norm and
  its gradient, attention's masking passes over bools (:data:`ELEMENTWISE_KINDS`); on an accelerator at a second,
  larger size too (:data:`ELEMENTWISE_LARGE_ELEMENTS`), as there a kernel's fixed cost dominates a call on 2^20
  elements and its rate grows with the size up to the memory's bandwidth: :meth:`Calibration.elementwise_rate`
  interpolates log(rate) in log(elements) between the two. There the calls of a kind are queued back to back
  between synchronisations (:data:`ACCELERATOR_ELEMENTWISE_CALLS`), as a step's operators run, and a layer norm's
  rows are a transformer's hidden width (:data:`ACCELERATOR_NORM_ROW`);
- the dispatch cost: the time per call of an operator on one element, plain and recorded by autograd; and what an
  operator costs inside a training step beyond its work (:func:`_time_step_dispatch`): a two-block transformer on
  tensors of a few elements, forward and backward through modules and autograd's engine, timed and divided by the
  operators the step's tracer counts in it (module calls, hooks and the engine between operators included, which a
  loop of one operator leaves out).

Each is timed between the backend's synchronisations, best and median of repeats kept. A call's dispatch is taken
out of the timed matmuls and streams (that of a 1x1 matmul, of a one-element ``add``), so that
:mod:`accelbench.estimate.step_time` counts it once per operator, as the dispatch cost.
Results are cached in ``calibration.json`` beside the measured peak (:func:`accelbench.estimate.peak.cache_dir`),
written atomically; ``refresh`` measures again. A measurement during which the process's threads waited for a
core (or a virtual machine's hypervisor stole the cores' time) is marked contended and never cached: its rates are a
lower bound of the device's (on a shared host, 10^4 times too low has been seen), so the next call measures again. A cached
calibration more than an hour old is spot-checked against the device as it runs now (:func:`calibration_drift`: two
of its points timed again) before a run's prediction; the run measures it again where the device has moved by more
than :data:`DRIFT_TOLERANCE`. torch is imported inside the functions.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Union

from pydantic import BaseModel, ConfigDict, ValidationError

from accelbench.estimate.engine_cost import DTensorDispatch, FsdpHooks, Zero3Hooks
from accelbench.estimate.peak import CONTENDED_WAITING, cache_dir, device_key, measured_since
from accelbench.hostinfo import cpu_usage, usable_cores
from accelbench.results import _write_atomically

if TYPE_CHECKING:
    import torch

CACHE_FILE = "calibration.json"
CALIBRATION_VERSION = 7
# Matmul grid: each of m, n, k from these (27 shapes). 32: a head's width, a tiny batch; 256: a small model's
# width; 2048: a micro-batch's tokens, a large model's width. Beyond the grid the rate at its edge is used.
MATMUL_SIZES = (32, 256, 2048)
# Elementwise streams, total bytes read and written by one call: from cache-resident (48 KiB) to 192 MiB.
STREAM_BYTES = (3 * 2**14, 3 * 2**18, 3 * 2**22, 3 * 2**26)
DISPATCH_CALLS = 400  # calls of a one-element operator per timed loop
# repeats of one shape run this long, and at least MIN_REPEATS of them unless those reach MAX_REPEAT_S
REPEAT_BUDGET_S = 0.05
MIN_REPEATS = 5
MAX_REPEAT_S = 1.0
# A product that the dtype's fastest timed product says would take longer than this a call is not timed: it is
# priced at the rate of the largest one timed (a CPU without 16-bit matrix units runs fp16 through scalar code at
# well under 1 GFLOP/s, and would take 40 s a 2048^3 product, minutes for the grid).
MAX_MATMUL_CALL_S = 0.25
# Elementwise work whose arithmetic, not its memory traffic, bounds it on a CPU: each kind's rate (elements/s) is
# measured on ELEMENTWISE_ELEMENTS fp32 values with the operator named, and applies to the aten operators listed.
ELEMENTWISE_KINDS: dict[str, tuple[str, frozenset[str]]] = {
    "random": ("bernoulli_", frozenset({"bernoulli_", "bernoulli", "native_dropout", "normal_", "uniform_"})),
    "softmax": ("softmax", frozenset({"_softmax", "_safe_softmax", "_log_softmax"})),
    "transcendental": ("gelu", frozenset({"gelu", "exp", "tanh", "erf", "sigmoid", "silu", "log"})),
    # their gradients evaluate the function and its derivative: about half the forward's rate on a CPU
    "transcendental_backward": (
        "gelu_backward",
        frozenset({"gelu_backward", "silu_backward", "tanh_backward"}),
    ),
    # normalisation: a pass for the row's statistics and one to normalise, with a reciprocal square root a row;
    # its backward adds the weight's and bias's gradients, reduced over the rows
    "normalisation": ("native_layer_norm", frozenset({"native_layer_norm"})),
    "normalisation_backward": ("native_layer_norm_backward", frozenset({"native_layer_norm_backward"})),
    "softmax_backward": (
        "_softmax_backward_data",
        frozenset({"_softmax_backward_data", "_log_softmax_backward_data"}),
    ),
    # attention's masking of a row masked whole (_safe_softmax): a test of each score, a reduction of bools over
    # the row and a select broadcast over it, which a CPU runs well below its bandwidth (a byte or a bool each)
    "mask_test": ("isneginf", frozenset({"isneginf", "isinf", "isnan", "isposinf"})),
    "mask_reduce": ("all", frozenset({"all", "any"})),
    "mask_select": ("where", frozenset({"where"})),
}
# Copies that gather a tensor whose layout is permuted (an activation split into heads made contiguous again, the
# gradients of q, k and v joined from the heads' layout) read it across its rows: where an input of one of these
# operators is not contiguous it is priced by the element at the rate of a permuted copy, measured as this kind.
STRIDED_KIND = "strided_copy"
STRIDED_OPERATORS = frozenset({"clone", "copy_", "cat", "_to_copy"})
ELEMENTWISE_ELEMENTS = 2**20
# On an accelerator each kind is timed on this many elements too (64 MiB of fp32, beyond an H100's or H200's L2):
# at 2^20 elements an H200's layer norm runs at 57 Gelem/s, a tenth of what its bandwidth allows a transformer's
# activation of tens of millions of elements (docs/gpu/h200-2026-11-28)
ELEMENTWISE_LARGE_ELEMENTS = 2**24
ELEMENTWISE_ROW = 128  # a row of a softmax (a sequence), a norm, a reduction
# On an accelerator a call is queued and a step's operators run back to back: each elementwise kind is timed over
# this many calls between synchronisations, so that the launch and the synchronisation's round trip (tens of
# microseconds, more than the work of a kernel on 2^20 elements) are not taken for the kernel's work. On the H200
# (2026-11-28) one call per repeat gave rates that moved 2x from one calibration to the next.
ACCELERATOR_ELEMENTWISE_CALLS = 20
# Likewise an accelerator's products are queued until a timed repeat holds this many multiply-adds (about 0.1 ms
# of an H200's bf16 work; a 256^3 product is under 1 us of it, and one call per repeat timed it at 11-20 TFLOP/s).
ACCELERATOR_QUEUED_MULTIPLY_ADDS = 5e10
# A layer norm's row on an accelerator: a transformer's hidden width (768 to 8,192), the rows its kernels are made
# for. Rows of ELEMENTWISE_ROW gave the H200 80 Gelem/s on 2^24 elements, a fifth of its copy bandwidth, and
# over-priced the norms of GPT steps at batch 128 (+35% on gpt2-medium).
ACCELERATOR_NORM_ROW = 1024
# Products, streams and elementwise kinds are timed on tensors carved from buffers written once (:class:`ColdMemory`)
# and cycled through, so that each call finds its tensors out of every cache, as a step's operator finds what was
# written many operators before. On a CPU each buffer is twice its last-level cache (:func:`cold_memory_bytes`),
# at least CPU_COLD_BYTES, at most MAX_COLD_BYTES and a sixteenth of the memory available; an accelerator's is
# COLD_BYTES (NVIDIA's and Intel's GPUs have L2s under it). A fixed 64 MiB had sat in the 480 MiB L3 an Intel Xeon
# VM reports: its streams ran at 58 GB/s where a step's ran at 31, and the README's first run was predicted 18% short
# (2026-12-01). There a cycle of 128 MiB still ran 50% faster than memory (the VM's share of the L3 is about 100
# MiB, and a cache's replacement keeps part of a cycle larger than itself), 256 MiB and more at memory's speed:
# hence the floor, well beyond a 32 MiB L3 slice and its L2s. A pool has at most MAX_BUFFER_SETS sets.
COLD_BYTES = 64 * 2**20
CPU_COLD_BYTES = 256 * 2**20
MAX_COLD_BYTES = 4 * 2**30
MAX_BUFFER_SETS = 1024
# each tensor carved from the buffer starts on a cache line
COLD_ALIGNMENT = 64
# The optimizer phase's host cost (:func:`_time_optimizer_phase`): the tiny transformer with this many blocks (29
# and 101 parameter tensors), each phase timed this many times, the best kept; for each of these AdamW kernels.
OPTIMIZER_PROBE_BLOCKS = (2, 8)
OPTIMIZER_PROBE_REPEATS = 5
OPTIMIZER_KERNELS = ("fused", "foreach", "plain")
# Of a timed call, at least this share is kept as the work's own time when the dispatch cost is taken out.
MIN_WORK_SHARE = 0.1
# The spot check of a cached calibration (:func:`calibration_drift`): points this small are timed again, and a
# device further than DRIFT_TOLERANCE from them is calibrated again before a run's prediction.
SPOT_MATMUL_WORK = 256 * 256 * 2048
SPOT_STREAM_BYTES = 16 * 2**20
# 5%: the step target is 10%, and a calibration off by x prices every step x off; a spot check right after a
# calibration reads -2% to -5% (the Xeon VM), with an outlier now and then, which a second check sets aside
DRIFT_TOLERANCE = 0.05
# a calibration younger than this is trusted as it is: a shared host's speed moves over the hour, and a check on
# every run costs a few tenths of a second (a test suite's hundreds of runs, minutes)
SPOT_CHECK_AFTER_S = 3600.0


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MatmulPoint(_Model):
    """A timed (m x k) @ (k x n) in ``dtype``: FLOP/s of the best and the median repeat, dispatch taken out; where
    not ``timed`` (too slow to time, :data:`MAX_MATMUL_CALL_S`), the rates of the largest product timed."""

    dtype: str
    m: int
    n: int
    k: int
    best_flops_per_s: float
    median_flops_per_s: float
    timed: bool = True


class StreamPoint(_Model):
    """A timed elementwise ``add`` of ``bytes_moved`` (read and written): bytes/s, best and median repeat."""

    bytes_moved: int
    best_bytes_per_s: float
    median_bytes_per_s: float


class OptimizerPhase(_Model):
    """The host's cost of a step's optimizer phase (clipping, AdamW's step, the gradients set to None) beyond its
    operators' work: per step, and per parameter tensor updated (:func:`_time_optimizer_phase`)."""

    per_step_s: float
    per_tensor_s: float

    def seconds(self, tensors: int) -> float:
        return self.per_step_s + self.per_tensor_s * tensors

    def describe(self) -> str:
        return f"{self.per_step_s * 1e3:.2g} ms + {self.per_tensor_s * 1e6:.2g} us a tensor"


# A datasheet profile's tiles (m, n, their efficiency of a full tile's rate): the largest a GEMM library picks for a
# large product, and smaller ones that fill the compute units on a small or skinny one
MATMUL_TILES = ((128, 128, 1.0), (128, 64, 0.9), (64, 64, 0.75), (32, 32, 0.5))
MATMUL_TILE_K = 32  # the depth a tile's main loop steps through
MATMUL_FILL_STEPS = 2  # a tile's prologue and epilogue, in steps of its main loop
MATMUL_SPLIT_K = (1, 2, 4, 8)  # split-K factors, each while every split keeps MIN_SPLIT_DEPTH of k
MIN_SPLIT_DEPTH = 256
SPLIT_K_COST = 1.1  # the partial products' reduction


class TiledMatmul(_Model):
    """A product's rate from a datasheet (:func:`accelbench.estimate.profile.datasheet_profile`): its work padded
    to whole tiles (:data:`MATMUL_TILES`) and split over the device's compute units in waves, a wave as long as one
    tile's work at the peak's ``efficiency`` over the units, plus a kernel's fixed device time; the fastest tile and
    split-K a GEMM library could pick. Without ``compute_units``, no wave quantisation."""

    peak_flops_per_s: dict[str, float]
    efficiency: float
    compute_units: int | None
    kernel_s: float

    def rate(self, m: int, n: int, k: int, dtype: str) -> float:
        """FLOP/s of an (m x k) @ (k x n) in ``dtype`` (a dtype without a peak: the fp32 one's)."""
        peak = (
            self.peak_flops_per_s.get(dtype)
            or self.peak_flops_per_s.get("float32")
            or max(self.peak_flops_per_s.values())
        )
        rate = peak * self.efficiency
        best = math.inf
        for tile_m, tile_n, share in MATMUL_TILES:
            tiles = math.ceil(m / tile_m) * math.ceil(n / tile_n)
            for split in MATMUL_SPLIT_K:
                if split > 1 and k / split < MIN_SPLIT_DEPTH:
                    break
                steps = math.ceil(math.ceil(k / split) / MATMUL_TILE_K) + MATMUL_FILL_STEPS
                tile_flops = 2.0 * tile_m * tile_n * MATMUL_TILE_K * steps
                if self.compute_units:
                    waves = math.ceil(tiles * split / self.compute_units)
                    seconds = waves * tile_flops / (rate * share / self.compute_units)
                else:
                    seconds = tiles * split * tile_flops / (rate * share)
                best = min(best, seconds * (SPLIT_K_COST if split > 1 else 1.0))
        return 2.0 * m * n * k / (best + self.kernel_s)


class Calibration(_Model):
    """What this device reaches, measured (see the module's docstring); the calibrated step time's rates."""

    version: int = CALIBRATION_VERSION
    key: str
    device_type: str
    dtype: str
    threads: int | None
    # the cores this process could run on when measured (a CPU's; None on accelerators and in older calibrations):
    # worker processes x threads beyond them share them (accelbench.estimate.step_time.oversubscription)
    cores: int | None = None
    matmul: list[MatmulPoint]
    stream: list[StreamPoint]
    elementwise: dict[str, float] = {}  # elements/s by kind (ELEMENTWISE_KINDS), dispatch taken out
    # the same at ELEMENTWISE_LARGE_ELEMENTS elements, measured on accelerators only (empty on a CPU)
    elementwise_large: dict[str, float] = {}
    dispatch_s: float
    autograd_dispatch_s: float
    # seconds per operator of a training step whose operators do no work (:func:`_time_step_dispatch`); what the
    # step time counts per forward and backward operator, where measured
    step_dispatch_s: float | None = None
    # the bytes of each buffer the timed calls cycled through (:class:`ColdMemory`); None in calibrations from
    # before it was recorded
    cold_bytes: int | None = None
    # the optimizer phase's host cost by AdamW's kernels (fused, foreach, plain: those this device runs)
    optimizer_phase: dict[str, OptimizerPhase] = {}
    measured_at: str
    seconds: float
    contended: bool = False
    waiting: float | None = None
    # of the usable cores' time, the fraction a virtual machine's hypervisor gave to other guests meanwhile
    steal: float | None = None
    notes: list[str] = []
    # DeepSpeed ZeRO-3's engine cost on this host, attached where a ZeRO-3 step is priced (cached apart, in
    # accelbench.estimate.engine_cost; never stored with the calibration)
    zero3_hooks: Zero3Hooks | None = None
    # DTensor's dispatch cost on this host, attached where a tensor-parallel step is priced (cached apart, as above)
    dtensor_dispatch: DTensorDispatch | None = None
    # FSDP2's hooks' cost on this host, attached where an FSDP step is priced (cached apart, as above)
    fsdp_hooks: FsdpHooks | None = None
    # a datasheet profile's products, by shape from tiles and waves (its grid is this at the grid's shapes)
    tiles: TiledMatmul | None = None

    def matmul_rate(self, m: int, n: int, k: int, dtype: str | None = None) -> float:
        """FLOP/s of an (m x k) @ (k x n) in ``dtype`` (the calibration's matmul dtype when it has no grid for
        it): log(rate) interpolated linearly in log(m), log(n), log(k) between the grid's shapes, its edge beyond;
        a datasheet profile's from its tiles and waves at the shape itself."""
        if self.tiles is not None:
            return self.tiles.rate(m, n, k, dtype or self.dtype)
        points = [p for p in self.matmul if p.dtype == dtype] or [
            p for p in self.matmul if p.dtype == self.dtype
        ]
        grid = {(float(p.m), float(p.n), float(p.k)): p.best_flops_per_s for p in points}
        axes = [sorted({key[i] for key in grid}) for i in range(3)]
        brackets = [_bracket(axis, value) for axis, value in zip(axes, (m, n, k), strict=True)]
        log_rate = 0.0
        for corner in range(8):
            weight, shape = 1.0, []
            for axis in range(3):
                lo, hi, t = brackets[axis]
                upper = corner >> axis & 1
                weight *= t if upper else 1.0 - t
                shape.append(hi if upper else lo)
            if weight:
                log_rate += weight * math.log(grid[(shape[0], shape[1], shape[2])])
        return math.exp(log_rate)

    def stream_rate(self, bytes_moved: float) -> float:
        """Bytes/s of elementwise work moving ``bytes_moved``, interpolated in log(bytes), the edge beyond."""
        return _log_interpolate({float(p.bytes_moved): p.best_bytes_per_s for p in self.stream}, bytes_moved)

    def elementwise_rate(
        self, operator: str, strided: bool = False, elements: float | None = None
    ) -> float | None:
        """Elements/s of ``operator`` on ``elements`` (of its largest tensor) where its kind is measured (random
        numbers, softmax, exp-like activations, norms, masking; a copy of a tensor that is not contiguous,
        ``strided``), else None (memory-bound: :meth:`stream_rate`). Where the kind was measured at two sizes (an
        accelerator), log(rate) is interpolated in log(elements) between them, the edge's rate beyond."""
        kind = next(
            (k for k, (_, operators) in ELEMENTWISE_KINDS.items() if operator in operators),
            STRIDED_KIND if strided and operator in STRIDED_OPERATORS else None,
        )
        if kind is None or kind not in self.elementwise:
            return None
        small, large = self.elementwise[kind], self.elementwise_large.get(kind)
        if large is None or elements is None:
            return small
        return _log_interpolate(
            {float(ELEMENTWISE_ELEMENTS): small, float(ELEMENTWISE_LARGE_ELEMENTS): large}, elements
        )

    def describe(self) -> str:
        square = self.matmul_rate(MATMUL_SIZES[-1], MATMUL_SIZES[-1], MATMUL_SIZES[-1])
        small = self.matmul_rate(MATMUL_SIZES[0], MATMUL_SIZES[0], MATMUL_SIZES[0])
        stream = max(p.best_bytes_per_s for p in self.stream)
        kinds = ", ".join(
            f"{kind} {rate / 1e9:.2g}"
            + (f"-{self.elementwise_large[kind] / 1e9:.2g}" if kind in self.elementwise_large else "")
            for kind, rate in self.elementwise.items()
        )
        sizes = (
            f" at 2^{int(math.log2(ELEMENTWISE_ELEMENTS))}-2^{int(math.log2(ELEMENTWISE_LARGE_ELEMENTS))} elements"
            if self.elementwise_large
            else ""
        )
        busy = "; the host was busy meanwhile (a lower bound)" if self.contended else ""
        return (
            f"{self.dtype} matmul {small / 1e9:.3g} to {square / 1e9:.3g} GFLOP/s ({MATMUL_SIZES[0]}^3 to "
            f"{MATMUL_SIZES[-1]}^3), elementwise up to {stream / 1e9:.3g} GB/s ({kinds} Gelem/s{sizes}), dispatch "
            f"{self.dispatch_s * 1e6:.2g} us/op ({self.autograd_dispatch_s * 1e6:.2g} us recorded by autograd"
            + (
                f", {self.step_dispatch_s * 1e6:.2g} us within a training step"
                if self.step_dispatch_s is not None
                else ""
            )
            + ")"
            + "".join(
                f", optimizer phase ({kernels}) {phase.describe()}"
                for kernels, phase in self.optimizer_phase.items()
            )  # fmt: skip
            + (f", on {self.cold_bytes / 2**20:.0f} MiB of tensors cycled through" if self.cold_bytes else "")
            + f"; measured {self.measured_at} on {self.key}{busy}"
        )


def _bracket(axis: Sequence[float], value: float) -> tuple[float, float, float]:
    """The grid values either side of ``value`` and its position between them in log space (clamped to the
    grid's ends)."""
    if value <= axis[0]:
        return axis[0], axis[0], 0.0
    if value >= axis[-1]:
        return axis[-1], axis[-1], 0.0
    i = bisect.bisect_right(axis, value)
    lo, hi = axis[i - 1], axis[i]
    return lo, hi, (math.log(value) - math.log(lo)) / (math.log(hi) - math.log(lo))


def _log_interpolate(rates: dict[float, float], value: float) -> float:
    """``rates`` (by size) at ``value``: log(rate) interpolated linearly in log(size), the edge's rate beyond."""
    lo, hi, t = _bracket(sorted(rates), value)
    return math.exp((1.0 - t) * math.log(rates[lo]) + t * math.log(rates[hi]))


def calibration_key(backend: str, device_name: str, dtype: str, device_type: str) -> str:
    """What a calibration depends on: host, backend, device, torch version, matmul dtype and on a CPU the
    intra-op threads (:func:`accelbench.estimate.peak.device_key`)."""
    return device_key(backend, device_name, dtype, device_type)


def calibrate(
    device: torch.device,
    synchronize: Callable[[torch.device], None],
    *,
    backend: str,
    device_name: str,
    dtype: str,
    refresh: bool = False,
    fresh_since: datetime | None = None,
    cached_only: bool = False,
    directory: Path | None = None,
    matmul_sizes: Sequence[int] | None = None,
    stream_bytes: Sequence[int] | None = None,
    cold_bytes: int | None = None,
) -> Calibration | None:
    """This device's calibration for matmuls in ``dtype``: from the cache where this host, device, torch, dtype
    (and CPU thread count) were calibrated before, unless ``refresh`` or the cached one was contended; else
    measured now (seconds) on ``device`` (already bound by the backend), stored and returned. With ``refresh``, a
    cached calibration measured at or after ``fresh_since`` counts as measured now (``plan --refresh-calibration``
    resolves one precision after another, several of them in one dtype: each is measured once a command). With
    ``cached_only`` nothing is measured: None when nothing usable is cached. An unreadable cache entry is
    measured again, and the calibration's notes say so. ``matmul_sizes`` and ``stream_bytes`` replace the grids
    (:data:`MATMUL_SIZES`, :data:`STREAM_BYTES`), ``cold_bytes`` the memory cycled through (:func:`cold_memory_bytes`)."""
    import torch

    matmul_sizes = matmul_sizes or MATMUL_SIZES
    stream_bytes = stream_bytes or STREAM_BYTES

    key = calibration_key(backend, device_name, dtype, device.type)
    folder = directory or cache_dir()
    entries, problem = _load(folder / CACHE_FILE)
    notes = [problem] if problem else []
    earlier: Calibration | None = None
    fresh = measured_since(entries.get(key), fresh_since)  # by this command: not measured again
    if key in entries and (not refresh or fresh):
        try:
            cached = Calibration.model_validate(entries[key])
            if cached.version != CALIBRATION_VERSION:
                raise ValueError(f"version {cached.version}, this accelbench writes {CALIBRATION_VERSION}")
            if (
                cached.device_type == "cpu" and cached.cores is None
            ):  # from before it was recorded: this host's
                cached = cached.model_copy(update={"cores": usable_cores()})
            if cached_only or fresh or not cached.contended:
                return cached
            earlier = cached
            notes.append("the cached calibration was measured on a busy host: measured again")
        except (ValidationError, ValueError) as exc:
            notes.append(
                f"the cached calibration for {key} in {folder / CACHE_FILE} is not one this accelbench reads "
                f"({_first_line(exc)}): measured again"
            )
    if cached_only:
        return None
    started = time.perf_counter()
    before = cpu_usage()
    dispatch = _time_dispatch(device, synchronize, autograd=False)
    autograd_dispatch = _time_dispatch(device, synchronize, autograd=True)
    step_dispatch = _time_step_dispatch(device, synchronize)
    dtypes = [dtype] if dtype == "float32" else [dtype, "float32"]
    memory = ColdMemory(device, cold_bytes)
    matmul = []
    for d in dtypes:
        tiny = _time_matmul(
            device, synchronize, d, 1, 1, 1, 0.0, memory
        )  # a matmul's own dispatch: nothing to compute
        matmul += _time_matmul_grid(
            device, synchronize, d, matmul_sizes, 2.0 / tiny.median_flops_per_s, memory
        )
        slow = [p for p in matmul if p.dtype == d and not p.timed]
        if slow:
            notes.append(
                f"{len(slow)} {d} product(s) of the grid not timed: at this device's fastest {d} rate "
                f"({max(p.best_flops_per_s for p in matmul if p.dtype == d) / 1e9:.3g} GFLOP/s) one call would take "
                f"over {MAX_MATMUL_CALL_S:g} s; priced at the rate of the largest timed"
            )
    matmul = _no_faster_than_the_largest(matmul)
    stream = [_time_stream(device, synchronize, size, dispatch, memory) for size in stream_bytes]
    kinds = [*((kind, op) for kind, (op, _) in ELEMENTWISE_KINDS.items()), (STRIDED_KIND, "permuted")]
    elementwise = {
        kind: _time_elementwise(device, synchronize, op, dispatch, memory=memory) for kind, op in kinds
    }
    elementwise_large = (
        {
            kind: _time_elementwise(device, synchronize, op, dispatch, ELEMENTWISE_LARGE_ELEMENTS, memory)
            for kind, op in kinds
        }
        if device.type != "cpu"
        else {}
    )
    optimizer_phase = {
        kernels: phase
        for kernels in OPTIMIZER_KERNELS
        if (phase := _time_optimizer_phase(device, synchronize, memory, kernels)) is not None
    }
    after = cpu_usage()
    waiting, steal = after.waiting_since(before), after.steal_since(before)
    calibration = Calibration(
        key=key,
        device_type=device.type,
        dtype=dtype,
        threads=torch.get_num_threads() if device.type == "cpu" else None,
        cores=usable_cores() if device.type == "cpu" else None,
        matmul=matmul,
        stream=stream,
        elementwise=elementwise,
        elementwise_large=elementwise_large,
        dispatch_s=dispatch,
        autograd_dispatch_s=autograd_dispatch,
        step_dispatch_s=step_dispatch,
        cold_bytes=memory.nbytes,
        optimizer_phase=optimizer_phase,
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        seconds=time.perf_counter() - started,
        contended=any(f is not None and f >= CONTENDED_WAITING for f in (waiting, steal)),
        waiting=waiting,
        steal=steal,
    )
    if calibration.contended and earlier is not None and not refresh:
        calibration = _faster(calibration, earlier)
        notes.append(
            "measured on a busy host again: each rate is the higher of this and the cached measurement"
        )
    if (
        calibration.contended
    ):  # a lower bound of the device's rates: used where the caller says so, never cached
        notes.append(
            "measured while the host was busy (its threads waited for a core, or the hypervisor took the cores' "
            "time): its rates are a lower bound of this device's, and it is not cached"
        )
        return calibration.model_copy(update={"notes": notes})
    entries, _ = _load(folder / CACHE_FILE)  # re-read: another process may have stored meanwhile
    entries[key] = calibration.model_dump(exclude={"zero3_hooks", "dtensor_dispatch", "fsdp_hooks"})
    _write_atomically(json.dumps(entries, indent=2, sort_keys=True), folder / CACHE_FILE)
    return calibration.model_copy(update={"notes": notes})


def needs_spot_check(calibration: Calibration, now: datetime | None = None) -> bool:
    """Whether ``calibration`` is old enough (:data:`SPOT_CHECK_AFTER_S`) to be checked against the device before
    it prices a run (:func:`calibration_drift`); an unreadable timestamp is checked."""
    try:
        measured = datetime.fromisoformat(calibration.measured_at)
    except ValueError:
        return True
    if measured.tzinfo is None:
        measured = measured.replace(tzinfo=timezone.utc)
    return ((now or datetime.now(timezone.utc)) - measured).total_seconds() > SPOT_CHECK_AFTER_S


def calibration_drift(
    calibration: Calibration, device: torch.device, synchronize: Callable[[torch.device], None]
) -> float | None:
    """How far this device is now from its cached ``calibration``: one of its matmul points and one of its stream
    points timed again (a tenth of a second), each rate now over the cached one, less 1; the one further from the
    cache. A shared host (a virtual machine, a node with other jobs) changes speed by tens of percent within an
    hour, and a calibration from a faster or slower moment then predicts every step of this one as far off. None
    where the calibration has no point small enough to time quickly.

    The points: the largest matmul of at most :data:`SPOT_MATMUL_WORK` multiply-adds in the calibration's dtype,
    and the largest stream of at most :data:`SPOT_STREAM_BYTES`."""
    matmuls = [
        p for p in calibration.matmul if p.dtype == calibration.dtype and p.m * p.n * p.k <= SPOT_MATMUL_WORK
    ]
    streams = [p for p in calibration.stream if p.bytes_moved <= SPOT_STREAM_BYTES]
    if not matmuls or not streams:
        return None
    was_matmul = max(matmuls, key=lambda p: p.m * p.n * p.k)
    was_stream = max(streams, key=lambda p: p.bytes_moved)
    memory = ColdMemory(device, calibration.cold_bytes)
    tiny = _time_matmul(device, synchronize, calibration.dtype, 1, 1, 1, 0.0, memory)
    overhead = 2.0 / tiny.median_flops_per_s
    matmul = _time_matmul(
        device, synchronize, calibration.dtype, was_matmul.m, was_matmul.n, was_matmul.k, overhead, memory
    )
    stream = _time_stream(device, synchronize, was_stream.bytes_moved, calibration.dispatch_s, memory)
    changes = (
        matmul.best_flops_per_s / was_matmul.best_flops_per_s - 1.0,
        stream.best_bytes_per_s / was_stream.best_bytes_per_s - 1.0,
    )
    return max(changes, key=abs)


def drift_beyond_tolerance(
    calibration: Calibration, device: torch.device, synchronize: Callable[[torch.device], None]
) -> float | None:
    """The device's drift from its cached ``calibration`` (:func:`calibration_drift`) where it is beyond
    :data:`DRIFT_TOLERANCE` twice running (the second check's, the nearer of the two: a spot check's tenth of a
    second now and then meets a busy moment, and one such reading should not cost a calibration); else None."""
    first = calibration_drift(calibration, device, synchronize)
    if first is None or abs(first) <= DRIFT_TOLERANCE:
        return None
    second = calibration_drift(calibration, device, synchronize)
    if second is None or abs(second) <= DRIFT_TOLERANCE:
        return None
    return min(first, second, key=abs)


def _no_faster_than_the_largest(points: list[MatmulPoint]) -> list[MatmulPoint]:
    """Each dtype's rates capped at that of its largest product, whose dispatch is negligible: taking a small
    product's dispatch out of its time leaves little, and a busy host's dispatch (timed apart) can leave too little,
    so a small product would seem faster than the device's dense peak, which no product is."""
    ceiling: dict[str, MatmulPoint] = {}
    for p in points:
        if (
            p.dtype not in ceiling
            or p.m * p.n * p.k > ceiling[p.dtype].m * ceiling[p.dtype].n * ceiling[p.dtype].k
        ):
            ceiling[p.dtype] = p
    return [
        p.model_copy(
            update={
                "best_flops_per_s": min(p.best_flops_per_s, ceiling[p.dtype].best_flops_per_s),
                "median_flops_per_s": min(p.median_flops_per_s, ceiling[p.dtype].best_flops_per_s),
            }
        )
        for p in points
    ]


def _faster(now: Calibration, earlier: Calibration) -> Calibration:
    """Two calibrations of one device, both on a busy host: a busy host only lowers a rate and lengthens a
    dispatch, so each figure is the better of the two (shapes and sizes the earlier one lacks are kept as now)."""
    matmul = {(p.dtype, p.m, p.n, p.k): p for p in earlier.matmul}
    stream = {p.bytes_moved: p for p in earlier.stream}

    def better_matmul(p: MatmulPoint) -> MatmulPoint:
        old = matmul.get((p.dtype, p.m, p.n, p.k))
        return old if old is not None and old.best_flops_per_s > p.best_flops_per_s else p

    def better_stream(p: StreamPoint) -> StreamPoint:
        old = stream.get(p.bytes_moved)
        return old if old is not None and old.best_bytes_per_s > p.best_bytes_per_s else p

    return now.model_copy(
        update={
            "matmul": _no_faster_than_the_largest([better_matmul(p) for p in now.matmul]),
            "stream": [better_stream(p) for p in now.stream],
            "elementwise": {k: max(v, earlier.elementwise.get(k, 0.0)) for k, v in now.elementwise.items()},
            "elementwise_large": {
                k: max(v, earlier.elementwise_large.get(k, 0.0)) for k, v in now.elementwise_large.items()
            },
            "dispatch_s": min(now.dispatch_s, earlier.dispatch_s),
            "autograd_dispatch_s": min(now.autograd_dispatch_s, earlier.autograd_dispatch_s),
            "step_dispatch_s": min(
                (d for d in (now.step_dispatch_s, earlier.step_dispatch_s) if d is not None), default=None
            ),
            "optimizer_phase": {
                kernels: _cheaper(phase, earlier.optimizer_phase.get(kernels))
                for kernels, phase in now.optimizer_phase.items()
            },
        }
    )


def _cheaper(now: OptimizerPhase, earlier: OptimizerPhase | None) -> OptimizerPhase:
    if earlier is None:
        return now
    return OptimizerPhase(per_step_s=min(now.per_step_s, earlier.per_step_s),
                          per_tensor_s=min(now.per_tensor_s, earlier.per_tensor_s))  # fmt: skip


def _repeat(
    run: Callable[[], object], synchronize: Callable[[], None], calls: int = 1
) -> tuple[float, float]:
    """Seconds per call of ``run`` (``calls`` calls per timed repeat): best and median of the repeats, which run
    for :data:`REPEAT_BUDGET_S` (at least :data:`MIN_REPEATS` unless they reach :data:`MAX_REPEAT_S`), each between
    synchronisations."""
    run()  # warm-up: kernel selection, lazy initialisation
    times: list[float] = []
    spent = 0.0
    while spent < REPEAT_BUDGET_S or (len(times) < MIN_REPEATS and spent < MAX_REPEAT_S):
        synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            run()
        synchronize()
        elapsed = time.perf_counter() - start
        spent += elapsed
        times.append(elapsed / calls)
    return min(times), statistics.median(times)


def _work_time(per_call: float, dispatch: float) -> float:
    """A call's time less its dispatch (counted per operator elsewhere), never below a tenth of the call."""
    return max(per_call - dispatch, per_call * MIN_WORK_SHARE)


def _time_dispatch(
    device: torch.device, synchronize: Callable[[torch.device], None], autograd: bool
) -> float:
    """Median seconds per call of ``add`` on one-element tensors (its work is nil): the dispatch, and with
    ``autograd`` the recording of the graph node too."""
    import torch

    a = torch.ones(1, device=device, requires_grad=autograd)
    b = torch.ones(1, device=device)
    with torch.enable_grad():
        _, median = _repeat(lambda: torch.add(a, b), lambda: synchronize(device), DISPATCH_CALLS)
    return median


def _time_step_dispatch(device: torch.device, synchronize: Callable[[torch.device], None]) -> float:
    """Median seconds per operator of a training step that does no work: two pre-norm transformer blocks (explicit
    causal attention with dropout, a GELU MLP) and a head, on a batch of 2 sequences of 4 tokens 8 wide, forward,
    cross-entropy and backward, timed as a whole and divided by the operators the tracer
    (:mod:`accelbench.estimate.operators`) records in the same step, views and all. The per-operator cost of a
    step's module calls, autograd's engine and the allocator, which a loop of one operator does not pay."""

    from accelbench.estimate.operators import count_operators

    model, backward = _tiny_training_step(device, blocks=2)

    def step() -> None:
        backward()
        for p in model.parameters():
            p.grad = None

    operators = count_operators(step)
    _, median = _repeat(step, lambda: synchronize(device))
    return median / max(operators, 1)


def _tiny_transformer_class() -> type[torch.nn.Module]:
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
            self.drop = nn.Dropout(0.1)
            self.heads = 2

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, c = x.shape
            q, k, v = self.qkv(self.norm1(x)).split(c, dim=2)
            q, k, v = (y.view(b, t, self.heads, c // self.heads).transpose(1, 2) for y in (q, k, v))
            scores = (q @ k.transpose(-2, -1)) / (c // self.heads) ** 0.5
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            attention = self.drop(scores.masked_fill(~mask, float("-inf")).softmax(-1))
            y = (attention @ v).transpose(1, 2).contiguous().view(b, t, c)
            x = x + self.drop(self.proj(y))
            return x + self.drop(self.down(nn.functional.gelu(self.up(self.norm2(x)))))

    class TinyTransformer(nn.Module):
        def __init__(self, width: int, vocab: int, blocks: int = 2) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            self.blocks = nn.Sequential(*(Block(width) for _ in range(blocks)))
            self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.head(self.norm(self.blocks(self.embed(tokens))))

    return TinyTransformer


def _TinyTransformer(width: int, vocab: int, blocks: int = 2) -> torch.nn.Module:  # noqa: N802 - torch imported on first use
    return _tiny_transformer_class()(width, vocab, blocks)


def _tiny_training_step(device: torch.device, blocks: int) -> tuple[torch.nn.Module, Callable[[], None]]:
    """The tiny transformer of ``blocks`` blocks, 8 wide, on ``device`` in train mode, and its forward,
    cross-entropy and backward on a batch of 2 sequences of 4 tokens (a vocabulary of 16)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    width, tokens, vocab = 8, 4, 16
    model = _TinyTransformer(width, vocab, blocks).to(device).train()
    inputs = torch.randint(0, vocab, (2, tokens), generator=generator).to(device)
    targets = torch.randint(0, vocab, (2, tokens), generator=generator).to(device)

    def backward() -> None:
        torch.nn.functional.cross_entropy(model(inputs).flatten(0, 1), targets.flatten()).backward()

    return model, backward


def _time_optimizer_phase(
    device: torch.device, synchronize: Callable[[torch.device], None], memory: ColdMemory, kernels: str
) -> OptimizerPhase | None:
    """The host's cost of a step's optimizer phase with AdamW's ``kernels``, as the executor runs it (the
    gradients clipped to a global norm, AdamW's step over two groups, decayed and not, as the workloads make them,
    and the gradients set to None): per step and per parameter tensor, from the tiny transformer with
    :data:`OPTIMIZER_PROBE_BLOCKS` blocks (29 and 101 tensors of a few elements, whose work is nil), each timed
    after its forward and backward and a read of the cold memory, as a step's optimizer runs once backward has
    gone through its activations (Python's and the optimizer's objects out of the cache: on this project's Xeon
    VM the phase took 2-2.5x as long so). None where the device cannot run these kernels."""
    timed = [
        _optimizer_phase_seconds(device, synchronize, memory, kernels, b) for b in OPTIMIZER_PROBE_BLOCKS
    ]
    if any(t is None for t in timed):
        return None
    (few, t_few), (many, t_many) = (t for t in timed if t is not None)
    per_tensor = max(0.0, (t_many - t_few) / (many - few))
    return OptimizerPhase(per_step_s=max(0.0, t_few - per_tensor * few), per_tensor_s=per_tensor)


def _optimizer_phase_seconds(
    device: torch.device,
    synchronize: Callable[[torch.device], None],
    memory: ColdMemory,
    kernels: str,
    blocks: int,
) -> tuple[int, float] | None:
    """The tiny transformer of ``blocks`` blocks: its parameter tensors, and the best time of its optimizer phase
    (:func:`_time_optimizer_phase`); None where the device cannot run ``kernels``."""
    import torch

    from accelbench.workloads import optimizer_kernels

    model, backward = _tiny_training_step(device, blocks)
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]  # fmt: skip
    try:
        optimizer = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95), **optimizer_kernels(kernels))

        def update() -> None:
            torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=kernels != "plain")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        backward()
        update()  # the optimizer's state made, as after a run's first step
    except (RuntimeError, ValueError, NotImplementedError):  # e.g. no fused AdamW on this device
        return None
    times = []
    for _ in range(OPTIMIZER_PROBE_REPEATS):
        backward()
        memory.sweep()
        synchronize(device)
        start = time.perf_counter()
        update()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return len(params), min(times)


def _time_matmul(
    device: torch.device,
    synchronize: Callable[[torch.device], None],
    dtype: str,
    m: int,
    n: int,
    k: int,
    dispatch: float,
    memory: ColdMemory | None = None,
) -> MatmulPoint:
    """``a @ b -> out``, each call on the next of several operand sets (:class:`ColdMemory`): a step's products
    read activations and weights last touched many operators before, and write where another tensor lay."""
    import torch

    kind = getattr(torch, dtype)
    turn = (memory or ColdMemory(device)).sets((kind, (m, k)), (kind, (k, n)), out=(kind, (m, n)))

    def product() -> None:
        a, b, out = next(turn)
        torch.mm(a, b, out=out)

    flops = 2.0 * m * n * k
    # tiny products: several per timed repeat; on an accelerator, queued until a repeat holds some work, as a step's
    # products run back to back (one call between synchronisations times the launch and the round trip)
    queued = 2e6 if device.type == "cpu" else ACCELERATOR_QUEUED_MULTIPLY_ADDS
    calls = max(1, min(DISPATCH_CALLS, int(queued // (m * n * k))))
    best, median = _repeat(product, lambda: synchronize(device), calls)
    return MatmulPoint(
        dtype=dtype,
        m=m,
        n=n,
        k=k,
        best_flops_per_s=flops / _work_time(best, dispatch),
        median_flops_per_s=flops / _work_time(median, dispatch),
    )


def _time_matmul_grid(
    device: torch.device,
    synchronize: Callable[[torch.device], None],
    dtype: str,
    sizes: Sequence[int],
    dispatch: float,
    memory: ColdMemory | None = None,
) -> list[MatmulPoint]:
    """Every (m, n, k) of ``sizes`` in ``dtype``, smallest work first; a product that would take longer than
    :data:`MAX_MATMUL_CALL_S` a call at the fastest rate timed so far is not timed but given the rates of the
    largest product timed (``timed`` False)."""
    shapes = sorted(itertools.product(sizes, repeat=3), key=math.prod)
    memory = memory or ColdMemory(device)
    points: list[MatmulPoint] = []
    for m, n, k in shapes:
        timed = [p for p in points if p.timed]
        fastest = max((p.best_flops_per_s for p in timed), default=math.inf)
        if timed and 2.0 * m * n * k / fastest > MAX_MATMUL_CALL_S:
            largest = max(timed, key=lambda p: p.m * p.n * p.k)
            points.append(largest.model_copy(update={"m": m, "n": n, "k": k, "timed": False}))
        else:
            points.append(_time_matmul(device, synchronize, dtype, m, n, k, dispatch, memory))
    return points


def cold_memory_bytes(device: torch.device) -> int:
    """How much memory a cold measurement cycles through on ``device`` (:class:`ColdMemory`, per buffer): on a CPU
    twice its last-level cache as Linux reports it, at least :data:`CPU_COLD_BYTES`, at most :data:`MAX_COLD_BYTES`
    and a sixteenth of the memory available (a calibration holds up to four buffers), never under
    :data:`COLD_BYTES`; an accelerator's :data:`COLD_BYTES`."""
    from accelbench.hostinfo import available_memory_bytes, last_level_cache_bytes

    if device.type != "cpu":
        return COLD_BYTES
    wanted = min(max(CPU_COLD_BYTES, 2 * (last_level_cache_bytes() or 0)), MAX_COLD_BYTES)
    available = available_memory_bytes()
    if available:
        wanted = min(wanted, available // 16)
    return max(wanted, COLD_BYTES)


# a cold buffer's key: an input dtype, or None: the untyped output buffer
_Key = Union["torch.dtype", None]


class ColdMemory:
    """The memory a calibration's timed calls take their tensors from, so that each call finds them out of every
    cache, as a step's operator finds what was written many operators before.

    On a CPU, whose buffers are its memory's (up to GiBs): per dtype one buffer of ``nbytes`` for the inputs,
    written once, and one untyped buffer the outputs are written to (never read, so one dtype's results there are
    no other's inputs). Each buffer is cut into slots the size of one set's tensors; a pool of sets (:meth:`sets`)
    takes the slots after those the calls before it used, and is cycled through, so a call's tensors are the ones
    touched longest ago. Elsewhere each pool's sets are tensors of their own, ``nbytes`` in all, as before: a lazy
    device (XLA) compiles a graph for each slice of a buffer it is given (on XLA's CPU device a calibration over
    slices compiled for minutes and held 9 GB), and needs no dtype reinterpreted. Inputs are small values (0.5: no
    denormals, no overflow), bools True; an in-place call (dropout's mask) writes 0s and 1s there."""

    def __init__(self, device: torch.device, nbytes: int | None = None) -> None:
        self.device = device
        self.nbytes = nbytes if nbytes is not None else cold_memory_bytes(device)
        self._buffers: dict[_Key, torch.Tensor] = {}
        self._cursors: dict[_Key, int] = {}  # the byte each buffer's next pool starts from
        self._last: _Pool | None = None

    def _buffer(self, key: _Key, nbytes: int) -> torch.Tensor:
        """The input buffer of a dtype (its elements), or the output buffer (None: bytes), of ``nbytes`` or more;
        made on first use, and made again larger where a set needs more than one holds. The output buffer is written
        once too: a first write would fault its pages in while timed."""
        import torch

        found = self._buffers.get(key)
        if found is None or found.numel() * found.element_size() < nbytes:
            if key is None:
                found = torch.zeros(nbytes, dtype=torch.uint8, device=self.device)
            else:
                value = True if key == torch.bool else 0.5
                found = torch.full((nbytes // _element_size(key),), value, dtype=key, device=self.device)
            self._buffers[key] = found
            self._cursors[key] = 0
        return found

    def sets(
        self,
        *inputs: tuple[torch.dtype, tuple[int, ...]],
        out: tuple[torch.dtype, tuple[int, ...]] | None = None,
    ) -> Iterator[tuple[torch.Tensor, ...]]:
        """Sets of tensors, one set a call, cycled through: the ``inputs`` (dtype and shape each) and the output
        ``out``, in that order; as many sets as every buffer has slots for (elsewhere than on a CPU, as fit
        ``nbytes``), at most :data:`MAX_BUFFER_SETS`."""
        if self.device.type != "cpu":
            return self._separate_sets(inputs, out)
        self._advance()
        wanted: dict[_Key, list[tuple[torch.dtype, tuple[int, ...]]]] = {}
        for dtype, shape in inputs:
            wanted.setdefault(dtype, []).append((dtype, shape))
        if out is not None:
            wanted[None] = [out]
        room = {
            key: sum(_aligned(_nbytes(d, shape)) for d, shape in tensors) for key, tensors in wanted.items()
        }
        # a set larger than the buffer is one slot of a buffer its size (its own size is then what makes it cold)
        buffers = {key: self._buffer(key, max(self.nbytes, r)) for key, r in room.items()}
        slots = {key: buffers[key].numel() * buffers[key].element_size() // r for key, r in room.items()}
        count = max(1, min(MAX_BUFFER_SETS, *slots.values()))
        first = {key: -(-self._cursors[key] // room[key]) % slots[key] for key in wanted}
        pool = []
        for i in range(count):
            carved: dict[_Key, list[torch.Tensor]] = {}
            for key, tensors in wanted.items():
                buffer = buffers[key]
                offset = (first[key] + i) % slots[key] * room[key]
                carved[key] = []
                for dtype, shape in tensors:
                    carved[key].append(_view(buffer, offset, dtype, shape))
                    offset += _aligned(_nbytes(dtype, shape))
            taken = [carved[dtype].pop(0) for dtype, _ in inputs]
            pool.append(tuple(taken + (carved[None] if out is not None else [])))
        self._last = _Pool(pool, {key: (first[key], slots[key], room[key]) for key in wanted})
        return self._last

    def _separate_sets(
        self,
        inputs: tuple[tuple[torch.dtype, tuple[int, ...]], ...],
        out: tuple[torch.dtype, tuple[int, ...]] | None,
    ) -> Iterator[tuple[torch.Tensor, ...]]:
        """Sets of tensors of their own (a device other than a CPU), ``nbytes`` in all, cycled through."""
        import torch

        tensors = [*inputs, *([out] if out is not None else [])]
        size = sum(_nbytes(dtype, shape) for dtype, shape in tensors)
        count = max(1, min(MAX_BUFFER_SETS, self.nbytes // max(size, 1)))
        pool = [
            tuple(
                torch.full(shape, True if dtype == torch.bool else 0.5, dtype=dtype, device=self.device)
                for dtype, shape in tensors
            )
            for _ in range(count)
        ]
        return _Pool(pool, {})

    def sweep(self) -> None:
        """Read a whole buffer of ``nbytes``: what the caches held before is gone from them."""
        import torch

        self._buffer(torch.float32, self.nbytes).sum()

    def _advance(self) -> None:
        """Each buffer's cursor past the slots the last pool's calls used (past its whole ring where they went
        round it: what lies beyond was touched longest ago)."""
        last, self._last = self._last, None
        if last is None:
            return
        used = min(last.calls, len(last.pool))
        for key, (first, slots, room) in last.slots.items():
            self._cursors[key] = (first + used) % slots * room


class _Pool:
    """Sets of tensors cycled through, counting the calls that took one (:meth:`ColdMemory._advance`)."""

    def __init__(self, pool: list[tuple[torch.Tensor, ...]], slots: dict[_Key, tuple[int, int, int]]):
        self.pool, self.slots, self.calls = pool, slots, 0

    def __iter__(self) -> _Pool:
        return self

    def __next__(self) -> tuple[torch.Tensor, ...]:
        found = self.pool[self.calls % len(self.pool)]
        self.calls += 1
        return found


def _element_size(dtype: torch.dtype) -> int:
    import torch

    return torch.empty((), dtype=dtype).element_size()


def _nbytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    return math.prod(shape) * _element_size(dtype)


def _aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to whole :data:`COLD_ALIGNMENT` lines."""
    return -(-nbytes // COLD_ALIGNMENT) * COLD_ALIGNMENT


def _view(buffer: torch.Tensor, offset: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """A ``dtype`` tensor of ``shape`` at byte ``offset`` (aligned) of ``buffer``: an input buffer of that dtype, or
    the untyped output buffer."""
    if buffer.dtype == dtype:
        return buffer.narrow(0, offset // buffer.element_size(), math.prod(shape)).view(shape)
    return buffer.narrow(0, offset, _nbytes(dtype, shape)).view(dtype).view(shape)


def _time_stream(
    device: torch.device,
    synchronize: Callable[[torch.device], None],
    bytes_moved: int,
    dispatch: float,
    memory: ColdMemory | None = None,
) -> StreamPoint:
    """``a + b -> out`` moving ``bytes_moved``, each call on the next of several sets of tensors
    (:class:`ColdMemory`), so that its tensors come from memory, not from the cache the previous calls warmed: in a
    step most elementwise work reads what was written long before (backward reads forward's activations)."""
    import torch

    elements = bytes_moved // 12  # three fp32 tensors: a + b -> out
    fp32 = torch.float32
    turn = (memory or ColdMemory(device)).sets(
        (fp32, (elements,)), (fp32, (elements,)), out=(fp32, (elements,))
    )

    def add() -> None:
        a, b, out = next(turn)
        torch.add(a, b, out=out)

    calls = max(1, min(DISPATCH_CALLS, 2**22 // bytes_moved))
    best, median = _repeat(add, lambda: synchronize(device), calls)
    moved = elements * 12
    return StreamPoint(
        bytes_moved=moved,
        best_bytes_per_s=moved / _work_time(best, dispatch),
        median_bytes_per_s=moved / _work_time(median, dispatch),
    )


def _time_elementwise(
    device: torch.device,
    synchronize: Callable[[torch.device], None],
    operator: str,
    dispatch: float,
    elements: int = ELEMENTWISE_ELEMENTS,
    memory: ColdMemory | None = None,
) -> float:
    """Elements/s of ``operator`` on ``elements`` fp32 values in rows of :data:`ELEMENTWISE_ROW` (a softmax's, a
    norm's and a reduction's rows), each call on the next of several sets of inputs and output
    (:class:`ColdMemory`), as in a step; the elements are those of its largest tensor, as
    :mod:`accelbench.estimate.step_time` counts them."""
    run = _elementwise_call(memory or ColdMemory(device), operator, elements)
    calls = 1 if device.type == "cpu" else ACCELERATOR_ELEMENTWISE_CALLS
    best, _ = _repeat(run, lambda: synchronize(device), calls)
    return elements / _work_time(best, dispatch)


def _elementwise_call(
    memory: ColdMemory, operator: str, elements: int = ELEMENTWISE_ELEMENTS
) -> Callable[[], object]:
    """One call of ``operator`` (an :data:`ELEMENTWISE_KINDS` kind's) on ``elements`` values, on the next set of
    cold tensors from ``memory``."""
    import torch

    aten = torch.ops.aten
    device, fp32, bool_ = memory.device, torch.float32, torch.bool
    norm = operator in ("native_layer_norm", "native_layer_norm_backward")
    width = ACCELERATOR_NORM_ROW if norm and device.type != "cpu" else ELEMENTWISE_ROW
    rows = elements // width
    shape, row = (rows, width), (rows, 1)
    if operator == "bernoulli_":  # in place: the mask overwrites its input
        masks = memory.sets((fp32, shape))
        return lambda: next(masks)[0].bernoulli_(0.9)  # dropout's keep probability
    if norm:
        weight = torch.ones(width, device=device)
        bias = torch.zeros(width, device=device)
        if operator == "native_layer_norm":
            inputs = memory.sets((fp32, shape))
            return lambda: aten.native_layer_norm(next(inputs)[0], [width], weight, bias, 1e-5)
        sets = memory.sets((fp32, shape), (fp32, shape), (fp32, row), (fp32, row))

        def backward() -> object:
            grad, x, mean, rstd = next(sets)
            return aten.native_layer_norm_backward(
                grad, x, [width], mean, rstd, weight, bias, [True, True, True]
            )

        return backward
    if operator == "all":  # over each row of a bool per score, as _safe_softmax's test of a row masked whole
        flags = memory.sets((bool_, shape), out=(bool_, row))

        def reduce() -> object:
            x, out = next(flags)
            return aten.all.out(x, -1, True, out=out)

        return reduce
    if operator == "where":  # a bool per row broadcast over it, a scalar where it holds, the scores elsewhere
        zero = torch.zeros((), device=device)
        sets = memory.sets((bool_, row), (fp32, shape), out=(fp32, shape))

        def select() -> object:
            condition, x, out = next(sets)
            return aten.where.self_out(condition, zero, x, out=out)

        return select
    if operator == "permuted":
        # a (batch, sequence, heads, width) activation made contiguous as (batch, heads, sequence, width)
        batch = elements // (width * 4 * 32)
        sets = memory.sets((fp32, (batch, width, 4, 32)), out=(fp32, (batch, 4, width, 32)))

        def gather() -> object:
            x, out = next(sets)
            return out.copy_(x.transpose(1, 2))

        return gather
    if operator == "isneginf":
        tests = memory.sets((fp32, shape), out=(bool_, shape))

        def test() -> object:
            x, out = next(tests)
            return aten.isneginf.out(x, out=out)

        return test
    sets = memory.sets((fp32, shape), (fp32, shape), out=(fp32, shape))

    def run() -> None:
        x, grad, out = next(sets)
        if operator == "gelu_backward":
            aten.gelu_backward.grad_input(grad, x, grad_input=out)
        elif operator == "_softmax_backward_data":  # the output's gradient, the output
            aten._softmax_backward_data.out(grad, x, -1, torch.float32, grad_input=out)
        elif operator == "softmax":
            aten._softmax.out(x, -1, False, out=out)
        else:
            getattr(aten, operator).out(x, out=out)

    return run


def _load(path: Path) -> tuple[dict[str, object], str | None]:
    """The cache's entries, and what was wrong with the file where it could not be read (it is then rewritten
    with what is measured now)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}, None
    except OSError as exc:
        return {}, f"the calibration cache {path} cannot be read ({exc}): measured again"
    try:
        raw = json.loads(text)
    except ValueError as exc:
        return {}, f"the calibration cache {path} is not JSON ({_first_line(exc)}): measured again"
    if not isinstance(raw, dict):
        return (
            {},
            f"the calibration cache {path} holds no calibrations (a JSON {type(raw).__name__}): measured again",
        )
    return raw, None


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:200]
