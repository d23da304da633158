"""selfdrived stub: the engagement gate in front of the model outputs.

    python -m selfdrive_stub.consumers.selfdrived

States: disabled -> enabled -> softDisabling -> disabled (openpilot's state machine, reduced to what the gate
needs). Invariants:
- an engage request is accepted only when no NO_ENTRY event is active; every input (modelV2, drivingModelData,
  driverMonitoringState, extrinsicsCalibration, carState) must pass SubMaster.all_checks() (alive, on time,
  valid) and be well formed, calibration must be complete, DM must not be in alert three or lockout. A late,
  invalid, missing or malformed input is never treated as "path OK";
- time is control steps, not the wall clock: one step per carState (100 Hz, DT_CTRL). While enabled, any
  SOFT_DISABLE event moves to softDisabling; if the events clear within SOFT_DISABLE_TIME (300 steps) the state
  returns to enabled, otherwise it becomes disabled; a disengage request always disables at once. A replay
  therefore ends a soft disable at the same step however fast it runs. Live, a loop iteration that comes late
  (carState gone) counts the steps the wall clock says it missed, so a dead car interface cannot stretch it;
- the USB GPU (openpilot 2026, from modeld's usbGpuState): while it is plugged and the big model is loading,
  engagement waits (bigModelLoading); a big-model failure while engaged soft-disengages (bigModelLost, held
  until disabled); the next engagement drives on the small model (bigModelFailed is then only a warning).
  Deliberate difference: our modeld re-runs the failing frame on the small model (no lost frame, see
  daemons/modeld/README.md), so only the small model's history refill makes the next frames invalid; the soft
  disengage is kept anyway, because the driver must know the stronger model is gone;
- a malformed input (non-finite value, unknown enum ordinal) counts as invalid for its service, is counted in
  `malformedInputs`, and never stops the process;
- `SelfdriveStateMachine` is pure (events and step counts in, state out); `collect_events` reads a
  SubMaster-like object (alive/freq_ok/valid dicts, invalid_reason(), item access).
"""
import math
import time
from dataclasses import dataclass, field

from cereal import messaging
from common.cli import Parser, run_cli, stop_on_signals
from selfdrive_stub.env import SELFDRIVE_ENV

NO_ENTRY, SOFT_DISABLE, WARNING = "noEntry", "softDisable", "warning"
DT_CTRL = 0.01            # s per control step (carState rate)
SOFT_DISABLE_TIME = 3.0   # s
SOFT_DISABLE_STEPS = int(round(SOFT_DISABLE_TIME / DT_CTRL))
MAX_CATCH_UP_STEPS = 100  # live: at most 1 s of missed steps counted for one late iteration

# event name -> the types it carries
EVENT_TYPES = {
  "modeldLagging": {NO_ENTRY, SOFT_DISABLE},
  "modelInvalid": {NO_ENTRY, SOFT_DISABLE},
  "driverMonitoringUnavailable": {NO_ENTRY, SOFT_DISABLE},
  "calibrationIncomplete": {NO_ENTRY, SOFT_DISABLE},
  "calibrationInvalid": {NO_ENTRY, SOFT_DISABLE},
  "commIssue": {NO_ENTRY, SOFT_DISABLE},
  "bigModelLoading": {NO_ENTRY},
  "bigModelFailed": {WARNING},             # driving on the small model
  "bigModelLost": {SOFT_DISABLE},          # the big model failed during this engagement
  "driverDistracted1": {WARNING},
  "driverDistracted2": {WARNING},
  "driverDistracted3": {NO_ENTRY, SOFT_DISABLE},
  "driverUnresponsive1": {WARNING},
  "driverUnresponsive2": {WARNING},
  "driverUnresponsive3": {NO_ENTRY, SOFT_DISABLE},
  "driverMonitoringLockout": {NO_ENTRY, SOFT_DISABLE},
}
MODEL_SERVICES = ("modelV2", "drivingModelData")
GATED_SERVICES = ("modelV2", "drivingModelData", "driverMonitoringState", "extrinsicsCalibration", "carState")
CONTEXT_SERVICES = ("usbGpuState",)
BIG_MODEL_LOADING = "big model loading"   # modeld's invalidReason while the big model loads
DM_LEVELS = {"one": 1, "two": 2, "three": 3}


def enum_name(value) -> str | None:
  """The enumerant's name, or None for an ordinal the schema does not know (capnp-valid, but unusable)."""
  try:
    return str(value)
  except RuntimeError:
    return None


def _ok(sm, s: str) -> bool:
  return bool(sm.alive[s] and sm.freq_ok[s])


def _invalid_causes(reason: str) -> list[str]:
  """The separate causes in an invalidReason ("a; b"); an invalid message without a reason still counts."""
  return [p.strip() for p in reason.split(";") if p.strip()] or ["invalid"]


def malformed_services(sm) -> list[str]:
  """The gated services whose current message is capnp-valid but unusable (checked where the gate reads it)."""
  bad = []
  if sm.seen["modelV2"] and not math.isfinite(sm["modelV2"].frameDropPerc):
    bad.append("modelV2")
  dm = sm["driverMonitoringState"]
  if sm.seen["driverMonitoringState"] and (enum_name(dm.alertLevel) is None or enum_name(dm.activePolicy) is None):
    bad.append("driverMonitoringState")
  if sm.seen["extrinsicsCalibration"] and enum_name(sm["extrinsicsCalibration"].calStatus) is None:
    bad.append("extrinsicsCalibration")
  cs = sm["carState"]
  if sm.seen["carState"] and not (math.isfinite(cs.vEgo) and math.isfinite(cs.steeringAngleDeg)):
    bad.append("carState")
  return bad


class InputGuard:
  """Which gated services are malformed now: the newest message failed to decode (SubMaster counts and drops
  it, so the previous message would otherwise be used as if current) or decoded to unusable values. Counts
  every such message once."""

  def __init__(self):
    self.count = 0
    self._undecodable: dict[str, bool] = {}
    self._seen_errors: dict[str, int] = {}

  def update(self, sm) -> list[str]:
    for s in GATED_SERVICES:
      errors = sm.malformed[s]
      if errors > self._seen_errors.get(s, 0):
        self.count += errors - self._seen_errors.get(s, 0)
        self._seen_errors[s], self._undecodable[s] = errors, True
      elif sm.updated[s]:
        self._undecodable[s] = False
    bad = malformed_services(sm)
    self.count += sum(1 for s in bad if sm.updated[s])
    return sorted(set(bad) | {s for s, b in self._undecodable.items() if b})


def collect_events(sm, malformed=()) -> list[str]:
  """Names of the events active for the current SubMaster state (order: most severe cause first).
  `malformed`: services whose message is unusable (malformed_services), judged as invalid."""
  events = []
  if not all(_ok(sm, s) for s in MODEL_SERVICES):
    events.append("modeldLagging")
  elif "modelV2" in malformed:
    events.append("modelInvalid")
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
  if "usbGpuState" in sm.seen and sm.seen["usbGpuState"] and sm.alive["usbGpuState"] and sm.valid["usbGpuState"]:
    gpu = sm["usbGpuState"]
    state = enum_name(gpu.state)
    if gpu.plugged and state == "loading":
      events.append("bigModelLoading")
    elif state == "failed":
      events.append("bigModelFailed")
  if not (_ok(sm, "driverMonitoringState") and sm.valid["driverMonitoringState"]) or "driverMonitoringState" in malformed:
    events.append("driverMonitoringUnavailable")
  else:
    dm = sm["driverMonitoringState"]
    level = DM_LEVELS.get(enum_name(dm.alertLevel), 0)
    if level:
      kind = "driverDistracted" if enum_name(dm.activePolicy) == "vision" else "driverUnresponsive"
      events.append(f"{kind}{level}")
    if dm.lockout:
      events.append("driverMonitoringLockout")
  if not (_ok(sm, "extrinsicsCalibration") and sm.valid["extrinsicsCalibration"]) or "extrinsicsCalibration" in malformed:
    events.append("calibrationInvalid")
  else:
    status = enum_name(sm["extrinsicsCalibration"].calStatus)
    if status == "invalid":
      events.append("calibrationInvalid")
    elif status != "calibrated":
      events.append("calibrationIncomplete")
  if not (_ok(sm, "carState") and sm.valid["carState"]) or "carState" in malformed:
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
    self.soft_disable_timer = 0      # control steps left before a soft disable disengages
    self.big_model_lost = False      # the big model failed during the current engagement
    self._big_failed_before = False
    self.last_refusal: list[str] = []

  def update(self, events: list[str], engage_request: bool | None = None, steps: int = 1) -> SelfdriveOutput:
    """One control step (or `steps` of them, for a late live iteration). engage_request: True = the driver
    asks to engage, False = to disengage, None = no request."""
    unknown = [e for e in events if e not in EVENT_TYPES]
    if unknown:
      raise ValueError(f"unknown selfdrived events {unknown}; known: {sorted(EVENT_TYPES)}")
    big_failed = "bigModelFailed" in events
    if big_failed and not self._big_failed_before and self.state != "disabled":
      self.big_model_lost = True
    self._big_failed_before = big_failed
    if self.big_model_lost:
      events = [*events, "bigModelLost"]
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
        self.state, self.soft_disable_timer = "softDisabling", SOFT_DISABLE_STEPS
        alert = "take control: " + ", ".join(soft)
    elif self.state == "softDisabling":
      self.soft_disable_timer -= steps
      if not soft:
        self.state, alert = "enabled", "recovered"
      elif self.soft_disable_timer <= 0:
        self.state, alert = "disabled", "disengaged: " + ", ".join(soft)
      else:
        alert = "take control: " + ", ".join(soft)
    if self.state == "disabled":
      self.big_model_lost = False   # the next engagement drives on the small model
    return SelfdriveOutput(self.state, self.state in ("enabled", "softDisabling"), not no_entry, list(events), alert)


def fill_selfdrive_state(msg, out: SelfdriveOutput, malformed: int = 0) -> None:
  s = msg.selfdriveState
  s.state, s.enabled, s.active, s.engageable = out.state, out.enabled, out.enabled, out.engageable
  s.events = out.events
  s.alertText1 = out.alert
  s.alertText2 = ", ".join(out.events)
  severe = any(SOFT_DISABLE in EVENT_TYPES[e] for e in out.events) and out.enabled
  s.alertStatus = "critical" if severe else "userPrompt" if out.events else "normal"
  s.alertSize = "full" if severe else "small" if out.events else "none"
  s.malformedInputs = malformed


def main(argv=None) -> None:
  import setproctitle
  parser = Parser(prog="python -m selfdrive_stub.consumers.selfdrived",
                  description="selfdrived stub: engagement gate on modelV2/DM/calibration/car inputs")
  parser.parse_args(argv)
  setproctitle.setproctitle("selfdrived")
  stop = stop_on_signals()
  sm = messaging.SubMaster(list(GATED_SERVICES) + list(CONTEXT_SERVICES) + ["engageRequest"], poll="carState")
  pm = messaging.PubMaster(["selfdriveState"], process="selfdrived")
  machine = SelfdriveStateMachine()
  replay = SELFDRIVE_ENV.flag("REPLAY")
  guard = InputGuard()
  last = time.monotonic()
  try:
    while not stop.is_set():
      sm.update(100)
      now = time.monotonic()
      # replay: exactly one step per carState; live: the steps the clock says passed (usually one)
      steps = 1 if replay else min(max(1, int(round((now - last) / DT_CTRL))), MAX_CATCH_UP_STEPS)
      last = now
      request = sm["engageRequest"].engage if sm.updated["engageRequest"] else None
      if request is False and machine.state == "disabled":
        request = None
      out = machine.update(collect_events(sm, guard.update(sm)), request, steps)
      msg = messaging.new_message("selfdriveState")
      fill_selfdrive_state(msg, out, guard.count)
      pm.send("selfdriveState", msg)
  finally:
    pm.close()
    sm.close()


if __name__ == "__main__":
  run_cli("selfdrived", main)
