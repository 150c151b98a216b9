"""Whether a cell's runs train as the shipped reference of their recipe does (docs/quality.md): each run's held-out
loss after every epoch against the reference's band for that epoch and, where two or more runs (seeds) are each
within, Welch's test of their final losses against the reference seeds'. One verdict, which the text formats show
beside the val loss and CSV and JSON carry as fields."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from accelbench.compare.summary import RunFigures
from accelbench.references import Reference

Verdict = Literal["within", "outside", "seeds off"]


@dataclass(frozen=True)
class Parity:
    """A cell's runs against their reference: ``outside`` when some run's loss left a band (the first epoch it
    did, over all runs), ``seeds off`` when every run is within but the test over seeds finds their mean off the
    reference's, ``within`` otherwise. ``seeds`` is how many runs the test over seeds took (0: not run, with fewer
    than two runs, a run outside, or no shipped reference by that name)."""

    verdict: Verdict
    reference: str | None
    runs: int
    runs_outside: int
    first_outside_epoch: int | None
    seeds: int
    seeds_difference: float | None  # the runs' mean final loss less the reference seeds'
    seeds_half_width: float | None  # ... and the half-width it is held to

    def text(self) -> str:
        """The mark the text formats put after the val loss."""
        if self.verdict == "outside":
            return (
                f"✗ outside ref after epoch {self.first_outside_epoch} ({self.runs_outside}/{self.runs} runs)"
            )
        if self.verdict == "seeds off":
            return f"✗ {self.seeds} seeds off ref by {self.seeds_difference:+.3f} (> {self.seeds_half_width:.3f})"
        return f"✓ ref ({self.seeds} seeds)" if self.seeds else "✓ ref"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def csv_fields(self) -> dict[str, Any]:
        """Flat fields for CSV: ``parity`` (the verdict) and ``parity_<field>`` for the others."""
        return {("parity" if k == "verdict" else f"parity_{k}"): v for k, v in asdict(self).items()}


CSV_FIELDS = tuple(Parity("within", "", 0, 0, None, 0, None, None).csv_fields())


def parity(figures: Sequence[RunFigures], references: Mapping[str, Reference]) -> Parity | None:
    """The verdict over the runs' figures that were tested against a reference (None where none was)."""
    tested = [f for f in figures if f.outside_reference is not None]
    if not tested:
        return None
    named = next((f.reference_model for f in tested if f.reference_model is not None), None)
    outside = [f for f in tested if f.outside_reference]
    if outside:
        first = min(int(f.reference_first_outside or 0) for f in outside)
        return Parity("outside", named, len(tested), len(outside), first, 0, None, None)
    finals = [
        f.reference_val_loss
        for f in tested
        if f.reference_model is not None and f.reference_val_loss is not None
    ]
    reference = references.get(named) if named is not None else None
    if len(finals) < 2 or reference is None:
        return Parity("within", named, len(tested), 0, None, 0, None, None)
    difference, half = reference.seeds_test([v for v in finals if v is not None])
    verdict: Verdict = "seeds off" if abs(difference) > half else "within"
    return Parity(verdict, named, len(tested), 0, None, len(finals), difference, half)
