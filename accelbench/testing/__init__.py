"""The conformance kit for backend plugins: a contract suite every backend runs against itself.

A plugin's tests subclass :class:`BackendContract` and name their backend; pytest then runs the whole contract
through the real plugin host, exactly as ``accelbench`` loads the plugin::

    # tests/test_mydevice_contract.py of accelbench-mydevice
    from accelbench.testing import BackendContract

    class TestMydeviceContract(BackendContract):
        backend = "mydevice"

What it checks: the plugin is installed and active; every ``accelbench_*`` function is a documented hook and
decorated; detection returns a list, never raises and initialises no device runtime in the calling process;
run options are well formed. Where the device is present it also checks device binding, that every declared
precision yields a consistent plan, that every declared strategy builds an executor, the memory query's shape,
telemetry, peak figures, and a short real training run through the ``accelbench`` command. Without the device
those tests skip with the reason "no <backend> device on this machine".

This module is also a pytest plugin (``pytest_plugins = ["accelbench.testing"]`` in a top-level conftest, or
``pytest -p accelbench.testing``): it adds the installed backends and their devices to pytest's report header
and offers the :func:`accelbench_host` fixture. The contract class works without it. Requires pytest.
"""

from __future__ import annotations

import pytest

from accelbench.plugins import PluginHost
from accelbench.testing.contract import BackendContract, tiny_config

__all__ = ["BackendContract", "accelbench_host", "tiny_config"]


@pytest.fixture
def accelbench_host() -> PluginHost:
    """A freshly loaded plugin host (entry points as installed, broken plugins reported, not fatal)."""
    return PluginHost(strict=False)


def pytest_report_header(config: pytest.Config) -> list[str]:
    """One line per installed backend: what the contract suites below will find on this machine."""
    try:
        host = PluginHost(strict=False)
    except Exception as exc:  # the header must never stop a test session
        return [f"accelbench plugins: could not load ({type(exc).__name__}: {exc})"]
    lines = []
    for name, backend in host.backends.items():
        devices = backend.detect()
        found = ", ".join(d.name for d in devices) or "no device"
        lines.append(f"accelbench backend {name} (priority {backend.info.priority}): {found}")
    lines += [f"accelbench plugin {r.name} FAILED: {r.error}" for r in host.failed]
    return lines
