"""Exit codes of every `accelbench` command (and of each sweep point's `accelbench run`)."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    ERROR = 1  # the run failed (its record says why), or some sweep point could not be done
    REFUSED = (
        2  # refused before anything ran: bad input, unknown backend, unsupported precision; nothing written
    )
    OOM = 3  # out of memory (record written)
    DIVERGED = (
        4  # training diverged: a loss not finite, a gradient norm exploding or a loss not falling (record written;
        # its speed is no valid result)
    )
    INTERRUPTED = 130  # Ctrl-C or SIGTERM (record written with the completed epochs)
    CLOSED_PIPE = (
        141  # the output's reader went away (as a program killed by SIGPIPE); nothing else is affected
    )

    @classmethod
    def of_status(cls, status: str) -> ExitCode:
        """The exit code of a run that ended with record status ``status``."""
        return {
            "ok": cls.OK,
            "error": cls.ERROR,
            "oom": cls.OOM,
            "interrupted": cls.INTERRUPTED,
            "diverged": cls.DIVERGED,
        }[status]
