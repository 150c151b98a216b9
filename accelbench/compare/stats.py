"""Statistics of repeated measurements: the median and range shown for a cell, and the noise test.

A difference between two systems only means something if it is larger than the run-to-run noise. Timings are
skewed and have outliers, so the test is Mann-Whitney's rank test, which assumes no distribution.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_ALPHA = 0.05

# n1 * n2 above this: the normal approximation (exact at 20 x 20 takes 60 ms, at 50 x 50 3 s)
_EXACT_LIMIT = 400


@dataclass(frozen=True)
class Spread:
    """Median and range of repeated measurements."""

    median: float
    low: float
    high: float
    values: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def relative_half_range(self) -> float:
        """Half the range over the median: the ``±`` shown next to a median."""
        return (self.high - self.low) / 2 / self.median if self.median else 0.0

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Spread | None:
        """The spread of the finite values; None when there are none (unknown is never zero)."""
        known = tuple(float(v) for v in values if v is not None and math.isfinite(v))
        if not known:
            return None
        return cls(statistics.median(known), min(known), max(known), known)

    def as_dict(self) -> dict[str, Any]:
        return {"median": self.median, "min": self.low, "max": self.high, "n": self.n}


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of the Mann-Whitney U test: how likely a separation at least this clear is if both
    samples came from the same distribution. Makes no normality assumption, which suits timings (skewed, with
    outliers). Exact (the permutation distribution, ties given mid-ranks) for small samples; the normal
    approximation with tie correction for large ones."""
    n1, n2 = len(a), len(b)
    if not n1 or not n2:
        raise ValueError("mann_whitney_p needs two non-empty samples")
    n = n1 + n2
    # tied values share their mid-rank; twice a mid-rank is an integer, so rank sums stay exact
    ordered = sorted([*a, *b])
    ties: list[tuple[int, int]] = []  # (how many share the value, twice their mid-rank)
    twice_rank: dict[float, int] = {}
    i = 0
    while i < n:
        j = i
        while j < n and ordered[j] == ordered[i]:
            j += 1
        ties.append((j - i, i + 1 + j))
        twice_rank[ordered[i]] = i + 1 + j
        i = j
    observed = sum(twice_rank[x] for x in a)  # twice sample 1's rank sum
    centre = n1 * (n + 1)  # its expectation under the null hypothesis
    if n1 * n2 > _EXACT_LIMIT:
        correction = sum(t**3 - t for t, _ in ties) / (n * (n - 1))
        sd = math.sqrt(n1 * n2 / 12 * ((n + 1) - correction))
        if sd == 0:
            return 1.0  # every value the same: nothing separates the samples
        z = max(0.0, abs(observed - centre) / 2 - 0.5) / sd  # continuity correction
        return min(1.0, math.erfc(z / math.sqrt(2)))
    # ways[(k, s)]: ways to give k of the values seen so far to sample 1 with twice-rank-sum s
    ways: dict[tuple[int, int], int] = {(0, 0): 1}
    for count, rank2 in ties:
        step: dict[tuple[int, int], int] = {}
        for (k, total), w in ways.items():
            for c in range(min(count, n1 - k) + 1):
                state = (k + c, total + c * rank2)
                step[state] = step.get(state, 0) + w * math.comb(count, c)
        ways = step
    deviation = abs(observed - centre)
    extreme = sum(w for (k, total), w in ways.items() if k == n1 and abs(total - centre) >= deviation)
    return min(1.0, extreme / math.comb(n, n1))


def smallest_p(n1: int, n2: int) -> float:
    """The smallest p-value samples of these sizes can reach (complete separation): with 2 vs 2 measurements it
    is 1/3, so no amount of difference can be called beyond the noise."""
    return 2 / math.comb(n1 + n2, n1)


def noise_verdict(p_value: float, n1: int, n2: int, alpha: float) -> str:
    """``beyond noise``, ``within noise``, or ``too few measurements`` when these sample sizes could never reach
    ``alpha`` (so "within noise" would claim more than the data can say)."""
    if smallest_p(n1, n2) >= alpha:
        return "too few measurements"
    return "beyond noise" if p_value < alpha else "within noise"
