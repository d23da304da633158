#!/usr/bin/env python3
"""Long fuzzing of the bus, frame and message layers: the suite's hypothesis properties, randomized and run
for minutes instead of a bounded number of examples.

Properties (each in tests/, each run in a child process so a signal, hang or runaway memory is caught):
  decode    tests/cereal/fuzz_decode.py     cereal decoding of mutated messages of every service
  ring      tests/msgq/fuzz_ring.py         random sends, slow readers and header corruption on the ring
  announce  tests/visionipc/fuzz_announce.py  forged, replayed and garbage VisionIPC announcements
Rounds rotate through the properties until the time is up; each round is a fresh random search. Exit 1 on
the first failure, with the child's output (hypothesis prints the shrunk failing case).

  python -m bench.fuzz_bus [--minutes N] [--only decode,ring,announce] [--examples N]
"""
import argparse
import ast
import os
import signal
import subprocess
import sys
import time

from bench.results import record

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROPERTIES = {"decode": ("tests/cereal/fuzz_decode.py", 2000), "ring": ("tests/msgq/fuzz_ring.py", 200),
              "announce": ("tests/visionipc/fuzz_announce.py", 200)}
ROUND_TIMEOUT_S = 1800


def run_round(name: str, examples: int) -> dict:
  path, _ = PROPERTIES[name]
  args = [sys.executable, os.path.join(REPO_ROOT, path), str(examples), "--random"]
  start = time.monotonic()
  r = subprocess.run(args, cwd=REPO_ROOT, capture_output=True, text=True, timeout=ROUND_TIMEOUT_S)
  if r.returncode < 0:
    raise SystemExit(f"{name}: killed by {signal.Signals(-r.returncode).name}\n{r.stdout}\n{r.stderr}")
  if r.returncode != 0:
    raise SystemExit(f"{name}: failed\n{r.stdout}\n{r.stderr}")
  stats = ast.literal_eval(r.stdout.strip().splitlines()[-1])
  stats["seconds"] = round(time.monotonic() - start, 1)
  return stats


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--minutes", type=float, default=10, help="total time to fuzz (default 10)")
  ap.add_argument("--only", default=",".join(PROPERTIES), help="subset of " + ",".join(PROPERTIES))
  ap.add_argument("--examples", type=int, help="examples per round (default: per property)")
  args = ap.parse_args()
  names = [n for n in args.only.split(",") if n]
  unknown = [n for n in names if n not in PROPERTIES]
  if unknown or not names:
    ap.error(f"--only takes names from {','.join(PROPERTIES)}, got {args.only!r}")
  deadline, rounds, per_property = time.monotonic() + 60 * args.minutes, 0, {n: 0 for n in names}
  try:
    while time.monotonic() < deadline:
      name = names[rounds % len(names)]
      stats = run_round(name, args.examples or PROPERTIES[name][1])
      rounds += 1
      per_property[name] += 1
      print(f"round {rounds:3d} {name:9s} {stats}", flush=True)
  except SystemExit as failure:   # a failing round is recorded too, with what failed
    record("fuzz_bus", {"rounds": rounds, "rounds_per_property": per_property, "failure": str(failure.code).splitlines()[0]})
    raise
  print(f"{rounds} rounds, no failure")
  print(f"recorded in {record('fuzz_bus', {'rounds': rounds, 'rounds_per_property': per_property, 'failure': None})}")


if __name__ == "__main__":
  main()
