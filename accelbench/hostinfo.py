"""Facts about the host that several layers need (the system record, the CPU backend, the runner's thread split).

Plain standard library: importing this module costs nothing.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask), which is what a CPU run really gets."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class CpuUsage:
    """A reading of this process's use of the host's cores; the difference of two readings describes an interval.

    ``cpu_s``: seconds its threads ran on a core (all threads, live or ended); ``wait_s``: seconds its live threads
    were ready to run but waited for a core (the kernel's per-thread schedstat run delay; None where there is none);
    ``load_1m``: the host's 1-minute load average; ``steal_ticks`` and ``ticks``: of the clock ticks the cores it
    may run on counted (Linux's /proc/stat, summed over its affinity), those the hypervisor gave to other guests
    (a virtual machine's steal time; 0 on bare metal; None without /proc/stat). Waiting is what a shared, busy node
    costs a run; steal is what a busy host under a virtual machine costs it, unseen by the guest's own scheduler.
    """

    cpu_s: float
    wait_s: float | None
    load_1m: float | None
    steal_ticks: int | None = None
    ticks: int | None = None

    def waiting_since(self, before: CpuUsage) -> float | None:
        """Of the time the threads were ready to run since ``before``, the fraction they waited for a core."""
        if before.wait_s is None or self.wait_s is None:
            return None
        ran, waited = self.cpu_s - before.cpu_s, max(0.0, self.wait_s - before.wait_s)
        return waited / (ran + waited) if ran + waited > 0 else 0.0

    def steal_since(self, before: CpuUsage) -> float | None:
        """Of the clock ticks of the usable cores since ``before``, the fraction the hypervisor stole."""
        if None in (before.steal_ticks, before.ticks, self.steal_ticks, self.ticks):
            return None
        assert self.ticks is not None and before.ticks is not None
        assert self.steal_ticks is not None and before.steal_ticks is not None
        ticks = self.ticks - before.ticks
        return max(0, self.steal_ticks - before.steal_ticks) / ticks if ticks > 0 else 0.0


def cpu_usage(proc: Path = Path("/proc/self"), stat: Path = Path("/proc/stat")) -> CpuUsage:
    """This process's CPU reading now (a few hundred microseconds: one small file per thread, and /proc/stat)."""
    times = os.times()
    wait_ns, read = 0, 0
    try:
        for task in (proc / "task").iterdir():
            try:
                wait_ns += int((task / "schedstat").read_text().split()[1])
                read += 1
            except (OSError, IndexError, ValueError):
                continue  # the thread ended meanwhile, or the kernel keeps no schedstat
    except OSError:
        pass  # no /proc: not Linux
    try:
        load: float | None = os.getloadavg()[0]
    except (OSError, AttributeError):
        load = None
    steal, ticks = core_ticks(stat)
    return CpuUsage(times.user + times.system, wait_ns / 1e9 if read else None, load, steal, ticks)


def core_ticks(stat: Path = Path("/proc/stat")) -> tuple[int | None, int | None]:
    """Steal ticks and all ticks so far of the cores this process may run on, from /proc/stat's per-core lines
    (user, nice, system, idle, iowait, irq, softirq, steal; guest time is inside user's); (None, None) where the
    file is absent or holds no steal column (kernels before 2.6.11)."""
    try:
        cores = os.sched_getaffinity(0)
    except AttributeError:
        cores = None
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return None, None
    steal, ticks, seen = 0, 0, 0
    for line in lines:
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or not name[3:].isdigit():
            continue
        if cores is not None and int(name[3:]) not in cores:
            continue
        fields = rest.split()
        if len(fields) < 8:
            return None, None
        try:
            counts = [int(f) for f in fields[:8]]
        except ValueError:
            return None, None
        steal, ticks, seen = steal + counts[7], ticks + sum(counts), seen + 1
    return (steal, ticks) if seen else (None, None)


def cpu_list(cpus: set[int] | list[int]) -> str:
    """CPU numbers in the kernel's cpulist notation: {0, 1, 2, 3, 8} -> '0-3,8'."""
    ranges: list[str] = []
    ordered = sorted(cpus)
    start = prev = ordered[0] if ordered else -1
    for cpu in [*ordered[1:], None]:
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        ranges.append(str(start) if start == prev else f"{start}-{prev}")
        if cpu is not None:
            start = prev = cpu
    return ",".join(ranges) if ordered else ""


def numa_nodes(root: Path = Path("/sys/devices/system/node")) -> dict[str, str]:
    """The host's NUMA nodes and their CPUs, as the kernel lists them ({'node0': '0-15', 'node1': '16-31'});
    empty where the kernel exposes none (not Linux, or a container without /sys)."""
    nodes: dict[str, str] = {}
    try:
        folders = sorted(root.glob("node[0-9]*"), key=lambda p: int(p.name[4:]))
        for folder in folders:
            nodes[folder.name] = (folder / "cpulist").read_text().strip()
    except (OSError, ValueError):
        return {}
    return nodes


def cpu_affinity() -> str | None:
    """The CPUs this process may run on (its affinity mask) in cpulist notation; None where unknown."""
    try:
        return cpu_list(sorted(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return None


def last_level_cache_bytes(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """The size of the largest data cache the first CPU reports (its last level: an L3 shared by the socket's
    cores, or a virtual machine's view of it), from Linux's sysfs; None where none is readable (not Linux)."""
    sizes = []
    try:
        entries = list(root.glob("index*"))
    except OSError:
        return None
    for entry in entries:
        try:
            if (entry / "type").read_text().strip() == "Instruction":
                continue
            sizes.append(_size_bytes((entry / "size").read_text()))
        except (OSError, ValueError):
            continue
    return max(sizes, default=None)


def available_memory_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """Memory the kernel says can be allocated without swapping (``MemAvailable``); None where unreadable."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return _size_bytes(line.split(":", 1)[1].replace("kB", "K"))
    except (OSError, ValueError):
        pass
    return None


def _size_bytes(text: str) -> int:
    """'491520K', '32M', '2048 K' (sysfs's and meminfo's sizes) in bytes."""
    text = text.strip().replace(" ", "").upper()
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * scale
