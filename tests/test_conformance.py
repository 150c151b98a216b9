"""The built-in CPU backend passes the conformance kit every backend plugin runs (accelbench.testing)."""

from __future__ import annotations

from accelbench.testing import BackendContract


class TestCpuContract(BackendContract):
    backend = "cpu"
