"""The real dmonitoringd process under the replay harness: a capnp-valid but malformed driverStateV2 (a
one-value faceOrientation, NaN) is "monitoring unavailable", counted and published invalid; the process keeps
running with its state (a crash would have the manager restart it with full awareness)."""
import math
import os

from cereal.messaging import log_from_bytes, new_message
from cereal.route import Route
from process_replay.configs import get_config
from process_replay.harness import LogMessage, replay
from repo_paths import REPO_ROOT

from .test_dmonitoringd import driver_state, malformed_state

T0 = 10**12


def context(t_ns):
  cs = new_message("carState")
  cs.carState.vEgo, cs.carState.gearShifter = 25.0, "drive"
  ss = new_message("selfdriveState")
  ss.selfdriveState.enabled = True
  cal = new_message("extrinsicsCalibration")
  cal.extrinsicsCalibration.rpyCalib, cal.extrinsicsCalibration.calStatus = [0.0, 0.0, 0.0], "calibrated"
  return [LogMessage(t_ns + i, m.which(), m.to_bytes()) for i, m in enumerate((cs, ss, cal))]


def messages(kinds):
  out = []
  for k, kind in enumerate(kinds):
    t = T0 + k * 50_000_000
    ds = driver_state(yaw=0.8) if kind == "away" else malformed_state(kind)
    out += context(t) + [LogMessage(t + 10, "driverStateV2", ds.as_builder().to_bytes())]
  return out


def test_malformed_driver_state_does_not_kill_dmonitoringd_or_reset_it():
  kinds = ["away"] * 80 + ["short", "nan"] + ["away"] * 4
  with Route(os.path.join(REPO_ROOT, "process_replay", "routes", "tici")) as route:
    res = replay(get_config("dmonitoringd"), route, messages=messages(kinds))
  outs = [log_from_bytes(d) for d in res.outputs]
  assert len(outs) == len(kinds)                                   # one state per step, none lost to a crash
  before, bad, after = outs[79], outs[80:82], outs[82:]
  assert before.valid and str(before.driverMonitoringState.alertLevel) == "one"
  for m, n in zip(bad, (1, 2)):
    assert not m.valid and "malformed input: leftDriverData.face" in m.invalidReason
    assert m.driverMonitoringState.malformedInputs == n
  for m in outs:
    assert math.isfinite(m.driverMonitoringState.visionPolicyState.pose.pitch)
  # the awareness kept falling through the malformed steps instead of starting over at 100 %
  pct = [m.driverMonitoringState.visionPolicyState.awarenessPercent for m in (before, *bad, *after)]
  assert pct == sorted(pct, reverse=True) and pct[-1] < pct[0] < 100
  assert all(m.valid for m in after) and after[-1].driverMonitoringState.malformedInputs == 2
