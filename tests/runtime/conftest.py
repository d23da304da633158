"""Runtime tests share one machine-code cache directory per session (entries are content-addressed and
verified, so what one test compiled is exactly what another would); tests of the cache itself use their own
directories."""
import pytest


@pytest.fixture(autouse=True)
def _session_cache_dir(tmp_path_factory, monkeypatch):
  root = tmp_path_factory.getbasetemp() / "runtime-cache"
  root.mkdir(mode=0o700, exist_ok=True)
  monkeypatch.setenv("PYMODELD_CACHE_DIR", str(root))
