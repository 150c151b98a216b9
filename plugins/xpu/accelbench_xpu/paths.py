"""Which Intel software path runs: modern (stock ``torch.xpu`` + ``xccl``) or legacy (IPEX + oneCCL, ``ccl``).

Intel moved XPU support into stock PyTorch (``torch.xpu`` from 2.5, the ``xccl`` collective backend from 2.8) and
ended feature work on Intel Extension for PyTorch and the oneCCL bindings; older clusters still run those. The
rule, recorded with every run:

- device: stock ``torch.xpu`` when torch was built with it; otherwise Intel Extension for PyTorch
  (``intel_extension_for_pytorch``), which adds ``torch.xpu`` when imported;
- collective: ``xccl`` when torch has it; otherwise ``ccl`` from the oneCCL bindings
  (``oneccl_bindings_for_pytorch``), which registers it when imported;
- ``ACCELBENCH_XPU_PATH=legacy`` forces IPEX and ``ccl`` where both stacks are installed (``modern`` forces the
  stock path).

Only ``importlib.util.find_spec`` is used to see what is installed: importing IPEX initialises its runtime.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from accelbench.errors import ConfigError

PATH_ENV = "ACCELBENCH_XPU_PATH"
IPEX = "intel_extension_for_pytorch"
ONECCL = "oneccl_bindings_for_pytorch"


@dataclass(frozen=True)
class XpuPath:
    """The software path a run takes. ``device`` None: this torch cannot drive Intel GPUs at all."""

    device: str | None  # "torch.xpu" (stock) or "ipex" (Intel Extension for PyTorch)
    collective: str | None  # "xccl", "ccl", or None when neither is installed

    @property
    def legacy(self) -> bool:
        return self.device == "ipex" or self.collective == "ccl"

    def describe(self) -> str:
        device = {"torch.xpu": "stock torch.xpu", "ipex": "Intel Extension for PyTorch"}.get(
            self.device or "", "none"
        )
        collective = {"xccl": "xccl (stock torch.distributed)", "ccl": "ccl (oneCCL bindings)"}.get(
            self.collective or "", "none"
        )
        return f"{'legacy' if self.legacy else 'modern'}: device {device}, collective {collective}"


def resolve(
    environ: Mapping[str, str] = os.environ,
    torch_has_xpu: bool | None = None,
    xccl_available: bool | None = None,
    installed: Callable[[str], Any] | None = None,
) -> XpuPath:
    """The path this process takes (arguments default to what this torch and environment have;
    ``installed(module)`` answers like ``importlib.util.find_spec``)."""
    import torch

    installed = installed or importlib.util.find_spec
    if torch_has_xpu is None:
        torch_has_xpu = bool(getattr(torch._C, "_has_xpu", False))
    if xccl_available is None:
        xccl_available = _xccl_available()
    ipex, oneccl = installed(IPEX) is not None, installed(ONECCL) is not None
    forced = environ.get(PATH_ENV)
    if forced not in (None, "modern", "legacy"):
        raise ConfigError(
            f"{PATH_ENV}={forced!r}: use 'modern' (stock torch.xpu + xccl) or 'legacy' (IPEX + oneCCL)"
        )
    if forced == "legacy":
        if not ipex:
            raise ConfigError(
                f"{PATH_ENV}=legacy, but {IPEX} is not installed; install it or unset {PATH_ENV}"
            )
        return XpuPath("ipex", "ccl" if oneccl else None)
    if forced == "modern" and not torch_has_xpu:
        raise ConfigError(f"{PATH_ENV}=modern, but torch {torch.__version__} was built without XPU support")
    if torch_has_xpu:
        return XpuPath("torch.xpu", "xccl" if xccl_available else ("ccl" if oneccl else None))
    if ipex:
        return XpuPath("ipex", "ccl" if oneccl else None)
    return XpuPath(None, None)


def _xccl_available() -> bool:
    import torch.distributed as dist

    return bool(dist.is_available() and getattr(dist, "is_xccl_available", lambda: False)())
