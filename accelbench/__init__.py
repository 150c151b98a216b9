"""accelbench: benchmark AI training on any accelerator, with honest numbers.

A vendor plugin imports :data:`hookimpl` and implements hooks from :mod:`accelbench.hookspecs`.
"""

from importlib.metadata import PackageNotFoundError, version

import pluggy

PROJECT = "accelbench"
# The plugin contract (accelbench.hookspecs) this accelbench implements. A plugin declares the version it was written
# for (``accelbench_contract = "2.1"``); the same major version and a minor version not newer than this one load.
# 2.1 added the optional ``accelbench_known_devices`` (the devices a peak table knows, for ``accelbench estimate``).
CONTRACT_VERSION = "2.1"
hookimpl = pluggy.HookimplMarker(PROJECT)
hookspec = pluggy.HookspecMarker(PROJECT)

try:
    __version__ = version("accelbench")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["CONTRACT_VERSION", "PROJECT", "__version__", "hookimpl", "hookspec"]
