"""DriverMonitoring policy: alert timings, distraction types, unavailability and lockout, with synthetic inputs."""
import math

import pytest

from selfdrive_stub.dm_policy import DT_DMON, DMInputs, DriverData, DriverMonitoring, face_orientation_from_model


def driver(yaw=0.0, pitch=0.0, face=0.95, blink=0.05, eye=0.95, sunglasses=0.02, phone=0.05, sleep=0.05, std=0.05):
  # orientation in model convention: the policy uses -orient[1] as yaw; a centred face position
  return DriverData([pitch, -yaw, 0.0], [std, std, std], [0.0, 0.1], [0.01, 0.01], face, eye, eye, blink, blink,
                    sunglasses, phone, sleep)


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


def test_attentive_driver_never_alerted():
  dm = DriverMonitoring()
  for _ in range(steps(30)):
    dm.run_step(inputs())
  st = dm.state()
  assert st["alertLevel"] == "none" and st["visionPolicyState"]["awarenessPercent"] == 100
  assert st["activePolicy"] == "vision" and st["visionPolicyState"]["faceDetected"]
  assert not st["visionPolicyState"]["isDistracted"]


def test_looking_away_raises_one_two_three_at_vision_timings():
  dm = DriverMonitoring()
  seen = first_step_at_level(dm, inputs(driver(yaw=0.8)))
  # the distraction low-pass (rc 0.25 s) delays the count by a few steps
  assert 5.0 <= seen[1] <= 5.6, seen
  assert 8.0 <= seen[2] <= 8.6, seen
  assert 13.0 <= seen[3] <= 13.6, seen
  st = dm.state()
  assert st["visionPolicyState"]["distractedTypes"]["pose"] and "driverDistracted3" in st["events"]
  # 5 s in red without a response: forced decel and a lockout
  assert st["noResponseForceDecel"] and st["lockout"] and st["lockoutCount"] == 1


def test_looking_down_is_distracted_looking_up_is_not():
  down, up = DriverMonitoring(), DriverMonitoring()
  for _ in range(steps(6)):
    down.run_step(inputs(driver(pitch=-0.9)))
    up.run_step(inputs(driver(pitch=0.9)))
  assert down.alert_level >= 1 and down.distracted_types["pose"]
  assert up.alert_level == 0 and not up.distracted_types["pose"]


@pytest.mark.parametrize("kw,kind", [({"blink": 0.97}, "eye"), ({"phone": 0.9}, "phone"), ({"sleep": 0.9}, "sleep")])
def test_distraction_types(kw, kind):
  dm = DriverMonitoring()
  for _ in range(steps(6)):
    dm.run_step(inputs(driver(**kw)))
  assert dm.distracted_types[kind] and dm.alert_level == 1


def test_sunglasses_or_invisible_eyes_mask_blinks():
  for kw in ({"sunglasses": 0.95}, {"eye": 0.3}):
    dm = DriverMonitoring()
    for _ in range(steps(6)):
      dm.run_step(inputs(driver(blink=0.97, **kw)))
    assert not dm.distracted_types["eye"] and dm.alert_level == 0


def test_high_model_std_does_not_count_as_distracted():
  dm = DriverMonitoring()
  for _ in range(steps(6)):
    dm.run_step(inputs(driver(yaw=0.8, std=0.5)))
  assert not dm.driver_distracted and dm.alert_level == 0


def test_unavailable_model_is_never_attentive():
  dm = DriverMonitoring()
  for _ in range(steps(2)):
    dm.run_step(inputs())
  seen = {}
  for i in range(steps(15)):
    dm.run_step(None, enabled=True, car_speed=20.0)
    seen.setdefault(dm.alert_level, (i + 1) * DT_DMON)
  # counts down at the vision rate; missing data never switches to the laxer wheel-touch policy
  assert abs(seen[1] - 5.0) <= 0.2 and abs(seen[2] - 8.0) <= 0.2 and abs(seen[3] - 13.0) <= 0.2, seen
  st = dm.state()
  assert not st["visionPolicyState"]["faceDetected"] and "driverMonitoringUnavailable" in st["events"]
  assert st["activePolicy"] == "vision"


def test_no_face_falls_back_to_wheeltouch_and_counts_down():
  dm = DriverMonitoring()
  seen = first_step_at_level(dm, inputs(driver(face=0.1)), max_seconds=26)
  assert dm.state()["activePolicy"] == "wheeltouch"
  assert abs(seen[1] - 5.0) <= 0.2 and abs(seen[2] - 15.0) <= 0.2 and abs(seen[3] - 25.0) <= 0.2, seen


def test_not_engaged_resets_awareness_unless_always_on():
  off = DriverMonitoring()
  for _ in range(steps(10)):
    off.run_step(inputs(driver(yaw=0.8), enabled=False))
  assert off.alert_level == 0
  always = DriverMonitoring(always_on=True)
  for _ in range(steps(10)):
    always.run_step(inputs(driver(yaw=0.8), enabled=False))
  assert always.alert_level == 2 and always.state()["alwaysOnLockout"]


def test_attention_recovers_awareness():
  dm = DriverMonitoring()
  for _ in range(steps(6)):
    dm.run_step(inputs(driver(yaw=0.8)))
  assert dm.alert_level == 1
  for _ in range(steps(3)):
    dm.run_step(inputs())
  assert dm.alert_level == 0 and dm.awareness > 0.9


def test_low_speed_exemption_stops_before_orange():
  dm = DriverMonitoring()
  for _ in range(steps(20)):
    dm.run_step(inputs(driver(yaw=0.8), speed=1.0))
  assert dm.alert_level == 1


def test_two_red_alerts_lock_out():
  dm = DriverMonitoring()
  for _ in range(2):
    for _ in range(steps(14)):
      dm.run_step(inputs(driver(yaw=0.8)))
    assert dm.alert_level == 3
    for _ in range(steps(1)):    # the driver takes the wheel: interaction resets awareness
      dm.run_step(inputs(driver(yaw=0.8), driver_interacting=True))
  st = dm.state()
  assert st["lockout"] and st["lockoutCount"] == 1 and st["lockoutMinutesRemaining"] == 1
  assert "tooDistracted" in st["events"]


def test_rhd_learned_uses_right_side():
  dm = DriverMonitoring()
  left, right = driver(yaw=0.8), driver()
  x = DMInputs(left=left, right=right, wheel_on_right_prob=0.97, car_speed=20.0, enabled=False)
  for _ in range(steps(20)):
    dm.run_step(x)
  assert dm.state()["isRHD"]
  x.enabled = True
  for _ in range(steps(8)):
    dm.run_step(x)
  assert dm.alert_level == 0   # the attentive right-side driver is the one watched


def test_face_orientation_geometry():
  # a face centred in the reference frame with zero model orientation looks straight ahead
  pitch, yaw = face_orientation_from_model([0.0, 0.0, 0.0], [0.0, 0.0], [0.0, 0.0, 0.0])
  assert pitch == 0.0 and yaw == 0.0
  pitch, yaw = face_orientation_from_model([0.1, -0.2, 0.0], [0.25, 0.0], [0.0, 0.05, 0.02])
  assert math.isclose(yaw, 0.2 + math.atan2(0.25 * 1928, 598) - 0.02)
  assert math.isclose(pitch, 0.1 - 0.05)


def test_steering_into_turn_relieves_yaw():
  dm = DriverMonitoring()
  # looking left (positive yaw) while steering hard left: the relief removes up to 0.39 rad of yaw error
  x = inputs(driver(yaw=0.62), steering_angle_deg=-200.0)
  for _ in range(steps(6)):
    dm.run_step(x)
  assert not dm.distracted_types["pose"]


def test_pose_offsets_learn_at_speed_and_calibrate():
  dm = DriverMonitoring()
  # a driver who naturally sits looking 0.2 rad to the side: after 60 s at speed the offset is learned
  for _ in range(steps(65)):
    dm.run_step(inputs(driver(yaw=0.2), speed=20.0))
  p = dm.state()["visionPolicyState"]["pose"]
  assert p["calibrated"] and p["yawCalib"]["calibratedPercent"] == 100
  assert 0.15 < p["yawCalib"]["offset"] < 0.21
  assert dm.alert_level == 0
