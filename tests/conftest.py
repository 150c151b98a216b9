"""Fixtures for the core tests (helpers live in core_support.py).

The real records several test modules read are made here, once a session (:func:`real_runs`, :func:`tiny_run`):
read them, and copy a record before changing it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from core_support import RealRuns, Site

if TYPE_CHECKING:
    from accelbench.results import ResultRecord


@pytest.fixture
def site(tmp_path: Path) -> Site:
    path = tmp_path / "site"
    path.mkdir()
    return Site(path)


@pytest.fixture(scope="session")
def real_runs(tmp_path_factory: pytest.TempPathFactory) -> RealRuns:
    return RealRuns(tmp_path_factory.mktemp("real-runs"))


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[ResultRecord, Path]:
    """One real record, in this process: the conformance kit's tiny model, 2 epochs of 2 steps; the record as the
    run returned it, and its file."""
    from accelbench.engine.runner import run
    from accelbench.plugins import get_host
    from accelbench.testing import tiny_config

    out = tmp_path_factory.mktemp("tiny-run")
    record, path, _ = run(tiny_config(epochs=2, steps_per_epoch=2, output_dir=out), get_host())
    return record, path
