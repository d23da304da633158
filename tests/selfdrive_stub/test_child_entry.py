"""A managed child stopped with SIGINT at any moment of its start-up (the interpreter's own, then the entry's
imports) exits without a traceback: the manager relays a child's output, and a KeyboardInterrupt from the middle
of an import reads as a crash. The module run here imports nothing slow, so the window is the entry's; a daemon's
own imports are its own (run_child catches a KeyboardInterrupt that reaches it)."""
import signal
import sys
import time

from repo_paths import REPO_ROOT
from selfdrive_stub.supervisor.process import spawn_child


def test_a_child_interrupted_anywhere_in_its_start_up_exits_without_a_traceback():
  tracebacks = []
  for i in range(16):
    p = spawn_child([sys.executable, "-P", "-m", "selfdrive_stub.supervisor.child", "probe", "selfdrive_stub.env"],
                    cwd=REPO_ROOT, text=True, env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"})
    time.sleep(0.01 + 0.01 * i)   # from the interpreter's own start to the module's import
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=60)
    if "Traceback" in out:
      tracebacks.append((i, out[-600:]))
  assert tracebacks == []
