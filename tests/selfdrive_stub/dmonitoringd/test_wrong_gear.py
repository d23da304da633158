"""Always-on monitoring applies only in a forward driving gear: openpilot's dmonitoringd counts every gear but
drive and low as the wrong gear, so a disengaged car in park, sport, eco or manual mode is not monitored."""
import pytest

from cereal import log
from cereal.messaging import SubMaster, log_from_bytes, new_message
from selfdrive_stub.consumers import dmonitoringd

GEARS = sorted(log.CarState.GearShifter.schema.enumerants)
MONITORED = ("drive", "low")


def _car_state(gear: str):
  msg = new_message("carState")
  msg.carState.vEgo, msg.carState.gearShifter = 25.0, gear
  return log_from_bytes(msg.to_bytes())


def _away_driver():
  msg = new_message("driverStateV2")
  for side in ("leftDriverData", "rightDriverData"):
    d = getattr(msg.driverStateV2, side)
    d.faceOrientation, d.faceOrientationStd = [0.0, -0.8, 0.0], [0.05, 0.05, 0.05]   # looking far to the side
    d.facePosition, d.facePositionStd = [0.0, 0.1], [0.01, 0.01]
    d.faceProb, d.leftEyeProb, d.rightEyeProb = 0.95, 0.95, 0.95
    d.leftBlinkProb = d.rightBlinkProb = d.sunglassesProb = d.phoneProb = d.sleepProb = 0.05
  msg.driverStateV2.wheelOnRightProb = 0.02
  return log_from_bytes(msg.to_bytes())


def _calibration():
  msg = new_message("extrinsicsCalibration")
  msg.extrinsicsCalibration.rpyCalib, msg.extrinsicsCalibration.calStatus = [0.0, 0.0, 0.0], "calibrated"
  return log_from_bytes(msg.to_bytes())


@pytest.mark.parametrize("gear", GEARS)
def test_every_gear_but_drive_and_low_is_the_wrong_gear(gear):
  sm = SubMaster(dmonitoringd.SERVICES, poll="driverStateV2", clock=lambda: 0.05)
  sm.update_msgs(0.05, [_car_state(gear)])
  ctx, problem = dmonitoringd.car_context(sm)
  assert problem == "" and ctx["wrong_gear"] is (gear not in MONITORED)


@pytest.mark.parametrize("gear, alert", [("drive", "two"), ("low", "two"), ("sport", "none"), ("manumatic", "none"),
                                         ("park", "none")])
def test_always_on_monitoring_of_a_disengaged_distracted_driver_alerts_only_in_drive_and_low(gear, alert):
  tick = 0
  sm = SubMaster(dmonitoringd.SERVICES, poll="driverStateV2", clock=lambda: tick * 0.05)
  monitor = dmonitoringd.Monitor(dmonitoringd.DriverMonitoring(always_on=True))
  for tick in range(1, int(6 / 0.05) + 1):   # 6 s away: past alert two (5 s) when monitored
    calibration = [_calibration()] if tick % 5 == 0 else []   # 4 Hz
    sm.update_msgs(tick * 0.05, [_car_state(gear), *calibration, _away_driver()])
    ok, reason = monitor.step(sm, sm.updated["driverStateV2"])
  assert ok, reason
  state = log_from_bytes(monitor.message(ok, reason).to_bytes()).driverMonitoringState
  assert str(state.alertLevel) == alert
