from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True, scope="session")
def _latecast_env(tmp_path_factory):
    """Tests never touch ~/.cache/latecast and ignore the user's LATECAST_* settings.

    One cache for the whole session, so the bundled MNIST is decoded once, not per test.
    """
    patch = pytest.MonkeyPatch()
    patch.setenv("LATECAST_CACHE", str(tmp_path_factory.mktemp("latecast-cache")))
    for var in ("LATECAST_DATA", "LATECAST_MIRRORS"):
        patch.delenv(var, raising=False)
    yield
    patch.undo()


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty decoded-dataset cache for one test."""
    path = tmp_path / "cache"
    monkeypatch.setenv("LATECAST_CACHE", str(path))
    return path
