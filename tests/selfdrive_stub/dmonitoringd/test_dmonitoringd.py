"""dmonitoringd's gating: the policy sees the model output only when its inputs pass all_checks()."""

import math

from cereal.messaging import SubMaster, log_from_bytes, new_message
from selfdrive_stub.consumers import dmonitoringd

def driver_state(yaw=0.0, valid=True, face=0.95):
  msg = new_message("driverStateV2", valid=valid)
  if not valid:
    msg.invalidReason = "calibration missing"
  for side in ("leftDriverData", "rightDriverData"):
    d = getattr(msg.driverStateV2, side)
    d.faceOrientation, d.faceOrientationStd = [0.0, -yaw, 0.0], [0.05, 0.05, 0.05]
    d.facePosition, d.facePositionStd = [0.0, 0.1], [0.01, 0.01]
    d.faceProb, d.leftEyeProb, d.rightEyeProb = face, 0.95, 0.95
    d.leftBlinkProb = d.rightBlinkProb = d.sunglassesProb = d.phoneProb = d.sleepProb = 0.05
  msg.driverStateV2.wheelOnRightProb = 0.02
  return log_from_bytes(msg.to_bytes())


def car_msgs(enabled=True):
  cs = new_message("carState")
  cs.carState.vEgo, cs.carState.gearShifter = 25.0, "drive"
  ss = new_message("selfdriveState")
  ss.selfdriveState.enabled = enabled
  return [log_from_bytes(cs.to_bytes()), log_from_bytes(ss.to_bytes())]


def calib_msg():
  m = new_message("extrinsicsCalibration")
  m.extrinsicsCalibration.rpyCalib = [0.0, 0.0, 0.0]
  m.extrinsicsCalibration.calStatus = "calibrated"
  return log_from_bytes(m.to_bytes())


class Bus:
  """Simulated time: like dmonitoringd's loop, the SubMaster updates every 50 ms (on driverStateV2 or its poll
  timeout), taking the newest carState/selfdriveState each time and the 4 Hz calibration when due."""

  def __init__(self):
    self.tick = 0
    self.sm = SubMaster(dmonitoringd.SERVICES, poll="driverStateV2", clock=lambda: self.tick * 0.05)
    self.monitor = dmonitoringd.Monitor(dmonitoringd.DriverMonitoring())
    self.results = []

  def run(self, seconds, driver=lambda tick: driver_state(), model_alive=True):
    for _ in range(int(round(seconds / 0.05))):
      self.tick += 1
      msgs = car_msgs()
      if self.tick % 5 == 0:
        msgs.append(calib_msg())
      if model_alive:
        msgs.append(driver(self.tick))
      self.sm.update_msgs(self.tick * 0.05, msgs)
      ok, reason = self.monitor.step(self.sm, self.sm.updated["driverStateV2"])
      msg = log_from_bytes(self.monitor.message(ok, reason).to_bytes())
      self.results.append((ok, reason, msg))
    return self.results[-1][2]


def test_attentive_driver_with_healthy_inputs():
  bus = Bus()
  last = bus.run(12)
  assert last.valid and str(last.driverMonitoringState.alertLevel) == "none"
  dms = last.driverMonitoringState
  assert dms.visionPolicyState.faceDetected and str(dms.activePolicy) == "vision"
  assert dms.visionPolicyState.awarenessPercent == 100


def test_distracted_driver_escalates():
  bus = Bus()
  bus.run(3)
  last = bus.run(9, driver=lambda tick: driver_state(yaw=0.8))
  dms = last.driverMonitoringState
  assert str(dms.alertLevel) == "two" and dms.visionPolicyState.distractedTypes.pose
  assert "driverDistracted2" in list(dms.events)


def test_invalid_model_output_is_unavailable_not_attentive():
  bus = Bus()
  bus.run(3)
  last = bus.run(9, driver=lambda tick: driver_state(valid=False))
  assert not last.valid and "driverStateV2" in last.invalidReason
  dms = last.driverMonitoringState
  assert str(dms.alertLevel) == "two" and not dms.visionPolicyState.faceDetected
  assert "driverMonitoringUnavailable" in list(dms.events)


def test_missing_model_keeps_stepping_and_escalates():
  bus = Bus()
  bus.run(3)
  last = bus.run(14, model_alive=False)
  assert not last.valid and "driverStateV2: not alive" in last.invalidReason
  assert str(last.driverMonitoringState.alertLevel) == "three"


def test_model_output_at_wrong_rate_is_unavailable():
  bus = Bus()
  bus.run(3)
  # 5 Hz instead of 20 Hz: alive, valid, but off frequency
  last = bus.run(9, driver=lambda tick: driver_state() if tick % 4 == 0 else None)
  assert not last.valid and "driverStateV2: frequency out of range" in last.invalidReason
  assert str(last.driverMonitoringState.alertLevel) != "none"


def malformed_state(kind):
  msg = driver_state(yaw=0.8).as_builder()
  d = msg.driverStateV2.leftDriverData
  if kind == "short":
    d.faceOrientation = [0.1]              # capnp-valid, one value where the policy needs pitch and yaw
  elif kind == "nan":
    d.faceOrientation = [float("nan"), -0.8, 0.0]
  elif kind == "inf_prob":
    d.faceProb = float("inf")
  return log_from_bytes(msg.to_bytes())


def test_malformed_model_output_is_unavailable_counted_and_keeps_the_state():
  bus = Bus()
  bus.run(4, driver=lambda tick: driver_state(yaw=0.8))          # distracted: alert one, awareness down
  awareness = bus.monitor.dm.awareness
  assert str(bus.results[-1][2].driverMonitoringState.alertLevel) == "one"
  for i, kind in enumerate(("short", "nan", "inf_prob")):
    last = bus.run(0.05, driver=lambda tick, kind=kind: malformed_state(kind))
    dms = last.driverMonitoringState
    assert not last.valid and last.invalidReason.startswith("malformed input: leftDriverData.")
    assert dms.malformedInputs == i + 1 and math.isfinite(dms.visionPolicyState.pose.pitch)
    assert not dms.visionPolicyState.faceDetected and "driverMonitoringUnavailable" in list(dms.events)
  assert bus.monitor.dm.awareness < awareness        # kept its state and kept counting down (never attentive)
  last = bus.run(0.05)
  assert last.valid and last.driverMonitoringState.malformedInputs == 3


def test_malformed_car_and_calibration_inputs_are_unavailable_too():
  bus = Bus()
  bus.run(2)
  cs = car_msgs()[0].as_builder()
  cs.carState.vEgo = float("nan")
  bus.sm.update_msgs(bus.tick * 0.05 + 0.05, [log_from_bytes(cs.to_bytes()), driver_state()])
  ok, reason = bus.monitor.step(bus.sm, True)
  assert not ok and reason == "malformed input: carState.vEgo is nan"
  cal = calib_msg().as_builder()
  cal.extrinsicsCalibration.rpyCalib = [0.0, 0.0]
  bus.sm.update_msgs(bus.tick * 0.05 + 0.1, [car_msgs()[0], cal.as_reader(), driver_state()])
  ok, reason = bus.monitor.step(bus.sm, True)
  assert not ok and reason == "malformed input: extrinsicsCalibration.rpyCalib has 2 values, needs 3"
  assert bus.monitor.malformed == 2
