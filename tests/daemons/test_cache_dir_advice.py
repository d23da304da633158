"""A hand-run model daemon refused an unsafe compiled-code cache dir gives the fix once: a CacheError that carries
its own advice gets no second copy of it from the CLI's hint table, and one that does not (a dir of another user)
gets the same advice. Each case drives the real command."""
import os
import subprocess
import sys
import tempfile

import pytest

from repo_paths import REPO_ROOT

DAEMONS = ["daemons.modeld", "daemons.dmonitoringmodeld"]


def _refusal(name, cache_dir):
  r = subprocess.run([sys.executable, "-m", name], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                     env={**os.environ, "PYMODELD_CACHE_DIR": cache_dir, "PYMODELD_DISK_CACHE": "1"})
  lines = (r.stdout + r.stderr).strip().splitlines()
  assert r.returncode == 2 and len(lines) == 1, lines
  return lines[0]


@pytest.mark.parametrize("name", DAEMONS)
def test_a_shared_cache_dir_is_refused_with_the_advice_said_once(name):
  line = _refusal(name, "/tmp")
  assert "cache dir /tmp" in line and "a new directory of your own" in line, line
  assert line.count("PYMODELD_CACHE_DIR") == 1 and "chmod" not in line, line


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a dir to another user needs root")
@pytest.mark.parametrize("name", DAEMONS)
def test_a_cache_dir_of_another_user_is_refused_with_the_same_advice_once(name):
  with tempfile.TemporaryDirectory() as d:
    foreign = os.path.join(d, "cache")
    os.mkdir(foreign, 0o700)
    os.chown(foreign, 65534, 65534)
    line = _refusal(name, foreign)
  assert "owned by uid 65534" in line and "a new directory of your own" in line, line
  assert line.count("PYMODELD_CACHE_DIR") == 1 and "chmod" not in line, line
