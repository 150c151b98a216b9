"""The backend: one object per accelerator kind, whose methods are what a run asks of the device.

Every method of :class:`Backend` is the stock-PyTorch behaviour for any device (``torch.accelerator``, torch's
default collective map, inductor, foreach clipping, the fused optimizers torch has for the device). A vendor
subclasses it, sets :attr:`Backend.info`, implements :meth:`Backend.detect_devices` and overrides only what differs
for its device, calling ``super()`` where it adjusts the stock answer rather than replacing it::

    class GaudiBackend(Backend):
        info = BackendInfo(name="gaudi", device_type="hpu", device_unit="HPU (one Gaudi card)", priority=100)

        def detect_devices(self) -> list[DeviceInfo]: ...

        def after_backward(self, device: torch.device) -> None:
            htcore.mark_step()          # lazy mode: cut the graph here

        def compile_backend(self) -> str | None:
            return "hpu_backend"

Methods are grouped in the order a run calls them. The rules for every method:

- never import the vendor library at module import time; import it inside the method, so the plugin loads (and
  reports "no device") on machines without the vendor stack;
- detection never raises and never initialises the device runtime in the calling process;
- raise :class:`accelbench.errors.BackendError` (or ``ConfigError`` for a bad request) with an actionable message.

Nothing here imports the engine: the core's executors reach a backend through :class:`ExecutorRequest`, whose
``default_executor`` builds the stock executor, so :meth:`Backend.executor` can wrap it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from accelbench.contract.options import RunOption, Scalar
from accelbench.contract.precision import (
    FP8_PRECISIONS,
    FP8_REQUIREMENT,
    MX_PRECISIONS,
    MX_REQUIREMENT,
    PRECISIONS,
    PrecisionPlan,
    standard_plan,
)
from accelbench.contract.records import (
    NO_COLLECTIVE,
    BackendInfo,
    DeviceInfo,
    EpochReadings,
    MemoryStats,
    NoCollective,
    PeakFigures,
    allocator_memory,
)
from accelbench.contract.strategies import STRATEGIES
from accelbench.errors import BackendError, ConfigError

if TYPE_CHECKING:
    import torch

    from accelbench.config import RunConfig
    from accelbench.contract.executor import Executor, ExecutorRequest, World

OptimizerImplementation = Literal["fused", "foreach", "plain"]


# dtypes torch.distributed's stock collectives (gloo, nccl, xccl) reduce
COLLECTIVE_DTYPES: tuple[str, ...] = ("float64", "float32", "bfloat16", "float16", "int64", "int32")

# Lightning's accelerator names for torch device types it ships an accelerator for
LIGHTNING_ACCELERATORS = {"cpu": "cpu", "cuda": "cuda", "mps": "mps", "xla": "tpu"}


class Backend:
    """One accelerator kind. Subclass it; the host makes one instance per run of ``accelbench`` and keeps state a
    backend holds between calls (an epoch's counters, an open library session) on it, never in module globals."""

    info: ClassVar[BackendInfo]
    """What this backend is: its ``--backend`` name, torch device type, what one device is, detection priority."""

    strategies: ClassVar[tuple[str, ...]] = STRATEGIES
    """Every strategy this backend can build on some device of its kind (what ``run --help`` lists, asked without
    importing torch); :meth:`supported_strategies` narrows it per device."""

    def __init__(self) -> None:
        self._devices: list[DeviceInfo] | None = None
        self.detect_error: str | None = None

    @property
    def name(self) -> str:
        return self.info.name

    # ---------------------------------------------------------------------------------------------------------
    # What the command line and the record need before any run
    # ---------------------------------------------------------------------------------------------------------

    def run_options(self) -> list[RunOption]:
        """Extra ``accelbench run`` options this backend reads (a TF32 policy, the IPU's replicas, Gaudi's lazy
        mode), each with ``backend`` set to this backend's name. Values a user gives arrive, checked against each
        option's type and bounds, in ``RunConfig.backend_options``; an option not given is absent, and the backend
        applies (and records) its default. Names must not clash with core or workload options."""
        return []

    def recorded_environment(self) -> list[str]:
        """Environment variables that change this vendor's performance, recorded in every record: names, or
        prefixes ending in ``*`` (``NCCL_*``)."""
        return []

    # ---------------------------------------------------------------------------------------------------------
    # Detection: cheap, never raises, never initialises the runtime in this process
    # ---------------------------------------------------------------------------------------------------------

    def detect_devices(self) -> list[DeviceInfo]:
        """The devices of this backend present on this host, [] when there are none. Use management-library
        queries (NVML, amdsmi, hlml) or a subprocess (:func:`accelbench.devices.probe_in_subprocess`): a process
        that initialised the device runtime cannot fork workers that use it. Stock: none (a backend must say)."""
        return []

    def detect(self) -> list[DeviceInfo]:
        """:meth:`detect_devices`, asked once per backend (selection, preflight and the record all ask; a probe
        may cost a subprocess); [] when detection failed, the failure kept in :attr:`detect_error`. Not for
        overriding."""
        if self._devices is None:
            try:
                found = self.detect_devices()
                if not isinstance(found, list) or not all(isinstance(d, DeviceInfo) for d in found):
                    raise BackendError(
                        f"detect_devices returned {type(found).__name__}, not a list of DeviceInfo"
                    )
                self._devices = list(found)
            except Exception as exc:  # detection must never break a command
                self.detect_error = f"{type(exc).__name__}: {exc}"
                self._devices = []
        return list(self._devices)

    def runtime_versions(self) -> dict[str, str]:
        """Versions worth recording: driver, runtime, vendor libraries. Must not initialise the runtime."""
        return {}

    def known_devices(self) -> list[DeviceInfo]:
        """The products this backend's peak table knows, each as detection would report it (``details`` holding
        a ``label`` and comma-separated ``aliases``), so ``accelbench estimate --device NAME`` can predict for a
        system that is not here. Stock: none."""
        return []

    def device_profiles(self) -> list[str]:
        """Device profiles this plugin ships as data: each the JSON text of a profile measured on one of its devices
        (``accelbench calibrate --export FILE`` on that device, with its provenance), which ``accelbench estimate
        --device NAME`` prices a step with in place of one derived from the datasheet. Read them with
        ``importlib.resources`` from the plugin's own package. Stock: none."""
        return []

    # ---------------------------------------------------------------------------------------------------------
    # Device setup (in every worker process, before anything touches the device)
    # ---------------------------------------------------------------------------------------------------------

    def device_kind(self) -> torch.device:
        """This backend's device type as an index-less ``torch.device``: what the core asks about before a device is
        bound (which precisions and strategies it runs, what it costs). A device type torch learns from the vendor's
        package (PrivateUse1: ``npu``, ...) is known to torch only once that package is imported: import it here
        (torch's ``torch.backends`` entry-point autoload may do it too, but not where autoload is off,
        ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``, or the package is absent). Nothing in the core or the conformance kit
        builds a ``torch.device`` of this type any other way before :meth:`setup_device`. Stock: the type as
        declared, and a clear error where torch does not know it. Since contract 3.3."""
        import torch

        try:
            return torch.device(self.info.device_type)
        except RuntimeError as exc:
            raise RuntimeError(
                f"torch {torch.__version__} does not know device type {self.info.device_type!r} ({exc}): the "
                f"{self.info.name} backend must import the vendor package that registers it, in device_kind()"
            ) from None

    def setup_device(self, world: World, options: Mapping[str, Scalar]) -> torch.device:
        """Bind this process to its device and return it. ``world`` is where the launcher put this process (rank,
        local rank, processes on this node, nodes); ``options`` are the run's backend options, so a mode switch (a
        lazy or eager mode) can be a run option. Apply launcher or vendor quirks here. Stock: the current
        ``torch.accelerator`` index set to the local rank."""
        import torch

        if self.info.device_type == "cpu":
            return torch.device("cpu")
        _accelerator().set_device_index(world.local_rank)
        return torch.device(self.info.device_type, world.local_rank)

    # ---------------------------------------------------------------------------------------------------------
    # Collectives
    # ---------------------------------------------------------------------------------------------------------

    def collective_backend(self, device: torch.device) -> str | NoCollective:
        """The ``torch.distributed`` backend for ``device`` ('gloo', 'nccl', 'xccl', 'hccl', ...), or
        :data:`~accelbench.contract.NO_COLLECTIVE` for devices that replicate without torch.distributed (IPUs).
        Stock: ``torch.distributed.get_default_backend_for_device``; on a CUDA build without NCCL, gloo."""
        import torch.distributed as dist

        if hasattr(dist, "get_default_backend_for_device"):  # torch >= 2.6
            try:
                name = str(dist.get_default_backend_for_device(device))
            except (RuntimeError, ValueError):  # a device type torch registered no collective for
                name = "gloo"
        else:
            name = {"cpu": "gloo", "cuda": "nccl"}.get(device.type, "gloo")
        available = getattr(dist, "is_backend_available", None)
        if device.type == "cuda" and name != "gloo" and available is not None and not available(name):
            return "gloo"
        return name

    def collective(self, device: torch.device) -> str | None:
        """:meth:`collective_backend` as the host uses it: the backend's name, or None where the device replicates
        without torch.distributed. Not for overriding."""
        answer = self.collective_backend(device)
        if answer is NO_COLLECTIVE:
            return None
        if not isinstance(answer, str):
            raise BackendError(
                f"backend {self.name!r}: collective_backend returned {type(answer).__name__}, not a name or NO_COLLECTIVE"
            )
        return answer

    def collective_dtypes(self, device: torch.device) -> tuple[str, ...]:
        """dtype names (``float64``, ``float32``, ...) this device's collective reduces. The runner reduces its
        own figures (epoch times) in float64 where listed, else in float32."""
        return COLLECTIVE_DTYPES

    # ---------------------------------------------------------------------------------------------------------
    # Precision
    # ---------------------------------------------------------------------------------------------------------

    def supported_precisions(self, device: torch.device) -> list[str]:
        """Precision names this device can run; another is refused before the run, naming these. ``device`` may
        carry no index (the launcher asks before binding one). Stock: the standard names; FP8 (``fp8-*``) only where
        a backend declares it, since it needs FP8 matrix units and torchao (the CUDA plugin on compute capability
        >= 8.9); likewise MX (``mxfp8``), which needs MX matrix units (the CUDA plugin on Blackwell)."""
        return [name for name in PRECISIONS if name not in FP8_PRECISIONS and name not in MX_PRECISIONS]

    def precision_plan(
        self, precision: str, device: torch.device, options: Mapping[str, Scalar]
    ) -> PrecisionPlan:
        """The plan for a supported precision: parameter and autocast dtypes, loss scaling and, above all, the
        matmul math really in effect (TF32 for "fp32" on NVIDIA when enabled, BF32 on Intel). Apply any global
        switch the plan implies here, so that what is recorded is what runs. Stock: torch's float32 matmul
        precision setting."""
        import torch

        mode = torch.get_float32_matmul_precision()
        return standard_plan(precision, matmul_math="ieee-fp32" if mode == "highest" else f"reduced ({mode})")

    def check_precision(self, precision: str, device: torch.device) -> None:
        """ConfigError naming the supported precisions when ``precision`` is not one. Not for overriding."""
        supported = self.supported_precisions(device)
        if precision in FP8_PRECISIONS and precision not in supported:
            raise ConfigError(
                f"backend {self.name!r} does not support precision {precision!r} on {device}: this device has no "
                f"FP8 training here; FP8 training needs {FP8_REQUIREMENT}. On this device use one of: "
                f"{', '.join(supported)}"
            )
        if precision in MX_PRECISIONS and precision not in supported:
            raise ConfigError(
                f"backend {self.name!r} does not support precision {precision!r} on {device}: this device has no "
                f"MX training here; MX training needs {MX_REQUIREMENT}. On this device use one of: "
                f"{', '.join(supported)}"
            )
        if precision not in supported:
            raise ConfigError(
                f"backend {self.name!r} does not support precision {precision!r} on {device}; "
                f"it supports: {', '.join(supported)}"
            )

    # ---------------------------------------------------------------------------------------------------------
    # Strategies and the executor
    # ---------------------------------------------------------------------------------------------------------

    def supported_strategies(self, device: torch.device) -> list[str]:
        """Strategy names this backend can build on ``device`` (an index-less device before launch). Asking for
        another fails before launch, listing these. Stock: :attr:`strategies`."""
        return list(self.strategies)

    def check_strategy(self, strategy: str, device: torch.device) -> None:
        """ConfigError listing the supported strategies when ``strategy`` is not one. Not for overriding."""
        supported = self.supported_strategies(device)
        if strategy not in supported:
            raise ConfigError(
                f"backend {self.name!r} does not support strategy {strategy!r}; it supports: {', '.join(supported)}"
            )

    def check_run(self, config: RunConfig) -> None:
        """Refuse, before anything starts, a run this backend cannot do as configured (a compile mode its compiler
        lacks, an option combination its runtime rejects), raising ``ConfigError`` that says what would work. Called
        by the preflight once the run's options are resolved (``config.backend_options`` holds the given ones).
        Stock: nothing to refuse."""

    def executor(self, request: ExecutorRequest) -> Executor:
        """The executor for ``request.strategy``. Stock: the core's (``request.default_executor``): single, DDP,
        FSDP2, DeepSpeed ZeRO, tensor/pipeline/mesh, Lightning; they call this backend's step boundaries, clipping
        and compile. An IPU-like backend returns its own; one that adjusts the stock executor wraps
        ``super().executor(request)``."""
        if request.default_executor is None:
            raise BackendError(
                f"backend {self.name!r}: no core executor was offered for {request.strategy!r}"
            )
        return request.default_executor(request)

    def lightning_accelerator(self) -> Any:
        """What ``lightning.Fabric(accelerator=...)`` takes for this device (``--engine lightning``): a name
        Lightning knows or an ``Accelerator`` instance (lightning-habana's ``HPUAccelerator()``). None: Lightning
        cannot drive this device, and ``--engine lightning`` is refused."""
        return LIGHTNING_ACCELERATORS.get(self.info.device_type)

    # ---------------------------------------------------------------------------------------------------------
    # The training step (called by every executor)
    # ---------------------------------------------------------------------------------------------------------

    def optimizer_implementation(self, device: torch.device) -> OptimizerImplementation:
        """Which optimizer kernels the workload's optimizer uses on ``device``: 'fused' (one kernel for every
        parameter), 'foreach' (grouped kernels) or 'plain' (a loop over parameters). Stock: fused where torch has
        fused kernels for the device type, else foreach. torch lists its PrivateUse1 type (a vendor's ``npu``, ...)
        among the fused ones whether or not the vendor wrote them: for that type the stock answer is foreach;
        a backend whose package has fused AdamW kernels overrides this to say 'fused'."""
        import torch

        try:
            from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

            fused = set(_get_fused_kernels_supported_devices())
        except ImportError:  # older torch: the devices that had fused AdamW
            fused = {"cuda"}
        fused.discard(torch._C._get_privateuse1_backend_name())
        return "fused" if device.type in fused else "foreach"

    def clip_grad_norm(self, parameters: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
        """Clip gradients to ``max_norm`` by their global norm and return the norm. Stock:
        ``torch.nn.utils.clip_grad_norm_`` with foreach kernels unless the optimizer implementation is 'plain'
        (torch refuses foreach on devices without foreach support)."""
        import torch

        params = list(parameters)
        device = next((p.device for p in params), torch.device("cpu"))
        foreach = self.optimizer_implementation(device) != "plain"
        return torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=foreach)

    def after_backward(self, device: torch.device) -> None:
        """After each backward pass (each micro-batch with ``--grad-accum``). A lazy device cuts its graph here
        (Gaudi's ``htcore.mark_step()``). Stock: nothing."""

    def after_optimizer_step(self, device: torch.device) -> None:
        """After each optimizer step. A lazy device cuts and runs its graph here (``mark_step``). Stock: nothing."""

    def end_of_step(self, device: torch.device) -> None:
        """After each training step, called by the runner once the executor's ``train_step`` returned (lazy
        devices: PyTorch/XLA's ``torch_xla.sync()``). Must not wait for the device. Stock: nothing."""

    def compile_backend(self) -> str | None:
        """The ``torch.compile`` backend for ``--compile`` ('inductor', 'hpu_backend', 'openxla'), or None
        where this device cannot compile (``--compile`` is then refused). Recorded with the run."""
        return "inductor"

    def compile_options(self, mode: str) -> dict[str, Any]:
        """Keyword arguments for ``torch.compile`` besides the backend, for ``--compile-mode`` ``mode``. Stock:
        inductor's mode (``None`` for 'default') and static shapes: an epoch's smaller last batch gets its own
        graph rather than turning every later step into a dynamic-shape graph."""
        return {"mode": None if mode == "default" else mode, "dynamic": False}

    def compile_model(self, model: torch.nn.Module, mode: str) -> torch.nn.Module:
        """``model`` compiled for ``--compile`` (``torch.compile`` with :meth:`compile_backend` and
        :meth:`compile_options`)."""
        import torch

        backend = self.compile_backend()
        if backend is None:
            raise ConfigError(f"backend {self.name!r} cannot compile; drop --compile")
        compiled: torch.nn.Module = torch.compile(model, backend=backend, **self.compile_options(mode))  # type: ignore[assignment]
        return compiled

    # ---------------------------------------------------------------------------------------------------------
    # Timing, epochs and memory
    # ---------------------------------------------------------------------------------------------------------

    def synchronize(self, device: torch.device) -> None:
        """Block until all queued work on ``device`` has finished; called before every clock read that ends a
        timed region. Stock: ``torch.accelerator.synchronize``."""
        if device.type != "cpu":
            _accelerator().synchronize(device)

    def epoch_start(self, device: torch.device) -> None:
        """A timed epoch is about to start (outside the timed region): reset peak-memory counters and snapshot the
        cumulative counters (energy) that :meth:`epoch_end` differences. Stock: reset the allocator peaks."""
        if device.type != "cpu":
            _accelerator().memory.reset_peak_memory_stats(device)

    def epoch_end(self, device: torch.device) -> EpochReadings:
        """The epoch has ended (after its closing synchronisation): peak memory since :meth:`epoch_start` and what
        it measures; the energy the device's own counter saw (None where none is readable, never a made-up
        figure); telemetry measured over the epoch. Stock: the ``torch.accelerator`` allocator peak."""
        if device.type == "cpu":  # torch keeps no allocator statistics for CPU tensors
            return EpochReadings(
                memory=MemoryStats(peak_bytes=None, source="unknown (the backend measures no memory)")
            )
        memory = _accelerator().memory
        total = int(memory.get_memory_info(device)[1]) if hasattr(memory, "get_memory_info") else None
        return EpochReadings(memory=allocator_memory(memory, device, "torch allocator", total=total))

    def release_memory(self, device: torch.device) -> None:
        """Return the allocator's cached, unused memory to the device once a run has ended, so the next run in
        the same process starts from what it allocates itself. Stock: ``torch.accelerator.memory.empty_cache``."""
        if device.type != "cpu":
            _accelerator().memory.empty_cache()

    # ---------------------------------------------------------------------------------------------------------
    # Peak figures (MFU, roofline)
    # ---------------------------------------------------------------------------------------------------------

    def peak_figures(self, device: DeviceInfo, precision: PrecisionPlan) -> PeakFigures | None:
        """Dense peak FLOP/s (and memory bandwidth) of one ``device`` for the math ``precision`` really uses, from
        a table the backend owns; None when unknown (a CPU's is then measured). ``--peak-tflops`` overrides it."""
        return None


def _accelerator() -> Any:
    """``torch.accelerator`` (torch >= 2.6 with its memory API from 2.8). Backends for older torch builds (poptorch
    pins torch 2.0) override the methods that use it; reaching it on such a build is a clear error."""
    import torch

    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None or not hasattr(accelerator, "memory"):
        raise BackendError(
            f"torch {torch.__version__} has no torch.accelerator memory API (torch >= 2.8); upgrade torch, "
            "or use a backend that overrides device setup, synchronisation and memory itself"
        )
    return accelerator


__all__ = ["COLLECTIVE_DTYPES", "NO_COLLECTIVE", "Backend", "OptimizerImplementation"]
