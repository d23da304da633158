"""Parser (MDN, sigmoid, softmax) and action rules against hand-computed cases."""
import math

import numpy as np
import pytest

from daemons.modeld.action import Action, get_action_from_model, smooth_value
from daemons.modeld.constants import OUTPUT_HEADS, T_IDXS
from daemons.modeld.parse import ParseError, parse_mdn, parse_outputs


def zero_heads():
  return {name: np.zeros((1, w), np.float32) for name, w in OUTPUT_HEADS}


def test_mdn_means_first_then_log_stds_clipped_at_e11():
  raw = np.concatenate([np.arange(6), [0, 1, -1, 20, np.log(2), -50]]).astype(np.float32)[None]
  outs = {"pose": raw}
  parse_mdn(outs, "pose", out_shape=(6,))
  np.testing.assert_array_equal(outs["pose"], [np.arange(6)])
  np.testing.assert_allclose(outs["pose_stds"], [[1, math.e, 1 / math.e, math.exp(11), 2, math.exp(-50)]], rtol=1e-6)


def test_multi_hypothesis_lead_picks_best_hypothesis_per_slot():
  # 2 hypotheses x (24 means + 24 log-stds + 3 weights) = 102, the MHP lead layout
  raw = np.zeros((2, 51), np.float32)
  raw[0, :24], raw[1, :24] = 1.0, 2.0
  raw[0, 48:] = [5.0, -5.0, 5.0]      # hypothesis 0 wins slots 0 and 2, hypothesis 1 wins slot 1
  heads = zero_heads()
  heads["lead"] = raw.reshape(1, 102)
  out = parse_outputs(heads)
  assert out["lead"].shape == (1, 3, 6, 4)
  assert out["lead"][0, 0, 0, 0] == 1 and out["lead"][0, 1, 0, 0] == 2 and out["lead"][0, 2, 0, 0] == 1
  np.testing.assert_allclose(out["lead_weights"][0, :, 0].sum(), 1.0, rtol=1e-6)


def test_parse_outputs_shapes_and_hand_values():
  heads = zero_heads()
  heads["lane_lines_prob"][0, 1] = 50.0
  heads["meta"][0, 0] = -50.0
  heads["desire_state"][0, 3] = math.log(3.0)
  heads["desire_pred"][0, 8 + 2] = math.log(7.0)
  heads["plan"][0, :495] = np.arange(495)
  out = parse_outputs(heads)
  assert out["plan"].shape == (1, 33, 15) and out["plan"][0, 1, 0] == 15 and out["plan_stds"][0, 0, 0] == 1
  assert out["lane_lines"].shape == (1, 4, 33, 2) and out["road_edges"].shape == (1, 2, 33, 2)
  assert out["lead"].shape == (1, 3, 6, 4) and out["pose"].shape == (1, 6) and out["road_transform"].shape == (1, 6)
  assert out["lane_lines_prob"][0, 0] == 0.5 and out["lane_lines_prob"][0, 1] == pytest.approx(1.0)
  assert out["meta"][0, 0] == pytest.approx(1 / (1 + math.exp(11)))      # the sigmoid floor, not 0
  np.testing.assert_allclose(out["desire_state"][0, 3], 3 / 10, rtol=1e-6)
  assert out["desire_pred"].shape == (1, 4, 8)
  np.testing.assert_allclose(out["desire_pred"][0, 1, 2], 7 / 14, rtol=1e-6)
  np.testing.assert_allclose(out["desire_pred"][0, 0], np.full(8, 1 / 8), rtol=1e-6)
  assert out["hidden_state"].shape == (1, 512)


def test_parse_errors_name_the_head():
  heads = zero_heads()
  del heads["lead_prob"]
  with pytest.raises(ParseError, match="lead_prob"):
    parse_outputs(heads)
  heads = zero_heads()
  heads["pose"] = np.zeros((1, 11), np.float32)
  with pytest.raises(ParseError, match="'pose'"):
    parse_outputs(heads)


def plan_outs(v0=10.0, dv=1.0, a0=1.0, yaw_rate=0.1):
  plan = np.zeros((1, 33, 15), np.float32)
  plan[0, :, 3] = v0 + dv * T_IDXS
  plan[0, 0, 6] = a0
  plan[0, :, 11] = yaw_rate * T_IDXS
  plan[0, :, 14] = yaw_rate
  return {"plan": plan}


ALPHA = 1 - math.exp(-0.05 / 0.3)


def test_accel_and_curvature_from_plan():
  a = get_action_from_model(plan_outs(), Action(), lat_action_t=0.5, long_action_t=0.5, v_ego=10.0)
  # v(0.5) = 10.5 -> a = 2*0.5/0.5 - a0(1) = 1, low-passed from 0
  assert a.desired_acceleration == pytest.approx(ALPHA * 1.0, rel=1e-4)
  # psi(0.5) = 0.05 -> 2*0.05/(10*0.5) - 0.1/10 = 0.01, not smoothed
  assert a.desired_curvature == pytest.approx(0.01, rel=1e-4)
  assert not a.should_stop
  # below the stable delay the target is scaled linearly from t=0: still exactly the ramp here
  b = get_action_from_model(plan_outs(), Action(desired_acceleration=1.0), 0.15, 0.15, 10.0)
  assert b.desired_acceleration == pytest.approx(1.0, rel=1e-4)


def test_curvature_held_when_slow_and_should_stop():
  prev = Action(desired_curvature=0.2, desired_acceleration=-1.0)
  a = get_action_from_model(plan_outs(v0=0.0, dv=0.0, a0=0.0), prev, 0.5, 0.5, v_ego=0.1)
  assert a.desired_curvature == 0.2
  assert a.desired_acceleration == pytest.approx(smooth_value(0.0, -1.0, 0.3))
  assert a.should_stop
  assert not get_action_from_model(plan_outs(v0=0.0, dv=4.0, a0=0.0), Action(desired_acceleration=2.0), 0.5, 0.5, 0.1).should_stop


def test_action_head_takes_precedence_and_times_must_be_positive():
  outs = plan_outs()
  outs["action"] = np.array([[0.5, -2.0]], np.float32)
  a = get_action_from_model(outs, Action(desired_acceleration=-2.0), 0.5, 0.5, v_ego=5.0)
  assert a.desired_curvature == pytest.approx(0.5 / 25) and a.desired_acceleration == pytest.approx(-2.0)
  with pytest.raises(ValueError, match="long action time"):
    get_action_from_model(plan_outs(), Action(), 0.5, 0.0, 10.0)
  assert smooth_value(3.0, 1.0, 0.0) == 3.0
