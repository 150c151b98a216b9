"""The conformance kit catches a broken backend: each defect a vendor's plugin has shipped with, applied to the working
CPU backend, makes its check fail with a message naming what is wrong; the working backend passes the same check
(accelbench.testing.meaning)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from core_support import installed_plugin

from accelbench.backends.cpu import CpuBackend
from accelbench.contract import DeviceInfo, EpochReadings, MemoryStats, World
from accelbench.testing.meaning import (
    ContractViolation,
    NotProven,
    Proven,
    check_collective_backend,
    check_local_ranks,
    check_memory,
    check_synchronize,
    declared_dtypes,
)

CPU = torch.device("cpu")


def working() -> CpuBackend:
    backend = CpuBackend()
    backend.setup_device(World(), {})
    return backend


def test_a_working_backends_memory_peak_covers_an_allocation_and_resets() -> None:
    outcome = check_memory(working(), CPU)
    assert isinstance(outcome, Proven) and "raised the epoch's peak by" in outcome.detail


def test_a_memory_query_that_always_answers_0_is_caught() -> None:
    class ZeroMemory(CpuBackend):
        def epoch_end(self, device: torch.device) -> EpochReadings:
            return EpochReadings(memory=MemoryStats(peak_bytes=0, source="device memory in use"))

    backend = ZeroMemory()
    backend.setup_device(World(), {})
    with pytest.raises(ContractViolation, match="does not measure what the device holds"):
        check_memory(backend, CPU)


def test_a_peak_reset_that_does_nothing_is_caught() -> None:
    """A reset that does nothing: every epoch reads the highest peak any earlier epoch saw (an allocator's peak
    counter never reset), here the working reading kept as a running maximum from the check's first epoch."""

    class NoReset(CpuBackend):
        highest = 0

        def epoch_end(self, device: torch.device) -> EpochReadings:
            readings = super().epoch_end(device)
            NoReset.highest = max(NoReset.highest, readings.memory.peak_bytes or 0)
            memory = readings.memory.model_copy(update={"peak_bytes": NoReset.highest})
            return readings.model_copy(update={"memory": memory})

    backend = NoReset()
    backend.setup_device(World(), {})
    with pytest.raises(ContractViolation, match="epoch_start does not reset the peak"):
        check_memory(backend, CPU)


def test_a_backend_that_measures_no_memory_is_said_not_failed() -> None:
    class Unmeasured(CpuBackend):
        def epoch_end(self, device: torch.device) -> EpochReadings:
            return EpochReadings(memory=MemoryStats(peak_bytes=None, source="unknown"))

    outcome = check_memory(Unmeasured(), CPU)
    assert isinstance(outcome, NotProven) and "measures no memory" in outcome.why


class StandInQueue:
    """An asynchronous stand-in device: queued work runs on a thread (0.2 s), collecting a result joins it."""

    def __init__(self) -> None:
        self.pending: list[threading.Thread] = []

    def queue(self) -> threading.Thread:
        thread = threading.Thread(target=time.sleep, args=(0.2,))
        thread.start()
        self.pending.append(thread)
        return thread

    @staticmethod
    def collect(thread: Any) -> None:
        thread.join()

    def drain(self) -> None:
        while self.pending:
            self.pending.pop().join()


def test_a_synchronize_that_waits_passes_and_one_that_does_not_is_caught() -> None:
    device = StandInQueue()

    class Waits(CpuBackend):
        def synchronize(self, d: torch.device) -> None:
            device.drain()

    class ReturnsAtOnce(CpuBackend):
        def synchronize(self, d: torch.device) -> None:
            pass

    outcome = check_synchronize(Waits(), CPU, device.queue, device.collect)
    assert isinstance(outcome, Proven) and "finished when synchronize returned" in outcome.detail
    with pytest.raises(ContractViolation, match="synchronize does not wait for the device"):
        check_synchronize(ReturnsAtOnce(), CPU, device.queue, device.collect)


def test_a_synchronous_device_is_said_to_have_nothing_to_wait_for() -> None:
    outcome = check_synchronize(working(), CPU)
    assert isinstance(outcome, Proven) and "synchronous" in outcome.detail


def test_a_collective_backend_torch_does_not_have_is_caught() -> None:
    class NamesNccl(CpuBackend):
        def collective_backend(self, device: torch.device) -> str:
            return "nccl"

    backend = NamesNccl()
    with pytest.raises(ContractViolation, match="collectives: .*'nccl'"):
        check_collective_backend(backend, CPU, [torch.float32])


def test_the_working_collective_backend_reduces_every_declared_dtype() -> None:
    backend = working()
    dtypes = declared_dtypes(backend, CPU)
    assert torch.float32 in dtypes and torch.bfloat16 in dtypes
    outcome = check_collective_backend(backend, CPU, dtypes)
    assert isinstance(outcome, Proven) and "'gloo' reduced float32, bfloat16" in outcome.detail


class TwoDevices(CpuBackend):
    """Two stand-in devices on the host, each rank's its own (torch.device('cpu', local_rank))."""

    def detect_devices(self) -> list[DeviceInfo]:
        return [DeviceInfo(index=i, name=f"stand-in {i}") for i in range(2)]

    def setup_device(self, world: World, options: Any) -> torch.device:
        super().setup_device(world, options)
        return torch.device("cpu", world.local_rank)


def test_local_ranks_that_share_a_device_are_caught() -> None:
    class SharesOne(TwoDevices):
        def setup_device(self, world: World, options: Any) -> torch.device:
            return torch.device("cpu", 0)

    right = TwoDevices()
    outcome = check_local_ranks(right, right.detect_devices())
    assert isinstance(outcome, Proven) and "cpu:0 and cpu:1" in outcome.detail
    wrong = SharesOne()
    with pytest.raises(ContractViolation, match="setup_device ignores world.local_rank"):
        check_local_ranks(wrong, wrong.detect_devices())
    one = working()
    assert isinstance(check_local_ranks(one, one.detect_devices()), NotProven)


def test_a_failed_run_says_why_on_stderr_even_when_quiet(tmp_path: Path) -> None:
    """--quiet silences the progress and the summary, never the reason a run failed (it was only in the record)."""
    done = subprocess.run(
        [sys.executable, "-m", "accelbench.cli", "run", "--model", "custom", "--layers", "1", "--heads", "2",
         "--embd", "16", "--block-size", "16", "--batch-size", "8", "--dropout", "0", "--epochs", "2",
         "--steps-per-epoch", "3", "--lr", "1e12", "--quiet", "--output-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 4 and not done.stdout
    assert "diverged: training diverged: the loss was nan" in done.stderr
    assert "result record:" in done.stderr


def test_the_example_plugin_with_a_memory_query_that_answers_0_fails_the_kit_naming_it(
    tmp_path: Path,
) -> None:
    """End to end: the example plugin, its memory query made to answer 0, installed under another name and checked
    with `accelbench check-backend`: the kit fails, and its report names the defect."""
    example = Path(__file__).resolve().parents[1] / "plugins" / "example" / "accelbench_example"
    source = (example / "plugin.py").read_text()
    source = source.replace(
        "from accelbench_example import __version__", "from accelbench_zero import __version__"
    )
    source = source.replace('name="example"', 'name="zero"')
    broken = source.replace(
        'memory=MemoryStats(peak_bytes=None, source="unknown (CPU tensors have no allocator peak counter)")',
        'memory=MemoryStats(peak_bytes=0, source="device memory in use")',
    )
    assert broken != source
    env = installed_plugin(tmp_path, "zero", broken, init='__version__ = "0.1.0"\n')
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "accelbench.cli", "check-backend", "zero", "--json", str(report)],
        capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    failed = [row for row in json.loads(report.read_text())["results"] if row["result"] == "failed"]
    assert [row["test"] for row in failed] == ["memory peak covers an allocation and resets"]
    assert "does not measure what the device holds" in failed[0]["why"]
