"""accelbench: benchmark AI training on any accelerator, with honest numbers.

A vendor plugin subclasses :class:`accelbench.contract.Backend` and registers it (:mod:`accelbench.contract`).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("accelbench")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
