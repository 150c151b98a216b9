"""Errors a user can act on. Each message says what was wrong, the value seen, and what to do instead."""


class AccelbenchError(Exception):
    """Base class: printed as a one-line error by the CLI, without a traceback."""


class ConfigError(AccelbenchError):
    """The request cannot be run as given (unknown backend, unsupported precision, bad value)."""


class BackendError(AccelbenchError):
    """A backend cannot do what was asked on this machine."""


class PluginError(AccelbenchError):
    """A plugin failed to load or register (fatal only with ACCELBENCH_STRICT_PLUGINS=1)."""


class ResultFileError(AccelbenchError):
    """A result file is malformed, foreign, or written by a newer accelbench."""
