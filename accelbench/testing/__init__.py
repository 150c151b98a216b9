"""The conformance kit for backend plugins: a contract suite every backend runs against itself.

A plugin's tests subclass :class:`BackendContract` and name their backend; pytest then runs the whole contract
through the real plugin host, exactly as ``accelbench`` loads the plugin::

    # tests/test_mydevice_contract.py of accelbench-mydevice
    from accelbench.testing import BackendContract

    class TestMydeviceContract(BackendContract):
        backend = "mydevice"

What it checks: the plugin is installed, active and declares contract 3; its backend subclasses
``accelbench.contract.Backend`` with the contract's signatures, a docstring, and no template TODO left; detection
returns a list, never raises and initialises no device runtime in the calling process; run options are well
formed. Where the device is present it also checks device binding, that every declared precision yields a
consistent plan, that every declared strategy builds an executor, the step boundaries (after backward, after the
optimizer step, end of step) called in order through the real runner with and without gradient accumulation, the
memory query's shape, telemetry, peak figures, and real training runs through the ``accelbench`` command: short,
with ``--grad-accum 2``, compiled with the backend's compiler (or ``--compile`` refused where it has none), and on
two processes over its collective. Without the device those tests skip with a reason that starts "NOT PROVEN" and
says what was not proven.

This module is also a pytest plugin, loaded by pytest wherever accelbench is installed (the ``pytest11`` entry
point): it adds the installed backends and their devices to pytest's report header, offers the
:func:`accelbench_host` fixture, and ends the session with the list of what the conformance kit could not prove on
this machine. Requires pytest.
"""

from __future__ import annotations

import pytest

from accelbench.plugins import PluginHost
from accelbench.testing.contract import NOT_PROVEN, BackendContract, tiny_config

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


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The parts of the contract this machine could not prove, one line each: a kit run without the device is
    not a pass of the contract, and says so."""
    lines = []
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = getattr(report, "longrepr", None)
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        reason = str(reason).removeprefix("Skipped: ")
        if reason.startswith(NOT_PROVEN):
            lines.append(f"{report.nodeid.split('::')[-2] if '::' in report.nodeid else report.nodeid}::"
                         f"{report.nodeid.split('::')[-1]}: {reason}")  # fmt: skip
    if lines:
        terminalreporter.section("accelbench conformance: not proven on this machine")
        for line in sorted(set(lines)):
            terminalreporter.write_line(line)
