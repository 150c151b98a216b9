"""The epoch sampler on its own: means of what succeeded, failures dropped, a hung reading never waited on."""

from __future__ import annotations

import threading
import time

from accelbench_xpu.sampler import EpochSampler


def test_means_of_each_reading_and_the_rounds_taken() -> None:
    values = iter([10.0, 20.0, 30.0, 40.0] + [50.0] * 10_000)

    def power() -> float:
        time.sleep(0.01)
        return next(values)

    sampler = EpochSampler({"power_w": power, "broken": lambda: 1 / 0}).start()
    time.sleep(0.06)
    result = sampler.stop()
    assert "broken" not in result
    assert result["telemetry_samples"] >= 3 and 10.0 < result["power_w"] <= 50.0


def test_nothing_measured_is_an_empty_answer() -> None:
    assert EpochSampler({"power_w": lambda: 1 / 0}).start().stop() == {}


def test_a_hung_reading_is_not_waited_on() -> None:
    release = threading.Event()
    sampler = EpochSampler({"power_w": lambda: float(release.wait(5))}).start()
    start = time.perf_counter()
    assert sampler.stop(timeout_s=0.1) == {}
    assert time.perf_counter() - start < 1.0
    release.set()  # let the thread finish rather than linger
