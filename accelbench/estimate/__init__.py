"""``accelbench estimate``: why a run would take the time and memory it takes, predicted without running it.

One module per job:

- :mod:`~accelbench.estimate.model`: the analytical model, pure arithmetic (no torch): memory per device by kind
  and strategy, communication per device per step by collective, FLOPs, step time, and seed 001's scaling.
- :mod:`~accelbench.estimate.facts`: what the model needs of a workload, read off a built or meta-device model.
- :mod:`~accelbench.estimate.predictor`: :func:`predict` for a :class:`~accelbench.config.RunConfig` (what the runner
  stores in a record) and :func:`predict_scaling`.
- :mod:`~accelbench.estimate.comm`: bus bandwidth by collective and message size, from comm records.
- :mod:`~accelbench.estimate.peak`: :func:`measured_peak`, dense matmuls timed on the device, cached.
- :mod:`~accelbench.estimate.catalog`: devices by name from the plugins' peak tables (``--device H100``).
- :mod:`~accelbench.estimate.arguments` and :mod:`~accelbench.estimate.command`: the command line.

Importing this package imports no torch, and the names below load their modules only when first used (the
command line's parser imports :mod:`~accelbench.estimate.arguments` alone).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from accelbench.estimate.arguments import DEFAULT_EFFICIENCY
    from accelbench.estimate.model import (
        CommOp,
        MemoryBreakdown,
        Prediction,
        ScalingPrediction,
        WorkloadFacts,
        predict_speedup,
    )
    from accelbench.estimate.predictor import predict, predict_scaling, run_shape

_HOME = {
    "DEFAULT_EFFICIENCY": "arguments",
    "CommOp": "model",
    "MemoryBreakdown": "model",
    "Prediction": "model",
    "ScalingPrediction": "model",
    "WorkloadFacts": "model",
    "predict_speedup": "model",
    "run_shape": "predictor",
    "predict": "predictor",
    "predict_scaling": "predictor",
}

__all__ = [
    "DEFAULT_EFFICIENCY",
    "CommOp",
    "MemoryBreakdown",
    "Prediction",
    "ScalingPrediction",
    "WorkloadFacts",
    "run_shape",
    "predict",
    "predict_scaling",
    "predict_speedup",
]


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(import_module(f"accelbench.estimate.{_HOME[name]}"), name)
    raise AttributeError(f"module 'accelbench.estimate' has no attribute {name!r}")
