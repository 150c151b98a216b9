"""The accelbench plugin contract: every hook a backend or workload plugin may implement.

A backend plugin is an ordinary module (or object) registered under the ``accelbench`` entry-point group::

    # pyproject.toml of accelbench-mydevice
    [project.entry-points.accelbench]
    mydevice = "accelbench_mydevice.plugin"

    # accelbench_mydevice/plugin.py
    from accelbench import hookimpl
    from accelbench.config import RunOption
    from accelbench.devices import BackendInfo

    @hookimpl
    def accelbench_backend() -> BackendInfo:
        return BackendInfo(name="mydevice", device_type="mydevice", device_unit="card", priority=100)

Hooks are grouped below in the order a run calls them. Except for the two registration hooks, a hook is
called only on the *selected* backend's plugin, with the core's generic implementations (from
``accelbench.backends.defaults``, which use stock PyTorch: ``torch.accelerator``, ``torch.distributed``'s
default backend map) as the fallback. A backend therefore implements only what differs for its vendor.
Every hook marked "first result" stops at the first non-None result; return None to defer to the defaults.

Rules for every backend hook:
- never import the vendor library at module import time; import it inside the hook, so the plugin loads
  (and reports "no device") on machines without the vendor stack;
- detection never raises and never initialises the device runtime in the calling process;
- raise ``accelbench.errors.BackendError`` with an actionable message for a request that cannot work.

Hook implementations must be named exactly as below: a misspelled ``accelbench_*`` hook is rejected when
the plugin loads (see ``accelbench plugins``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from accelbench import hookspec

if TYPE_CHECKING:
    import torch

    from accelbench.config import RunOption
    from accelbench.devices import BackendInfo, DeviceInfo, MemoryStats, PeakFigures
    from accelbench.engine.executor import Executor, ExecutorRequest
    from accelbench.precision import PrecisionPlan
    from accelbench.workloads import Workload


# --------------------------------------------------------------------------------------------------------
# Registration (called on every plugin)
# --------------------------------------------------------------------------------------------------------


@hookspec
def accelbench_backend() -> BackendInfo | None:
    """Declare the backend this plugin provides, or return None if it provides none (a workload-only plugin).

    Called once per plugin when plugins load. Backend names must be unique across installed plugins: a
    second plugin claiming a taken name is reported as failed, naming both distributions.
    """


@hookspec
def accelbench_register_workloads(register: Callable[[Workload], None]) -> None:
    """Register workloads by calling ``register(workload)`` for each (see ``accelbench.workloads.Workload``).

    Called once on every plugin. Duplicate workload names are an error naming both plugins.
    """


@hookspec
def accelbench_run_options() -> list[RunOption] | None:
    """Declare extra ``accelbench run`` options this plugin reads (e.g. the IPU's replication factor).

    Called on every plugin when the command line is built. Values arrive in ``RunConfig.backend_options``
    (and so in ``ExecutorRequest.config``), are recorded with the config, and are ``None``-free: an option the
    user did not give is absent unless it has a default. Names must not clash with core options.
    """


# --------------------------------------------------------------------------------------------------------
# Detection (selected backend; also run for every backend by `accelbench info` and `accelbench plugins`)
# --------------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def accelbench_detect_devices() -> list[DeviceInfo] | None:
    """Return the devices of this backend present on this host (an empty list when there are none).

    Must be cheap, must not raise when the hardware or vendor library is absent, and must not initialise the
    device runtime in this process (forked workers break otherwise): use NVML-style queries or a subprocess.
    Backends are tried by descending ``BackendInfo.priority`` when ``--backend`` is absent; the first with a
    device wins. First result.
    """


@hookspec(firstresult=True)
def accelbench_runtime_versions() -> dict[str, str] | None:
    """Versions worth recording: driver, runtime (CUDA, HIP, Level Zero, Poplar SDK), vendor libraries. First result."""


# --------------------------------------------------------------------------------------------------------
# Device setup (in every worker process, before anything touches the device)
# --------------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def accelbench_setup_device(device_type: str, local_rank: int) -> torch.device | None:
    """Bind this process to its device for ``local_rank`` and return it (e.g. ``torch.device('cuda', 1)``).

    Apply launcher or vendor quirks here (visible-device variables, tile affinity). Default: set the
    current ``torch.accelerator`` index to ``local_rank``. First result.
    """


# --------------------------------------------------------------------------------------------------------
# Collective backend
# --------------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def accelbench_collective_backend(device: torch.device) -> str | None:
    """The ``torch.distributed`` backend name for this device ('gloo', 'nccl', 'xccl', 'ccl', ...).

    Return the string ``"none"`` for devices that replicate without torch.distributed (IPUs). Default:
    ``torch.distributed.get_default_backend_for_device``. First result.
    """


# --------------------------------------------------------------------------------------------------------
# Precision
# --------------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def accelbench_supported_precisions(device: torch.device) -> list[str] | None:
    """Precision names this device can run (from ``accelbench.precision.PRECISIONS``). A request for any
    other is refused before the run starts, naming these. First result.
    """


@hookspec(firstresult=True)
def accelbench_precision_plan(
    precision: str, device: torch.device, options: dict[str, str | int | float | bool]
) -> PrecisionPlan | None:
    """The plan for a supported precision: parameter and autocast dtypes, loss scaling and, above all, the
    matmul math really in effect (TF32 for "fp32" on NVIDIA when enabled, BF32 on Intel, ...).

    ``options`` are the run's plugin options (``RunConfig.backend_options``, e.g. a TF32 policy flag); a hook that
    needs none simply leaves the parameter out. Apply any global switch the plan implies (e.g. torch's TF32
    flags) here, so what is recorded is what runs. First result.
    """


# --------------------------------------------------------------------------------------------------------
# Strategy mapping
# --------------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def accelbench_supported_strategies() -> list[str] | None:
    """Strategy names this backend can build ('single', 'ddp', 'fsdp', 'deepspeed-zero1', 'pipelined', ...).
    Asking for another fails before launch, listing these. First result.
    """


@hookspec(firstresult=True)
def accelbench_executor(request: ExecutorRequest) -> Executor | None:
    """Build the executor for ``request.strategy``. The executor owns model wrapping, the optimizer step and
    any compile step; the runner only calls its methods (see ``accelbench.engine.executor.Executor``).
    GPU-like backends can return the core's torch executors; an IPU backend returns a PopTorch one. First result.
    """


# --------------------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def accelbench_synchronize(device: torch.device) -> bool | None:
    """Block until all queued work on ``device`` has finished; return True. The runner calls this before every
    clock read that ends a timed region. Default: ``torch.accelerator.synchronize``. First result.
    """


# --------------------------------------------------------------------------------------------------------
# Memory query
# --------------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def accelbench_reset_peak_memory(device: torch.device) -> bool | None:
    """Reset the peak-memory counters of ``device``; return True. Called before each timed epoch. First result."""


@hookspec(firstresult=True)
def accelbench_memory_stats(device: torch.device) -> MemoryStats | None:
    """Peak memory since the last reset, and the device total. Unknown figures are None, never estimated.
    First result.
    """


@hookspec(firstresult=True)
def accelbench_release_memory(device: torch.device) -> bool | None:
    """Return the allocator's cached, unused memory of ``device`` to the device; return True. Called when a run
    has ended and its record's memory figures are read, so that the next run in the same process (an API user,
    a run after an out-of-memory) starts from what it allocates itself. First result.
    """


@hookspec(firstresult=True)
def accelbench_device_telemetry(device: torch.device) -> dict[str, float] | None:
    """Device readings worth recording after each epoch, from the vendor's management library: e.g.
    ``power_w``, ``utilization_pct``, ``temperature_c``, ``pcie_rx_bytes_per_s``, ``pcie_tx_bytes_per_s``,
    ``clock_sm_mhz``. Called after an epoch's closing synchronisation, outside the timed region. Return None
    (the default) when the backend has no such library; never raise for a missing library. First result.
    """


# --------------------------------------------------------------------------------------------------------
# Peak figures (for MFU and roofline ratios)
# --------------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def accelbench_peak_figures(device: DeviceInfo, precision: PrecisionPlan) -> PeakFigures | None:
    """Dense peak FLOP/s (and memory bandwidth) of one ``device`` for the math ``precision`` really uses, from a
    table the plugin owns. Return None when unknown: MFU is then reported as unknown. The user's
    ``--peak-tflops`` overrides this. First result.
    """
