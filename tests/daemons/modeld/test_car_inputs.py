"""modeld's bus inputs: a malformed carState, lateralDelay or calibration never reaches the model; the daemon
keeps the last good values, marks the frame invalid with the reason and counts the message."""
import math

from cereal import messaging
from daemons.common.calibration import camera_time
from daemons.modeld.car_inputs import CarInputReader
from daemons.modeld.daemon import SUBSCRIPTIONS


def feed(sm, now, **fields):
  msgs = []
  for service, values in fields.items():
    m = messaging.new_message(service)
    for k, v in values.items():
      setattr(getattr(m, service), k, v)
    msgs.append(m.as_reader())
  sm.update_msgs(now, msgs)


def test_non_finite_car_state_keeps_the_last_good_values_and_is_counted():
  sm = messaging.SubMaster(SUBSCRIPTIONS, clock=lambda: 0.0)
  reader = CarInputReader()
  feed(sm, 1.0, carState={"vEgo": 20.0, "leftBlinker": True, "steeringTorque": 0.5})
  good = reader.read(sm, 0.0)
  assert good.v_ego == 20.0 and good.left_blinker and good.malformed == "" and good.malformed_count == 0
  feed(sm, 1.01, carState={"vEgo": math.nan, "leftBlinker": False})
  bad = reader.read(sm, 0.0)
  assert bad.v_ego == 20.0 and bad.left_blinker and bad.steering_torque == 0.5   # held, not the NaN message's
  assert bad.malformed == "carState non-finite" and bad.malformed_count == 1
  sm.update_msgs(1.02, [])                     # no new message: not counted twice, still flagged
  again = reader.read(sm, 0.0)
  assert again.malformed_count == 1 and again.malformed == "carState non-finite"
  feed(sm, 1.03, carState={"vEgo": 21.0})
  assert reader.read(sm, 0.0).v_ego == 21.0 and reader.read(sm, 0.0).malformed == ""


def test_unknown_calibration_status_and_bad_delay_are_rejected_not_fatal():
  sm = messaging.SubMaster(SUBSCRIPTIONS, clock=lambda: 0.0)
  reader = CarInputReader()
  feed(sm, 1.0, lateralDelay={"lateralDelay": 0.25})
  assert reader.read(sm, 0.0).lat_delay == 0.25
  cal = messaging.new_message("extrinsicsCalibration")
  cal.extrinsicsCalibration.rpyCalib = [0.0, 0.01, 0.0]
  cal.extrinsicsCalibration.calStatus = 77        # capnp-valid, but no such status
  bad_delay = messaging.new_message("lateralDelay")
  bad_delay.lateralDelay.lateralDelay = math.inf
  sm.update_msgs(1.01, [cal.as_reader(), bad_delay.as_reader()])
  car = reader.read(sm, 0.0)
  assert car.lat_delay == 0.25 and car.calibration_invalid == "calStatus unknown"
  assert "extrinsicsCalibration malformed" in car.malformed and "lateralDelay out of range" in car.malformed
  assert car.malformed_count == 2


def test_blind_spots_and_lateral_control_reach_the_desire_inputs():
  sm = messaging.SubMaster(SUBSCRIPTIONS, clock=lambda: 0.0)
  feed(sm, 1.0, carState={"leftBlindspot": True, "rightBlindspot": False}, carControl={"latActive": True})
  car = CarInputReader().read(sm, 0.0)
  assert car.left_blindspot and not car.right_blindspot and car.lat_active


def _calibration():
  cal = messaging.new_message("extrinsicsCalibration", valid=True)
  cal.extrinsicsCalibration.rpyCalib = [0.0, 0.01, 0.0]
  cal.extrinsicsCalibration.calStatus = "calibrated"
  return cal.as_reader()


def _stale_flags(wall_clock, calibration_frames, n_frames):
  """calibration_stale per frame when frames 0..n-1 are read at wall_clock(frame), with a calibration message
  delivered at the listed frames (a real SubMaster, not in SIMULATION mode)."""
  t = [wall_clock(0)]
  sm = messaging.SubMaster(SUBSCRIPTIONS, clock=lambda: t[0])
  reader = CarInputReader()
  flags = []
  for frame_id in range(n_frames):
    t[0] = wall_clock(frame_id)
    sm.update_msgs(t[0], [_calibration()] if frame_id in calibration_frames else [])
    flags.append(reader.read(sm, camera_time(frame_id)).calibration_stale)
  return flags, sm


def test_calibration_goes_stale_in_camera_time_while_the_wall_clock_is_frozen():
  # a replay stepped faster than real time: 5 s of frames, one calibration at the start, no wall time passes
  flags, sm = _stale_flags(lambda frame_id: 100.0, {0}, 101)
  assert sm.alive["extrinsicsCalibration"]          # the SubMaster's wall-clock rule would call it fresh
  assert flags.index(True) == 51 and all(flags[51:]) and not any(flags[:51])   # 2.55 s > 2.5 s, 2.5 s is not


def test_calibration_at_4_hz_of_camera_time_is_fresh_while_the_wall_clock_races():
  # a replay stepped slower than real time: 10 wall seconds per frame, calibration every 5th frame (4 Hz)
  flags, sm = _stale_flags(lambda frame_id: 100.0 + 10.0 * frame_id, set(range(0, 100, 5)), 100)
  assert not sm.alive["extrinsicsCalibration"]      # the SubMaster's wall-clock rule would call it stale
  assert not any(flags)


def test_a_camera_restart_restarts_the_calibration_age():
  sm = messaging.SubMaster(SUBSCRIPTIONS, clock=lambda: 0.0)
  reader = CarInputReader()
  sm.update_msgs(0.0, [_calibration()])
  assert not reader.read(sm, camera_time(1000)).calibration_stale
  sm.update_msgs(0.0, [])
  assert not reader.read(sm, camera_time(3)).calibration_stale        # frame ids start over: age from here
  sm.update_msgs(0.0, [])
  assert reader.read(sm, camera_time(3 + 51)).calibration_stale
