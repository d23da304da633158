"""The replayed process's side of a resident daemon: import once, run the daemon's main() once per route.

    python -m process_replay.resident MODULE:FUNCTION REPLY_FD PARENT_PID   (started by the harness, never by hand)
    python -m process_replay.resident --exec PARENT_PID PYTHON_ARGS...      (a daemon that is not resident)

Protocol (the harness is the only peer): commands are JSON lines on stdin, replies JSON lines on the
inherited file descriptor REPLY_FD.
- after importing MODULE it replies {"ready": true}; the import (numpy, onnx, the runtime) is most of a
  daemon's launch, so the harness starts this early and overlaps it with its own work;
- {"run": [args...]} calls FUNCTION(args) in the main thread, exactly as `python -m` would; when it returns
  (the harness stops a route with SIGINT and one open gate) the reply is {"returned": code};
- {"exit": true} or end of input: exit 0. An exception from FUNCTION prints its traceback and exits 1, so a
  daemon that dies mid-route is a dead process to the harness, as without the resident wrapper.

Invariants: everything a route can change lives inside FUNCTION's frame (its sockets, state, model objects),
so the next run starts from the daemon's initial state; what survives is only what the daemon itself keeps
at module level (imports, the runtime's in-process compile cache). tests/process_replay pins this by
replaying routes A, B, A in one resident and getting A's bytes twice.

A replayed daemon never outlives its harness, and SIGTERM ends it at any time:
- before anything slow is imported it asks the kernel to SIGKILL it when PARENT_PID (the harness) dies
  (selfdrive_stub.supervisor.process.die_with_parent, the manager's own guard); `--exec` does only that and then execs the
  daemon, which keeps the request across exec;
- the daemons' SIGTERM handlers only ask their loop to stop, and a loop parked at its replay gate never looks
  again while the harness is stopped or gone, so a SIGTERM (`kill`, a supervisor) would be ignored. Here SIGTERM
  keeps its default action: a daemon's request to handle it is set aside (signal.signal is wrapped for SIGTERM
  only). The harness ends a route's main() with SIGINT instead, which every replayed daemon handles as it
  handled SIGTERM.
"""
from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import traceback

from selfdrive_stub.supervisor.process import die_with_parent

_install_handler = signal.signal


def _keep_sigterm_fatal(signum, handler):
  """signal.signal for the daemon: SIGTERM stays at its default action (the previous handler reported is the
  default one); every other signal is installed as asked."""
  if signum == signal.SIGTERM:
    return signal.SIG_DFL
  return _install_handler(signum, handler)


def _reply(fd: int, **msg) -> None:
  os.write(fd, (json.dumps(msg) + "\n").encode())


def serve(target: str, reply_fd: int, commands=sys.stdin) -> int:
  module_name, _, func_name = target.partition(":")
  func = getattr(importlib.import_module(module_name), func_name)
  _reply(reply_fd, ready=True)
  for line in commands:
    cmd = json.loads(line)
    if "run" not in cmd:
      return 0
    try:
      rc = func(list(cmd["run"]))
    except SystemExit as e:   # argparse errors and sys.exit() inside main
      rc = e.code if isinstance(e.code, int) else 1
    except BaseException:
      traceback.print_exc()
      sys.stderr.flush()
      return 1
    sys.stdout.flush()
    sys.stderr.flush()
    _reply(reply_fd, returned=int(rc or 0))
  return 0


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  # a signal mask survives exec, and a harness may run where SIGINT is blocked (a Ray worker): the harness's
  # SIGINT must reach the daemon's handler, and SIGTERM must end the daemon
  signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
  if len(argv) >= 3 and argv[0] == "--exec" and argv[1].isdigit():
    die_with_parent(int(argv[1]))
    os.execv(sys.executable, [sys.executable, *argv[2:]])
  if len(argv) != 3 or ":" not in argv[0] or not argv[1].isdigit() or not argv[2].isdigit():
    print("process_replay.resident: started by the replay harness as MODULE:FUNCTION REPLY_FD PARENT_PID", file=sys.stderr)
    return 2
  die_with_parent(int(argv[2]))
  signal.signal(signal.SIGTERM, signal.SIG_DFL)
  signal.signal = _keep_sigterm_fatal
  return serve(argv[0], int(argv[1]))


if __name__ == "__main__":
  sys.exit(main())
