"""Faithful stand-ins of Habana's PyTorch bridge (``habana_frameworks.torch``) and HLML (``pyhlml``).

They enforce what Habana documents, so a backend that breaks a rule fails here as it would on a Gaudi:

- the bridge reads ``PT_HPU_LAZY_MODE`` once, when ``habana_frameworks.torch`` is first imported;
- in lazy mode, the graph accumulated since the last ``htcore.mark_step()`` is cut after ``loss.backward()`` (before
  ``optimizer.step()``) and after ``optimizer.step()`` (before the next forward), as Habana's training examples do.
  The real bridge does not raise when a call is missing: its graph grows until a value is read on the host, so the
  step runs slow and holds memory. The stand-in raises instead, naming the missing call, so that an omission is
  caught by a test rather than by a slow benchmark. The tensors stay on the CPU (there is no HPU here); the rule is
  enforced on the training loop's structure, through torch's global optimizer and module hooks;
- ``FusedClipNorm`` clips by the global norm and counts its calls; HCCL registers by import;
- HLML must be initialised before any query; its energy counter (mJ) only grows; handles come from valid indices.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

MODULES = (
    "habana_frameworks",
    "habana_frameworks.torch",
    "habana_frameworks.torch.core",
    "habana_frameworks.torch.hpu",
    "habana_frameworks.torch.distributed",
    "habana_frameworks.torch.distributed.hccl",
    "habana_frameworks.torch.hpex",
    "habana_frameworks.torch.hpex.normalization",
)


class LazyModeError(RuntimeError):
    pass


@dataclass
class Bridge:
    """The fake bridge's state: the mode it read at import, the mark_step calls, the rule's bookkeeping."""

    lazy: bool
    devices: int = 8
    mark_steps: int = 0
    clips: int = 0
    synchronized: int = 0
    graph_open: bool = False  # operations issued since the last mark_step (a forward started one)
    step_uncut: bool = False  # an optimizer step not yet followed by mark_step
    peak: int = 0
    allocated: int = 0
    hooks: list[Any] = field(default_factory=list)

    def mark_step(self) -> None:
        self.mark_steps += 1
        self.graph_open = False
        self.step_uncut = False


def install(lazy_env: str | None = None, devices: int = 8) -> Bridge:
    """Put the fake bridge in ``sys.modules`` as an import would, reading PT_HPU_LAZY_MODE now (as the real one
    reads it once). Returns its state; :func:`uninstall` removes it and its hooks."""
    if lazy_env is not None:
        os.environ["PT_HPU_LAZY_MODE"] = lazy_env
    lazy = os.environ.get("PT_HPU_LAZY_MODE", "1") != "0"
    bridge = Bridge(lazy=lazy, devices=devices)
    root = types.ModuleType("habana_frameworks")
    pt = types.ModuleType("habana_frameworks.torch")
    pt.__version__ = "1.22.0-stand-in"  # type: ignore[attr-defined]
    core = types.ModuleType("habana_frameworks.torch.core")
    core.mark_step = bridge.mark_step  # type: ignore[attr-defined]
    hpu = types.ModuleType("habana_frameworks.torch.hpu")
    hpu.is_available = lambda: bridge.devices > 0  # type: ignore[attr-defined]
    hpu.device_count = lambda: bridge.devices  # type: ignore[attr-defined]
    hpu.current_device = lambda: 0  # type: ignore[attr-defined]
    hpu.synchronize = lambda: setattr(bridge, "synchronized", bridge.synchronized + 1)  # type: ignore[attr-defined]
    hpu.max_memory_allocated = lambda device=None: bridge.peak  # type: ignore[attr-defined]
    hpu.memory_allocated = lambda device=None: bridge.allocated  # type: ignore[attr-defined]
    hpu.reset_peak_memory_stats = lambda device=None: setattr(bridge, "peak", bridge.allocated)  # type: ignore[attr-defined]
    hpu.memory_stats = lambda device=None: {  # type: ignore[attr-defined]
        "Limit": 94 * 2**30, "InUse": bridge.allocated, "MaxInUse": bridge.peak,
    }  # fmt: skip
    hpu.empty_cache = lambda: None  # type: ignore[attr-defined]
    dist = types.ModuleType("habana_frameworks.torch.distributed")
    hccl = types.ModuleType("habana_frameworks.torch.distributed.hccl")
    hpex = types.ModuleType("habana_frameworks.torch.hpex")
    normalization = types.ModuleType("habana_frameworks.torch.hpex.normalization")

    class FusedClipNorm:
        """Habana's fused clipping: built over the parameters and a max norm; ``clip_norm`` returns the norm."""

        def __init__(self, parameters: Any, max_norm: float) -> None:
            self.max_norm = max_norm

        def clip_norm(self, parameters: Any) -> torch.Tensor:
            bridge.clips += 1
            return torch.nn.utils.clip_grad_norm_(list(parameters), self.max_norm, foreach=False)

    normalization.FusedClipNorm = FusedClipNorm  # type: ignore[attr-defined]
    for name, module in zip(MODULES, (root, pt, core, hpu, dist, hccl, hpex, normalization), strict=True):
        sys.modules[name] = module
    root.torch = pt  # type: ignore[attr-defined]
    pt.core, pt.hpu, pt.distributed, pt.hpex = core, hpu, dist, hpex  # type: ignore[attr-defined]
    dist.hccl, hpex.normalization = hccl, normalization  # type: ignore[attr-defined]
    if lazy:
        _enforce_lazy_rules(bridge)
    return bridge


def _enforce_lazy_rules(bridge: Bridge) -> None:
    from torch.nn.modules.module import register_module_forward_pre_hook
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    def forward(module: torch.nn.Module, args: Any) -> None:
        if bridge.step_uncut:
            raise LazyModeError(
                "Gaudi lazy mode: a forward pass after optimizer.step() without htcore.mark_step() in between "
                "(the optimizer's graph was never cut)"
            )
        bridge.graph_open = True

    def before_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if bridge.graph_open:
            raise LazyModeError(
                "Gaudi lazy mode: optimizer.step() with the backward graph not cut: call htcore.mark_step() after "
                "loss.backward()"
            )

    def after_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        bridge.step_uncut = True

    bridge.hooks = [
        register_module_forward_pre_hook(forward),
        register_optimizer_step_pre_hook(before_step),
        register_optimizer_step_post_hook(after_step),
    ]


def uninstall(bridge: Bridge | None = None) -> None:
    for name in MODULES:
        sys.modules.pop(name, None)
    for hook in bridge.hooks if bridge else []:
        hook.remove()


@contextmanager
def bridge_installed(lazy_env: str | None = "1", devices: int = 8) -> Iterator[Bridge]:
    saved = os.environ.get("PT_HPU_LAZY_MODE")
    bridge = install(lazy_env, devices)
    try:
        yield bridge
    finally:
        uninstall(bridge)
        if saved is None:
            os.environ.pop("PT_HPU_LAZY_MODE", None)
        else:
            os.environ["PT_HPU_LAZY_MODE"] = saved


# --------------------------------------------------------------------------------------------------------------
# HLML
# --------------------------------------------------------------------------------------------------------------


class HLMLError(Exception):
    pass


@dataclass
class FakeDevice:
    name: str = "HL-325L"
    module_id: int = 0
    uuid: str = "01P0-HL3090A0-18-U4V193-22-07-00"
    total: int = 128 * 10**9
    used: int = 2 * 2**30
    energy_mj: int = 1_000_000
    temperature: float = 41.0
    utilization: float = 87.0


@dataclass
class Utilization:
    aip: float


@dataclass
class Memory:
    total: int
    used: int
    free: int


class FakeHLML(types.ModuleType):
    """``pyhlml`` as documented: init first, handles by index, NVML-like queries; the energy counter grows by
    ``energy_step_mj`` at every read."""

    HLML_TEMPERATURE_ON_AIP = 0

    def __init__(self, devices: list[FakeDevice], energy_step_mj: int = 5000) -> None:
        super().__init__("pyhlml")
        self.devices = devices
        self.energy_step_mj = energy_step_mj
        self.initialised = False

    def _check(self) -> None:
        if not self.initialised:
            raise HLMLError("HLML_ERROR_UNINITIALIZED")

    def hlmlInit(self) -> None:
        self.initialised = True

    def hlmlShutdown(self) -> None:
        self.initialised = False

    def hlmlDeviceGetCount(self) -> int:
        self._check()
        return len(self.devices)

    def hlmlDeviceGetHandleByIndex(self, index: int) -> FakeDevice:
        self._check()
        if not 0 <= index < len(self.devices):
            raise HLMLError("HLML_ERROR_INVALID_ARGUMENT")
        return self.devices[index]

    def hlmlDeviceGetName(self, handle: FakeDevice) -> bytes:
        self._check()
        return handle.name.encode()

    def hlmlDeviceGetModuleID(self, handle: FakeDevice) -> int:
        return handle.module_id

    def hlmlDeviceGetUUID(self, handle: FakeDevice) -> str:
        return handle.uuid

    def hlmlDeviceGetMemoryInfo(self, handle: FakeDevice) -> Memory:
        self._check()
        return Memory(handle.total, handle.used, handle.total - handle.used)

    def hlmlDeviceGetTotalEnergyConsumption(self, handle: FakeDevice) -> int:
        self._check()
        handle.energy_mj += self.energy_step_mj
        return handle.energy_mj

    def hlmlDeviceGetTemperature(self, handle: FakeDevice, sensor: int) -> float:
        return handle.temperature

    def hlmlDeviceGetUtilizationRates(self, handle: FakeDevice) -> Utilization:
        return Utilization(handle.utilization)

    def hlmlGetDriverVersion(self) -> str:
        return "1.22.0-fake"


def install_hlml(devices: list[FakeDevice] | None = None) -> FakeHLML:
    fake = FakeHLML(
        devices if devices is not None else [FakeDevice(module_id=i, uuid=f"gaudi-{i}") for i in range(8)]
    )
    sys.modules["pyhlml"] = fake
    return fake
