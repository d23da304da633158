"""Generate dmonitoring_model.onnx: a small, deterministic driver-monitoring CNN with the reference I/O contract.

    python -m tools.gen_dm_model [--out PATH]

Regenerating reproduces the file byte for byte (fixed seed, fixed opset/IR version, no timestamps).

Contract (openpilot's dmonitoring_model.onnx): inputs `input_img` uint8 (1, 1382400) = 1440×960 luma and
`calib` float32 (1, 3); output `outputs` float32 (1, 553); `metadata_props["output_slices_json"]` names the heads.

Structure (only the op set our runtime implements first):
  luma → Cast → 8×8 mean (1×8 then 8×1 AveragePool, 120×180) → normalise
     ├─ 2×2 AveragePool (60×90) → hand-designed face branch (fixed filters, ramps, GlobalAveragePool) → 8 features
     └─ seeded conv tower (strided, grouped/depthwise, Relu/LeakyRelu) → GlobalAveragePool → 32
  [tower, face features, calib] → Gemm/Tanh hidden (64) → heads = hand weights · face features + small random
  weights · hidden; features (512) = seeded Gemm of hidden.

The face branch is why the model responds to a face at all (random weights would not). On the 60×90 map B:
  skin       = Relu(blur3(B) - mean(B) - SKIN_MARGIN) × a central-band prior (side windows are not skin)
  silhouette = ramp(skin): the whole head, lit or shaded;  core = ramp(skin - 0.85·skin level): its lit part
  dark       = Relu(localmean7(B) - B - DARK_MARGIN) inside the face (away from its rim)
  sclera     = Relu(B - mean luma of the core - SCLERA_MARGIN), split at the head centre
Features: head centroid (→ face position), head mass (→ face/eye probability, confidence), core-vs-silhouette
centroid offset (→ yaw: turning the head shades its far side), dark-feature vertical offset (→ pitch), sclera per
side (→ blink: an open eye shows pixels brighter than the lit skin, a closed lid none).
Every hand constant is named below with the scene measurements it was tuned on; the other heads (sunglasses,
phone, roll, wheel side, features) come from the seeded parts and sit in an unsaturated range.
"""
import argparse
import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from daemons.dmonitoringmodeld.model_state import MODEL_PATH   # a tool beside the packages: it writes where the daemon reads

SEED = 20260611
OPSET = 17
IR_VERSION = 8
IN_W, IN_H = 1440, 960

N_FEATURES = 512
DRIVER_HEADS = ("face_prob", "left_eye_prob", "right_eye_prob", "left_blink_prob", "right_blink_prob",
                "sunglasses_prob", "using_phone_prob", "sleep_prob")

# hand-designed face branch constants (tuned on selfdrive_stub/producers/scenes.py's synthetic cabin face)
SKIN_MARGIN = 0.03   # skin must be this much brighter than the frame mean (luma scale 0..1)
DARK_MARGIN = 0.06   # a dark feature is this much darker than its 7×7 neighbourhood
SIL_GAIN = 20.0       # skin → 0..1 membership ramps
CORE_FRACTION = 0.85  # the lit core: skin above this share of the skin level
PRIOR_INNER, PRIOR_OUTER = 0.38, 0.5   # |x| (of -1..1) where the head prior starts fading, and reaches 0
SCLERA_MARGIN = 0.06   # sclera: this much (luma 0..1, ≈ 13 of 219) brighter than the lit skin
SCLERA_CAP = 0.6       # per-side sclera feature cap (open eyes measure 0.4-1.3)
INSIDE_FRACTION = 0.7  # a pixel is inside the face when its 9×9 skin average exceeds this share of the skin level
EPS = 1e-3
CENTROID_EPS = 1e-5


def output_slices() -> dict[str, tuple[int, int]]:
  """Head layout of the flat output: per side 12 face descs + 8 probabilities, then wheel side, then features."""
  slices, i = {}, 0
  for side in ("lhd", "rhd"):
    slices[f"face_descs_{side}"] = (i, i + 12)
    i += 12
    for head in DRIVER_HEADS:
      slices[f"{head}_{side}"] = (i, i + 1)
      i += 1
  slices["wheel_on_right"] = (i, i + 1)
  slices["features"] = (i + 1, i + 1 + N_FEATURES)
  return slices


class GraphBuilder:
  """Tiny helper: named constants and nodes, in insertion order (so the file is deterministic)."""

  def __init__(self):
    self.nodes, self.inits, self.n = [], [], 0

  def const(self, name, array):
    self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
    return name

  def op(self, op_type, inputs, **attrs):
    self.n += 1
    out = f"{op_type.lower()}_{self.n}"
    self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
    return out

  def conv(self, x, w, b=None, stride=1, pad=0, group=1):
    ins = [x, self.const(f"w{self.n + 1}", w.astype(np.float32))]
    if b is not None:
      ins.append(self.const(f"b{self.n + 1}", b.astype(np.float32)))
    return self.op("Conv", ins, strides=[stride, stride], pads=[pad] * 4, group=group,
                   kernel_shape=list(w.shape[2:]))

  def gemm(self, x, w, b):
    return self.op("Gemm", [x, self.const(f"w{self.n + 1}", w.astype(np.float32)),
                            self.const(f"b{self.n + 1}", b.astype(np.float32))])

  def scalar(self, value):
    return self.const(f"c{len(self.inits)}", np.array(value, np.float32))


def box(k):
  return np.full((1, 1, k, k), 1.0 / (k * k), np.float32)


def face_branch(g, b60):
  """Hand-designed face features from the 60×90 map; returns a (1, 8) tensor (see module docstring)."""
  h, w = 60, 90
  xs = np.linspace(-1.0, 1.0, w, dtype=np.float32)[None, :].repeat(h, 0)
  ys = np.linspace(-1.0, 1.0, h, dtype=np.float32)[:, None].repeat(w, 1)
  ones = np.ones((h, w), np.float32)
  # spatial prior: the driver's head sits in the central band (keeps side windows from looking like skin)
  prior = np.clip((PRIOR_OUTER - np.abs(xs)) / (PRIOR_OUTER - PRIOR_INNER), 0.0, 1.0).astype(np.float32)
  frame_mean = g.op("GlobalAveragePool", [b60])
  skin = g.op("Sub", [g.op("Sub", [g.conv(b60, box(3), pad=1), frame_mean]), g.scalar(SKIN_MARGIN)])
  skin = g.op("Mul", [g.op("Relu", [skin]), g.const("prior", prior[None, None])])
  dev = g.op("Sub", [b60, g.conv(b60, box(7), pad=3)])                 # brighter (+) / darker (-) than around
  dark = g.op("Relu", [g.op("Sub", [g.op("Mul", [dev, g.scalar(-1.0)]), g.scalar(DARK_MARGIN)])])
  # skin level: the skin-weighted mean skin value, so the thresholds below follow exposure
  skin_level = g.op("Div", [g.op("GlobalAveragePool", [g.op("Mul", [skin, skin])]),
                            g.op("Add", [g.op("GlobalAveragePool", [skin]), g.scalar(EPS)])])
  level_at = lambda frac: g.op("Mul", [skin_level, g.scalar(frac)])
  ramp01 = lambda x, gain: g.op("Clip", [g.op("Mul", [x, g.scalar(gain)]), g.scalar(0.0), g.scalar(1.0)])
  silhouette = ramp01(skin, SIL_GAIN)                                       # the whole head, lit or shaded
  core = ramp01(g.op("Sub", [skin, level_at(CORE_FRACTION)]), SIL_GAIN)      # its brightly lit part only
  # "inside the face": the 9×9 skin average is well above the skin level only away from the face's rim
  inside = g.op("Relu", [g.op("Sub", [g.conv(skin, box(9), pad=4), level_at(INSIDE_FRACTION)])])
  dark_in = g.op("Mul", [dark, inside])
  def moments(m, masks, name):   # (1, len(masks)): the mean of m weighted by each mask
    weighted = g.op("Mul", [m, g.const(name, np.stack(masks)[None])])
    return g.op("Flatten", [g.op("GlobalAveragePool", [weighted])])

  sil_m = moments(silhouette, [ones, xs, ys], "sil_masks")
  core_m = moments(core, [ones, xs, ys], "core_masks")
  dark_m = moments(dark_in, [ones, xs, ys], "dark_masks")
  s0, s1, s3, ax = (g.const(n, np.array([v])) for n, v in (("s0", 0), ("s1", 1), ("s3", 3), ("ax", 1)))
  def centroid(m, fallback):     # (x, y) of a [mass, x-moment, y-moment] triple; `fallback` when massless
    num = g.op("Add", [g.op("Slice", [m, s1, s3, ax]), g.op("Mul", [fallback, g.scalar(CENTROID_EPS)])])
    return g.op("Div", [num, g.op("Add", [g.op("Slice", [m, s0, s1, ax]), g.scalar(CENTROID_EPS)])])

  s_mass = g.op("Slice", [sil_m, s0, s1, ax])
  s_den = g.op("Add", [s_mass, g.scalar(EPS)])
  s_xy = g.op("Div", [g.op("Slice", [sil_m, s1, s3, ax]), s_den])
  # turning the head shades its far side: the lit core's centroid leaves the silhouette's (yaw);
  # the dark features' centroid moves up/down within the head (pitch). Both fall back to 0 without a face.
  yaw_dx = g.op("Slice", [g.op("Sub", [centroid(core_m, s_xy), s_xy]), s0, s1, ax])
  pitch_dy = g.op("Slice", [g.op("Sub", [centroid(dark_m, s_xy), s_xy]), s1, g.const("s2", np.array([2])), ax])
  d_ratio = g.op("Div", [g.op("Slice", [dark_m, s0, s1, ax]), s_den])
  # open eyes: the sclera is brighter than any skin. Threshold = the lit core's mean luma + a margin (a very
  # high threshold when there is no face); counted per side of the head centre (image left / right).
  core_luma = g.op("Flatten", [g.op("GlobalAveragePool", [g.op("Mul", [core, b60])])])
  core_mean = g.op("Div", [g.op("Add", [core_luma, g.scalar(CENTROID_EPS * 2.0)]),
                           g.op("Add", [g.op("Slice", [core_m, s0, s1, ax]), g.scalar(CENTROID_EPS)])])
  threshold = g.op("Reshape", [g.op("Add", [core_mean, g.scalar(SCLERA_MARGIN)]), g.const("to4d", np.array([1, 1, 1, 1]))])
  bright = g.op("Relu", [g.op("Sub", [b60, threshold])])
  cx4 = g.op("Reshape", [g.op("Slice", [s_xy, s0, s1, ax]), "to4d"])
  right = ramp01(g.op("Sub", [g.const("xs", xs[None, None]), cx4]), 50.0)     # right of the head centre
  left = g.op("Sub", [g.scalar(1.0), right])
  bright_lr = g.op("Concat", [g.op("Mul", [bright, left]), g.op("Mul", [bright, right])], axis=1)
  # per mille of the head: an open eye is a few cells ~0.1 above the threshold
  # (capped: one clearly open eye is enough, and the cap keeps the blink heads off the sigmoid floor)
  sclera = g.op("Flatten", [g.op("GlobalAveragePool", [bright_lr])])
  sclera = g.op("Mul", [g.op("Div", [sclera, s_den]), g.scalar(1000.0)])
  sclera = g.op("Clip", [sclera, g.scalar(0.0), g.scalar(SCLERA_CAP)])
  # [head cx, head cy, yaw offset, dark-feature vertical offset, head mass, dark/head, sclera image-left, -right]
  return g.op("Concat", [s_xy, yaw_dx, pitch_dy, s_mass, d_ratio, sclera], axis=1)


# Hand weights: head logit = HAND[:, head] · features + bias, features =
#   [head cx, head cy, yaw_dx, dark_dy, head mass, dark ratio, sclera image-left, sclera image-right].
# Tuned on the synthetic cabin (selfdrive_stub/producers/scenes.py), both cameras: head mass ≈ 0.08-0.12 with a face, 0
# without; yaw_dx ≈ 0 facing the camera, ≈ -0.05..-0.07 turned 0.75 rad away; sclera ≈ 0.4-1.3 per open eye,
# exactly 0 closed (the closed lid is darker than skin, the sclera brighter).
N_FACE = 8


def hand_heads():
  """(N_FACE, 41) weights and (41,) biases for the driver heads of both sides and the wheel side."""
  slices = output_slices()
  W = np.zeros((N_FACE, 41), np.float32)
  b = np.zeros(41, np.float32)
  for side in ("lhd", "rhd"):
    o = slices[f"face_descs_{side}"][0]
    W[3, o + 0], b[o + 0] = -1.0, -0.06         # pitch: small, dark features dropping → looking down
    W[2, o + 1] = 12.0                          # yaw (model sign; the policy uses -orient[1]): ~0.6-0.8 turned
    W[0, o + 3], b[o + 3] = 720 / 1928, (244 + 720) / 1928 - 0.5   # position x in the 1928-wide camera frame
    W[1, o + 4], b[o + 4] = 480 / 1208, (248 + 480) / 1208 - 0.5   # position y in the 1208-high camera frame
    for k in range(6):                          # log-stds: confident with a face, unsure without one
      W[4, o + 6 + k], b[o + 6 + k] = -8.0, -1.2 - 0.1 * k
    p = {h: slices[f"{h}_{side}"][0] for h in DRIVER_HEADS}
    W[4, p["face_prob"]], b[p["face_prob"]] = 60.0, -3.0
    for eye in ("left_eye_prob", "right_eye_prob"):
      W[4, p[eye]], b[p[eye]] = 60.0, -2.0
    # facing the camera the driver's left eye is on the image's right
    W[7, p["left_blink_prob"]], b[p["left_blink_prob"]] = -14.0, 4.0
    W[6, p["right_blink_prob"]], b[p["right_blink_prob"]] = -14.0, 4.0
    W[6:8, p["sleep_prob"]], b[p["sleep_prob"]] = -4.0, 0.5
    b[p["sunglasses_prob"]] = -3.0
    b[p["using_phone_prob"]] = -2.5
  b[slices["wheel_on_right"][0]] = -3.0
  return W, b


def he(rng, *shape, fan_in=None):
  fan_in = fan_in or int(np.prod(shape[1:]))
  return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)


def build_model() -> onnx.ModelProto:
  rng = np.random.default_rng(SEED)
  g = GraphBuilder()
  img = g.op("Cast", ["input_img"], to=TensorProto.FLOAT)
  # downsample first (pooling is linear, so normalising after it is the same and 64× cheaper); the 8×8 mean is
  # split into a 1×8 pool over rows of 8 pixels and an 8×1 pool over the result: 16 strided passes, not 64
  img = g.op("Reshape", [img, g.const("row_groups", np.array([1, 1, IN_H * IN_W // 8, 8], np.int64))])
  p1x8 = g.op("AveragePool", [img], kernel_shape=[1, 8], strides=[1, 8])
  p1x8 = g.op("Reshape", [p1x8, g.const("img_shape", np.array([1, 1, IN_H, IN_W // 8], np.int64))])
  p8 = g.op("AveragePool", [p1x8], kernel_shape=[8, 1], strides=[8, 1])
  p8 = g.op("Div", [g.op("Sub", [p8, g.scalar(16.0)]), g.scalar(219.0)])         # video-range luma → 0..1
  b60 = g.op("AveragePool", [p8], kernel_shape=[2, 2], strides=[2, 2])
  face = face_branch(g, b60)

  # seeded conv tower: 120×180 → 60×90 → 30×45 → 15×23, one grouped (depthwise) layer
  x = g.op("Mul", [g.op("Sub", [p8, g.scalar(0.5)]), g.scalar(2.0)])
  x = g.op("Relu", [g.conv(x, he(rng, 8, 1, 4, 4), np.zeros(8), stride=2, pad=1)])
  x = g.op("Relu", [g.conv(x, he(rng, 16, 8, 3, 3), np.full(16, 0.05), stride=2, pad=1)])
  x = g.op("Relu", [g.conv(x, he(rng, 16, 1, 3, 3), np.full(16, 0.05), stride=1, pad=1, group=16)])
  x = g.op("LeakyRelu", [g.conv(x, he(rng, 32, 16, 3, 3), np.zeros(32), stride=2, pad=1)], alpha=0.1)
  tower = g.op("Flatten", [g.op("GlobalAveragePool", [x])])
  joined = g.op("Concat", [tower, face, "calib"], axis=1)                       # (1, 32 + N_FACE + 3)
  n_joined = 32 + N_FACE + 3
  hidden = g.op("Tanh", [g.gemm(joined, he(rng, 64, n_joined, fan_in=n_joined).T * 0.5, np.zeros(64))])

  Wh, bh = hand_heads()
  w_rand = (rng.standard_normal((64, 41)) * 0.02).astype(np.float32)
  for side in ("lhd", "rhd"):   # pose and position are purely geometric: no random part to jitter the policy's yaw
    o = output_slices()[f"face_descs_{side}"][0]
    w_rand[:, [o, o + 1, o + 3, o + 4]] = 0.0
  driver = g.op("Add", [g.gemm(face, Wh, bh), g.op("MatMul", [hidden, g.const("w_rand_heads", w_rand)])])
  features = g.gemm(hidden, (rng.standard_normal((64, N_FEATURES)) * 0.3).astype(np.float32), np.zeros(N_FEATURES))
  out = g.op("Concat", [driver, features], axis=1)
  g.nodes.append(helper.make_node("Identity", [out], ["outputs"], name="outputs"))

  graph = helper.make_graph(
    g.nodes, "dmonitoring_model",
    [helper.make_tensor_value_info("input_img", TensorProto.UINT8, [1, IN_W * IN_H]),
     helper.make_tensor_value_info("calib", TensorProto.FLOAT, [1, 3])],
    [helper.make_tensor_value_info("outputs", TensorProto.FLOAT, [1, 41 + N_FEATURES])],
    initializer=g.inits)
  model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                            producer_name="pymodeld-dm-generate", producer_version="1")
  model.ir_version = IR_VERSION
  helper.set_model_props(model, {"output_slices_json": json.dumps(output_slices(), sort_keys=False),
                                 "generator": "tools/gen_dm_model.py", "seed": str(SEED)})
  onnx.checker.check_model(model)
  return model


def model_bytes() -> bytes:
  return build_model().SerializeToString(deterministic=True)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default=MODEL_PATH)
  args = ap.parse_args(argv)
  data = model_bytes()
  with open(args.out, "wb") as f:
    f.write(data)
  print(f"wrote {args.out} ({len(data)} bytes)")


if __name__ == "__main__":
  main()
