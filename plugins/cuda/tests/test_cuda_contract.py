"""accelbench-cuda against the conformance kit every backend runs (accelbench.testing)."""

from __future__ import annotations

from accelbench.testing import BackendContract


class TestCudaContract(BackendContract):
    backend = "cuda"
