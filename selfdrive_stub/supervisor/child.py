"""Entry point of a managed child: `python -P -m selfdrive_stub.supervisor.child NAME MODULE [ARGS...]` (process.run_child).

The manager stops a child with SIGINT at any moment, also while its interpreter is still importing this entry's
own dependencies; Python's default handler would then print a KeyboardInterrupt traceback from the middle of an
import, which the manager relays as if the child had crashed. So the manager starts a child with SIGINT blocked
(process.spawn_child), and the first thing done here is to make SIGINT a quiet exit (130, as a shell reports it) and
unblock it; run_child puts the default handler back just before the daemon's module
runs, so the daemon sees SIGINT as it always does."""
import os
import signal

signal.signal(signal.SIGINT, lambda *_: os._exit(130))   # before anything slow is imported
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})   # process.spawn_child blocked it across exec

import sys  # noqa: E402

from selfdrive_stub.supervisor.process import run_child  # noqa: E402

if __name__ == "__main__":
  run_child(sys.argv[1:])
