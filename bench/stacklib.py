"""Helpers shared by the full-stack latency benchmarks: start a stack process, drain a socket, percentiles."""
import os
import subprocess
import sys

import numpy as np

from cereal.messaging import log_from_bytes
from common.realtime import CORES_ENV, stack_pins

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start(module, *args):
  """Start a stack process, pinned as the manager pins it, in the current namespace (read from os.environ now:
  the caller enters it first)."""
  return subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO_ROOT,
                          env={**os.environ, CORES_ENV: stack_pins()}, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)


def drain(sock):
  out = []
  while (dat := sock.receive(non_blocking=True)) is not None:
    out.append(log_from_bytes(dat))
  return out


def pct(values, q):
  return float(np.percentile(values, q)) if len(values) else float("nan")
