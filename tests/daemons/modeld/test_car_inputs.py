"""modeld's bus inputs: a malformed carState, lateralDelay or calibration never reaches the model; the daemon
keeps the last good values, marks the frame invalid with the reason and counts the message."""
import math

from cereal import messaging
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
  good = reader.read(sm)
  assert good.v_ego == 20.0 and good.left_blinker and good.malformed == "" and good.malformed_count == 0
  feed(sm, 1.01, carState={"vEgo": math.nan, "leftBlinker": False})
  bad = reader.read(sm)
  assert bad.v_ego == 20.0 and bad.left_blinker and bad.steering_torque == 0.5   # held, not the NaN message's
  assert bad.malformed == "carState non-finite" and bad.malformed_count == 1
  sm.update_msgs(1.02, [])                     # no new message: not counted twice, still flagged
  again = reader.read(sm)
  assert again.malformed_count == 1 and again.malformed == "carState non-finite"
  feed(sm, 1.03, carState={"vEgo": 21.0})
  assert reader.read(sm).v_ego == 21.0 and reader.read(sm).malformed == ""


def test_unknown_calibration_status_and_bad_delay_are_rejected_not_fatal():
  sm = messaging.SubMaster(SUBSCRIPTIONS, clock=lambda: 0.0)
  reader = CarInputReader()
  feed(sm, 1.0, lateralDelay={"lateralDelay": 0.25})
  assert reader.read(sm).lat_delay == 0.25
  cal = messaging.new_message("extrinsicsCalibration")
  cal.extrinsicsCalibration.rpyCalib = [0.0, 0.01, 0.0]
  cal.extrinsicsCalibration.calStatus = 77        # capnp-valid, but no such status
  bad_delay = messaging.new_message("lateralDelay")
  bad_delay.lateralDelay.lateralDelay = math.inf
  sm.update_msgs(1.01, [cal.as_reader(), bad_delay.as_reader()])
  car = reader.read(sm)
  assert car.lat_delay == 0.25 and car.calibration_invalid == "calStatus unknown"
  assert "extrinsicsCalibration malformed" in car.malformed and "lateralDelay out of range" in car.malformed
  assert car.malformed_count == 2


def test_blind_spots_and_lateral_control_reach_the_desire_inputs():
  sm = messaging.SubMaster(SUBSCRIPTIONS, clock=lambda: 0.0)
  feed(sm, 1.0, carState={"leftBlindspot": True, "rightBlindspot": False}, carControl={"latActive": True})
  car = CarInputReader().read(sm)
  assert car.left_blindspot and not car.right_blindspot and car.lat_active
