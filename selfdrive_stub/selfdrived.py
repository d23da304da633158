"""selfdrived stub: the engagement gate in front of the model outputs.

    python -m selfdrive_stub.selfdrived

States: disabled -> enabled -> softDisabling -> disabled (openpilot's state machine, reduced to what the gate
needs). Invariants:
- an engage request is accepted only when no NO_ENTRY event is active; every input (modelV2, drivingModelData,
  driverMonitoringState, extrinsicsCalibration, carState) must pass SubMaster.all_checks() (alive, on time,
  valid), calibration must be complete, DM must not be in alert three or lockout, the big model must not be
  loading. A late, invalid or missing model output is never treated as "path OK";
- while enabled, any SOFT_DISABLE event moves to softDisabling; if the events clear within SOFT_DISABLE_TIME the
  state returns to enabled, otherwise it becomes disabled; a disengage request always disables at once;
- `SelfdriveStateMachine` is pure (events and an injected clock in, state out); `collect_events` reads a
  SubMaster-like object (alive/freq_ok/valid dicts, invalid_reason(), item access).
"""
import signal
import time
from dataclasses import dataclass, field
from cereal import messaging
from daemons.common.cli import Parser, run_cli

NO_ENTRY, SOFT_DISABLE, WARNING = "noEntry", "softDisable", "warning"
SOFT_DISABLE_TIME = 3.0   # s

# event name -> the types it carries
EVENT_TYPES = {
  "modeldLagging": {NO_ENTRY, SOFT_DISABLE},
  "modelInvalid": {NO_ENTRY, SOFT_DISABLE},
  "driverMonitoringUnavailable": {NO_ENTRY, SOFT_DISABLE},
  "calibrationIncomplete": {NO_ENTRY, SOFT_DISABLE},
  "calibrationInvalid": {NO_ENTRY, SOFT_DISABLE},
  "commIssue": {NO_ENTRY, SOFT_DISABLE},
  "bigModelLoading": {NO_ENTRY},
  "bigModelFailed": {WARNING},          # the switch itself makes the next frames invalid (modelInvalid)
  "driverDistracted1": {WARNING},
  "driverDistracted2": {WARNING},
  "driverDistracted3": {NO_ENTRY, SOFT_DISABLE},
  "driverMonitoringLockout": {NO_ENTRY, SOFT_DISABLE},
}
MODEL_SERVICES = ("modelV2", "drivingModelData")
GATED_SERVICES = ("modelV2", "drivingModelData", "driverMonitoringState", "extrinsicsCalibration", "carState")
BIG_MODEL_LOADING = "big model loading"   # modeld's invalidReason while the big model loads


def _ok(sm, s: str) -> bool:
  return bool(sm.alive[s] and sm.freq_ok[s])


def _invalid_causes(reason: str) -> list[str]:
  """The separate causes in an invalidReason ("a; b"); an invalid message without a reason still counts."""
  return [p.strip() for p in reason.split(";") if p.strip()] or ["invalid"]


def collect_events(sm) -> list[str]:
  """Names of the events active for the current SubMaster state (order: most severe cause first)."""
  events = []
  if not all(_ok(sm, s) for s in MODEL_SERVICES):
    events.append("modeldLagging")
  else:
    causes = [c for s in MODEL_SERVICES if not sm.valid[s] for c in _invalid_causes(sm.invalid_reason(s))]
    if BIG_MODEL_LOADING in causes:
      events.append("bigModelLoading")
    if any(c != BIG_MODEL_LOADING for c in causes):
      events.append("modelInvalid")
    if sm["modelV2"].frameDropPerc > 20.0:
      events.append("modeldLagging")
    if sm["modelV2"].fallbackReason:
      events.append("bigModelFailed")
  if not (_ok(sm, "driverMonitoringState") and sm.valid["driverMonitoringState"]):
    events.append("driverMonitoringUnavailable")
  else:
    dm = sm["driverMonitoringState"]
    level = str(dm.alertLevel)
    if level in ("one", "two", "three"):
      events.append({"one": "driverDistracted1", "two": "driverDistracted2", "three": "driverDistracted3"}[level])
    if dm.lockout:
      events.append("driverMonitoringLockout")
  if not (_ok(sm, "extrinsicsCalibration") and sm.valid["extrinsicsCalibration"]):
    events.append("calibrationInvalid")
  else:
    status = str(sm["extrinsicsCalibration"].calStatus)
    if status == "invalid":
      events.append("calibrationInvalid")
    elif status != "calibrated":
      events.append("calibrationIncomplete")
  if not (_ok(sm, "carState") and sm.valid["carState"]):
    events.append("commIssue")
  return list(dict.fromkeys(events))


@dataclass
class SelfdriveOutput:
  state: str
  enabled: bool
  engageable: bool
  events: list = field(default_factory=list)
  alert: str = ""


class SelfdriveStateMachine:
  def __init__(self):
    self.state = "disabled"
    self.soft_disable_until = 0.0
    self.last_refusal: list[str] = []

  def update(self, now: float, events: list[str], engage_request: bool | None = None) -> SelfdriveOutput:
    """One step. engage_request: True = the driver asks to engage, False = to disengage, None = no request."""
    unknown = [e for e in events if e not in EVENT_TYPES]
    if unknown:
      raise ValueError(f"unknown selfdrived events {unknown}; known: {sorted(EVENT_TYPES)}")
    no_entry = [e for e in events if NO_ENTRY in EVENT_TYPES[e]]
    soft = [e for e in events if SOFT_DISABLE in EVENT_TYPES[e]]
    alert = ""
    if engage_request is False and self.state != "disabled":
      self.state, alert = "disabled", "disengaged by the driver"
    elif self.state == "disabled":
      if engage_request:
        if no_entry:
          self.last_refusal = no_entry
          alert = "engagement refused: " + ", ".join(no_entry)
        else:
          self.state, alert = "enabled", "engaged"
    elif self.state == "enabled":
      if soft:
        self.state, self.soft_disable_until = "softDisabling", now + SOFT_DISABLE_TIME
        alert = "take control: " + ", ".join(soft)
    elif self.state == "softDisabling":
      if not soft:
        self.state, alert = "enabled", "recovered"
      elif now >= self.soft_disable_until:
        self.state, alert = "disabled", "disengaged: " + ", ".join(soft)
      else:
        alert = "take control: " + ", ".join(soft)
    return SelfdriveOutput(self.state, self.state in ("enabled", "softDisabling"), not no_entry, list(events), alert)


def fill_selfdrive_state(msg, out: SelfdriveOutput) -> None:
  s = msg.selfdriveState
  s.state, s.enabled, s.active, s.engageable = out.state, out.enabled, out.enabled, out.engageable
  s.events = out.events
  s.alertText1 = out.alert
  s.alertText2 = ", ".join(out.events)
  severe = any(SOFT_DISABLE in EVENT_TYPES[e] for e in out.events) and out.enabled
  s.alertStatus = "critical" if severe else "userPrompt" if out.events else "normal"
  s.alertSize = "full" if severe else "small" if out.events else "none"


def main(argv=None) -> None:
  import setproctitle
  parser = Parser(prog="python -m selfdrive_stub.selfdrived",
                  description="selfdrived stub: engagement gate on modelV2/DM/calibration/car inputs")
  parser.parse_args(argv)
  setproctitle.setproctitle("selfdrived")
  stop = []
  signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
  signal.signal(signal.SIGINT, lambda *_: stop.append(1))
  sm = messaging.SubMaster(list(GATED_SERVICES) + ["engageRequest"], poll="carState")
  pm = messaging.PubMaster(["selfdriveState"], process="selfdrived")
  machine = SelfdriveStateMachine()
  while not stop:
    sm.update(100)
    request = sm["engageRequest"].engage if sm.updated["engageRequest"] else None
    if request is False and machine.state == "disabled":
      request = None
    out = machine.update(time.monotonic(), collect_events(sm), request)
    msg = messaging.new_message("selfdriveState")
    fill_selfdrive_state(msg, out)
    pm.send("selfdriveState", msg)


if __name__ == "__main__":
  run_cli("selfdrived", main)
