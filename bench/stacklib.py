"""Helpers shared by the full-stack latency benchmarks: start a stack process, drain a socket, percentiles."""
import os
import subprocess
import sys

import numpy as np

from cereal.messaging import log_from_bytes

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start(module, *args):
  return subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)


def drain(sock):
  out = []
  while (dat := sock.receive(non_blocking=True)) is not None:
    out.append(log_from_bytes(dat))
  return out


def pct(values, q):
  return float(np.percentile(values, q)) if len(values) else float("nan")
