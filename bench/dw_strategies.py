"""Depthwise convs with lanes along the rows ("direct") against lanes along the channels ("direct_cm": the input
copied into channel blocks first), over a grid of windows, strides, channel counts and plane sizes: the data
behind codegen/conv.py's dw_channel_lanes.

    python -m bench.dw_strategies [--iters 40] [--channels 96,384] [--kernels 3,5,7] [--sizes 7,14,28,56,112]

One process, one thread. Each conv is built once per strategy as a one-conv program (the way the measured search
builds its candidates: runtime.program.build_program with force_conv), both are checked to give the same output,
then timed in alternation; each figure is the fastest run (the kernels are a few microseconds to a millisecond,
well under this VM's scheduling noise, which the minimum filters out). Each row says which strategy the heuristic
takes and whether that was the faster; the run is appended to bench/results/dw_strategies.json."""
from __future__ import annotations

import argparse
import time

import numpy as np

from bench.results import record
from runtime.codegen import conv as cv
from runtime.compiler import vector_bytes
from runtime.graph import Graph, Node, Spec
from runtime.link import link
from runtime.program import build_program


def parse():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--iters", type=int, default=40, help="timed runs per strategy (alternating)")
  p.add_argument("--channels", default="96,384", help="comma-separated channel counts (whole vectors)")
  p.add_argument("--kernels", default="3,5,7", help="comma-separated square window sizes")
  p.add_argument("--sizes", default="7,14,28,56,112", help="comma-separated square input plane sizes")
  p.add_argument("--max-elements", type=int, default=96 * 112 * 112, help="skip inputs larger than this")
  return p.parse_args()


def ints(s: str) -> list[int]:
  return [int(v) for v in s.split(",") if v]


def one_conv(C: int, k: int, s: int, hw: int, rng) -> Graph:
  w = (rng.standard_normal((C, 1, k, k)) * 0.3).astype(np.float32)
  node = Node("Conv", ["x", "w"], ["y"], {"group": C, "strides": [s, s], "pads": [k // 2] * 4, "kernel_shape": [k, k]})
  return Graph({"x": Spec((1, C, hw, hw), np.dtype(np.float32))}, ["y"], [node], {"w": w}, opset=17)


def main():
  args = parse()
  vl = vector_bytes() // 4
  rng = np.random.default_rng(0)
  rows = []
  print(f"{'C':>4} {'k':>2} {'s':>2} {'hw':>4} {'out_w':>5} {'rows us':>9} {'channels us':>12} {'ratio':>6}  heuristic")
  for C in ints(args.channels):
    for k in ints(args.kernels):
      for s in (1, 2):
        for hw in ints(args.sizes):
          if C * hw * hw > args.max_elements:
            continue
          g = one_conv(C, k, s, hw, rng)
          linked = {st: link(build_program(g, "CPU", passes=False, force_conv={"y": st}, measure=False))
                    for st in ("direct", "direct_cm")}
          x = rng.standard_normal((1, C, hw, hw)).astype(np.float32)
          outs = {}
          for st, lk in linked.items():
            lk.inputs["x"][...] = x
            lk.run()
            outs[st] = np.array(lk.outputs["y"])
          assert np.allclose(outs["direct"], outs["direct_cm"], rtol=1e-5, atol=1e-5), (C, k, s, hw)
          best = {st: float("inf") for st in linked}
          for _ in range(args.iters):
            for st, lk in linked.items():
              t = time.perf_counter()
              lk.run()
              best[st] = min(best[st], time.perf_counter() - t)
          out_w = (hw + 2 * (k // 2) - k) // s + 1
          pick = "direct_cm" if cv.dw_channel_lanes(k * k, s > 1, out_w, vl) else "direct"
          ratio = best["direct_cm"] / best["direct"]
          right = (ratio <= 1.05) if pick == "direct_cm" else (ratio >= 0.95)   # within 5 %: a tie either way
          rows.append({"C": C, "k": k, "stride": s, "hw": hw, "out_w": out_w, "rows_us": best["direct"] * 1e6,
                       "channels_us": best["direct_cm"] * 1e6, "ratio": ratio, "heuristic": pick, "heuristic_ok": right})
          print(f"{C:>4} {k:>2} {s:>2} {hw:>4} {out_w:>5} {best['direct'] * 1e6:>9.1f} {best['direct_cm'] * 1e6:>12.1f} "
                f"{ratio:>6.2f}  {pick}{'' if right else '  (the other was faster)'}", flush=True)
  missed = [r for r in rows if not r["heuristic_ok"]]
  print(f"{len(rows)} convs; the heuristic took the faster form (or one within 5 %) for {len(rows) - len(missed)}")
  print(f"results: {record('dw_strategies', {'vl': vl, 'rows': rows, 'missed': len(missed)})}")


if __name__ == "__main__":
  main()
