"""accelbench-xla against the conformance kit (accelbench.testing). In the XLA venv CI builds (PJRT_DEVICE=CPU) the
whole kit runs, compiled with openxla included; elsewhere it lists what it could not prove."""

from __future__ import annotations

import os

from accelbench.testing import BackendContract


class TestXlaContract(BackendContract):
    backend = "xla"
    run_timeout_s = 900.0  # XLA compiles every new graph shape on the CPU client: the first steps are slow


if "PJRT_DEVICE" not in os.environ and os.environ.get("ACCELBENCH_XLA_CPU") == "1":
    os.environ["PJRT_DEVICE"] = "CPU"
