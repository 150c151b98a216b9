"""accelbench-xla: the accelbench backend for PyTorch/XLA devices (Google TPUs, and XLA's CPU device for testing).

The entry point is :mod:`accelbench_xla.plugin`; :mod:`~accelbench_xla.peaks` holds the TPU peak table.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("accelbench-xla")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
