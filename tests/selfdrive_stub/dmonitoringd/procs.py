"""Launch the stack's real processes for end-to-end tests; every child is stopped (then killed) at teardown."""
import os
import subprocess
import sys
import time
from repo_paths import REPO_ROOT



class Procs:
  def __init__(self):
    self.children = {}

  def start(self, name, module, *args, env=None):
    child_env = dict(os.environ)
    child_env.update(env or {})
    self.children[name] = subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO_ROOT, env=child_env,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return self.children[name]

  def stop_all(self):
    for p in self.children.values():
      if p.poll() is None:
        p.terminate()
    deadline = time.monotonic() + 10
    for p in self.children.values():
      try:
        p.wait(max(0.1, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
      if p.stderr:
        p.stderr.close()


def receive_all(sock):
  """Every message waiting on a (non-conflated) socket, as bytes."""
  out = []
  while (dat := sock.receive(non_blocking=True)) is not None:
    out.append(dat)
  return out
