"""Registration: the two hooks a plugin implements to add backends and workloads.

A plugin is a module (or an object) named by an entry point of the ``accelbench`` group in its distribution's
metadata. It declares the contract version it was written for and registers what it provides::

    # pyproject.toml of accelbench-gaudi
    [project.entry-points.accelbench]
    gaudi = "accelbench_gaudi.plugin"

    # accelbench_gaudi/plugin.py
    from accelbench.contract import hookimpl

    accelbench_contract = "3.0"

    @hookimpl
    def accelbench_register_backends(register):
        register(GaudiBackend)

Both hooks are called on every plugin, once, when plugins load. Everything a backend does is a method of its
:class:`~accelbench.contract.Backend` subclass; nothing else is a hook.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from accelbench.contract.markers import hookspec

if TYPE_CHECKING:
    from accelbench.contract.backend import Backend
    from accelbench.workloads import Workload


@hookspec
def accelbench_register_backends(register: Callable[[type[Backend]], None]) -> None:
    """Register backends.

    :param register: call it once per :class:`~accelbench.contract.Backend` subclass; the host makes one instance.
        Backend names are unique across installed plugins: a second plugin claiming a taken name is reported as
        failed, naming both distributions.
    """


@hookspec
def accelbench_register_workloads(register: Callable[[Workload], None]) -> None:
    """Register workloads.

    :param register: call it once per workload (an object following :class:`accelbench.workloads.Workload`).
        A duplicate workload name is an error naming both plugins.
    """
