"""Per-frame warp + model as one captured runtime program, against today's numpy warp + OnnxRunner, in one run.

    python -m bench.frame_program [--rounds 30] [--camera tici|mici] [--no-record]

For the DM model (cabin luma warp) and the small road model (road + wide warps, image history), per frame:
- program: FrameProgram.run (frames bound as external memory, the warps compiled into the model's program);
- peer: the numpy warp (the cabin plan selfdrive_stub/supervisor/cabin_warp.py, the tests' road oracle tests/warp_oracles.py,
  built once), a ring of the last five warped frames for the road model's image pair, then OnnxRunner on the
  same device.
The two are interleaved frame by frame (so a busy neighbour slows both alike) and checked bit-identical on
the first frame. Reported: p50 and p90 ms of each and the ratio of the p50s (program / peer; < 1 is faster).
Results go to bench/results/frame_program.json (bench/results.py).
"""
import argparse
import sys
import time

import numpy as np


from bench.results import record
from common.cameras import DEVICE_CAMERAS
from common.transforms import get_warp_matrix
from daemons.common import frame_program as fp
from daemons.common.dm_warp import dm_transform
from daemons.dmonitoringmodeld.model_state import MODEL_PATH as DM_MODEL
from daemons.modeld.model_state import MODEL_PATHS
from runtime import OnnxRunner
from selfdrive_stub.supervisor.cabin_warp import plan_for_camera
from tests.warp_oracles import RoadWarp
from visionipc.nv12 import padded_nv12_layout


def pct(xs, q) -> float:
  return round(float(np.percentile(np.asarray(xs) * 1e3, q)), 3)


def compare(name: str, program_step, peer_step, rounds: int) -> dict:
  a, b = program_step(), peer_step()
  for k in b:
    if a[k].tobytes() != b[k].tobytes():
      raise SystemExit(f"{name}: output {k!r} of the frame program differs from the peer's")
  tp, tq = [], []
  for _ in range(rounds):
    t0 = time.perf_counter()
    program_step()
    t1 = time.perf_counter()
    peer_step()
    tq.append(time.perf_counter() - t1)
    tp.append(t1 - t0)
  out = {"program_p50_ms": pct(tp, 50), "program_p90_ms": pct(tp, 90), "peer_p50_ms": pct(tq, 50),
         "peer_p90_ms": pct(tq, 90)}
  out["ratio_p50"] = round(out["program_p50_ms"] / out["peer_p50_ms"], 3)
  return out


def dm_case(cam, rounds: int) -> dict:
  w, h = cam.cabin.size
  size, stride, _ = padded_nv12_layout(w, h)
  prog = fp.dm_frame_program(fp.ModelGraph(DM_MODEL), dm_transform(cam.cabin), w, h, stride, size,
                             fp.device_table("dmonitoringmodeld", {}))
  runner, plan = OnnxRunner(DM_MODEL, "CPU"), plan_for_camera(w, h, stride)
  rng = np.random.default_rng(0)
  frame = rng.integers(0, 256, size, dtype=np.uint8)
  calib = np.zeros((1, 3), np.float32)
  img = np.zeros((1, 1382400), np.uint8)

  def peer():
    plan(frame, out=img)
    return runner(input_img=img, calib=calib)
  return compare("dm", lambda: {prog.output: prog.run({"frame": frame}, {"calib": calib})[0]}, peer, rounds)


def road_case(cam, rounds: int) -> dict:
  w, h = cam.road.size
  size, stride, uv_offset = padded_nv12_layout(w, h)
  prog = fp.road_frame_program(fp.ModelGraph(MODEL_PATHS["small"]),
                               {c: (w, h, stride, uv_offset, size) for c in fp.ROAD_CAMERAS},
                               fp.device_table("modeld.small", {}))
  runner = OnnxRunner(MODEL_PATHS["small"], "CPU")
  rng = np.random.default_rng(1)
  frames = {c: rng.integers(0, 256, size, dtype=np.uint8) for c in fp.ROAD_CAMERAS}
  ms = {"road": get_warp_matrix(np.zeros(3), cam.road.intrinsics), "wide": get_warp_matrix(np.zeros(3), cam.wide.intrinsics, True)}
  warps = {c: RoadWarp(w, h, stride, uv_offset) for c in fp.ROAD_CAMERAS}
  for c in fp.ROAD_CAMERAS:
    warps[c].set_transform(ms[c])
  specs = runner.input_specs
  other = {n: np.zeros(specs[n][0], np.float32) for n in ("features_buffer", "desire_pulse", "traffic_convention", "action_t")}
  rings = {c: np.zeros((fp.RING, 6, 128, 256), np.uint8) for c in fp.ROAD_CAMERAS}
  pushed = [0]

  def program():
    return {prog.output: prog.run({f"{c}_frame": frames[c] for c in fp.ROAD_CAMERAS},
                                  {**{f"{c}_transform": ms[c] for c in fp.ROAD_CAMERAS}, **other})[0]}

  def peer():
    slot, old = pushed[0] % fp.RING, (pushed[0] - fp.PAIR_HISTORY) % fp.RING
    pushed[0] += 1
    pairs = {}
    for c in fp.ROAD_CAMERAS:
      warps[c].warp(frames[c], out=rings[c][slot])
      pairs[fp.ROAD_MODEL_INPUTS[c]] = np.concatenate([rings[c][old], rings[c][slot]])[None]
    return runner(**pairs, **other)
  return compare("road", program, peer, rounds)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--rounds", type=int, default=30)
  ap.add_argument("--camera", choices=sorted(DEVICE_CAMERAS), default="tici")
  ap.add_argument("--no-record", action="store_true")
  args = ap.parse_args(argv)
  if args.rounds < 1:
    ap.error("--rounds must be at least 1")
  cam = DEVICE_CAMERAS[args.camera]
  figures = {"camera": args.camera, "rounds": args.rounds, "dm": dm_case(cam, args.rounds),
             "road_small": road_case(cam, args.rounds)}
  for k in ("dm", "road_small"):
    f = figures[k]
    print(f"{k:11s} program p50 {f['program_p50_ms']:8.3f} ms  p90 {f['program_p90_ms']:8.3f}   "
          f"numpy warp + OnnxRunner p50 {f['peer_p50_ms']:8.3f} ms  p90 {f['peer_p90_ms']:8.3f}   ratio {f['ratio_p50']:.3f}")
  if not args.no_record:
    print("recorded in", record("frame_program", figures, sys.argv if argv is None else ["frame_program", *argv]))
  return 0


if __name__ == "__main__":
  sys.exit(main())
