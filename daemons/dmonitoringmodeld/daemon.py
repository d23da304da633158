"""dmonitoringmodeld: cabin camera frames -> driver monitoring model -> driverStateV2 (README.md beside this file).

Invariants:
- Sized from the first received frame, not from connect(); a geometry change rebuilds the warp; an unknown
  geometry on the first frame is a startup error (UnknownCameraError names the supported ones), later it is
  logged and its frames skipped. A camerad restart is followed by the VisionIPC client's own reconnect.
- One driverStateV2 per processed frame, frameId = the camera's frame id; `valid` per core.py.
- SIGINT/SIGTERM end the loop and the process exits 0. A model that does not meet the contract, or a
  first frame of an unknown geometry, is one line naming it and exit 2 (common.cli). A failure of the model's
  device (a hang past its wait timeout, a disconnect) is one line and exit DEVICE_FAILED: there is no standby
  model, so the process ends and the manager restarts it on a reopened device.
- It says what it is doing, on stderr, in order (daemons/common/daemon_log.py): loading the model (its contract
  checked), waiting for the cabin stream, the first frame and its geometry, compiling the frame program for that
  geometry, ready (with the time and what it compiled, or that it came from the cache), a status line every
  --status-every seconds (frame rate, p50 latency frame end to publish, valid share), and `exiting` when it stops.
"""
import time

from setproctitle import setproctitle

from cereal.messaging import PubMaster, SubMaster
from common.cameras import UnknownCameraError
from common.cli import Parser, check_cache_dir, one_line, run_cli, stop_on_signals
from common.realtime import SCHEDULING_HELP, scheduling_plan
from daemons.common.calibration import camera_time
from daemons.common.daemon_log import devices_words, frame_words, make_log, timed_capture
from daemons.common.frame_loop import Frame, add_status_every, run_frame_loop
from daemons.common.metadata import ModelMetadataError
from daemons.dmonitoringmodeld.core import Calibration, DMonitoringmodeld
from daemons.dmonitoringmodeld.model_state import MODEL_PATH
from daemons.dmonitoringmodeld.programs import dm_devices, load_programs
from msgq.namespace import runtime_dir
from runtime import config as runtime_config
from runtime.device import DeviceDisconnected, DeviceTimeout, TransferError
from visionipc import VisionIpcClient, VisionStreamType

PROCESS_NAME = "dmonitoringmodeld"
WAITING_LOG_S = 10.0   # while no frame comes, say so this often
DEVICE_FAILED = 1        # exit status after the model's device failed (not a user error: 2 is theirs)
# a device that worked and then failed; one that is not there at all (DeviceUnavailable) is a setup error, exit 2
DEVICE_FAILURES = (DeviceTimeout, DeviceDisconnected, TransferError)


log = make_log(PROCESS_NAME)


def main(argv=None) -> int:
  ap = Parser(prog="python -m daemons.dmonitoringmodeld", description=__doc__.splitlines()[0], epilog=SCHEDULING_HELP)
  ap.add_argument("--model", default=MODEL_PATH,
                  help="ONNX model with the DM contract (inputs, heads: daemons/dmonitoringmodeld/README.md)")
  ap.add_argument("--server", default="camerad", help="VisionIPC server name (default camerad)")
  add_status_every(ap, "driverStateV2")
  args = ap.parse_args(argv)
  check_cache_dir()   # an unsafe cache dir is one line now, not after waiting for frames
  try:
    scheduling = scheduling_plan(PROCESS_NAME)  # checked now, applied before the frame loop
  except ValueError as e:
    ap.error(str(e))
  setproctitle(PROCESS_NAME)
  runtime_config.set_runtime_dir(runtime_dir)   # the USB+AMD simulator's files live in this run's namespace
  stop = stop_on_signals()

  log(f"loading model {args.model}")
  model = load_programs(args.model)   # the captured frame program per cabin geometry (compiled at the first frame)
  log(f"model fits the contract; its frame program ({devices_words(dm_devices())}) is compiled at the first frame, "
      "for that frame's geometry")
  dm = DMonitoringmodeld(model)
  pm = PubMaster(["driverStateV2"], process=PROCESS_NAME)
  sm = SubMaster(["extrinsicsCalibration"])
  calib = Calibration()
  client = VisionIpcClient(args.server, VisionStreamType.VISION_STREAM_CABIN, conflate=True, skip_overwritten=True)
  scheduling.apply(log)
  log(f"waiting for the cabin stream of VisionIPC server {args.server!r}")
  state = {"first": True, "skipped_geometry": None, "geometry": None}
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
      dm.check_geometry(buf.width, buf.height)
    except UnknownCameraError as e:
      if state["first"]:
        raise
      if state["skipped_geometry"] != (buf.width, buf.height):
        log(f"skipping frames: {e}")
        state["skipped_geometry"] = (buf.width, buf.height)
      return None
    geometry = (buf.width, buf.height, buf.stride, memoryview(buf.data).nbytes)
    if geometry != state["geometry"]:   # the first frame, or camerad restarted with another camera
      words = frame_words(buf.width, buf.height, buf.stride)
      log(f"first frame {buf.frame_id}: cabin stream {words}" if state["first"] else f"cabin stream changed to {words}")
      # compiled now, so the step that runs it is not the one that waits
      timed_capture(log, "the frame program (warp + model)", words, lambda: dm.model.frames.program(geometry))
      state["first"], state["geometry"] = False, geometry
    state["skipped_geometry"] = None
    return [Frame.from_buf(buf)]

  def read_bus(frames) -> Calibration:
    sm.update(0)
    if sm.updated["extrinsicsCalibration"]:   # its age is judged in camera time, so a replay is exact
      calib.update(sm["extrinsicsCalibration"], camera_time(frames[0].frame_id), sm.valid["extrinsicsCalibration"])
    return calib

  try:
    run_frame_loop(receive, read_bus, dm.step, pm.send, stop.is_set, status_every=args.status_every, say=log)
  except DEVICE_FAILURES as e:   # the model has no standby: a failed device ends the process (the manager restarts it)
    log(f"the model's device failed: {one_line(e)}; exiting")
    return DEVICE_FAILED
  finally:
    client.close()
    pm.close()
    sm.close()
  log("exiting")
  return 0


def cli() -> None:
  run_cli(PROCESS_NAME, main, hints={ModelMetadataError: "the DM model contract is in daemons/dmonitoringmodeld/README.md"})


if __name__ == "__main__":
  cli()
