"""The `accelbench comm` table, in nccl-tests' layout: one line per message size, the out-of-place figures and the
in-place figures side by side (size, count, type, redop, root; time, algbw, busbw, #wrong for each variant).

A variant torch does not offer for a collective (all_reduce, broadcast and reduce work in place only; all_to_all and
send/recv out of place only) shows ``-``; a size that could not be measured says why where its time would be.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TextIO

from accelbench.comm.collectives import COLLECTIVES, VARIANTS, size_label
from accelbench.comm.records import CommMeasurement

_HEAD = f"{'size':>12} {'count':>12} {'type':>6} {'redop':>6} {'root':>5}"
_UNITS = f"{'(B)':>12} {'(elements)':>12} {'':>6} {'':>6} {'':>5}"
_VARIANT_HEAD = f"{'time':>9} {'algbw':>8} {'busbw':>8} {'#wrong':>7}"
_VARIANT_UNITS = f"{'(us)':>9} {'(GB/s)':>8} {'(GB/s)':>8} {'':>7}"
_FAILED = {"oom": "OOM", "unsupported": "unsupp.", "error": "error"}


def header_lines(op: str, dtype: str, ranks: int) -> list[str]:
    """The heading of one collective x type: what busbw means for it, and the column names."""
    collective = COLLECTIVES[op]
    factor = collective.bus_factor(ranks)
    offered = " and ".join(collective.variants)
    width = len(_VARIANT_HEAD)
    return [
        f"# {op} ({collective.torch_call}), {dtype}, {ranks} ranks: busbw = algbw x {collective.formula} = "
        f"{factor:.4g}; torch offers it {offered}",
        f"#{'':<{len(_HEAD) - 1}} {'out-of-place':^{width}} {'in-place':^{width}}",
        f"#{_HEAD[1:]} {_VARIANT_HEAD} {_VARIANT_HEAD}",
        f"#{_UNITS[1:]} {_VARIANT_UNITS} {_VARIANT_UNITS}",
    ]


def _variant_cells(m: CommMeasurement | None) -> str:
    if m is None:  # not a variant torch offers for this collective
        return f"{'-':>9} {'-':>8} {'-':>8} {'-':>7}"
    if m.status in _FAILED:
        return f"{_FAILED[m.status]:>9} {'':>8} {'':>8} {'':>7}"
    time = f"{m.time_us:9.2f}" if m.time_us is not None and m.time_us < 1e5 else f"{m.time_us or 0:9.0f}"
    algbw = f"{m.algbw_gbps:8.2f}" if m.algbw_gbps is not None else f"{'-':>8}"
    busbw = f"{m.busbw_gbps:8.2f}" if m.busbw_gbps is not None else f"{'-':>8}"
    wrong = "N/A" if m.wrong is None else str(m.wrong)
    return f"{time} {algbw} {busbw} {wrong:>7}"


def row_line(row: Sequence[CommMeasurement]) -> str:
    """One size: the measurements of its variants (as :meth:`Measuring.run` hands them over)."""
    first = row[0]
    collective = COLLECTIVES[first.op]
    by_variant = {m.variant: m for m in row}
    redop = "sum" if collective.reduces else "none"
    root = "0" if collective.rooted else "-1"
    start = f"{first.size_bytes:>12} {first.count:>12} {first.dtype:>6} {redop:>6} {root:>5}"
    return " ".join([start, *(_variant_cells(by_variant.get(v)) for v in VARIANTS)])


def in_step_line(m: CommMeasurement) -> str:
    """Under a size's row, its call's time in a step (``--in-step``) and in a burst (``--burst``) beside its time
    alone."""
    parts = [f"{t.time_us:.2f} us after {t.compute_ms:.3g} ms of compute" for t in m.in_step]
    if m.burst_us is not None:
        parts.append(f"{m.burst_us:.2f} us a call in a burst")
    alone = f" (alone {m.time_us:.2f} us)" if m.time_us is not None else ""
    label = "in step" if m.in_step else "in a burst"
    return f"#{'':>12} {label} ({m.variant}): {', '.join(parts)}{alone}"


def peak_line(measurements: Sequence[CommMeasurement]) -> str:
    """The footer of one collective x type: its highest bus bandwidth and where, and the average over sizes
    (nccl-tests' "Avg bus bandwidth")."""
    ok = [m for m in measurements if m.busbw_gbps is not None]
    if not ok:
        return "# no bus bandwidth measured"
    best = max(ok, key=lambda m: m.busbw_gbps or 0.0)
    average = sum(m.busbw_gbps or 0.0 for m in ok) / len(ok)
    return (
        f"# peak bus bandwidth: {best.busbw_gbps:.3f} GB/s at {size_label(best.size_bytes)} ({best.variant}); "
        f"average over sizes: {average:.3f} GB/s"
    )


class TablePrinter:
    """Prints the table as sizes are measured (rank 0), a heading whenever a new collective x type starts and
    its peak when it ends."""

    def __init__(self, out: TextIO, ranks: int) -> None:
        self.out, self.ranks = out, ranks
        self._section: tuple[str, str] | None = None
        self._seen: list[CommMeasurement] = []

    def intro(self, lines: Sequence[str]) -> None:
        for line in lines:
            print(f"# {line}", file=self.out, flush=True)

    def row(self, row: Sequence[CommMeasurement]) -> None:
        section = (row[0].op, row[0].dtype)
        if section != self._section:
            self.close()
            self._section = section
            print("#", file=self.out)
            for line in header_lines(*section, self.ranks):
                print(line, file=self.out)
        self._seen += row
        print(row_line(row), file=self.out, flush=True)
        timed = next((m for m in row if m.in_step or m.burst_us is not None), None)
        if timed is not None:
            print(in_step_line(timed), file=self.out, flush=True)

    def close(self) -> None:
        """End the section being printed with its peak."""
        if self._section is not None:
            print(peak_line(self._seen), file=self.out, flush=True)
        self._section, self._seen = None, []
