"""Runtime core tests: each test gets its own disk compile cache."""
import pytest


@pytest.fixture(autouse=True)
def _private_cache_dir(tmp_path, monkeypatch):
  # results never depend on what earlier tests (or runs) left in the cache
  monkeypatch.setenv("PYMODELD_CACHE_DIR", str(tmp_path / "cache"))
