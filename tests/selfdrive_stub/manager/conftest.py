"""Fixtures for running the manager CLI and proving that a run left nothing behind."""
import json
import os
import re
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from procfs import proc_stats
from repo_paths import REPO_ROOT



def live_in_groups(pgids):
  """pids of live (non-zombie) processes in these process groups (each managed child leads its own)."""
  return [pid for pid, state, _, pgid in proc_stats() if state != "Z" and pgid in pgids]


def child_pids(text):
  """Every pid the manager reported starting ("... started (pid N)")."""
  return {int(m) for m in re.findall(r"\(pid (\d+)", text)}


def wait_until_gone(pgids, timeout=10):
  deadline = time.monotonic() + timeout
  while live_in_groups(pgids) and time.monotonic() < deadline:
    time.sleep(0.1)
  return live_in_groups(pgids)


@pytest.fixture
def groups():
  return SimpleNamespace(live=live_in_groups, child_pids=child_pids, wait_until_gone=wait_until_gone)


@pytest.fixture
def run_manager(namespace, tmp_path):
  """run_manager(*args) runs the manager CLI in the test's namespace -> (exit code, output, summary dict)."""
  def run(*args, timeout=240):
    summary = tmp_path / "summary.json"
    proc = subprocess.run([sys.executable, "-m", "selfdrive_stub.supervisor.manager", "--summary-json", str(summary), *args],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
    report = json.loads(summary.read_text()) if summary.exists() else None
    return proc.returncode, proc.stdout + proc.stderr, report
  return run


@pytest.fixture
def assert_nothing_left(namespace):
  """assert_nothing_left(output): the run's shared memory, sockets and every process it started are gone."""
  def check(output):
    assert not os.path.exists(namespace.shm_dir), os.listdir(namespace.shm_dir)
    assert not os.path.exists(namespace.runtime_dir), os.listdir(namespace.runtime_dir)
    pgids = child_pids(output)
    assert pgids, output
    assert wait_until_gone(pgids) == []
  return check
