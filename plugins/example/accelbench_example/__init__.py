"""accelbench-example: an accelbench backend plugin. Its backend is :class:`accelbench_example.plugin.ExampleBackend`."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("accelbench-example")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
