"""Enums of the stand-in poptorch, with the names and members of poptorch 3.x that accelbench-ipu uses."""

from __future__ import annotations

import enum


class ReductionType(enum.IntEnum):
    Sum = 0
    Mean = 1
    NoReduction = 2


class OutputMode(enum.IntEnum):
    Final = 0
    EveryN = 1
    All = 2
    Sum = 3
    Default = 4


class AutoStage(enum.IntEnum):
    SameAsIpu = 0
    AutoIncrement = 1


class Liveness(enum.IntEnum):
    AlwaysLive = 0
    OffChipAfterFwd = 1
    OffChipAfterFwdNoOverlap = 2
    OffChipAfterEachPhase = 3


class ConnectionType(enum.IntEnum):
    Always = 0
    OnDemand = 1
    Never = 2
