"""Per-frame work of dmonitoringmodeld, free of sockets so tests and process_replay can drive it.

Invariants:
- The model's metadata is validated at load (required heads, sizes, slices inside the output); its inputs must be
  `input_img` (1, 1382400) and `calib` (1, 3).
- The warp plan is built from the first frame's geometry and rebuilt only when the geometry changes; an unknown
  geometry raises UnknownCameraError (the caller decides: fatal at startup, skip later).
- `valid` is False, with the reason in `invalidReason`, when the output is non-finite, the frame was overwritten
  while being processed, or the calibration is missing, invalid, the wrong length or stale. The reasons join
  with "; " so a consumer sees all of them.
"""
import math
import os
import time
from dataclasses import dataclass, field

import numpy as np

from cereal.messaging import new_message
from daemons.common.dm_warp import DM_INPUT_SIZE, WarpPlan, plan_for_camera
from daemons.common.metadata import ModelContract, ModelMetadata, ModelMetadataError, load_metadata
from daemons.dmonitoringmodeld.parse import HEAD_SIZES, fill_driver_data, non_finite_heads, parse_outputs

MODEL_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models", "dmonitoring_model.onnx")
CALIB_STALE_S = 2.5        # 10 periods of the 4 Hz extrinsicsCalibration (the daemon's clock: camera time)
INPUT_SHAPES = {"input_img": (1, DM_INPUT_SIZE[0] * DM_INPUT_SIZE[1]), "calib": (1, 3)}
# the DM model contract (README.md states it): checked whole at load, every mismatch in one error
DM_CONTRACT = ModelContract("driver monitoring", {"input_img": ("uint8", INPUT_SHAPES["input_img"]),
                                                  "calib": ("float32", INPUT_SHAPES["calib"])}, HEAD_SIZES)


def load_dm_metadata(path: str) -> ModelMetadata:
  return load_metadata(path, contract=DM_CONTRACT)


@dataclass
class Calibration:
  """The latest extrinsicsCalibration as the daemon judges it. `problem(now)` is '' when it may be used.
  A bad rpyCalib is not fed to the model: the last good one (zeros at first) stays."""
  rpy: np.ndarray = field(default_factory=lambda: np.zeros(3, np.float32))
  received_at: float | None = None
  status: str = ""
  msg_valid: bool = True
  bad_value: str = ""

  def update(self, cal, now: float, msg_valid: bool = True) -> None:
    rpy = [float(v) for v in cal.rpyCalib]
    self.received_at, self.status, self.msg_valid, self.bad_value = now, str(cal.calStatus), msg_valid, ""
    if len(rpy) != 3:
      self.bad_value = f"calibration rpyCalib has {len(rpy)} values, expected 3"
    elif not all(math.isfinite(v) for v in rpy):
      self.bad_value = f"calibration rpyCalib is not finite: {rpy}"
    else:
      self.rpy = np.asarray(rpy, np.float32)

  def problem(self, now: float) -> str:
    if self.received_at is None:
      return "calibration missing"
    if self.bad_value:
      return self.bad_value
    if not self.msg_valid or self.status == "invalid":
      return f"calibration invalid (calStatus={self.status}, valid={self.msg_valid})"
    if now < self.received_at:
      self.received_at = now       # the camera restarted (frame ids start over): age counts from here
    age = now - self.received_at
    if age > CALIB_STALE_S:
      return f"calibration stale ({age:.1f} s old)"
    return ""


class ModelState:
  def __init__(self, runner, metadata: ModelMetadata, send_raw_pred: bool = False):
    self.runner = runner
    self.meta = metadata
    self.send_raw_pred = send_raw_pred
    self.plan: WarpPlan | None = None
    self.geometry: tuple[int, int, int] | None = None
    self.img = np.zeros(INPUT_SHAPES["input_img"], np.uint8)
    self.calib = np.zeros(INPUT_SHAPES["calib"], np.float32)
    self.last_frame_id: int | None = None
    self.frames_dropped = 0

  @classmethod
  def load(cls, runner_factory, path: str = MODEL_PATH, send_raw_pred: bool = False) -> "ModelState":
    meta = load_dm_metadata(path)
    return cls(runner_factory(path), meta, send_raw_pred)

  def ensure_plan(self, width: int, height: int, stride: int) -> WarpPlan:
    """The warp for this geometry (UnknownCameraError for an unsupported one)."""
    if self.geometry != (width, height, stride):
      self.plan = plan_for_camera(width, height, stride)
      self.geometry = (width, height, stride)
    return self.plan

  def step(self, frame, width: int, height: int, stride: int, frame_id: int, calib: Calibration, now: float,
           timestamp_sof: int = 0, timestamp_eof: int = 0, still_valid=lambda: True):
    """Warp, run, parse one frame; returns the driverStateV2 Event builder. `still_valid()` is the
    VisionIPC overwrite check, called after the pixels were last read."""
    t0 = time.perf_counter()
    self.ensure_plan(width, height, stride)(frame, out=self.img)
    overwritten = not still_valid()
    t1 = time.perf_counter()
    self.calib[0, :] = calib.rpy
    out, times = self.runner({"input_img": self.img, "calib": self.calib})
    t2 = time.perf_counter()
    reasons = []
    if out.size != self.meta.output_size:
      raise ModelMetadataError(f"model returned {out.size} values, metadata says {self.meta.output_size}")
    bad = non_finite_heads(out, self.meta)
    if bad:
      reasons.append(f"non-finite model output in {bad}")
    if overwritten:
      reasons.append(f"frame {frame_id} was overwritten during processing")
    cal_problem = calib.problem(now)
    if cal_problem:
      reasons.append(cal_problem)
    parsed = parse_outputs(out, self.meta)
    if self.last_frame_id is not None and frame_id > self.last_frame_id + 1:
      self.frames_dropped += frame_id - self.last_frame_id - 1
    self.last_frame_id = frame_id

    msg = new_message("driverStateV2", valid=not reasons)
    if reasons:
      msg.invalidReason = "; ".join(reasons)
    ds = msg.driverStateV2
    ds.frameId = frame_id
    ds.timestampSof, ds.timestampEof = timestamp_sof, timestamp_eof
    ds.framesDropped = self.frames_dropped
    ds.wheelOnRightProb = parsed["wheel_on_right"]
    fill_driver_data(ds.leftDriverData, parsed["lhd"])
    fill_driver_data(ds.rightDriverData, parsed["rhd"])
    if self.send_raw_pred:
      ds.rawPredictions = out.astype("<f4").tobytes()
    t3 = time.perf_counter()
    st = ds.stageTimings
    st.warpMs = (t1 - t0) * 1e3
    st.modelMs = times.get("model", t2 - t1) * 1e3
    st.readbackMs = times.get("readback", 0.0) * 1e3
    st.uploadMs = times.get("upload", 0.0) * 1e3
    st.parseMs = (t3 - t2) * 1e3
    ds.modelExecutionTime = t3 - t0
    ds.gpuExecutionTime = t2 - t1
    return msg
