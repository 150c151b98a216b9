"""Bus bandwidth by collective, element type and message size, from ``accelbench comm`` records: what the
collectives' times are computed from.

:func:`accelbench.estimate.predictor.predict_step` needs one method, ``lookup(op, ranks, message_bytes, dtype)`` -> (bus
bandwidth in bytes/s, where it comes from). :class:`BusBandwidth` answers it from measured samples:

- the same collective and element type over the same number of ranks, interpolated log-log between the two
  message sizes around the one asked for (clamped to the smallest or largest measured, which it says);
- otherwise the nearest number of ranks measured (said so), another element type of the same collective (said
  so), then a sibling collective (an all-gather for a reduce-scatter and back: the same ring moves the same bus
  bytes; an all-reduce for a reduce or a broadcast), and as a last resort any measured collective (said so).

:func:`load_bus_bandwidth` reads comm records (schema ``accelbench.comm``, written by ``accelbench comm``) through
:func:`accelbench.comm.records.read_comm_record`: the measurements whose status is ``ok``, their ``busbw_gbps``
(nccl-tests' bus bandwidth: sizes are the whole array; busbw = algbw x 2(n-1)/n for all_reduce, (n-1)/n for
all_gather, reduce_scatter and all_to_all, 1 for broadcast, reduce and sendrecv). Out-of-place measurements are
used where a size has both variants (what the training strategies run).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field

from accelbench.comm.records import comm_record_in, read_comm_record
from accelbench.errors import ConfigError, ResultFileError
from accelbench.estimate.hardware import Bandwidth

SIBLINGS = {
    "reduce_scatter": ("all_gather",),
    "all_gather": ("reduce_scatter",),
    "reduce": ("all_reduce",),
    "broadcast": ("all_reduce", "all_gather"),
    "sendrecv": ("broadcast",),
    "all_to_all": ("all_gather",),
}


class _Sample(BaseModel):
    """One measured point of a collective in ``dtype`` over ``world_size`` ranks on ``size_bytes`` (the whole
    array), from ``source``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    op: str
    dtype: str = "fp32"
    world_size: int = Field(ge=1)
    size_bytes: float = Field(gt=0)
    source: str = ""


class BandwidthSample(_Sample):
    """The bus bandwidth of a collective timed alone."""

    busbw_bytes_per_s: float = Field(gt=0)


class InStepSample(_Sample):
    """One collective's time after ``compute_s`` of compute on every rank (``accelbench comm --in-step``)."""

    compute_s: float = Field(gt=0)
    time_s: float = Field(ge=0)
    asked_s: float | None = Field(
        default=None,
        gt=0,
        description="The compute asked for (--in-step), which records measured alike share.",
    )


class BurstSample(_Sample):
    """A call's time within a burst of ``calls`` issued back to back (``accelbench comm --burst``)."""

    calls: int = Field(ge=2)
    time_s: float = Field(ge=0)


Sample = TypeVar("Sample", bound=_Sample)


class BusBandwidth(Bandwidth):
    """Measured bus bandwidth (see the module's docstring for how a lookup is answered), and the collectives'
    times in a step where they were measured so."""

    def __init__(
        self,
        samples: Iterable[BandwidthSample],
        in_step: Iterable[InStepSample] = (),
        bursts: Iterable[BurstSample] = (),
    ) -> None:
        self.samples = list(samples)
        self.in_step = list(in_step)
        self.bursts = list(bursts)

    def lookup_in_step(
        self, op: str, ranks: int, message_bytes: float, dtype: str, compute_s: float
    ) -> tuple[float, str] | None:
        """A call's time after ``compute_s`` of compute: the same collective (else a sibling) and type (else
        another), the nearest number of ranks; at each measured size, log-linear between the two compute lengths
        around ``compute_s`` (the nearest outside them), then log-log between the sizes around the message (the
        nearest outside them)."""
        candidates = [c for c in self._candidates(op) if not c[1] or c[0] in SIBLINGS.get(op, ())]
        found = _select(self.in_step, candidates, ranks, message_bytes, dtype)
        if found is None:
            return None
        points, head, tail = found
        sizes = sorted({s.size_bytes for s in points})
        at_size = {
            size: _along(_pooled([s for s in points if s.size_bytes == size]), compute_s, log_value=False)
            for size in sizes
        }
        seconds = _along(sorted(at_size.items()), message_bytes, log_value=True)
        lengths = sorted({s.compute_s for s in points})
        records = len({s.source for s in points})
        pooled = f", the mean of {records} records" if records > 1 else ""
        return seconds, (
            f"{head} after {compute_s * 1e3:.3g} ms of compute: {seconds * 1e3:.3g} ms a call (measured after "
            f"{lengths[0] * 1e3:.3g} to {lengths[-1] * 1e3:.3g} ms, at {_size(sizes[0])} to {_size(sizes[-1])}"
            f"{pooled}){tail}"
        )

    def lookup_burst(self, op: str, ranks: int, message_bytes: float, dtype: str) -> tuple[float, str] | None:
        """A call's time within a burst: the same collective (else a sibling) and type (else another), the nearest
        number of ranks, log-log between the sizes around the message (the nearest outside them)."""
        candidates = [c for c in self._candidates(op) if not c[1] or c[0] in SIBLINGS.get(op, ())]
        found = _select(self.bursts, candidates, ranks, message_bytes, dtype)
        if found is None:
            return None
        points, head, tail = found
        seconds = _along([(s.size_bytes, s.time_s) for s in points], message_bytes, log_value=True)
        calls = sorted({s.calls for s in points})
        return seconds, (
            f"{head}: {seconds * 1e3:.3g} ms a call in a burst (measured in bursts of "
            f"{', '.join(str(c) for c in calls)} calls, at {_size(points[0].size_bytes)} to "
            f"{_size(points[-1].size_bytes)}){tail}"
        )

    @classmethod
    def constant(cls, bytes_per_s: float, source: str) -> BusBandwidth:
        """One figure for every collective, type and size (``--bus-bandwidth``)."""
        return _Constant(bytes_per_s, source)

    def lookup(self, op: str, ranks: int, message_bytes: float, dtype: str) -> tuple[float, str] | None:
        found = _select(self.samples, self._candidates(op), ranks, message_bytes, dtype)
        if found is None:
            return None
        points, head, tail = found
        busbw, where = _interpolate(points, message_bytes)
        return busbw, f"{head}: {where}{tail}"

    def _candidates(self, op: str) -> list[tuple[str, str]]:
        out = [(op, "")]
        out += [(s, f"no {op} measured: its sibling {s}") for s in SIBLINGS.get(op, ())]
        others = sorted({s.op for s in self.samples} - {c for c, _ in out})
        out += [(o, f"no {op} or its siblings measured: {o} stands in") for o in others]
        return out


def _select(
    samples: Sequence[Sample],
    candidates: Sequence[tuple[str, str]],
    ranks: int,
    message_bytes: float,
    dtype: str,
) -> tuple[list[Sample], str, str] | None:
    """The samples a lookup reads: the first candidate collective measured, in ``dtype`` (else the first type
    measured), over the number of ranks nearest ``ranks``, by size; with the head of the text that says so and its
    tail (what stands in for what was asked, and the records it comes from). None when no candidate was measured."""
    for candidate, note in candidates:
        mine = [s for s in samples if s.op == candidate]
        if not mine:
            continue
        same_type = any(s.dtype == dtype for s in mine)
        kind = dtype if same_type else sorted({s.dtype for s in mine})[0]
        typed = [s for s in mine if s.dtype == kind]
        world = min({s.world_size for s in typed}, key=lambda w: (abs(math.log(w / ranks)), -w))
        points = sorted((s for s in typed if s.world_size == world), key=lambda s: s.size_bytes)
        tail = f" (none measured over {ranks} ranks)" if world != ranks else ""
        tail += "" if same_type else f" (no {dtype} measured)"
        tail += f" ({note})" if note else ""
        origins = sorted({s.source for s in points if s.source})
        tail += f"; from {', '.join(origins)}" if origins else ""
        return points, f"{candidate} {kind} over {world} ranks at {_size(message_bytes)}", tail
    return None


class _Constant(BusBandwidth):
    def __init__(self, bytes_per_s: float, source: str) -> None:
        super().__init__([])
        self.bytes_per_s = bytes_per_s
        self.source = source

    def lookup(self, op: str, ranks: int, message_bytes: float, dtype: str) -> tuple[float, str] | None:
        return self.bytes_per_s, self.source


def _interpolate(points: Sequence[BandwidthSample], size: float) -> tuple[float, str]:
    """Bus bandwidth at ``size``: log-log between the measured sizes around it, the nearest end outside them."""
    if size <= points[0].size_bytes:
        clamp = " (below the smallest size measured)" if size < points[0].size_bytes else ""
        return points[0].busbw_bytes_per_s, f"{_gbps(points[0].busbw_bytes_per_s)}{clamp}"
    if size >= points[-1].size_bytes:
        clamp = " (above the largest size measured)" if size > points[-1].size_bytes else ""
        return points[-1].busbw_bytes_per_s, f"{_gbps(points[-1].busbw_bytes_per_s)}{clamp}"
    for low, high in zip(points, points[1:], strict=False):
        if low.size_bytes <= size <= high.size_bytes:
            t = math.log(size / low.size_bytes) / math.log(high.size_bytes / low.size_bytes)
            value = math.exp(
                math.log(low.busbw_bytes_per_s) + t * math.log(high.busbw_bytes_per_s / low.busbw_bytes_per_s)
            )
            return (
                value,
                f"{_gbps(value)}, between {_size(low.size_bytes)} and {_size(high.size_bytes)} measured",
            )
    raise AssertionError("unreachable: the size lies between two measured sizes")


def _pooled(points: Sequence[InStepSample]) -> list[tuple[float, float]]:
    """One size's (compute, time) points, those measured after the same compute asked for (``--in-step``, in
    several records of the host: moments apart, the same call's time in a step moves by tens of percent on a
    shared host) merged into one: their mean compute and mean time. Points without the length asked stand alone."""
    groups: dict[float, list[InStepSample]] = {}
    for sample in points:
        groups.setdefault(sample.asked_s or sample.compute_s, []).append(sample)
    return sorted(
        (sum(s.compute_s for s in group) / len(group), sum(s.time_s for s in group) / len(group))
        for group in groups.values()
    )


def _along(points: Sequence[tuple[float, float]], x: float, log_value: bool) -> float:
    """The value at ``x`` of measured (x, value) ``points``: linear in log(x) between the two around it (in log
    value too where ``log_value``), the nearest end's value outside them; several values at one x, their mean."""
    merged: dict[float, list[float]] = {}
    for at, value in points:
        merged.setdefault(at, []).append(value)
    curve = sorted((at, sum(values) / len(values)) for at, values in merged.items())
    if x <= curve[0][0]:
        return curve[0][1]
    if x >= curve[-1][0]:
        return curve[-1][1]
    for (x0, y0), (x1, y1) in zip(curve, curve[1:], strict=False):
        if x0 <= x <= x1:
            t = math.log(x / x0) / math.log(x1 / x0)
            if log_value and y0 > 0 and y1 > 0:
                return math.exp(math.log(y0) + t * math.log(y1 / y0))
            return y0 + t * (y1 - y0)
    raise AssertionError("unreachable: x lies between two measured points")


def _gbps(value: float) -> str:
    return f"{value / 1e9:.3g} GB/s"


def _size(value: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


def load_bus_bandwidth(paths: Sequence[Path]) -> BusBandwidth:
    """The bandwidth samples of every comm record in ``paths``: files (each must be a comm record), or folders
    (whose ``*.json`` comm records are read; other records there are skipped)."""
    samples: list[BandwidthSample] = []
    in_step: list[InStepSample] = []
    bursts: list[BurstSample] = []
    for path in paths:
        path = Path(path)
        try:
            if path.is_dir():
                records = [
                    (f, r) for f in sorted(path.glob("*.json")) if (r := comm_record_in(f)) is not None
                ]
            elif path.is_file():
                records = [(path, read_comm_record(path))]
            else:
                raise ConfigError(f"--comm {path}: no such file or folder")
        except ResultFileError as exc:
            raise ConfigError(f"--comm: {exc}") from None
        for file, record in records:
            label = f"accelbench comm, {record.backend.info.name}, {file.name}"
            chosen: dict[tuple[str, str, int], BandwidthSample] = {}
            for m in record.measurements:
                if m.status != "ok" or not m.busbw_gbps:
                    continue
                key = (m.op, m.dtype, m.size_bytes)
                if key in chosen and m.variant != "out-of-place":
                    continue  # the out-of-place figure stands where both were measured
                chosen[key] = BandwidthSample(
                    op=m.op,
                    dtype=m.dtype,
                    world_size=record.world_size,
                    size_bytes=m.size_bytes,
                    busbw_bytes_per_s=m.busbw_gbps * 1e9,
                    source=label,
                )
                asked = record.config.in_step_ms if len(record.config.in_step_ms) == len(m.in_step) else []
                in_step += [
                    InStepSample(op=m.op, dtype=m.dtype, world_size=record.world_size, size_bytes=m.size_bytes,
                                 compute_s=t.compute_ms * 1e-3, time_s=t.time_us * 1e-6, source=label,
                                 asked_s=asked[j] * 1e-3 if asked else None)
                    for j, t in enumerate(m.in_step)
                ]  # fmt: skip
                if m.burst_us is not None and record.config.burst >= 2:
                    bursts.append(
                        BurstSample(op=m.op, dtype=m.dtype, world_size=record.world_size, size_bytes=m.size_bytes,
                                    calls=record.config.burst, time_s=m.burst_us * 1e-6, source=label)
                    )  # fmt: skip
            samples += chosen.values()
    if not samples:
        where = ", ".join(str(p) for p in paths)
        raise ConfigError(
            f"--comm {where}: no bandwidth measured there (comm records of schema 'accelbench.comm' with ok "
            "measurements: run `accelbench comm --devices N` on the system predicted for)"
        )
    return BusBandwidth(samples, in_step, bursts)
