"""dmonitoringmodeld: cabin camera frames -> driver monitoring model -> driverStateV2 (README.md beside this file).

Invariants:
- Sized from the first received frame, not from connect(); a geometry change rebuilds the warp; an unknown
  geometry on the first frame is a startup error (UnknownCameraError names the supported ones), later it is
  logged and its frames skipped. A camerad restart is followed by the VisionIPC client's own reconnect.
- One driverStateV2 per processed frame, frameId = the camera's frame id; `valid` per core.py.
- SIGINT/SIGTERM end the loop and the process exits 0. A model that does not meet the contract, or a
  first frame of an unknown geometry, is one line naming it and exit 2 (daemons.common.cli).
- It says what it is doing: loading, compiled (with the time), waiting for the cabin stream, first frame.
"""
import signal
import sys
import time

from setproctitle import setproctitle

from cereal.messaging import PubMaster, SubMaster
from daemons.common.calibration import camera_time
from daemons.common.cameras import UnknownCameraError
from daemons.common.cli import Parser, check_cache_dir, run_cli
from daemons.common.env import dm_runtime
from daemons.common.frame_loop import Frame, run_frame_loop
from daemons.common.metadata import ModelMetadataError
from daemons.common.realtime import SCHEDULING_HELP, scheduling_plan
from daemons.common.runner import RunnerUnavailable, make_runner
from daemons.dmonitoringmodeld.core import Calibration, DMonitoringmodeld
from daemons.dmonitoringmodeld.model_state import MODEL_PATH, ModelState
from daemons.dmonitoringmodeld.programs import load_programs
from msgq.namespace import runtime_dir
from runtime import config as runtime_config
from visionipc import VisionIpcClient, VisionStreamType

PROCESS_NAME = "dmonitoringmodeld"
WAITING_LOG_S = 10.0   # while no frame comes, say so this often


class Stop:
  def __init__(self):
    self.requested = False
    for sig in (signal.SIGINT, signal.SIGTERM):
      signal.signal(sig, self._handle)

  def _handle(self, signum, frame):
    self.requested = True


def log(msg: str) -> None:
  print(f"{PROCESS_NAME}: {msg}", file=sys.stderr, flush=True)


def main(argv=None) -> int:
  ap = Parser(prog="python -m daemons.dmonitoringmodeld", description=__doc__.splitlines()[0], epilog=SCHEDULING_HELP)
  ap.add_argument("--model", default=MODEL_PATH,
                  help="ONNX model with the DM contract (inputs, heads: daemons/dmonitoringmodeld/README.md)")
  ap.add_argument("--server", default="camerad", help="VisionIPC server name (default camerad)")
  args = ap.parse_args(argv)
  check_cache_dir()   # an unsafe cache dir is one line now, not after waiting for frames
  try:
    scheduling = scheduling_plan(PROCESS_NAME)  # checked now, applied before the frame loop
  except ValueError as e:
    ap.error(str(e))
  setproctitle(PROCESS_NAME)
  runtime_config.set_runtime_dir(runtime_dir)   # the USB+AMD simulator's files live in this run's namespace
  stop = Stop()

  log(f"loading model {args.model}")
  t0 = time.monotonic()
  backend = dm_runtime()
  if backend == "runtime":   # the captured frame program per cabin geometry (captured at the first frame)
    model = load_programs(args.model)
  else:                      # a peer engine: the numpy warp, then the model through the runner protocol
    model = ModelState.load(lambda path: make_runner(path, backend=backend), args.model)
  dm = DMonitoringmodeld(model)
  log(f"model compiled and loaded in {time.monotonic() - t0:.1f} s")
  pm = PubMaster(["driverStateV2"], process=PROCESS_NAME)
  sm = SubMaster(["extrinsicsCalibration"])
  calib = Calibration()
  client = VisionIpcClient(args.server, VisionStreamType.VISION_STREAM_CABIN, conflate=True, skip_overwritten=True)
  scheduling.apply(log)
  log(f"waiting for the cabin stream of VisionIPC server {args.server!r}")
  state = {"first": True, "skipped_geometry": None}
  waiting_since = next_waiting_log = time.monotonic()

  def receive():
    nonlocal next_waiting_log
    buf = client.recv(100)
    if buf is None:
      if state["first"] and time.monotonic() >= next_waiting_log + WAITING_LOG_S:
        next_waiting_log = time.monotonic()
        log(f"still waiting for cabin frames ({next_waiting_log - waiting_since:.0f} s; is camerad running in this "
            "OPENPILOT_PREFIX?)")
      return None
    try:
      dm.ensure_plan(buf.width, buf.height, buf.stride)
    except UnknownCameraError as e:
      if state["first"]:
        raise
      if state["skipped_geometry"] != (buf.width, buf.height):
        log(f"skipping frames: {e}")
        state["skipped_geometry"] = (buf.width, buf.height)
      return None
    if state["first"]:
      log(f"first frame {buf.frame_id}: cabin stream {buf.width}x{buf.height} stride {buf.stride}, "
          f"warp plan {dm.plan.kind}")
      if dm.model.frames is not None:
        t = time.monotonic()
        dm.model.frames.program((buf.width, buf.height, buf.stride, memoryview(buf.data).nbytes))
        log(f"frame program captured in {time.monotonic() - t:.1f} s")
      state["first"] = False
    state["skipped_geometry"] = None
    return [Frame.from_buf(buf)]

  def read_bus(frames) -> Calibration:
    sm.update(0)
    if sm.updated["extrinsicsCalibration"]:   # its age is judged in camera time, so a replay is exact
      calib.update(sm["extrinsicsCalibration"], camera_time(frames[0].frame_id), sm.valid["extrinsicsCalibration"])
    return calib

  try:
    run_frame_loop(receive, read_bus, dm.step, pm.send, lambda: stop.requested)
  finally:
    client.close()
    pm.close()
    sm.close()
  log("exiting")
  return 0


def cli() -> None:
  run_cli(PROCESS_NAME, main, errors=(RunnerUnavailable,),
          hints={ModelMetadataError: "the DM model contract is in daemons/dmonitoringmodeld/README.md"})


if __name__ == "__main__":
  cli()
