"""One colour per thing across every figure of a report: per precision, per strategy, per system.

A reader who has learnt that bf16-mixed is green in one figure must find it green in the next; a system keeps its
colour from the overview to the last figure. Precisions and strategies have fixed colours (the same in every
report); systems get theirs in the order the comparison lists them. The colours are the Okabe-Ito set and its
neighbours, which stay apart for colour-blind readers.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Iterator, Sequence
from contextvars import ContextVar

from accelbench.contract.strategies import Strategy

# Okabe & Ito (2008), "Color Universal Design": distinguishable with every common colour-vision deficiency
_OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
_MORE = ("#7F7F7F", "#8C564B", "#17BECF", "#BCBD22", "#9467BD", "#393B79", "#637939", "#843C39")

PRECISION_COLOURS = {
    "fp32": "#0072B2",  # blue
    "fp16-mixed": "#E69F00",  # orange
    "bf16-mixed": "#009E73",  # green
    "bf16-true": "#CC79A7",  # purple
}
STRATEGY_COLOURS = {
    # the core's strategies (contract.strategies), then the IPU plugin's
    Strategy.SINGLE.value: "#7F7F7F",
    Strategy.DDP.value: "#0072B2",
    Strategy.FSDP.value: "#D55E00",
    Strategy.ZERO1.value: "#56B4E9",
    Strategy.ZERO2.value: "#009E73",
    Strategy.ZERO3.value: "#E69F00",
    Strategy.TP.value: "#CC79A7",
    Strategy.PP.value: "#8C564B",
    Strategy.MESH.value: "#000000",
    "pipelined": "#0072B2",
    "sharded": "#D55E00",
    "serial-phased": "#009E73",
    "parallel-phased": "#E69F00",
}
PHASE_COLOURS = {"epoch 1 (warm-up)": "#E69F00", "steady epochs": "#0072B2"}


class Palette:
    """The colours of one report: fixed ones for precisions, strategies and phases, and the systems' in order."""

    def __init__(self, systems: Sequence[str] = ()) -> None:
        colours = _OKABE_ITO + _MORE
        self.systems = {name: colours[i % len(colours)] for i, name in enumerate(systems)}

    def colour(self, name: str) -> str:
        """The colour of a series named ``name``: a precision, strategy, phase or system (a system label with a
        device count after it, ``vm · cpu x2``, is the system's); anything else a stable colour of its own."""
        for table in (PRECISION_COLOURS, STRATEGY_COLOURS, PHASE_COLOURS, self.systems):
            if name in table:
                return table[name]
        for system, colour in self.systems.items():
            if name.startswith(system + " x"):
                return colour
        return _MORE[zlib.crc32(name.encode()) % len(_MORE)]


_CURRENT: ContextVar[Palette | None] = ContextVar("accelbench_report_palette", default=None)


def colour(name: str) -> str:
    """The current report's colour for a series (see :meth:`Palette.colour`)."""
    return (_CURRENT.get() or Palette()).colour(name)


@contextlib.contextmanager
def using(palette: Palette) -> Iterator[Palette]:
    """Draw with ``palette`` while the block lasts (a report builds its figures inside one)."""
    token = _CURRENT.set(palette)
    try:
        yield palette
    finally:
        _CURRENT.reset(token)
