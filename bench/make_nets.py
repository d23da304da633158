"""Deterministic benchmark models with non-constant weights (a fixed seed makes every byte reproducible).

    python -m bench.make_nets [--out DIR]      (default ~/.cache/pymodeld/bench-nets; files are made once)

- patchify: shaped like our DM model's image path: a 1-channel 1440x960 input, a 4x4 stride-4 patchify conv,
  then stride-2 3x3 convs (ReLU), a global average pool and a linear head;
- mobilenet: a depthwise mobilenet-like net: a stride-2 stem, blocks of depthwise 3x3 + pointwise 1x1 with
  ReLU6 (Clip), some strided, a global average pool and a linear head;
- the onnx package's light models with every ConstantOfShape weight replaced by a fixed-seed random initializer
  of the same shape (He-scaled conv/gemm weights, plausible BatchNorm statistics), so nothing folds away.
"""
from __future__ import annotations

import argparse
import glob
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
NETS_DIR = os.path.join(os.path.expanduser("~"), ".cache", "pymodeld", "bench-nets")  # ~1.3 GB, outside the tree


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


def all_models(out_dir: str) -> list[tuple[str, str]]:
  """Write every benchmark model into out_dir (once) and return (name, path) pairs."""
  os.makedirs(out_dir, exist_ok=True)
  made = []
  for name, build in (("patchify_1440x960", patchify_net), ("mobilenet_dw", mobilenet_net)):
    p = os.path.join(out_dir, name + ".onnx")
    if not os.path.exists(p):
      onnx.save(build(), p)
    made.append((name, p))
  for src in sorted(glob.glob(os.path.join(LIGHT_DIR, "*.onnx"))):
    name = os.path.basename(src)[6:-5] + "_rand"
    p = os.path.join(out_dir, name + ".onnx")
    if not os.path.exists(p):
      onnx.save(randomized_light(src), p)
    made.append((name, p))
  return made


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default=NETS_DIR)
  for name, path in all_models(ap.parse_args().out):
    print(f"{name}: {path}")


if __name__ == "__main__":
  main()
