"""One managed child process: declaration, launch, crash bookkeeping and stop.

Invariants:
- Every child runs `python -P -m selfdrive_stub.supervisor.child <name> <module> [args...]`: the entry point below sets the
  process title to <name>, asks the kernel to SIGKILL it when the manager dies (PR_SET_PDEATHSIG), and runs the
  module as __main__. So a title and an orphan guard exist even for modules that forget them.
- Each child is the leader of its own session/process group; stop and kill signal the whole group, so helper
  processes a daemon forks die with it.
- stop(): SIGINT once, wait up to `stop_timeout` (5 s, as the reference), then SIGKILL; it always reaps.
- A module that cannot be found is state "missing": reported, never started, never a manager crash.
- A child that exits on its own is a crash. With restart_if_crash it is restarted after an exponential backoff
  (0.5 s doubling to 10 s; the count resets once a run lasted `stable_after` seconds).
- A child's stdout and stderr go to one pipe, read line by line by a thread (unbuffered child, so lines come
  as they are written): the last OUTPUT_LINES are kept, and `last_error` is the last line a crashed run
  printed (its error, or a traceback's last line), so the manager can show why it crashed. `take_output()`
  hands the new lines to whoever shows them.
"""
from __future__ import annotations

import collections
import ctypes
import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from selfdrive_stub.env import SELFDRIVE_ENV

STOP_TIMEOUT_S = 5.0
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 10.0
STABLE_AFTER_S = 30.0
MANAGER_PID_ENV = "PYMODELD_MANAGER_PID"
OUTPUT_LINES = 50
MAX_LINE = 400    # a child's line is cut here: a runaway print must not grow the manager
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the directory holding our packages


def always_run(ctx) -> bool:
  return True


def module_exists(module: str) -> bool:
  """True if `python -m module` would find something to run (a module, or a package with __main__)."""
  try:
    spec = importlib.util.find_spec(module)
    if spec is None:
      return False
    if spec.submodule_search_locations is not None:
      return importlib.util.find_spec(module + ".__main__") is not None
    return True
  except (ImportError, ValueError):
    return False


@dataclass
class ProcessConfig:
  """Declaration of one process, as in openpilot's process_config.py."""
  name: str
  module: str
  args: Callable[[object], list[str]] = lambda ctx: []
  env: Callable[[object], dict[str, str]] = lambda ctx: {}   # variables of this process only, over the manager's
  enabled: bool = True
  should_run: Callable[[object], bool] = always_run
  after: tuple[str, ...] = ()           # start only once these are ready (or given up on)
  ready_check: Callable[[object], bool] | None = None   # extra readiness probe beside "owned services publish"
  restart_if_crash: bool = True


@dataclass
class ManagedProcess:
  cfg: ProcessConfig
  stop_timeout: float = STOP_TIMEOUT_S
  stable_after: float = STABLE_AFTER_S
  proc: subprocess.Popen | None = None
  state: str = "stopped"               # stopped | missing | running | backoff | crashed | disabled
  ready: bool = False
  exit_code: int | None = None
  restarts: int = 0
  crashes: int = 0                     # unexpected exits
  expected_exits: int = 0              # exits we caused on purpose (fault injection)
  started_at: float = 0.0
  next_start: float = 0.0
  _consecutive: int = 0
  _expect_exit: bool = False
  log: list[str] = field(default_factory=list)
  last_error: str = ""                 # the last line a crashed run printed
  tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=OUTPUT_LINES))
  _new_lines: collections.deque = field(default_factory=lambda: collections.deque(maxlen=10 * OUTPUT_LINES))
  _reader: threading.Thread | None = None

  @property
  def name(self) -> str:
    return self.cfg.name

  @property
  def pid(self) -> int | None:
    return self.proc.pid if self.proc is not None else None

  @property
  def running(self) -> bool:
    return self.proc is not None and self.proc.poll() is None

  def start(self, env: dict[str, str], ctx=None) -> bool:
    """Launch the child; False (state "missing") if its module does not exist. A child that was started and whose
    exit poll() has not noticed yet is left alone: starting again would lose that exit (never noted or counted)."""
    if self.proc is not None:
      return True
    if not module_exists(self.cfg.module):
      if self.state != "missing":
        self.log.append(f"{self.name}: module {self.cfg.module!r} not found; not started")
      self.state = "missing"
      return False
    child_env = {**env, **self.cfg.env(ctx)}
    child_env["PYMODELD_PROCESS"] = self.name
    child_env[MANAGER_PID_ENV] = str(os.getpid())
    child_env["PYTHONUNBUFFERED"] = "1"
    # -P: the working directory is not on the child's path, so a runtime.py (or any module of ours) in the
    # directory the manager was started from cannot shadow the package; the checkout is named explicitly instead
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), CHECKOUT) if p)
    argv = [sys.executable, "-P", "-m", "selfdrive_stub.supervisor.child", self.name, self.cfg.module, *self.cfg.args(ctx)]
    self.proc = spawn_child(argv, env=child_env)
    self.tail.clear()
    self._reader = threading.Thread(target=self._read_output, args=(self.proc.stdout,), name=f"out-{self.name}",
                                    daemon=True)
    self._reader.start()
    self.state, self.ready, self.exit_code = "running", False, None
    self.started_at = time.monotonic()
    return True

  def _read_output(self, pipe) -> None:
    with pipe:
      for raw in iter(pipe.readline, b""):
        line = raw[:MAX_LINE].decode(errors="replace").rstrip()
        if line:
          self.tail.append(line)
          self._new_lines.append(line)

  def take_output(self) -> list[str]:
    """The lines the child printed since the last call."""
    out = []
    while self._new_lines:
      out.append(self._new_lines.popleft())
    return out

  def _finish_output(self) -> None:
    """Wait (briefly) for the reader to see the end of the dead child's output."""
    if self._reader is not None:
      self._reader.join(timeout=2.0)
      self._reader = None

  def poll(self, now: float) -> str | None:
    """Notice an exit; returns "crash" or "expected" once per exit, else None."""
    if self.proc is None or self.proc.poll() is None:
      return None
    self.exit_code = self.proc.returncode
    self._signal_group(signal.SIGKILL)   # leftover helpers of the dead child
    self._finish_output()
    self.proc = None
    self.ready = False
    if self._expect_exit:
      self._expect_exit = False
      self.expected_exits += 1
      kind = "expected"
    else:
      self.crashes += 1
      kind = "crash"
      self.last_error = self._exit_reason()
    self.log.append(f"{self.name}: exited with code {self.exit_code} ({kind})")
    if now - self.started_at >= self.stable_after:
      self._consecutive = 0
    if self.cfg.restart_if_crash:
      delay = min(BACKOFF_FIRST_S * 2 ** self._consecutive, BACKOFF_MAX_S)
      self._consecutive += 1
      self.state, self.next_start = "backoff", now + delay
    else:
      self.state = "crashed"
    return kind

  def _exit_reason(self) -> str:
    code = self.exit_code or 0
    if code < 0:
      try:
        return f"killed by {signal.Signals(-code).name}" + (f" after: {self.tail[-1]}" if self.tail else "")
      except ValueError:
        return f"killed by signal {-code}"
    return self.tail[-1] if self.tail else f"exit code {code}, no output"

  def due_for_restart(self, now: float) -> bool:
    return self.state == "backoff" and now >= self.next_start

  def restart(self) -> None:
    """Stop (as stop()) on purpose, counted as an injected exit, and be due to start again at once."""
    if self.proc is None:
      return
    self.stop(block=True)
    self.expected_exits += 1
    self.state, self.next_start = "backoff", 0.0

  def kill(self, expected: bool = True) -> None:
    """SIGKILL the group now (fault injection); the exit is noticed by poll()."""
    if self.running:
      self._expect_exit = expected
      self._signal_group(signal.SIGKILL)

  def stop(self, block: bool = True) -> None:
    """SIGINT the group; if block, wait up to stop_timeout, then SIGKILL and reap."""
    if self.proc is None:
      return
    if self.proc.poll() is None:
      self._signal_group(signal.SIGINT)
    if not block:
      return
    try:
      self.proc.wait(self.stop_timeout)
    except subprocess.TimeoutExpired:
      self.log.append(f"{self.name}: no exit {self.stop_timeout:.0f} s after SIGINT; SIGKILL")
    self._signal_group(signal.SIGKILL)
    self.exit_code = self.proc.wait()
    self._finish_output()
    self.proc = None
    self.ready = False
    self.state = "stopped"

  def _signal_group(self, sig: int) -> None:
    if self.proc is None:
      return
    try:
      os.killpg(self.proc.pid, sig)
    except (ProcessLookupError, PermissionError):
      pass


def die_with_parent(parent_pid: int) -> None:
  """Ask the kernel to SIGKILL this process when its parent dies (PR_SET_PDEATHSIG), so a parent that is killed
  leaves no orphans; exit at once if `parent_pid` already died before the request took effect. Shared by the
  manager's children and the replay harness's. The kernel ties the request to the parent *thread* that started
  this process, so a parent must start its children from a thread that lives as long as they should."""
  PR_SET_PDEATHSIG = 1
  try:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
  except (OSError, AttributeError):
    return
  if os.getppid() != parent_pid:
    os._exit(1)


def _die_with_parent() -> None:
  """Die with the manager that started us (its pid is in the environment; none: started by hand)."""
  manager_pid = SELFDRIVE_ENV.get(MANAGER_PID_ENV)
  if manager_pid:
    die_with_parent(int(manager_pid))


def spawn_child(argv: list[str], **popen) -> subprocess.Popen:
  """Start a child entry (selfdrive_stub.supervisor.child) with SIGINT blocked: the mask survives exec, so a stop that comes
  while the child's interpreter is still starting stays pending until the entry has made SIGINT a quiet exit and
  unblocked it, instead of printing a KeyboardInterrupt traceback from the middle of an import."""
  old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
  try:
    return subprocess.Popen(argv, **{"start_new_session": True, "stdin": subprocess.DEVNULL, "stdout": subprocess.PIPE,
                                     "stderr": subprocess.STDOUT, **popen})
  finally:
    signal.pthread_sigmask(signal.SIG_SETMASK, old)


def run_child(argv: list[str]) -> None:
  """Entry point of a managed child: title, orphan guard, then the module as __main__."""
  if len(argv) < 2:
    raise SystemExit("usage: python -m selfdrive_stub.supervisor.child NAME MODULE [ARGS...]")
  name, module, args = argv[0], argv[1], argv[2:]
  _die_with_parent()
  try:
    from setproctitle import setproctitle
    setproctitle(name)
  except ImportError:
    pass
  import runpy
  sys.argv = [module, *args]
  signal.signal(signal.SIGINT, signal.default_int_handler)   # selfdrive_stub.supervisor.child made it a quiet exit until here
  try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
  except KeyboardInterrupt:
    pass


if __name__ == "__main__":
  run_child(sys.argv[1:])
