"""`python -m runtime.faults`: plug or unplug the simulated USB+AMD device, arm or clear a fault, show status.

The files live in the runtime dir: --runtime-dir DIR, else env PYMODELD_RUNTIME_DIR (the manager's namespace
runtime dir, which it prints). A user mistake is one line on stderr and exit status 2."""
from __future__ import annotations

import argparse
import os
import sys

from runtime import config, faults, usb_amd

SPEC_HELP = """fault SPEC grammar: KIND[@PARAM[,PARAM]] with PARAM after=N or factor=F; several specs joined by ';'
  KIND   hang            the queue stops; the next wait raises DeviceTimeout after wait_timeout_ms
         disconnect      every call raises DeviceDisconnected; the device unplugs itself
         slow            every command takes factor (>= 1) times as long
         nan             float readbacks become NaN
         transfer_error  the next transfer raises TransferError
  after=N  fire once N more model runs (compute submissions) were made after arming (default 0: next command)
examples: hang   disconnect@after=3   slow@factor=4,after=2   nan;transfer_error@after=10"""


def parse(argv):
  ap = argparse.ArgumentParser(prog="python -m runtime.faults", description=__doc__, epilog=SPEC_HELP,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--runtime-dir", help="directory of the presence and fault files (default env "
                                        f"{config.RUNTIME_DIR_ENV})")
  sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
  sub.add_parser("plug", help="make the simulated device present")
  sub.add_parser("unplug", help="make it absent")
  inj = sub.add_parser("inject", help="arm a fault in a running device (SPEC: see below)", epilog=SPEC_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
  inj.add_argument("spec", metavar="SPEC")
  sub.add_parser("clear", help="remove the fault file (a fault that fired stays until the device reopens)")
  sub.add_parser("status", help="show presence and the armed fault file")
  return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
  args = parse(argv)
  if args.runtime_dir:
    config.set_runtime_dir(args.runtime_dir)
  try:
    where = config.runtime_dir()
  except FileNotFoundError as e:
    print(f"runtime.faults: {e}", file=sys.stderr)
    return 2
  if not os.path.isdir(where):
    print(f"runtime.faults: runtime dir {where} does not exist", file=sys.stderr)
    return 2
  try:
    if args.cmd == "inject":
      print(faults.inject(args.spec))
    elif args.cmd == "clear":
      faults.clear()
    elif args.cmd == "plug":
      print(usb_amd.plug())
    elif args.cmd == "unplug":
      usb_amd.unplug()
    else:
      present, why = usb_amd.presence()
      print(f"USB+AMD {'present' if present else 'absent'}: {why}")
      path = faults.fault_file_path()
      text = open(path).read().strip() if os.path.exists(path) else "(none)"
      print(f"fault file {path}: {text}")
  except ValueError as e:  # a bad SPEC
    print(f"runtime.faults: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
