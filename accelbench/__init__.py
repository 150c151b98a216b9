"""accelbench: benchmark AI training on any accelerator, with honest numbers.

A vendor plugin imports :data:`hookimpl` and implements hooks from :mod:`accelbench.hookspecs`.
"""

from importlib.metadata import PackageNotFoundError, version

import pluggy

PROJECT = "accelbench"
hookimpl = pluggy.HookimplMarker(PROJECT)
hookspec = pluggy.HookspecMarker(PROJECT)

try:
    __version__ = version("accelbench")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["PROJECT", "__version__", "hookimpl", "hookspec"]
