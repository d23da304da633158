"""dmonitoringd: driverStateV2 (+ car context) → DriverMonitoring policy → driverMonitoringState at 20 Hz.

Invariants:
- The policy (dm_policy.DriverMonitoring) acts on the model output only when the inputs it depends on pass
  SubMaster.all_checks() (alive, on frequency, valid): driverStateV2, extrinsicsCalibration and carState.
- A late, invalid or missing driverStateV2 is "monitoring unavailable": the policy steps with no driver data, so
  awareness falls and alerts rise; it is never treated as an attentive driver. When driverStateV2 stops coming,
  the loop keeps stepping on its own 50 ms clock so the alert escalates even with the model daemon dead.
- selfdriveState (engaged) and modelV2 (brake-disengage probability, pose strictness) are context: when they are
  missing the policy assumes not engaged / lenient strictness, as the reference does before they arrive.
- With REPLAY=1 (process replay, lockstep tests) it steps only on driverStateV2, one step per message, as the
  reference does, so the output is a function of the inputs and not of wall-clock timing.
- One driverMonitoringState per step; SIGINT/SIGTERM exit 0.
"""
import signal
import time

from setproctitle import setproctitle

from cereal.messaging import PubMaster, SubMaster, new_message
from daemons.common.cli import Parser, run_cli
from selfdrive_stub.dm_policy import DT_DMON, DMInputs, DriverData, DriverMonitoring
from selfdrive_stub.env import SELFDRIVE_ENV

PROCESS_NAME = "dmonitoringd"
SERVICES = ["driverStateV2", "extrinsicsCalibration", "carState", "selfdriveState", "modelV2"]
REQUIRED = ["driverStateV2", "extrinsicsCalibration", "carState"]
WRONG_GEARS = ("park", "neutral", "reverse", "unknown")


def context_ok(sm, s: str) -> bool:
  return sm.seen[s] and sm.alive[s] and sm.valid[s]


def car_context(sm) -> dict:
  """Speed, engagement and driver interaction from the context services (defaults when they are missing)."""
  ctx = {"car_speed": 0.0, "enabled": False, "driver_interacting": False, "wrong_gear": False,
         "steering_angle_deg": 0.0, "brake_disengage_prob": 0.0}
  if context_ok(sm, "carState"):
    cs = sm["carState"]
    ctx.update(car_speed=float(cs.vEgo), driver_interacting=bool(cs.steeringPressed or cs.gasPressed),
               wrong_gear=str(cs.gearShifter) in WRONG_GEARS, steering_angle_deg=float(cs.steeringAngleDeg))
  if context_ok(sm, "selfdriveState"):
    ctx["enabled"] = bool(sm["selfdriveState"].enabled)
  if context_ok(sm, "modelV2"):
    probs = list(sm["modelV2"].meta.disengagePredictions.brakeDisengageProbs)
    ctx["brake_disengage_prob"] = float(probs[0]) if probs else 0.0
  return ctx


def policy_inputs(sm) -> DMInputs:
  ds = sm["driverStateV2"]
  rpy = list(sm["extrinsicsCalibration"].rpyCalib)
  return DMInputs(left=DriverData.from_reader(ds.leftDriverData), right=DriverData.from_reader(ds.rightDriverData),
                  wheel_on_right_prob=float(ds.wheelOnRightProb),
                  cal_rpy=tuple(rpy) if len(rpy) == 3 else (0.0, 0.0, 0.0), **car_context(sm))


def fill_state(builder, values: dict) -> None:
  """Copy the policy's nested state dict into a capnp builder (enums as their names)."""
  for key, value in values.items():
    if isinstance(value, dict):
      fill_state(getattr(builder, key), value)
    else:
      setattr(builder, key, value)


def state_message(dm: DriverMonitoring, valid: bool, reason: str):
  msg = new_message("driverMonitoringState", valid=valid)
  if not valid:
    msg.invalidReason = reason
  fill_state(msg.driverMonitoringState, dm.state())
  return msg


def step(dm: DriverMonitoring, sm, fresh: bool) -> tuple[bool, str]:
  """One policy step. `fresh`: a driverStateV2 arrived since the last step. Returns (inputs ok, why not)."""
  failures = sm.failures(REQUIRED)
  if fresh and not failures:
    dm.run_step(policy_inputs(sm))
    return True, ""
  ctx = car_context(sm)
  dm.run_step(None, enabled=ctx["enabled"], car_speed=ctx["car_speed"] if context_ok(sm, "carState") else None,
              wrong_gear=ctx["wrong_gear"])
  return False, "; ".join(failures) or "driverStateV2 late"


def main(argv=None) -> int:
  ap = Parser(prog="python -m selfdrive_stub.dmonitoringd", description=__doc__.splitlines()[0])
  ap.add_argument("--always-on", action="store_true", help="monitor while not engaged (openpilot's AlwaysOnDM)")
  ap.add_argument("--rhd", action="store_true", help="start as right-hand drive (openpilot's IsRhdDetected)")
  args = ap.parse_args(argv)
  setproctitle(PROCESS_NAME)
  stop = []
  for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, lambda *_: stop.append(True))

  pm = PubMaster(["driverMonitoringState"], process=PROCESS_NAME)
  sm = SubMaster(SERVICES, poll="driverStateV2")
  dm = DriverMonitoring(rhd_saved=args.rhd, always_on=args.always_on)
  own_clock = SELFDRIVE_ENV.get("REPLAY", "0") != "1"
  next_due = time.monotonic() + DT_DMON
  try:
    while not stop:
      sm.update(max(1, int((next_due - time.monotonic()) * 1000)))
      now = time.monotonic()
      fresh = sm.updated["driverStateV2"]
      if not fresh and (now < next_due or not own_clock):
        continue
      # a fresh model output steps at once; without one the loop steps on its own 50 ms clock, so awareness
      # keeps falling while the model is late or gone
      next_due = now + (DT_DMON * 1.5 if fresh else DT_DMON)
      ok, reason = step(dm, sm, fresh)
      pm.send("driverMonitoringState", state_message(dm, ok, reason))
  finally:
    pm.close()
    sm.close()
  return 0


if __name__ == "__main__":
  run_cli(PROCESS_NAME, main)
