"""Plugin loading through real entry points of real (test) distributions, installed on PYTHONPATH."""

from __future__ import annotations

import json

import pytest
from core_support import TINY, Site, accelbench

from accelbench.plugins import PluginHost

BROKEN_IMPORT = """
import nonexistent_vendor_runtime  # the vendor library is missing on this machine
"""

MISSPELLED = """
from accelbench.contract import hookimpl
accelbench_contract = "3.0"

@hookimpl
def accelbench_register_backend(register):
    pass
"""

BAD_SIGNATURE = """
from accelbench.contract import hookimpl
accelbench_contract = "3.0"

@hookimpl
def accelbench_register_backends(register, stream):
    pass
"""

UNDECORATED = """
from accelbench.contract import Backend, BackendInfo, hookimpl
accelbench_contract = "3.0"

@hookimpl
def accelbench_register_workloads(register):
    pass

def accelbench_register_backends(register):  # forgot @hookimpl: pluggy would ignore it silently
    register(QuietBackend)

class QuietBackend(Backend):
    info = BackendInfo(name="quiet", device_type="cpu", device_unit="test unit", priority=-5)
"""

# Written for contract 2.1: per-backend hooks, no Backend subclass
CONTRACT_2 = """
from accelbench.contract import hookimpl
accelbench_contract = "2.1"

@hookimpl
def accelbench_detect_devices():
    return []
"""

NOT_A_BACKEND = """
from accelbench.contract import hookimpl
accelbench_contract = "3.0"

class Lookalike:  # has the methods, but does not subclass accelbench.contract.Backend
    def detect_devices(self):
        return []

@hookimpl
def accelbench_register_backends(register):
    register(Lookalike)
"""

# A complete third-party backend: runs on CPU tensors but is its own backend with its own rules.
TESTDEV = """
import torch
from accelbench.contract import Backend, BackendInfo, DeviceInfo, RunOption, hookimpl
accelbench_contract = "3.0"

@hookimpl
def accelbench_register_backends(register):
    register(TestDevBackend)

# device binding, synchronisation and epoch readings: the stock Backend's, which know CPU tensors
class TestDevBackend(Backend):
    info = BackendInfo(name="testdev", device_type="cpu", device_unit="test device", priority=50)

    def run_options(self):
        return [RunOption(name="tiles_per_card", type="int", default=1, help="tiles per card", backend="testdev")]

    def detect_devices(self):
        return [DeviceInfo(index=0, name="Test Device 9000")]

    def supported_precisions(self, device):
        return ["fp32"]
"""

DUPLICATE = """
from accelbench.contract import Backend, BackendInfo, hookimpl
accelbench_contract = "3.0"

@hookimpl
def accelbench_register_backends(register):
    register(Duplicate)

class Duplicate(Backend):
    info = BackendInfo(name="testdev", device_type="cpu", device_unit="another", priority=1)
"""


def plugins_json(site: Site, **env: str) -> dict[str, dict]:
    proc = accelbench("plugins", "--json", env=site.env(**env))
    assert proc.returncode == 0, proc.stderr
    return {row["name"]: row for row in json.loads(proc.stdout)}


def test_cpu_backend_is_an_entry_point_plugin_with_a_device() -> None:
    host = PluginHost()
    cpu = next(r for r in host.records if r.name == "cpu")
    assert cpu.status == "active"
    assert cpu.distribution == "accelbench"
    assert cpu.hooks == ["accelbench_register_backends"] and cpu.contract == "3.0"
    assert "detect_devices" in cpu.overrides["cpu"] and "executor" not in cpu.overrides["cpu"]
    assert host.backends["cpu"].detect()[0].memory_bytes > 0


def test_broken_plugins_are_reported_and_skipped(site: Site) -> None:
    site.add_distribution("accelbench-broken", {"broken": "broken_plugin"}, {"broken_plugin": BROKEN_IMPORT})
    site.add_distribution("accelbench-typo", {"typo": "typo_plugin"}, {"typo_plugin": MISSPELLED})
    site.add_distribution("accelbench-badsig", {"badsig": "badsig_plugin"}, {"badsig_plugin": BAD_SIGNATURE})
    rows = plugins_json(site)

    assert rows["cpu"]["status"] == "active"
    assert rows["cpu"]["devices"], "the CPU backend must still detect its device"
    broken = rows["broken"]
    assert (broken["status"], broken["distribution"]) == ("failed", "accelbench-broken")
    assert "nonexistent_vendor_runtime" in broken["error"]
    assert rows["typo"]["status"] == "failed"
    assert "accelbench_register_backend'" in rows["typo"]["error"]
    assert "did you mean 'accelbench_register_backends'" in rows["typo"]["error"]
    assert rows["badsig"]["status"] == "failed"
    assert "stream" in rows["badsig"]["error"]

    # the human table shows them too, and a run still works with a broken plugin around
    table = accelbench("plugins", env=site.env())
    assert table.returncode == 0 and "failed" in table.stdout and "accelbench-broken" in table.stdout


def test_strict_mode_makes_plugin_failures_fatal(site: Site) -> None:
    site.add_distribution("accelbench-broken", {"broken": "broken_plugin"}, {"broken_plugin": BROKEN_IMPORT})
    proc = accelbench("plugins", env=site.env(ACCELBENCH_STRICT_PLUGINS="1"))
    assert proc.returncode == 2
    assert "plugin 'broken' (distribution accelbench-broken) failed" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_undecorated_hook_is_a_warning(site: Site) -> None:
    site.add_distribution("accelbench-quiet", {"quiet": "quiet_plugin"}, {"quiet_plugin": UNDECORATED})
    row = plugins_json(site)["quiet"]
    assert row["status"] == "active"
    assert any("accelbench_register_backends is not decorated" in w for w in row["warnings"])


@pytest.mark.slow
def test_third_party_backend_selection_and_its_own_precision_rules(site: Site, tmp_path) -> None:
    site.add_distribution("accelbench-testdev", {"testdev": "testdev_plugin"}, {"testdev_plugin": TESTDEV})
    env = site.env()
    out = tmp_path / "out"
    # detection by priority picks testdev (50) over cpu (0)
    args = [*TINY, "--epochs", "1", "--steps-per-epoch", "2", "--output-dir", str(out), "--json", "-q"]
    proc = accelbench("run", *args, "--tiles-per-card", "2", env=env)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert record["config"]["backend_options"] == {"tiles_per_card": 2}  # a plugin's own run option, as given
    assert record["backend"]["info"]["name"] == "testdev"
    assert record["backend"]["devices"][0]["name"] == "Test Device 9000"
    assert record["backend"]["distribution"] == "accelbench-testdev"
    # its declared precisions apply to it and not to cpu: the cpu plugin's own hooks are not consulted
    refused = accelbench("run", *TINY, "--precision", "bf16-mixed", "--output-dir", str(out), env=env)
    assert refused.returncode == 2
    assert "backend 'testdev' does not support precision 'bf16-mixed'" in refused.stderr
    assert "it supports: fp32" in refused.stderr
    # a plugin's option is refused for another backend rather than silently ignored
    wrong = accelbench("run", "--backend", "cpu", *args, "--tiles-per-card", "2", env=env)
    assert wrong.returncode == 2
    assert "--tiles-per-card is an option of backend 'testdev', not of 'cpu'" in wrong.stderr
    # an explicit --backend always wins
    proc = accelbench(
        "run",
        "--backend",
        "cpu",
        *TINY,
        "--precision",
        "bf16-mixed",
        "--epochs",
        "1",
        "--steps-per-epoch",
        "2",
        "--output-dir",
        str(out),
        "--json",
        "-q",
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["backend"]["info"]["name"] == "cpu"


def test_duplicate_backend_name_fails_naming_both_distributions(site: Site) -> None:
    site.add_distribution("accelbench-testdev", {"testdev": "testdev_plugin"}, {"testdev_plugin": TESTDEV})
    site.add_distribution("accelbench-zzdup", {"zzdup": "dup_plugin"}, {"dup_plugin": DUPLICATE})
    rows = plugins_json(site)
    assert rows["testdev"]["status"] == "active"
    assert rows["zzdup"]["status"] == "failed"
    assert "already provided by distribution accelbench-testdev" in rows["zzdup"]["error"]


def test_unknown_backend_lists_installed_ones(site: Site, tmp_path) -> None:
    site.add_distribution("accelbench-broken", {"broken": "broken_plugin"}, {"broken_plugin": BROKEN_IMPORT})
    proc = accelbench("run", "--backend", "tpu", "--output-dir", str(tmp_path), env=site.env())
    assert proc.returncode == 2
    assert "unknown backend 'tpu'" in proc.stderr
    assert "cpu" in proc.stderr.split("installed backends:")[1]
    proc = accelbench("run", "--backend", "broken", "--output-dir", str(tmp_path), env=site.env())
    assert "plugin 'broken' is installed but failed to load" in proc.stderr
    assert not list(tmp_path.glob("*.json"))


@pytest.mark.parametrize("hook", ["accelbench_register_backends", "accelbench_register_workloads"])
def test_every_hook_is_documented(hook: str) -> None:
    from accelbench.contract import hookspecs

    assert len((getattr(hookspecs, hook).__doc__ or "").split()) > 10


def test_every_backend_method_is_documented_and_typed() -> None:
    import inspect

    from accelbench.contract import Backend

    for name, method in inspect.getmembers(Backend, callable):
        if name.startswith("_"):
            continue
        assert len((method.__doc__ or "").split()) > 8, f"Backend.{name} needs a docstring"
        assert "return" in inspect.get_annotations(method), f"Backend.{name} needs a return type"


def test_a_2x_plugin_is_reported_with_its_version_and_what_to_do(site: Site) -> None:
    site.add_distribution("accelbench-two", {"two": "two_plugin"}, {"two_plugin": CONTRACT_2})
    site.add_distribution("accelbench-fake", {"fake": "fake_plugin"}, {"fake_plugin": NOT_A_BACKEND})
    rows = plugins_json(site)
    two = rows["two"]
    assert two["status"] == "failed" and "written for plugin contract 2.1" in two["error"]
    assert (
        "subclass of accelbench.contract.Backend" in two["error"] and "Porting a 2.x plugin" in two["error"]
    )
    fake = rows["fake"]
    assert fake["status"] == "failed" and "not a subclass of accelbench.contract.Backend" in fake["error"]
    assert rows["cpu"]["status"] == "active" and rows["cpu"]["contract"] == "3.0"


CONTRACT_1 = """
from accelbench.contract import hookimpl
from accelbench.contract import BackendInfo

@hookimpl
def accelbench_backend():
    return BackendInfo(name="oldie", device_type="cpu", device_unit="old", priority=-1)
"""

FUTURE = CONTRACT_1.replace("oldie", "future") + 'accelbench_contract = "3.9"\n'

# A plugin object: its methods are the hooks and its per-run state lives on it (an epoch counter here)
STATEFUL = """
import os
from accelbench.contract import Backend, BackendInfo, DeviceInfo, EnergyReading, EpochReadings, MemoryStats
from accelbench.contract import hookimpl

accelbench_contract = "3.0"

@hookimpl
def accelbench_register_backends(register):
    register(CountingBackend)

class CountingBackend(Backend):
    \"\"\"A test backend that counts the epochs it saw and reports a made-for-the-test energy counter.\"\"\"

    info = BackendInfo(name="counting", device_type="cpu", device_unit="test unit", priority=-10)

    def __init__(self):
        super().__init__()
        self.started = 0

    def detect_devices(self):
        return [DeviceInfo(index=0, name="Counter")]

    def recorded_environment(self):
        return ["COUNTING_*"]

    def epoch_start(self, device):
        self.started += 1

    def epoch_end(self, device):
        memory = MemoryStats(peak_bytes=self.started, source="epochs started so far (a test counter)")
        # half a joule more each epoch: a plausible draw for epochs of milliseconds (a counter implying more than
        # 5 kW is flagged as jumped and its epoch's energy left unknown)
        energy = EnergyReading(joules=0.5 * self.started, domain="test:one", source="test counter")
        return EpochReadings(memory=memory, energy=energy, telemetry={"epochs_started": float(self.started)})
"""


def test_plugins_for_another_contract_version_are_reported_not_loaded(site: Site) -> None:
    site.add_distribution("accelbench-oldie", {"oldie": "old_plugin"}, {"old_plugin": CONTRACT_1})
    site.add_distribution("accelbench-future", {"future": "future_plugin"}, {"future_plugin": FUTURE})
    rows = plugins_json(site)
    old, future = rows["oldie"], rows["future"]
    assert old["status"] == "failed" and "written for plugin contract 1" in old["error"]
    assert "upgrade the plugin" in old["error"] and old["hooks"] == [] and old["backend"] is None
    assert (
        future["status"] == "failed"
        and "contract 3.9" in future["error"]
        and "upgrade accelbench" in future["error"]
    )
    assert rows["cpu"]["status"] == "active"


def test_a_plugin_object_keeps_its_state_and_reports_epoch_readings(site: Site, tmp_path) -> None:
    site.add_distribution(
        "accelbench-counting", {"counting": "counting_plugin"}, {"counting_plugin": STATEFUL}
    )
    out = tmp_path / "out"
    env = site.env(COUNTING_MODE="fast", ACCELBENCH_DEBUG="1")
    args = [*TINY, "--epochs", "3", "--steps-per-epoch", "2", "--output-dir", str(out), "--json", "-q",
            "--no-calibration", "--idle-baseline-s", "0"]  # fmt: skip  # only the epochs start and end: the counts below are theirs
    proc = accelbench("run", "--backend", "counting", *args, env=env)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    epochs = record["metrics"]["epochs"]
    assert [e["peak_memory_bytes"] for e in epochs] == [1, 2, 3]  # one object saw every epoch start
    assert [e["telemetry"]["epochs_started"] for e in epochs] == [1.0, 2.0, 3.0]
    assert [e["energy_j"] for e in epochs] == [0.5, 1.0, 1.5]
    assert epochs[0]["joules_per_sample"] == 0.5 / epochs[0]["samples"]
    steady = record["metrics"]["steady"]
    assert (
        steady["joules_per_sample"] == pytest.approx(1.25 / 16)
        and record["metrics"]["energy_source"] == "test counter"
    )
    assert record["system"]["environment"]["COUNTING_MODE"] == "fast"  # the plugin asked for COUNTING_*
    # ACCELBENCH_DEBUG=1: every call of the backend's methods traced on stderr
    assert "counting.epoch_end(" in proc.stderr and "counting.epoch_start(" in proc.stderr
