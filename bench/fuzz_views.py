#!/usr/bin/env python3
"""Long differential fuzzing of views against onnxruntime: tests/runtime/view_fuzz.py in a child process (a crash
of generated code is reported with the case that caused it, not a dead bench), and the counts recorded with
bench/results.py: graphs, compared, equal, refused, invalid (onnxruntime rejects the graph), failed.

  python -m bench.fuzz_views --graphs N --seed S
"""
import argparse
import ast
import os
import signal
import subprocess
import sys

from bench.results import record

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO_ROOT, "tests", "runtime", "view_fuzz.py")


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--graphs", type=int, default=1000)
  p.add_argument("--seed", type=int, default=0)
  a = p.parse_args(argv)
  if a.graphs < 0:
    p.error("--graphs must be >= 0")
  proc = subprocess.run([sys.executable, SCRIPT, "--graphs", str(a.graphs), "--seed", str(a.seed)], capture_output=True,
                        text=True, cwd=REPO_ROOT)
  if proc.returncode != 0:
    last = [ln for ln in proc.stderr.splitlines() if ln.startswith("case ")][-1:]
    how = signal.Signals(-proc.returncode).name if proc.returncode < 0 else f"exit {proc.returncode}"
    print(f"fuzz_views: the child died ({how}) at {last[0] if last else 'startup'}", file=sys.stderr)
    print(proc.stderr[-3000:], file=sys.stderr)
    return 1
  counts = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
  for f in counts["failures"]:
    print(f"FAILED {f[:2000]}")
  figures = {k: counts[k] for k in ("graphs", "seed", "compared", "equal", "refused", "invalid", "failed")}
  print(" ".join(f"{k}={v}" for k, v in figures.items()))
  record("fuzz_views", figures, argv=[sys.argv[0], *(sys.argv[1:] if argv is None else argv)])
  return 1 if counts["failed"] else 0


if __name__ == "__main__":
  sys.exit(main())
