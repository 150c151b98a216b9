"""Measured peak: what dense matrix multiplies really reach on this device, for where no vendor table has a figure.

A CPU has no vendor peak table, so a CPU run has no MFU; :func:`measured_peak` times square matrix multiplies (large
enough to be compute-bound) in the precision's matmul dtype on the selected backend's device, with the backend's own
device binding and synchronisation, and returns :class:`~accelbench.devices.PeakFigures` labelled
``measured: dense matmul ...``. MFU against it is then "of the achievable matmul rate", which the label says.

Results are cached per host, backend, device, torch version, dtype, fp32 math mode and (on a CPU) thread count, in
``measured-peak.json`` under ``$ACCELBENCH_CACHE_DIR`` (default ``~/.cache/accelbench``), written atomically, so a
second call costs nothing. A busy host can only lower a matmul rate, so a measurement during which the process's
threads waited for a core (10% or more of their ready time, as a run's host contention is judged), or during which
a virtual machine's hypervisor stole 10% of the cores' time, is kept but not
trusted: the next call measures again and keeps the higher rate, until one measures on a quiet host. torch is
imported inside the functions.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelbench.contract import PeakFigures
from accelbench.hostinfo import cpu_usage
from accelbench.results import _write_atomically

if TYPE_CHECKING:
    import torch

    from accelbench.contract import Backend, PrecisionPlan

CACHE_ENV = "ACCELBENCH_CACHE_DIR"
CACHE_FILE = "measured-peak.json"
# One multiply must take at least this long to be timed as compute-bound; sizes double from MIN_SIZE until it does.
MIN_MATMUL_S = 0.05
MIN_SIZE = 256
MAX_SIZE = {"cpu": 4096}  # elsewhere DEFAULT_MAX_SIZE
DEFAULT_MAX_SIZE = 16384
COPY_BYTES = 256 * 2**20  # the memory-bandwidth copy: far larger than any cache
# waited for a core this share of the time its threads were ready to run, or had this share of the cores' time
# stolen by a virtual machine's hypervisor: the host was busy (as for a run's epochs)
CONTENDED_WAITING = 0.10


def cache_dir() -> Path:
    """``$ACCELBENCH_CACHE_DIR``, else ``~/.cache/accelbench``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "accelbench")


def matmul_dtype(plan: PrecisionPlan) -> str:
    """The dtype a precision plan's matmuls run in: the autocast dtype, else the parameters'."""
    return plan.autocast_dtype or plan.param_dtype


@dataclass(frozen=True)
class MatmulRate:
    """A timed dense matmul: size ``n`` (n x n times n x n), FLOP/s of the best and the median repeat."""

    dtype: str
    size: int
    repeats: int
    best_flops_per_s: float
    median_flops_per_s: float


def time_matmul(
    device: torch.device,
    dtype: str,
    synchronize: Callable[[torch.device], None],
    budget_s: float = 1.0,
    max_size: int | None = None,
) -> MatmulRate:
    """Time ``n x n @ n x n`` in ``dtype`` on ``device``: n doubles from 256 until one multiply takes 50 ms (or
    the device's largest size), then repeats run for ``budget_s`` (at least 3), each between synchronisations.
    FLOPs = 2 n^3 per multiply."""
    import torch

    kind = getattr(torch, dtype)
    limit = max_size or MAX_SIZE.get(device.type, DEFAULT_MAX_SIZE)
    n = MIN_SIZE
    while True:
        a = torch.randn(n, n, device=device).to(kind)
        b = torch.randn(n, n, device=device).to(kind)
        torch.matmul(a, b)  # warm-up: kernel selection, lazy initialisation
        synchronize(device)
        start = time.perf_counter()
        torch.matmul(a, b)
        synchronize(device)
        elapsed = time.perf_counter() - start
        if elapsed >= MIN_MATMUL_S or n * 2 > limit:
            break
        n *= 2
    rates: list[float] = []
    spent = 0.0
    while spent < budget_s or len(rates) < 3:
        synchronize(device)
        start = time.perf_counter()
        torch.matmul(a, b)
        synchronize(device)
        elapsed = time.perf_counter() - start
        spent += elapsed
        rates.append(2.0 * n**3 / elapsed)
    return MatmulRate(dtype, n, len(rates), max(rates), statistics.median(rates))


def time_copy(
    device: torch.device, synchronize: Callable[[torch.device], None], budget_s: float = 0.5
) -> float:
    """Memory bandwidth in bytes/s: the best of repeated copies of a 256 MiB tensor (each reads and writes it)."""
    import torch

    elements = COPY_BYTES // 4
    src = torch.ones(elements, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best, spent, repeats = 0.0, 0.0, 0
    while spent < budget_s or repeats < 3:
        synchronize(device)
        start = time.perf_counter()
        dst.copy_(src)
        synchronize(device)
        elapsed = time.perf_counter() - start
        spent += elapsed
        repeats += 1
        best = max(best, 2.0 * COPY_BYTES / elapsed)
    return best


def cache_key(backend: str, device_name: str, plan: PrecisionPlan, device_type: str) -> str:
    """What a measured peak depends on: host, backend, device, torch version, matmul dtype, fp32 math mode, and on
    a CPU the intra-op threads (torch.get_num_threads)."""
    dtype = matmul_dtype(plan)
    return device_key(
        backend, device_name, dtype, device_type, plan.matmul_math if dtype == "float32" else None
    )


def device_key(backend: str, device_name: str, dtype: str, device_type: str, math: str | None = None) -> str:
    """What a measurement on this device depends on, as a cache key: host, backend, device, torch version, dtype,
    the fp32 math mode where given, and on a CPU the intra-op threads (torch.get_num_threads, which a run of several
    processes divides). The measured peak's and the calibration's caches are keyed by it."""
    import torch

    parts = [platform.node(), backend, device_name, f"torch {torch.__version__}", dtype]
    if math is not None:
        parts.append(math)
    if device_type == "cpu":
        parts.append(f"{torch.get_num_threads()} thread(s)")
    return ", ".join(parts)


def measured_peak(
    backend: Backend,
    device: torch.device,
    precision: PrecisionPlan,
    *,
    device_name: str | None = None,
    refresh: bool = False,
    cached_only: bool = False,
    budget_s: float = 1.0,
    directory: Path | None = None,
) -> PeakFigures | None:
    """The measured dense-matmul peak of ``device`` (bound by ``backend.setup_device``) for the math ``precision``
    uses, and its copy bandwidth, as :class:`~accelbench.devices.PeakFigures` with source
    ``measured: dense matmul N^3 DTYPE ...``; from the cache when this host, device, torch, dtype (and CPU thread
    count) were measured before, unless ``refresh``. None when the device cannot multiply in that dtype, or with
    ``cached_only`` when nothing is cached (nothing is then measured: the device need not be bound).

    The runner may call it where ``backend.peak_figures`` has no figure (a CPU), so MFU is reported against the
    measured rate, labelled as such. It takes a few seconds the first time (``budget_s`` per measurement).
    """
    if device_name is None:
        detected = backend.detect()
        index = device.index or 0
        device_name = detected[index].name if index < len(detected) else backend.name
    key = cache_key(backend.name, device_name, precision, device.type)
    folder = directory or cache_dir()
    cached = read_cache(folder / CACHE_FILE).get(key)
    if cached is not None and not refresh:
        try:
            figures = _figures(cached)
            if cached_only or not cached.get("contended"):
                return figures
        except (KeyError, TypeError, ValueError):
            cached = None  # an entry this version cannot read: measure again
    if cached_only:
        return None
    dtype = matmul_dtype(precision)
    before = cpu_usage()
    try:
        rate = time_matmul(device, dtype, backend.synchronize, budget_s)
        bandwidth = time_copy(device, backend.synchronize, budget_s / 2)
    except (RuntimeError, TypeError, NotImplementedError):  # the device has no matmul in this dtype
        return None
    after = cpu_usage()
    waiting, steal = after.waiting_since(before), after.steal_since(before)
    contended = any(f is not None and f >= CONTENDED_WAITING for f in (waiting, steal))
    if contended and cached is not None and not refresh and cached["flops_per_s"] >= rate.best_flops_per_s:
        return _figures(cached)  # busy again, and slower than before: the earlier (higher) rate stands
    entry = {
        "flops_per_s": rate.best_flops_per_s,
        "median_flops_per_s": rate.median_flops_per_s,
        "size": rate.size,
        "repeats": rate.repeats,
        "dtype": dtype,
        "memory_bandwidth_bytes_per_s": bandwidth,
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "key": key,
        "contended": contended,
        "waiting": waiting,
        "steal": steal,
    }
    entries = read_cache(folder / CACHE_FILE)
    entries[key] = entry
    _write_atomically(json.dumps(entries, indent=2, sort_keys=True), folder / CACHE_FILE)
    return _figures(entry)


def _figures(entry: dict[str, Any]) -> PeakFigures:
    n, dtype = entry["size"], entry["dtype"]
    busy = (
        f"; the host was busy meanwhile (threads waited {entry.get('waiting') or 0:.0%} of their ready time"
        + (f", the hypervisor stole {entry['steal']:.0%} of the cores' time" if entry.get("steal") else "")
        + "): a lower bound, measured again next time"
        if entry.get("contended")
        else ""
    )
    return PeakFigures(
        flops_per_s=float(entry["flops_per_s"]),
        memory_bandwidth_bytes_per_s=entry.get("memory_bandwidth_bytes_per_s"),
        source=(
            f"measured: dense matmul {n}x{n}x{n} {dtype}, best of {entry['repeats']} (median "
            f"{entry['median_flops_per_s'] / 1e12:.3g} TFLOP/s) on {entry['key']}, {entry['measured_at']}{busy}"
        ),
    )


def measured_since(entry: object, moment: datetime | None) -> bool:
    """Whether a cache entry (a calibration's or an engine cost's, as stored) was measured at or after ``moment``
    (to the second, as ``measured_at`` is written). False where ``moment`` is None or the entry has no time."""
    if moment is None or not isinstance(entry, dict) or not isinstance(entry.get("measured_at"), str):
        return False
    try:
        at = datetime.fromisoformat(entry["measured_at"])
    except ValueError:
        return False
    if at.tzinfo is None:
        at = at.replace(tzinfo=timezone.utc)
    return at >= moment.astimezone(timezone.utc).replace(microsecond=0)


def read_cache(path: Path) -> dict[str, Any]:
    """A cache file's entries (the measured peak's, ZeRO-3's engine cost); an unreadable or foreign file counts as
    empty (it is rewritten on the next store)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}
