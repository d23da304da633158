"""Lane-change desire from the car (openpilot's DesireHelper semantics, selfdrive/controls/lib/desire_helper.py).

Upstream revision followed: commaai/openpilot `selfdrive/controls/lib/desire_helper.py` @082c194ed3a6 (the
lane-change helper with the preLaneChange -> laneChangeStarting -> laneChangeFinishing fade and the blind-spot
check). Facts and constants only; the code is ours.

States off -> preLaneChange -> laneChangeStarting -> laneChangeFinishing -> off (or preLaneChange again while
a blinker is still on). Invariants:
- a lane change is offered only while lateral control is active (carControl.latActive), at or above
  LANE_CHANGE_SPEED_MIN, on the rising edge of exactly one blinker (carState.leftBlinker/rightBlinker);
- in preLaneChange the car keeps its lane (desire none) until the driver nudges the wheel toward the blinker
  (carState.steeringPressed with steeringTorque > 0 for left, < 0 for right) and that side's blind spot
  (carState.leftBlindspot/rightBlindspot) is clear; letting go of the blinker or slowing down cancels;
- laneChangeStarting fades the lane lines out (2 DT_MDL per step) and ends once they are gone and the model's
  lane-change probability (desireState laneChangeLeft + laneChangeRight) has dropped below 0.02;
  laneChangeFinishing fades them back in (1 DT_MDL per step);
- nothing lasts beyond LANE_CHANGE_TIME_MAX of starting/finishing; losing lateral control cancels at once;
- `desire` is laneChangeLeft/Right in laneChangeStarting/Finishing, otherwise none; the daemon feeds it to the
  model from the previous frame and the model history turns it into a pulse on its rising edge only.
"""
from dataclasses import dataclass

from daemons.modeld.constants import DT_MDL

LANE_CHANGE_SPEED_MIN = 20 * 0.44704   # 20 mph in m/s
LANE_CHANGE_TIME_MAX = 10.0
LANE_CHANGE_PROB_DONE = 0.02
OFF, PRE, STARTING, FINISHING = "off", "preLaneChange", "laneChangeStarting", "laneChangeFinishing"
DESIRE_NONE, DESIRE_LANE_CHANGE_LEFT, DESIRE_LANE_CHANGE_RIGHT = 0, 3, 4
DESIRE_NAMES = ("none", "turnLeft", "turnRight", "laneChangeLeft", "laneChangeRight", "keepLeft", "keepRight", "reserved7")


@dataclass(frozen=True)
class DriverInputs:
  v_ego: float = 0.0
  left_blinker: bool = False
  right_blinker: bool = False
  steering_pressed: bool = False
  steering_torque: float = 0.0
  left_blindspot: bool = False
  right_blindspot: bool = False
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
      left = self.direction == "left"
      nudged = d.steering_pressed and (d.steering_torque > 0 if left else d.steering_torque < 0)
      blocked = d.left_blindspot if left else d.right_blindspot
      if not one_blinker or too_slow:
        self.state, self.direction = OFF, "none"
      elif nudged and not blocked:
        self.state = STARTING
    elif self.state == STARTING:
      self.ll_prob = max(self.ll_prob - 2 * DT_MDL, 0.0)
      if lane_change_prob < LANE_CHANGE_PROB_DONE and self.ll_prob < 0.01:
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
