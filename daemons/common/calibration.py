"""Calibration age, judged in camera time by both model daemons.

Invariants:
- The daemons' clock for calibration is the camera's: `camera_time(frame_id)` = frame id x 50 ms (20 Hz
  cameras), never the wall clock. A replay stepped faster or slower than real time, or with its wall clock
  frozen, therefore judges staleness exactly as the drive did, without SIMULATION mode.
- A calibration is stale when it is older than CALIB_STALE_S = 10 periods of the 4 Hz extrinsicsCalibration
  (the SubMaster's alive rule, in camera time).
- Camera time going backwards means the camera restarted (frame ids start over): the age counts again from the
  first frame of the new run, so a restart never makes a calibration look minutes old or from the future.
"""
from __future__ import annotations

CAMERA_DT = 0.05          # s between frames of a 20 Hz camera
CALIB_HZ = 4.0            # extrinsicsCalibration's rate (cereal/services.py)
CALIB_STALE_S = 10 / CALIB_HZ


def camera_time(frame_id: int) -> float:
  """Seconds of camera time at this frame id."""
  return frame_id * CAMERA_DT


class CalibrationAge:
  """When the last extrinsicsCalibration arrived, in camera time."""

  def __init__(self):
    self.received_at: float | None = None

  def received(self, now: float) -> None:
    self.received_at = now

  def age(self, now: float) -> float | None:
    """Camera seconds since the last calibration (None before the first one)."""
    if self.received_at is None:
      return None
    if now < self.received_at:
      self.received_at = now      # the camera restarted: age counts from here
    return now - self.received_at

  def stale(self, now: float) -> bool:
    age = self.age(now)
    return age is not None and age > CALIB_STALE_S
