"""modeld latency: road frame announced -> modelV2 published, small and big model, with the stack running.

Small model on the CPU and big model on the simulated USB+AMD device, each with camerad, the car stub and
dmonitoringmodeld running.

    python -m bench.modeld_latency [--duration 30] [--warmup 5] [--camera tici|mici] [--modes small,big]

For each mode, in a fresh bus namespace, reports:
- end to end: modelV2.logMonoTime - the later logMonoTime of the frame's two camera states (narrow, wide),
  which camerad stamps right before it announces each frame (modeld needs both; it stamps modelV2 when it
  builds it). Both ends are stamped by their publishers, so the figure does not depend on when this process
  runs (with PYMODELD_REALTIME=1 the realtime daemons preempt it); outputs are matched to camera states at the
  end, since camerad publishes a state after its frame and a modelV2 can be drained first;
- per stage from modelV2.stageTimings (warp, upload, model, readback, parse) and modelExecutionTime;
- dropped frames: camera frames with no modelV2, and the share of modelV2 marked invalid.
The big mode waits until modeld reports modelName "big" before measuring; the device is a simulator
(USB link latency/bandwidth modelled, kernels run on this CPU), so big/small ratios are the figure to read.
Then, unless --no-interleaved, both models' runs alone, interleaved in this process on the same inputs (small
on CPU, big on the simulated device), so their ratio is not skewed by load changing between the two modes.
Target of this bench: small p50 <= 25 ms on 2 cores with everything running; < 1 % dropped frames.
"""
import argparse
import subprocess
import time


from daemons.common.env import set_blas_threads  # noqa: E402

set_blas_threads()   # as modeld itself, before numpy loads

import numpy as np  # noqa: E402

from cereal.messaging import sub_sock  # noqa: E402
from common.realtime import stack_pins  # noqa: E402
from msgq.namespace import Namespace, runtime_dir  # noqa: E402
from runtime import config as runtime_config  # noqa: E402
from bench.results import record  # noqa: E402
from bench.stacklib import drain, pct, start  # noqa: E402
from daemons.modeld.model_state import MODEL_PATHS  # noqa: E402
from runtime import OnnxRunner, usb_amd  # noqa: E402
from runtime.device import Device  # noqa: E402

runtime_config.set_runtime_dir(runtime_dir)  # the simulator's presence file, in the bench's namespace

STAGES = ("warpMs", "uploadMs", "modelMs", "readbackMs", "parseMs")


def matched(outputs: list, cam_time: dict) -> list:
  """(end-to-end ms, execution ms, valid, stage timings, frame id) of each modelV2 whose camera states came."""
  return [((t - cam_time[f]) / 1e6, execution, valid, stages, f) for f, t, execution, valid, stages in outputs
          if f in cam_time]


def run_mode(mode: str, args) -> dict:
  with Namespace():
    if mode == "big":
      usb_amd.plug()
    models = sub_sock("modelV2", conflate=False)
    cams = [sub_sock(service, conflate=False) for service in ("narrowRoadCameraState", "wideRoadCameraState")]
    procs = [start("selfdrive_stub.producers.camerad", "--camera", args.camera), start("selfdrive_stub.producers.car", "--camera", args.camera),
             start("daemons.dmonitoringmodeld"), start("daemons.modeld", *(["--no-big"] if mode == "small" else []))]
    print(f"[{mode}] camerad ({args.camera}), car, dmonitoringmodeld, modeld; pinned: {stack_pins() or 'none'}; "
          f"warm-up {args.warmup:.0f} s, then {args.duration:.0f} s", flush=True)
    cam_time, outputs, frames_seen = {}, [], []
    t_start = time.monotonic()
    measure_from = big_since = None
    next_report = t_start + 5
    try:
      while True:
        now = time.monotonic()
        ready = mode == "small" or big_since is not None
        if measure_from is None and ready and now - (t_start if mode == "small" else big_since) > args.warmup:
          measure_from = now
        if measure_from is not None and now - measure_from > args.duration:
          break
        if now - t_start > args.warmup + args.duration + 120:
          print(f"[{mode}] gave up: modeld never got ready", flush=True)
          break
        for sock in cams:
          for m in drain(sock):
            frame_id = getattr(m, m.which()).frameId
            first = frame_id not in cam_time
            cam_time[frame_id] = max(cam_time.get(frame_id, 0), m.logMonoTime)
            if first and measure_from is not None:
              frames_seen.append(frame_id)
        for m in drain(models):
          mv2 = m.modelV2
          if mode == "big" and mv2.modelName != "big":
            if mv2.fallbackReason:
              print(f"[{mode}] modeld fell back to the small model: {mv2.fallbackReason}", flush=True)
            continue
          if mode == "big" and big_since is None:
            big_since = now
          if measure_from is None:
            continue
          outputs.append((mv2.frameId, m.logMonoTime, mv2.modelExecutionTime * 1e3, m.valid,
                          [getattr(mv2.stageTimings, s) for s in STAGES]))
        if now >= next_report:
          rows = matched(outputs, cam_time)
          p50 = f"p50 {pct([r[0] for r in rows], 50):.2f} ms" if rows else "no output yet (the models compile or warm up)"
          print(f"[{mode}] {now - t_start:5.1f} s: {len(rows)} outputs, {p50}", flush=True)
          next_report = now + 5
        time.sleep(0.001)
    finally:
      for p in procs:
        p.terminate()
      for p in procs:
        try:
          p.wait(timeout=20)
        except subprocess.TimeoutExpired:
          p.kill()
      if mode == "big":
        usb_amd.unplug()
  rows = matched(outputs, cam_time)
  ids = {r[4] for r in rows}
  expected = [f for f in frames_seen if f <= max(ids, default=-1)]
  return {"rows": rows, "dropped": sum(f not in ids for f in expected), "frames": len(expected)}


def report(mode: str, res: dict) -> dict:
  rows = res["rows"]
  if not rows:
    print(f"{mode}: no outputs measured")
    return {}
  lat = [r[0] for r in rows]
  stages = np.array([r[3] for r in rows])
  summary = {"e2e": (pct(lat, 50), pct(lat, 99)), "exec": (pct([r[1] for r in rows], 50), pct([r[1] for r in rows], 99))}
  for i, s in enumerate(STAGES):
    summary[s] = (pct(stages[:, i], 50), pct(stages[:, i], 99))
  drop = 100.0 * res["dropped"] / max(res["frames"], 1)
  invalid = 100.0 * sum(not r[2] for r in rows) / len(rows)
  print(f"\n{mode}: {len(rows)} modelV2 over the run; dropped {res['dropped']}/{res['frames']} frames ({drop:.2f} %), "
        f"{invalid:.1f} % invalid")
  print(f"  {'stage':<18}{'p50 ms':>10}{'p99 ms':>10}")
  for name, (p50, p99) in summary.items():
    label = {"e2e": "frame -> modelV2", "exec": "modelExecution"}.get(name, name.replace("Ms", ""))
    print(f"  {label:<18}{p50:>10.2f}{p99:>10.2f}")
  return summary


def interleaved(n: int) -> dict:
  """Model runs only (upload, compute, readback), small and big alternating, same inputs."""
  with Namespace():
    usb_amd.plug()
    try:
      runners = {"small (CPU)": OnnxRunner(MODEL_PATHS["small"], "CPU"),
                 "big (USB+AMD sim)": OnnxRunner(MODEL_PATHS["big"], "USB+AMD")}
      rng = np.random.default_rng(0)
      feeds = {"img": rng.integers(0, 256, (1, 12, 128, 256), dtype=np.uint8),
               "big_img": rng.integers(0, 256, (1, 12, 128, 256), dtype=np.uint8),
               "features_buffer": rng.uniform(-1, 1, (1, 24, 512)).astype(np.float32),
               "desire_pulse": np.zeros((1, 25, 8), np.float32),
               "traffic_convention": np.array([[1, 0]], np.float32), "action_t": np.array([[0.3, 0.5]], np.float32)}
      times = {k: [] for k in runners}
      for i in range(n + 5):
        for name, run in runners.items():
          t0 = time.perf_counter()
          run(**feeds)
          if i >= 5:
            times[name].append((time.perf_counter() - t0) * 1e3)
    finally:
      Device.close("USB+AMD")
      usb_amd.unplug()
  print(f"\nmodel runs alone, interleaved, {n} each:")
  for name, ts in times.items():
    print(f"  {name:<20} p50 {pct(ts, 50):7.2f} ms  p99 {pct(ts, 99):7.2f} ms")
  small, big = (pct(ts, 50) for ts in times.values())
  print(f"  big / small p50: {big / small:.2f}x")
  return {name: {"p50_ms": round(pct(ts, 50), 3), "p99_ms": round(pct(ts, 99), 3)} for name, ts in times.items()}


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--duration", type=float, default=30.0, help="seconds to measure per mode (after warm-up)")
  ap.add_argument("--warmup", type=float, default=5.0, help="seconds ignored at the start of each mode")
  ap.add_argument("--camera", choices=["tici", "mici"], default="tici")
  ap.add_argument("--modes", default="small,big", help="comma-separated: small, big")
  ap.add_argument("--interleaved", type=int, default=100, help="interleaved model-only runs per model (0: skip)")
  args = ap.parse_args(argv)
  summaries = {}
  for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
    if mode not in ("small", "big"):
      ap.error(f"unknown mode {mode!r}; expected small or big")
    summaries[mode] = report(mode, run_mode(mode, args))
  if summaries.get("small") and summaries.get("big"):
    print("\nbig / small (p50):", "  ".join(f"{k.replace('Ms', '')} {summaries['big'][k][0] / summaries['small'][k][0]:.2f}x"
                                            for k in ("e2e", "exec", "modelMs") if summaries["small"][k][0] > 0))
  alone = interleaved(args.interleaved) if args.interleaved > 0 else {}
  if summaries.get("small"):
    p50 = summaries["small"]["e2e"][0]
    print(f"small frame -> modelV2 p50 {p50:.2f} ms (target <= 25 ms): {'met' if p50 <= 25 else 'NOT met'}")
  figures = {"camera": args.camera, "modes": {mode: {k: {"p50_ms": round(v[0], 3), "p99_ms": round(v[1], 3)} for k, v in s.items()}
                                              for mode, s in summaries.items()}, "models_alone": alone}
  print(f"recorded in {record('modeld_latency', figures)}")


if __name__ == "__main__":
  main()
