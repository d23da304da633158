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
import sys
from typing import Callable

from cereal.messaging.errors import ServiceOwnershipError, UnknownServiceError
from cereal.route import RouteError
from daemons.common.cameras import UnknownCameraError
from daemons.common.metadata import ModelMetadataError
from msgq.env import EnvError
from msgq.errors import IpcError, MultiplePublishersError
from msgq.namespace import prefix as namespace_prefix
from runtime.device import DeviceUnavailable
from runtime import config as runtime_config
from runtime.cache import safe_dir
from runtime.errors import CacheError, InputError, ModelError, UnsupportedDtypeError, UnsupportedOpError
from visionipc.errors import GeometryError, UnknownStreamError
from visionipc.framefile import FrameFileError

USAGE_EXIT = 2


class UsageError(ValueError):
  """A command-line value that cannot be used; the message names it and the fix."""


USER_ERRORS: tuple[type[BaseException], ...] = (
  UsageError, EnvError, IpcError, ServiceOwnershipError, UnknownServiceError, RouteError, FrameFileError,
  GeometryError, UnknownStreamError, ModelMetadataError, UnknownCameraError, ModelError, UnsupportedOpError,
  UnsupportedDtypeError, InputError, DeviceUnavailable, PermissionError, CacheError,
)

# the fix, for errors whose own message names the value but not what to do about it
HINTS: dict[type[BaseException], str] = {
  MultiplePublishersError: "another copy already runs in this namespace: stop it, or use another OPENPILOT_PREFIX",
  ServiceOwnershipError: "run it under its own name: PYMODELD_PROCESS=<owner>, as the manager does",
  DeviceUnavailable: "start the stack with `pymodeld-manager --usb-gpu` for the USB+AMD device",
  CacheError: "set PYMODELD_CACHE_DIR to a new path of your own, e.g. under your home; never a shared dir such as /tmp",
}


def check_cache_dir() -> None:
  """CacheError now, at a daemon's start, when the compiled-code cache it will use is unsafe, not after it has
  waited for frames and compiled (then every restart by the manager repeated it)."""
  if runtime_config.disk_cache_enabled():
    safe_dir(runtime_config.cache_dir())


def one_line(error: BaseException, hints: dict | None = None) -> str:
  """The error's message on one line, with the fix for its type when the message does not give one."""
  text = " ".join(str(error).split()) or type(error).__name__
  for kind, hint in {**HINTS, **(hints or {})}.items():
    if isinstance(error, kind) and hint not in text:
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
  except USER_ERRORS + tuple(errors) as e:
    print(f"{prog}: {one_line(e, hints)}", file=sys.stderr, flush=True)
    sys.exit(USAGE_EXIT)
  except KeyboardInterrupt:
    sys.exit(130)
  sys.exit(code or 0)


class Parser(argparse.ArgumentParser):
  """argparse, but a bad flag or value is one line naming it (and `-h` for the rest), exit 2."""

  def error(self, message: str):
    self.exit(USAGE_EXIT, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} -h)\n")
