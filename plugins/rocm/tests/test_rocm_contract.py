"""accelbench-rocm against the conformance kit every backend runs (accelbench.testing)."""

from __future__ import annotations

from accelbench.testing import BackendContract


class TestRocmContract(BackendContract):
    backend = "rocm"
