"""The vendor plugins this repository ships (``plugins/<name>/``), as the core knows them without their being
installed: what hardware each serves, how to install it, and the device names its catalogue answers ``--device``
for. So ``accelbench estimate --device H100`` without the CUDA plugin names the plugin to install instead of "no
installed plugin knows it", and ``accelbench plugins`` lists the ones not installed. A test checks every name
against the plugins' own catalogues, so this list cannot drift from them."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class VendorPlugin:
    """An in-tree vendor plugin: its distribution, backend name, hardware, and its catalogue's short names."""

    distribution: str
    backend: str
    hardware: str
    devices: tuple[str, ...]

    @property
    def install(self) -> str:
        """How to install it from a clone of accelbench."""
        return f"pip install ./plugins/{self.backend}"


IN_TREE: tuple[VendorPlugin, ...] = (
    VendorPlugin(
        "accelbench-cuda",
        "cuda",
        "NVIDIA GPUs (CUDA)",
        (
            "V100-16GB",
            "V100",
            "A100-40GB",
            "A100",
            "A100 PCIe 40GB",
            "A100 PCIe",
            "H100",
            "H100 PCIe",
            "H200",
            "B200",
            "GB200",
        ),
    ),  # fmt: skip
    VendorPlugin(
        "accelbench-rocm",
        "rocm",
        "AMD GPUs (ROCm)",
        ("MI100", "MI210", "MI250", "MI250X", "MI300X", "MI325X", "MI355X"),
    ),  # fmt: skip
    VendorPlugin("accelbench-xpu", "xpu", "Intel GPUs (XPU)", ("Max 1550", "Max 1550 tile")),
    VendorPlugin("accelbench-gaudi", "gaudi", "Intel Gaudi", ("Gaudi3", "Gaudi2", "Gaudi")),
    VendorPlugin("accelbench-xla", "xla", "Google TPUs (PyTorch/XLA)", ("v4", "v5e", "v5p", "v6e")),
    VendorPlugin("accelbench-ipu", "ipu", "Graphcore IPUs (PopTorch)", ("GC200", "Bow")),
)


def name_key(text: str) -> str:
    """A device name as matched: case, spaces and punctuation ignored ('H100 SXM' and 'h100-sxm' are one)."""
    return re.sub(r"[^0-9a-z]", "", text.casefold())


def plugin_knowing(device: str) -> VendorPlugin | None:
    """The in-tree plugin whose catalogue holds ``device`` (its name ignoring case, spaces and punctuation), or
    None."""
    wanted = name_key(device)
    exact = [p for p in IN_TREE if wanted in {name_key(d) for d in p.devices}]
    partial = exact or [p for p in IN_TREE if wanted and any(wanted in name_key(d) for d in p.devices)]
    return partial[0] if len(partial) == 1 else None
