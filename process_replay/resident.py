"""The replayed process's side of a resident daemon: import once, run the daemon's main() once per route.

    python -m process_replay.resident MODULE:FUNCTION REPLY_FD   (started by the harness, never by hand)

Protocol (the harness is the only peer): commands are JSON lines on stdin, replies JSON lines on the
inherited file descriptor REPLY_FD.
- after importing MODULE it replies {"ready": true}; the import (numpy, onnx, the runtime) is most of a
  daemon's launch, so the harness starts this early and overlaps it with its own work;
- {"run": [args...]} calls FUNCTION(args) in the main thread, exactly as `python -m` would; when it returns
  (the harness stops a route with SIGTERM and one open gate) the reply is {"returned": code};
- {"exit": true} or end of input: exit 0. An exception from FUNCTION prints its traceback and exits 1, so a
  daemon that dies mid-route is a dead process to the harness, as without the resident wrapper.

Invariants: everything a route can change lives inside FUNCTION's frame (its sockets, state, model objects),
so the next run starts from the daemon's initial state; what survives is only what the daemon itself keeps
at module level (imports, the runtime's in-process compile cache). tests/process_replay pins this by
replaying routes A, B, A in one resident and getting A's bytes twice.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import traceback

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


def main() -> int:
  if len(sys.argv) != 3 or ":" not in sys.argv[1] or not sys.argv[2].isdigit():
    print("process_replay.resident: started by the replay harness as MODULE:FUNCTION REPLY_FD", file=sys.stderr)
    return 2
  return serve(sys.argv[1], int(sys.argv[2]))


if __name__ == "__main__":
  sys.exit(main())
