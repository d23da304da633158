"""A/B of who computes the conv GEMMs: our runtime with PYMODELD_GEMM=auto (the generated micro-kernel where
its heuristic picks it) against PYMODELD_GEMM=blas (OpenBLAS's sgemm everywhere), both against onnxruntime.

    python -m bench.gemm_ab [--models resnet50,vgg19,inception] [--iters 15] [--block 3] [--mode auto|micro]

One process, one thread per engine, the standard models of bench.runtime_vs_ort. The three engines run the same
inputs in alternating blocks (--block runs of one, then the next; the order rotates every round), so a load
change on a shared machine hits all of them alike; each figure is the median run. Before timing, both of ours are
checked against onnxruntime (max |x - ort| / max |ort|) and the micro-kernel program is run twice for
bit-identical outputs. Each run, with the load average before and after every model, is appended to
bench/results/gemm_ab.json."""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import onnxruntime as ort

from bench import runtime_vs_ort as rvo
from bench.results import record
from runtime import OnnxRunner
from runtime.config import GEMM_ENV


def parse():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--models", default="", help="comma-separated substrings of standard model names (default: all)")
  p.add_argument("--iters", type=int, default=15, help="timed runs per engine")
  p.add_argument("--block", type=int, default=3, help="consecutive runs of one engine before the next")
  p.add_argument("--mode", default="auto", choices=("auto", "micro"), help="the micro-kernel side's PYMODELD_GEMM")
  p.add_argument("--groups", default="standard", help="comma-separated model groups of bench.runtime_vs_ort "
                 "(standard, daemons, daemon_shaped); the geomeans cover the standard models only")
  return p.parse_args()


def runner(path: str, mode: str) -> OnnxRunner:
  os.environ[GEMM_ENV] = mode   # read when the program is built: each side's setting lasts for its build only
  try:
    return OnnxRunner(path, cache=rvo.CACHE, threads=1)
  finally:
    os.environ.pop(GEMM_ENV, None)


def bench(group: str, name: str, path: str, args) -> dict:
  ours = {"micro": runner(path, args.mode), "blas": runner(path, "blas")}
  feeds = rvo.feeds_for(ours["blas"])
  so = ort.SessionOptions()
  so.intra_op_num_threads, so.inter_op_num_threads, so.log_severity_level = 1, 1, 3
  sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
  ort_feeds = {i.name: feeds[i.name] for i in sess.get_inputs()}
  names = [o.name for o in sess.get_outputs()]
  ref = sess.run(None, ort_feeds)
  errs = {k: rvo.rel_err([r(**feeds)[n] for n in names], ref) for k, r in ours.items()}
  first = {k: np.array(v) for k, v in ours["micro"](**feeds).items()}
  again = ours["micro"](**feeds)
  identical = all(np.array_equal(first[k], np.asarray(again[k])) for k in first)
  runs = [("micro", lambda: ours["micro"](**feeds)), ("blas", lambda: ours["blas"](**feeds)),
          ("ort", lambda: sess.run(None, ort_feeds))]
  times = {k: [] for k, _ in runs}
  load_before = os.getloadavg()[0]
  for r in range(-(-args.iters // args.block)):
    for k, fn in runs[r % len(runs):] + runs[:r % len(runs)]:
      for _ in range(args.block):
        t0 = time.perf_counter()
        fn()
        times[k].append(time.perf_counter() - t0)
  med = {k: statistics.median(v) for k, v in times.items()}
  row = {"model": name, "group": group, "ms": {k: v * 1e3 for k, v in med.items()}, "micro_ort": med["micro"] / med["ort"],
         "blas_ort": med["blas"] / med["ort"], "micro_blas": med["micro"] / med["blas"], "rel_err": errs,
         "bit_identical": identical, "micro_gemms": sum(k.tags.get("gemm") == "micro" for k in ours["micro"].program.kernels),
         "load1": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
  print(f"  {name:22s} micro/ort {row['micro_ort']:.3f}  blas/ort {row['blas_ort']:.3f}  micro/blas {row['micro_blas']:.3f}"
        f"  ({row['micro_gemms']} micro GEMMs, identical {identical}, load {row['load1'][0]:.2f}->{row['load1'][1]:.2f})",
        flush=True)
  return row


def main():
  args = parse()
  args.quick = False
  groups = args.groups.split(",")
  rows = [bench(group, name, path, args) for group, name, path in rvo.models(args) if group in groups]

  def geo(key):
    vals = [r[key] for r in rows if r["group"] == "standard"]
    return float(np.exp(np.mean(np.log(vals)))) if vals else None
  figures = {"rows": rows, "geomean_micro_ort": geo("micro_ort"), "geomean_blas_ort": geo("blas_ort"),
             "geomean_micro_blas": geo("micro_blas"), "cpu": rvo.cpu_info(), "iters": args.iters, "block": args.block,
             "mode": args.mode}
  if figures["geomean_micro_ort"] is not None:
    print(f"geomean micro/ort {figures['geomean_micro_ort']:.3f}  blas/ort {figures['geomean_blas_ort']:.3f}  "
          f"micro/blas {figures['geomean_micro_blas']:.3f}")
  print(f"recorded in {record('gemm_ab', figures)}")


if __name__ == "__main__":
  main()
