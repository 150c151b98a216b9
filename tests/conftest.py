"""Fixtures for the core tests (helpers live in core_support.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from core_support import Site


@pytest.fixture
def site(tmp_path: Path) -> Site:
    path = tmp_path / "site"
    path.mkdir()
    return Site(path)
