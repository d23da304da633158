"""DriverMonitoring on openpilot's current policy, one scenario per rule, with synthetic inputs: attentive,
distracted (3/5/11 s), invisible (wheel-touch 15/24/30 s), traffic light (standstill stops before alert one),
uncertain model -> wheel-touch fallback, terminal alert cleared only by disengaging, dashcam, lockout."""
import math

import pytest

from selfdrive_stub.consumers.dm_policy import (DT_DMON, DMInputs, DriverData, DriverMonitoring, MalformedInput, Settings,
                                      face_orientation_from_model)


def driver(yaw=0.0, pitch=0.0, face=0.95, blink=0.05, eye=0.95, sunglasses=0.02, phone=0.05, sleep=0.05, std=0.05):
  # orientation in model convention: the policy uses -orient[1] as yaw; a centred face position
  return DriverData([pitch, -yaw, 0.0], [std, std, std], [0.0, 0.1], [0.01, 0.01], face, eye, eye, blink, blink,
                    sunglasses, phone, sleep)


AWAY = dict(yaw=0.8)


def inputs(d=None, speed=20.0, enabled=True, **kw):
  d = d or driver()
  return DMInputs(left=d, right=d, wheel_on_right_prob=0.02, car_speed=speed, enabled=enabled, **kw)


def steps(seconds):
  return int(round(seconds / DT_DMON))


def first_step_at_level(dm, x, max_seconds=20.0):
  """Run the same input; return {level: seconds when it first appeared}."""
  seen = {}
  for i in range(steps(max_seconds)):
    dm.run_step(x)
    seen.setdefault(dm.alert_level, (i + 1) * DT_DMON)
  return seen


def run(dm, x, seconds):
  for _ in range(steps(seconds)):
    dm.run_step(x)
  return dm.state()


def test_constants_follow_the_current_upstream_policy():
  s = Settings
  assert s.VISION_INTERVALS == (3.0, 5.0, 11.0) and s.WHEELTOUCH_INTERVALS == (15.0, 24.0, 30.0)
  assert s.EYE_THRESHOLD == s.BLINK_THRESHOLD == 0.5
  assert s.MAX_TERMINAL_ALERTS == 3 and s.MAX_TERMINAL_STEPS * DT_DMON == 30.0
  dm = DriverMonitoring()
  assert dm.vision.alert_1_threshold == pytest.approx(1 - 3 / 11) and dm.vision.alert_2_threshold == pytest.approx(1 - 5 / 11)
  assert dm.vision.awareness_step == pytest.approx(DT_DMON / 11)
  assert dm.wheeltouch.alert_1_threshold == pytest.approx(0.5) and dm.wheeltouch.alert_2_threshold == pytest.approx(0.2)


def test_attentive_driver_never_alerted():
  st = run(DriverMonitoring(), inputs(), 40)
  assert st["alertLevel"] == "none" and st["visionPolicyState"]["awarenessPercent"] == 100
  assert st["activePolicy"] == "vision" and st["visionPolicyState"]["faceDetected"]
  assert not st["visionPolicyState"]["isDistracted"] and st["events"] == []


def test_distracted_driver_alerts_at_3_5_and_11_seconds():
  dm = DriverMonitoring()
  seen = first_step_at_level(dm, inputs(driver(**AWAY)))
  # the distraction low-pass (rc 0.25 s) delays the count by a few steps
  assert 3.0 <= seen[1] <= 3.5 and 5.0 <= seen[2] <= 5.5 and 11.0 <= seen[3] <= 11.5, seen
  st = dm.state()
  assert st["visionPolicyState"]["distractedTypes"]["pose"] and "driverDistracted3" in st["events"]
  assert st["alert3Count"] == 1 and st["alertCountLockoutPercent"] == 33


@pytest.mark.parametrize("kw,kind", [({"blink": 0.6}, "eye"), ({"phone": 0.9}, "phone"), ({"pitch": -0.9}, "pose")])
def test_each_distraction_type_counts(kw, kind):
  st = run(DriverMonitoring(), inputs(driver(**kw)), 4)
  assert st["visionPolicyState"]["distractedTypes"][kind] and st["alertLevel"] == "one"


def test_closed_eyes_count_only_when_the_eyes_are_visible():
  assert run(DriverMonitoring(), inputs(driver(blink=0.6, eye=0.55)), 4)["alertLevel"] == "one"   # 0.5 thresholds
  st = run(DriverMonitoring(), inputs(driver(blink=0.6, eye=0.45)), 4)
  assert not st["visionPolicyState"]["distractedTypes"]["eye"] and st["alertLevel"] == "none"
  assert run(DriverMonitoring(), inputs(driver(blink=0.45)), 4)["alertLevel"] == "none"


def test_looking_up_is_not_distracted():
  st = run(DriverMonitoring(), inputs(driver(pitch=0.9)), 6)
  assert st["alertLevel"] == "none" and not st["visionPolicyState"]["distractedTypes"]["pose"]


def test_invisible_driver_falls_back_to_wheeltouch_at_15_24_30_seconds():
  dm = DriverMonitoring()
  seen = first_step_at_level(dm, inputs(driver(face=0.1)), max_seconds=31)
  assert dm.state()["activePolicy"] == "wheeltouch"
  assert abs(seen[1] - 15.0) <= 0.1 and abs(seen[2] - 24.0) <= 0.1 and abs(seen[3] - 30.0) <= 0.1, seen
  assert "driverUnresponsive3" in dm.state()["events"]


def test_wheel_touch_resets_the_wheeltouch_policy_before_terminal():
  dm = DriverMonitoring()
  run(dm, inputs(driver(face=0.1)), 20)
  assert dm.alert_level == 1
  dm.run_step(inputs(driver(face=0.1), driver_interacting=True))
  assert dm.alert_level == 0 and dm.wheeltouch.awareness == 1.0


def test_uncertain_model_falls_back_to_wheeltouch_after_10_seconds():
  dm = DriverMonitoring()
  x = inputs(driver(std=0.5))            # a face, but the model is unsure of its pose
  st = run(dm, x, 9.9)
  assert st["activePolicy"] == "vision" and st["alertLevel"] == "none" and st["visionPolicyState"]["wheeltouchFallbackPercent"] < 100
  st = run(dm, x, 0.3)
  assert st["activePolicy"] == "wheeltouch" and st["visionPolicyState"]["wheeltouchFallbackPercent"] == 100
  st = run(dm, x, 15.5)                  # now counted on the wheel-touch intervals
  assert st["alertLevel"] == "one" and "driverUnresponsive1" in st["events"]
  st = run(dm, inputs(), 0.1)            # a confident model again: back to vision
  assert st["activePolicy"] == "vision"


def test_traffic_light_stops_the_count_just_before_alert_one_and_restarts_from_one():
  dm = DriverMonitoring()
  stopped = inputs(driver(**AWAY), speed=0.0, standstill=True)
  levels = {run(dm, stopped, 1.0)["alertLevel"] for _ in range(30)}
  assert levels == {"none"}                                     # 30 s distracted at a red light: no alert
  assert dm.vision.awareness > dm.vision.alert_1_threshold
  assert dm.vision.awareness - dm.vision.awareness_step <= dm.vision.alert_1_threshold + 0.02   # parked near alert one
  # moving off, still distracted: alert one at once, alert two only 2 s later (5 - 3), never a jump
  seen = first_step_at_level(dm, inputs(driver(**AWAY)), max_seconds=10)
  assert seen[1] <= 0.2 and 1.8 <= seen[2] - seen[1] <= 2.2, seen


def test_awareness_recovers_at_standstill_near_alert_one():
  dm = DriverMonitoring()
  run(dm, inputs(driver(**AWAY)), 3.5)
  assert dm.alert_level == 1
  run(dm, inputs(driver(**AWAY), speed=0.0, standstill=True), 0.5)
  assert dm.alert_level == 0                                    # recovered while stopped, though still looking away


def test_attention_recovers_awareness():
  dm = DriverMonitoring()
  run(dm, inputs(driver(**AWAY)), 4)
  assert dm.alert_level == 1
  run(dm, inputs(), 2)
  assert dm.alert_level == 0 and dm.awareness > 0.9


def test_an_alert_clears_as_soon_as_recovery_lifts_awareness_above_the_alert_two_threshold():
  dm = DriverMonitoring()
  seen = first_step_at_level(dm, inputs(driver(**AWAY)), max_seconds=5.6)
  assert dm.alert_level == 2, seen
  cleared_after = None
  for i in range(steps(2.0)):
    dm.run_step(inputs())
    if dm.alert_level == 0:
      cleared_after = (i + 1) * DT_DMON
      break
  # cleared while awareness is still below the alert-one threshold (upstream: "cleared" from the recovery branch)
  assert cleared_after is not None and cleared_after <= 0.6, cleared_after
  assert dm.vision.alert_2_threshold < dm.awareness <= dm.vision.alert_1_threshold
  assert dm.state()["alertLevel"] == "none" and dm.state()["events"] == []


def test_touching_the_wheel_while_recovering_resets_vision_awareness_to_one():
  dm = DriverMonitoring()
  run(dm, inputs(driver(**AWAY)), 4)
  assert dm.alert_level == 1 and dm.vision_active
  for _ in range(steps(1.0)):
    dm.run_step(inputs(driver_interacting=True))
    if dm.vision.attentive:
      break
  assert dm.vision.attentive and dm.vision.awareness == 1.0 and dm.alert_level == 0


def test_back_to_vision_only_once_the_wheeltouch_awareness_is_above_its_alert_two_threshold():
  dm = DriverMonitoring()
  run(dm, inputs(driver(face=0.1)), 25)
  assert dm.alert_level == 2 and not dm.vision_active
  dm.run_step(inputs())          # the face is back, but wheel-touch is orange: it recovers first, no switch yet
  assert not dm.vision_active and dm.alert_level == 2
  for _ in range(steps(2.0)):
    before = dm.wheeltouch.awareness
    dm.run_step(inputs())
    if dm.vision_active:
      break
  assert dm.vision_active and before > dm.wheeltouch.alert_2_threshold


def test_touching_the_wheel_while_disengaged_is_reported_in_the_wheeltouch_state():
  dm = DriverMonitoring()
  st = run(dm, inputs(enabled=False, driver_interacting=True), 0.05)
  assert st["wheeltouchPolicyState"]["driverInteracting"] is True


def test_demo_mode_ignores_the_steering_angle_like_its_other_car_inputs():
  x = inputs(driver(yaw=-0.425), steering_angle_deg=90.0)   # looking into a 90 degree turn: relieved when driving
  assert not run(DriverMonitoring(), x, 0.5)["visionPolicyState"]["distractedTypes"]["pose"]
  dm = DriverMonitoring()
  for _ in range(steps(0.5)):
    dm.run_step(x, demo=True)
  assert dm.state()["visionPolicyState"]["distractedTypes"]["pose"]


def test_terminal_alert_is_cleared_only_by_disengaging():
  dm = DriverMonitoring()
  run(dm, inputs(driver(**AWAY)), 12)
  assert dm.alert_level == 3
  st = run(dm, inputs(), 5)                                     # attentive again: still terminal
  assert st["alertLevel"] == "three"
  st = run(dm, inputs(driver_interacting=True), 1)              # touching the wheel does not clear it either
  assert st["alertLevel"] == "three"
  st = run(dm, inputs(enabled=False), 0.05)
  assert st["alertLevel"] == "none" and st["visionPolicyState"]["awarenessPercent"] == 100


def test_three_terminal_alerts_lock_out():
  dm = DriverMonitoring()
  for n in range(3):
    run(dm, inputs(driver(**AWAY)), 12)
    assert dm.alert_level == 3 and dm.terminal_alert_cnt == n + 1
    run(dm, inputs(enabled=False), 0.1)                         # disengage: awareness back to full
  st = run(dm, inputs(), 0.05)
  assert st["lockout"] and "tooDistracted" in st["events"] and st["alertCountLockoutPercent"] == 100


def test_thirty_seconds_of_terminal_alert_lock_out():
  dm = DriverMonitoring()
  run(dm, inputs(driver(**AWAY)), 11.5)
  assert dm.alert_level == 3
  run(dm, inputs(driver(**AWAY)), 29.0)
  assert not dm.too_distracted and dm.terminal_alert_cnt == 1
  st = run(dm, inputs(driver(**AWAY)), 1.5)
  assert st["lockout"] and st["alertTimeLockoutPercent"] == 100


def test_dashcam_never_alerts():
  dm = DriverMonitoring()
  st = run(dm, inputs(driver(**AWAY), enabled=False), 40)
  assert st["alertLevel"] == "none" and st["events"] == [] and st["visionPolicyState"]["awarenessPercent"] == 100
  assert st["visionPolicyState"]["distractedTypes"]["pose"]     # it still sees the driver, it just does not alert


def test_always_on_monitors_while_disengaged():
  dm = DriverMonitoring(always_on=True)
  st = run(dm, inputs(driver(**AWAY), enabled=False), 6)
  assert st["alertLevel"] == "two" and st["alwaysOnLockout"]


def test_unavailable_model_is_never_attentive_and_counts_at_the_vision_rate():
  dm = DriverMonitoring()
  run(dm, inputs(), 2)
  seen = {}
  for i in range(steps(12)):
    dm.run_step(None, enabled=True)
    seen.setdefault(dm.alert_level, (i + 1) * DT_DMON)
  # missing data neither switches to the laxer wheel-touch policy nor freezes the vision count
  assert abs(seen[1] - 3.0) <= 0.1 and abs(seen[2] - 5.0) <= 0.1 and abs(seen[3] - 11.0) <= 0.1, seen
  st = dm.state()
  assert not st["visionPolicyState"]["faceDetected"] and "driverMonitoringUnavailable" in st["events"]
  assert st["activePolicy"] == "vision"


def test_rhd_learned_uses_right_side():
  dm = DriverMonitoring()
  left, right = driver(**AWAY), driver()
  x = DMInputs(left=left, right=right, wheel_on_right_prob=0.97, car_speed=20.0, enabled=False)
  run(dm, x, 20)
  assert dm.state()["isRHD"]
  x.enabled = True
  run(dm, x, 8)
  assert dm.alert_level == 0   # the attentive right-side driver is the one watched


def test_face_orientation_geometry():
  # a face centred in the reference frame with zero model orientation looks straight ahead
  pitch, yaw = face_orientation_from_model([0.0, 0.0, 0.0], [0.0, 0.0], [0.0, 0.0, 0.0])
  assert pitch == 0.0 and yaw == 0.0
  pitch, yaw = face_orientation_from_model([0.1, -0.2, 0.0], [0.25, 0.0], [0.0, 0.05, 0.02])
  assert math.isclose(yaw, 0.2 + math.atan2(0.25 * 1928, 598) - 0.02)
  assert math.isclose(pitch, 0.1 - 0.05)


def test_steering_into_turn_relieves_yaw():
  x = inputs(driver(yaw=0.62), steering_angle_deg=-200.0)
  st = run(DriverMonitoring(), x, 6)
  assert not st["visionPolicyState"]["distractedTypes"]["pose"]


def test_pose_offsets_learn_at_speed_and_calibrate():
  dm = DriverMonitoring()
  # a driver who naturally sits looking 0.2 rad to the side: after 60 s at speed the offset is learned
  p = run(dm, inputs(driver(yaw=0.2), speed=20.0), 65)["visionPolicyState"]["pose"]
  assert p["calibrated"] and p["yawCalib"]["calibratedPercent"] == 100
  assert 0.15 < p["yawCalib"]["offset"] < 0.21
  assert dm.alert_level == 0


class _Side:
  def __init__(self, **over):
    d = driver()
    for k, v in vars(d).items():
      setattr(self, k, over.get(k, v))


@pytest.mark.parametrize("over,msg", [
  ({"faceOrientation": [0.1]}, "faceOrientation has 1 values"),
  ({"facePosition": [0.0, math.nan]}, r"facePosition\[1\] is nan"),
  ({"faceProb": math.inf}, "faceProb is inf"),
  ({"phoneProb": 1.5}, "phoneProb = 1.5 is not a probability"),
  ({"faceOrientationStd": [-0.1, 0.1, 0.1]}, "negative standard deviation"),
])
def test_malformed_driver_data_is_refused_by_name(over, msg):
  with pytest.raises(MalformedInput, match=msg):
    DriverData.from_reader(_Side(**over), "leftDriverData")


def test_empty_face_description_is_legal_and_changes_nothing():
  d = DriverData.from_reader(_Side(faceOrientation=[], faceOrientationStd=[], facePosition=[], facePositionStd=[]))
  dm = DriverMonitoring()
  run(dm, inputs(driver(**AWAY)), 2)
  before = dm.vision.face_detected, dm.vision.pose.yaw
  dm.run_step(inputs(d))
  assert (dm.vision.face_detected, dm.vision.pose.yaw) == before
