"""The per-frame step of dmonitoringmodeld on the daemons' shared skeleton (daemons/common/frame_loop.py),
free of sockets so tests drive it directly.

Invariants:
- A frame's geometry is checked when it changes (the frame program of a known geometry is captured by the
  daemon); an unknown geometry raises UnknownCameraError (the caller decides: fatal at startup, skip later).
- `valid` is False, with every reason in `invalidReason` (inputs, overwrite, model, in that order), when the
  calibration is missing, invalid, the wrong length or stale (in camera time: daemons/common/calibration.py),
  the frame was overwritten while it was warped, or the output is unusable (wrong size, NaN/Inf: not parsed, and the
  message carries ids and timestamps only).
- One driverStateV2 per step, frameId = the camera's frame id, with the frame's sof/eof, the count of frames
  skipped since the first one, and the timing fields the skeleton stamps.
"""
from dataclasses import dataclass, field

import numpy as np

from common.cameras import config_for_frame
from common.transforms import CalibrationError, check_calibration
from daemons.common.calibration import CalibrationAge, camera_time
from daemons.common.env import send_raw_pred as env_send_raw_pred
from daemons.common.frame_loop import FrameDrops, FrameStep, ModelOutcome, model_event
from daemons.common.outputs import ModelOutputError
from daemons.common.stage_times import StageTimes
from daemons.dmonitoringmodeld.model_state import ModelState
from daemons.dmonitoringmodeld.parse import fill_driver_data


@dataclass
class Calibration:
  """The latest extrinsicsCalibration as the daemon judges it. `problem(now)` is '' when it may be used
  (`now` in camera seconds). A bad rpyCalib is not fed to the model: the last good one (zeros at first) stays."""
  rpy: np.ndarray = field(default_factory=lambda: np.zeros(3, np.float32))
  age: CalibrationAge = field(default_factory=CalibrationAge)
  status: str = ""
  msg_valid: bool = True
  bad_value: str = ""

  @property
  def received_at(self) -> float | None:
    return self.age.received_at

  def update(self, cal, now: float, msg_valid: bool = True) -> None:
    self.age.received(now)
    self.status, self.msg_valid, self.bad_value = str(cal.calStatus), msg_valid, ""
    try:   # modeld's one check, and its words
      self.rpy = check_calibration(list(cal.rpyCalib)).astype(np.float32)
    except CalibrationError as e:
      self.bad_value = f"calibration unusable: {e}"

  def problem(self, now: float) -> str:
    if self.received_at is None:
      return "calibration missing"
    if self.bad_value:
      return self.bad_value
    if not self.msg_valid or self.status == "invalid":
      return f"calibration invalid (calStatus={self.status}, valid={self.msg_valid})"
    if self.age.stale(now):
      return f"calibration stale ({self.age.age(now):.1f} s old)"
    return ""


class DMonitoringmodeld(FrameStep):
  """step([cabin Frame], Calibration) -> StepResult with one driverStateV2."""

  def __init__(self, model: ModelState, send_raw_pred: bool | None = None):
    self.model = model
    self.send_raw_pred = env_send_raw_pred() if send_raw_pred is None else send_raw_pred
    self.geometry: tuple[int, int] | None = None
    self.drops = FrameDrops()

  def check_geometry(self, width: int, height: int) -> None:
    """A cabin camera of this size is known (UnknownCameraError otherwise)."""
    if self.geometry != (width, height):
      config_for_frame(width, height)
      self.geometry = (width, height)

  def check(self, frames, calib: Calibration) -> list[str]:
    (frame,) = frames
    self.drops.seen(frame.frame_id)
    problem = calib.problem(camera_time(frame.frame_id))
    return [problem] if problem else []

  def run(self, frames, calib: Calibration, reasons: list[str]) -> ModelOutcome:
    (frame,) = frames
    self.check_geometry(frame.width, frame.height)
    try:
      parsed, raw, times = self.model.run_frame(frame, calib.rpy, lambda: self.check_overwritten([frame], reasons))
    except ModelOutputError as e:   # published invalid, with ids and timestamps, never as a prediction
      reasons.append(f"{self.model.name} model failed: {type(e).__name__}: {e}")
      return ModelOutcome(None, None, StageTimes(), self.model.name)
    return ModelOutcome(parsed, raw, times, self.model.name)

  def build(self, frames, calib: Calibration, outcome: ModelOutcome, reasons: list[str]) -> list:
    (frame,) = frames
    parsed = outcome.parsed
    msg = model_event("driverStateV2", reasons)
    ds = msg.driverStateV2
    ds.frameId = frame.frame_id
    ds.timestampSof, ds.timestampEof = frame.timestamp_sof, frame.timestamp_eof
    ds.framesDropped = self.drops.total
    if parsed is None:
      return [("driverStateV2", msg)]
    ds.wheelOnRightProb = parsed["wheel_on_right"]
    fill_driver_data(ds.leftDriverData, parsed["lhd"])
    fill_driver_data(ds.rightDriverData, parsed["rhd"])
    if self.send_raw_pred:
      ds.rawPredictions = outcome.raw.astype("<f4").tobytes()
    return [("driverStateV2", msg)]
