"""Helpers for the fault matrix: real processes started the way the manager starts them, and a bus recorder.

Invariants:
- Every child runs as `python -m selfdrive_stub.supervisor.process NAME MODULE ...` with PYMODELD_PROCESS=NAME (its
  publishing rights) and the test process as its "manager" (it is SIGKILLed if the test process dies).
- A child's stdout+stderr go to a log file, readable with `log(name)` for assertions and diagnostics.
- Stack.stop_all() stops every child (SIGINT, then SIGKILL) and reaps it: no zombies are left behind.
- Recorder reads every message of its services through non-conflating sockets and decodes each one with the
  strict decoder; a message that does not decode is counted, never silently skipped.
"""
import os
import signal
import subprocess
import sys
import time

from cereal import messaging
from procfs import proc_stats
from repo_paths import REPO_ROOT
from selfdrive_stub.supervisor.process import spawn_child

GENEROUS_S = 90.0    # "something should happen": a loaded 2-core machine may need a long time


def wait_for(predicate, timeout: float = GENEROUS_S, what: str = "condition", poll=None, dt: float = 0.02):
  """Call poll() (if given) and predicate() until predicate is truthy; AssertionError naming `what` on timeout."""
  deadline = time.monotonic() + timeout
  while True:
    if poll is not None:
      poll()
    value = predicate()
    if value:
      return value
    if time.monotonic() > deadline:
      raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what() if callable(what) else what}")
    time.sleep(dt)


class Stack:
  def __init__(self, logdir: str):
    self.logdir = logdir
    self.procs: dict[str, subprocess.Popen] = {}
    self._logs: dict[str, str] = {}

  def start(self, name: str, module: str, *args: str, env: dict | None = None) -> subprocess.Popen:
    child_env = dict(os.environ)
    child_env.update({"PYMODELD_PROCESS": name, "PYMODELD_MANAGER_PID": str(os.getpid())})
    child_env.update(env or {})
    path = os.path.join(self.logdir, f"{name}.{len([k for k in self._logs if k.startswith(name)])}.log")
    self._logs[name] = path
    with open(path, "w") as log:
      proc = spawn_child([sys.executable, "-m", "selfdrive_stub.supervisor.child", name, module, *args], cwd=REPO_ROOT,
                         env=child_env, stdout=log)
    self.procs[name] = proc
    return proc

  def log(self, name: str) -> str:
    with open(self._logs[name]) as f:
      return f.read()

  def alive(self, name: str) -> bool:
    return self.procs[name].poll() is None

  def stop(self, name: str, sig: int = signal.SIGINT, timeout: float = 60.0) -> int:
    """Send sig to the child's group and reap it (SIGKILL if it has not exited after `timeout`)."""
    proc = self.procs[name]
    if proc.poll() is None:
      try:
        os.killpg(proc.pid, sig)
      except ProcessLookupError:
        pass
    try:
      return proc.wait(timeout)
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.wait()
      raise AssertionError(f"{name} did not exit within {timeout:.0f} s of signal {sig}; killed. Log:\n"
                           f"{self.log(name)[-3000:]}") from None

  def stop_all(self) -> None:
    for proc in self.procs.values():
      if proc.poll() is None:
        try:
          os.killpg(proc.pid, signal.SIGINT)
        except ProcessLookupError:
          pass
    deadline = time.monotonic() + 20
    for proc in self.procs.values():
      try:
        proc.wait(max(0.1, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class Recorder:
  """Every message of `services`, decoded, with its arrival time: rec[service] -> [(t, event), ...]."""

  def __init__(self, services):
    self.socks = {s: messaging.sub_sock(s, conflate=False) for s in services}
    self.msgs: dict[str, list] = {s: [] for s in services}
    self.malformed: dict[str, int] = dict.fromkeys(services, 0)

  def poll(self) -> None:
    for s, sock in self.socks.items():
      for raw in messaging.drain_sock_raw(sock):
        try:
          evt = messaging.log_from_bytes(raw, service=s)
        except messaging.MessageDecodeError:
          self.malformed[s] += 1
          continue
        self.msgs[s].append((time.monotonic(), evt))

  def __getitem__(self, service: str) -> list:
    return [e for _, e in self.msgs[service]]

  def since(self, service: str, t: float) -> list:
    return [e for ts, e in self.msgs[service] if ts >= t]

  def dropped(self, service: str) -> int:
    return self.socks[service].dropped

  def wait(self, predicate, timeout: float = GENEROUS_S, what: str = "condition"):
    return wait_for(lambda: predicate(self), timeout, what, poll=self.poll)

  def close(self) -> None:
    for sock in self.socks.values():
      sock.close()


def zombies_of(pid: int) -> list[int]:
  """Zombie children of `pid` (state Z in /proc)."""
  return [child for child, state, ppid, _ in proc_stats() if state == "Z" and ppid == pid]
