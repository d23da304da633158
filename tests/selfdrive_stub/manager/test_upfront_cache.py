"""The manager refuses an unsafe compiled-code cache dir before it starts anything, in one line with the daemons'
own advice, instead of letting each model daemon crash on it at every restart."""
import os
import subprocess
import sys

from repo_paths import REPO_ROOT


def _run(*args, env=None):
  return subprocess.run([sys.executable, "-m", "selfdrive_stub.supervisor.manager", *args], cwd=REPO_ROOT, capture_output=True,
                        text=True, timeout=60, env={**os.environ, **(env or {})})


def test_a_shared_cache_dir_is_refused_up_front_in_one_line_with_the_advice(namespace):
  r = _run("--duration", "5", env={"PYMODELD_CACHE_DIR": "/tmp", "PYMODELD_DISK_CACHE": "1"})
  lines = (r.stdout + r.stderr).strip().splitlines()
  assert r.returncode == 2 and len(lines) == 1, lines
  assert lines[0].startswith("pymodeld-manager: cache dir /tmp") and "a new directory of your own" in lines[0], lines
  assert "started" not in lines[0] and "crashed" not in lines[0], lines


def test_a_run_without_model_daemons_does_not_check_the_cache_dir(namespace):
  r = _run("--duration", "0.5", "--block", "modeld,dmonitoringmodeld,camerad,car,dmonitoringd,selfdrived",
           env={"PYMODELD_CACHE_DIR": "/tmp", "PYMODELD_DISK_CACHE": "1"})
  assert "cache dir" not in r.stdout + r.stderr, r.stdout + r.stderr
