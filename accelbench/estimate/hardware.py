"""What the device can do, as far as known: :class:`Hardware` (memory, peak FLOP/s, memory bandwidth) and the
collectives' :class:`Bandwidth`, which communication times are read from."""

from __future__ import annotations

from dataclasses import dataclass


class Bandwidth:
    """Bus bandwidth by collective, group size and message size: what
    :func:`~accelbench.estimate.predictor.predict_step` divides bus bytes by.
    :class:`accelbench.estimate.comm.BusBandwidth` reads it from comm records; a test may give any object with
    this method."""

    def lookup(self, op: str, ranks: int, message_bytes: float, dtype: str) -> tuple[float, str] | None:
        """(bytes/s, where the figure comes from), or None when nothing is known for ``op``."""
        raise NotImplementedError

    def lookup_in_step(
        self, op: str, ranks: int, message_bytes: float, dtype: str, compute_s: float
    ) -> tuple[float, str] | None:
        """(seconds a call takes when it follows ``compute_s`` of compute on every rank, where the figure comes
        from), or None when no such time was measured (``accelbench comm --in-step``)."""
        return None

    def lookup_burst(self, op: str, ranks: int, message_bytes: float, dtype: str) -> tuple[float, str] | None:
        """(seconds a call takes within a burst of calls issued back to back, where the figure comes from), or
        None when no burst was measured (``accelbench comm --burst N``)."""
        return None


@dataclass(frozen=True)
class Hardware:
    """What the device can do, as far as known: a name, memory, peak FLOP/s (vendor table, measured, or given),
    memory bandwidth, the collectives' bandwidth, and its device type (which attention kernel runs, whether
    collectives can overlap compute)."""

    name: str
    device_type: str
    memory_bytes: int | None = None
    peak_flops_per_s: float | None = None
    peak_source: str | None = None
    memory_bandwidth_bytes_per_s: float | None = None
    bandwidth: Bandwidth | None = None
    devices_per_node: int = 1
