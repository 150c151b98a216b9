"""How a run ends on SIGTERM: a scheduler's time limit, a sweep's point timeout, torchrun stopping the survivors.

Before training, SIGTERM ends the process at once (exit 130, nothing measured, no record). While training, it
raises :class:`RunInterrupted` in the training loop, so the epochs measured so far are written. While the record
is being written it is ignored: a record is owed and must not be cut short.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from types import FrameType
from typing import Literal


class RunInterrupted(BaseException):  # noqa: N818 - an interruption, not an error
    """Raised by the SIGTERM handler while measuring; handled like Ctrl-C."""


Phase = Literal["starting", "measuring", "recording"]


class Termination:
    """The run's phase, read by the SIGTERM handler: one object instead of module-level flags."""

    def __init__(self) -> None:
        self.phase: Phase = "starting"
        self.signalled = (
            False  # SIGTERM arrived (a collective that fails afterwards failed as the job stopped)
        )

    def install(self) -> None:
        """Handle SIGTERM in this process according to the phase (main thread only, as signals require)."""
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.signalled = True
        if self.phase == "measuring":
            raise RunInterrupted()
        if self.phase == "starting":
            if _importing(frame):
                # an exception raised inside an import can leave a C extension half-loaded, and the importing code
                # may catch it and import again (numpy then fails, "cannot load module more than once per
                # process", with a traceback): before training there is nothing to unwind, so end here
                os._exit(130)
            raise SystemExit(130)

    @contextlib.contextmanager
    def measuring(self) -> Iterator[None]:
        """Training: SIGTERM interrupts it. Afterwards a record is owed, so SIGTERM no longer ends the process."""
        self.phase = "measuring"
        try:
            yield
        finally:
            self.phase = "recording"

    def reset(self) -> None:
        """A new run in the same process (API users, tests): before training again."""
        self.phase = "starting"
        self.signalled = False


def _importing(frame: FrameType | None) -> bool:
    """Whether the interrupted code runs inside an ``import`` (Python's import machinery is on the stack)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


TERMINATION = Termination()
