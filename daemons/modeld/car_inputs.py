"""modeld's bus inputs (carState, carControl, lateralDelay, extrinsicsCalibration, driverMonitoringState) as
CarInputs for Modeld.step.

Invariants:
- a malformed message (capnp-valid, but a non-finite value, an out-of-range delay or an unknown enum ordinal)
  never reaches the model: the last good values stay in use, the frame carries the reason (so it is published
  valid=False) and every rejected message is counted once, when it arrives;
- the calibration itself is checked by the core (check_calibration); here it is only counted when malformed;
- calibration age is judged in camera time (`now` = camera_time of the main frame), as dmonitoringmodeld does
  (daemons/common/calibration.py), never by the SubMaster's wall-clock `alive`: a replay stepped at any speed
  judges it as the drive did, without SIMULATION mode.
"""
import math

from daemons.common.calibration import CalibrationAge
from daemons.modeld.core import CarInputs

MAX_LATERAL_DELAY = 2.0   # s; a delay estimate beyond this is not a delay


def _enum(value) -> str | None:
  """An enumerant's name, or None for an ordinal the schema does not know (capnp-valid, but unusable)."""
  try:
    return str(value)
  except RuntimeError:
    return None


class CarInputReader:
  """CarInputs from the SubMaster. A malformed message (non-finite value, unknown enum) is rejected: the last
  good values stay in use, the frame gets the reason, and every rejected message is counted once."""

  def __init__(self):
    self.car = CarInputs()
    self.malformed_count = 0
    self.calibration_age = CalibrationAge()

  def _check(self, sm, service: str, ok: bool, what: str, problems: list) -> bool:
    if not ok:
      problems.append(f"{service} {what}")
      if sm.updated[service]:
        self.malformed_count += 1
    return ok

  def read(self, sm, now: float) -> CarInputs:
    """The inputs of the frame at camera time `now` (s), after sm.update()."""
    problems: list[str] = []
    if sm.updated["extrinsicsCalibration"]:
      self.calibration_age.received(now)
    prev = self.car
    cs, cc, ld = sm["carState"], sm["carControl"], sm["lateralDelay"]
    car_ok = self._check(sm, "carState", math.isfinite(cs.vEgo) and math.isfinite(cs.steeringTorque), "non-finite", problems)
    delay_ok = not sm.seen["lateralDelay"] or self._check(sm, "lateralDelay", math.isfinite(ld.lateralDelay) and
                                                          0.0 <= ld.lateralDelay <= MAX_LATERAL_DELAY, "out of range", problems)
    calib = sm["extrinsicsCalibration"]
    status = _enum(calib.calStatus)
    if sm.seen["extrinsicsCalibration"]:
      self._check(sm, "extrinsicsCalibration", status is not None and all(map(math.isfinite, calib.rpyCalib)), "malformed", problems)
    invalid = ""
    if sm.seen["extrinsicsCalibration"]:
      if status != "calibrated" and status not in ("uncalibrated", "recalibrating"):
        invalid = f"calStatus {status or 'unknown'}"
      elif not sm.valid["extrinsicsCalibration"]:
        invalid = f"message invalid ({sm.invalid_reason('extrinsicsCalibration') or 'no reason'})"
    self.car = CarInputs(
      v_ego=max(cs.vEgo, 0.0) if car_ok else prev.v_ego,
      left_blinker=cs.leftBlinker if car_ok else prev.left_blinker,
      right_blinker=cs.rightBlinker if car_ok else prev.right_blinker,
      steering_pressed=cs.steeringPressed if car_ok else prev.steering_pressed,
      steering_torque=cs.steeringTorque if car_ok else prev.steering_torque,
      left_blindspot=cs.leftBlindspot if car_ok else prev.left_blindspot,
      right_blindspot=cs.rightBlindspot if car_ok else prev.right_blindspot,
      lat_active=cc.latActive,
      lat_delay=(ld.lateralDelay if delay_ok else prev.lat_delay) if sm.seen["lateralDelay"] else CarInputs.lat_delay,
      is_rhd=sm["driverMonitoringState"].isRHD,
      camera_state_frame_id=sm["narrowRoadCameraState"].frameId,
      calibration=list(calib.rpyCalib) if sm.seen["extrinsicsCalibration"] else None,
      calibration_stale=self.calibration_age.stale(now),
      calibration_invalid=invalid,
      malformed="; ".join(problems),
      malformed_count=self.malformed_count,
    )
    return self.car


def car_inputs(sm, now: float = 0.0) -> CarInputs:
  """One-off read (tests and tools); the daemon keeps a CarInputReader so rejected messages fall back to the
  last good values and calibration age is tracked."""
  return CarInputReader().read(sm, now)
