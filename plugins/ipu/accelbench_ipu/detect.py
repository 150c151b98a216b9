"""IPU detection: poptorch's hardware queries, run in a subprocess, plus ``gc-info`` for the board type.

Detection never imports poptorch into the calling process (importing it loads the Poplar runtime): it first
checks that a ``poptorch`` module can be found at all, which costs nothing, and only then asks a short-lived
interpreter. The result is cached for the life of the process.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

from accelbench.contract import DeviceInfo
from accelbench_ipu.peaks import IN_PROCESSOR_MEMORY_MK2, PARTS

SDK_NOTE = (
    "poptorch is not importable: it ships as a wheel inside Graphcore's Poplar SDK (it is not on PyPI); install "
    "the SDK, `source` its enable script and pip-install the SDK's poptorch wheel into this environment"
)
PROBE_TIMEOUT_S = 120.0
EMULATED_IPUS = 64  # the IPU Model emulates any power-of-two count; list as many as one partition holds

_PROBE = r"""
import json
try:
    import poptorch
except Exception as exc:
    print(json.dumps({"import_error": f"{type(exc).__name__}: {exc}"}))
    raise SystemExit(0)
out = {"version": str(getattr(poptorch, "__version__", "unknown")),
       "stand_in": bool(getattr(poptorch, "__accelbench_stand_in__", False))}
try:
    out["hardware_version"] = int(poptorch.ipuHardwareVersion())
except Exception:
    out["hardware_version"] = None
count, n = 0, 1
while n <= 64:
    try:
        available = poptorch.ipuHardwareIsAvailable(n)
    except Exception:
        available = False
    if not available:
        break
    count, n = n, n * 2
out["ipus"] = count
print(json.dumps(out))
"""


@dataclass(frozen=True)
class Probe:
    """What this host offers: poptorch (or why not), the IPUs it can reserve, the board."""

    poptorch: str | None = None  # version; None when not importable
    error: str | None = None
    ipus: int = 0  # largest power of two of IPUs poptorch reports available
    hardware_version: int | None = None
    stand_in: bool = False
    board: dict[str, str] = field(default_factory=dict)  # `gc-info -i -d 0` attributes

    @property
    def emulator(self) -> bool:
        return self.poptorch is not None and os.environ.get("POPTORCH_IPU_MODEL", "") == "1"


@functools.lru_cache(maxsize=1)
def probe() -> Probe:
    """Probe once per process (``probe.cache_clear()`` to probe again)."""
    if importlib.util.find_spec("poptorch") is None:
        return Probe(error=SDK_NOTE)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Probe(error=f"probing poptorch failed: {type(exc).__name__}: {exc}")
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (done.stderr or done.stdout).strip()[-500:]
        return Probe(error=f"probing poptorch failed (exit {done.returncode}): {tail}")
    if "import_error" in found:
        return Probe(error=f"poptorch is installed but does not import: {found['import_error']}")
    return Probe(
        poptorch=found["version"],
        ipus=int(found.get("ipus") or 0),
        hardware_version=found.get("hardware_version"),
        stand_in=bool(found.get("stand_in")),
        board=_gc_info() if found.get("ipus") else {},
    )


def _gc_info() -> dict[str, str]:
    """Attributes of IPU 0 from ``gc-info -i -d 0`` (board type, architecture, clock, driver), or {}."""
    tool = shutil.which("gc-info")
    if tool is None:
        return {}
    try:
        done = subprocess.run(
            [tool, "-i", "-d", "0"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return parse_gc_info(done.stdout)


def parse_gc_info(text: str) -> dict[str, str]:
    """``key: value`` lines of ``gc-info --device-info`` output."""
    attributes = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition(":")
        if sep and key and value.strip():
            attributes[key.strip().lower()] = value.strip()
    return attributes


def classify(hardware_version: int | None, board: dict[str, str]) -> tuple[str, str, str | None]:
    """(part key, device name, architecture) from the board type, else the architecture and clock.

    A Mk2 IPU whose board cannot be read may be a GC200 or a Bow (same architecture): the part is then
    unknown, and so is its peak, rather than guessed.
    """
    arch = board.get("ipu architecture") or {2: "ipu2", 21: "ipu21"}.get(hardware_version or 0)
    kind = board.get("board type", "").lower()
    if "bow" in kind:
        return "bow", PARTS["bow"].name, arch
    if "m2000" in kind or "pod" in kind:
        return "gc200", PARTS["gc200"].name, arch
    if "c600" in kind:
        return "c600", "Graphcore C600 IPU", arch
    clock = _mhz(board.get("clock", ""))
    if arch == "ipu2" and clock is not None and clock >= 1000:  # an idle IPU may report a low clock
        key = "bow" if clock >= 1700 else "gc200"
        return key, PARTS[key].name, arch
    if arch == "ipu2":
        return "", "Graphcore Mk2 IPU (GC200 or Bow: board type unknown)", arch
    if arch == "ipu21":
        return "", "Graphcore ipu21 IPU (board type unknown)", arch
    return "", "Graphcore IPU", arch


def _mhz(text: str) -> float | None:
    digits = text.lower().removesuffix("mhz").strip()
    try:
        return float(digits)
    except ValueError:
        return None


def devices() -> list[DeviceInfo]:
    """One DeviceInfo per IPU poptorch can reserve; the IPU Model's when POPTORCH_IPU_MODEL=1; else []."""
    found = probe()
    if found.poptorch is None:
        return []
    common = {"poptorch": found.poptorch}
    if found.stand_in:
        common["stand_in"] = "true: a test stand-in for poptorch, not an IPU"
    if found.emulator:
        details = {**common, "emulated": "true", "part": ""}
        return [
            DeviceInfo(index=i, name="IPU Model (emulator)", arch="ipu-model", details=details)
            for i in range(EMULATED_IPUS)
        ]
    part, name, arch = classify(found.hardware_version, found.board)
    details = {**common, "part": part, "hardware_version": str(found.hardware_version)}
    for key in ("board type", "clock", "firmware version", "driver version"):
        if key in found.board:
            details[key.replace(" ", "_")] = found.board[key]
    memory = IN_PROCESSOR_MEMORY_MK2 if arch in ("ipu2", "ipu21") else None
    return [
        DeviceInfo(index=i, name=name, arch=arch, memory_bytes=memory, details=details)
        for i in range(found.ipus)
    ]
