"""IPU memory: from the compile-time graph profile, or unknown.

An IPU has no runtime allocator to query: everything a program keeps on chip is laid out by the Poplar
compiler. Its graph profile (``POPLAR_ENGINE_OPTIONS`` ``autoReport.outputGraphProfile``) records the bytes
on every tile; the Poplar SDK's ``pva`` module reads it, and summing tiles per IPU gives the
In-Processor-Memory each IPU uses. Without ``pva`` (or when the executable came from the cache, so nothing
was compiled) the figure is recorded as unknown, never estimated.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from accelbench.contract import MemoryStats

ENGINE_OPTIONS_ENV = "POPLAR_ENGINE_OPTIONS"


@dataclass(frozen=True)
class GraphMemory:
    """Per-IPU In-Processor-Memory from a graph profile, or why there is none."""

    per_ipu_bytes: tuple[int, ...] | None
    capacity_per_ipu_bytes: int | None
    source: str

    def stats(self) -> MemoryStats:
        if not self.per_ipu_bytes:
            return MemoryStats(peak_bytes=None, source=self.source, total_bytes=self.capacity_per_ipu_bytes)
        return MemoryStats(
            peak_bytes=max(self.per_ipu_bytes),
            source=self.source,
            total_bytes=self.capacity_per_ipu_bytes,
        )

    def describe(self) -> dict[str, object]:
        return {
            "source": self.source,
            "per_ipu_bytes": list(self.per_ipu_bytes) if self.per_ipu_bytes else None,
            "capacity_per_ipu_bytes": self.capacity_per_ipu_bytes,
        }


NOT_COMPILED = GraphMemory(
    None, None, "unknown: IPU memory comes from the compile-time graph profile; not compiled yet"
)


def pva_available() -> bool:
    return importlib.util.find_spec("pva") is not None


class GraphProfile:
    """Asks Poplar for a graph profile in a scratch directory while a compile runs, then reads it with pva.

    Use around the compile: ``with GraphProfile(enabled) as profile: model.compile(...)``, then
    ``profile.read()``. The user's own ``POPLAR_ENGINE_OPTIONS`` are kept (a directory they chose wins).
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.available = enabled and pva_available()
        self.directory: Path | None = None
        self._scratch: str | None = None
        self._saved: str | None = None

    def __enter__(self) -> GraphProfile:
        if not self.available:
            return self
        self._saved = os.environ.get(ENGINE_OPTIONS_ENV)
        try:
            options = json.loads(self._saved) if self._saved else {}
        except json.JSONDecodeError:
            self.available = False  # the user's value is not JSON: leave it alone
            return self
        if "autoReport.directory" not in options:
            self._scratch = tempfile.mkdtemp(prefix="accelbench-ipu-profile-")
            options["autoReport.directory"] = self._scratch
        options.setdefault("autoReport.outputGraphProfile", "true")
        self.directory = Path(options["autoReport.directory"])
        os.environ[ENGINE_OPTIONS_ENV] = json.dumps(options)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self.available:
            return
        if kind is not None and self._scratch:  # the compile failed: read() will not run to clean up
            shutil.rmtree(self._scratch, ignore_errors=True)
        if self._saved is None:
            os.environ.pop(ENGINE_OPTIONS_ENV, None)
        else:
            os.environ[ENGINE_OPTIONS_ENV] = self._saved

    def read(self, compiled: bool) -> GraphMemory:
        """The per-IPU reading of the profile just written (``compiled``: False when the cache supplied it)."""
        try:
            return self._read(compiled)
        finally:
            if self._scratch:
                shutil.rmtree(self._scratch, ignore_errors=True)

    def _read(self, compiled: bool) -> GraphMemory:
        if not self.enabled:
            return GraphMemory(None, None, "unknown: graph profile turned off (--no-ipu-graph-profile)")
        if not self.available:
            return GraphMemory(
                None,
                None,
                "unknown: IPU memory is known only from the compile-time graph profile, and the Poplar SDK's "
                "report reader (pva) is not importable",
            )
        if not compiled:
            return GraphMemory(
                None, None, "unknown: the executable came from the cache, so no graph profile was written"
            )
        found = (
            sorted(self.directory.rglob("profile.pop"), key=lambda p: p.stat().st_mtime)
            if self.directory
            else []
        )
        if not found:
            return GraphMemory(None, None, f"unknown: no graph profile (profile.pop) under {self.directory}")
        try:
            per_ipu, capacity = read_profile(found[-1])
        except Exception as exc:  # a report layout this reader does not know: say so, do not guess
            return GraphMemory(None, None, f"unknown: reading {found[-1].name} with pva failed: {exc}")
        return GraphMemory(
            per_ipu,
            capacity,
            f"compile-time graph profile (pva): In-Processor-Memory of the fullest of {len(per_ipu)} IPUs, "
            "including gaps; every IPU in the executor record",
        )


def read_profile(path: Path) -> tuple[tuple[int, ...], int | None]:
    """(bytes per IPU, capacity per IPU) from a graph profile: tile memory summed per IPU."""
    import pva

    report = pva.openReport(str(path))
    target = report.compilation.target
    tiles_per_ipu = int(target.tilesPerIpu)
    per_ipu = [0] * int(target.numIPUs)
    for tile in report.compilation.tiles:
        per_ipu[int(tile.number) // tiles_per_ipu] += int(tile.memory.total.includingGaps)
    bytes_per_tile = getattr(target, "bytesPerTile", None)
    capacity = int(bytes_per_tile) * tiles_per_ipu if bytes_per_tile else None
    return tuple(per_ipu), capacity
