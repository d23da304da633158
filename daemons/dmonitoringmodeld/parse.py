"""Decode the DM model's flat output into driverStateV2 fields (facts: openpilot dmonitoringmodeld.py §1.4).

Invariants:
- Heads come from the model metadata, validated at load (REQUIRED_HEADS must exist, every slice inside the output
  and the right length): a malformed model fails at startup, never as a short array per frame.
- Probabilities are the clipped sigmoid (floor 1/(1+e^11) ≈ 1.67e-5); stds are safe_exp of the log-stds
  (cap e^11). A non-finite output is reported by name, never silently published as valid.
"""
import numpy as np

from daemons.common.metadata import ModelMetadata, ModelMetadataError
from daemons.common.outputs import safe_exp, sigmoid

SIDES = ("lhd", "rhd")
PROB_HEADS = {"face_prob": "faceProb", "left_eye_prob": "leftEyeProb", "right_eye_prob": "rightEyeProb",
              "left_blink_prob": "leftBlinkProb", "right_blink_prob": "rightBlinkProb",
              "sunglasses_prob": "sunglassesProb", "using_phone_prob": "phoneProb", "sleep_prob": "sleepProb"}
REQUIRED_HEADS = tuple(f"face_descs_{s}" for s in SIDES) + \
                 tuple(f"{h}_{s}" for s in SIDES for h in PROB_HEADS) + ("wheel_on_right",)
HEAD_SIZES = {**{f"face_descs_{s}": 12 for s in SIDES}, **{h: 1 for h in REQUIRED_HEADS if "descs" not in h}}


def check_head_sizes(meta: ModelMetadata) -> None:
  """Each head the daemon reads has exactly the length it indexes (12 face descs, 1 per probability)."""
  for name, size in HEAD_SIZES.items():
    start, stop, _ = meta.output_slices[name].indices(meta.output_size)
    if stop - start != size:
      raise ModelMetadataError(f"head {name!r} has {stop - start} values, expected {size}")


def non_finite_heads(flat: np.ndarray, meta: ModelMetadata) -> list[str]:
  """Names of the heads (the daemon reads) that hold NaN or Inf."""
  flat = flat.reshape(-1)
  return [n for n in REQUIRED_HEADS if not np.isfinite(flat[meta.output_slices[n]]).all()]


def parse_outputs(flat: np.ndarray, meta: ModelMetadata) -> dict:
  """{'wheel_on_right': float, 'lhd': DriverData fields, 'rhd': DriverData fields} as plain python values."""
  heads = meta.slice_outputs(np.asarray(flat, dtype=np.float32))
  parsed = {"wheel_on_right": float(sigmoid(heads["wheel_on_right"])[0, 0])}
  for side in SIDES:
    desc = heads[f"face_descs_{side}"]
    means, stds = desc[0, :6], safe_exp(desc[0, 6:12])
    d = {"faceOrientation": means[0:3].tolist(), "faceOrientationStd": stds[0:3].tolist(),
         # the reference publishes only x, y of the position (the third mean is dropped)
         "facePosition": means[3:5].tolist(), "facePositionStd": stds[3:5].tolist()}
    for head, field in PROB_HEADS.items():
      d[field] = float(sigmoid(heads[f"{head}_{side}"])[0, 0])
    parsed[side] = d
  return parsed


def fill_driver_data(builder, d: dict) -> None:
  for field, value in d.items():
    setattr(builder, field, value)
