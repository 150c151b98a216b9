"""``accelbench estimate``: why a run would take the time and memory it takes, predicted without running it.

One module per job:

- :mod:`~accelbench.estimate.predictor`: :func:`predict` for a :class:`~accelbench.config.RunConfig` (what the runner
  stores in a record), :func:`predict_scaling`, and :func:`~accelbench.estimate.predictor.predict_step`, the
  analytical model's whole-run entry: pure arithmetic (no torch), from the modules below.
- :mod:`~accelbench.estimate.facts`: what the model needs of a workload (``WorkloadFacts``), read off a built or
  meta-device model.
- :mod:`~accelbench.estimate.shape`: the run as the formulas see it (``RunShape``) and the strategies they cover;
  :mod:`~accelbench.estimate.hardware`: what the device can do (``Hardware``, the collectives' ``Bandwidth``).
- :mod:`~accelbench.estimate.state`: bytes per parameter of each kind of state, by precision and engine;
  :mod:`~accelbench.estimate.activations`: activations kept for backward (Korthikanti et al.).
- :mod:`~accelbench.estimate.strategies`: memory per device by kind and communication per device per step by
  collective, for each strategy (data parallelism, ZeRO; tp/pp through :mod:`~accelbench.estimate.parallel`).
- :mod:`~accelbench.estimate.step_time`: compute, optimizer and communication time, and what overlap hides.
- :mod:`~accelbench.estimate.scaling`: seed 001's speedup to other device counts.
- :mod:`~accelbench.estimate.schema`: the prediction as data (``Prediction``, ``MemoryBreakdown``, ``CommOp``,
  ``ScalingPrediction``); :mod:`~accelbench.estimate.notes`: its assumptions and sources as they are collected.
- :mod:`~accelbench.estimate.parallel`: tensor and pipeline parallelism's formulas (:func:`estimate_parallel`).
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
    from accelbench.estimate.facts import WorkloadFacts
    from accelbench.estimate.predictor import predict, predict_scaling, run_shape
    from accelbench.estimate.scaling import predict_speedup
    from accelbench.estimate.schema import CommOp, MemoryBreakdown, Prediction, ScalingPrediction

_HOME = {
    "DEFAULT_EFFICIENCY": "arguments",
    "CommOp": "schema",
    "MemoryBreakdown": "schema",
    "Prediction": "schema",
    "ScalingPrediction": "schema",
    "WorkloadFacts": "facts",
    "predict_speedup": "scaling",
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
