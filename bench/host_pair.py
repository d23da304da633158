"""Why a model's 2-thread time on a VM moves from minute to minute: our runtime at 1 and 2 threads on one model, each
round followed by two probes of what the host gives two threads right then.

    python -m bench.host_pair [--model mobilenet_v2] [--seconds 150] [--block 15]

Each round times --block runs of the model at 1 thread, then at 2 (median each), then runs the probes, each on 1
thread and then on 2 at once (C, compiled through the runtime's kernel cache; the two threads start together at a
barrier):
- fma: a loop of vector FMAs on registers only (8 independent chains). 2-thread time over 1-thread time: ~1.0 where
  the two CPUs have their own FMA units, ~2.0 where they are two hardware threads of one core.
- stream: 64 MiB read twice per thread. 2-thread bandwidth over 1-thread bandwidth: how far the two CPUs share
  one path to memory (~1.4 on this VM while they share a last-level cache; ~2.0 while each has its own).
At the end the rounds are grouped by the model's 2-thread speed-up (< 1.3, 1.3-1.6, >= 1.6) with the probes'
medians in each group; the run is appended to bench/results/host_pair.json. The probes run after the model's
blocks, so a round at the edge of a change of placement can pair a model figure with a probe of the other state.
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time

import numpy as np

from bench import runtime_vs_ort as rvo
from bench.make_nets import NETS_DIR, model_groups
from bench.results import record
from runtime import OnnxRunner
from runtime.cache import DEFAULT_KERNELS

PROBE_SOURCE = r"""#include <stdint.h>
#include <stdlib.h>
#include <pthread.h>
#include <time.h>
typedef float vf __attribute__((vector_size(64)));
#define HP_STREAM ((64 << 20) / 64)   /* vectors per thread's buffer: 64 MiB */
static vf* hp_buf[2];
static pthread_barrier_t hp_bar;
static int hp_kind;
static double hp_took[2];
static double hp_now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void* hp_one(void* p) {
  const int me = (int)(intptr_t)p;
  vf a = {0}, b = {0}, c = {0}, d = {0}, e = {0}, f = {0}, g = {0}, h = {0}, x, y;
  for (int j = 0; j < 16; j++) { x[j] = 1.0f + j * 1e-7f; y[j] = 0.999999f; }
  pthread_barrier_wait(&hp_bar);
  const double t = hp_now();
  if (hp_kind == 0) {
    for (int64_t i = 0; i < 2000000; i++) {
      __asm__ volatile("" : "+x"(x), "+x"(y));
      a = a * y + x; b = b * y + x; c = c * y + x; d = d * y + x; e = e * y + x; f = f * y + x; g = g * y + x; h = h * y + x;
    }
  } else {
    const vf* s = hp_buf[me];
    for (int r = 0; r < 2; r++)
      for (int64_t i = 0; i < HP_STREAM; i += 4) { a += s[i]; b += s[i + 1]; c += s[i + 2]; d += s[i + 3]; }
  }
  hp_took[me] = hp_now() - t;
  a += b + c + d + e + f + g + h;
  return (void*)(intptr_t)(a[0] > 1e30f);
}
/* Seconds the slower thread took; kind 0 fma, 1 stream; -1 where a buffer or a thread could not be had. */
double hp_probe(int kind, int threads) {
  for (int k = 0; k < 2 && kind == 1; k++) {
    if (hp_buf[k]) continue;
    if (!(hp_buf[k] = aligned_alloc(64, (size_t)HP_STREAM * 64))) return -1;
    for (int64_t i = 0; i < HP_STREAM; i++) hp_buf[k][i] = (vf){0};   /* touched once: no page faults in the timing */
  }
  hp_kind = kind;
  pthread_barrier_init(&hp_bar, 0, (unsigned)threads);
  pthread_t t;
  if (threads == 2 && pthread_create(&t, 0, hp_one, (void*)1) != 0) { pthread_barrier_destroy(&hp_bar); return -1; }
  hp_one((void*)0);
  if (threads == 2) pthread_join(t, 0);
  pthread_barrier_destroy(&hp_bar);
  return threads == 2 && hp_took[1] > hp_took[0] ? hp_took[1] : hp_took[0];
}
void hp_free(void) { for (int k = 0; k < 2; k++) { free(hp_buf[k]); hp_buf[k] = 0; } }
"""
GROUPS = ((0.0, 1.3, "< 1.3"), (1.3, 1.6, "1.3-1.6"), (1.6, 99.0, ">= 1.6"))


def parse():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--model", default="mobilenet_v2", help="a standard model of bench.runtime_vs_ort (substring)")
  p.add_argument("--seconds", type=float, default=150.0, help="how long to keep taking rounds")
  p.add_argument("--block", type=int, default=15, help="runs per thread count per round (median)")
  return p.parse_args()


def probes():
  (lk,), _ = DEFAULT_KERNELS.get_many([(PROBE_SOURCE, "hp_probe")], "host_pair")
  fn = ctypes.CFUNCTYPE(ctypes.c_double, ctypes.c_int, ctypes.c_int)(lk.address)
  free = ctypes.CFUNCTYPE(None)(ctypes.cast(lk.lib.hp_free, ctypes.c_void_p).value)

  def ratio(kind: int) -> float:
    one, two = fn(kind, 1), fn(kind, 2)
    if one <= 0 or two <= 0:
      raise SystemExit("host_pair: could not start a probe thread or allocate its buffer")
    return two / one if kind == 0 else 2 * one / two   # fma: time ratio; stream: bandwidth ratio
  return ratio, free


def main():
  args = parse()
  found = [(n, p) for n, p in model_groups(NETS_DIR)["standard"] if args.model in n]
  if not found:
    print(f"host_pair: no standard model matches {args.model!r} (python -m bench.make_nets writes them)", file=sys.stderr)
    raise SystemExit(2)
  name, path = found[0]
  runners = {n: OnnxRunner(path, cache=rvo.CACHE, threads=n) for n in (1, 2)}
  feeds = rvo.feeds_for(runners[1])
  ratio, free = probes()
  rounds = []
  end = time.monotonic() + args.seconds
  try:
    while time.monotonic() < end:
      ms = {}
      for n, r in runners.items():
        r(**feeds)
        ts = []
        for _ in range(args.block):
          t = time.perf_counter()
          r(**feeds)
          ts.append(time.perf_counter() - t)
        ms[n] = statistics.median(ts) * 1e3
      rd = {"ms@1": ms[1], "ms@2": ms[2], "speedup": ms[1] / ms[2], "fma": ratio(0), "stream": ratio(1)}
      rounds.append(rd)
      print(f"{name}: 1 thread {ms[1]:.2f} ms, 2 threads {ms[2]:.2f} ms (x{rd['speedup']:.2f}) | probes, 2 threads over 1: "
            f"fma time x{rd['fma']:.2f}, stream bandwidth x{rd['stream']:.2f}", flush=True)
  finally:
    free()
  groups = []
  for lo, hi, label in GROUPS:
    sel = [r for r in rounds if lo <= r["speedup"] < hi]
    if sel:
      g = {"speedup": label, "rounds": len(sel), "fma_median": statistics.median(r["fma"] for r in sel),
           "stream_median": statistics.median(r["stream"] for r in sel),
           "stream_over_1.7": sum(r["stream"] > 1.7 for r in sel) / len(sel)}
      groups.append(g)
      print(f"speed-up {label}: {len(sel)} rounds; fma x{g['fma_median']:.2f}, stream x{g['stream_median']:.2f} (median); "
            f"stream above 1.7 in {100 * g['stream_over_1.7']:.0f}% of them")
  figures = {"model": name, "block": args.block, "seconds": args.seconds, "cpu": rvo.cpu_info(), "groups": groups,
             "speedup_median": float(np.median([r["speedup"] for r in rounds])) if rounds else None, "rounds": rounds}
  print(f"recorded in {record('host_pair', figures)}")


if __name__ == "__main__":
  main()
