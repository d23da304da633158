"""`python -m runtime.faults`: plug or unplug the simulated USB+AMD device, arm or clear a fault of it or of the
OpenCL device (--device CL: `hang` only), show status.

The files live in the runtime dir: --runtime-dir DIR, else env PYMODELD_RUNTIME_DIR; DIR is the run's namespace
runtime dir ($XDG_RUNTIME_DIR/pymodeld/$OPENPILOT_PREFIX, else /tmp/pymodeld-$UID/$OPENPILOT_PREFIX), created
owner-only when it does not exist yet. A user mistake is one line on stderr and exit status 2.

Invariants:
- Without a runtime dir the one line names the flag and the variable to give it with, never a Python call.
- --device names whose fault file is written (USB+AMD's `usb_amd.fault` by default, CL's `cl.fault`); a kind
  the device cannot take, or plug/unplug for CL (present when an OpenCL driver is installed), is one line.
- A runtime dir that does not exist yet is created, owner-only (0700, and so is each missing parent), as the
  bus's namespace creates it: the device can be plugged or a fault armed before any piece of the run started.
  An existing path is used only if it is a directory of this user (not a symlink); its mode is left alone.
"""
from __future__ import annotations

import argparse
import os
import stat
import sys

from runtime import cl, config, faults, usb_amd
from runtime.device import DeviceUnavailable

SPEC_HELP = """fault SPEC grammar: KIND[@PARAM[,PARAM]] with PARAM after=N or factor=F; several specs joined by ';'
  KIND   hang            the queue stops; the next wait raises DeviceTimeout after wait_timeout_ms
         disconnect      every call raises DeviceDisconnected; the device unplugs itself
         slow            every command takes factor (>= 1) times as long
         nan             float readbacks become NaN
         transfer_error  the next transfer raises TransferError
  after=N  fire once N more model runs (compute submissions) were made after arming (default 0: next command)
  --device CL takes only hang (a user event the real OpenCL queue waits on)
examples: hang   disconnect@after=3   slow@factor=4,after=2   nan;transfer_error@after=10
          --device CL inject hang@after=20"""


PROG = "python -m runtime.faults"
NAME = "runtime.faults"   # how its one-line errors start
USAGE_EXIT = 2
# where the bus puts a namespace's runtime dir (msgq.namespace, which this layer does not import), as a user reads it
NAMESPACE_DIRS = "$XDG_RUNTIME_DIR/pymodeld/$OPENPILOT_PREFIX, else /tmp/pymodeld-$UID/$OPENPILOT_PREFIX"


class Parser(argparse.ArgumentParser):
  """argparse, but a bad flag or value is one line naming it (and `-h` for the rest), exit 2."""

  def error(self, message: str):
    self.exit(USAGE_EXIT, f"{PROG}: error: {' '.join(message.split())} (see {PROG} -h)\n")


def parse(argv):
  ap = Parser(prog=PROG, description=__doc__.split("\n\nInvariants:")[0], epilog=SPEC_HELP,
              formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--runtime-dir", metavar="DIR",
                  help=f"directory of the presence and fault files: the run's namespace runtime dir ({NAMESPACE_DIRS}; "
                       f"default env {config.RUNTIME_DIR_ENV}); created owner-only when missing")
  ap.add_argument("--device", choices=sorted(faults.FAULT_FILES), default="USB+AMD",
                  help="the device whose fault file inject, clear and status address (default USB+AMD; CL: hang only)")
  sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND", parser_class=Parser)
  sub.add_parser("plug", help="make the simulated device present")
  sub.add_parser("unplug", help="make it absent")
  inj = sub.add_parser("inject", help="arm a fault in a running device (SPEC: see below)", epilog=SPEC_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
  inj.add_argument("spec", metavar="SPEC")
  sub.add_parser("clear", help="remove the fault file (a fault that fired stays until the device reopens)")
  sub.add_parser("status", help="show presence and the armed fault file")
  return ap.parse_args(argv)


class RuntimeDirError(ValueError):
  """A runtime dir that cannot be used; the message names it and the fix."""


def private_dir(path: str) -> str:
  """`path`, created 0700 with each missing parent when it does not exist; RuntimeDirError when it exists as
  anything but a directory of this user (a symlink included)."""
  path = os.path.abspath(path)
  missing = []
  p = path
  while not os.path.lexists(p):
    missing.append(p)
    p = os.path.dirname(p)
  for p in reversed(missing):
    try:
      os.mkdir(p, 0o700)
    except FileExistsError:   # made meanwhile by someone else: checked below like any existing dir
      pass
    except OSError as e:
      raise RuntimeDirError(f"runtime dir {path} cannot be created: {e.strerror} at {p}") from None
  st = os.lstat(path)
  if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
    raise RuntimeDirError(f"runtime dir {path} is {'a symlink' if stat.S_ISLNK(st.st_mode) else 'not a directory'}; "
                          "name the run's namespace runtime dir itself")
  if st.st_uid != os.getuid():
    raise RuntimeDirError(f"runtime dir {path} belongs to uid {st.st_uid}, not to you (uid {os.getuid()}); "
                          "name a runtime dir of your own run")
  return path


def main(argv: list[str] | None = None) -> int:
  args = parse(argv)
  if args.runtime_dir:
    config.set_runtime_dir(args.runtime_dir)
  try:
    where = config.runtime_dir()
  except FileNotFoundError:   # its message is for a program (set_runtime_dir); a user of this tool gives a flag
    print(f"{NAME}: no runtime dir: pass --runtime-dir DIR or set {config.RUNTIME_DIR_ENV}=DIR, DIR being the run's "
          f"namespace runtime dir ({NAMESPACE_DIRS})", file=sys.stderr)
    return USAGE_EXIT
  try:
    private_dir(where)
  except RuntimeDirError as e:
    print(f"{NAME}: {e}", file=sys.stderr)
    return USAGE_EXIT
  if args.device != "USB+AMD" and args.cmd in ("plug", "unplug"):
    print(f"{NAME}: {args.cmd} is the USB+AMD simulator's; {args.device} is present when its OpenCL driver is installed "
          f"({cl.INSTALL_LINE})", file=sys.stderr)
    return USAGE_EXIT
  try:
    if args.cmd == "inject":
      print(faults.inject(args.spec, args.device))
    elif args.cmd == "clear":
      faults.clear(args.device)
    elif args.cmd == "plug":
      print(usb_amd.plug())
    elif args.cmd == "unplug":
      usb_amd.unplug()
    else:
      if args.device == "CL":
        try:
          print(f"CL present: OpenCL platform {', '.join(cl.platform_names())}")
        except DeviceUnavailable as e:
          print(f"CL absent: {e}")
      else:
        present, why = usb_amd.presence()
        print(f"USB+AMD {'present' if present else 'absent'}: {why}")
      path = faults.fault_file_path(args.device)
      text = open(path).read().strip() if os.path.exists(path) else "(none)"
      print(f"fault file {path}: {text}")
  except ValueError as e:  # a bad SPEC
    print(f"{NAME}: {' '.join(str(e).split())}", file=sys.stderr)
    return USAGE_EXIT
  except OSError as e:    # e.g. a runtime dir this user may not write
    print(f"{NAME}: {e.strerror}: {e.filename}", file=sys.stderr)
    return USAGE_EXIT
  return 0


if __name__ == "__main__":
  sys.exit(main())
