"""Where a benchmark keeps its runs: bench/results/<bench>.json is a JSON list of runs, newest last; each run
records when it ran, the exact command, what the machine was doing, and the bench's figures. README.md's table
quotes the newest run of each; bench/RESULTS.md says how to read the history."""
from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import sys
import tempfile

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def machine() -> dict:
  load1, _, _ = os.getloadavg()
  return {"cpus": os.cpu_count(), "load1_at_end": round(load1, 2), "machine": platform.machine(),
          "python": platform.python_version()}


def record(bench: str, figures: dict, argv: list[str] | None = None, note: str = "") -> str:
  """Append one run to bench/results/<bench>.json (atomically: a killed bench leaves the old file whole)."""
  os.makedirs(RESULTS_DIR, exist_ok=True)
  path = os.path.join(RESULTS_DIR, f"{bench}.json")
  runs = []
  if os.path.exists(path):
    with open(path) as f:
      runs = json.load(f)
    if isinstance(runs, dict):   # a file written before the benches appended: its one run comes first
      runs = [runs]
  argv = sys.argv if argv is None else argv
  runs.append({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "command": " ".join(shlex.quote(a) for a in ["python", "-m", f"bench.{bench}", *argv[1:]]),
               "machine": machine(), "note": note, "figures": figures})
  fd, tmp = tempfile.mkstemp(dir=RESULTS_DIR, prefix=f".{bench}.", suffix=".json")
  with os.fdopen(fd, "w") as f:
    json.dump(runs, f, indent=1, sort_keys=True)
    f.write("\n")
  os.replace(tmp, path)
  return path
