"""Power and utilisation sampled through an epoch by a background thread.

``torch.xpu.power_draw`` and ``torch.xpu.utilization`` each measure the ~100 ms after the call (two reads of a
Level Zero Sysman counter). Called once after the epoch, when the runner has already synchronised, they would
describe an idle GPU; called back to back from a thread while the epoch runs, their mean is the epoch's. The thread
spends its time inside those calls, asleep or in ctypes (both release the GIL), so the training loop does not wait
on it. A reading that fails (pyzes missing, no permission) is dropped for the rest of the epoch, never reported as 0.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

Reading = Callable[[], float]


class EpochSampler:
    """Calls each reading repeatedly from :meth:`start` until :meth:`stop`, and returns their means."""

    def __init__(self, readings: dict[str, Reading]) -> None:
        self._readings = dict(readings)
        self._sums: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="accelbench-xpu-sampler", daemon=True)

    def start(self) -> EpochSampler:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 1.0) -> dict[str, float]:
        """End sampling; the mean of each reading that succeeded at least once, and how many rounds ran."""
        self._stop.set()
        self._thread.join(timeout_s)  # a reading in flight finishes within ~100 ms; never wait on a hung one
        with self._lock:
            means = {key: self._sums[key] / self._counts[key] for key in self._sums}
            if means:
                means["telemetry_samples"] = float(max(self._counts.values()))
            return means

    def _run(self) -> None:
        while not self._stop.is_set() and self._readings:
            for key, read in list(self._readings.items()):
                try:
                    value = float(read())
                except Exception:  # unavailable here: stop asking for it
                    del self._readings[key]
                    continue
                with self._lock:
                    self._sums[key] = self._sums.get(key, 0.0) + value
                    self._counts[key] = self._counts.get(key, 0) + 1
                if self._stop.is_set():
                    break
