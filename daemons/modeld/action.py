"""Control action from the model plan (semantics of openpilot's get_action_from_model in selfdrive/modeld/modeld.py).

- accel: the plan velocity is read at the longitudinal action time t; a_target = 2 (v(t) - v0) / t - a0; for
  t < MIN_STABLE_DELAY the value at MIN_STABLE_DELAY is scaled linearly from v0;
- curvature: the same interpolation on yaw, curv = 2 psi(t) / (v t) - yaw_rate0 / v with v = max(vEgo, 1);
- models with an `action` head: accel = action[0, 1], curvature = action[0, 0] / max(1, vEgo)^2;
- smoothing: accel is low-passed with tau = LONG_SMOOTH_SECONDS; curvature is not smoothed (tau = 0) and is
  *held* at its previous value while vEgo <= MIN_LAT_CONTROL_SPEED;
- shouldStop = vEgo < 0.3 and accel < 0.1.
"""
from dataclasses import dataclass

import numpy as np

from daemons.modeld.constants import (DT_MDL, LAT_SMOOTH_SECONDS, LONG_SMOOTH_SECONDS, MIN_CURVATURE_SPEED,
                                      MIN_LAT_CONTROL_SPEED, MIN_STABLE_DELAY, Plan, T_IDXS)

STOP_SPEED = 0.3
STOP_ACCEL = 0.1


@dataclass(frozen=True)
class Action:
  desired_curvature: float = 0.0
  desired_acceleration: float = 0.0
  should_stop: bool = False


def smooth_value(val: float, prev: float, tau: float, dt: float = DT_MDL) -> float:
  alpha = 1.0 - np.exp(-dt / tau) if tau > 0 else 1.0
  return float(alpha * val + (1.0 - alpha) * prev)


def _value_at(series: np.ndarray, action_t: float) -> float:
  if action_t < MIN_STABLE_DELAY:
    at_stable = np.interp(MIN_STABLE_DELAY, T_IDXS, series)
    return float(series[0] + (action_t / MIN_STABLE_DELAY) * (at_stable - series[0]))
  return float(np.interp(action_t, T_IDXS, series))


def get_accel_from_plan(speeds: np.ndarray, accels: np.ndarray, action_t: float) -> float:
  if action_t <= 0:
    raise ValueError(f"long action time must be positive, got {action_t}")
  v_target = _value_at(speeds, action_t)
  return 2.0 * (v_target - float(speeds[0])) / action_t - float(accels[0])


def get_curvature_from_plan(yaws: np.ndarray, yaw_rates: np.ndarray, v_ego: float, action_t: float) -> float:
  if action_t <= 0:
    raise ValueError(f"lat action time must be positive, got {action_t}")
  psi_target = _value_at(yaws, action_t)
  v = max(v_ego, MIN_CURVATURE_SPEED)
  return 2.0 * psi_target / (v * action_t) - float(yaw_rates[0]) / v


def get_action_from_model(outs: dict, prev: Action, lat_action_t: float, long_action_t: float, v_ego: float) -> Action:
  if "action" in outs:
    raw = np.asarray(outs["action"]).reshape(-1)
    desired_accel = float(raw[1])
    desired_curvature = float(raw[0]) / max(1.0, v_ego) ** 2
  else:
    plan = outs["plan"][0]
    desired_accel = get_accel_from_plan(plan[:, Plan.VELOCITY][:, 0], plan[:, Plan.ACCELERATION][:, 0], long_action_t)
    desired_curvature = get_curvature_from_plan(plan[:, Plan.T_FROM_CURRENT_EULER][:, 2],
                                                plan[:, Plan.ORIENTATION_RATE][:, 2], v_ego, lat_action_t)
  desired_accel = smooth_value(desired_accel, prev.desired_acceleration, LONG_SMOOTH_SECONDS)
  should_stop = v_ego < STOP_SPEED and desired_accel < STOP_ACCEL
  if v_ego > MIN_LAT_CONTROL_SPEED:
    desired_curvature = smooth_value(desired_curvature, prev.desired_curvature, LAT_SMOOTH_SECONDS)
  else:
    desired_curvature = prev.desired_curvature
  return Action(float(desired_curvature), float(desired_accel), bool(should_stop))
