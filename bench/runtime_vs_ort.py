"""Replay time of the pymodeld runtime against onnxruntime and OpenVINO on models with non-constant weights.

    python -m bench.runtime_vs_ort [--iters 30] [--models dm,small] [--threads 1,2] [--no-openvino]
                                   [--compile] [--per-kernel N]

Models (bench/make_nets.py writes them once, deterministically): our daemons' models (daemons/*/models), two
nets of our own shaped like them (a 1-channel 1440x960 patchify net, a depthwise mobilenet-like net), and the
onnx package's light models with their ConstantOfShape weights turned into fixed-seed random initializers.

Each engine runs the same random input. Timed runs are interleaved (ours, onnxruntime, OpenVINO, ours, ...) so a
load change on this shared machine hits every engine alike; each figure is the median. "1 thread" runs every
engine on one thread; "best" takes, per engine and model, the fastest of the thread counts in --threads. Our
thread count is OnnxRunner(threads=): sgemm's threads and the parts a large generated kernel's rows are cut into.
The ratio is ours / peer; "rel err" is max |ours - onnxruntime| / max |onnxruntime| over the float outputs.

--compile also measures, each in a fresh process, a cold compile (empty kernel cache) and a load from the
disk cache, for the daemons' models. --per-kernel N prints our N slowest kernels per model.
Each run (with the machine's load average before and after) is appended to bench/results/runtime_vs_ort.json."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402

from bench import results  # noqa: E402
from bench.make_nets import NETS_DIR, all_models  # noqa: E402
from runtime import OnnxRunner, blas  # noqa: E402
from runtime.program import CompileCache  # noqa: E402

DAEMON_MODELS = [("dmonitoring_model", "daemons/dmonitoringmodeld/models/dmonitoring_model.onnx"),
                 ("driving_small", "daemons/modeld/models/driving_small.onnx"),
                 ("driving_big", "daemons/modeld/models/driving_big.onnx")]
TARGETS = {"geomean": 1.0, "max_1thread": 1.3, "dmonitoring_model": 0.9, "driving_small": 0.9,
           "cold_compile_dm_s": 10.0, "disk_load_dm_s": 0.3}


def parse():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--iters", type=int, default=30)
  ap.add_argument("--models", default="", help="comma-separated substrings of model names to run")
  ap.add_argument("--threads", default="1,2", help="thread counts to try (the first is the '1 thread' column)")
  ap.add_argument("--no-openvino", action="store_true")
  ap.add_argument("--compile", action="store_true", help="measure cold compile and disk-cache load too")
  ap.add_argument("--per-kernel", type=int, default=0, metavar="N")
  return ap.parse_args()


def models(wanted: str) -> list[tuple[str, str]]:
  found = [(n, os.path.join(REPO, p)) for n, p in DAEMON_MODELS] + all_models(NETS_DIR)
  keys = [w for w in wanted.split(",") if w]
  return [(n, p) for n, p in found if not keys or any(k in n for k in keys)]


def feeds_for(runner) -> dict:
  rng = np.random.default_rng(0)
  return {n: (rng.integers(0, 255, shape) if dtype.kind in "iu" else rng.standard_normal(shape)).astype(dtype)
          for n, (shape, dtype) in runner.input_specs.items()}


class Engines:
  """The three engines on one model, at one thread count each (built once per count)."""

  def __init__(self, path: str, counts: list[int], openvino: bool):
    self.path, self.counts = path, counts
    self.ours = {n: OnnxRunner(path, cache=CACHE, threads=n) for n in counts}
    self.feeds = feeds_for(self.ours[counts[0]])
    self.ort, self.ov = {}, {}
    for n in counts:
      so = ort.SessionOptions()
      so.intra_op_num_threads, so.inter_op_num_threads, so.log_severity_level = n, 1, 3
      self.ort[n] = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
      if openvino:
        import openvino as ov  # noqa: PLC0415  (optional peer: only imported when asked for)
        core = ov.Core()
        # f32 like the other two: on CPUs with AVX512-BF16/AMX OpenVINO's default precision is bfloat16
        compiled = core.compile_model(core.read_model(path), "CPU",
                                      {"INFERENCE_NUM_THREADS": n, "PERFORMANCE_HINT": "LATENCY",
                                       "INFERENCE_PRECISION_HINT": "f32"})
        self.ov[n] = compiled.create_infer_request()
    sess = self.ort[counts[0]]
    self.ort_feeds = {i.name: self.feeds[i.name] for i in sess.get_inputs()}
    self.ort_outs = [o.name for o in sess.get_outputs()]

  def run_ours(self, n):
    blas.set_threads(n)
    return self.ours[n](**self.feeds)

  def run_ort(self, n):
    return self.ort[n].run(None, self.ort_feeds)

  def run_ov(self, n):
    return self.ov[n].infer(self.ort_feeds)

  def rel_err(self) -> float:
    ours, ref = self.run_ours(self.counts[0]), self.run_ort(self.counts[0])
    return max(float(np.max(np.abs(ours[name] - r)) / (np.max(np.abs(r)) + 1e-30))
               for name, r in zip(self.ort_outs, ref) if r.dtype.kind == "f")


def bench(name: str, path: str, args) -> dict:
  counts = [int(c) for c in args.threads.split(",")]
  e = Engines(path, counts, not args.no_openvino)
  err = e.rel_err()
  runs = [("ours", e.run_ours), ("ort", e.run_ort)] + ([("ov", e.run_ov)] if e.ov else [])
  times = {(eng, n): [] for eng, _ in runs for n in counts}
  for n in counts:
    for eng, fn in runs:  # warm each (first touches of memory, thread pools)
      fn(n)
      fn(n)
  for _ in range(args.iters):
    for n in counts:
      for eng, fn in runs:
        t = time.perf_counter()
        fn(n)
        times[(eng, n)].append(time.perf_counter() - t)
  med = {k: float(np.median(v)) for k, v in times.items()}
  one = counts[0]
  best = {eng: min(med[(eng, n)] for n in counts) for eng, _ in runs}
  row = {"model": name, "rel_err": err, "kernels": len(e.ours[one].program.kernels),
         "fallbacks": e.ours[one].program.fallbacks,
         "ms": {f"{eng}@{n}": med[(eng, n)] * 1e3 for eng, n in med},
         "best_ms": {eng: t * 1e3 for eng, t in best.items()},
         "ratio_ort_1": med[("ours", one)] / med[("ort", one)], "ratio_ort_best": best["ours"] / best["ort"]}
  if e.ov:
    row["ratio_ov_1"] = med[("ours", one)] / med[("ov", one)]
    row["ratio_ov_best"] = best["ours"] / best["ov"]
  ov = f" {row['ratio_ov_1']:6.2f} {row['ratio_ov_best']:6.2f}" if e.ov else ""
  ov_ms = f" {med[('ov', one)] * 1e3:8.2f}" if e.ov else ""
  print(f"{name:22s} {med[('ours', one)] * 1e3:8.2f} {med[('ort', one)] * 1e3:8.2f}{ov_ms} {row['ratio_ort_1']:6.2f} "
        f"{row['ratio_ort_best']:8.2f}{ov} {err:8.1e}", flush=True)
  if args.per_kernel:
    per_kernel(e.ours[one], args)
  return row


def per_kernel(runner, args):
  """Each linked kernel timed on its own (min over iterations), the slowest first."""
  calls = runner.linked.calls
  t = np.full(len(calls), np.inf)
  for _ in range(args.iters):
    for i, c in enumerate(calls):
      s = time.perf_counter()
      c()
      t[i] = min(t[i], time.perf_counter() - s)
  for i in np.argsort(-t)[:args.per_kernel]:
    k = runner.program.kernels[i]
    print(f"      {t[i] * 1e3:7.3f} ms  {'+'.join(k.tags.get('ops', ['copy']))} {k.tags.get('strategy', '')} "
          f"{k.tags.get('schedules', '')}")


COMPILE_CODE = """
import sys, time
t0 = time.perf_counter()
from runtime import OnnxRunner
from runtime.program import CompileCache
t1 = time.perf_counter()
OnnxRunner(sys.argv[1], cache=CompileCache(disk_dir=sys.argv[2]))
print(time.perf_counter() - t1, t1 - t0)
"""


def compile_figures(path: str) -> dict:
  """Cold compile and disk-cache load of one model, each in a fresh process (import time reported apart)."""
  with tempfile.TemporaryDirectory() as d:
    out = {}
    for what in ("cold_s", "disk_s"):
      r = subprocess.run([sys.executable, "-c", COMPILE_CODE, path, d], capture_output=True, text=True, cwd=REPO,
                         timeout=600, check=True)
      t, imp = (float(v) for v in r.stdout.split())
      out[what], out[what.replace("_s", "_import_s")] = t, imp
  out["import_s"] = out["disk_import_s"]
  out["disk_total_s"] = out["disk_s"] + out["disk_import_s"]   # a fresh process from start to a runnable model
  return out


CACHE = CompileCache()


def main():
  args = parse()
  load0 = os.getloadavg()
  print(f"iters={args.iters} threads={args.threads} load={load0[0]:.2f} (1-minute average, before)")
  peer = f" {'ov ms':>8s}" if not args.no_openvino else ""
  print(f"{'model':22s} {'ours ms':>8s} {'ort ms':>8s}{peer} {'/ort 1':>6s} {'/ort bst':>8s}"
        f"{'  /ov 1 /ov bst' if not args.no_openvino else ''} {'rel err':>8s}   (times at the first thread count)")
  rows = [bench(n, p, args) for n, p in models(args.models)]
  summary = {}
  if rows:
    g1 = float(np.exp(np.mean([np.log(r["ratio_ort_1"]) for r in rows])))
    gb = float(np.exp(np.mean([np.log(r["ratio_ort_best"]) for r in rows])))
    summary = {"geomean_ort_1": g1, "geomean_ort_best": gb, "max_ort_1": max(r["ratio_ort_1"] for r in rows)}
    print(f"geomean ours/onnxruntime: 1 thread {g1:.3f}, best threads {gb:.3f} (target <= {TARGETS['geomean']}); "
          f"worst at 1 thread {summary['max_ort_1']:.2f} (target <= {TARGETS['max_1thread']})")
    if "ratio_ov_1" in rows[0]:
      summary["geomean_ov_1"] = float(np.exp(np.mean([np.log(r["ratio_ov_1"]) for r in rows])))
      summary["geomean_ov_best"] = float(np.exp(np.mean([np.log(r["ratio_ov_best"]) for r in rows])))
      print(f"geomean ours/OpenVINO: 1 thread {summary['geomean_ov_1']:.3f}, best {summary['geomean_ov_best']:.3f}")
  compile_rows = {}
  if args.compile:
    for name, p in DAEMON_MODELS:
      if not args.models or any(k in name for k in args.models.split(",") if k):
        compile_rows[name] = compile_figures(os.path.join(REPO, p))
        c = compile_rows[name]
        print(f"compile {name:18s} cold {c['cold_s']:6.2f} s   from disk cache {c['disk_s']:6.3f} s   "
              f"(import {c['import_s']:.2f} s, not included; with it {c['disk_total_s']:.3f} s)")
  load1 = os.getloadavg()
  print(f"load average after: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
  figures = {"load_before": load0, "load_after": load1, "args": vars(args), "rows": rows, "summary": summary,
             "compile": compile_rows, "targets": TARGETS}
  print(f"results: {results.record('runtime_vs_ort', figures)}")


if __name__ == "__main__":
  main()
