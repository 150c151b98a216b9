"""The built-in CPU backend. Registered through the ``accelbench`` entry-point group like any vendor plugin: this module
is the plugin, :class:`CpuBackend` its backend.

One device = the CPU cores this process may run on (its affinity mask), with torch's intra-op threads. Its
tensors come from glibc's malloc, told at device setup to keep freed memory for reuse (:mod:`host_malloc`;
``--cpu-malloc default`` does not), so a step writes reused pages as a tuned CPU loop does, not fresh ones.
Peak memory is the process's resident-set high-water mark (VmHWM), reset at each epoch's start through
``/proc/self/clear_refs``; CPU tensors have no allocator peak counter in torch. Energy comes from Linux RAPL
(``/sys/class/powercap/intel-rapl:N/energy_uj``, the CPU packages) where it is readable, which often needs root;
elsewhere it is unknown.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from accelbench.contract import (
    Backend,
    BackendInfo,
    DeviceInfo,
    EnergyReading,
    EpochReadings,
    MemoryStats,
    PrecisionPlan,
    RunOption,
    Scalar,
    World,
    hookimpl,
)
from accelbench.devices import CounterFile
from accelbench.hostinfo import cpu_model, usable_cores

if TYPE_CHECKING:
    import torch

accelbench_contract = "3.0"

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")
POWERCAP = Path("/sys/class/powercap")
# Where the RAPL zones are read instead (a folder laid out as /sys/class/powercap): a node's counters faked at the
# file level, to test energy without root or RAPL; or a node exposing them elsewhere.
POWERCAP_ENV = "ACCELBENCH_POWERCAP_DIR"


def rapl_packages(root: Path = POWERCAP) -> list[CounterFile]:
    """The readable RAPL package domains (``intel-rapl:N``, also used by AMD's driver); sub-domains are inside
    them and are not counted again."""
    out = []
    for zone in sorted(root.glob("intel-rapl:*")):
        if zone.name.count(":") != 1:  # intel-rapl:0:0 and deeper are parts of a package
            continue
        energy = zone / "energy_uj"
        try:
            max_uj = int((zone / "max_energy_range_uj").read_text())
            int(energy.read_text())  # readable by this user?
        except (OSError, ValueError):
            continue
        out.append(CounterFile(zone.name, energy, wrap=max_uj))
    return out


@hookimpl
def accelbench_register_backends(register: Callable[[type[Backend]], None]) -> None:
    register(CpuBackend)


class CpuBackend(Backend):
    """The CPU backend. Per-run state (whether VmHWM was reset, the RAPL counters at the epoch's start) lives here."""

    info = BackendInfo(
        name="cpu",
        device_type="cpu",
        device_unit="CPU (the cores this process may use)",
        priority=0,
        description="Built-in: trains on the host CPU with torch's intra-op threads.",
    )

    def __init__(self, powercap: Path | None = None) -> None:
        super().__init__()
        self.powercap = powercap or Path(os.environ.get(POWERCAP_ENV) or POWERCAP)
        self._reads_node = True  # local rank 0 reads the node's counters; its peers on the node do not
        self._peak_resettable = False
        self._rapl_start: dict[str, int] = {}
        self._packages: list[CounterFile] | None = None
        self._malloc: str | None = None  # the host allocator's settings in force (setup_device)

    def run_options(self) -> list[RunOption]:
        from accelbench.backends.host_malloc import MODES

        return [
            RunOption(
                name="cpu_malloc",
                type="str",
                choices=MODES,
                help="host allocator: 'reuse' (default) has glibc's malloc keep freed memory, as tuned CPU "
                "training does with jemalloc or TCMalloc, so a step does not fault in fresh pages; 'default' "
                "leaves glibc's settings. A preloaded allocator or MALLOC_*_ settings are left as they are",
                backend="cpu",
            )
        ]

    def recorded_environment(self) -> list[str]:
        return [
            "LD_PRELOAD",
            "MALLOC_*",
            "GLIBC_TUNABLES",
            "OMP_NUM_THREADS",
            "MKL_NUM_THREADS",
            "OMP_PROC_BIND",
            "OMP_PLACES",
            "KMP_AFFINITY",
            "ONEDNN_*",
        ]

    def detect_devices(self) -> list[DeviceInfo]:
        import psutil

        details = {
            "logical_cores": str(os.cpu_count()),
            "physical_cores": str(psutil.cpu_count(logical=False)),
            "usable_cores": str(usable_cores()),
            "energy_counter": "RAPL" if self.packages() else "none readable",
        }
        return [
            DeviceInfo(
                index=0,
                name=cpu_model(),
                arch=f"{platform.machine()} {_cpu_capability()}",
                memory_bytes=psutil.virtual_memory().total,
                details=details,
            )
        ]

    def runtime_versions(self) -> dict[str, str]:
        import torch

        versions = {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "mkldnn": str(torch.backends.mkldnn.is_available()),
            "openmp": str(torch.backends.openmp.is_available()),
        }
        get = getattr(torch.backends.cpu, "get_cpu_capability", None)  # torch >= 2.1
        if get is not None:
            versions["cpu_capability"] = str(get())  # the kernels torch dispatches to
        if self._malloc is not None:
            versions["host_malloc"] = self._malloc
        return versions

    def supported_precisions(self, device: torch.device) -> list[str]:
        # torch's CPU autocast runs bf16 and fp16 regions; fp16 is emulated on most CPUs and slow, but it runs.
        return ["fp32", "bf16-mixed", "bf16-true", "fp16-mixed"]

    def precision_plan(
        self, precision: str, device: torch.device, options: Mapping[str, Scalar]
    ) -> PrecisionPlan:
        import torch

        from accelbench.contract import standard_plan

        # oneDNN may run fp32 matmuls in bf16 when asked; record the setting that is really in force (torch >= 2.9)
        fp32_mode = getattr(getattr(torch.backends.mkldnn, "matmul", None), "fp32_precision", "none")
        math = "ieee-fp32" if fp32_mode in ("none", "ieee") else f"oneDNN fp32 matmuls as {fp32_mode}"
        return standard_plan(precision, matmul_math=math)

    def setup_device(self, world: World, options: Mapping[str, Scalar]) -> torch.device:
        import torch

        from accelbench.backends.host_malloc import keep_freed_memory

        self._reads_node = world.local_rank == 0
        self._malloc = keep_freed_memory(str(options.get("cpu_malloc", "reuse")))
        return torch.device("cpu")

    def synchronize(self, device: torch.device) -> None:
        """Nothing to wait for: CPU kernels run synchronously with the Python thread."""

    def epoch_start(self, device: torch.device) -> None:
        try:
            _CLEAR_REFS.write_text("5")  # "5" resets the peak RSS (VmHWM) of this process (Linux >= 4.0)
            self._peak_resettable = True
        except OSError:  # not Linux, or /proc is read-only: the reading is then the lifetime peak
            self._peak_resettable = False
        packages = self.packages() if self._reads_node else []
        self._rapl_start = {p.name: uj for p in packages if (uj := p.read()) is not None}

    def epoch_end(self, device: torch.device) -> EpochReadings:
        return EpochReadings(memory=self._memory(), energy=self._energy())

    def packages(self) -> list[CounterFile]:
        if self._packages is None:
            self._packages = rapl_packages(self.powercap)
        return self._packages

    def _energy(self) -> EnergyReading | None:
        """Joules over the epoch from every package's counter (a counter that wrapped once is unwrapped). The
        packages are the node's, shared by all its ranks: local rank 0 reads them once for the node, and the other
        ranks report the same counter (domain) with no joules of their own, so the node counts once and
        :func:`~accelbench.engine.metrics.apportion_energy` shares it out over the ranks."""
        if not self._reads_node:
            packages = self.packages()
            if not packages:
                return None
            names = "+".join(p.name for p in packages)
            return EnergyReading(
                joules=0.0,
                domain=f"rapl:{platform.node()}:{names}",
                source=f"Linux RAPL package energy counters ({names}, {self.powercap}): read once per node, by "
                "its local rank 0",
            )
        packages = [p for p in self.packages() if p.name in self._rapl_start]
        if not packages:
            return None
        total_uj = 0
        for package in packages:
            delta = package.since(self._rapl_start[package.name])
            if delta is None:
                return None
            total_uj += delta
        names = "+".join(p.name for p in packages)
        return EnergyReading(
            joules=total_uj / 1e6,
            domain=f"rapl:{platform.node()}:{names}",
            source=f"Linux RAPL package energy counters ({names}, {self.powercap}): the whole CPU package, "
            "shared by every process on it, read once per node (local rank 0)",
        )

    def _memory(self) -> MemoryStats:
        import psutil

        total = psutil.virtual_memory().total
        hwm = _read_vmhwm()
        if hwm is not None and self._peak_resettable:
            return MemoryStats(
                peak_bytes=hwm, source="host RSS high-water mark (VmHWM, reset per epoch)", total_bytes=total
            )
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
        return MemoryStats(
            peak_bytes=peak * scale,
            source="host RSS peak over the process lifetime (ru_maxrss)",
            total_bytes=total,
        )


# the widest vector extension the CPU reports (/proc/cpuinfo flags), the way torch names its kernel dispatch levels
_ISA_FLAGS = (("avx512f", "AVX512"), ("avx2", "AVX2"), ("asimd", "NEON"), ("sve", "SVE"))


def _cpu_capability() -> str:
    """The CPU's widest vector extension, read from /proc/cpuinfo (detection imports no torch); the level torch
    really dispatches to is in the run's runtime versions (``cpu_capability``)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown vector ISA"
    flags = set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            flags.update(line.split(":", 1)[1].split())
            break
    found = [name for flag, name in _ISA_FLAGS if flag in flags]
    if "SVE" in found:
        return "SVE"
    return found[0] if found else "no vector extension reported"


def _read_vmhwm() -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
