"""What a prediction assumed and where its formulas come from, collected as it is made (each line once)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Notes:
    """The assumptions a prediction made and the sources of its formulas, in order, each once."""

    assumptions: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)

    def assume(self, text: str) -> None:
        if text not in self.assumptions:
            self.assumptions.append(text)

    def cite(self, text: str) -> None:
        if text not in self.sources:
            self.sources.append(text)
