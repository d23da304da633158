"""Lane-change desire from the driver's blinker and steering (semantics of openpilot's DesireHelper, spec §1.4).

States off -> preLaneChange -> laneChangeStarting -> laneChangeFinishing -> off (or preLaneChange again while a
blinker is still on). Invariants:
- a lane change is only offered while lateral control is active, above LANE_CHANGE_SPEED_MIN, on the rising
  edge of exactly one blinker; it starts when the driver nudges the wheel toward the blinker;
- laneChangeStarting ends when the model's lane-change probability has dropped (< 0.02) and the lane-line
  fade-out has run (2 s); laneChangeFinishing fades back in (1 s);
- nothing lasts beyond LANE_CHANGE_TIME_MAX; losing lateral control cancels at once;
- `desire` is laneChangeLeft/Right only in laneChangeStarting/Finishing, otherwise none. The daemon feeds the
  value from the previous frame, as the reference does.
"""
from dataclasses import dataclass

from daemons.modeld.constants import DT_MDL

LANE_CHANGE_SPEED_MIN = 20 * 0.44704   # 20 mph in m/s
LANE_CHANGE_TIME_MAX = 10.0
OFF, PRE, STARTING, FINISHING = "off", "preLaneChange", "laneChangeStarting", "laneChangeFinishing"
DESIRE_NONE, DESIRE_LANE_CHANGE_LEFT, DESIRE_LANE_CHANGE_RIGHT = 0, 3, 4


@dataclass(frozen=True)
class DriverInputs:
  v_ego: float = 0.0
  left_blinker: bool = False
  right_blinker: bool = False
  steering_pressed: bool = False
  steering_torque: float = 0.0
  lat_active: bool = False


class DesireHelper:
  def __init__(self):
    self.state, self.direction = OFF, "none"
    self.timer = 0.0
    self.ll_prob = 1.0         # lane-line weight, faded out while the lane change runs
    self.prev_one_blinker = False
    self.desire = DESIRE_NONE

  def update(self, d: DriverInputs, lane_change_prob: float) -> None:
    one_blinker = d.left_blinker != d.right_blinker
    too_slow = d.v_ego < LANE_CHANGE_SPEED_MIN
    if not d.lat_active or self.timer > LANE_CHANGE_TIME_MAX:
      self.state, self.direction = OFF, "none"
    elif self.state == OFF:
      if one_blinker and not self.prev_one_blinker and not too_slow:
        self.state, self.ll_prob = PRE, 1.0
    elif self.state == PRE:
      self.direction = "left" if d.left_blinker else "right"
      toward = d.steering_torque > 0 if self.direction == "left" else d.steering_torque < 0
      if not one_blinker or too_slow:
        self.state, self.direction = OFF, "none"
      elif d.steering_pressed and toward:
        self.state = STARTING
    elif self.state == STARTING:
      self.ll_prob = max(self.ll_prob - 2 * DT_MDL, 0.0)
      if lane_change_prob < 0.02 and self.ll_prob < 0.01:
        self.state = FINISHING
    elif self.state == FINISHING:
      self.ll_prob = min(self.ll_prob + DT_MDL, 1.0)
      if self.ll_prob > 0.99:
        self.direction = "none"
        self.state = PRE if one_blinker else OFF
    self.timer = 0.0 if self.state in (OFF, PRE) else self.timer + DT_MDL
    self.prev_one_blinker = one_blinker
    changing = self.state in (STARTING, FINISHING)
    self.desire = ({"left": DESIRE_LANE_CHANGE_LEFT, "right": DESIRE_LANE_CHANGE_RIGHT}.get(self.direction, DESIRE_NONE)
                   if changing else DESIRE_NONE)
