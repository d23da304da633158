"""Car stub (process "car"): a deterministic simulated drive on the bus.

Publishes carState and carControl at 100 Hz, deviceState at 2 Hz, extrinsicsCalibration at 4 Hz, lateralDelay
and engageRequest at 1 Hz.

Invariants:
- Everything published is a pure function of (seed, tick): tick n is simulated time n * 10 ms, so two runs with
  the same seed publish the same values (only logMonoTime and carControl's echo of selfdriveState differ).
- Pacing is a fixed monotonic schedule (tick n is due at start + n * 10 ms): no drift; a late loop does not sleep.
- Calibration follows openpilot's calibrationd bookkeeping (BLOCK_SIZE 100 inputs per block, INPUTS_NEEDED 5
  blocks to be calibrated, INPUTS_WANTED 50): uncalibrated with a growing calPerc, then calibrated; the inputs
  arrive at a simulated rate so calibration completes after `cal_seconds`.
- engageRequest says engage=False until `engage_after` seconds, then engage=True (selfdrived decides).
- Scenarios script the driver on top of the drive: `lane-change` cruises from the start with lateral control
  active (carControl.latActive, as when engaged), turns the left blinker on at LANE_CHANGE_AT, nudges the wheel
  left half a second later (steeringPressed, steeringTorque > 0) and hands lateral control back at
  LANE_CHANGE_HANDBACK; its blind spots stay clear. The default scenario has no nudges and no lateral control
  unless selfdrived engages.
"""
from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

import numpy as np
from cereal import messaging
from cereal.messaging import new_message
from common.cli import Parser, run_cli, stop_on_signals

DT_CTRL = 0.01
CAR_HZ, CALIB_EVERY, DEVICE_EVERY, SLOW_EVERY = 100, 25, 50, 100   # 100 Hz; 4 Hz; 2 Hz; 1 Hz in ticks

# openpilot calibrationd bookkeeping
BLOCK_SIZE = 100
INPUTS_NEEDED = 5
INPUTS_WANTED = 50
CAMERA_HEIGHT_M = 1.22
LATERAL_DELAY_S = 0.2

CRUISE_SPEED = 27.0    # m/s
BLINK_SECONDS = 3.0
SCENARIOS = ("default", "lane-change")
LANE_CHANGE_AT = 2.0        # s: left blinker on (scenario lane-change)
NUDGE_DELAY, NUDGE_SECONDS, NUDGE_TORQUE = 0.5, 0.5, 1.5   # the driver's push on the wheel toward the blinker
LAT_ACTIVE_FROM = 0.5       # s: lateral control active from here (scenario lane-change) ...
LANE_CHANGE_HANDBACK = 6.0  # ... until here


@dataclass(frozen=True)
class CarSnapshot:
  t: float
  v_ego: float
  a_ego: float
  steering_angle_deg: float
  steering_rate_deg: float
  yaw_rate: float
  left_blinker: bool
  right_blinker: bool
  steering_pressed: bool = False
  steering_torque: float = 0.0
  lat_active: bool | None = None     # scripted lateral control; None: follows the engagement


def _euler_to_rot(rpy) -> np.ndarray:
  roll, pitch, yaw = rpy
  cr, sr, cp, sp, cy, sy = math.cos(roll), math.sin(roll), math.cos(pitch), math.sin(pitch), math.cos(yaw), math.sin(yaw)
  rx = np.array([[1, 0, 0], [0, cr, -sr], [0, sr, cr]])
  ry = np.array([[cp, 0, sp], [0, 1, 0], [-sp, 0, cp]])
  rz = np.array([[cy, -sy, 0], [sy, cy, 0], [0, 0, 1]])
  return rz @ ry @ rx


# device frame (x forward, y right, z down) -> view frame (x right, y down, z forward)
VIEW_FROM_DEVICE = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])


class DriveModel:
  """The simulated drive: speed profile, steering and blinker schedule, all pure functions of time."""

  def __init__(self, seed: int = 0, cal_seconds: float = 4.0, scenario: str = "default"):
    if cal_seconds <= 0:
      raise ValueError(f"cal_seconds must be > 0, got {cal_seconds!r}")
    if scenario not in SCENARIOS:
      raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
    rng = np.random.default_rng(seed)
    self.seed = seed
    self.scenario = scenario
    self.cal_seconds = cal_seconds
    self.true_rpy = np.array([0.0, rng.uniform(-0.03, 0.03), rng.uniform(-0.03, 0.03)])
    self._speed_waves = [(rng.uniform(1.0, 2.5), rng.uniform(12, 25), rng.uniform(0, 2 * math.pi)) for _ in range(2)]
    self._steer_waves = [(rng.uniform(2.0, 6.0), rng.uniform(15, 40), rng.uniform(0, 2 * math.pi)) for _ in range(2)]
    # blinker episodes: (start, side); the first a few seconds in, then every 10-20 s
    episodes, t = [], rng.uniform(5.0, 8.0)
    while t < 3600:
      episodes.append((t, "left" if rng.random() < 0.5 else "right"))
      t += rng.uniform(10.0, 20.0)
    self.blinker_episodes = [(LANE_CHANGE_AT, "left")] if scenario == "lane-change" else episodes
    self._cal_noise = rng.normal(0, 1, (INPUTS_WANTED + 1, 3))

  def speed(self, t: float) -> float:
    if self.scenario == "lane-change":
      ramp = 1.0                             # already cruising: a lane change needs 20 mph
    else:
      ramp = 0.0 if t < 1.0 else min((t - 1.0) / 15.0, 1.0)
      ramp = ramp * ramp * (3 - 2 * ramp)    # smoothstep from standstill to cruise
    wave = sum(a * math.sin(2 * math.pi * t / p + ph) for a, p, ph in self._speed_waves)
    return max(ramp * (CRUISE_SPEED + wave), 0.0)

  def steering_angle(self, t: float) -> float:
    angle = sum(a * math.sin(2 * math.pi * t / p + ph) for a, p, ph in self._steer_waves)
    side = self.blinker(t)
    if side is not None:   # a lane change: a smooth steering bump toward the blinker side
      start = next(s for s, _ in reversed(self.blinker_episodes) if s <= t)
      bump = 4.0 * math.sin(math.pi * (t - start) / BLINK_SECONDS)
      angle += bump if side == "left" else -bump
    return angle

  def blinker(self, t: float) -> str | None:
    for start, side in self.blinker_episodes:
      if start > t:
        return None
      if t < start + BLINK_SECONDS:
        return side
    return None

  def snapshot(self, t: float) -> CarSnapshot:
    v = self.speed(t)
    a = (self.speed(t + DT_CTRL) - self.speed(max(t - DT_CTRL, 0.0))) / (2 * DT_CTRL)
    angle = self.steering_angle(t)
    rate = (self.steering_angle(t + DT_CTRL) - self.steering_angle(max(t - DT_CTRL, 0.0))) / (2 * DT_CTRL)
    side = self.blinker(t)
    # bicycle model: curvature = tan(wheel angle) / wheelbase, steer ratio 15, wheelbase 2.7 m
    yaw_rate = v * math.tan(math.radians(angle) / 15.0) / 2.7
    pressed, torque, lat = False, 0.0, None
    if self.scenario == "lane-change":
      start = LANE_CHANGE_AT + NUDGE_DELAY
      pressed = start <= t < start + NUDGE_SECONDS
      torque = NUDGE_TORQUE if pressed else 0.0   # positive: toward the left, as openpilot's steeringTorque
      lat = LAT_ACTIVE_FROM <= t < LANE_CHANGE_HANDBACK
    return CarSnapshot(t, v, a, angle, rate, yaw_rate, side == "left", side == "right", pressed, torque, lat)

  def calibration(self, t: float) -> dict:
    """extrinsicsCalibration fields at time t, per calibrationd's block bookkeeping."""
    inputs = int(t * INPUTS_NEEDED * BLOCK_SIZE / self.cal_seconds)
    valid_blocks = min(inputs // BLOCK_SIZE, INPUTS_WANTED)
    idx = inputs % BLOCK_SIZE if valid_blocks < INPUTS_WANTED else 0
    cal_perc = min(100 * (valid_blocks * BLOCK_SIZE + idx) // (INPUTS_NEEDED * BLOCK_SIZE), 100)
    calibrated = valid_blocks >= INPUTS_NEEDED
    # the estimate is the mean of the completed blocks: it starts at zero and tightens around the truth
    n = max(valid_blocks, 1)
    noise = self._cal_noise[:n].mean(axis=0) * 0.004
    rpy = (self.true_rpy + noise) if valid_blocks > 0 else np.zeros(3)
    spread = np.full(3, 0.02 / math.sqrt(n)) if valid_blocks > 0 else np.zeros(3)
    rot = VIEW_FROM_DEVICE @ _euler_to_rot(rpy)
    extrinsic = np.hstack([rot, (rot @ np.array([0.0, 0.0, -CAMERA_HEIGHT_M]))[:, None]])
    return {
      "calStatus": "calibrated" if calibrated else "uncalibrated",
      "calCycle": inputs // BLOCK_SIZE,
      "calPerc": int(cal_perc),
      "validBlocks": int(valid_blocks),
      "rpyCalib": [float(x) for x in rpy],
      "rpyCalibSpread": [float(x) for x in spread],
      "extrinsicMatrix": [float(x) for x in extrinsic.ravel()],
      "wideFromDeviceEuler": [0.0, 0.0, 0.0],
      "height": [CAMERA_HEIGHT_M],
    }

  def lateral_delay(self, t: float) -> dict:
    blocks = min(int(t / self.cal_seconds * 5), 10)
    estimated = blocks >= 5
    return {"lateralDelay": LATERAL_DELAY_S, "lateralDelayEstimate": LATERAL_DELAY_S, "lateralDelayEstimateStd": 0.05,
            "validBlocks": blocks, "calPerc": min(blocks * 20, 100), "status": "estimated" if estimated else "unestimated"}


def _set_fields(builder, values: dict) -> None:
  for key, value in values.items():
    setattr(builder, key, value)


class CarStub:
  """Builds the messages of one tick; the socket loop lives in main()."""

  def __init__(self, model: DriveModel, camera: str = "tici", engage_after: float = 3.0, chestnut: bool = False):
    self.model = model
    self.camera = camera
    self.engage_after = engage_after
    self.chestnut = chestnut

  def messages(self, tick: int, engaged: bool = False) -> list:
    """The messages due at `tick` (always carState and carControl, the slower ones on their divisors)."""
    t = tick * DT_CTRL
    snap = self.model.snapshot(t)
    msgs = []

    cs = new_message("carState", valid=True)
    _set_fields(cs.carState, {
      "vEgo": snap.v_ego, "vEgoRaw": snap.v_ego, "aEgo": snap.a_ego, "yawRate": snap.yaw_rate,
      "standstill": snap.v_ego < 0.01, "steeringAngleDeg": snap.steering_angle_deg,
      "steeringRateDeg": snap.steering_rate_deg, "leftBlinker": snap.left_blinker,
      "rightBlinker": snap.right_blinker, "gearShifter": "drive", "canValid": True,
      "steeringPressed": snap.steering_pressed, "steeringTorque": snap.steering_torque,
      "leftBlindspot": False, "rightBlindspot": False})
    _set_fields(cs.carState.cruiseState, {"enabled": True, "available": True, "speed": CRUISE_SPEED,
                                          "speedCluster": CRUISE_SPEED})
    msgs.append(cs)

    cc = new_message("carControl", valid=True)
    lat_active = engaged and snap.v_ego > 1.0 if snap.lat_active is None else snap.lat_active
    _set_fields(cc.carControl, {"enabled": engaged, "latActive": lat_active, "longActive": engaged,
                                "leftBlinker": snap.left_blinker, "rightBlinker": snap.right_blinker})
    curvature = math.tan(math.radians(snap.steering_angle_deg) / 15.0) / 2.7
    _set_fields(cc.carControl.actuators, {"accel": snap.a_ego if engaged else 0.0, "curvature": curvature if lat_active else 0.0,
                                          "steeringAngleDeg": snap.steering_angle_deg, "speed": snap.v_ego,
                                          "longControlState": "pid" if engaged else "off"})
    msgs.append(cc)

    if tick % CALIB_EVERY == 0:
      cal = new_message("extrinsicsCalibration", valid=True)
      _set_fields(cal.extrinsicsCalibration, self.model.calibration(t))
      msgs.append(cal)
    if tick % DEVICE_EVERY == 0:
      ds = new_message("deviceState", valid=True)
      _set_fields(ds.deviceState, {"started": True, "deviceType": self.camera, "chestnutPresent": self.chestnut,
                                   "freeSpacePercent": 80.0, "memoryUsagePercent": 30, "maxTempC": 45.0,
                                   "thermalStatus": "green"})
      msgs.append(ds)
    if tick % SLOW_EVERY == 0:
      ld = new_message("lateralDelay", valid=True)
      _set_fields(ld.lateralDelay, self.model.lateral_delay(t))
      msgs.append(ld)
      er = new_message("engageRequest", valid=True)
      er.engageRequest.engage = t >= self.engage_after
      msgs.append(er)
    return msgs


SERVICES = ["carState", "carControl", "extrinsicsCalibration", "deviceState", "lateralDelay", "engageRequest"]


def parse_args(argv=None) -> argparse.Namespace:
  p = Parser(prog="python -m selfdrive_stub.producers.car", description=__doc__.split("\n\nInvariants:")[0],
             formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--seed", type=int, default=0, help="drive profile seed (default 0)")
  p.add_argument("--camera", choices=["tici", "mici"], default="tici", help="deviceState.deviceType")
  p.add_argument("--engage-after", type=float, default=3.0, help="seconds before engageRequest.engage turns True")
  p.add_argument("--cal-seconds", type=float, default=4.0, help="seconds until calibration completes")
  p.add_argument("--chestnut", action="store_true", help="report the USB GPU as present in deviceState")
  p.add_argument("--scenario", choices=SCENARIOS, default="default",
                 help="scripted driver: 'lane-change' cruises with lateral control, blinks left at 2 s and nudges the wheel")
  p.add_argument("--duration", type=float, default=None, help="exit after this many seconds")
  args = p.parse_args(argv)
  if not args.cal_seconds > 0:
    p.error(f"--cal-seconds must be > 0, got {args.cal_seconds}")
  return args


def main(argv=None) -> None:
  args = parse_args(argv)
  from setproctitle import setproctitle
  setproctitle("car")
  stop = stop_on_signals()

  stub = CarStub(DriveModel(args.seed, args.cal_seconds, args.scenario), args.camera, args.engage_after, args.chestnut)
  pm = messaging.PubMaster(SERVICES, process="car")
  sm = messaging.SubMaster(["selfdriveState"])
  start = time.monotonic()
  tick = 0
  while not stop.is_set():
    if args.duration is not None and tick * DT_CTRL >= args.duration:
      break
    sm.update(0)
    for msg in stub.messages(tick, engaged=bool(sm["selfdriveState"].enabled)):
      pm.send(msg.which(), msg)
    tick += 1
    delay = start + tick * DT_CTRL - time.monotonic()
    if delay > 0:
      time.sleep(delay)


if __name__ == "__main__":
  run_cli("car", main)
