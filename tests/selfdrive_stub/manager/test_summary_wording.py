"""The summary's selfdrive lines read as words: a long reason is cut at a word boundary with an ellipsis (the
event log has it whole), and selfdrived's first disabled state is named as the start-up state it is."""
import io

from cereal import messaging
from cereal.messaging import new_message
from selfdrive_stub import manager as mgr
from selfdrive_stub.liveview import ServiceMonitor

LONG_REASON = "driverStateV2 " + " ".join(["frequency out of range"] * 8)


def _summary_of(state: str, events: list[str], dm_reason: str) -> str:
  m = mgr.Manager(mgr.parse_args(["--duration", "10"]), processes=[], out=io.StringIO())
  m.monitor = ServiceMonitor({"selfdriveState": 100.0, "driverMonitoringState": 20.0})
  pm = messaging.PubMaster(["selfdriveState", "driverMonitoringState"], allow_foreign=True)
  try:
    m.monitor.start_window()
    dm = new_message("driverMonitoringState", valid=False)
    dm.invalidReason = dm_reason
    pm.send("driverMonitoringState", dm)
    sd = new_message("selfdriveState", valid=True)
    sd.selfdriveState.state = state
    sd.selfdriveState.events = events
    pm.send("selfdriveState", sd)
    m.monitor.update()
    text, _ = m.summary(10.0, 8.0)
  finally:
    pm.close()
    m.monitor.close()
  return next(line for line in text.splitlines() if "selfdrive at" in line)


def test_a_long_reason_in_the_summary_is_cut_at_a_word_boundary_with_an_ellipsis(namespace):
  line = _summary_of("softDisabling", ["driverMonitoringUnavailable"], LONG_REASON)
  reason = line.split("driverMonitoringUnavailable: ", 1)[1]
  assert reason.endswith("\u2026") and len(reason) <= 100, line
  assert reason[:-1].split()[-1] in ("frequency", "out", "of", "range"), line   # a whole word before the ellipsis


def test_the_first_disabled_state_is_named_the_start_up_state(namespace):
  line = _summary_of("disabled", ["commIssue"], "")
  assert "disabled (the start-up state, before every input arrives)" in line, line
