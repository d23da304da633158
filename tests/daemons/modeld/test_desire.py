"""DesireHelper: lane change offered on a blinker, started by a nudge, finished by the model, bounded in time."""
from daemons.modeld.desire import (DESIRE_LANE_CHANGE_LEFT, DESIRE_LANE_CHANGE_RIGHT, DESIRE_NONE, FINISHING,
                                   LANE_CHANGE_SPEED_MIN, OFF, PRE, STARTING, DesireHelper, DriverInputs)

FAST = LANE_CHANGE_SPEED_MIN + 5


def run(dh, n, lane_change_prob=0.5, **kw):
  d = DriverInputs(**{"v_ego": FAST, "lat_active": True, **kw})
  for _ in range(n):
    dh.update(d, lane_change_prob)
  return dh.state, dh.direction, dh.desire


def test_full_left_lane_change():
  dh = DesireHelper()
  assert run(dh, 1) == (OFF, "none", DESIRE_NONE)
  assert run(dh, 1, left_blinker=True) == (PRE, "none", DESIRE_NONE)
  assert run(dh, 1, left_blinker=True) == (PRE, "left", DESIRE_NONE)
  assert run(dh, 1, left_blinker=True, steering_pressed=True, steering_torque=-1.0)[0] == PRE   # wrong way
  assert run(dh, 1, left_blinker=True, steering_pressed=True, steering_torque=1.0) == (STARTING, "left", DESIRE_LANE_CHANGE_LEFT)
  assert run(dh, 30, left_blinker=True)[0] == STARTING            # the model still sees the lane change
  assert run(dh, 1, lane_change_prob=0.01)[0] == FINISHING        # lines faded out (2 s) and prob dropped
  assert dh.desire == DESIRE_LANE_CHANGE_LEFT
  assert run(dh, 25, lane_change_prob=0.01) == (OFF, "none", DESIRE_NONE)   # faded back in, blinker off


def test_right_change_needs_rising_edge_speed_and_lateral_control():
  dh = DesireHelper()
  assert run(dh, 3, right_blinker=True, v_ego=5.0)[0] == OFF       # too slow
  assert run(dh, 3, right_blinker=True)[0] == OFF                  # blinker was already on: no rising edge
  run(dh, 1)
  run(dh, 2, right_blinker=True)
  assert run(dh, 1, right_blinker=True, steering_pressed=True, steering_torque=-1.0) == (STARTING, "right", DESIRE_LANE_CHANGE_RIGHT)
  assert run(dh, 1, right_blinker=True, lat_active=False) == (OFF, "none", DESIRE_NONE)
  assert run(dh, 2, left_blinker=True, right_blinker=True)[0] == OFF   # hazards are not one blinker


def test_lane_change_times_out():
  dh = DesireHelper()
  run(dh, 1)
  run(dh, 2, left_blinker=True)
  run(dh, 1, left_blinker=True, steering_pressed=True, steering_torque=1.0)
  assert run(dh, 195, left_blinker=True, lane_change_prob=0.9)[0] == STARTING   # 9.8 s in
  assert run(dh, 10, left_blinker=True, lane_change_prob=0.9)[0] == OFF         # past 10 s


def test_a_car_in_the_blind_spot_holds_the_lane_until_it_is_clear():
  dh = DesireHelper()
  run(dh, 1)
  run(dh, 2, left_blinker=True)
  nudge = dict(left_blinker=True, steering_pressed=True, steering_torque=1.0)
  assert run(dh, 5, left_blindspot=True, **nudge) == (PRE, "left", DESIRE_NONE)     # keeps its lane
  assert run(dh, 1, right_blindspot=True, **nudge)[0] == STARTING                     # the other side does not matter
  dh = DesireHelper()
  run(dh, 1)
  run(dh, 2, right_blinker=True)
  assert run(dh, 3, right_blinker=True, right_blindspot=True, steering_pressed=True, steering_torque=-1.0)[0] == PRE
