"""The node's power as its BMC measures it, through IPMI's DCMI power reading (``ipmitool dcmi power reading``).

A BMC's DCMI reading is the whole node at the wall (power supplies' input: CPUs, memory, accelerators, fans), which
neither RAPL (the CPU packages) nor a device's counter sees. It is a power, not an energy counter: the instantaneous
watts and the BMC's own average over its sampling period (which the BMC chooses: often 1 s, sometimes minutes), so
it goes into an epoch's telemetry as watts, never into ``energy_j`` (no counter, no joules). Rank 0 reads it once
per epoch, while the epoch runs (:class:`NodePowerReader`). It is read where
``ipmitool`` is installed and the reading succeeds (in-band, ``/dev/ipmi0``, often root only) with the BMC's power
measurement activated; where it does not, the first failure is the last try of the run, and nothing is recorded.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
from dataclasses import dataclass

COMMAND = ("ipmitool", "dcmi", "power", "reading")
TIMEOUT_S = 10.0  # a BMC answers in well under a second; one that does not is not waited for past this
JOIN_S = 2.0  # how long an epoch's end waits for a reading still under way before leaving it out
# `ipmitool dcmi power reading` (1.8.18/1.8.19) prints, after a blank line:
#     Instantaneous power reading:                   235 Watts
#     Minimum during sampling period:                 64 Watts
#     Maximum during sampling period:                612 Watts
#     Average power reading over sample period:      218 Watts
#     IPMI timestamp:                           Thu Feb 15 08:36:01 2024
#     Sampling period:                          00000001 Seconds.
#     Power reading state is:                   activated
_WATTS = re.compile(r"^\s*(?P<label>[A-Za-z ]+?)\s*:\s*(?P<watts>\d+(?:\.\d+)?)\s+Watts\s*$", re.M)
_PERIOD = re.compile(r"^\s*Sampling period\s*:\s*(?P<n>\d+)\s+(?P<unit>Milliseconds|Seconds)\b", re.M | re.I)
_STATE = re.compile(r"^\s*Power reading state is\s*:\s*(?P<state>\w+)", re.M)


@dataclass(frozen=True)
class NodePower:
    """One DCMI power reading of this node."""

    watts: float  # instantaneous
    average_watts: float  # the BMC's average over its sampling period
    sampling_s: float | None  # that period; None where the BMC does not say

    def telemetry(self) -> dict[str, float]:
        """As an epoch's telemetry keys (``node_`` = the whole node at the wall, from its BMC)."""
        out = {"node_power_w": self.watts, "node_power_avg_w": self.average_watts}
        if self.sampling_s is not None:
            out["node_power_sampling_s"] = self.sampling_s
        return out


def parse_dcmi_power(text: str) -> NodePower | None:
    """The reading in ``ipmitool dcmi power reading``'s output; None where the BMC's power measurement is not
    activated (its figures are then zeros or stale) or the output is not such a reading."""
    state = _STATE.search(text)
    if state is None or state.group("state").lower() != "activated":
        return None
    watts = {m.group("label").lower(): float(m.group("watts")) for m in _WATTS.finditer(text)}
    now, average = (
        watts.get("instantaneous power reading"),
        watts.get("average power reading over sample period"),
    )
    if now is None or average is None:
        return None
    period = _PERIOD.search(text)
    sampling = None
    if period is not None:
        sampling = int(period.group("n")) / (1000 if period.group("unit").lower() == "milliseconds" else 1)
    return NodePower(now, average, sampling)


def read_node_power() -> NodePower | None:
    """This node's DCMI power reading through ``ipmitool``, or None (not installed, no BMC or no access to it, a
    failed or unparsable reading)."""
    if shutil.which(COMMAND[0]) is None:
        return None
    try:
        out = subprocess.run(COMMAND, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_dcmi_power(out.stdout) if out.returncode == 0 else None


class NodePowerReader:
    """The node's power read *during* each timed epoch: :meth:`begin` (as the epoch starts) asks the BMC from a
    thread, so the reading is of the node under load and the rank reading it is not held back while its peers
    start the next epoch; :meth:`end` takes it. A reading still under way then (a BMC slower than
    :data:`JOIN_S` after an epoch shorter than it) is left out, and no other is started until it ends. A failed
    reading is the run's last try: a node without a readable BMC costs one try per run, not one per epoch."""

    def __init__(self) -> None:
        self.readable = shutil.which(COMMAND[0]) is not None
        self._thread: threading.Thread | None = None
        self._result: list[NodePower | None] = []
        self._fresh = False  # the reading under way was started by this epoch's begin()

    def begin(self) -> None:
        if not self.readable or (self._thread is not None and self._thread.is_alive()):
            self._fresh = False
            return
        result: list[NodePower | None] = []
        self._result, self._fresh = result, True
        self._thread = threading.Thread(target=lambda: result.append(read_node_power()), daemon=True)
        self._thread.start()

    def end(self) -> dict[str, float]:
        """This epoch's reading as telemetry keys, or nothing."""
        thread = self._thread
        if thread is None or not self._fresh:
            return {}
        thread.join(JOIN_S)
        if thread.is_alive():
            return {}
        self._thread = None
        power = self._result[0] if self._result else None
        if power is None:
            self.readable = False
            return {}
        return power.telemetry()
