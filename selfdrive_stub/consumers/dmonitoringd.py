"""dmonitoringd: driverStateV2 (+ car context) → DriverMonitoring policy → driverMonitoringState at 20 Hz.

Invariants:
- The policy (dm_policy.DriverMonitoring) acts on the model output only when the inputs it depends on pass
  SubMaster.all_checks() (alive, on frequency, valid): driverStateV2, extrinsicsCalibration and carState.
- A late, invalid, missing or malformed driverStateV2 is "monitoring unavailable": the policy steps with no
  driver data, so awareness falls and alerts rise; it is never treated as an attentive driver. Malformed means
  capnp-valid but unusable (a short faceOrientation, NaN or Inf anywhere, a probability outside [0, 1]); the
  same holds for a malformed carState or calibration. Each malformed step is counted in `malformedInputs`,
  published valid=False with the reason, and the process keeps running with its state (a crash would restart
  it with full awareness).
- When driverStateV2 stops coming, the loop keeps stepping on its own 50 ms clock so the alert escalates even
  with the model daemon dead.
- selfdriveState (engaged) and modelV2 (brake-disengage probability, pose strictness) are context: when they are
  missing or malformed the policy assumes not engaged / lenient strictness, as the reference does before they
  arrive.
- With REPLAY=1 (process replay, lockstep tests) it steps only on driverStateV2, one step per message, as the
  reference does, so the output is a function of the inputs and not of wall-clock timing.
- One driverMonitoringState per step; SIGINT/SIGTERM exit 0.
"""
import math
import time

from setproctitle import setproctitle

from cereal.messaging import PubMaster, SubMaster, new_message
from common.cli import Parser, run_cli, stop_on_signals
from selfdrive_stub.consumers.dm_policy import DT_DMON, DMInputs, DriverData, DriverMonitoring, MalformedInput
from selfdrive_stub.env import SELFDRIVE_ENV

PROCESS_NAME = "dmonitoringd"
SERVICES = ["driverStateV2", "extrinsicsCalibration", "carState", "selfdriveState", "modelV2"]
REQUIRED = ["driverStateV2", "extrinsicsCalibration", "carState"]
MONITORED_GEARS = ("drive", "low")   # openpilot's: every other gear is the wrong gear for always-on monitoring


def context_ok(sm, s: str) -> bool:
  return sm.seen[s] and sm.alive[s] and sm.valid[s]


def _finite(name: str, v) -> float:
  v = float(v)
  if not math.isfinite(v):
    raise MalformedInput(f"{name} is {v}")
  return v


def _gear(cs) -> str:
  try:
    return str(cs.gearShifter)
  except RuntimeError:   # an ordinal the schema does not know
    raise MalformedInput(f"carState.gearShifter {cs.gearShifter.raw} is not a gear") from None


def car_context(sm) -> tuple[dict, str]:
  """Speed, engagement and driver interaction from the context services (defaults when they are missing),
  and why carState could not be used ("" if it could). A malformed modelV2 counts as missing context."""
  ctx = {"car_speed": 0.0, "enabled": False, "driver_interacting": False, "wrong_gear": False,
         "steering_angle_deg": 0.0, "brake_disengage_prob": 0.0, "standstill": False}
  problem = ""
  if context_ok(sm, "carState"):
    cs = sm["carState"]
    try:
      ctx.update(car_speed=_finite("carState.vEgo", cs.vEgo),
                 steering_angle_deg=_finite("carState.steeringAngleDeg", cs.steeringAngleDeg),
                 driver_interacting=bool(cs.steeringPressed or cs.gasPressed), standstill=bool(cs.standstill),
                 wrong_gear=_gear(cs) not in MONITORED_GEARS)
    except MalformedInput as e:
      problem = str(e)
  if context_ok(sm, "selfdriveState"):
    ctx["enabled"] = bool(sm["selfdriveState"].enabled)
  if context_ok(sm, "modelV2"):
    probs = list(sm["modelV2"].meta.disengagePredictions.brakeDisengageProbs)
    if probs and math.isfinite(probs[0]):
      ctx["brake_disengage_prob"] = min(max(float(probs[0]), 0.0), 1.0)
  return ctx, problem


def policy_inputs(sm) -> DMInputs:
  """The policy's inputs from the bus; MalformedInput names the first value it cannot use."""
  ds = sm["driverStateV2"]
  ctx, problem = car_context(sm)
  if problem:
    raise MalformedInput(problem)
  rpy = [_finite(f"extrinsicsCalibration.rpyCalib[{i}]", v) for i, v in enumerate(sm["extrinsicsCalibration"].rpyCalib)]
  if len(rpy) != 3:
    raise MalformedInput(f"extrinsicsCalibration.rpyCalib has {len(rpy)} values, needs 3")
  wheel = _finite("driverStateV2.wheelOnRightProb", ds.wheelOnRightProb)
  return DMInputs(left=DriverData.from_reader(ds.leftDriverData, "leftDriverData"),
                  right=DriverData.from_reader(ds.rightDriverData, "rightDriverData"),
                  wheel_on_right_prob=wheel, cal_rpy=tuple(rpy), **ctx)


def fill_state(builder, values: dict) -> None:
  """Copy the policy's nested state dict into a capnp builder (enums as their names)."""
  for key, value in values.items():
    if isinstance(value, dict):
      fill_state(getattr(builder, key), value)
    else:
      setattr(builder, key, value)


def state_message(dm: DriverMonitoring, valid: bool, reason: str, malformed: int = 0):
  msg = new_message("driverMonitoringState", valid=valid)
  if not valid:
    msg.invalidReason = reason
  fill_state(msg.driverMonitoringState, dm.state())
  msg.driverMonitoringState.malformedInputs = malformed
  return msg


class Monitor:
  """dmonitoringd's per-step logic over a SubMaster-like object: gating, malformed-input handling, counting."""

  def __init__(self, dm: DriverMonitoring):
    self.dm = dm
    self.malformed = 0
    self._decode_errors = 0

  def undecodable(self, sm) -> bool:
    """A driverStateV2 arrived but failed to decode (SubMaster counted and dropped it) since the last check."""
    errors = sm.malformed["driverStateV2"]
    new, self._decode_errors = errors > self._decode_errors, errors
    return new

  def step(self, sm, fresh: bool, undecodable: bool = False) -> tuple[bool, str]:
    """One policy step. `fresh`: a driverStateV2 arrived since the last step; `undecodable`: one arrived that
    could not be decoded (it counts as malformed). Returns (inputs ok, why not)."""
    if undecodable and not sm.updated["driverStateV2"]:
      self.malformed += 1
      self._unavailable(sm)
      return False, f"malformed input: driverStateV2 did not decode ({sm.decode_error['driverStateV2']})"
    failures = sm.failures(REQUIRED)
    if fresh and not failures:
      try:
        x = policy_inputs(sm)
      except MalformedInput as e:
        self.malformed += 1
        self._unavailable(sm)
        return False, f"malformed input: {e}"
      self.dm.run_step(x)
      return True, ""
    self._unavailable(sm)
    return False, "; ".join(failures) or "driverStateV2 late"

  def _unavailable(self, sm) -> None:
    ctx, _ = car_context(sm)   # a malformed carState leaves the strict defaults: moving, no interaction
    self.dm.run_step(None, enabled=ctx["enabled"], standstill=ctx["standstill"], wrong_gear=ctx["wrong_gear"],
                     driver_interacting=ctx["driver_interacting"])

  def message(self, ok: bool, reason: str):
    return state_message(self.dm, ok, reason, self.malformed)


def main(argv=None) -> int:
  ap = Parser(prog="python -m selfdrive_stub.consumers.dmonitoringd", description=__doc__.splitlines()[0])
  ap.add_argument("--always-on", action="store_true", help="monitor while not engaged (openpilot's AlwaysOnDM)")
  ap.add_argument("--rhd", action="store_true", help="start as right-hand drive (openpilot's IsRhdDetected)")
  args = ap.parse_args(argv)
  setproctitle(PROCESS_NAME)
  stop = stop_on_signals()

  pm = PubMaster(["driverMonitoringState"], process=PROCESS_NAME)
  sm = SubMaster(SERVICES, poll="driverStateV2")
  monitor = Monitor(DriverMonitoring(rhd_saved=args.rhd, always_on=args.always_on))
  own_clock = not SELFDRIVE_ENV.flag("REPLAY")
  next_due = time.monotonic() + DT_DMON
  try:
    while not stop.is_set():
      sm.update(max(1, int((next_due - time.monotonic()) * 1000)))
      now = time.monotonic()
      undecodable = monitor.undecodable(sm)
      fresh = sm.updated["driverStateV2"] or undecodable
      if not fresh and (now < next_due or not own_clock):
        continue
      # a fresh model output steps at once; without one the loop steps on its own 50 ms clock, so awareness
      # keeps falling while the model is late or gone
      next_due = now + (DT_DMON * 1.5 if fresh else DT_DMON)
      ok, reason = monitor.step(sm, sm.updated["driverStateV2"], undecodable)
      pm.send("driverMonitoringState", monitor.message(ok, reason))
  finally:
    pm.close()
    sm.close()
  return 0


if __name__ == "__main__":
  run_cli(PROCESS_NAME, main)
