#!/usr/bin/env python3
"""The long run of route-loading fuzzing (the suite runs a bounded one): many hypothesis examples in a child
process, reporting its exit (a negative code is a signal death), the outcome counts and the peak RSS.

  python -m bench.fuzz_routes [--examples 20000] [--seed S]
"""
import argparse
import os
import subprocess
import sys
import time

from bench.results import record

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--examples", type=int, default=20000, help="hypothesis examples (default 20000)")
  ap.add_argument("--seed", type=int, default=None, help="hypothesis seed (default random, printed)")
  args = ap.parse_args()
  cmd = [sys.executable, os.path.join(ROOT, "tests", "cereal", "route_fuzz.py"), "--examples", str(args.examples)]
  if args.seed is not None:
    cmd += ["--seed", str(args.seed)]
  t0 = time.monotonic()
  r = subprocess.run(cmd, cwd=ROOT)
  seconds = time.monotonic() - t0
  print(f"exit {r.returncode} after {seconds:.0f} s")
  figures = {"examples": args.examples, "seed": args.seed, "exit": r.returncode, "seconds": round(seconds, 1)}
  print(f"recorded in {record('fuzz_routes', figures)}")
  return 0 if r.returncode == 0 else 1


if __name__ == "__main__":
  sys.exit(main())
