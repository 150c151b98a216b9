"""Helpers a backend uses to answer: counter files, allocator readings, device probes in a subprocess, the torch
build. The records they produce are the contract's (:mod:`accelbench.contract.records`)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelbench.contract.records import EnergyReading, EpochReadings, MemoryStats
from accelbench.errors import BackendError


@dataclass(frozen=True)
class CounterFile:
    """A cumulative counter a kernel driver publishes as a file of one integer (RAPL's ``energy_uj``, a GPU's
    hwmon ``energy1_input``, both microjoules): ``name`` says which, ``wrap`` is the value it wraps at if known."""

    name: str
    path: Path
    wrap: int | None = None

    def read(self) -> int | None:
        """The counter now, or None when it cannot be read (gone, no permission)."""
        try:
            return int(self.path.read_text())
        except (OSError, ValueError):
            return None

    def since(self, start: int) -> int | None:
        """The increase since ``start``, counting one wrap; None when unreadable or when it went back unexplained."""
        end = self.read()
        if end is None:
            return None
        if end >= start:
            return end - start
        return end - start + self.wrap if self.wrap else None


def readings_with_energy(
    memory: MemoryStats, telemetry: dict[str, float], domain: str, source: str
) -> EpochReadings:
    """An epoch's readings from a counter window's telemetry: its ``energy_j`` (if any) becomes the
    :class:`EnergyReading` of ``domain``, the rest stays telemetry."""
    telemetry = dict(telemetry)
    joules = telemetry.pop("energy_j", None)
    energy = None if joules is None else EnergyReading(joules=joules, domain=domain, source=source)
    return EpochReadings(memory=memory, energy=energy, telemetry=telemetry)


def probe_in_subprocess(
    script: str, *, label: str, hang_hint: str, args: tuple[str, ...] = (), timeout: float = 60.0
) -> list[dict[str, Any]]:
    """Run a device-query ``script`` in a child interpreter and return the JSON list it prints last.

    For detection hooks: asking a vendor runtime for device properties initialises it, and a process that has done so
    cannot fork workers that use the device. The child inherits the visible-device variables, so it sees what a run
    would. ``label`` names the vendor in errors ("CUDA"); ``hang_hint`` says what to check if the child hangs.
    """
    try:
        proc = subprocess.run(
            [sys.executable, "-c", script, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise BackendError(
            f"the {label} device probe gave no answer within {timeout:.0f} s: {hang_hint}"
        ) from exc
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise BackendError(f"the {label} device probe failed (exit status {proc.returncode}): {last}")
    try:
        devices = json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise BackendError(f"the {label} device probe printed no device list: {lines[-1][:200]!r}") from exc
    if not isinstance(devices, list):
        raise BackendError(f"the {label} device probe printed {type(devices).__name__}, not a device list")
    return devices


@dataclass(frozen=True)
class TorchBuild:
    """What the installed torch was built for, known without importing torch (detection and ``accelbench plugins``
    stay fast): its version and its CUDA and HIP versions (None for a build without them)."""

    version: str
    cuda: str | None
    hip: str | None


def torch_build() -> TorchBuild | None:
    """The installed torch's build, from ``torch.version`` if torch is already imported, else read from its
    ``version.py`` without importing it; None when torch is not installed."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return TorchBuild(torch.__version__, torch.version.cuda, getattr(torch.version, "hip", None))
    spec = importlib.util.find_spec("torch")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        text = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text()
    except OSError:  # an unusual layout: ask torch itself
        import torch as imported

        return TorchBuild(imported.__version__, imported.version.cuda, getattr(imported.version, "hip", None))

    def value(name: str) -> str | None:
        match = re.search(rf"^{name}\s*(?::[^=]*)?=\s*(?:'([^']*)'|\"([^\"]*)\"|None)", text, re.MULTILINE)
        return (match.group(1) or match.group(2)) if match and (match.group(1) or match.group(2)) else None

    return TorchBuild(value("__version__") or "unknown", value("cuda"), value("hip"))


def refuse_torch_build(built: TorchBuild | None, seen: str, wanted: str) -> None:
    """Raise the error for hardware that this torch cannot drive, rather than reporting "no device": ``seen`` says
    what the management library found ("NVML sees 2 NVIDIA GPU(s)"), ``wanted`` the build it needs ("CUDA")."""
    if built is None:
        raise BackendError(f"{seen} but torch is not installed")
    if built.cuda:
        kind = f"CUDA build (CUDA {built.cuda})"
    elif built.hip:
        kind = f"ROCm build (HIP {built.hip})"
    else:
        kind = "CPU-only build"
    raise BackendError(
        f"{seen} but torch {built.version} is a {kind}; install a {wanted} build of torch "
        "(https://pytorch.org/get-started/locally/)"
    )
