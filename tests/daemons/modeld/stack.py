"""Helpers for the process-level modeld tests: spawn stack processes, stop them, collect bus messages."""
import os
import re
import signal
import subprocess
import sys
import time

from cereal import messaging
from repo_paths import REPO_ROOT



def spawn(*args, env=None):
  return subprocess.Popen([sys.executable, "-m", *args], cwd=REPO_ROOT, env={**os.environ, **(env or {})},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def stop(procs):
  for p in procs:
    if p.poll() is None:
      p.send_signal(signal.SIGTERM)
  codes = []
  for p in procs:
    try:
      codes.append(p.wait(timeout=30))
    except subprocess.TimeoutExpired:
      p.kill()
      codes.append(p.wait())
  return codes


def collect(services, until, deadline_s=90):
  socks = {s: messaging.sub_sock(s, conflate=False) for s in services}
  got = {s: [] for s in services}
  deadline = time.monotonic() + deadline_s
  while time.monotonic() < deadline and not until(got):
    for s, sock in socks.items():
      for dat in messaging.drain_sock_raw(sock):
        got[s].append(messaging.log_from_bytes(dat))
    time.sleep(0.02)
  return got


LOAD_REASONS = re.compile(r"^(\d+ frames? dropped before frame \d+|frame \d+(, \d+)? overwritten while it was warped|"
                          r"frames out of sync by [-\d.]+ ms)(; .*)?$")


def warming_up(m):
  return "calibration" in m.invalidReason or "history filling" in m.invalidReason
