"""Process replay's real-time factor per daemon: route seconds replayed per wall second, launch included.

    python -m bench.replay_speed [--routes tici] [--procs selfdrived dmonitoringd ...] [--rounds 3]

Each round runs the user's command once per process, `python -m process_replay --routes R --procs P -j 1`, as its
own CLI (so each daemon's launch is the first task's, overlapped with nothing but the harness loading the route),
and reads the CLI's per-process summary line: the real-time factor with the launch included and while stepping.
The processes take turns within a round, so a load change on this shared machine hits all of them alike; each
figure is the median over the rounds, and dmonitoringd, the other consumer, is the peer the others are given
against (selfdrived steps 100 times per route second, dmonitoringd 20). A run whose replay does not pass is
still timed and says so. The load average is taken before each replay. Each run is appended to
bench/results/replay_speed.json.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys

from bench.results import record
from process_replay.configs import CONFIGS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER = "dmonitoringd"
TARGET = {"selfdrived": 20.0}   # launch included, -j 1
# the CLI's per-process line: "  selfdrived          24.51x (41.15x stepping) over 10.5 route s in 1 task(s)"
SUMMARY = re.compile(r"^\s+(\S+)\s+([0-9.]+)x \(([0-9.]+)x stepping\) over ([0-9.]+) route s", re.M)


def replay_once(route: str, proc: str, timeout_s: float) -> dict:
  """One CLI run for one process: its factors, whether it passed, and the load average before it."""
  load = os.getloadavg()[0]
  cmd = [sys.executable, "-m", "process_replay", "--routes", route, "--procs", proc, "-j", "1"]
  r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
  found = {m.group(1): m for m in SUMMARY.finditer(r.stdout)}
  if proc not in found:
    raise SystemExit(f"bench.replay_speed: {' '.join(cmd[1:])} printed no summary for {proc} (exit {r.returncode}):\n"
                     f"{(r.stdout + r.stderr)[-2000:]}")
  m = found[proc]
  return {"x_real": float(m.group(2)), "x_step": float(m.group(3)), "route_s": float(m.group(4)),
          "passed": r.returncode == 0, "load1_before": round(load, 2)}


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--routes", default="tici", help="one sample route name or route directory (default: tici)")
  ap.add_argument("--procs", nargs="+", choices=sorted(CONFIGS), default=["selfdrived", PEER, "dmonitoringmodeld", "modeld"],
                  help="processes, each replayed by its own CLI run (default: all four)")
  ap.add_argument("--rounds", type=int, default=3, help="CLI runs per process, taking turns (default: 3)")
  ap.add_argument("--timeout-s", type=float, default=600.0, help="limit for one CLI run")
  args = ap.parse_args(argv)
  if args.rounds < 1:
    ap.error("--rounds must be at least 1")

  runs: dict[str, list[dict]] = {p: [] for p in args.procs}
  for n in range(args.rounds):
    for proc in args.procs:
      one = replay_once(args.routes, proc, args.timeout_s)
      runs[proc].append(one)
      print(f"round {n + 1}/{args.rounds} {proc:18s} {one['x_real']:6.2f}x real ({one['x_step']:.2f}x stepping) "
            f"load {one['load1_before']:.2f}{'' if one['passed'] else '  (replay did not pass)'}", flush=True)

  figures: dict = {"route": args.routes, "rounds": args.rounds, "procs": {}}
  for proc, rs in runs.items():
    figures["procs"][proc] = {
      "x_real_median": round(statistics.median(r["x_real"] for r in rs), 2),
      "x_step_median": round(statistics.median(r["x_step"] for r in rs), 2),
      "x_real_runs": [r["x_real"] for r in rs], "x_step_runs": [r["x_step"] for r in rs],
      "load1_before": [r["load1_before"] for r in rs], "all_passed": all(r["passed"] for r in rs),
      "route_s": rs[0]["route_s"]}
  peer = figures["procs"].get(PEER)
  print(f"median over {args.rounds} round(s), route {args.routes}, -j 1, launch included (stepping only):")
  for proc, f in figures["procs"].items():
    line = f"  {proc:18s} {f['x_real_median']:6.2f}x ({f['x_step_median']:.2f}x stepping)"
    if peer and proc != PEER:
      f["over_peer"] = round(f["x_real_median"] / peer["x_real_median"], 3)
      line += f", {f['over_peer']:.2f} of {PEER}'s"
    if proc in TARGET:
      f["target_x_real"] = TARGET[proc]
      line += f"; target {TARGET[proc]:g}x: {'met' if f['x_real_median'] >= TARGET[proc] else 'NOT met'}"
    print(line + ("" if f["all_passed"] else "  (a replay did not pass)"))
  print(f"recorded in {record('replay_speed', figures)}")


if __name__ == "__main__":
  main()
