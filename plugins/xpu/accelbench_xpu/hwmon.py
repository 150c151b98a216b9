"""Energy of an Intel GPU from its kernel driver's hwmon counter, read from sysfs.

The i915 and xe drivers publish each discrete card's cumulative energy as ``hwmon*/energy1_input`` (microjoules)
under ``/sys/class/drm/cardN/device``; it is the counter Level Zero Sysman's power domains report on Linux. It
covers the whole card (both tiles of a Max 1550), so the domain is the card: ranks on two tiles of one card are
counted once. The mapping from a torch.xpu ordinal to a card is only certain when the node has one Intel card; with
several, the energy is unknown rather than guessed.
"""

from __future__ import annotations

from pathlib import Path

from accelbench.devices import CounterFile

DRM = Path("/sys/class/drm")
INTEL_VENDOR = "0x8086"


def intel_cards(root: Path = DRM) -> list[CounterFile]:
    """The Intel GPU cards whose hwmon energy counter this user can read, in card order."""
    out = []
    for card in sorted(root.glob("card[0-9]*")):
        if "-" in card.name:  # connectors (card0-DP-1), not cards
            continue
        try:
            if (card / "device" / "vendor").read_text().strip() != INTEL_VENDOR:
                continue
        except OSError:
            continue
        for energy in sorted((card / "device" / "hwmon").glob("hwmon*/energy1_input")):
            counter = CounterFile(card.name, energy)  # a 64-bit count of microjoules: it does not wrap
            if counter.read() is not None:
                out.append(counter)
                break
    return out


def the_counter(root: Path = DRM) -> CounterFile | None:
    """The node's one Intel card's counter; None with none, or with several (which card a rank runs on is not
    known from torch.xpu here)."""
    cards = intel_cards(root)
    return cards[0] if len(cards) == 1 else None
