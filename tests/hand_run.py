"""The pieces a daemon run by hand needs beside it in the tests of what it says: camerad started late, and
every piece stopped as a user would (SIGTERM) at the end."""
import os
import signal
import subprocess
import sys

from repo_paths import REPO_ROOT


def start_camerad() -> subprocess.Popen:
  return subprocess.Popen([sys.executable, "-m", "selfdrive_stub.producers.camerad", "--camera", "tici"], cwd=REPO_ROOT,
                          env={**os.environ, "PYMODELD_PROCESS": "camerad"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop(*procs) -> None:
  """SIGTERM each piece still running (None: never started) and wait for it."""
  for proc in procs:
    if proc is not None and proc.poll() is None:
      proc.send_signal(signal.SIGTERM)
      proc.wait(30)
