"""dmonitoringmodeld latency: cabin frame announced → driverStateV2 published, with the stack running.

    python -m bench.dm_latency [--duration 30] [--camera tici|mici] [--no-modeld]
    python -m bench.dm_latency --warp      # the 1440×960 warp alone, against a naive numpy warp

Starts camerad (all three streams), the car stub and modeld (when present) next to dmonitoringmodeld, in a fresh
bus namespace, and reports:
- end to end: driverStateV2.logMonoTime − cabinCameraState.logMonoTime of the same frameId (camerad publishes
  cabinCameraState right after announcing the frame; the daemon stamps driverStateV2 just before sending it);
- per stage from driverStateV2.stageTimings (warp, model, readback, parse);
- frames the camera announced that got no driverStateV2 (dropped), and the daemon's own framesDropped.
Targets of this bench: p50 ≤ 12 ms, p99 ≤ 25 ms on 2 cores with everything running, no dropped frames.
"""
import argparse
import os
import subprocess
import time

import numpy as np


from bench.results import record
from bench.stacklib import REPO_ROOT, drain, pct, start
from cereal.messaging import sub_sock
from common.cameras import DEVICE_CAMERAS
from common.realtime import stack_pins
from daemons.common.dm_warp import BORDER_VALUE, dm_transform
from msgq.namespace import Namespace
from selfdrive_stub.supervisor.cabin_warp import plan_for_camera
from visionipc.nv12 import padded_nv12_layout


def bench_warp(rounds: int = 30) -> None:
  """Plan replay vs the naive numpy warp (per frame: coordinate grid, transform, rint, mask, gather)."""

  def naive(M, buf, w, h, stride):
    ys, xs = np.mgrid[0:960, 0:1440].astype(np.float32)
    den = M[2, 0] * xs + M[2, 1] * ys + M[2, 2]
    sx = np.rint((M[0, 0] * xs + M[0, 1] * ys + M[0, 2]) / den)
    sy = np.rint((M[1, 0] * xs + M[1, 1] * ys + M[1, 2]) / den)
    ok = (sx >= 0) & (sx <= w - 1) & (sy >= 0) & (sy <= h - 1)
    out = np.full((960, 1440), BORDER_VALUE, np.uint8)
    out[ok] = buf[sy[ok].astype(np.int64) * stride + sx[ok].astype(np.int64)]
    return out

  figures = {}
  for name, dev in DEVICE_CAMERAS.items():
    cam = dev.cabin
    size, stride, _ = padded_nv12_layout(cam.width, cam.height)
    buf = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
    plan, M = plan_for_camera(cam.width, cam.height, stride), dm_transform(cam)
    out = np.empty((1, 1440 * 960), np.uint8)
    assert (plan(buf, out).reshape(960, 1440) == naive(M, buf, cam.width, cam.height, stride)).all()
    ours, peer = [], []
    for _ in range(rounds):   # interleaved, so both see the same machine load
      t0 = time.perf_counter()
      plan(buf, out)
      t1 = time.perf_counter()
      naive(M, buf, cam.width, cam.height, stride)
      ours.append((t1 - t0) * 1e3)
      peer.append((time.perf_counter() - t1) * 1e3)
    print(f"{name} {cam.width}x{cam.height} ({plan.kind}): plan p50 {pct(ours, 50):.3f} ms, naive numpy p50 "
          f"{pct(peer, 50):.2f} ms, {pct(peer, 50) / pct(ours, 50):.0f}x faster (target ≤ 1 ms)")
    figures[name] = {"plan_p50_ms": round(pct(ours, 50), 4), "naive_numpy_p50_ms": round(pct(peer, 50), 3),
                     "naive_over_plan": round(pct(peer, 50) / pct(ours, 50), 1)}
  print(f"recorded in {record('dm_latency', {'warp': figures}, note='--warp: the 1440x960 warp alone')}")


def latencies_ms(announced: dict, published: dict) -> list[float]:
  """Announcement → driverStateV2 in ms, for every frame measured at both ends."""
  return [(published[f] - announced[f]) / 1e6 for f in announced if f in published]


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--duration", type=float, default=30.0, help="seconds to measure (after warm-up)")
  ap.add_argument("--warmup", type=float, default=5.0, help="seconds ignored at the start")
  ap.add_argument("--camera", choices=["tici", "mici"], default="tici")
  ap.add_argument("--no-modeld", action="store_true", help="do not run the road model next to it")
  ap.add_argument("--warp", action="store_true", help="benchmark only the warp, against a naive numpy warp")
  args = ap.parse_args(argv)
  if args.warp:
    bench_warp()
    return

  with Namespace():
    cams, states = sub_sock("cabinCameraState"), sub_sock("driverStateV2")
    procs = [start("selfdrive_stub.producers.camerad", "--camera", args.camera), start("selfdrive_stub.producers.car")]
    with_modeld = not args.no_modeld and os.path.exists(os.path.join(REPO_ROOT, "daemons", "modeld", "__main__.py"))
    if with_modeld:
      procs.append(start("daemons.modeld"))
    procs.append(start("daemons.dmonitoringmodeld"))
    print(f"running camerad ({args.camera}), car{', modeld' if with_modeld else ''}, dmonitoringmodeld; "
          f"pinned: {stack_pins() or 'none'}; warm-up {args.warmup:.0f} s, then {args.duration:.0f} s", flush=True)
    announced, published = {}, {}
    stages = {k: [] for k in ("warpMs", "modelMs", "readbackMs", "parseMs")}
    daemon_dropped = []
    t_start = time.monotonic()
    measure_from = t_start + args.warmup
    next_report = measure_from + 5
    try:
      while (now := time.monotonic()) < measure_from + args.duration:
        for m in drain(cams):
          if now >= measure_from:
            announced[m.cabinCameraState.frameId] = m.logMonoTime
        for m in drain(states):  # matched to announcements at the end: a driverStateV2 can be drained
          ds = m.driverStateV2  # before the camera state it answers, which camerad publishes after the frame
          daemon_dropped.append(ds.framesDropped)
          published[ds.frameId] = m.logMonoTime
          if now >= measure_from:
            for k in stages:
              stages[k].append(getattr(ds.stageTimings, k))
        if now >= next_report:
          lat = latencies_ms(announced, published)
          print(f"  {now - measure_from:5.0f} s: {len(lat)} frames, p50 {pct(lat, 50):.1f} ms, "
                f"p99 {pct(lat, 99):.1f} ms", flush=True)
          next_report += 5
        time.sleep(0.005)
    finally:
      for p in procs:
        p.terminate()
      for p in procs:
        try:
          p.wait(10)
        except subprocess.TimeoutExpired:
          p.kill()
          p.wait()

  lat = latencies_ms(announced, published)
  last_announced = max(announced) if announced else 0
  missed = len([f for f in announced if f not in published and f < last_announced])
  print(f"\nframe announced → driverStateV2 published, {len(lat)} frames over {args.duration:.0f} s "
        f"({len(lat) / args.duration:.1f} Hz)")
  print(f"  end to end   p50 {pct(lat, 50):6.2f} ms   p99 {pct(lat, 99):6.2f} ms   "
        f"max {max(lat, default=float('nan')):6.2f} ms   (target p50 ≤ 12, p99 ≤ 25)")
  for k, v in stages.items():
    print(f"  {k:<12} p50 {pct(v, 50):6.2f} ms   p99 {pct(v, 99):6.2f} ms")
  dropped = daemon_dropped[-1] - daemon_dropped[0] if daemon_dropped else 0
  print(f"  frames announced without a driverStateV2: {missed} of {len(announced)}; daemon framesDropped over the run: {dropped}")
  figures = {"camera": args.camera, "with_modeld": with_modeld, "frames": len(lat), "p50_ms": round(pct(lat, 50), 3),
             "p99_ms": round(pct(lat, 99), 3), "stages_p50_ms": {k: round(pct(v, 50), 3) for k, v in stages.items()},
             "missed": missed, "daemon_frames_dropped": dropped}
  print(f"recorded in {record('dm_latency', figures)}")


if __name__ == "__main__":
  main()
