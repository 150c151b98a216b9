"""Lazy or eager execution: Habana's PyTorch bridge reads ``PT_HPU_LAZY_MODE`` once, when it is first imported.

- Lazy mode (``PT_HPU_LAZY_MODE=1``): operations accumulate into a graph that runs at ``htcore.mark_step()``; a
  training loop calls it after ``loss.backward()`` and after ``optimizer.step()``. ``torch.compile`` is not used.
- Eager mode (``PT_HPU_LAZY_MODE=0``): operations run as issued; ``torch.compile(backend="hpu_backend")`` compiles
  graphs, and ``mark_step`` is not needed.

Which is the default depends on the software release (lazy until 1.20; eager with torch.compile from 1.21), so
accelbench never relies on it: the run option ``--hpu-mode`` chooses, else the environment's value, else lazy, and
the mode is set before the bridge loads and recorded with the run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Literal

from accelbench.contract import Scalar
from accelbench.errors import BackendError

LAZY_ENV = "PT_HPU_LAZY_MODE"
BRIDGE = "habana_frameworks.torch"
Mode = Literal["lazy", "eager"]


def wanted_mode(options: Mapping[str, Scalar], env: Mapping[str, str] | None = None) -> Mode:
    """The mode a run asks for: ``--hpu-mode``, else ``PT_HPU_LAZY_MODE`` (1 lazy, 0 eager), else lazy."""
    env = os.environ if env is None else env
    if "hpu_mode" in options:
        return "eager" if str(options["hpu_mode"]) == "eager" else "lazy"
    value = env.get(LAZY_ENV, "").strip()
    if value in ("0", "1"):
        return "lazy" if value == "1" else "eager"
    if value:
        raise BackendError(
            f"{LAZY_ENV}={value!r} is neither 1 (lazy) nor 0 (eager); set one, or give --hpu-mode"
        )
    return "lazy"


def set_mode(mode: Mode) -> None:
    """Make ``mode`` the bridge's mode: set ``PT_HPU_LAZY_MODE`` before the bridge is imported. Once imported, the
    bridge keeps the mode it read; asking for another is an error that says how to get it."""
    value = "1" if mode == "lazy" else "0"
    if BRIDGE in sys.modules and os.environ.get(LAZY_ENV) != value:
        raise BackendError(
            f"--hpu-mode {mode}: Habana's bridge was already imported in this process in the other mode "
            f"({LAZY_ENV}={os.environ.get(LAZY_ENV)!r}); start a new process with {LAZY_ENV}={value}"
        )
    os.environ[LAZY_ENV] = value


def current_mode() -> Mode:
    """The mode of the bridge in this process (what ``PT_HPU_LAZY_MODE`` said when it was set)."""
    return "eager" if os.environ.get(LAZY_ENV) == "0" else "lazy"
