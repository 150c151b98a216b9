"""The accelbench plugin contract, version 2.1: every hook a backend or workload plugin may implement.

A plugin is a module, a class (instantiated once when plugins load) or an object, registered under the
``accelbench`` entry-point group of its distribution. An object's methods are its hooks, so state a backend keeps
between hooks (an epoch's counters, an open library session) lives on the object, never in module globals::

    # pyproject.toml of accelbench-mydevice
    [project.entry-points.accelbench]
    mydevice = "accelbench_mydevice.plugin:MyDeviceBackend"

    # accelbench_mydevice/plugin.py
    from accelbench import hookimpl
    from accelbench.devices import BackendInfo

    class MyDeviceBackend:
        accelbench_contract = "2.1"          # the contract version this plugin implements

        @hookimpl
        def accelbench_backend(self) -> BackendInfo:
            return BackendInfo(name="mydevice", device_type="mydevice", device_unit="card", priority=100)

**Contract version.** A plugin declares ``accelbench_contract = "MAJOR.MINOR"`` (a module or object attribute).
The host loads it when MAJOR equals :data:`accelbench.CONTRACT_VERSION`'s and MINOR is not newer; otherwise, or
when the attribute is missing (a plugin written for contract 1), ``accelbench plugins`` reports it as failed,
saying which version it was built for, and none of its hooks is registered. Version 2.1 added the optional
``accelbench_known_devices``; a plugin that implements it declares ``"2.1"``.

**Who is called.** The registration hooks (``accelbench_backend``, ``accelbench_register_workloads``,
``accelbench_run_options``, ``accelbench_recorded_environment``) are called on every plugin. Every other hook is
called on the *selected* backend's plugin only. Where that plugin does not implement a hook, or (for hooks marked
*first result*) returns None, the core's stock-PyTorch implementation in ``accelbench.backends.defaults`` answers
instead (``torch.accelerator``, ``torch.distributed``'s default backend map), so a backend implements only what
differs for its vendor. Hooks that act rather than answer (``accelbench_synchronize``,
``accelbench_epoch_start``, ``accelbench_release_memory``) return nothing: implementing one replaces the default.

Rules for every backend hook:
- never import the vendor library at module import time; import it inside the hook, so the plugin loads
  (and reports "no device") on machines without the vendor stack;
- detection never raises and never initialises the device runtime in the calling process;
- raise ``accelbench.errors.BackendError`` (or ``ConfigError`` for a bad request) with an actionable message.

Hook implementations must be named exactly as below: a misspelled ``accelbench_*`` hook is rejected when the
plugin loads. ``ACCELBENCH_DEBUG=1`` traces every hook call (pluggy's tracing) on stderr.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from accelbench import hookspec

if TYPE_CHECKING:
    import torch

    from accelbench.config import RunOption
    from accelbench.devices import BackendInfo, DeviceInfo, EpochReadings, NoCollective, PeakFigures
    from accelbench.engine.executor import Executor, ExecutorRequest
    from accelbench.precision import PrecisionPlan
    from accelbench.workloads import Workload


# --------------------------------------------------------------------------------------------------------
# Registration (called on every plugin)
# --------------------------------------------------------------------------------------------------------


@hookspec
def accelbench_backend() -> BackendInfo | None:
    """The backend this plugin provides.

    :returns: its :class:`~accelbench.devices.BackendInfo`, or None when the plugin provides no backend (a
        workload-only plugin). Backend names are unique across installed plugins: a second plugin claiming a
        taken name is reported as failed, naming both distributions.
    """


@hookspec
def accelbench_register_workloads(register: Callable[[Workload], None]) -> None:
    """Register workloads.

    :param register: call it once per workload (an object following :class:`accelbench.workloads.Workload`).
        A duplicate workload name is an error naming both plugins.
    """


@hookspec
def accelbench_run_options() -> list[RunOption] | None:
    """Extra ``accelbench run`` options this backend reads (the CUDA plugin's TF32 policy, the IPU's replicas).

    :returns: :class:`~accelbench.config.RunOption` s with ``backend`` set to this backend's name. Values the user
        gives arrive, checked against each option's type and bounds, in ``RunConfig.backend_options`` (and so in
        ``ExecutorRequest.config``) and are recorded with the config; an option not given is absent, and the
        plugin applies (and records) its default. Names must not clash with core or workload options.
    """


@hookspec
def accelbench_recorded_environment() -> list[str] | None:
    """Environment variables that change this vendor's performance and belong in every record.

    :returns: variable names, or prefixes ending in ``*`` (``NCCL_*``). The values set in the run's environment
        are recorded in ``system.environment``; the core records its own (threads, scheduler) besides.
    """


# --------------------------------------------------------------------------------------------------------
# Detection (selected backend; also run for every backend by `accelbench info` and `accelbench plugins`)
# --------------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def accelbench_detect_devices() -> list[DeviceInfo] | None:
    """The devices of this backend present on this host. First result.

    Must be cheap, must not raise when the hardware or vendor library is absent, and must not initialise the
    device runtime in this process (forked workers break otherwise): use NVML-style queries or a subprocess.
    Backends are tried by descending ``BackendInfo.priority`` when ``--backend`` is absent; the first with a
    device wins.

    :returns: one :class:`~accelbench.devices.DeviceInfo` per device, [] when there are none.
    """


@hookspec(firstresult=True)
def accelbench_runtime_versions() -> dict[str, str] | None:
    """Versions worth recording: driver, runtime (CUDA, HIP, Level Zero, Poplar SDK), vendor libraries. First
    result. Must not initialise the device runtime when it is not already initialised (``accelbench info``)."""


# --------------------------------------------------------------------------------------------------------
# Device setup (in every worker process, before anything touches the device)
# --------------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def accelbench_setup_device(device_type: str, local_rank: int) -> torch.device | None:
    """Bind this process to its device. First result.

    :param device_type: ``BackendInfo.device_type`` of the selected backend.
    :param local_rank: this process's rank on its node (0 for a single process).
    :returns: the device, e.g. ``torch.device('cuda', 1)``. Apply launcher or vendor quirks here (visible-device
        variables, tile affinity). Default: set the current ``torch.accelerator`` index to ``local_rank``.
    """


# --------------------------------------------------------------------------------------------------------
# Collective backend
# --------------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def accelbench_collective_backend(device: torch.device) -> str | NoCollective | None:
    """The ``torch.distributed`` backend for ``device``. First result.

    :returns: its name ('gloo', 'nccl', 'xccl', 'ccl', ...), or :data:`accelbench.devices.NO_COLLECTIVE` for
        devices that replicate without torch.distributed (IPUs: one host process drives every replica).
        Default: ``torch.distributed.get_default_backend_for_device``.
    """


# --------------------------------------------------------------------------------------------------------
# Precision
# --------------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def accelbench_supported_precisions(device: torch.device) -> list[str] | None:
    """Precision names this device can run (from ``accelbench.precision.PRECISIONS``). First result.

    :param device: a device of this backend; before workers start it carries no index (the launcher asks
        without binding a device). A request for another precision is refused before the run, naming these.
    """


@hookspec(firstresult=True)
def accelbench_precision_plan(
    precision: str, device: torch.device, options: dict[str, str | int | float | bool]
) -> PrecisionPlan | None:
    """The plan for a supported precision: parameter and autocast dtypes, loss scaling and, above all, the
    matmul math really in effect (TF32 for "fp32" on NVIDIA when enabled, BF32 on Intel, ...). First result.

    :param options: the run's backend options (``RunConfig.backend_options``, e.g. a TF32 policy flag); a hook that
        needs none leaves the parameter out. Apply any global switch the plan implies (torch's TF32 flags) here,
        so what is recorded is what runs.
    """


# --------------------------------------------------------------------------------------------------------
# Strategy mapping
# --------------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def accelbench_supported_strategies() -> list[str] | None:
    """Strategy names this backend can build ('single', 'ddp', 'fsdp', 'deepspeed-zero1', 'pipelined', ...).
    Asking for another fails before launch, listing these. First result."""


@hookspec(firstresult=True)
def accelbench_executor(request: ExecutorRequest) -> Executor | None:
    """Build the executor for ``request.strategy``. First result.

    The executor owns model wrapping, the optimizer step and any compile step; the runner only calls its methods
    (see ``accelbench.engine.executor.Executor``). Strategies that split the model find its parts in the
    ``TrainingJob.units`` handed to ``Executor.setup``, never in its attributes. GPU-like backends return the
    core's torch executors (the default); an IPU backend returns a PopTorch one.
    """


# --------------------------------------------------------------------------------------------------------
# Timing and epochs
# --------------------------------------------------------------------------------------------------------


@hookspec
def accelbench_synchronize(device: torch.device) -> None:
    """Block until all queued work on ``device`` has finished. The runner calls it before every clock read that
    ends a timed region. Default: ``torch.accelerator.synchronize``."""


@hookspec
def accelbench_epoch_start(device: torch.device) -> None:
    """A timed epoch is about to start on ``device`` (outside the timed region): reset peak-memory counters and
    snapshot cumulative counters (energy, PCIe bytes) that :func:`accelbench_epoch_end` will difference. Keep that
    state on the plugin object, per device. Default: reset the ``torch.accelerator`` allocator peaks."""


@hookspec(firstresult=True)
def accelbench_epoch_end(device: torch.device) -> EpochReadings | None:
    """The epoch on ``device`` has ended (after its closing synchronisation, outside the timed region). First
    result.

    :returns: :class:`~accelbench.devices.EpochReadings`: peak memory since ``epoch_start`` (and what it measures);
        the energy the device's own counter saw over the epoch (``energy``: joules, the counter's domain, its
        source), None where no counter is readable, never a made-up figure; and telemetry measured over the epoch
        (``power_w``, ``utilization_pct``, ``pcie_*_bytes_per_s``) or read at its end (``temperature_c``,
        ``clock_sm_mhz``). An instantaneous reading now would describe an idle device: measure over the epoch.
    """


# --------------------------------------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------------------------------------


@hookspec
def accelbench_release_memory(device: torch.device) -> None:
    """Return the allocator's cached, unused memory of ``device`` to the device. Called when a run has ended and
    its objects are gone, so that the next run in the same process (an API user, a run after an out-of-memory)
    starts from what it allocates itself. Default: ``torch.accelerator.memory.empty_cache``."""


# --------------------------------------------------------------------------------------------------------
# Peak figures (for MFU and roofline ratios)
# --------------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def accelbench_peak_figures(device: DeviceInfo, precision: PrecisionPlan) -> PeakFigures | None:
    """Dense peak FLOP/s (and memory bandwidth) of one ``device`` for the math ``precision`` really uses, from a
    table the plugin owns. First result. None when unknown: MFU is then reported as unknown. The user's
    ``--peak-tflops`` overrides this."""


@hookspec(firstresult=True)
def accelbench_known_devices() -> list[DeviceInfo] | None:
    """The devices this backend's peak table knows, each as detection would report it, so that ``accelbench
    estimate --device NAME`` can predict for a system that is not here. First result. Contract 2.1; optional.

    :returns: one :class:`~accelbench.devices.DeviceInfo` per product: ``name``, ``arch`` and the ``details`` the
        plugin's own :func:`accelbench_peak_figures` keys on (so it answers for them as for a detected device),
        ``memory_bytes`` the datasheet capacity of one device (one GCD, tile or IPU where that is the unit), and in
        ``details`` a ``label`` as people name the product ("H100 SXM5") and comma-separated ``aliases`` that
        ``--device`` accepts ("H100,H100 SXM"). None (the default): this backend has no catalogue.
    """
