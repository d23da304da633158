"""Deterministic benchmark models with non-constant weights (a fixed seed makes every byte reproducible).

    python -m bench.make_nets [--out DIR]      (default ~/.cache/pymodeld/bench-nets; files are made once)

- patchify: shaped like our DM model's image path: a 1-channel 1440x960 input, a 4x4 stride-4 patchify conv,
  then stride-2 3x3 convs (ReLU), a global average pool and a linear head;
- mobilenet: a depthwise mobilenet-like net: a stride-2 stem, blocks of depthwise 3x3 + pointwise 1x1 with
  ReLU6 (Clip), some strided, a global average pool and a linear head;
- the onnx package's light models with every ConstantOfShape weight replaced by a fixed-seed random initializer
  of the same shape (He-scaled conv/gemm weights, plausible BatchNorm statistics), so nothing folds away;
- standard architectures built here from a fixed seed: mobilenet_v2, vgg19_half, efficientnet_b0_like, unet
  (ConvTranspose, Resize, Concat skips), transformer_2blk (attention, LayerNormalization, GELU by Erf),
  lstm_unrolled (8 steps of MatMul + Sigmoid/Tanh) and lstm_op (the same layer as one ONNX LSTM op).
"""
from __future__ import annotations

import argparse
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
NETS_DIR = os.path.join(os.path.expanduser("~"), ".cache", "pymodeld", "bench-nets")  # ~0.9 GB, outside the tree


class _Net:
  def __init__(self, seed: int):
    self.rng, self.nodes, self.inits, self.n = np.random.default_rng(seed), [], [], 0

  def name(self, p: str) -> str:
    self.n += 1
    return f"{p}{self.n}"

  def const(self, a: np.ndarray, p: str = "w") -> str:
    n = self.name(p)
    self.inits.append(numpy_helper.from_array(a.astype(np.float32), n))
    return n

  def ints(self, v: list[int], p: str = "i") -> str:
    """An int64 initializer (shapes, axes): const() would make it float32, which those inputs refuse."""
    n = self.name(p)
    self.inits.append(numpy_helper.from_array(np.array(v, np.int64), n))
    return n

  def op(self, op: str, ins: list[str], **attrs) -> str:
    out = self.name(op.lower())
    self.nodes.append(helper.make_node(op, ins, [out], **attrs))
    return out

  def conv(self, x: str, cin: int, cout: int, k: int, s: int, pad: int, group: int = 1, act: str | None = "Relu"):
    w = self.rng.standard_normal((cout, cin // group, k, k)) * np.sqrt(2.0 / (cin // group * k * k))
    b = self.rng.standard_normal(cout) * 0.05
    y = self.op("Conv", [x, self.const(w), self.const(b, "b")], kernel_shape=[k, k], strides=[s, s],
                pads=[pad] * 4, group=group)
    if act == "Relu":
      y = self.op("Relu", [y])
    elif act == "Relu6":
      y = self.op("Clip", [y, self.const(np.array(0.0), "lo"), self.const(np.array(6.0), "hi")])
    return y

  def head(self, x: str, c: int, n_out: int) -> str:
    g = self.op("GlobalAveragePool", [x])
    f = self.op("Flatten", [g], axis=1)
    w = self.rng.standard_normal((c, n_out)) * np.sqrt(1.0 / c)
    return self.op("Gemm", [f, self.const(w), self.const(self.rng.standard_normal(n_out) * 0.05, "b")])

  def model(self, name: str, inputs, out: str, out_shape) -> onnx.ModelProto:
    g = helper.make_graph(self.nodes, name, inputs, [helper.make_tensor_value_info(out, TensorProto.FLOAT, out_shape)],
                          self.inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="pymodeld-bench")
    m.ir_version = 8
    return m


def patchify_net() -> onnx.ModelProto:
  n = _Net(1)
  x = "img"
  y = n.op("Mul", [x, n.const(np.array(1 / 255.0), "s")])
  y = n.conv(y, 1, 16, 4, 4, 0)            # 1440x960 -> 360x240
  y = n.conv(y, 16, 24, 3, 2, 1)           # 180x120
  y = n.conv(y, 24, 32, 3, 2, 1)           # 90x60
  y = n.conv(y, 32, 48, 3, 2, 1)           # 45x30
  y = n.conv(y, 48, 64, 3, 2, 1)           # 23x15
  out = n.head(y, 64, 16)
  return n.model("patchify", [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 1, 960, 1440])], out, [1, 16])


def mobilenet_net() -> onnx.ModelProto:
  n = _Net(2)
  x = "image"
  y = n.conv(x, 3, 16, 3, 2, 1, act="Relu6")   # 160 -> 80
  c = 16
  for cout, s in ((24, 2), (24, 1), (32, 2), (32, 1), (64, 2), (64, 1), (96, 1), (128, 2), (128, 1)):
    y = n.conv(y, c, c, 3, s, 1, group=c, act="Relu6")   # depthwise
    y = n.conv(y, c, cout, 1, 1, 0, act="Relu6")         # pointwise
    c = cout
  out = n.head(y, c, 100)
  return n.model("mobilenet", [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 3, 160, 160])], out, [1, 100])


def mobilenet_v2_net() -> onnx.ModelProto:
  """MobileNetV2's layout at width 1.0 on a 192x192 input: inverted residuals (1x1 expand, depthwise 3x3,
  linear 1x1 project) with ReLU6, a residual Add wherever the block keeps its shape."""
  n = _Net(3)
  x = "image"
  y = n.conv(x, 3, 32, 3, 2, 1, act="Relu6")   # 192 -> 96
  c = 32
  for t, cout, reps, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                           (6, 320, 1, 1)):
    for i in range(reps):
      stride, hid = (s if i == 0 else 1), c * t
      h = n.conv(y, c, hid, 1, 1, 0, act="Relu6") if t != 1 else y
      h = n.conv(h, hid, hid, 3, stride, 1, group=hid, act="Relu6")
      h = n.conv(h, hid, cout, 1, 1, 0, act=None)
      y = n.op("Add", [y, h]) if stride == 1 and c == cout else h
      c = cout
  y = n.conv(y, c, 1280, 1, 1, 0, act="Relu6")
  out = n.head(y, 1280, 1000)
  return n.model("mobilenet_v2", [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 3, 192, 192])], out, [1, 1000])


def vgg19_net() -> onnx.ModelProto:
  """VGG19's 16 3x3 convs in 5 stages and its 3 dense layers, at half the channels on a 112x112 input
  (about 1/16 of VGG19's multiply-adds, so a run stays far under a second)."""
  n = _Net(4)
  x = "image"
  y, c = x, 3
  for cout, reps in ((32, 2), (64, 2), (128, 4), (256, 4), (256, 4)):
    for _ in range(reps):
      y = n.conv(y, c, cout, 3, 1, 1)
      c = cout
    y = n.op("MaxPool", [y], kernel_shape=[2, 2], strides=[2, 2])
  f = n.op("Flatten", [y], axis=1)   # 256 x 3 x 3
  for i, (fin, fout) in enumerate(((c * 9, 1024), (1024, 1024), (1024, 1000))):
    w = n.rng.standard_normal((fin, fout)) * np.sqrt(2.0 / fin)
    f = n.op("Gemm", [f, n.const(w), n.const(n.rng.standard_normal(fout) * 0.05, "b")])
    if i < 2:
      f = n.op("Relu", [f])
  return n.model("vgg19_half", [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 3, 112, 112])], f, [1, 1000])


def _silu(n: _Net, x: str) -> str:
  return n.op("Mul", [x, n.op("Sigmoid", [x])])


def efficientnet_net() -> onnx.ModelProto:
  """EfficientNet-B0's block layout on a 160x160 input: MBConv blocks of 1x1 expand, depthwise 3x3/5x5, a
  squeeze-excite (global pool, reduce, SiLU, expand, Sigmoid, Mul), a linear 1x1 project and residual Adds;
  SiLU written as x * Sigmoid(x) as exporters write it."""
  n = _Net(5)
  x = "image"
  y = _silu(n, n.conv(x, 3, 32, 3, 2, 1, act=None))   # 160 -> 80
  c = 32
  for t, k, cout, reps, s in ((1, 3, 16, 1, 1), (6, 3, 24, 2, 2), (6, 5, 40, 2, 2), (6, 3, 80, 3, 2), (6, 5, 112, 3, 1),
                              (6, 5, 192, 4, 2), (6, 3, 320, 1, 1)):
    for i in range(reps):
      stride, hid = (s if i == 0 else 1), c * t
      h = _silu(n, n.conv(y, c, hid, 1, 1, 0, act=None)) if t != 1 else y
      h = _silu(n, n.conv(h, hid, hid, k, stride, k // 2, group=hid, act=None))
      sq = max(1, c // 4)
      g = n.op("GlobalAveragePool", [h])
      g = _silu(n, n.conv(g, hid, sq, 1, 1, 0, act=None))
      g = n.op("Sigmoid", [n.conv(g, sq, hid, 1, 1, 0, act=None)])
      h = n.op("Mul", [h, g])
      h = n.conv(h, hid, cout, 1, 1, 0, act=None)
      y = n.op("Add", [y, h]) if stride == 1 and c == cout else h
      c = cout
  y = _silu(n, n.conv(y, c, 1280, 1, 1, 0, act=None))
  out = n.head(y, 1280, 1000)
  return n.model("efficientnet_b0_like", [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 3, 160, 160])], out,
                 [1, 1000])


def unet_net() -> onnx.ModelProto:
  """A 3-level U-Net on a 1x3x128x128 input: two 3x3 convs per level, MaxPool down; up through a ConvTranspose
  (stride 2) at the deepest level and nearest Resize + 3x3 conv above it; Concat skips; a 1x1 conv to 4 classes."""
  n = _Net(6)
  x = "image"
  y, c, skips = x, 3, []
  for cout in (16, 32, 64):
    y = n.conv(n.conv(y, c, cout, 3, 1, 1), cout, cout, 3, 1, 1)
    skips.append((y, cout))
    y = n.op("MaxPool", [y], kernel_shape=[2, 2], strides=[2, 2])
    c = cout
  y = n.conv(n.conv(y, c, 128, 3, 1, 1), 128, 128, 3, 1, 1)
  c = 128
  for level, (skip, sc) in enumerate(reversed(skips)):
    if level == 0:
      w = n.rng.standard_normal((c, sc, 2, 2)) * np.sqrt(2.0 / (c * 4))
      y = n.op("ConvTranspose", [y, n.const(w), n.const(n.rng.standard_normal(sc) * 0.05, "b")], kernel_shape=[2, 2],
               strides=[2, 2])
    else:
      y = n.op("Resize", [y, "", n.const(np.array([1, 1, 2, 2]), "scales")], mode="nearest")
      y = n.conv(y, c, sc, 3, 1, 1)
    y = n.op("Concat", [skip, y], axis=1)
    y = n.conv(n.conv(y, 2 * sc, sc, 3, 1, 1), sc, sc, 3, 1, 1)
    c = sc
  out = n.conv(y, c, 4, 1, 1, 0, act=None)
  return n.model("unet", [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 3, 128, 128])], out, [1, 4, 128, 128])


def transformer_net() -> onnx.ModelProto:
  """Two pre-norm transformer encoder blocks (BERT-small-like): 128 tokens of width 256, 4 heads of 64,
  LayerNormalization, MatMul attention with a scaled Softmax, a 1024-wide MLP with exact GELU (Erf)."""
  n = _Net(7)
  seq, d, heads, ff = 128, 256, 4, 1024
  dh = d // heads
  x = "tokens"

  def dense(v, fin, fout):
    w = n.rng.standard_normal((fin, fout)) * np.sqrt(1.0 / fin)
    return n.op("Add", [n.op("MatMul", [v, n.const(w)]), n.const(n.rng.standard_normal(fout) * 0.02, "b")])

  def norm(v):
    return n.op("LayerNormalization", [v, n.const(n.rng.uniform(0.8, 1.2, d), "g"), n.const(n.rng.normal(0, 0.05, d), "b")],
                axis=-1, epsilon=1e-5)

  def heads_of(v):   # (1, seq, d) -> (1, heads, seq, dh)
    r = n.op("Reshape", [v, n.ints([1, seq, heads, dh], "shape")])
    return n.op("Transpose", [r], perm=[0, 2, 1, 3])

  y = x
  for _ in range(2):
    h = norm(y)
    q, k, v = (heads_of(dense(h, d, d)) for _ in range(3))
    kt = n.op("Transpose", [k], perm=[0, 1, 3, 2])
    s = n.op("Mul", [n.op("MatMul", [q, kt]), n.const(np.array(1 / np.sqrt(dh)), "scale")])
    a = n.op("MatMul", [n.op("Softmax", [s], axis=-1), v])
    a = n.op("Reshape", [n.op("Transpose", [a], perm=[0, 2, 1, 3]), n.ints([1, seq, d], "shape")])
    y = n.op("Add", [y, dense(a, d, d)])
    h = dense(norm(y), d, ff)
    erf = n.op("Erf", [n.op("Mul", [h, n.const(np.array(1 / np.sqrt(2)), "s")])])
    h = n.op("Mul", [n.op("Mul", [h, n.op("Add", [erf, n.const(np.array(1.0), "one")])]), n.const(np.array(0.5), "half")])
    y = n.op("Add", [y, dense(h, ff, d)])
  return n.model("transformer", [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, seq, d])], y, [1, seq, d])


LSTM_STEPS, LSTM_BATCH, LSTM_IN, LSTM_HID = 8, 16, 128, 256


def lstm_unrolled_net() -> onnx.ModelProto:
  """An LSTM layer unrolled over 8 steps (batch 16, input 128, hidden 256), as a tracing exporter writes one:
  per step X_t W + H R + b, Split into the i/o/f/c gates, Sigmoid and Tanh, the cell update; the last H out."""
  n = _Net(8)
  x = "seq"
  hid = LSTM_HID
  w = n.const(n.rng.standard_normal((LSTM_IN, 4 * hid)) * np.sqrt(1.0 / LSTM_IN))
  r = n.const(n.rng.standard_normal((hid, 4 * hid)) * np.sqrt(1.0 / hid))
  b = n.const(n.rng.standard_normal(4 * hid) * 0.05, "b")
  h = n.const(np.zeros((LSTM_BATCH, hid)), "h0")
  cell = n.const(np.zeros((LSTM_BATCH, hid)), "c0")
  steps = [n.name("x") for _ in range(LSTM_STEPS)]
  n.nodes.append(helper.make_node("Split", [x], steps, axis=0))   # opset 17: equal parts, one per output
  for t in range(LSTM_STEPS):
    xt = n.op("Squeeze", [steps[t], n.ints([0], "axes")])
    z = n.op("Add", [n.op("Add", [n.op("MatMul", [xt, w]), n.op("MatMul", [h, r])]), b])
    gates = [n.name("g") for _ in range(4)]
    n.nodes.append(helper.make_node("Split", [z], gates, axis=1))
    i, o, f = (n.op("Sigmoid", [g]) for g in gates[:3])
    g = n.op("Tanh", [gates[3]])
    cell = n.op("Add", [n.op("Mul", [f, cell]), n.op("Mul", [i, g])])
    h = n.op("Mul", [o, n.op("Tanh", [cell])])
  return n.model("lstm_unrolled", [helper.make_tensor_value_info(x, TensorProto.FLOAT, [LSTM_STEPS, LSTM_BATCH, LSTM_IN])],
                 h, [LSTM_BATCH, hid])


def lstm_op_net() -> onnx.ModelProto:
  """The same LSTM layer as lstm_unrolled_net, written as the ONNX LSTM op (what a non-tracing exporter emits)."""
  n = _Net(8)
  hid = LSTM_HID
  w = n.const(n.rng.standard_normal((1, 4 * hid, LSTM_IN)) * np.sqrt(1.0 / LSTM_IN))
  r = n.const(n.rng.standard_normal((1, 4 * hid, hid)) * np.sqrt(1.0 / hid))
  b = n.const(n.rng.standard_normal((1, 8 * hid)) * 0.05, "b")
  n.nodes.append(helper.make_node("LSTM", ["seq", w, r, b], ["", "h_last"], hidden_size=hid))
  return n.model("lstm_op", [helper.make_tensor_value_info("seq", TensorProto.FLOAT, [LSTM_STEPS, LSTM_BATCH, LSTM_IN])],
                 "h_last", [1, LSTM_BATCH, hid])


def randomized_light(path: str, seed: int = 0) -> onnx.ModelProto:
  """The light model at path with its ConstantOfShape weights turned into random initializers."""
  m = onnx.load(path)
  g = m.graph
  rng = np.random.default_rng(seed)
  consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
  for n in g.node:
    if n.op_type == "Constant":
      for a in n.attribute:
        if a.name == "value":
          consts[n.output[0]] = numpy_helper.to_array(a.t)
  uses: dict[str, tuple[str, int]] = {}
  for n in g.node:
    for i, name in enumerate(n.input):
      uses.setdefault(name, (n.op_type, i))
  keep, new_inits = [], []
  for n in g.node:
    if n.op_type != "ConstantOfShape":
      keep.append(n)
      continue
    shape = tuple(int(v) for v in consts[n.input[0]])
    op, slot = uses.get(n.output[0], ("", -1))
    if op in ("Conv", "Gemm", "MatMul") and slot == 1:
      fan_in = int(np.prod(shape[1:])) if op == "Conv" else (shape[0] if op == "MatMul" else int(np.prod(shape[1:])))
      a = rng.standard_normal(shape) * np.sqrt(2.0 / max(1, fan_in))
    elif op == "BatchNormalization":
      a = {1: rng.uniform(0.3, 0.7, shape), 2: rng.normal(0, 0.1, shape), 3: rng.normal(0, 0.1, shape),
           4: rng.uniform(0.5, 1.5, shape)}.get(slot, rng.normal(0, 0.1, shape))
    else:
      a = rng.normal(0, 0.05, shape)
    new_inits.append(numpy_helper.from_array(a.astype(np.float32), n.output[0]))
  del g.node[:]
  g.node.extend(keep)
  g.initializer.extend(new_inits)
  return m


LIGHT_STANDARD = ("resnet50", "inception_v1", "inception_v2", "densenet121", "squeezenet", "shufflenet", "bvlc_alexnet",
                  "zfnet512")
# Standard architectures the bench builds itself; lstm_op is the same layer as lstm_unrolled written as the LSTM op.
BUILT_STANDARD = (("mobilenet_v2", mobilenet_v2_net), ("vgg19_half", vgg19_net), ("efficientnet_b0_like", efficientnet_net),
                  ("unet", unet_net), ("transformer_2blk", transformer_net), ("lstm_unrolled", lstm_unrolled_net),
                  ("lstm_op", lstm_op_net))
DAEMON_SHAPED = (("patchify_1440x960", patchify_net), ("mobilenet_dw", mobilenet_net))


def _write_built(out_dir: str, name: str, build) -> str:
  """A built model is rewritten whenever its bytes change, so an edited builder never leaves a stale file."""
  p = os.path.join(out_dir, name + ".onnx")
  data = build().SerializeToString()
  if not os.path.exists(p) or os.path.getsize(p) != len(data) or open(p, "rb").read() != data:
    with open(p + ".tmp", "wb") as f:
      f.write(data)
    os.replace(p + ".tmp", p)
  return p


def model_groups(out_dir: str) -> dict[str, list[tuple[str, str]]]:
  """Write every benchmark model into out_dir and return {group: [(name, path)]}: "standard" (the light models in
  LIGHT_STANDARD that this onnx package ships, re-weighted, then BUILT_STANDARD) and "daemon_shaped" (nets shaped
  after our daemons' models, which the runtime was tuned on). Light vgg19 is left out: at 224x224 one run takes
  seconds here, and vgg19_half stands for it."""
  os.makedirs(out_dir, exist_ok=True)
  standard = []
  for name in LIGHT_STANDARD:
    src = os.path.join(LIGHT_DIR, f"light_{name}.onnx")
    if not os.path.exists(src):
      continue
    p = os.path.join(out_dir, name + "_rand.onnx")
    if not os.path.exists(p):
      onnx.save(randomized_light(src), p)
    standard.append((name + "_rand", p))
  standard += [(name, _write_built(out_dir, name, build)) for name, build in BUILT_STANDARD]
  return {"standard": standard, "daemon_shaped": [(name, _write_built(out_dir, name, b)) for name, b in DAEMON_SHAPED]}


def all_models(out_dir: str) -> list[tuple[str, str]]:
  """Every model of model_groups, in one list."""
  return [m for ms in model_groups(out_dir).values() for m in ms]


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default=NETS_DIR)
  for name, path in all_models(ap.parse_args().out):
    print(f"{name}: {path}")


if __name__ == "__main__":
  main()
