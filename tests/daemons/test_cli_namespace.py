"""A bus piece run by hand with an OPENPILOT_PREFIX that is not one path component says so in one line and
exits 2 before touching the bus, as the manager does. Each case drives the real command."""
import os
import subprocess
import sys

import pytest

from repo_paths import REPO_ROOT


@pytest.mark.parametrize("name", ["daemons.modeld", "daemons.dmonitoringmodeld", "selfdrive_stub.producers.camerad",
                                  "selfdrive_stub.consumers.dmonitoringd"])
def test_a_daemon_refuses_a_prefix_with_a_slash_in_one_line(name):
  r = subprocess.run([sys.executable, "-m", name], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                     env={**os.environ, "OPENPILOT_PREFIX": "a/b"})
  lines = (r.stdout + r.stderr).strip().splitlines()
  assert r.returncode == 2 and len(lines) == 1, lines
  assert "OPENPILOT_PREFIX 'a/b'" in lines[0] and "Traceback" not in lines[0], lines


@pytest.mark.parametrize("name", ["daemons.modeld", "daemons.dmonitoringmodeld"])
def test_a_daemon_refuses_a_shared_cache_dir_at_start_in_one_line_advising_a_private_one(name):
  r = subprocess.run([sys.executable, "-m", name], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                     env={**os.environ, "PYMODELD_CACHE_DIR": "/tmp", "PYMODELD_DISK_CACHE": "1"})
  lines = (r.stdout + r.stderr).strip().splitlines()
  assert r.returncode == 2 and len(lines) == 1, lines
  assert "cache dir /tmp" in lines[0] and "a new directory of your own" in lines[0], lines
