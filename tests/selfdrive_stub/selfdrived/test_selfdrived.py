"""selfdrived: the pure state machine, and event collection from a real SubMaster fed synthetic messages."""
import pytest

from cereal import messaging
from selfdrive_stub.consumers.selfdrived import (BIG_MODEL_LOADING, SOFT_DISABLE_STEPS, SelfdriveStateMachine, collect_events,
                                       fill_selfdrive_state, malformed_services)

RATES = {"modelV2": 20, "drivingModelData": 20, "usbGpuState": 20, "driverMonitoringState": 20, "extrinsicsCalibration": 4,
         "carState": 100}


class Feed:
  """A SubMaster (real sockets, unused) driven through update_msgs with simulated time at 100 Hz."""

  def __init__(self):
    self.t = 100.0
    self.sm = messaging.SubMaster(list(RATES), clock=lambda: self.t)
    self.tick = 0
    self.model_valid, self.model_reason, self.fallback = True, "", ""
    self.dm_level, self.dm_lockout, self.cal_status, self.dm_policy = "none", False, "calibrated", "vision"
    self.model_alive = True
    self.gpu_plugged, self.gpu_state = False, "absent"
    self.frame_drop = 0.0

  def message(self, s):
    if s in ("modelV2", "drivingModelData"):
      msg = messaging.new_message(s, valid=self.model_valid, invalidReason=self.model_reason)
      getattr(msg, s).fallbackReason = self.fallback
      if s == "modelV2":
        msg.modelV2.frameDropPerc = self.frame_drop
    else:
      msg = messaging.new_message(s)
    if s == "driverMonitoringState":
      msg.driverMonitoringState.alertLevel = self.dm_level
      msg.driverMonitoringState.lockout = self.dm_lockout
      msg.driverMonitoringState.activePolicy = self.dm_policy
    if s == "usbGpuState":
      msg.usbGpuState.plugged, msg.usbGpuState.state = self.gpu_plugged, self.gpu_state
    if s == "extrinsicsCalibration":
      msg.extrinsicsCalibration.calStatus = self.cal_status
    return msg.as_reader()

  def run(self, seconds):
    for _ in range(int(round(seconds * 100))):
      self.tick += 1
      self.t += 0.01
      due = [s for s, hz in RATES.items() if self.tick % (100 // hz) == 0]
      if not self.model_alive:
        due = [s for s in due if s not in ("modelV2", "drivingModelData", "usbGpuState")]
      self.sm.update_msgs(self.t, [self.message(s) for s in due])
    return collect_events(self.sm, malformed_services(self.sm))


def test_state_machine_counts_control_steps():
  m = SelfdriveStateMachine()
  out = m.update(["calibrationIncomplete"], engage_request=True)
  assert out.state == "disabled" and not out.engageable and "calibrationIncomplete" in out.alert
  assert m.update([], engage_request=True).state == "enabled"
  assert m.update(["driverDistracted1"]).state == "enabled"                # warnings do not disengage
  assert m.update(["modelInvalid"]).state == "softDisabling"
  assert m.update([]).state == "enabled"                                   # cleared in time: back to enabled
  m.update(["modeldLagging"])
  states = [m.update(["modeldLagging"]).state for _ in range(SOFT_DISABLE_STEPS)]
  assert SOFT_DISABLE_STEPS == 300 and states == ["softDisabling"] * (SOFT_DISABLE_STEPS - 1) + ["disabled"]
  assert m.update([], engage_request=True).state == "enabled"
  assert m.update([], engage_request=False).state == "disabled"
  m.update([], engage_request=True)
  m.update(["commIssue"])
  assert m.update(["commIssue"], steps=150).state == "softDisabling"        # a late live iteration counts its steps
  assert m.update(["commIssue"], steps=150).state == "disabled"
  with pytest.raises(ValueError, match="notAnEvent"):
    m.update(["notAnEvent"])


def test_engages_only_when_every_input_passes():
  f = Feed()
  assert "modeldLagging" in collect_events(f.sm)            # nothing received yet: never "path OK"
  events = f.run(3.0)
  assert events == []
  m = SelfdriveStateMachine()
  assert m.update(events, engage_request=True).state == "enabled"


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
  out = SelfdriveStateMachine().update(events, engage_request=True)
  assert out.state == "disabled" and not out.engageable


def test_model_failure_while_engaged_soft_disables_then_disengages():
  f = Feed()
  m = SelfdriveStateMachine()
  m.update(f.run(2.0), engage_request=True)
  assert m.state == "enabled"
  f.model_alive = False                                     # modeld stops publishing (e.g. a device hang)
  events = f.run(0.6)
  assert "modeldLagging" in events and m.update(events).state == "softDisabling"
  assert [m.update(f.run(0.01)).state for _ in range(SOFT_DISABLE_STEPS)][-2:] == ["softDisabling", "disabled"]


def test_fallback_is_reported_and_loading_only_blocks_entry():
  f = Feed()
  f.fallback = "big model failed: DeviceTimeout: wait timed out"
  events = f.run(2.0)
  assert events == ["bigModelFailed"]
  assert SelfdriveStateMachine().update(events, engage_request=True).state == "enabled"


def test_selfdrive_state_message():
  m = SelfdriveStateMachine()
  m.update([], engage_request=True)
  out = m.update(["modelInvalid"])
  msg = messaging.new_message("selfdriveState")
  fill_selfdrive_state(msg, out)
  s = msg.selfdriveState
  assert str(s.state) == "softDisabling" and s.enabled and list(s.events) == ["modelInvalid"]
  assert str(s.alertStatus) == "critical"


def test_engagement_waits_while_the_usb_gpu_loads_the_big_model():
  f = Feed()
  f.gpu_plugged, f.gpu_state = True, "loading"
  events = f.run(2.0)
  assert events == ["bigModelLoading"]
  assert SelfdriveStateMachine().update(events, engage_request=True).state == "disabled"
  f.gpu_plugged = False                                     # no USB GPU: "loading" cannot hold engagement
  assert f.run(0.1) == []


def test_big_failure_while_engaged_soft_disengages_and_the_next_engagement_drives_on_small():
  f = Feed()
  f.gpu_plugged, f.gpu_state = True, "ready"
  m = SelfdriveStateMachine()
  assert m.update(f.run(2.0), engage_request=True).state == "enabled"
  f.gpu_state = "failed"                                    # the big model fails; the small one's outputs are valid
  outs = [m.update(f.run(0.01)) for _ in range(SOFT_DISABLE_STEPS + 10)]
  first = next(i for i, o in enumerate(outs) if o.state == "softDisabling")   # the next usbGpuState (20 Hz)
  assert first < 5 and "bigModelLost" in outs[first].events
  assert [o.state for o in outs[first:first + SOFT_DISABLE_STEPS + 1]] == ["softDisabling"] * SOFT_DISABLE_STEPS + ["disabled"]
  out = m.update(f.run(0.01), engage_request=True)          # next engagement: on the small model
  assert out.state == "enabled" and out.events == ["bigModelFailed"]
  assert m.update(f.run(1.0)).state == "enabled"


def test_big_failure_before_engagement_only_warns():
  f = Feed()
  f.gpu_plugged, f.gpu_state = True, "failed"
  m = SelfdriveStateMachine()
  assert m.update(f.run(2.0), engage_request=True).state == "enabled"
  assert m.update(f.run(1.0)).state == "enabled"


def test_wheeltouch_alerts_are_unresponsive_events():
  f = Feed()
  f.run(2.0)
  f.dm_level, f.dm_policy = "two", "wheeltouch"
  assert "driverUnresponsive2" in f.run(0.1)


@pytest.mark.parametrize("setup, service, event", [
  (lambda f: setattr(f, "dm_level", 9), "driverMonitoringState", "driverMonitoringUnavailable"),
  (lambda f: setattr(f, "frame_drop", float("nan")), "modelV2", "modelInvalid"),
  (lambda f: setattr(f, "cal_status", 12), "extrinsicsCalibration", "calibrationInvalid"),
])
def test_malformed_inputs_are_invalid_never_ok(setup, service, event):
  f = Feed()
  f.run(2.0)
  setup(f)
  events = f.run(0.5)
  assert malformed_services(f.sm) == [service] and event in events
  assert SelfdriveStateMachine().update(events, engage_request=True).state == "disabled"
