"""Fixtures for the core tests (helpers live in core_support.py).

Tests that need a vendor plugin installed carry ``@pytest.mark.needs_plugin(DISTRIBUTION, ..., why=...)`` and are
skipped, saying so, where it is not (:func:`pytest_runtest_setup`).

The real records several test modules read are made here, once a session (:func:`real_runs`, :func:`tiny_run`):
read them, and copy a record before changing it. So is the one-node Slurm the launcher and ``sweep --submit slurm``
tests share (:func:`slurm`): one cluster a session, never two on one host.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from cluster_support import ClusterUnavailable, SlurmCluster, start_slurm
from core_support import RealRuns, Site

from accelbench.estimate.peak import CACHE_ENV

if TYPE_CHECKING:
    from accelbench.results import ResultRecord


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked ``needs_plugin("accelbench-cuda", why=...)`` reads what a vendor plugin brings (its peak table,
    its backend's refusals): where that plugin is not installed it is skipped, naming the plugin and why, so the core
    suite runs with the core alone."""
    for mark in item.iter_markers("needs_plugin"):
        missing = [name for name in mark.args if not _installed(name)]
        if missing:
            plugins = f"plugin{'s' if len(missing) > 1 else ''} {', '.join(missing)}"
            paths = " ".join(f"./plugins/{name.removeprefix('accelbench-')}" for name in missing)
            pytest.skip(f"needs the vendor {plugins} installed ({mark.kwargs['why']}): pip install {paths}")


@pytest.fixture(scope="session", autouse=True)
def session_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The session's own ``$ACCELBENCH_CACHE_DIR`` (calibrations, measured peaks, the corpus, tokenizers), which
    every run a test starts inherits: tests never write the user's cache. They did: stand-in devices' entries, and a
    calibration measured beside the tests' jobs, 20 to 1,000 times too slow, that the user's next run priced its
    step with. A ``$ACCELBENCH_CACHE_DIR`` set before the session is kept."""
    if os.environ.get(CACHE_ENV):
        yield Path(os.environ[CACHE_ENV])
        return
    folder = tmp_path_factory.mktemp("accelbench-cache")
    os.environ[CACHE_ENV] = str(folder)
    try:
        yield folder
    finally:
        os.environ.pop(CACHE_ENV, None)


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


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A one-node Slurm for the session (munge, slurmctld, slurmd), stopped by process id at the end; skipped,
    saying why, where it cannot start (tests/cluster_support.py)."""
    try:
        cluster = start_slurm(tmp_path_factory.mktemp("slurm"))
    except ClusterUnavailable as exc:
        pytest.skip(f"no real Slurm here: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def slurm_two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """Two Slurm nodes on this host (a slurmd each, ``slurmd -N``), for a real 2-node job; skipped as ``slurm``."""
    try:
        cluster = start_slurm(tmp_path_factory.mktemp("slurm2"), nodes=2)
    except ClusterUnavailable as exc:
        pytest.skip(f"no real 2-node Slurm here: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()
