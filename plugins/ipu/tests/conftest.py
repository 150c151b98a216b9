"""Test set-up: the real poptorch where the Poplar SDK is installed (tests then run on the IPU Model), the
stand-in in ``tests/fake_poptorch`` everywhere else.

The stand-in is put on ``sys.path`` (and on ``PYTHONPATH`` for detection's subprocess) per test, and its
modules are dropped from ``sys.modules`` when the session ends, so other test suites in the same session
never see a poptorch.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
from accelbench_ipu import detect, memory
from ipu_helpers import FAKE_POPTORCH, FAKE_PVA, REAL_POPTORCH

from accelbench.workloads.gpt.data import CharCorpus


@pytest.fixture(autouse=True)
def poptorch_on_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The stand-in importable here and in subprocesses (unless the real one is installed); fresh probes."""
    if REAL_POPTORCH:
        monkeypatch.setenv("POPTORCH_IPU_MODEL", "1")  # the same tests, on the IPU Model
    else:
        monkeypatch.syspath_prepend(str(FAKE_POPTORCH))
        monkeypatch.setenv(
            "PYTHONPATH", os.pathsep.join(filter(None, [str(FAKE_POPTORCH), os.environ.get("PYTHONPATH")]))
        )
        monkeypatch.delenv("POPTORCH_IPU_MODEL", raising=False)
    monkeypatch.delenv("POPLAR_ENGINE_OPTIONS", raising=False)
    monkeypatch.delenv("POPTORCH_CACHE_DIR", raising=False)
    detect.probe.cache_clear()
    yield
    detect.probe.cache_clear()


@pytest.fixture(scope="session", autouse=True)
def forget_stand_ins() -> Iterator[None]:
    yield
    for name in [n for n in sys.modules if n.split(".")[0] in ("poptorch", "pva")]:
        del sys.modules[name]


@pytest.fixture
def with_pva(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-in ``pva`` report reader (reads the stand-in poptorch's graph profiles)."""
    if REAL_POPTORCH:
        pytest.skip("the real SDK brings its own pva")
    monkeypatch.syspath_prepend(str(FAKE_PVA))


@pytest.fixture
def without_pva(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "pva_available", lambda: False)


@pytest.fixture(scope="session")
def corpus() -> CharCorpus:
    return CharCorpus.generated()
