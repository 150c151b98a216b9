"""The core's conformance kit (accelbench.testing) run against this plugin, with the stand-in poptorch (or
the real one on the IPU Model) providing the "device"."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
from ipu_helpers import FAKE_POPTORCH, REAL_POPTORCH

from accelbench.contract import Backend
from accelbench.testing import BackendContract


@pytest.fixture(scope="module", autouse=True)
def poptorch_for_the_contract() -> Iterator[None]:
    """Module scope: the contract's class-scoped fixtures detect devices before per-test fixtures run."""
    with pytest.MonkeyPatch.context() as patch:
        if REAL_POPTORCH:
            patch.setenv("POPTORCH_IPU_MODEL", "1")
        else:
            patch.syspath_prepend(str(FAKE_POPTORCH))
            patch.setenv(
                "PYTHONPATH",
                os.pathsep.join(filter(None, [str(FAKE_POPTORCH), os.environ.get("PYTHONPATH")])),
            )
        patch.setenv("ACCELBENCH_PLUGINS", "cpu,ipu")
        yield


class TestIpuContract(BackendContract):
    backend = "ipu"

    def test_device_binds_to_the_declared_type(
        self, contract_backend: Backend, contract_device: torch.device
    ) -> None:
        """Deliberate deviation: PopTorch executors take host tensors and stream them to the IPUs themselves,
        and torch itself cannot hold tensors on "ipu" (`.to("ipu")` raises), so the runner's batches must stay
        on the host: ``setup_device`` returns the CPU device while the backend's device type is "ipu"."""
        assert contract_backend.info.device_type == "ipu"
        assert contract_device == torch.device("cpu")
