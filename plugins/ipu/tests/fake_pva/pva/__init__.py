"""A stand-in for the Poplar SDK's ``pva`` report reader (libpva), reading the graph profiles the stand-in
poptorch writes. It offers the attributes accelbench-ipu reads from a real report:
``openReport(path).compilation.target.{numIPUs, tilesPerIpu, bytesPerTile}`` and
``compilation.tiles[i].{number, memory.total.includingGaps}``."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

__accelbench_stand_in__ = True


def openReport(path: str) -> SimpleNamespace:  # noqa: N802 - libpva's name
    data = json.loads(Path(path).read_text())
    target = SimpleNamespace(
        numIPUs=data["numIPUs"], tilesPerIpu=data["tilesPerIpu"], bytesPerTile=data["bytesPerTile"]
    )
    tiles = [
        SimpleNamespace(
            number=i, memory=SimpleNamespace(total=SimpleNamespace(includingGaps=b, excludingGaps=b))
        )
        for i, b in enumerate(data["tiles"])
    ]
    return SimpleNamespace(compilation=SimpleNamespace(target=target, tiles=tiles))
