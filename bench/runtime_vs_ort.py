"""Median replay time of the pymodeld runtime vs onnxruntime (same thread count) per model, and the ratio.

Models: the onnx package's light models (onnx/backend/test/data/light) and the daemons' own models.
Both engines get the same random input; timings alternate between the engines so load changes on a shared
machine hit both alike. Our time is a full OnnxRunner call (upload, program, readback).

    python bench/runtime_vs_ort.py [--threads 1] [--iters 15] [--models squeezenet,resnet50]

--threads sets onnxruntime's intra-op threads and our BLAS threads alike. It defaults to 1, the runtime's own
default (on a loaded 2-core machine a multi-threaded BLAS waits on descheduled workers at every call, and the
daemons run with everything else on those cores); --threads 2 compares both engines at two threads.

--per-op N also prints, per model, our replay time summed by op type and the N slowest kernels (each linked
kernel timed on its own, in program order), the starting point for finding what to speed up next.

"rel err" is max |ours - ort| / max |ort| over the float outputs. The light models build their weights from
constants, so many of their output channels are exact ties; where a softmax follows, which of the tied logits
come out largest is decided by float rounding, and the column can read up to 1 although every logit agrees
to float precision (light_squeezenet with this random input)."""
import argparse
import glob
import os
import sys


def parse():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--threads", type=int, default=1)
  ap.add_argument("--iters", type=int, default=15)
  ap.add_argument("--models", default="", help="comma-separated substrings of model names to run")
  ap.add_argument("--per-op", type=int, default=0, metavar="N", help="print our time per op and the N slowest kernels")
  return ap.parse_args()


ARGS = parse()
import time  # noqa: E402

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from runtime import OnnxRunner  # noqa: E402
from runtime.cache import CompileCache  # noqa: E402


def models():
  light = sorted(glob.glob(os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light",
                                        "*.onnx")))
  ours = sorted(glob.glob(os.path.join(REPO, "daemons", "*", "models", "*.onnx")))
  found = [(os.path.basename(p)[6:-5], p) for p in light] + [(os.path.basename(p)[:-5], p) for p in ours]
  wanted = [w for w in ARGS.models.split(",") if w]
  return [(n, p) for n, p in found if not wanted or any(w in n for w in wanted)]


def bench(name, path):
  t0 = time.perf_counter()
  runner = OnnxRunner(path, cache=CompileCache(use_disk=False), threads=ARGS.threads)
  compile_s = time.perf_counter() - t0
  so = ort.SessionOptions()
  so.intra_op_num_threads = ARGS.threads
  so.inter_op_num_threads = 1
  so.log_severity_level = 3
  sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
  rng = np.random.default_rng(0)
  feeds = {}
  for n, (shape, dtype) in runner.input_specs.items():
    feeds[n] = (rng.integers(0, 255, shape) if dtype.kind in "iu" else rng.standard_normal(shape)).astype(dtype)
  ort_feeds = {i.name: feeds[i.name] for i in sess.get_inputs()}
  for _ in range(2):  # warm both (first touches of memory, BLAS thread start)
    ours = runner(**feeds)
    ref = sess.run(None, ort_feeds)
  err = max(float(np.max(np.abs(ours[o.name] - r)) / (np.max(np.abs(r)) + 1e-30))
            for o, r in zip(sess.get_outputs(), ref) if r.dtype.kind == "f")
  t_ours, t_ort = [], []
  for _ in range(ARGS.iters):
    t = time.perf_counter()
    runner(**feeds)
    t_ours.append(time.perf_counter() - t)
    t = time.perf_counter()
    sess.run(None, ort_feeds)
    t_ort.append(time.perf_counter() - t)
  a, b = float(np.median(t_ours)), float(np.median(t_ort))
  print(f"{name:28s} {a * 1e3:9.2f} {b * 1e3:9.2f} {a / b:7.2f} {compile_s:8.2f} {err:9.1e}", flush=True)
  if ARGS.per_op:
    per_op(runner)
  return a / b


def per_op(runner):
  """Median time of each linked kernel run on its own, summed by op, and the slowest ones."""
  program, calls = runner.program, runner.linked.calls
  nodes = [n for step in program.steps for n in step]
  times = np.zeros((ARGS.iters, len(calls)))
  for it in range(ARGS.iters):
    for i, call in enumerate(calls):
      t = time.perf_counter()
      call()
      times[it, i] = time.perf_counter() - t
  med = np.median(times, axis=0)
  by_op: dict[str, float] = {}
  for n, t in zip(nodes, med):
    by_op[n.op] = by_op.get(n.op, 0.0) + t
  print("    " + ", ".join(f"{op} {t * 1e3:.2f}" for op, t in sorted(by_op.items(), key=lambda kv: -kv[1])))
  for i in np.argsort(-med)[:ARGS.per_op]:
    n = nodes[i]
    shape = program.specs[n.inputs[0]].shape if n.inputs and n.inputs[0] in program.specs else ()
    print(f"    {med[i] * 1e3:7.3f} ms {n.op} {shape} {n.name}")


def main():
  print(f"threads={ARGS.threads} iters={ARGS.iters} load={os.getloadavg()[0]:.1f}")
  print(f"{'model':28s} {'ours ms':>9s} {'ort ms':>9s} {'ratio':>7s} {'compile':>8s} {'rel err':>9s}")
  ratios = [bench(n, p) for n, p in models()]
  if ratios:
    print(f"geometric-mean ratio (ours/onnxruntime): {float(np.exp(np.mean(np.log(ratios)))):.2f} "
          f"over {len(ratios)} models (target <= 1.3)")


if __name__ == "__main__":
  main()
