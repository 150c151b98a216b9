"""The analytical model's prediction for a run's own configuration, stored in its record beside what was measured.

The runner reads the workload's facts off the job it built (:func:`accelbench.estimate.facts.facts_of`, before an
executor wraps or shards the model), the memory the backend's reading already counts before the model exists (a
CPU's resident set holds the interpreter and its libraries; a GPU allocator's peak holds nothing yet), the peak it
reports MFU against, and, with ``--comm-records``, the collectives' bus bandwidth measured by ``accelbench comm``;
:func:`predict_run` turns them into a :class:`~accelbench.results.RunPrediction` with the same functions
``accelbench estimate`` calls. The prediction never fails a run: what it cannot predict it says in ``note``.

The peak it is against is the one MFU is against: :func:`accelbench.engine.metrics.peak_for`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accelbench.errors import AccelbenchError, ConfigError
from accelbench.results import RunPrediction

if TYPE_CHECKING:
    from accelbench.config import RunConfig
    from accelbench.contract import DeviceInfo, PeakFigures
    from accelbench.estimate.facts import WorkloadFacts
    from accelbench.estimate.hardware import Bandwidth


def load_comm_records(config: RunConfig) -> Bandwidth | None:
    """The bus bandwidth in ``--comm-records``, or None without; a ConfigError naming the flag when unreadable."""
    if config.comm_records is None:
        return None
    from accelbench.estimate.comm import load_bus_bandwidth

    try:
        return load_bus_bandwidth([config.comm_records])
    except ConfigError as exc:
        text = str(exc).replace("--comm ", "--comm-records ", 1).replace("--comm:", "--comm-records:", 1)
        raise ConfigError(text) from None


def predict_run(
    config: RunConfig,
    facts: WorkloadFacts | None,
    *,
    device_type: str,
    device: DeviceInfo | None,
    peak: PeakFigures | None,
    runtime_bytes: float | None,
) -> RunPrediction:
    """The prediction for ``config`` as it ran: ``estimate``'s, on the facts of the built model."""
    if facts is None:
        return RunPrediction.absent("the model was never built")
    from accelbench.estimate.predictor import predict

    try:
        bandwidth = load_comm_records(config)
        p = predict(
            config,
            facts,
            device_type=device_type,
            device=device,
            peak=peak,
            bandwidth=bandwidth,
            runtime_bytes=runtime_bytes or 0.0,
        )
    except (AccelbenchError, ValueError, ZeroDivisionError) as exc:
        return RunPrediction.absent(str(exc))
    source = f"accelbench comm records in {config.comm_records}" if bandwidth is not None else None
    return RunPrediction.from_prediction(p, bandwidth_source=source)
