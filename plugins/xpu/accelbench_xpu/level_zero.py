"""What one Intel GPU device is, and which one each local rank uses: Level Zero's environment variables.

- ``ZE_FLAT_DEVICE_HIERARCHY``: ``FLAT`` (the driver's default on current drivers) makes every tile (stack) its
  own device; ``COMPOSITE`` makes a card one device; ``COMBINED`` exposes both. A Max 1550 has two tiles.
- ``ZE_AFFINITY_MASK``: the devices this process may see (``0,1`` or ``card.tile`` such as ``0.1``). Set before
  the runtime starts, it restricts the process to those devices: the usual way to give each MPI rank its own.

The unit is recorded per device from facts, not from the variable alone: a Max 1550 tile has half the card's
64 GiB x 2 of HBM, so the memory size tells a tile from a whole card whatever the driver's default was.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

from accelbench.errors import BackendError

HIERARCHY_ENV = "ZE_FLAT_DEVICE_HIERARCHY"
AFFINITY_ENV = "ZE_AFFINITY_MASK"
GIB = 2**30


def hierarchy(environ: Mapping[str, str]) -> str:
    """The device hierarchy in force, as recorded: the variable's value, or the driver default."""
    value = environ.get(HIERARCHY_ENV)
    return value.upper() if value else "unset (driver default: FLAT on current drivers)"


def device_unit(name: str, memory_bytes: int | None) -> str:
    """What one device is: a whole card, or one tile (stack) of a two-tile card."""
    if "max 1550" in name.lower():
        if memory_bytes is None:
            return "card or tile of a Max 1550 (memory size unknown)"
        return (
            "card (both stacks of a Max 1550)"
            if memory_bytes > 96 * GIB
            else "tile (one stack of a Max 1550)"
        )
    return "card (a single-stack GPU: card and tile are the same)"


def pin_local_rank(
    environ: MutableMapping[str, str], local_rank: int, runtime_started: bool
) -> tuple[int, str]:
    """Which device index this process uses for ``local_rank``, setting ZE_AFFINITY_MASK where that is still
    possible; returns (index, what was done) for the record."""
    mask = environ.get(AFFINITY_ENV)
    if mask is not None:
        entries = [entry.strip() for entry in mask.split(",") if entry.strip()]
        if (
            len(entries) == 1
        ):  # a launcher (mpiexec's GPU pinning, a wrapper script) gave this rank one device
            return 0, f"{AFFINITY_ENV}={mask} given: this process sees one device"
        if local_rank >= len(entries):
            raise BackendError(
                f"local rank {local_rank} needs device {local_rank}, but {AFFINITY_ENV}={mask!r} exposes "
                f"{len(entries)}; start at most {len(entries)} processes per node or widen {AFFINITY_ENV}"
            )
        return local_rank, f"{AFFINITY_ENV}={mask} given: local rank {local_rank} uses its entry {local_rank}"
    if runtime_started:  # too late for the mask to take effect in this process
        return (
            local_rank,
            f"{AFFINITY_ENV} unset and the runtime already started: device {local_rank} by index",
        )
    environ[AFFINITY_ENV] = str(local_rank)
    return 0, f"{AFFINITY_ENV}={local_rank} set by accelbench-xpu for local rank {local_rank}"
