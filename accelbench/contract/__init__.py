"""The accelbench plugin contract, version 3.0: everything a backend or workload plugin sees, in one place.

- :class:`Backend`: the base class a vendor subclasses (stock PyTorch behaviour in every method);
- the records a backend returns (:class:`BackendInfo`, :class:`DeviceInfo`, :class:`EpochReadings`, ...);
- :class:`Strategy` (the strategies the core builds), :class:`PrecisionPlan`, :class:`RunOption`, and the executor interface (:class:`Executor`,
  :class:`ExecutorRequest`, :class:`World`) for backends that build their own executor;
- the registration hooks (:mod:`accelbench.contract.hookspecs`), :data:`hookimpl` and :data:`CONTRACT_VERSION`.

Nothing in this package imports the engine, the plugin host or the command line. docs/writing-a-backend-plugin.md
documents every method with its types.
"""

from typing import TYPE_CHECKING

from accelbench.contract.backend import COLLECTIVE_DTYPES, Backend, OptimizerImplementation
from accelbench.contract.executor import DataShard, Executor, ExecutorRequest, World
from accelbench.contract.markers import CONTRACT_VERSION, PROJECT, hookimpl, hookspec
from accelbench.contract.options import RunOption, Scalar
from accelbench.contract.precision import (
    FP8_PRECISIONS,
    FP8_REQUIREMENT,
    MX_PRECISIONS,
    MX_REQUIREMENT,
    MXFP8_RECIPE,
    PRECISIONS,
    Float8Layers,
    MXScaling,
    PrecisionPlan,
    standard_plan,
)
from accelbench.contract.records import (
    NO_COLLECTIVE,
    BackendInfo,
    DeviceInfo,
    EnergyReading,
    EpochReadings,
    MemoryStats,
    NoCollective,
    PeakFigures,
    allocator_memory,
)
from accelbench.contract.strategies import STRATEGIES, Strategy, strategy_of

if (
    TYPE_CHECKING
):  # what Backend.check_run is given, for a plugin's annotation (the configuration imports this package)
    from accelbench.config import RunConfig as RunConfig

__all__ = [
    "COLLECTIVE_DTYPES",
    "CONTRACT_VERSION",
    "NO_COLLECTIVE",
    "FP8_PRECISIONS",
    "FP8_REQUIREMENT",
    "Float8Layers",
    "MX_PRECISIONS",
    "MX_REQUIREMENT",
    "MXFP8_RECIPE",
    "MXScaling",
    "PRECISIONS",
    "PROJECT",
    "STRATEGIES",
    "Strategy",
    "Backend",
    "BackendInfo",
    "DataShard",
    "DeviceInfo",
    "EnergyReading",
    "EpochReadings",
    "Executor",
    "ExecutorRequest",
    "MemoryStats",
    "NoCollective",
    "OptimizerImplementation",
    "PeakFigures",
    "PrecisionPlan",
    "RunOption",
    "Scalar",
    "World",
    "allocator_memory",
    "hookimpl",
    "hookspec",
    "standard_plan",
    "strategy_of",
]
