"""selfdrived: the pure state machine, and event collection from a real SubMaster fed synthetic messages."""
import pytest

from cereal import messaging
from selfdrive_stub.selfdrived import (BIG_MODEL_LOADING, SOFT_DISABLE_TIME, SelfdriveStateMachine, collect_events,
                                       fill_selfdrive_state)

RATES = {"modelV2": 20, "drivingModelData": 20, "driverMonitoringState": 20, "extrinsicsCalibration": 4, "carState": 100}


class Feed:
  """A SubMaster (real sockets, unused) driven through update_msgs with simulated time at 100 Hz."""

  def __init__(self):
    self.t = 100.0
    self.sm = messaging.SubMaster(list(RATES), clock=lambda: self.t)
    self.tick = 0
    self.model_valid, self.model_reason, self.fallback = True, "", ""
    self.dm_level, self.dm_lockout, self.cal_status = "none", False, "calibrated"
    self.model_alive = True

  def message(self, s):
    if s in ("modelV2", "drivingModelData"):
      msg = messaging.new_message(s, valid=self.model_valid, invalidReason=self.model_reason)
      getattr(msg, s).fallbackReason = self.fallback
    else:
      msg = messaging.new_message(s)
    if s == "driverMonitoringState":
      msg.driverMonitoringState.alertLevel = self.dm_level
      msg.driverMonitoringState.lockout = self.dm_lockout
    if s == "extrinsicsCalibration":
      msg.extrinsicsCalibration.calStatus = self.cal_status
    return msg.as_reader()

  def run(self, seconds):
    for _ in range(int(round(seconds * 100))):
      self.tick += 1
      self.t += 0.01
      due = [s for s, hz in RATES.items() if self.tick % (100 // hz) == 0]
      if not self.model_alive:
        due = [s for s in due if s not in ("modelV2", "drivingModelData")]
      self.sm.update_msgs(self.t, [self.message(s) for s in due])
    return collect_events(self.sm)


def test_state_machine_transitions_with_injected_clock():
  m = SelfdriveStateMachine()
  out = m.update(0.0, ["calibrationIncomplete"], engage_request=True)
  assert out.state == "disabled" and not out.engageable and "calibrationIncomplete" in out.alert
  assert m.update(1.0, [], engage_request=True).state == "enabled"
  assert m.update(1.1, ["driverDistracted1"]).state == "enabled"           # warnings do not disengage
  assert m.update(1.2, ["modelInvalid"]).state == "softDisabling"
  assert m.update(1.3, []).state == "enabled"                               # cleared in time: back to enabled
  m.update(2.0, ["modeldLagging"])
  assert m.update(2.0 + SOFT_DISABLE_TIME - 0.01, ["modeldLagging"]).state == "softDisabling"
  assert m.update(2.0 + SOFT_DISABLE_TIME, ["modeldLagging"]).state == "disabled"
  assert m.update(6.0, [], engage_request=True).state == "enabled"
  assert m.update(6.1, [], engage_request=False).state == "disabled"
  with pytest.raises(ValueError, match="notAnEvent"):
    m.update(7.0, ["notAnEvent"])


def test_engages_only_when_every_input_passes():
  f = Feed()
  assert "modeldLagging" in collect_events(f.sm)            # nothing received yet: never "path OK"
  events = f.run(3.0)
  assert events == []
  m = SelfdriveStateMachine()
  assert m.update(f.t, events, engage_request=True).state == "enabled"


@pytest.mark.parametrize("setup, event", [
  (lambda f: setattr(f, "cal_status", "uncalibrated"), "calibrationIncomplete"),
  (lambda f: setattr(f, "cal_status", "invalid"), "calibrationInvalid"),
  (lambda f: setattr(f, "dm_level", "three"), "driverDistracted3"),
  (lambda f: setattr(f, "dm_lockout", True), "driverMonitoringLockout"),
  (lambda f: (setattr(f, "model_valid", False), setattr(f, "model_reason", BIG_MODEL_LOADING)), "bigModelLoading"),
  (lambda f: (setattr(f, "model_valid", False), setattr(f, "model_reason", "no calibration received")), "modelInvalid"),
  (lambda f: setattr(f, "model_alive", False), "modeldLagging"),
])
def test_each_gate_refuses_engagement(setup, event):
  f = Feed()
  f.run(2.0)
  setup(f)
  events = f.run(1.0)
  assert event in events
  out = SelfdriveStateMachine().update(f.t, events, engage_request=True)
  assert out.state == "disabled" and not out.engageable


def test_model_failure_while_engaged_soft_disables_then_disengages():
  f = Feed()
  m = SelfdriveStateMachine()
  m.update(f.t, f.run(2.0), engage_request=True)
  assert m.state == "enabled"
  f.model_alive = False                                     # modeld stops publishing (e.g. a device hang)
  events = f.run(0.6)
  assert "modeldLagging" in events and m.update(f.t, events).state == "softDisabling"
  assert m.update(f.t + SOFT_DISABLE_TIME, f.run(SOFT_DISABLE_TIME)).state == "disabled"


def test_fallback_is_reported_and_loading_only_blocks_entry():
  f = Feed()
  f.fallback = "big model failed: DeviceTimeout: wait timed out"
  events = f.run(2.0)
  assert events == ["bigModelFailed"]
  assert SelfdriveStateMachine().update(f.t, events, engage_request=True).state == "enabled"


def test_selfdrive_state_message():
  m = SelfdriveStateMachine()
  m.update(0.0, [], engage_request=True)
  out = m.update(0.1, ["modelInvalid"])
  msg = messaging.new_message("selfdriveState")
  fill_selfdrive_state(msg, out)
  s = msg.selfdriveState
  assert str(s.state) == "softDisabling" and s.enabled and list(s.events) == ["modelInvalid"]
  assert str(s.alertStatus) == "critical"
