"""The driver-monitoring model on the OpenCL device against the CPU target, in one process on the same inputs.

    python -m bench.cl_vs_cpu [--runs 60] [--block 5] [--model PATH]

Both runners are OnnxRunners over the same model file (the CPU target at its default threads, CL on the first
OpenCL device the loader finds: pocl's CPU device on a machine without a GPU driver). Before timing, the CL outputs
are checked against the CPU's (max |cl - cpu| over every output). Timing: the two run the same random input in
alternating blocks of --block runs, so a load change on this shared machine hits both alike, after one warm-up run
each; each figure is the median of --runs whole runs (upload, compute, readback: what a daemon waits for), and
the ratio is CL / CPU. The median stage times (upload, model, readback from the device timeline) are reported too. Each run is appended to
bench/results/cl_vs_cpu.json.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from bench.results import record
from daemons.common.stage_times import last_stage_times
from runtime import OnnxRunner

DM_MODEL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "daemons", "dmonitoringmodeld",
                        "models", "dmonitoring_model.onnx")


def feeds_for(runner: OnnxRunner, seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  return {n: rng.integers(0, 256, s, dtype=np.uint8) if np.dtype(d) == np.uint8 else rng.standard_normal(s).astype(d)
          for n, (s, d) in runner.input_specs.items()}


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--runs", type=int, default=60, help="timed runs per device")
  ap.add_argument("--block", type=int, default=5, help="runs of one device before switching to the other")
  ap.add_argument("--model", default=DM_MODEL, help="the ONNX model (default: dmonitoringmodeld's)")
  args = ap.parse_args(argv)

  runners = {"CPU": OnnxRunner(args.model, device="CPU"), "CL": OnnxRunner(args.model, device="CL")}
  feeds = feeds_for(runners["CPU"])
  outs = {dev: r.run(feeds) for dev, r in runners.items()}   # also the warm-up run
  diff = max(float(np.max(np.abs(outs["CL"][n].astype(np.float64) - outs["CPU"][n]))) for n in outs["CPU"])
  walls: dict[str, list[float]] = {dev: [] for dev in runners}
  stages: dict[str, dict[str, list[float]]] = {dev: {} for dev in runners}
  while len(walls["CL"]) < args.runs:
    for dev, r in runners.items():
      for _ in range(min(args.block, args.runs - len(walls[dev]))):
        t0 = time.perf_counter()
        r.run(feeds)
        walls[dev].append(time.perf_counter() - t0)
        t = last_stage_times(r)
        for k in ("upload", "model", "readback"):
          stages[dev].setdefault(k, []).append(getattr(t, k))
  figures = {"model": os.path.relpath(args.model, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
             "runs": args.runs, "max_abs_diff": diff, "kernels": len(runners["CL"].program.kernels)}
  for dev in runners:
    figures[f"{dev.lower()}_ms"] = round(float(np.median(walls[dev])) * 1e3, 4)
    figures[f"{dev.lower()}_stages_ms"] = {k: round(float(np.median(v)) * 1e3, 4) for k, v in stages[dev].items()}
  figures["cl_over_cpu"] = round(figures["cl_ms"] / figures["cpu_ms"], 2)
  print(f"{figures['model']}: CPU {figures['cpu_ms']:.3f} ms, CL {figures['cl_ms']:.3f} ms per run (median of "
        f"{args.runs}), CL/CPU {figures['cl_over_cpu']:.2f}x; max |cl - cpu| {diff:.2e}")
  for dev in runners:
    print(f"  {dev} stages (median ms): " + ", ".join(f"{k} {v:.3f}" for k, v in figures[f"{dev.lower()}_stages_ms"].items()))
  print(f"recorded in {record('cl_vs_cpu', figures)}")


if __name__ == "__main__":
  main()
