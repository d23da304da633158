"""Command-line entry points: a user's mistake is one line on stderr naming the bad value and the fix, exit 2.

Invariants:
- `run_cli(prog, main)` runs a CLI's main(); the project's typed errors that mean "this input or this setup
  cannot be used" (USER_ERRORS, plus a CLI's own) end it with `prog: <message> (<fix>)` on one line and exit
  status 2, never a traceback. Anything else is a bug and keeps its traceback.
- The CLIs run through `run_cli` are pieces of the bus: an OPENPILOT_PREFIX that is not one path component is
  refused before main() runs (one line, exit 2), the same way the manager refuses it.
- `Parser` is argparse's parser with the same rule for bad flags: one line (the error and where the help is)
  instead of the usage block, exit 2.
- Ctrl-C before a CLI installs its own handlers ends it quietly with 130.
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Callable

from msgq.namespace import prefix as namespace_prefix
from runtime import config as runtime_config
from runtime.cache import safe_dir

USAGE_EXIT = 2


class UsageError(ValueError):
  """A command-line value that cannot be used; the message names it and the fix."""


# The project's typed errors that mean "this input or this setup cannot be used", by module and class name. They
# are resolved against sys.modules when an error reaches run_cli: an error can only come from a module that is
# already imported, so a CLI imports none of them for this table (selfdrived and dmonitoringd start without
# numpy, the route reader or the runtime's devices). tests/daemons/shared/test_cli_errors.py checks every name.
USER_ERRORS: tuple[tuple[str, str], ...] = (
  ("msgq.env", "EnvError"), ("msgq.errors", "IpcError"), ("cereal.messaging.errors", "ServiceOwnershipError"),
  ("cereal.messaging.errors", "UnknownServiceError"), ("cereal.route", "RouteError"), ("visionipc.framefile", "FrameFileError"),
  ("visionipc.errors", "GeometryError"), ("visionipc.errors", "UnknownStreamError"), ("daemons.common.metadata", "ModelMetadataError"),
  ("common.cameras", "UnknownCameraError"), ("runtime.errors", "ModelError"), ("runtime.errors", "UnsupportedOpError"),
  ("runtime.errors", "UnsupportedDtypeError"), ("runtime.errors", "InputError"), ("runtime.device", "DeviceUnavailable"),
  ("runtime.errors", "CacheError"),
)

# the fix, for errors whose own message names the value but not what to do about it: (hint, words of a fix). A
# message that already holds those words carries its own fix (a ZMQ port taken by another program is not "another
# copy"; an OpenCL device that is missing names its install line, not --usb-gpu) and gets no hint.
HINTS: dict[tuple[str, str], tuple[str, str]] = {
  ("msgq.errors", "MultiplePublishersError"):
    ("another copy already runs in this namespace: stop it, or use another OPENPILOT_PREFIX", "OPENPILOT_PREFIX"),
  ("cereal.messaging.errors", "ServiceOwnershipError"):
    ("run it under its own name: PYMODELD_PROCESS=<owner>, as the manager does", "PYMODELD_PROCESS="),
  ("runtime.device", "DeviceUnavailable"): ("start the stack with `pymodeld-manager --usb-gpu` for the USB+AMD device", "install: "),
  ("runtime.errors", "CacheError"):
    ("set PYMODELD_CACHE_DIR to a new directory of your own, e.g. under your home; never a shared dir such as /tmp",
     "a new directory of your own"),
}


def loaded(name: tuple[str, str]) -> type[BaseException] | None:
  """The error class `name` names, if its module is imported (else nothing can have raised it)."""
  module = sys.modules.get(name[0])
  return getattr(module, name[1]) if module is not None else None


def user_errors() -> tuple[type[BaseException], ...]:
  return (UsageError, PermissionError, *filter(None, map(loaded, USER_ERRORS)))


def check_cache_dir() -> None:
  """CacheError now, at a daemon's start, when the compiled-code cache it will use is unsafe, not after it has
  waited for frames and compiled (then every restart by the manager repeated it)."""
  if runtime_config.disk_cache_enabled():
    safe_dir(runtime_config.cache_dir())


def one_line(error: BaseException, hints: dict | None = None) -> str:
  """The error's message on one line, with the fix for its type when the message does not give one."""
  text = " ".join(str(error).split()) or type(error).__name__
  kinds = [(loaded(name), *hint) for name, hint in HINTS.items()] + [(kind, hint, hint) for kind, hint in (hints or {}).items()]
  for kind, hint, named in kinds:
    if kind is not None and isinstance(error, kind) and named not in text:
      return f"{text} ({hint})"
  return text


def run_cli(prog: str, main: Callable[[], int | None], errors: tuple = (), hints: dict | None = None) -> None:
  """sys.exit(main()); a user error (USER_ERRORS + `errors`) becomes one line `prog: ...` and exit 2."""
  try:
    namespace_prefix()
  except ValueError as e:
    print(f"{prog}: {one_line(e)} (set OPENPILOT_PREFIX to a name without '/', or unset it)", file=sys.stderr, flush=True)
    sys.exit(USAGE_EXIT)
  try:
    code = main()
  except KeyboardInterrupt:
    sys.exit(130)
  except Exception as e:
    if not isinstance(e, user_errors() + tuple(errors)):
      raise
    print(f"{prog}: {one_line(e, hints)}", file=sys.stderr, flush=True)
    sys.exit(USAGE_EXIT)
  sys.exit(code or 0)


def stop_on_signals() -> threading.Event:
  """The processes' one stop idiom: SIGINT or SIGTERM sets the event; the loop finishes its current step, then
  the process says so and returns 0."""
  stop = threading.Event()
  for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, lambda *_: stop.set())
  return stop


class Parser(argparse.ArgumentParser):
  """argparse, but a bad flag or value is one line naming it (and `-h` for the rest), exit 2."""

  def error(self, message: str):
    self.exit(USAGE_EXIT, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} -h)\n")
