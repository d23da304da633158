"""Median replay time of the pymodeld runtime vs onnxruntime (same thread count) per model, and the ratio.

Models: the onnx package's light models (onnx/backend/test/data/light) and the daemons' own models.
Both engines get the same random input; timings alternate between the engines so load changes on a shared
machine hit both alike. Our time is a full OnnxRunner call (upload, program, readback).

    python bench/runtime_vs_ort.py [--threads 1] [--iters 15] [--models squeezenet,resnet50]

--threads sets onnxruntime's intra-op threads and our BLAS threads alike. It defaults to 1, the runtime's own
default (on a loaded 2-core machine a multi-threaded BLAS waits on descheduled workers at every call, and the
daemons run with everything else on those cores); --threads 2 compares both engines at two threads."""
import argparse
import glob
import os
import sys


def parse():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--models", default="", help="comma-separated substrings of model names to run")
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
    return a / b


def main():
    print(f"threads={ARGS.threads} iters={ARGS.iters} load={os.getloadavg()[0]:.1f}")
    print(f"{'model':28s} {'ours ms':>9s} {'ort ms':>9s} {'ratio':>7s} {'compile':>8s} {'rel err':>9s}")
    ratios = [bench(n, p) for n, p in models()]
    if ratios:
        print(f"geometric-mean ratio (ours/onnxruntime): {float(np.exp(np.mean(np.log(ratios)))):.2f} "
              f"over {len(ratios)} models (target <= 1.3)")


if __name__ == "__main__":
    main()
