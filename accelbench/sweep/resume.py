"""What is already recorded, and when a point is done.

The result records in the output folder are the sweep's only memory: no state file can disagree with them, a
record copied in from elsewhere counts, and re-running the same command resumes. A point is done when it has
``repeats`` ``ok`` records or an ``oom`` record (:func:`point_done`); in a largest-fit search, the first size
that does not fit also settles the larger ones (:class:`LargestFit`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelbench.config import RunConfig
from accelbench.errors import ResultFileError

if TYPE_CHECKING:
    from accelbench.results import ResultRecord
    from accelbench.sweep.spec import Point

# fields that say how a run was launched, not what it measured: a record matches a point whatever they were
NOT_IDENTITY = {"output_dir", "backend_options", "node_rank", "rdzv_endpoint", "collective_timeout"}


def same_point(point: RunConfig, recorded: RunConfig) -> bool:
    """Whether a record is a run of this point: every option that defines the measurement is equal (plugin
    options only where the point sets them: a record also holds the defaults of every plugin installed)."""
    fields = set(RunConfig.model_fields) - NOT_IDENTITY
    if point.model_dump(include=fields) != recorded.model_dump(include=fields):
        return False
    return all(recorded.backend_options.get(k) == v for k, v in point.backend_options.items())


def point_done(outcomes: Sequence[str], repeats: int) -> bool:
    """Done: it ran out of memory or its training diverged (outcomes, the same every time with the same seed), or
    it has ``repeats`` successful runs."""
    return "oom" in outcomes or "diverged" in outcomes or outcomes.count("ok") >= repeats


@dataclass
class Recorded:
    """The records of a sweep's output folder: configuration, outcome and file."""

    entries: list[tuple[RunConfig, str, Path]] = field(default_factory=list)

    @classmethod
    def scan(cls, folder: Path) -> Recorded:
        from accelbench.results import read_record

        found = cls()
        if folder.is_dir():
            for path in sorted(folder.glob("*.json")):
                found.add_file(path, read_record)
        return found

    def add_file(self, path: Path, read: Callable[[Path], ResultRecord] | None = None) -> str | None:
        """Add one record file; returns its outcome status, or None if it is not a readable record."""
        if read is None:
            from accelbench.results import read_record

            read = read_record
        try:
            record = read(path)
        except ResultFileError:
            return None  # not ours to judge here; `accelbench compare` reports such files
        self.entries.append((record.config, record.outcome.status, path))
        return record.outcome.status

    def outcomes(self, config: RunConfig) -> list[str]:
        """The outcome of every recorded run of this configuration, in file order."""
        return [status for recorded, status, _ in self.entries if same_point(config, recorded)]


@dataclass
class LargestFit:
    """The largest-fit searches that found a size that does not fit: their larger sizes are not run."""

    stopped: set[tuple[Any, ...]] = field(default_factory=set)

    def beyond(self, point: Point) -> bool:
        """Whether ``point`` is larger than a size of its search that did not fit."""
        return point.series is not None and point.series in self.stopped

    def did_not_fit(self, point: Point) -> None:
        """``point`` ran out of memory (or was killed, most likely by the host's out-of-memory killer)."""
        if point.series is not None:
            self.stopped.add(point.series)
