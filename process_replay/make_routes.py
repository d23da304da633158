"""Build the sample routes (process_replay/routes/<name>) from the synthetic camerad scenes and the car stub.

    python -m process_replay.make_routes [--out DIR] [--routes tici mici lanechange] [--seconds S] [--seed 0] [--force]

Sample routes: `tici` and `mici` (10.5 s: the default drive, engage request from 3 s, a blinker episode that
never becomes a lane change because nothing has lateral control) and `lanechange` (tici, 8 s, the car stub's
`lane-change` scenario: lateral control active, left blinker at 2 s, a nudge on the wheel at 2.5 s).

Invariants:
- Everything is simulated time: car tick n is logged at START_NS + n * 10 ms, camera frame k ends at
  START_NS + k * 50 ms + FRAME_OFFSET_NS on all three cameras; so the recorded inputs (frames, camera states,
  car messages) are a pure function of the arguments, and the daemons' outputs a function of their code.
- Frames are the synthetic scenes without their sensor noise: noise does not compress (about 140 KB per
  tici frame instead of 5 KB), and git would otherwise carry ~80 MB per route.
- The model and safety outputs (driverStateV2, modelV2, drivingModelData, cameraOdometry,
  driverMonitoringState, selfdriveState) are produced the way openpilot's regen does it: the base route is
  replayed through each real daemon in dependency order and their outputs are merged into the final log.
  dmonitoringd runs before selfdrived exists, so its selfdriveState context is absent (not engaged), and the
  car stub's carControl is generated with engaged=False.
"""
from __future__ import annotations

import os
import shutil
import tempfile

from cereal.messaging import log_from_bytes, new_message
from cereal.route import Route, RouteWriter
from process_replay.cli import ArgParser, usage_exit
from process_replay.configs import get_config
from process_replay.harness import LogMessage, load_messages, replay
from selfdrive_stub.producers.car import CarStub, DriveModel
from selfdrive_stub.producers.scenes import SceneRenderer
from visionipc.nv12 import padded_nv12_layout

START_NS = 1_000_000_000_000
FRAME_NS = 50_000_000
TICK_NS = 10_000_000
FRAME_OFFSET_NS = 5_000_000     # frames end 5 ms after a car tick, so the two streams never share a timestamp
READOUT_NS = 10_000_000
STATE_DELAY_NS = 2_000_000      # camera state message after the frame's end
FRAME_LEVEL = 6                 # zstd level of the committed frame files
REGEN_ORDER = ("dmonitoringmodeld", "modeld", "dmonitoringd", "selfdrived")
CAMERA_SERVICES = (("road", "narrowRoadCameraState"), ("wide", "wideRoadCameraState"), ("cabin", "cabinCameraState"))
ROUTES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "routes")
# name -> (device, car stub scenario, seconds)
SAMPLE_ROUTES = {"tici": ("tici", "default", 10.5), "mici": ("mici", "default", 10.5),
                 "lanechange": ("tici", "lane-change", 8.0)}


def write_base_route(path: str, device: str, seconds: float, seed: int, frame_level: int = 1,
                     scenario: str = "default") -> None:
  """Camera frames, camera states and the car stub's messages for `seconds` of simulated drive."""
  if not seconds >= FRAME_NS / 1e9:
    raise ValueError(f"seconds={seconds!r}: a route needs at least one frame ({FRAME_NS / 1e9} s)")
  n_frames = int(round(seconds * 1e9 / FRAME_NS))
  n_ticks = int(round(seconds * 1e9 / TICK_NS))
  stub = CarStub(DriveModel(seed, scenario=scenario), device)
  extra = {"seconds": seconds, **({"scenario": scenario} if scenario != "default" else {})}
  with RouteWriter(path, device, "process_replay.make_routes", seed, extra, frame_level) as writer:
    renderer = SceneRenderer(device, seed, noise=False)
    for tick in range(n_ticks):
      t = START_NS + tick * TICK_NS
      for j, msg in enumerate(stub.messages(tick, engaged=False)):
        msg.logMonoTime = t + j * 1000
        writer.add_event(msg.to_bytes(), msg.logMonoTime, msg.which())
    for k in range(n_frames):
      eof = START_NS + k * FRAME_NS + FRAME_OFFSET_NS
      sof = eof - READOUT_NS
      for j, (camera, service) in enumerate(CAMERA_SERVICES):
        cam = getattr(renderer.device, camera)
        size, stride, uv_offset = padded_nv12_layout(cam.width, cam.height)
        writer.add_frame(camera, renderer.frame(camera, k), k, sof, eof, cam.width, cam.height, stride, uv_offset)
        msg = new_message(service)
        state = getattr(msg, service)
        state.frameId, state.timestampSof, state.timestampEof = k, sof, eof
        state.sensor = renderer.device.sensor
        msg.logMonoTime = eof + STATE_DELAY_NS + j * 1000
        writer.add_event(msg.to_bytes(), msg.logMonoTime, service)


def regen(route: Route, procs=REGEN_ORDER, log=print) -> list[LogMessage]:
  """Replay the base route through each daemon in order, feeding later ones the earlier ones' outputs."""
  msgs = load_messages(route)
  for name in procs:
    result = replay(get_config(name), route, messages=msgs)
    log(f"  {name}: {result.steps} steps, {result.counts}, {result.realtime_factor:.1f}x real time")
    for data in result.outputs:
      evt = log_from_bytes(data)
      msgs.append(LogMessage(evt.logMonoTime, evt.which(), data))
    msgs.sort(key=lambda m: m.log_mono_time)
  return msgs


def make_route(out: str, device: str, seconds: float, seed: int, procs=REGEN_ORDER, log=print,
               scenario: str = "default") -> None:
  if os.path.exists(out):
    raise FileExistsError(f"{out} exists; remove it first")
  with tempfile.TemporaryDirectory(prefix="route_base_") as tmp:
    base = os.path.join(tmp, "base")
    log(f"{device}: rendering {seconds} s of frames and car messages (scenario {scenario})")
    write_base_route(base, device, seconds, seed, scenario=scenario)
    extra = {"seconds": seconds, **({"scenario": scenario} if scenario != "default" else {})}
    with Route(base) as route:
      msgs = regen(route, procs, log=log)
      with RouteWriter(out, device, "process_replay.make_routes", seed, extra, FRAME_LEVEL) as writer:
        for m in msgs:
          writer.add_event(m.data, m.log_mono_time, m.which)
        for camera in route.cameras:
          reader = route.frames(camera)
          g = reader.geometry
          for frame in reader:
            writer.add_frame(camera, frame.data, frame.frame_id, frame.timestamp_sof, frame.timestamp_eof,
                             g.width, g.height, g.stride, g.uv_offset)
  size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
  log(f"{device}: wrote {out} ({size / 1e6:.1f} MB)")


def main(argv=None) -> int:
  ap = ArgParser(prog="python -m process_replay.make_routes", description=__doc__.splitlines()[0])
  ap.add_argument("--out", default=ROUTES_DIR, help="directory that receives one route per name")
  ap.add_argument("--routes", nargs="+", default=list(SAMPLE_ROUTES), choices=list(SAMPLE_ROUTES),
                  help="which sample routes to build (default: all)")
  ap.add_argument("--seconds", type=float, help="route length instead of each route's own (committed: 10.5 / 8)")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--force", action="store_true", help="replace existing routes")
  args = ap.parse_args(argv)
  for name in args.routes:
    device, scenario, seconds = SAMPLE_ROUTES[name]
    out = os.path.join(args.out, name)
    if os.path.exists(out) and not args.force:
      return usage_exit(ap.prog, f"{out} exists; pass --force to replace it")
    if args.force and os.path.isdir(out):
      shutil.rmtree(out)
    try:
      make_route(out, device, args.seconds or seconds, args.seed, scenario=scenario)
    except ValueError as e:
      return usage_exit(ap.prog, e)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
