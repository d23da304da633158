"""Why a model's 2-thread time on a VM moves from minute to minute: our runtime at 1 and 2 threads on one model, each
round followed by two probes of what the host gives two threads right then.

    python -m bench.host_pair [--model mobilenet_v2] [--seconds 150] [--block 15]

Each round times --block runs of the model at 1 thread, then at 2 (median each), then runs bench.host_probe's two
probes (each on 1 thread, then on 2 at once): fma, the 2-thread time of a register-only FMA loop over its 1-thread
time, and stream, the 2-thread bandwidth of a 64 MiB read over its 1-thread bandwidth.
At the end the rounds are grouped by the model's 2-thread speed-up (< 1.3, 1.3-1.6, >= 1.6) with the probes'
medians in each group; the run is appended to bench/results/host_pair.json. The probes run after the model's
blocks, so a round at the edge of a change of placement can pair a model figure with a probe of the other state.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from bench import runtime_vs_ort as rvo
from bench.host_probe import STREAM_APART, HostProbe
from bench.make_nets import NETS_DIR, model_groups
from bench.results import record
from runtime import OnnxRunner

GROUPS = ((0.0, 1.3, "< 1.3"), (1.3, 1.6, "1.3-1.6"), (1.6, 99.0, ">= 1.6"))


def parse():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--model", default="mobilenet_v2", help="a standard model of bench.runtime_vs_ort (substring)")
  p.add_argument("--seconds", type=float, default=150.0, help="how long to keep taking rounds")
  p.add_argument("--block", type=int, default=15, help="runs per thread count per round (median)")
  return p.parse_args()


def main():
  args = parse()
  found = [(n, p) for n, p in model_groups(NETS_DIR)["standard"] if args.model in n]
  if not found:
    print(f"host_pair: no standard model matches {args.model!r} (python -m bench.make_nets writes them)", file=sys.stderr)
    raise SystemExit(2)
  name, path = found[0]
  runners = {n: OnnxRunner(path, cache=rvo.CACHE, threads=n) for n in (1, 2)}
  feeds = rvo.feeds_for(runners[1])
  rounds = []
  end = time.monotonic() + args.seconds
  with HostProbe() as probe:
    while time.monotonic() < end:
      ms = {}
      for n, r in runners.items():
        ms[n] = statistics.median(rvo.block_times(lambda: r(**feeds), args.block)) * 1e3
      rd = {"ms@1": ms[1], "ms@2": ms[2], "speedup": ms[1] / ms[2], "fma": probe.fma(), "stream": probe.stream()}
      rounds.append(rd)
      print(f"{name}: 1 thread {ms[1]:.2f} ms, 2 threads {ms[2]:.2f} ms (x{rd['speedup']:.2f}) | probes, 2 threads over 1: "
            f"fma time x{rd['fma']:.2f}, stream bandwidth x{rd['stream']:.2f}", flush=True)
  groups = []
  for lo, hi, label in GROUPS:
    sel = [r for r in rounds if lo <= r["speedup"] < hi]
    if sel:
      g = {"speedup": label, "rounds": len(sel), "fma_median": statistics.median(r["fma"] for r in sel),
           "stream_median": statistics.median(r["stream"] for r in sel),
           "stream_apart": sum(r["stream"] > STREAM_APART for r in sel) / len(sel)}
      groups.append(g)
      print(f"speed-up {label}: {len(sel)} rounds; fma x{g['fma_median']:.2f}, stream x{g['stream_median']:.2f} (median); "
            f"stream above {STREAM_APART} in {100 * g['stream_apart']:.0f}% of them")
  figures = {"model": name, "block": args.block, "seconds": args.seconds, "cpu": rvo.cpu_info(), "groups": groups,
             "speedup_median": float(np.median([r["speedup"] for r in rounds])) if rounds else None, "rounds": rounds}
  print(f"recorded in {record('host_pair', figures)}")


if __name__ == "__main__":
  main()
