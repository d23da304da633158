"""selfdrived replayed by the harness (a real process on gated sockets): its timers count control steps, so a
5 s soft-disable condition disengages exactly 3.00 s in, however fast the replay runs; malformed inputs are
invalid, counted, and never end the process."""
import os

from cereal.messaging import log_from_bytes, new_message
from cereal.route import Route
from process_replay.compare import compare_logs
from process_replay.configs import get_config
from process_replay.harness import LogMessage, replay
from repo_paths import REPO_ROOT

T0 = 10**12
TICK = 10_000_000
CFG = get_config("selfdrived")


def timeline(seconds, model_invalid=lambda t: False, dm_level=lambda t: "none"):
  """carState at 100 Hz, the model/DM messages at 20 Hz, calibration at 4 Hz, an engage request at 1 s."""
  out = []
  for tick in range(int(seconds * 100)):
    t = T0 + tick * TICK
    msgs = [new_message("carState", valid=True)]
    if tick % 5 == 0:
      bad = model_invalid(tick / 100)
      for s in ("modelV2", "drivingModelData"):
        msgs.append(new_message(s, valid=not bad))
        if bad:
          msgs[-1].invalidReason = "no calibration received"
      dm = new_message("driverMonitoringState", valid=True)
      dm.driverMonitoringState.alertLevel = dm_level(tick / 100)
      msgs.append(dm)
    if tick % 25 == 0:
      cal = new_message("extrinsicsCalibration", valid=True)
      cal.extrinsicsCalibration.calStatus = "calibrated"
      msgs.append(cal)
    if tick == 100:
      er = new_message("engageRequest", valid=True)
      er.engageRequest.engage = True
      msgs.append(er)
    # carState last: it is selfdrived's trigger, everything else of this tick arrives before it
    msgs = msgs[1:] + msgs[:1]
    out += [LogMessage(t + i, m.which(), m.to_bytes()) for i, m in enumerate(msgs)]
  return out


def run(msgs):
  with Route(os.path.join(REPO_ROOT, "process_replay", "routes", "tici")) as route:
    return replay(CFG, route, messages=msgs)


def test_a_five_second_soft_disable_replays_exactly():
  msgs = timeline(9.0, model_invalid=lambda t: 3.0 <= t < 8.0)
  a, b = run(msgs), run(msgs)
  states = [(log_from_bytes(d).logMonoTime, str(log_from_bytes(d).selfdriveState.state)) for d in a.outputs]
  assert len(states) == 900
  enter = next(t for t, s in states if s == "softDisabling")
  leave = next(t for t, s in states if s == "disabled" and t > enter)
  assert (enter - T0) / 1e9 < 3.02 and leave - enter == 300 * TICK    # 3.00 s of control steps, not of wall time
  assert all(s == "softDisabling" for t, s in states if enter <= t < leave)
  assert compare_logs(a.outputs, b.outputs, CFG.ignore) == []       # and the same bytes run after run


def test_malformed_dm_alert_level_is_unavailable_and_counted_not_fatal():
  msgs = timeline(3.0, dm_level=lambda t: 9 if 2.0 <= t < 2.1 else "none")
  res = run(msgs)
  outs = [log_from_bytes(d) for d in res.outputs]
  assert len(outs) == 300                                            # the process survived every step
  during = [m for m in outs if 2.0 * 1e9 + 5e6 <= m.logMonoTime - T0 < 2.1 * 1e9]
  assert during and all("driverMonitoringUnavailable" in list(m.selfdriveState.events) for m in during)
  assert outs[-1].selfdriveState.malformedInputs == 2                # two 20 Hz messages with level 9
  assert "driverMonitoringUnavailable" not in list(outs[-1].selfdriveState.events)   # good messages again
