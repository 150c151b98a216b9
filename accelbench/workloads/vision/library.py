"""Loading torchvision (the ``vision`` extra), whichever build of it is installed.

Each torchvision release is built for one torch release and build. pip's default torchvision wheel next to a CPU
build of the same torch version matches the version but not the build: its compiled operators do not load, and
``import torchvision`` then fails registering kernels for ``torchvision::nms``. The model definitions and layers the
image workloads use are pure Python and need none of those operators (they are detection ops), so in that case
their schemas are declared and the import is retried, and the record says so. Lightning imports torchvision too
(through torchmetrics), so ``--engine lightning`` loads it here first.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType
from typing import Any

import torch

from accelbench.errors import ConfigError

# what torchvision's import registers unconditionally for its compiled operators (its _meta_registrations)
_TORCHVISION_OPS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
TORCHVISION_NOTES: list[str] = []  # set when torchvision was loaded without its compiled operators


def load_torchvision() -> ModuleType:
    """torchvision, or a ConfigError saying how to install it; a build for another torch is loaded without its
    compiled operators (see the module's docstring), and :data:`TORCHVISION_NOTES` says so."""
    loaded = sys.modules.get("torchvision")
    if loaded is not None:  # None: an import of it failed, or was blocked, in this process
        return loaded
    if importlib.util.find_spec("torchvision") is None:
        raise ConfigError(
            "the image workloads need torchvision: pip install 'accelbench[vision]' (with the torchvision release "
            f"built for your torch {torch.__version__}, e.g. torch 2.13.0 pairs with torchvision 0.28.0)"
        )
    try:
        import torchvision
    except RuntimeError as exc:
        if "torchvision::" not in str(exc):
            raise
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        library = torch.library.Library("torchvision", "FRAGMENT")  # schemas only, no kernels
        for schema in _TORCHVISION_OPS:
            library.define(schema)
        _keep.append(library)
        import torchvision

        TORCHVISION_NOTES.append(
            f"compiled operators unavailable ({exc}): this torchvision was built for another torch build; the "
            "models and their layers are pure Python and do not use them"
        )
    return torchvision


_keep: list[Any] = []  # the Library declaring the schemas must outlive the import
