"""Driving-model output parser (semantics of openpilot selfdrive/modeld/parse_model_outputs.py).

Input: the flat output split into named `(1, width)` heads (from the model's metadata slices). Output: a dict
with the decoded heads: MDN heads give `name` (means) and `name_stds` (exp of the log-stds, clipped at e^11);
probability heads go through the clipped sigmoid; class heads through softmax. `hidden_state`, `pad` and
`action` stay raw. A missing required head raises `ParseError` naming it.

MDN layout: a head of width W reshaped to (1, max(in_N, 1), W / in_N); per hypothesis the first n values are
means, the next n log-stds, and the last out_N are hypothesis weights (multi-hypothesis heads only).
"""
import numpy as np

from daemons.common.outputs import safe_exp, sigmoid, softmax
from daemons.modeld.constants import (DESIRE_LEN, DESIRE_PRED_LEN, IDX_N, LANE_LINES_WIDTH, LEAD_TRAJ_LEN,
                                      LEAD_WIDTH, NUM_LANE_LINES, NUM_LEADS, NUM_ROAD_EDGES, PLAN_WIDTH, POSE_WIDTH,
                                      WIDE_FROM_DEVICE_WIDTH)

LEAD_MHP_N = 2
PLAN_MHP_N = 5


class ParseError(ValueError):
  """A model output head that is missing or has a shape the parser cannot decode."""


def parse_mdn(outs: dict, name: str, in_N: int = 0, out_N: int = 0, out_shape: tuple = ()) -> None:
  raw = outs[name]
  batch = raw.shape[0]
  n_hyp = max(in_N, 1)
  if raw.size % (batch * n_hyp):
    raise ParseError(f"head {name!r} of width {raw.shape[-1]} does not split into {n_hyp} hypotheses")
  raw = raw.reshape(batch, n_hyp, -1)
  n = (raw.shape[2] - out_N) // 2
  if n * 2 + out_N != raw.shape[2] or n != int(np.prod(out_shape)):
    raise ParseError(f"head {name!r}: hypothesis width {raw.shape[2]} does not fit means+stds of shape {out_shape}"
                     f" plus {out_N} weights")
  mu = raw[:, :, :n]
  std = safe_exp(raw[:, :, n:2 * n])
  if in_N > 1:
    # weights: softmax over hypotheses of each selection column; pick the best hypothesis per slot
    weights = softmax(raw[:, :, 2 * n:], axis=1)  # (B, in_N, out_N)
    picks = np.argmax(weights, axis=1)             # (B, out_N): best hypothesis for each selection slot
    mu = np.take_along_axis(mu, picks[:, :, None], axis=1)
    std = np.take_along_axis(std, picks[:, :, None], axis=1)
    outs[name + "_weights"] = weights
  if out_N > 1:
    shape = (batch, out_N, *out_shape)
  else:
    shape = (batch, *out_shape)
  outs[name] = mu.reshape(shape)
  outs[name + "_stds"] = std.reshape(shape)


def _require(outs: dict, names: tuple[str, ...]) -> None:
  missing = [n for n in names if n not in outs]
  if missing:
    raise ParseError(f"missing model output heads {missing}")


def parse_outputs(heads: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Decode the named heads of one model output (a new dict; the raw heads are not modified)."""
  outs = {k: np.array(v, dtype=np.float32, copy=True) for k, v in heads.items()}
  _require(outs, ("pose", "wide_from_device_euler", "road_transform", "lane_lines", "road_edges", "lane_lines_prob",
                  "desire_pred", "meta", "lead_prob", "lead", "plan", "desire_state"))
  parse_mdn(outs, "pose", out_shape=(POSE_WIDTH,))
  parse_mdn(outs, "wide_from_device_euler", out_shape=(WIDE_FROM_DEVICE_WIDTH,))
  parse_mdn(outs, "road_transform", out_shape=(POSE_WIDTH,))
  parse_mdn(outs, "lane_lines", out_shape=(NUM_LANE_LINES, IDX_N, LANE_LINES_WIDTH))
  parse_mdn(outs, "road_edges", out_shape=(NUM_ROAD_EDGES, IDX_N, LANE_LINES_WIDTH))
  outs["lane_lines_prob"] = sigmoid(outs["lane_lines_prob"])
  outs["desire_pred"] = softmax(outs["desire_pred"].reshape(-1, DESIRE_PRED_LEN, DESIRE_LEN), axis=-1)
  outs["meta"] = sigmoid(outs["meta"])
  outs["lead_prob"] = sigmoid(outs["lead_prob"])
  lead_shape = (NUM_LEADS, LEAD_TRAJ_LEN, LEAD_WIDTH)
  if outs["lead"].shape[1] == 2 * int(np.prod(lead_shape)):
    parse_mdn(outs, "lead", out_shape=lead_shape)
  else:
    parse_mdn(outs, "lead", in_N=LEAD_MHP_N, out_N=NUM_LEADS, out_shape=(LEAD_TRAJ_LEN, LEAD_WIDTH))
  if outs["plan"].shape[1] == 2 * IDX_N * PLAN_WIDTH:
    parse_mdn(outs, "plan", out_shape=(IDX_N, PLAN_WIDTH))
  else:
    parse_mdn(outs, "plan", in_N=PLAN_MHP_N, out_N=1, out_shape=(IDX_N, PLAN_WIDTH))
  outs["desire_state"] = softmax(outs["desire_state"], axis=-1)
  return outs
