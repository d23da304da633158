"""Deterministic generator of modeld's two road models (small for the CPU, big for the USB GPU).

    python -m tools.gen_road_models [--out DIR]

Both models have the reference base-model contract: inputs img / big_img uint8 (1, 12, 128, 256),
features_buffer (1, 24, 512), desire_pulse (1, 25, 8), traffic_convention (1, 2), action_t (1, 2); output
`outputs` float32 (1, 2576) whose heads are listed in metadata_props["output_slices_json"].

Architecture: one strided CNN encoder per camera input, a small temporal encoder over the feature history
and desire pulses, a fused hidden state (Tanh, fed back by the daemon as the next features_buffer entry), and
a low-rank linear head. Weights come from a fixed seed; head biases put every head in a plausible range (plan
forward at ~15 m/s, lane lines at +-1.8 / +-5.4 m, probabilities away from 0 and 1) and the head weights are
small, so the images modulate the outputs without saturating them. Only basic ops are used (see OPS_USED).

Invariant: the same onnx/numpy versions reproduce the files byte for byte (no timestamps, fixed ir/opset).
"""
import argparse
import json
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from daemons.modeld.constants import OUTPUT_HEADS, OUTPUT_SIZE, X_IDXS, T_IDXS
from daemons.modeld.model_state import MODEL_PATHS

# a tool beside the packages, not part of them: it writes where the daemon reads (MODELS_DIR)
MODELS_DIR = os.path.dirname(os.path.abspath(MODEL_PATHS["small"]))
IR_VERSION = 8
OPSET = 17

# (conv1 out, conv2 out, grouped conv channels, conv4 out, image embedding, hidden bottleneck)
SMALL = dict(name="small", seed=7, conv=(32, 48, 48, 64), embed=128, rank=128)
BIG = dict(name="big", seed=11, conv=(56, 72, 72, 96), embed=192, rank=160)
FILENAMES = {"small": "driving_small.onnx", "big": "driving_big.onnx"}


class _Builder:
  def __init__(self, rng: np.random.Generator):
    self.rng, self.nodes, self.inits, self.n = rng, [], [], 0

  def name(self, prefix: str) -> str:
    self.n += 1
    return f"{prefix}_{self.n}"

  def const(self, value: np.ndarray, prefix: str = "c") -> str:
    name = self.name(prefix)
    self.inits.append(numpy_helper.from_array(np.asarray(value), name))
    return name

  def op(self, op_type: str, inputs: list[str], **attrs) -> str:
    out = self.name(op_type.lower())
    self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
    return out

  def weight(self, shape: tuple[int, ...], fan_in: int, gain: float = 2.0) -> np.ndarray:
    return (self.rng.standard_normal(shape) * np.sqrt(gain / fan_in)).astype(np.float32)

  def conv(self, x: str, cin: int, cout: int, k: int, stride: int, pad: int, groups: int = 1) -> str:
    w = self.const(self.weight((cout, cin // groups, k, k), cin // groups * k * k), "w")
    b = self.const(np.zeros(cout, np.float32), "b")
    return self.op("Conv", [x, w, b], kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, group=groups)

  def dense(self, x: str, n_in: int, n_out: int, gain: float = 2.0) -> str:
    w = self.const(self.weight((n_in, n_out), n_in, gain), "w")
    b = self.const(np.zeros(n_out, np.float32), "b")
    return self.op("Gemm", [x, w, b])


def image_encoder(g: _Builder, img: str, conv: tuple[int, int, int, int], embed: int) -> str:
  c1, c2, c3, c4 = conv
  x = g.op("Cast", [img], to=TensorProto.FLOAT)
  x = g.op("Sub", [g.op("Mul", [x, g.const(np.float32(1 / 128))]), g.const(np.float32(1.0))])  # to [-1, 1)
  x = g.op("Relu", [g.conv(x, 12, c1, 4, 4, 0)])                    # (c1, 32, 64): 2x2-packed Y -> 8x8 px
  x = g.op("Relu", [g.conv(x, c1, c2, 3, 2, 1)])                    # (c2, 16, 32)
  x = g.op("Add", [x, g.op("LeakyRelu", [g.conv(x, c2, c3, 3, 1, 1, groups=4)], alpha=0.1)])  # residual
  x = g.op("Elu", [g.conv(x, c3, c4, 3, 2, 1)])                     # (c4, 8, 16)
  x = g.op("AveragePool", [x], kernel_shape=[2, 4], strides=[2, 4])  # (c4, 4, 4)
  x = g.op("Flatten", [x], axis=1)
  return g.op("Relu", [g.dense(x, c4 * 16, embed)])


def head_bias() -> np.ndarray:
  """Per-head biases that put the untrained model's outputs in a plausible driving range."""
  b = {name: np.zeros(width, np.float32) for name, width in OUTPUT_HEADS}
  meta = np.full(55, -3.0, np.float32)
  meta[0] = 2.0                    # engaged
  meta[4:31:6] = -4.0              # hard brake 3 m/s^2
  meta[6:31:6] = -5.0              # hard brake 5 m/s^2
  b["meta"] = meta
  b["desire_pred"] = np.tile(np.array([3.0] + [0.0] * 7, np.float32), 4)
  b["pose"][6:] = -2.0
  b["wide_from_device_euler"][3:] = -3.0
  b["road_transform"][6:] = -2.0
  lanes = np.zeros((4, 33, 2), np.float32)
  lanes[:, :, 0] = np.array([-5.4, -1.8, 1.8, 5.4], np.float32)[:, None]
  lanes[:, :, 1] = 1.2
  b["lane_lines"] = np.concatenate([lanes.ravel(), np.full(264, np.log(0.3), np.float32)])
  b["lane_lines_prob"] = np.array([-2.0, 1.0, -2.0, 2.5, -2.0, 2.5, -2.0, 1.0], np.float32)
  edges = np.zeros((2, 33, 2), np.float32)
  edges[:, :, 0] = np.array([-7.2, 7.2], np.float32)[:, None]
  edges[:, :, 1] = 1.2
  b["road_edges"] = np.concatenate([edges.ravel(), np.full(132, np.log(0.5), np.float32)])
  lead = np.zeros((3, 6, 4), np.float32)
  lead[:, :, 0] = 30.0 + 2.0 * np.arange(6)   # x: a lead 30 m ahead, slowly pulling away
  lead[:, :, 2] = 16.0                        # v
  b["lead"] = np.concatenate([lead.ravel(), np.zeros(72, np.float32)])
  b["lead_prob"] = np.array([0.5, -0.5, -1.5], np.float32)
  plan = np.zeros((33, 15), np.float32)
  plan[:, 0] = 15.0 * T_IDXS                  # position x at 15 m/s
  plan[:, 3] = 15.0                           # velocity x
  b["plan"] = np.concatenate([plan.ravel(), np.full(495, np.log(0.5), np.float32)])
  b["desire_state"] = np.array([4.0] + [0.0] * 7, np.float32)
  assert X_IDXS[-1] == 192.0
  return np.concatenate([b[name] for name, _ in OUTPUT_HEADS])


def build_model(cfg: dict) -> onnx.ModelProto:
  g = _Builder(np.random.default_rng(cfg["seed"]))
  img_shape = [1, 12, 128, 256]
  inputs = [helper.make_tensor_value_info("img", TensorProto.UINT8, img_shape),
            helper.make_tensor_value_info("big_img", TensorProto.UINT8, img_shape),
            helper.make_tensor_value_info("features_buffer", TensorProto.FLOAT, [1, 24, 512]),
            helper.make_tensor_value_info("desire_pulse", TensorProto.FLOAT, [1, 25, 8]),
            helper.make_tensor_value_info("traffic_convention", TensorProto.FLOAT, [1, 2]),
            helper.make_tensor_value_info("action_t", TensorProto.FLOAT, [1, 2])]

  road = image_encoder(g, "img", cfg["conv"], cfg["embed"])
  wide = image_encoder(g, "big_img", cfg["conv"], cfg["embed"])
  feats = g.op("Tanh", [g.op("MatMul", ["features_buffer", g.const(g.weight((512, 32), 512, 1.0), "w")])])
  feats = g.op("Relu", [g.dense(g.op("Flatten", [feats], axis=1), 24 * 32, 128)])
  desire = g.op("Relu", [g.dense(g.op("Flatten", ["desire_pulse"], axis=1), 200, 32)])
  action_t = g.op("Clip", ["action_t", g.const(np.float32(0.0)), g.const(np.float32(5.0))])
  fused = g.op("Concat", [road, wide, feats, desire, "traffic_convention", action_t], axis=1)
  n_fused = 2 * cfg["embed"] + 128 + 32 + 2 + 2
  hidden = g.op("Relu", [g.dense(fused, n_fused, 512)])
  hidden = g.op("Tanh", [g.dense(hidden, 512, 512, gain=1.0)])      # the hidden_state head, in (-1, 1)

  bias = head_bias()
  hs = dict(zip([n for n, _ in OUTPUT_HEADS], np.cumsum([0] + [w for _, w in OUTPUT_HEADS])))["hidden_state"]
  other = np.concatenate([bias[:hs], bias[hs + 512:]])
  # small weights scaled with each output's magnitude, so images modulate the biases without swamping them
  low = g.op("Relu", [g.dense(hidden, 512, cfg["rank"])])
  w_out = g.rng.standard_normal((cfg["rank"], other.size)).astype(np.float32)
  w_out *= (0.15 / np.sqrt(cfg["rank"]) * (1.0 + 0.05 * np.abs(other)) / 3.0).astype(np.float32)
  heads = g.op("Gemm", [low, g.const(w_out, "w"), g.const(other.astype(np.float32), "b")])
  before = g.op("Slice", [heads, g.const(np.array([0], np.int64)), g.const(np.array([hs], np.int64)),
                          g.const(np.array([1], np.int64))])
  after = g.op("Slice", [heads, g.const(np.array([hs], np.int64)), g.const(np.array([other.size], np.int64)),
                         g.const(np.array([1], np.int64))])
  out = g.op("Concat", [before, hidden, after], axis=1)
  g.nodes.append(helper.make_node("Identity", [out], ["outputs"], name="outputs"))

  graph = helper.make_graph(g.nodes, f"driving_{cfg['name']}", inputs,
                            [helper.make_tensor_value_info("outputs", TensorProto.FLOAT, [1, OUTPUT_SIZE])], g.inits)
  model = helper.make_model(graph, producer_name="pymodeld", producer_version="1",
                            opset_imports=[helper.make_opsetid("", OPSET)])
  model.ir_version = IR_VERSION
  slices, start = {}, 0
  for name, width in OUTPUT_HEADS:
    slices[name] = [start, start + width]
    start += width
  for key, value in (("output_slices_json", json.dumps(slices)), ("model_checkpoint", f"pymodeld-{cfg['name']}-seed{cfg['seed']}"),
                     ("model_name", cfg["name"])):
    model.metadata_props.append(onnx.StringStringEntryProto(key=key, value=value))
  onnx.checker.check_model(model)
  return model


def generate(out_dir: str = MODELS_DIR) -> dict[str, str]:
  paths = {}
  for cfg in (SMALL, BIG):
    path = os.path.join(out_dir, FILENAMES[cfg["name"]])
    with open(path, "wb") as f:
      f.write(build_model(cfg).SerializeToString())
    paths[cfg["name"]] = path
  return paths


if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=MODELS_DIR, help="output directory (default: the daemon's models/)")
  for name, path in generate(parser.parse_args().out).items():
    print(f"{name}: {path} ({os.path.getsize(path)} bytes)")
