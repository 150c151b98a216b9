"""accelbench-gaudi: the accelbench backend for Intel Gaudi accelerators (HPU).

The entry point is :mod:`accelbench_gaudi.plugin`; the other modules hold what it relies on, each testable without
a Gaudi: :mod:`~accelbench_gaudi.hlml` (detection, device memory, energy and telemetry through habana-pyhlml, or
``hl-smi``), :mod:`~accelbench_gaudi.modes` (lazy or eager execution, set before the bridge loads) and
:mod:`~accelbench_gaudi.peaks` (dense peak FLOP/s and bandwidth per generation).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("accelbench-gaudi")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
