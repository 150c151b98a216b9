"""accelbench-gaudi against the conformance kit every backend runs (accelbench.testing). Without a Gaudi, the kit
lists what it could not prove here; the stand-in tests (test_gaudi_backend.py) prove the rules that do not need one."""

from __future__ import annotations

from accelbench.testing import BackendContract


class TestGaudiContract(BackendContract):
    backend = "gaudi"
    run_precision = "bf16-mixed"
