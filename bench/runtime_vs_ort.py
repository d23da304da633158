"""Replay time of the pymodeld runtime against onnxruntime and OpenVINO on models it was never tuned on.

    python -m bench.runtime_vs_ort [--iters 30] [--block 3] [--threads 1,2] [--models resnet,unet] [--tol 1e-3]
                                   [--no-openvino] [--quick] [--compile] [--per-kernel N]

Models, in three groups (bench/make_nets.py writes the last two once, deterministically, from fixed seeds):
- standard: the only group in the geomeans. The onnx package's light models (resnet50, inception v1/v2,
  densenet121, squeezenet, shufflenet, alexnet, zfnet512) with their ConstantOfShape weights turned into random
  initializers, and nets built by make_nets (mobilenet_v2, vgg19_half, efficientnet_b0_like, unet,
  transformer_2blk, lstm_unrolled, lstm_op). Constant weights would flatter a runtime that folds, so none are.
- daemons: our daemons' own models (daemons/*/models), which the runtime was tuned on: own rows, no geomean.
- daemon_shaped: nets make_nets shapes after the daemons' models: own rows, no geomean.

Before timing, every engine's outputs are checked against onnxruntime's on the same input (max |x - ort| /
max |ort| over the float outputs, ours at every thread count): above --tol the row is a failure, not a speed.
A model our runtime refuses at load is a "refused" row with its typed error's first line; it stays out of the
geomeans, which say how many were left out.

Timing: all engines live in this one process and run the same inputs in alternating blocks (--block runs of
one engine at one thread count, then the next; the engine order rotates every round), so a load change on this
shared machine hits every engine alike, and each block starts once every other thread of the process has been idle
for QUIET_S (settle(): an engine's pool spins a while after a run, onnxruntime's for about 40 ms by default, and
would take the next engine's second core) with one untimed run (which wakes the engine's own workers: an idle vCPU
of a VM is slow to wake); each figure is the median run. "1 thread" runs every engine on one
thread; "best" takes, per engine and model, the fastest of the thread counts in --threads. After those, ours is
timed again at each thread count with the peers' sessions closed and no pause between blocks ("alone": our
thread scaling, free of the idle gaps the interleaved blocks start after). Our thread count is
OnnxRunner(threads=): sgemm's threads and the parts a large generated kernel's rows are cut into; onnxruntime
runs intra_op threads with its CPU provider, OpenVINO INFERENCE_NUM_THREADS, both in f32. Ratios are ours / peer.
With more than one thread count, bench.host_probe's stream probe runs before each model's blocks and after its
"alone" timing; the rows around which it read the two CPUs apart (each with its own path to memory, as when they
share no last-level cache: threads that hand each other data slow down, for seconds to minutes on a VM) are listed
at the end and in the summary's cpus_apart.

--quick is a smoke run (a few small models of each group, few iterations) and is not recorded. --compile also
measures, each in a fresh process, a cold compile and a load from the disk cache for the daemons' models.
--per-kernel N prints our N slowest kernels per model. Each run (CPU model and flags, the machine's load average
before and after) is appended to bench/results/runtime_vs_ort.json."""
from __future__ import annotations

import argparse
import gc
import hashlib
import os
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import onnxruntime as ort

from bench import results
from bench.host_probe import STREAM_APART, HostProbe, ProbeError
from bench.make_nets import NETS_DIR, model_groups
from runtime import OnnxRunner
from runtime.errors import RuntimeCoreError
from runtime.program import CompileCache

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DAEMON_MODELS = [("dmonitoring_model", "daemons/dmonitoringmodeld/models/dmonitoring_model.onnx"),
                 ("driving_small", "daemons/modeld/models/driving_small.onnx"),
                 ("driving_big", "daemons/modeld/models/driving_big.onnx")]
TARGETS = {"geomean": 0.9, "max_1thread": 1.15, "geomean_ov": 1.0, "max_ov_1thread": 1.1, "scaling_2_threads": 1.7,
           "dmonitoring_model": 0.9, "driving_small": 0.9,
           "cold_compile_dm_s": 10.0, "disk_load_dm_s": 0.3}
QUIET_S = 0.005     # a block starts once no other thread of this process has run for this long (settle())
SETTLE_MAX_S = 1.0  # ... or after this long, whichever comes first
QUICK_MODELS = ("dmonitoring_model", "squeezenet_rand", "shufflenet_rand", "mobilenet_v2", "transformer_2blk", "lstm_unrolled",
                "lstm_op", "mobilenet_dw")
# The CPU flags a generated kernel or a peer's kernels can use; the full list is recorded as a digest.
CPU_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
             "avx_vnni", "amx_tile", "amx_bf16")


def parse():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--iters", type=int, default=30, help="timed runs per engine and thread count")
  ap.add_argument("--block", type=int, default=3, help="consecutive runs of one engine before the next takes over")
  ap.add_argument("--models", default="", help="comma-separated substrings of model names to run")
  ap.add_argument("--threads", default="1,2", help="thread counts to try (the first is the '1 thread' column)")
  ap.add_argument("--tol", type=float, default=1e-3, help="largest max|x - ort| / max|ort| that counts as correct")
  ap.add_argument("--no-openvino", action="store_true")
  ap.add_argument("--quick", action="store_true", help="smoke run: a few small models, 6 iterations, not recorded")
  ap.add_argument("--compile", action="store_true", help="measure cold compile and disk-cache load too")
  ap.add_argument("--per-kernel", type=int, default=0, metavar="N")
  args = ap.parse_args()
  if args.quick:
    args.iters, args.block = min(args.iters, 6), min(args.block, 2)
  return args


def cpu_info() -> dict:
  """The CPU model name and its flags as /proc/cpuinfo gives them (first processor); empty off Linux."""
  name, flags = "", []
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        key, _, val = line.partition(":")
        if key.strip() == "model name" and not name:
          name = val.strip()
        elif key.strip() == "flags" and not flags:
          flags = val.split()
  except OSError:
    pass
  return {"model": name, "cpus": os.cpu_count(), "flags": [f for f in CPU_FLAGS if f in flags],
          "flags_sha1": hashlib.sha1(" ".join(flags).encode()).hexdigest()[:12], "flags_count": len(flags)}


def models(args) -> list[tuple[str, str, str]]:
  """(group, name, path) of every model to run, the standard group first."""
  groups = model_groups(NETS_DIR)
  found = [("standard", n, p) for n, p in groups["standard"]]
  found += [("daemons", n, os.path.join(REPO, p)) for n, p in DAEMON_MODELS]
  found += [("daemon_shaped", n, p) for n, p in groups["daemon_shaped"]]
  keys = [w for w in args.models.split(",") if w]
  if args.quick and not keys:
    return [m for m in found if m[1] in QUICK_MODELS]
  return [m for m in found if not keys or any(k in m[1] for k in keys)]


def feeds_for(runner) -> dict:
  rng = np.random.default_rng(0)
  return {n: (rng.integers(0, 255, shape) if dtype.kind in "iu" else rng.standard_normal(shape)).astype(dtype)
          for n, (shape, dtype) in runner.input_specs.items()}


def rel_err(outs: list, ref: list) -> float:
  """max |x - ref| / max |ref| over the float outputs (inf when a shape differs or a value is not finite)."""
  errs = [0.0]
  for x, r in zip(outs, ref):
    x, r = np.asarray(x), np.asarray(r)
    if r.dtype.kind != "f":
      errs.append(0.0 if np.array_equal(x, r) else np.inf)
    elif x.shape != r.shape or not np.all(np.isfinite(x)):
      errs.append(np.inf)
    else:
      errs.append(float(np.max(np.abs(x.astype(np.float64) - r)) / (np.max(np.abs(r)) + 1e-30)))
  return max(errs)


class Engines:
  """The three engines on one model, each built once per thread count; ours first, so a refusal costs nothing else."""

  def __init__(self, path: str, counts: list[int], openvino: bool):
    self.counts = counts
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
        self.ov[n] = (compiled, compiled.create_infer_request())
    sess = self.ort[counts[0]]
    self.ort_feeds = {i.name: self.feeds[i.name] for i in sess.get_inputs()}
    self.out_names = [o.name for o in sess.get_outputs()]

  def run_ours(self, n):
    return self.ours[n](**self.feeds)

  def run_ort(self, n):
    return self.ort[n].run(None, self.ort_feeds)

  def run_ov(self, n):
    return self.ov[n][1].infer(self.ort_feeds)

  def check(self) -> dict:
    """Every engine at every thread count against onnxruntime at the first count, on the same inputs."""
    ref = self.run_ort(self.counts[0])
    errs = {f"ours@{n}": rel_err([self.run_ours(n)[k] for k in self.out_names], ref) for n in self.counts}
    errs.update({f"ort@{n}": rel_err(self.run_ort(n), ref) for n in self.counts[1:]})
    for n, (compiled, _) in self.ov.items():
      r = self.run_ov(n)
      errs[f"ov@{n}"] = rel_err([r[compiled.output(i)] for i in range(len(self.out_names))], ref)
    return errs


def _others_cpu_ns() -> int | None:
  """CPU time so far of every thread of this process but the calling one (Linux's per-thread schedstat), or None
  where /proc cannot tell."""
  me, total = threading.get_native_id(), 0
  try:
    tids = os.listdir("/proc/self/task")
  except OSError:
    return None
  for t in tids:
    if t == str(me):
      continue
    try:
      with open(f"/proc/self/task/{t}/schedstat") as f:
        total += int(f.read().split()[0])
    except (OSError, ValueError, IndexError):   # the thread exited meanwhile
      pass
  return total


def settle(quiet_s: float = QUIET_S, limit_s: float = SETTLE_MAX_S) -> float:
  """Wait until the other threads of this process (the engines' pools) have used under a tenth of one CPU over the
  last quiet_s, or until limit_s has passed; returns the seconds waited. A fixed pause shorter than a peer's spin
  left that peer's worker spinning into the next engine's block, on the core the next engine's second thread needed."""
  t0 = time.perf_counter()
  last = _others_cpu_ns()
  while True:
    time.sleep(quiet_s)
    now = _others_cpu_ns()
    if last is None or now is None or now - last < quiet_s * 1e8 or time.perf_counter() - t0 >= limit_s:
      return time.perf_counter() - t0
    last = now


def first_line(e: BaseException) -> str:
  lines = str(e).strip().splitlines()
  return f"{type(e).__name__}: {lines[0] if lines else ''}"[:200]


def bench(group: str, name: str, path: str, args, probe: HostProbe | None = None) -> dict:
  counts = [int(c) for c in args.threads.split(",")]
  row = {"model": name, "group": group}
  try:
    e = Engines(path, counts, not args.no_openvino)
  except (RuntimeCoreError, FileNotFoundError) as err:   # ours refused it: the typed error says why
    print(f"  {name}: refused by our runtime: {first_line(err)}", flush=True)
    return {**row, "status": "refused", "error": first_line(err)}
  except Exception as err:  # noqa: BLE001  (a peer that cannot load the model is reported, not fatal)
    print(f"  {name}: a peer failed to load it: {first_line(err)}", flush=True)
    return {**row, "status": "peer_failed", "error": first_line(err)}
  one = counts[0]
  errs = e.check()
  row.update({"rel_err": errs[f"ours@{one}"], "rel_errs": errs, "kernels": len(e.ours[one].program.kernels),
              "fallbacks": e.ours[one].program.fallbacks})
  wrong = [k for k, v in errs.items() if k.startswith("ours") and not v <= args.tol]
  if wrong:
    print(f"  {name}: WRONG output, rel err {max(errs[k] for k in wrong):.2e} > {args.tol:g} at {', '.join(wrong)}", flush=True)
    return {**row, "status": "wrong"}
  ov_ok = bool(e.ov) and all(v <= args.tol for k, v in errs.items() if k.startswith("ov"))
  runs = [("ours", e.run_ours), ("ort", e.run_ort)] + ([("ov", e.run_ov)] if ov_ok else [])
  times = {(eng, n): [] for eng, _ in runs for n in counts}
  streams = [host_stream(probe)]
  settled = []
  for n in counts:
    for _, fn in runs:  # warm each (first touches of memory, thread pools)
      fn(n)
      fn(n)
  for rnd in range(max(1, -(-args.iters // args.block))):
    order = runs[rnd % len(runs):] + runs[:rnd % len(runs)]
    for n in counts:
      for eng, fn in order:
        settled.append(settle())   # the previous engine's idle workers stop spinning before this block starts
        times[(eng, n)] += block_times(lambda: fn(n), args.block)
  med = {k: float(np.median(v)) for k, v in times.items()}
  best = {eng: min(med[(eng, n)] for n in counts) for eng, _ in runs}
  row.update({"status": "ok", "ms": {f"{eng}@{n}": med[(eng, n)] * 1e3 for eng, n in med},
              "best_ms": {eng: t * 1e3 for eng, t in best.items()},
              "best_threads": {eng: min(counts, key=lambda n, eng=eng: med[(eng, n)]) for eng, _ in runs},
              "ratio_ort_1": med[("ours", one)] / med[("ort", one)], "ratio_ort_best": best["ours"] / best["ort"],
              "settle_ms": {"median": float(np.median(settled)) * 1e3, "max": float(np.max(settled)) * 1e3}})
  if ov_ok:
    row["ratio_ov_1"] = med[("ours", one)] / med[("ov", one)]
    row["ratio_ov_best"] = best["ours"] / best["ov"]
  elif e.ov:
    row["ov_wrong"] = True
  print(f"  {name}: ours {med[('ours', one)] * 1e3:.2f} ms, ort {med[('ort', one)] * 1e3:.2f} ms at {one} thread; "
        f"rel err {row['rel_err']:.1e}" + ("; OpenVINO's output is off, left out" if row.get("ov_wrong") else ""), flush=True)
  if len(counts) > 1:
    row["alone_ms"] = alone(e, counts, args)
  streams.append(host_stream(probe))
  if probe is not None:
    row["host_stream"] = streams
  if args.per_kernel:
    per_kernel(e.ours[one], args)
  return row


def host_stream(probe: HostProbe | None) -> float | None:
  """bench.host_probe's stream ratio now (None without a probe, or where it could not run)."""
  if probe is None:
    return None
  try:
    return probe.stream()
  except ProbeError:
    return None


def alone(e, counts: list[int], args) -> dict:
  """Ours at each thread count with the peers' sessions gone (alternating blocks, median): our thread scaling."""
  e.ort.clear()
  e.ov.clear()
  gc.collect()
  times = {n: [] for n in counts}
  for _ in range(max(1, -(-args.iters // args.block))):
    for n in counts:
      times[n] += block_times(lambda: e.run_ours(n), args.block)
  return {f"ours@{n}": float(np.median(v)) * 1e3 for n, v in times.items()}


def block_times(run, block: int) -> list[float]:
  """Seconds of each of `block` runs, after one untimed run that wakes the engine's workers (an idle vCPU of a VM
  is slow to wake)."""
  run()
  out = []
  for _ in range(block):
    t = time.perf_counter()
    run()
    out.append(time.perf_counter() - t)
  return out


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
    gemm = f" ({k.tags['gemm']})" if "gemm" in k.tags else ""
    print(f"      {t[i] * 1e3:7.3f} ms  {'+'.join(k.tags.get('ops', ['copy']))} {k.tags.get('strategy', '')}{gemm} "
          f"{k.tags.get('schedules', '')}")


def geomean(vals: list[float]) -> float | None:
  return float(np.exp(np.mean(np.log(vals)))) if vals else None


def summarise(rows: list[dict]) -> dict:
  """Geomeans over the standard group's timed rows only; daemons, daemon-shaped nets, refusals and failures
  never enter them, and the counts say how many were left out."""
  std = [r for r in rows if r["group"] == "standard"]
  ok = [r for r in std if r["status"] == "ok"]
  s = {"standard_models": len(std), "geomean_models": len(ok),
       "refused": [r["model"] for r in std if r["status"] == "refused"],
       "failed": [r["model"] for r in std if r["status"] not in ("ok", "refused")]}
  for key in ("ort_1", "ort_best", "ov_1", "ov_best"):
    vals = [r[f"ratio_{key}"] for r in ok if f"ratio_{key}" in r]
    s[f"geomean_{key}"] = geomean(vals)
    s[f"geomean_{key}_models"] = len(vals)
  scal = {}   # ours at the fewest threads over ours at the next thread count, per model, with no peer in the process
  for r in ok:
    counts = sorted(int(k.split("@")[1]) for k in r.get("alone_ms", {}))
    if len(counts) > 1:
      scal[r["model"]] = r["alone_ms"][f"ours@{counts[0]}"] / r["alone_ms"][f"ours@{counts[1]}"]
  s["scaling_ours"] = scal
  s["geomean_scaling_ours"] = geomean(list(scal.values()))
  s["cpus_apart"] = [r["model"] for r in rows if any(v is not None and v > STREAM_APART for v in r.get("host_stream") or ())]
  if ok:
    s["max_ort_1"] = max(r["ratio_ort_1"] for r in ok)
    s["worst_ort_1"] = max(ok, key=lambda r: r["ratio_ort_1"])["model"]
    s["worst_ort_best"] = max(ok, key=lambda r: r["ratio_ort_best"])["model"]
    s["max_ort_best"] = max(r["ratio_ort_best"] for r in ok)
  return s


def table(rows: list[dict], counts: list[int]) -> None:
  def fmt(v, spec):
    return format(v, spec) if v is not None else "-"

  for col, label in (("1", f"{counts[0]} thread"), ("best", f"best of threads {','.join(map(str, counts))}")):
    print(f"\n{label}:")
    print(f"{'group':13s} {'model':22s} {'ours ms':>8s} {'ort ms':>8s} {'ours/ort':>8s} {'ov ms':>8s} {'ours/ov':>8s}")
    for r in rows:
      if r["status"] != "ok":
        print(f"{r['group']:13s} {r['model']:22s} {r['status'].upper()}: {r.get('error', '')}"
              + (f"rel err {r['rel_err']:.2e}" if r["status"] == "wrong" else ""))
        continue
      ms = (lambda eng, r=r: r["ms"].get(f"{eng}@{counts[0]}")) if col == "1" else (lambda eng, r=r: r["best_ms"].get(eng))
      print(f"{r['group']:13s} {r['model']:22s} {fmt(ms('ours'), '8.2f')} {fmt(ms('ort'), '8.2f')} "
            f"{fmt(r.get('ratio_ort_' + col), '8.2f')} {fmt(ms('ov'), '8.2f')} {fmt(r.get('ratio_ov_' + col), '8.2f')}")


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
  """Cold compile and disk-cache load of one model, each in a fresh process (import time reported apart). The
  children import as a default Python does, from bytecode it wrote once: PYTHONDONTWRITEBYTECODE, if this
  shell sets it, would make every start compile our sources again."""
  env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
  subprocess.run([sys.executable, "-c", "import runtime.runner, runtime.program"], cwd=REPO, env=env, timeout=600,
                 check=True)   # the bytecode, written before anything is timed
  with tempfile.TemporaryDirectory() as d:
    out = {}
    for what in ("cold_s", "disk_s"):
      r = subprocess.run([sys.executable, "-c", COMPILE_CODE, path, d], capture_output=True, text=True, cwd=REPO,
                         env=env, timeout=600, check=True)
      t, imp = (float(v) for v in r.stdout.split())
      out[what], out[what.replace("_s", "_import_s")] = t, imp
  out["import_s"] = out["disk_import_s"]
  out["disk_total_s"] = out["disk_s"] + out["disk_import_s"]   # a fresh process from start to a runnable model
  return out


CACHE = CompileCache()


def main():
  args = parse()
  counts = [int(c) for c in args.threads.split(",")]
  cpu = cpu_info()
  load0 = os.getloadavg()
  t0 = time.perf_counter()
  print(f"CPU: {cpu['model']} ({cpu['cpus']} CPUs; flags {' '.join(cpu['flags'])}; all flags sha1 {cpu['flags_sha1']})")
  print(f"iters={args.iters} block={args.block} threads={args.threads} tol={args.tol:g} "
        f"load={load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} (1/5/15-minute averages, before)")
  todo = models(args)
  rows = []
  probe = HostProbe() if len(counts) > 1 else None
  try:
    for i, (group, name, path) in enumerate(todo):
      print(f"[{i + 1}/{len(todo)}] {group}/{name}", flush=True)
      rows.append(bench(group, name, path, args, probe))
  finally:
    if probe is not None:
      probe.close()
  table(rows, counts)
  s = summarise(rows)
  print(f"\nstandard set: {s['standard_models']} models, {s['geomean_models']} in the geomeans; refused "
        f"{len(s['refused'])} ({', '.join(s['refused']) or 'none'}); wrong or failed {len(s['failed'])} "
        f"({', '.join(s['failed']) or 'none'}). Daemons' models and daemon-shaped nets are not in them.")
  if s["geomean_ort_1"] is not None:
    print(f"geomean ours/onnxruntime: {counts[0]} thread {s['geomean_ort_1']:.3f}, best {s['geomean_ort_best']:.3f} "
          f"(target <= {TARGETS['geomean']})")
    if s["geomean_ov_1"] is not None:
      print(f"geomean ours/OpenVINO:    {counts[0]} thread {s['geomean_ov_1']:.3f}, best {s['geomean_ov_best']:.3f} "
            f"(over {s['geomean_ov_1_models']} models whose OpenVINO output matched; target <= {TARGETS['geomean_ov']})")
    print(f"worst: {s['worst_ort_1']} {s['max_ort_1']:.2f} at {counts[0]} thread (target <= {TARGETS['max_1thread']}); "
          f"{s['worst_ort_best']} {s['max_ort_best']:.2f} at best")
    if s["scaling_ours"]:
      top = ", ".join(f"{m} {v:.2f}x" for m, v in sorted(s["scaling_ours"].items(), key=lambda kv: -kv[1])[:3])
      print(f"ours alone (peers' sessions closed) at {counts[1]} threads vs {counts[0]}: geomean {s['geomean_scaling_ours']:.2f}x "
            f"(target >= {TARGETS['scaling_2_threads']} on resnet50-sized models; best {top}; "
            f"resnet50 {s['scaling_ours'].get('resnet50_rand', float('nan')):.2f}x)")
  if s["cpus_apart"]:
    print(f"host: around {len(s['cpus_apart'])} of {len(rows)} rows the two CPUs read apart (bench.host_probe's stream, 2 threads "
          f"over 1, above {STREAM_APART}, as when they share no last-level cache), where data the threads hand each other crosses "
          f"between caches and 2-thread figures fall: {', '.join(s['cpus_apart'])}")
  print(f"search: {'off' if os.environ.get('PYMODELD_SEARCH', '').strip().lower() in ('0', 'false', 'no') else 'on'} "
        "(PYMODELD_SEARCH); its results and the programs built with them are cached beside the kernels")
  compile_rows = {}
  if args.compile:
    for name, p in DAEMON_MODELS:
      if not args.models or any(k in name for k in args.models.split(",") if k):
        compile_rows[name] = compile_figures(os.path.join(REPO, p))
        c = compile_rows[name]
        print(f"compile {name:18s} cold {c['cold_s']:6.2f} s   from disk cache {c['disk_s']:6.3f} s   "
              f"(import {c['import_s']:.2f} s, not included; with it {c['disk_total_s']:.3f} s)")
  load1 = os.getloadavg()
  wall = time.perf_counter() - t0
  print(f"load average after: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}; wall {wall:.0f} s")
  if args.quick:
    print("--quick: a smoke run, not recorded")
    return
  figures = {"load_before": load0, "load_after": load1, "wall_s": wall, "args": vars(args), "cpu": cpu,
             "threads": {"ours": counts, "ort_intra_op": counts, "ov_inference_num_threads": counts,
                         "env_PYMODELD_RUNTIME_THREADS": os.environ.get("PYMODELD_RUNTIME_THREADS"),
             "env_PYMODELD_SEARCH": os.environ.get("PYMODELD_SEARCH")},
             "versions": {"onnxruntime": ort.__version__, "openvino": _ov_version(args)},
             "rows": rows, "summary": s, "compile": compile_rows, "targets": TARGETS}
  print(f"results: {results.record('runtime_vs_ort', figures, note=f'load {load0[0]:.2f} before, {load1[0]:.2f} after')}")


def _ov_version(args) -> str | None:
  if args.no_openvino:
    return None
  import openvino as ov  # noqa: PLC0415  (optional peer)
  return ov.get_version()


if __name__ == "__main__":
  main()
