"""Driver-monitoring policy as pure classes: a VisionPolicy and a WheeltouchPolicy over one shared awareness
countdown and recovery, held by DriverMonitoring.

Upstream revision followed: openpilot `selfdrive/monitoring/policy.py` in its VisionPolicy/WheeltouchPolicy
form (2026; the Euro NCAP driver-engagement protocol v11 intervals). Its intervals and terminal-alert lockout
first appear in commaai/openpilot@4f9044053c66 (`selfdrive/monitoring/policy.py`); the split into the two
policy classes, the 0.5 eye/blink thresholds and the recovery at standstill come from the newer revision.
Facts and constants only; the code is ours.

Invariants:
- Pure: no sockets, clocks or params files. One `run_step(inputs)` = one DT_DMON (50 ms) step; the caller owns
  time. Same inputs in, same state out.
- Awareness is a budget in [−0.1, 1]; alert n starts when it falls to 1 − interval_n / interval_3, so alert
  one/two/three come 3/5/11 s (vision) or 15/24/30 s (wheel-touch) after the driver stopped paying attention.
- Terminal (alert three, awareness ≤ 0) is sticky: nothing but a reset clears it, and the only reset while
  engaged is disengaging (or, on the wheel-touch policy, touching the wheel before it is terminal).
- At standstill the countdown stops just before alert one, and awareness may recover there; moving off
  distracted therefore starts again from alert one.
- Engagement locks out (`too_distracted`, sticky for this object's life) after MAX_TERMINAL_ALERTS terminal
  alerts or MAX_TERMINAL_STEPS steps spent in terminal alert.
- A step whose recovery resets awareness (wheel touched while attentive) or lifts it above the alert-two
  threshold shows no alert, even while awareness is still below the alert-one threshold (as upstream: the
  recovery branch reports "cleared").
- The active policy switches to wheel-touch only above the vision alert-two threshold, and back to vision only
  above the wheel-touch alert-two threshold: an orange alert is never escaped by switching.

Checked line by line against upstream's policy.py (and common/stat_live.py for the running stats); the
deliberate differences, all of them:
- `run_step(None)` is "monitoring unavailable" (the model output is late, invalid, missing or malformed): it is
  never attentive. The active policy keeps counting down at its own rate; unlike a no-face frame it does not
  switch to the laxer wheel-touch policy and the vision step is not frozen (deliberately stricter than
  upstream, whose model output is always "valid").
- Blink: our driverStateV2 carries per-eye heads (eye visible, blink) where upstream's newest model has combined
  eyesVisibleProb / eyesClosedProb: the blink probability is the mean over both eyes of blinkProb gated by
  eyeProb > EYE_THRESHOLD (upstream gates the combined closed probability by the combined visible one).
- Events: the policy names its events (driverDistracted1-3 / driverUnresponsive1-3 by the active policy,
  driverMonitoringUnavailable, tooDistracted) for dmonitoringd to publish; upstream's policy publishes none.
- The lockout starts False for each DriverMonitoring (pure: no params file); upstream starts from the persisted
  DriverTooDistracted param. dmonitoringd owns any persistence.
- Input checking: DriverData.from_reader refuses non-finite values, short lists, negative standard deviations and
  probabilities outside [0, 1] (MalformedInput); upstream reads whatever the model sent.
- State: alert3Count (terminal alerts, clamped to 127) is reported beside the lockout percents.
- Names only: HI_STD_* / hi_stds / is_model_uncertain are upstream's _POSE_UNCERTAINTY_THRESHOLD /
  wheeltouch_fallback_count / wheeltouch_fallback_active; the same rules.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

DT_DMON = 0.05


class Settings:
  """Constants of openpilot's DRIVER_MONITOR_SETTINGS (revision named in the module docstring)."""
  DT = DT_DMON
  VISION_INTERVALS = (3.0, 5.0, 11.0)        # s to alert one / two / three (Euro NCAP v11)
  WHEELTOUCH_INTERVALS = (15.0, 24.0, 30.0)  # s to alert one / two / three (UN R79)
  RECOVERY_FACTOR_MAX, RECOVERY_FACTOR_MIN = 5.0, 1.25
  MAX_TERMINAL_ALERTS = 3
  MAX_TERMINAL_STEPS = int(30 / DT_DMON)
  FACE_THRESHOLD = 0.7
  EYE_THRESHOLD = 0.5
  BLINK_THRESHOLD = 0.5
  PHONE_THRESHOLD = 0.5
  POSE_PITCH_THRESHOLD, POSE_PITCH_SLACK = 0.3133, 0.3237
  POSE_YAW_THRESHOLD, POSE_YAW_SLACK = 0.4020, 0.5042
  STEER_YAW_MIN_DEG, STEER_YAW_FACTOR, STEER_YAW_MAX = 30.0, 0.15, 0.3927
  PITCH_NATURAL_OFFSET, YAW_NATURAL_OFFSET = 0.011, 0.075
  PITCH_NATURAL_THRESHOLD = 0.449
  PITCH_PRIOR, YAW_PRIOR = (0.011, 3 * 0.01, 2), (0.075, 3 * 0.05, 2)
  PITCH_OFFSET_RANGE, YAW_OFFSET_RANGE = (-0.0881, 0.124), (-0.0246, 0.289)
  HI_STD_THRESHOLD = 0.3
  HI_STD_FALLBACK_STEPS = int(10 / DT_DMON)
  DCAM_UNCERTAIN_STD = 0.1
  DCAM_UNCERTAIN_ALERT_STEPS = int(60 / DT_DMON)
  DCAM_UNCERTAIN_RESET_STEPS = int(20 / DT_DMON)
  DISTRACTED_FILTER_RC = 0.25
  ATTENTIVE_FILTER, DISTRACTED_FILTER = 0.37, 0.63
  POSE_OFFSET_MIN_SPEED = 13.0
  POSE_OFFSET_MIN_COUNT = int(60 / DT_DMON)
  POSE_OFFSET_MAX_COUNT = int(360 / DT_DMON)
  WHEELPOS_MIN_SPEED = 11.0
  WHEELPOS_THRESHOLD = 0.5
  WHEELPOS_FILTER_MIN_COUNT = int(15 / DT_DMON)
  WHEELPOS_PRIOR = (0.03, 3 * 5.5e-5, 2)
  # the model's face position is relative to the undistorted tici cabin camera
  REF_W, REF_H, REF_FOCAL = 1928, 1208, 598.0


class RunningStat:
  """Welford mean/variance from an optional prior (M, S, n); with max_count >= 0, n stops growing there so
  newer samples keep their weight (openpilot's "short term memory")."""

  def __init__(self, prior=None, max_count: int = -1):
    self.prior, self.max_count = prior, max_count
    self.M, self.S, self.n = prior if prior else (0.0, 0.0, 0)

  def push(self, x: float) -> None:
    if self.max_count < 0 or self.n < self.max_count:
      self.n += 1
    m_prev = self.M
    self.M = m_prev + (x - m_prev) / self.n
    self.S = self.S + (x - m_prev) * (x - self.M)

  def mean(self) -> float:
    return self.M

  def std(self) -> float:
    return math.sqrt(self.S / (self.n - 1)) if self.n >= 2 else 0.0


class RunningStatFilter:
  """A raw stat (with the prior, unbounded) and a filtered one (no prior, bounded) that takes only the samples
  that do not widen the raw spread."""

  def __init__(self, prior=None, max_count: int = -1):
    self.raw = RunningStat(prior)
    self.filtered = RunningStat(None, max_count)

  def push(self, x: float) -> None:
    std_before = self.raw.std()
    self.raw.push(x)
    if self.raw.std() - std_before <= 0:
      self.filtered.push(x)


class FirstOrderFilter:
  def __init__(self, x0: float, rc: float, dt: float):
    self.x = x0
    self.k = dt / (rc + dt)

  def update(self, x: float) -> float:
    self.x = (1 - self.k) * self.x + self.k * x
    return self.x


def face_orientation_from_model(orient, pos, rpy_calib) -> tuple[float, float]:
  """Head pitch/yaw in the car frame: model orientation + the angle at which the face sits in the image."""
  W, H, f = Settings.REF_W, Settings.REF_H, Settings.REF_FOCAL
  px = (pos[0] + 0.5) * W
  py = (pos[1] + 0.5) * H
  pitch = orient[0] + math.atan2(py - H // 2, f) - rpy_calib[1]
  yaw = -orient[1] + math.atan2(px - W // 2, f) - rpy_calib[2]
  return pitch, yaw


class MalformedInput(ValueError):
  """A capnp-valid model or car message whose values the policy cannot use (short lists, NaN, out of range)."""


_LIST_FIELDS = ("faceOrientation", "faceOrientationStd", "facePosition", "facePositionStd")
_MIN_LEN = {"faceOrientation": 2, "faceOrientationStd": 2, "facePosition": 2, "facePositionStd": 2}
_PROB_FIELDS = ("faceProb", "leftEyeProb", "rightEyeProb", "leftBlinkProb", "rightBlinkProb", "sunglassesProb",
                "phoneProb", "sleepProb")


def _finite(name: str, v: float) -> float:
  if not math.isfinite(v):
    raise MalformedInput(f"{name} is {v}")
  return v


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
  def from_reader(cls, r, side: str = "driverData") -> "DriverData":
    """From a capnp DriverStateV2.DriverData reader; MalformedInput names the first unusable value.
    All four lists empty is legal (upstream: no face description this frame, the step changes nothing)."""
    lists = {n: [_finite(f"{side}.{n}[{i}]", float(v)) for i, v in enumerate(getattr(r, n))] for n in _LIST_FIELDS}
    if any(lists.values()):
      for n, v in lists.items():
        if len(v) < _MIN_LEN[n]:
          raise MalformedInput(f"{side}.{n} has {len(v)} values, needs at least {_MIN_LEN[n]}")
      for n in ("faceOrientationStd", "facePositionStd"):
        if min(lists[n]) < 0:
          raise MalformedInput(f"{side}.{n} has a negative standard deviation")
    probs = {}
    for n in _PROB_FIELDS:
      p = _finite(f"{side}.{n}", float(getattr(r, n)))
      if not 0.0 <= p <= 1.0:
        raise MalformedInput(f"{side}.{n} = {p} is not a probability")
      probs[n] = p
    return cls(**lists, **probs)

  @property
  def described(self) -> bool:
    return all(len(getattr(self, n)) > 0 for n in _LIST_FIELDS)


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
  standstill: bool = False


@dataclass
class Pose:
  pitch: float = 0.0
  yaw: float = 0.0
  calibrated: bool = False
  low_std: bool = True
  cfactor_pitch: float = 1.0
  cfactor_yaw: float = 1.0
  steer_yaw_offset: float = 0.0
  pitch_offseter: RunningStatFilter = field(
    default_factory=lambda: RunningStatFilter(Settings.PITCH_PRIOR, Settings.POSE_OFFSET_MAX_COUNT))
  yaw_offseter: RunningStatFilter = field(
    default_factory=lambda: RunningStatFilter(Settings.YAW_PRIOR, Settings.POSE_OFFSET_MAX_COUNT))


class AwarenessPolicy:
  """The countdown and recovery both policies share; the intervals set the thresholds and the step."""

  def __init__(self, s, intervals: tuple[float, float, float]):
    self.s = s
    self.alert_1_threshold = 1.0 - intervals[0] / intervals[2]
    self.alert_2_threshold = 1.0 - intervals[1] / intervals[2]
    self.awareness_step = s.DT / intervals[2]
    self.awareness = 1.0

  def reset_awareness(self) -> None:
    self.awareness = 1.0

  def reaching_alert_1(self, step: float) -> bool:
    return self.awareness - step <= self.alert_1_threshold

  def reaching_alert_3(self, step: float) -> bool:
    return self.awareness - step <= 0.0

  def recovery_available(self, can_recover: bool, standstill: bool, step: float) -> bool:
    return can_recover or (standstill and self.reaching_alert_1(step))

  def update_awareness(self, step: float, can_recover: bool, count_down: bool, standstill: bool,
                       exempt: bool, driver_interacting: bool = False) -> bool:
    """One step of the countdown or recovery. True: the alert is cleared this step (recovery reset awareness
    or lifted it above the alert-two threshold), so the caller shows no alert although awareness may still sit
    below the alert-one threshold."""
    if self.awareness <= 0.0:
      return False   # terminal: only a reset clears it
    standstill_exemption = standstill and self.reaching_alert_1(step)
    if self.recovery_available(can_recover, standstill, step):
      if driver_interacting:
        self.reset_awareness()
        return True
      gain = (self.s.RECOVERY_FACTOR_MAX - self.s.RECOVERY_FACTOR_MIN) * (1.0 - self.awareness) + self.s.RECOVERY_FACTOR_MIN
      self.awareness = min(self.awareness + gain * step, 1.0)
      if self.awareness > self.alert_2_threshold:
        return True
    if count_down and not (standstill_exemption or exempt):
      self.awareness = max(self.awareness - step, -0.1)
    return False

  def alert_level(self) -> int:
    if self.awareness <= 0.0:
      return 3
    if self.awareness <= self.alert_2_threshold:
      return 2
    return 1 if self.awareness <= self.alert_1_threshold else 0


class VisionPolicy(AwarenessPolicy):
  """Face pose, eyes and phone from the cabin model; also learns the wheel side and the pose offsets."""

  def __init__(self, s, rhd_saved: bool = False):
    super().__init__(s, s.VISION_INTERVALS)
    self.wheelpos = RunningStatFilter(s.WHEELPOS_PRIOR)
    self.wheel_on_right = self.wheel_on_right_default = rhd_saved
    self.wheel_on_right_last: bool | None = None
    self.pose = Pose()
    self.blink_prob = self.phone_prob = 0.0
    self.distracted_types = {"pose": False, "eye": False, "phone": False}
    self.driver_distracted = False
    self.distraction_filter = FirstOrderFilter(0.0, s.DISTRACTED_FILTER_RC, s.DT)
    self.face_detected = False
    self.is_model_uncertain = False
    self.hi_stds = 0
    self.model_std_max = 0.0
    self.dcam_uncertain_cnt = self.dcam_reset_cnt = 0
    self.is_available = True

  @property
  def attentive(self) -> bool:
    return self.distraction_filter.x < self.s.ATTENTIVE_FILTER and self.face_detected and self.pose.low_std

  @property
  def certainly_distracted(self) -> bool:
    return self.distraction_filter.x > self.s.DISTRACTED_FILTER and self.driver_distracted and self.face_detected

  @property
  def maybe_distracted(self) -> bool:
    return self.is_model_uncertain or not self.face_detected

  def set_pose_strictness(self, brake_disengage_prob: float, car_speed: float) -> None:
    s = self.s
    k1 = max(-0.00156 * (car_speed - 16) ** 2 + 0.6, 0.2)
    bp = min(max(brake_disengage_prob / k1, 0.0), 0.5)
    self.pose.cfactor_pitch = float(np.interp(bp, [0, 0.5], [s.POSE_PITCH_SLACK, s.POSE_PITCH_THRESHOLD])) / s.POSE_PITCH_THRESHOLD
    self.pose.cfactor_yaw = float(np.interp(bp, [0, 0.5], [s.POSE_YAW_SLACK, s.POSE_YAW_THRESHOLD])) / s.POSE_YAW_THRESHOLD

  def _pose_distracted(self) -> bool:
    s, p = self.s, self.pose
    if p.calibrated:
      pitch_err = p.pitch - min(max(p.pitch_offseter.filtered.mean(), s.PITCH_OFFSET_RANGE[0]), s.PITCH_OFFSET_RANGE[1])
      yaw_err = p.yaw - min(max(p.yaw_offseter.filtered.mean(), s.YAW_OFFSET_RANGE[0]), s.YAW_OFFSET_RANGE[1])
    else:
      pitch_err, yaw_err = p.pitch - s.PITCH_NATURAL_OFFSET, p.yaw - s.YAW_NATURAL_OFFSET
    pitch_err = 0.0 if pitch_err > 0 else abs(pitch_err)   # only looking down counts
    if yaw_err * p.steer_yaw_offset > 0:                    # looking into the turn is expected
      yaw_err = max(abs(yaw_err) - min(abs(p.steer_yaw_offset), s.STEER_YAW_MAX), 0.0)
    else:
      yaw_err = abs(yaw_err)
    pitch_thr = s.POSE_PITCH_THRESHOLD * p.cfactor_pitch if p.calibrated else s.PITCH_NATURAL_THRESHOLD
    return pitch_err > pitch_thr or yaw_err > s.POSE_YAW_THRESHOLD * p.cfactor_yaw

  def update(self, x: DMInputs, demo: bool) -> None:
    s = self.s
    if x.car_speed > s.WHEELPOS_MIN_SPEED and (x.left.faceProb > s.FACE_THRESHOLD or x.right.faceProb > s.FACE_THRESHOLD):
      self.wheelpos.push(x.wheel_on_right_prob)
    if self.wheelpos.filtered.n >= s.WHEELPOS_FILTER_MIN_COUNT or demo:
      self.wheel_on_right = self.wheelpos.filtered.M > s.WHEELPOS_THRESHOLD
    else:
      self.wheel_on_right = self.wheel_on_right_default
    if x.enabled and not demo and self.wheel_on_right_last is not None:
      self.wheel_on_right = self.wheel_on_right_last   # the watched side never flips while engaged
    d = x.right if self.wheel_on_right else x.left
    if not d.described:
      return
    self.face_detected = d.faceProb > s.FACE_THRESHOLD
    self.pose.pitch, self.pose.yaw = face_orientation_from_model(d.faceOrientation, d.facePosition, x.cal_rpy)
    steer_d = max(abs(x.steering_angle_deg) - s.STEER_YAW_MIN_DEG, 0.0)
    self.pose.steer_yaw_offset = math.radians(steer_d) * -float(np.sign(x.steering_angle_deg)) * s.STEER_YAW_FACTOR
    if self.wheel_on_right:
      self.pose.yaw, self.pose.steer_yaw_offset = -self.pose.yaw, -self.pose.steer_yaw_offset
    self.wheel_on_right_last = self.wheel_on_right
    self.model_std_max = max(d.faceOrientationStd[0], d.faceOrientationStd[1])
    self.pose.low_std = self.model_std_max < s.HI_STD_THRESHOLD
    self.blink_prob = 0.5 * (d.leftBlinkProb * (d.leftEyeProb > s.EYE_THRESHOLD) +
                             d.rightBlinkProb * (d.rightEyeProb > s.EYE_THRESHOLD))
    self.phone_prob = d.phoneProb
    self.distracted_types = {"pose": self._pose_distracted(), "eye": self.blink_prob > s.BLINK_THRESHOLD,
                             "phone": self.phone_prob > s.PHONE_THRESHOLD}
    self.driver_distracted = any(self.distracted_types.values()) and self.face_detected and self.pose.low_std
    self.distraction_filter.update(float(self.driver_distracted))

    if self.face_detected and x.car_speed > s.POSE_OFFSET_MIN_SPEED and self.pose.low_std and \
       (not x.enabled or not self.driver_distracted):
      self.pose.pitch_offseter.push(self.pose.pitch)
      self.pose.yaw_offseter.push(self.pose.yaw)
    self.pose.calibrated = self.pose.pitch_offseter.filtered.n >= s.POSE_OFFSET_MIN_COUNT and \
                           self.pose.yaw_offseter.filtered.n >= s.POSE_OFFSET_MIN_COUNT

    if self.face_detected and not self.driver_distracted:
      if self.model_std_max > s.DCAM_UNCERTAIN_STD and not x.standstill:
        self.dcam_uncertain_cnt += 1
        self.dcam_reset_cnt = 0
      else:
        self.dcam_reset_cnt += 1
        if self.dcam_reset_cnt > s.DCAM_UNCERTAIN_RESET_STEPS:
          self.dcam_uncertain_cnt = 0
    self.is_model_uncertain = self.hi_stds >= s.HI_STD_FALLBACK_STEPS
    self.is_available = self.face_detected and not self.is_model_uncertain
    if self.face_detected and not self.pose.low_std and not self.driver_distracted:
      self.hi_stds += 1
    elif self.face_detected and self.pose.low_std:
      self.hi_stds = 0

  def mark_unavailable(self) -> None:
    """No usable model output this step: nothing seen, so nothing is attentive."""
    self.face_detected = self.driver_distracted = False
    self.distraction_filter.update(0.0)

  def step_size(self, monitoring_available: bool) -> float:
    # a no-face or uncertain frame freezes the vision count (the wheel-touch policy takes over above alert two);
    # missing data does not
    return self.awareness_step if (self.is_available or not monitoring_available) else 0.0


class WheeltouchPolicy(AwarenessPolicy):
  """Steering-wheel touches: the fallback while the camera cannot see (or trust) the driver."""

  def __init__(self, s):
    super().__init__(s, s.WHEELTOUCH_INTERVALS)
    self.driver_interacting = False

  def update(self, active: bool, vision: VisionPolicy, driver_interacting: bool, standstill: bool, exempt: bool,
             monitoring_available: bool) -> bool:
    """True: this (active) policy's alert is cleared this step; standing by it never clears one."""
    self.driver_interacting = driver_interacting
    if active:
      return self.update_awareness(self.awareness_step, vision.attentive, vision.certainly_distracted or vision.maybe_distracted,
                                   standstill, exempt, driver_interacting)
    # standing by: an attentive, fully aware driver earns back wheel-touch awareness at the vision rate
    step = vision.step_size(monitoring_available)
    if vision.awareness == 1.0 and vision.recovery_available(vision.attentive, standstill, step):
      self.awareness = min(self.awareness + step, 1.0)
    return False


class DriverMonitoring:
  def __init__(self, rhd_saved: bool = False, always_on: bool = False, settings=Settings):
    self.s = settings
    self.vision = VisionPolicy(settings, rhd_saved)
    self.wheeltouch = WheeltouchPolicy(settings)
    self.always_on = always_on
    self.vision_active = True
    self.monitoring_available = True
    self.alert_level = 0
    self.terminal_alert_cnt = 0
    self.terminal_steps = 0
    self.too_distracted = False
    self.events: list[str] = []

  @property
  def active(self) -> AwarenessPolicy:
    return self.vision if self.vision_active else self.wheeltouch

  @property
  def awareness(self) -> float:
    return self.active.awareness

  def _active_step(self) -> float:
    return self.vision.step_size(self.monitoring_available) if self.vision_active else self.wheeltouch.awareness_step

  def _update_active_policy(self) -> None:
    if self.vision_active:
      if not self.vision.is_available and self.vision.awareness > self.vision.alert_2_threshold:
        self.vision_active = False   # no switch once alert two is up: no escaping an orange alert
    elif self.vision.is_available and self.wheeltouch.awareness > self.wheeltouch.alert_2_threshold:
      self.vision_active = True   # nor back to vision from an orange wheel-touch alert

  def _reset_awareness(self) -> None:
    self.vision.reset_awareness()
    self.wheeltouch.reset_awareness()

  def _update_events(self, interacting: bool, engaged: bool, standstill: bool, wrong_gear: bool) -> None:
    s = self.s
    self.alert_level = 0
    self.events = []
    self.wheeltouch.driver_interacting = interacting   # reported on every step, the reset path included
    if self.terminal_alert_cnt >= s.MAX_TERMINAL_ALERTS or self.terminal_steps >= s.MAX_TERMINAL_STEPS:
      self.too_distracted = True
    always_on_valid = self.always_on and not wrong_gear
    if (interacting and self.awareness > 0 and not self.vision_active) or (not always_on_valid and not engaged) or \
       (always_on_valid and not engaged and self.awareness <= 0):
      self._reset_awareness()
    else:
      prev = self.active.awareness
      exempt = always_on_valid and not engaged and self.active.reaching_alert_3(self._active_step())
      v = self.vision
      cleared = False
      if self.vision_active:
        cleared = v.update_awareness(v.step_size(self.monitoring_available), v.attentive,
                                     v.certainly_distracted or v.maybe_distracted, standstill, exempt, interacting)
      cleared |= self.wheeltouch.update(not self.vision_active, v, interacting, standstill, exempt, self.monitoring_available)
      if not cleared:
        self.alert_level = self.active.alert_level()
        if self.alert_level == 3:
          self.terminal_steps += 1
          if prev > 0.0:
            self.terminal_alert_cnt += 1
    if self.alert_level:
      self.events.append(f"{'driverDistracted' if self.vision_active else 'driverUnresponsive'}{self.alert_level}")
    if not self.monitoring_available:
      self.events.append("driverMonitoringUnavailable")
    if self.too_distracted:
      self.events.append("tooDistracted")

  def run_step(self, x: DMInputs | None, demo: bool = False, enabled: bool = False, standstill: bool = False,
               wrong_gear: bool = False, driver_interacting: bool = False) -> None:
    """One 50 ms step. `x=None`: no usable model output; the car context then comes from the keywords."""
    if x is not None:
      if demo:
        x = DMInputs(x.left, x.right, x.wheel_on_right_prob, (0.0, 0.0, 0.0), 30.0, True, False, False, 0.0, 1.0, False)
      self.monitoring_available = True
      self.vision.set_pose_strictness(x.brake_disengage_prob, x.car_speed)
      self.vision.update(x, demo)
      self._update_active_policy()
      self._update_events(x.driver_interacting, x.enabled, x.standstill, x.wrong_gear)
    else:
      self.monitoring_available = False
      self.vision.mark_unavailable()
      self._update_events(driver_interacting, enabled, standstill, wrong_gear)

  def state(self) -> dict:
    """Everything driverMonitoringState carries, as plain values (dmonitoringd writes it into the message)."""
    pct = lambda v: int(min(max(v * 100, 0), 100))
    v, w, p = self.vision, self.wheeltouch, self.vision.pose
    return {
      "lockout": self.too_distracted,
      "alert3Count": min(self.terminal_alert_cnt, 127),
      "alertCountLockoutPercent": pct(self.terminal_alert_cnt / self.s.MAX_TERMINAL_ALERTS),
      "alertTimeLockoutPercent": pct(self.terminal_steps / self.s.MAX_TERMINAL_STEPS),
      "alwaysOn": self.always_on,
      "alwaysOnLockout": self.always_on and self.active.awareness <= self.active.alert_2_threshold,
      "alertLevel": ("none", "one", "two", "three")[self.alert_level],
      "activePolicy": "vision" if self.vision_active else "wheeltouch",
      "isRHD": bool(v.wheel_on_right),
      "rhdCalibration": {"calibratedPercent": pct(v.wheelpos.filtered.n / self.s.WHEELPOS_FILTER_MIN_COUNT),
                         "offset": float(v.wheelpos.filtered.M)},
      "visionPolicyState": {
        "awarenessPercent": pct(v.awareness),
        "awarenessStep": self._active_step() if self.vision_active else 0.0,
        "isDistracted": bool(v.driver_distracted),
        "distractedTypes": {k: bool(b) for k, b in v.distracted_types.items()},
        "faceDetected": bool(v.face_detected),
        "pose": {"pitch": float(p.pitch), "yaw": float(p.yaw), "calibrated": bool(p.calibrated),
                 "uncertainty": float(v.model_std_max),
                 "pitchCalib": {"calibratedPercent": pct(p.pitch_offseter.filtered.n / self.s.POSE_OFFSET_MIN_COUNT),
                                "offset": float(p.pitch_offseter.filtered.M)},
                 "yawCalib": {"calibratedPercent": pct(p.yaw_offseter.filtered.n / self.s.POSE_OFFSET_MIN_COUNT),
                              "offset": float(p.yaw_offseter.filtered.M)}},
        "wheeltouchFallbackPercent": pct(v.hi_stds / self.s.HI_STD_FALLBACK_STEPS),
        "uncertainOffroadAlertPercent": pct(v.dcam_uncertain_cnt / self.s.DCAM_UNCERTAIN_ALERT_STEPS),
      },
      "wheeltouchPolicyState": {
        "awarenessPercent": pct(w.awareness),
        "awarenessStep": 0.0 if self.vision_active else w.awareness_step,
        "driverInteracting": bool(w.driver_interacting),
      },
      "events": list(self.events),
    }
