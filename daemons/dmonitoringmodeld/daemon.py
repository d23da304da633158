"""dmonitoringmodeld: cabin frames → DM model → driverStateV2 (spec dm_pipeline.md §1.5, with the fixes of §9).

Invariants:
- Sized from the first received frame, not from connect(); a geometry change rebuilds the warp; an unknown
  geometry on the first frame is a startup error (UnknownCameraError names the supported ones), later it is
  logged and its frames skipped. A camerad restart is followed by the VisionIPC client's own reconnect.
- One driverStateV2 per processed frame, frameId = the camera's frame id; `valid` per model_state.py.
- SIGINT/SIGTERM end the loop and the process exits 0.
"""
import argparse
import os
import signal
import sys

from setproctitle import setproctitle

from cereal.messaging import PubMaster, SubMaster
from daemons.common.cameras import UnknownCameraError
from daemons.common.realtime import SCHEDULING_HELP, scheduling_plan
from daemons.dmonitoringmodeld.model_state import MODEL_PATH, Calibration, ModelState, send_raw_pred_enabled
from daemons.dmonitoringmodeld.runner import make_runner
from msgq.namespace import runtime_dir
from runtime import config as runtime_config
from visionipc import VisionIpcClient, VisionStreamType

PROCESS_NAME = "dmonitoringmodeld"
CAMERA_DT = 0.05


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
  ap = argparse.ArgumentParser(prog=PROCESS_NAME, description=__doc__.splitlines()[0], epilog=SCHEDULING_HELP)
  ap.add_argument("--model", default=MODEL_PATH, help="ONNX model with the DM contract")
  ap.add_argument("--server", default="camerad", help="VisionIPC server name")
  args = ap.parse_args(argv)
  try:
    scheduling = scheduling_plan(PROCESS_NAME)  # checked now, applied before the frame loop
  except ValueError as e:
    ap.error(str(e))
  setproctitle(PROCESS_NAME)
  runtime_config.set_runtime_dir(runtime_dir)   # the USB+AMD simulator's files live in this run's namespace
  stop = Stop()

  model = ModelState.load(make_runner, args.model, send_raw_pred_enabled(os.environ.get("SEND_RAW_PRED")))
  pm = PubMaster(["driverStateV2"], process=PROCESS_NAME)
  sm = SubMaster(["extrinsicsCalibration"])
  calib = Calibration()
  client = VisionIpcClient(args.server, VisionStreamType.VISION_STREAM_CABIN, conflate=True)
  scheduling.apply(log)
  log("connecting to cabin stream")
  first = True
  skipped_geometry = None
  try:
    while not stop.requested:
      buf = client.recv(100)
      if buf is None:
        continue
      sm.update(0)
      # calibration age is measured in camera time (frame ids at 20 Hz), not wall time, so a replay is exact
      now = buf.frame_id * CAMERA_DT
      if sm.updated["extrinsicsCalibration"]:
        calib.update(sm["extrinsicsCalibration"], now, sm.valid["extrinsicsCalibration"])
      try:
        model.ensure_plan(buf.width, buf.height, buf.stride)
      except UnknownCameraError as e:
        if first:
          raise
        if skipped_geometry != (buf.width, buf.height):
          log(f"skipping frames: {e}")
          skipped_geometry = (buf.width, buf.height)
        continue
      if first:
        log(f"cabin stream {buf.width}x{buf.height} stride {buf.stride}: warp plan {model.plan.kind}")
        first = False
      skipped_geometry = None
      msg = model.step(buf.data, buf.width, buf.height, buf.stride, buf.frame_id, calib, now,
                       buf.timestamp_sof, buf.timestamp_eof, buf.still_valid)
      pm.send("driverStateV2", msg)
  finally:
    client.close()
    pm.close()
    sm.close()
  log("exiting")
  return 0


if __name__ == "__main__":
  sys.exit(main())
