"""A backend whose device type torch learns only from the vendor's package (PrivateUse1: ``npu``, ...): installed
without that package and with torch's autoload off, it loads, `accelbench plugins` lists it, and the conformance
kit's device-less tier passes (`accelbench check-backend`), the device tests not proven; nothing builds a
``torch.device`` of its type before the backend is asked to make it available (``device_kind``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from core_support import installed_plugin

PLUGIN = '''"""A PrivateUse1-style stand-in: device type "npu", which only the absent package npu_standin registers."""
from __future__ import annotations

from accelbench.contract import Backend, BackendInfo, DeviceInfo, hookimpl

accelbench_contract = "3.3"


@hookimpl
def accelbench_register_backends(register):
    register(NpuBackend)


class NpuBackend(Backend):
    """Stand-in NPUs: their runtime (npu_standin) is not installed here, so none is detected."""

    info = BackendInfo(name="npu", device_type="npu", device_unit="one NPU", priority=5,
                       description="stand-in NPUs whose package registers the device type with torch")

    def detect_devices(self) -> list[DeviceInfo]:
        try:
            import npu_standin  # noqa: F401 - the vendor's runtime
        except ImportError:
            return []  # no runtime, no device (detection never raises for that)
        return []

    def device_kind(self):
        import npu_standin  # noqa: F401 - registers "npu" with torch (PrivateUse1)
        import torch

        return torch.device("npu")
'''


def test_a_device_type_torch_learns_from_the_vendor_package_needs_it_only_with_a_device(
    tmp_path: Path,
) -> None:
    env = {**installed_plugin(tmp_path, "npu", PLUGIN), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    listed = subprocess.run([sys.executable, "-m", "accelbench.cli", "plugins"], capture_output=True, text=True,
                            env=env, timeout=300)  # fmt: skip
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "npu" in listed.stdout and "Traceback" not in listed.stderr
    report = tmp_path / "report.json"
    checked = subprocess.run(
        [sys.executable, "-m", "accelbench.cli", "check-backend", "npu", "--json", str(report)],
        capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert checked.returncode == 0, [
        r for r in json.loads(report.read_text())["results"] if r["result"] == "failed"
    ]
    results = {row["test"]: row for row in json.loads(report.read_text())["results"]}
    assert results["backend info names a torch device type"]["result"] == "passed"
    assert results["detection returns devices without raising"]["result"] == "passed"
    assert results["device binds to the declared type"]["result"] == "not proven"
    assert "no npu device on this machine" in results["device binds to the declared type"]["why"]
    assert results["memory peak covers an allocation and resets"]["result"] == "not proven"


STOCK_KERNELS = """
import torch
torch.utils.rename_privateuse1_backend("npu")  # what a vendor's package does when imported
from accelbench.contract import Backend, BackendInfo

class Npu(Backend):
    info = BackendInfo(name="npu", device_type="npu", device_unit="one NPU")

    def detect_devices(self):
        return []

print(Npu().optimizer_implementation(torch.device("npu")), Npu().optimizer_implementation(torch.device("cuda")))
"""


def test_the_stock_optimizer_kernels_of_a_privateuse1_type_are_foreach() -> None:
    """torch lists its PrivateUse1 type among those with fused AdamW whether or not the vendor wrote the kernels: the
    stock answer for it is foreach (a vendor with fused kernels says so by overriding optimizer_implementation)."""
    done = subprocess.run([sys.executable, "-c", STOCK_KERNELS], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["foreach", "fused"]
