"""Driver-monitoring policy: openpilot's DriverMonitoring (spec dm_pipeline.md §5), vision path, as a pure class.

Invariants:
- Pure: no sockets, no clocks, no params files. One `run_step(inputs)` = one DT_DMON (50 ms) step; the caller
  owns time. Same inputs in → same state out.
- `run_step(None)` means "monitoring unavailable" (driverStateV2 late, invalid or missing). It is never taken
  as attentive: the face counts as not detected, awareness falls at the active policy's rate (the policy does not
  switch to the laxer wheel-touch timings on missing data), so alerts rise one → two → three.
- Alert thresholds are fractions of the awareness budget: vision 5 / 8 / 13 s, wheel-touch 5 / 15 / 25 s.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

DT_DMON = 0.05


class Settings:
  """Constants of openpilot's DRIVER_MONITOR_SETTINGS (policy.py @28ed3f6d, see the spec)."""
  DT = DT_DMON
  VISION_TIMES = (5.0, 8.0, 13.0)          # alert one / two / three after this long distracted
  WHEELTOUCH_TIMES = (5.0, 15.0, 25.0)
  ALERT_MIN_SPEED = 2.8
  NO_RESPONSE_TIMEOUT = 5.0
  MAX_ALERT_3 = 2
  MAX_NO_RESPONSE = 1
  LOCKOUT_MINUTES = (1, 5, 15, 30)
  RECOVERY_FACTOR_MAX, RECOVERY_FACTOR_MIN = 5.0, 1.25
  FACE_THRESHOLD = 0.7
  EYE_THRESHOLD = 0.65
  SG_THRESHOLD = 0.9
  BLINK_THRESHOLD = 0.865
  PHONE_THRESHOLD = 0.5
  SLEEP_THRESHOLD = 0.75                   # unverified upstream value (spec §5.4 item 7)
  POSE_PITCH_THRESHOLD, POSE_PITCH_SLACK = 0.3133, 0.3237
  POSE_YAW_THRESHOLD, POSE_YAW_SLACK = 0.4020, 0.5042
  STEER_YAW_MIN_DEG, STEER_YAW_FACTOR, STEER_YAW_MAX = 30.0, 0.15, 0.3927
  PITCH_NATURAL_OFFSET, YAW_NATURAL_OFFSET = 0.011, 0.075
  PITCH_NATURAL_THRESHOLD = 0.449
  PITCH_PRIOR, YAW_PRIOR = (0.011, 0.03, 2), (0.075, 0.15, 2)
  PITCH_OFFSET_RANGE, YAW_OFFSET_RANGE = (-0.0881, 0.124), (-0.0246, 0.289)
  HI_STD_THRESHOLD = 0.3
  HI_STD_FALLBACK_STEPS = int(10 / DT_DMON)
  DCAM_UNCERTAIN_STD = 0.1
  DCAM_UNCERTAIN_ALERT_STEPS = int(60 / DT_DMON)
  DCAM_UNCERTAIN_RESET_STEPS = int(2 / DT_DMON)
  DISTRACTED_FILTER_RC = 0.25
  POSE_OFFSET_MIN_SPEED = 13.0
  POSE_OFFSET_MIN_COUNT = int(60 / DT_DMON)
  POSE_OFFSET_MAX_COUNT = int(360 / DT_DMON)
  WHEELPOS_MIN_SPEED = 11.0
  WHEELPOS_THRESHOLD = 0.5
  WHEELPOS_FILTER_MIN_COUNT = int(15 / DT_DMON)
  WHEELPOS_PRIOR = (0.03, 1.65e-4, 2)
  # driver camera reference for the geometry helper: undistorted tici cabin camera
  REF_W, REF_H, REF_FOCAL = 1928, 1208, 598.0


class RunningStat:
  """Welford mean/variance, optionally with a prior (M, S, n) and a bounded memory."""

  def __init__(self, prior=None, max_count=None):
    self.prior = prior
    self.max_count = max_count
    self.reset()

  def reset(self):
    self.M, self.S, self.n = self.prior if self.prior else (0.0, 0.0, 0)

  def push(self, x: float):
    # bounded memory as openpilot does it: once n reaches max_count it stops growing, so old samples fade
    if self.max_count is None or self.n < self.max_count:
      self.n += 1
    if self.n == 1:
      self.M, self.S = x, 0.0
      return
    m_prev = self.M
    self.M = m_prev + (x - m_prev) / self.n
    self.S = self.S + (x - m_prev) * (x - self.M)

  def mean(self) -> float:
    return self.M

  def variance(self) -> float:
    return self.S / (self.n - 1) if self.n > 1 else 0.0


class RunningStatFilter:
  """A raw running stat plus a filtered one that only takes samples that do not widen the raw spread."""

  def __init__(self, prior=None, max_count=None):
    self.raw = RunningStat(prior, max_count)
    self.filtered = RunningStat(prior, max_count)

  def push(self, x: float):
    var_before = self.raw.variance()
    self.raw.push(x)
    if self.raw.variance() <= var_before:
      self.filtered.push(x)


class FirstOrderFilter:
  def __init__(self, x0: float, rc: float, dt: float):
    self.x = x0
    self.k = dt / (rc + dt)

  def update(self, x: float) -> float:
    self.x = (1 - self.k) * self.x + self.k * x
    return self.x


def face_orientation_from_model(orient, pos, rpy_calib) -> tuple[float, float]:
  """Head pitch/yaw in the car frame (spec §5.3): model orientation + where the face sits in the image."""
  W, H, f = Settings.REF_W, Settings.REF_H, Settings.REF_FOCAL
  px = (pos[0] + 0.5) * W
  py = (pos[1] + 0.5) * H
  pitch = orient[0] + math.atan2(py - H // 2, f) - rpy_calib[1]
  yaw = -orient[1] + math.atan2(px - W // 2, f) - rpy_calib[2]
  return pitch, yaw


@dataclass
class DriverData:
  """The fields of one side of driverStateV2 the policy reads (plain floats, decoupled from capnp)."""
  faceOrientation: list
  faceOrientationStd: list
  facePosition: list
  facePositionStd: list
  faceProb: float
  leftEyeProb: float
  rightEyeProb: float
  leftBlinkProb: float
  rightBlinkProb: float
  sunglassesProb: float
  phoneProb: float
  sleepProb: float

  @classmethod
  def from_reader(cls, r) -> "DriverData":
    """From a capnp DriverStateV2.DriverData reader (or anything with the same attributes)."""
    lists = {n: [float(v) for v in getattr(r, n)] for n in _LIST_FIELDS}
    scalars = {n: float(getattr(r, n)) for n in _SCALAR_FIELDS}
    return cls(**lists, **scalars)


_LIST_FIELDS = ("faceOrientation", "faceOrientationStd", "facePosition", "facePositionStd")
_SCALAR_FIELDS = ("faceProb", "leftEyeProb", "rightEyeProb", "leftBlinkProb", "rightBlinkProb", "sunglassesProb",
                  "phoneProb", "sleepProb")


@dataclass
class DMInputs:
  """Everything one policy step reads. `left`/`right` are the two DriverData sides of driverStateV2."""
  left: DriverData
  right: DriverData
  wheel_on_right_prob: float
  cal_rpy: tuple = (0.0, 0.0, 0.0)
  car_speed: float = 0.0
  enabled: bool = False
  driver_interacting: bool = False
  wrong_gear: bool = False
  steering_angle_deg: float = 0.0
  brake_disengage_prob: float = 0.0


@dataclass
class Pose:
  pitch: float = 0.0
  yaw: float = 0.0
  calibrated: bool = False
  low_std: bool = True
  cfactor_pitch: float = 1.0
  cfactor_yaw: float = 1.0
  pitch_offseter: RunningStatFilter = field(
    default_factory=lambda: RunningStatFilter(Settings.PITCH_PRIOR, Settings.POSE_OFFSET_MAX_COUNT))
  yaw_offseter: RunningStatFilter = field(
    default_factory=lambda: RunningStatFilter(Settings.YAW_PRIOR, Settings.POSE_OFFSET_MAX_COUNT))


class DriverMonitoring:
  def __init__(self, rhd_saved: bool = False, always_on: bool = False, lockout_count: int = 0, settings=Settings):
    self.s = settings
    self.wheelpos = RunningStatFilter(self.s.WHEELPOS_PRIOR)
    self.wheel_on_right = rhd_saved
    self.wheel_on_right_default = rhd_saved
    self.always_on = always_on
    self.pose = Pose()
    self.blink_left = self.blink_right = 0.0
    self.phone_prob = self.sleep_prob = 0.0
    self.distracted_types = {"pose": False, "eye": False, "phone": False, "sleep": False}
    self.driver_distracted = False
    self.distraction_filter = FirstOrderFilter(0.0, self.s.DISTRACTED_FILTER_RC, self.s.DT)
    self.face_detected = False
    self.available = True
    self.driver_interacting = False
    self.hi_stds = 0
    self.dcam_uncertain_cnt = 0
    self.dcam_reset_cnt = 0
    self.model_std_max = 0.0
    self.is_model_uncertain = False
    self.awareness = self.awareness_vision = self.awareness_wheeltouch = 1.0
    self.vision_mode = False
    self.threshold_one = self.threshold_two = 1.0
    self.step_change = 0.0
    self.alert_level = 0
    self.events: list[str] = []
    self.lockout = False
    self.lockout_count = lockout_count
    self.lockout_remaining = 0
    self.alert3_count = 0
    self.no_response_count = 0
    self.terminal_steps = 0
    self.always_on_valid = False
    self.op_engaged = False
    self._set_policy(vision=True)

  # ---- policy (vision / wheel-touch) and its awareness budget
  def _set_policy(self, vision: bool):
    if self.vision_mode and self.awareness <= self.threshold_two:
      # no exploiting a switch once an orange alert is up
      self.step_change = self.s.DT / self.s.VISION_TIMES[2] if vision else 0.0
      return
    if self.awareness <= 0.0:
      return
    times = self.s.VISION_TIMES if vision else self.s.WHEELTOUCH_TIMES
    if vision and not self.vision_mode:
      self.awareness_wheeltouch, self.awareness = self.awareness, self.awareness_vision
    elif not vision and self.vision_mode:
      self.awareness_vision, self.awareness = self.awareness, self.awareness_wheeltouch
    self.threshold_one = 1 - times[0] / times[2]
    self.threshold_two = 1 - times[1] / times[2]
    self.step_change = self.s.DT / times[2]
    self.vision_mode = vision

  def _set_pose_strictness(self, brake_disengage_prob: float, car_speed: float):
    k1 = max(-0.00156 * (car_speed - 16) ** 2 + 0.6, 0.2)
    bp = min(max(brake_disengage_prob / k1, 0.0), 0.5)
    s = self.s
    pitch = np.interp(bp, [0, 0.5], [s.POSE_PITCH_SLACK, s.POSE_PITCH_THRESHOLD])
    yaw = np.interp(bp, [0, 0.5], [s.POSE_YAW_SLACK, s.POSE_YAW_THRESHOLD])
    self.pose.cfactor_pitch = pitch / s.POSE_PITCH_THRESHOLD
    self.pose.cfactor_yaw = yaw / s.POSE_YAW_THRESHOLD

  def _pose_distracted(self, steer_offset: float) -> bool:
    s, p = self.s, self.pose
    if p.calibrated:
      pitch_err = p.pitch - min(max(p.pitch_offseter.filtered.mean(), s.PITCH_OFFSET_RANGE[0]), s.PITCH_OFFSET_RANGE[1])
      yaw_err = p.yaw - min(max(p.yaw_offseter.filtered.mean(), s.YAW_OFFSET_RANGE[0]), s.YAW_OFFSET_RANGE[1])
      pitch_thr = s.POSE_PITCH_THRESHOLD * p.cfactor_pitch
      yaw_thr = s.POSE_YAW_THRESHOLD * p.cfactor_yaw
    else:
      pitch_err = p.pitch - s.PITCH_NATURAL_OFFSET
      yaw_err = p.yaw - s.YAW_NATURAL_OFFSET
      pitch_thr, yaw_thr = s.PITCH_NATURAL_THRESHOLD, s.POSE_YAW_THRESHOLD
    pitch_err = 0.0 if pitch_err > 0 else abs(pitch_err)   # only looking down counts
    if yaw_err * steer_offset > 0:                          # looking into the turn is expected
      yaw_err = max(abs(yaw_err) - abs(steer_offset), 0.0)
    return pitch_err > pitch_thr or abs(yaw_err) > yaw_thr

  # ---- per-step state from the model output
  def _update_states(self, x: DMInputs, demo: bool):
    s = self.s
    if (x.car_speed > s.WHEELPOS_MIN_SPEED and
        (x.left.faceProb > s.FACE_THRESHOLD or x.right.faceProb > s.FACE_THRESHOLD)):
      self.wheelpos.push(x.wheel_on_right_prob)
    if self.wheelpos.filtered.n > s.WHEELPOS_FILTER_MIN_COUNT or demo:
      learned = self.wheelpos.filtered.mean() > s.WHEELPOS_THRESHOLD
      self.wheel_on_right = learned if (demo or not x.enabled) else self.wheel_on_right
    d = x.right if self.wheel_on_right else x.left
    if not (d.faceOrientation and d.facePosition and d.faceOrientationStd and d.facePositionStd):
      return
    self.face_detected = d.faceProb > s.FACE_THRESHOLD
    self.pose.pitch, self.pose.yaw = face_orientation_from_model(d.faceOrientation, d.facePosition, x.cal_rpy)
    steer = abs(x.steering_angle_deg)
    steer_offset = min(math.radians(max(steer - s.STEER_YAW_MIN_DEG, 0.0)) * s.STEER_YAW_FACTOR, s.STEER_YAW_MAX)
    steer_offset *= -math.copysign(1.0, x.steering_angle_deg) if steer > 0 else 0.0
    if self.wheel_on_right:
      self.pose.yaw, steer_offset = -self.pose.yaw, -steer_offset
    self.model_std_max = max(d.faceOrientationStd[0], d.faceOrientationStd[1])
    self.pose.low_std = self.model_std_max < s.HI_STD_THRESHOLD
    eyes_ok = d.sunglassesProb < s.SG_THRESHOLD
    self.blink_left = d.leftBlinkProb * (d.leftEyeProb > s.EYE_THRESHOLD) * eyes_ok
    self.blink_right = d.rightBlinkProb * (d.rightEyeProb > s.EYE_THRESHOLD) * eyes_ok
    self.phone_prob, self.sleep_prob = d.phoneProb, d.sleepProb
    self._set_pose_strictness(x.brake_disengage_prob, x.car_speed)
    self.distracted_types = {
      "pose": self._pose_distracted(steer_offset),
      "eye": (self.blink_left + self.blink_right) * 0.5 > s.BLINK_THRESHOLD,
      "phone": self.phone_prob > s.PHONE_THRESHOLD,
      "sleep": self.sleep_prob > s.SLEEP_THRESHOLD,
    }
    self.driver_distracted = any(self.distracted_types.values()) and self.face_detected and self.pose.low_std
    self.distraction_filter.update(float(self.driver_distracted))

    if self.face_detected and x.car_speed > s.POSE_OFFSET_MIN_SPEED and self.pose.low_std and \
       (not x.enabled or not self.driver_distracted):
      self.pose.pitch_offseter.push(self.pose.pitch)
      self.pose.yaw_offseter.push(self.pose.yaw)
    self.pose.calibrated = self.pose.pitch_offseter.filtered.n > s.POSE_OFFSET_MIN_COUNT and \
                           self.pose.yaw_offseter.filtered.n > s.POSE_OFFSET_MIN_COUNT

    if self.face_detected and not self.driver_distracted:
      if self.model_std_max > s.DCAM_UNCERTAIN_STD:
        self.dcam_uncertain_cnt += 1
        self.dcam_reset_cnt = 0
      else:
        self.dcam_reset_cnt += 1
        if self.dcam_reset_cnt > s.DCAM_UNCERTAIN_RESET_STEPS:
          self.dcam_uncertain_cnt = 0
    if self.face_detected and not self.pose.low_std and not self.driver_distracted:
      self.hi_stds += 1
    elif self.face_detected and self.pose.low_std:
      self.hi_stds = 0
    self.is_model_uncertain = self.hi_stds >= s.HI_STD_FALLBACK_STEPS
    self._set_policy(vision=self.face_detected and not self.is_model_uncertain)

  # ---- awareness, alerts and lockout
  def _update_events(self, interacting: bool, engaged: bool, lowspeed: bool, wrong_gear: bool):
    s = self.s
    self.events = []
    self.always_on_valid = self.always_on and not wrong_gear
    if self.lockout_remaining > 0:
      self.lockout_remaining -= 1
      self.lockout = self.lockout_remaining > 0
    if (interacting and self.awareness > 0 and not self.vision_mode) or \
       (not self.always_on_valid and not engaged) or \
       (self.always_on_valid and not engaged and self.awareness <= 0):
      self._reset_awareness()
      return

    awareness_prev = self.awareness
    attentive = self.distraction_filter.x < 0.37
    if self.available and attentive and self.face_detected and self.pose.low_std and self.awareness > 0:
      if interacting:
        self._reset_awareness()
        return
      recovery = (s.RECOVERY_FACTOR_MAX - s.RECOVERY_FACTOR_MIN) * (1 - self.awareness) + s.RECOVERY_FACTOR_MIN
      self.awareness = min(self.awareness + recovery * self.step_change, 1.0)
      if self.awareness == 1.0:
        self.awareness_wheeltouch = min(self.awareness_wheeltouch + self.step_change, 1.0)
      if self.awareness > self.threshold_two:
        self.alert_level = 0
        return

    reaching_two = self.awareness - self.step_change <= self.threshold_two
    reaching_three = self.awareness - self.step_change <= 0
    standstill_exemption = lowspeed and reaching_two
    always_on_red_exemption = self.always_on_valid and not engaged and reaching_three
    certainly = self.distraction_filter.x > 0.63 and self.driver_distracted and self.face_detected
    maybe = self.is_model_uncertain or not self.face_detected or not self.available
    if (certainly or maybe) and not (standstill_exemption or always_on_red_exemption):
      self.awareness = max(self.awareness - self.step_change, -0.1)

    kind = "driverDistracted" if self.vision_mode else "driverUnresponsive"
    if self.awareness <= 0.0:
      self.alert_level = 3
      self.terminal_steps += 1
      if awareness_prev > 0.0:
        self.alert3_count += 1
      if self.terminal_steps == int(s.NO_RESPONSE_TIMEOUT / s.DT):
        self.no_response_count += 1
      if not self.lockout and (self.alert3_count >= s.MAX_ALERT_3 or self.no_response_count >= s.MAX_NO_RESPONSE) \
         and engaged:
        minutes = s.LOCKOUT_MINUTES[min(self.lockout_count, len(s.LOCKOUT_MINUTES) - 1)]
        self.lockout_count += 1
        self.lockout_remaining = int(minutes * 60 / s.DT)
        self.lockout = True
        self.alert3_count = self.no_response_count = 0
    elif self.awareness <= self.threshold_two:
      self.alert_level = 2
    elif self.awareness <= self.threshold_one:
      self.alert_level = 1
    else:
      self.alert_level = 0
    if self.alert_level:
      self.events.append(f"{kind}{self.alert_level}")
    if not self.available:
      self.events.append("driverMonitoringUnavailable")
    if self.lockout:
      self.events.append("tooDistracted")

  def _reset_awareness(self):
    self.awareness = self.awareness_vision = self.awareness_wheeltouch = 1.0
    self.alert_level = 0
    self.terminal_steps = 0

  def run_step(self, x: DMInputs | None, demo: bool = False, enabled: bool | None = None,
               car_speed: float | None = None, wrong_gear: bool | None = None):
    """One 50 ms step. `x=None`: the model output is unavailable; pass the car state via the keywords."""
    if x is not None:
      if demo:
        x = DMInputs(x.left, x.right, x.wheel_on_right_prob, (0.0, 0.0, 0.0), 30.0, True, False, False, 0.0, 1.0)
      self.available = True
      self.driver_interacting = x.driver_interacting
      self.op_engaged = x.enabled
      self._update_states(x, demo)
      self._update_events(x.driver_interacting, x.enabled, x.car_speed < self.s.ALERT_MIN_SPEED, x.wrong_gear)
    else:
      self.available = False
      self.face_detected = self.driver_distracted = self.driver_interacting = False
      self.distraction_filter.update(0.0)
      self.op_engaged = bool(enabled)
      lowspeed = car_speed is not None and car_speed < self.s.ALERT_MIN_SPEED
      self._update_events(False, self.op_engaged, lowspeed, bool(wrong_gear))

  def state(self) -> dict:
    """Everything driverMonitoringState carries, as plain values (dmonitoringd writes it into the message)."""
    pct = lambda v: int(min(max(v * 100, 0), 100))
    p = self.pose
    return {
      "lockout": self.lockout,
      "lockoutCount": min(self.lockout_count, 127),
      "lockoutMinutesRemaining": max(1, round(self.lockout_remaining * self.s.DT / 60)) if self.lockout else 0,
      "alert3Count": self.alert3_count,
      "noResponseCount": self.no_response_count,
      "noResponseForceDecel": self.alert_level == 3 and
                              self.terminal_steps >= int(self.s.NO_RESPONSE_TIMEOUT / self.s.DT),
      "alwaysOn": self.always_on,
      "alwaysOnLockout": self.always_on and self.awareness <= self.threshold_two,
      "alertLevel": ("none", "one", "two", "three")[self.alert_level],
      "activePolicy": "vision" if self.vision_mode else "wheeltouch",
      "isRHD": bool(self.wheel_on_right),
      "rhdCalibration": {"calibratedPercent": pct(self.wheelpos.filtered.n / self.s.WHEELPOS_FILTER_MIN_COUNT),
                         "offset": float(self.wheelpos.filtered.mean())},
      "visionPolicyState": {
        "awarenessPercent": pct(self.awareness_vision if not self.vision_mode else self.awareness),
        "awarenessStep": self.step_change if self.vision_mode else 0.0,
        "isDistracted": bool(self.driver_distracted),
        "distractedTypes": {k: bool(v) for k, v in self.distracted_types.items()},
        "faceDetected": bool(self.face_detected),
        "pose": {"pitch": float(p.pitch), "yaw": float(p.yaw), "calibrated": bool(p.calibrated),
                 "uncertainty": float(self.model_std_max),
                 "pitchCalib": {"calibratedPercent": pct(p.pitch_offseter.filtered.n / self.s.POSE_OFFSET_MIN_COUNT),
                                "offset": float(p.pitch_offseter.filtered.mean())},
                 "yawCalib": {"calibratedPercent": pct(p.yaw_offseter.filtered.n / self.s.POSE_OFFSET_MIN_COUNT),
                              "offset": float(p.yaw_offseter.filtered.mean())}},
        "wheeltouchFallbackPercent": pct(self.hi_stds / self.s.HI_STD_FALLBACK_STEPS),
        "uncertainOffroadAlertPercent": pct(self.dcam_uncertain_cnt / self.s.DCAM_UNCERTAIN_ALERT_STEPS),
      },
      "wheeltouchPolicyState": {
        "awarenessPercent": pct(self.awareness if not self.vision_mode else self.awareness_wheeltouch),
        "awarenessStep": self.step_change if not self.vision_mode else 0.0,
        "driverInteracting": bool(self.driver_interacting),
      },
      "events": list(self.events),
    }
