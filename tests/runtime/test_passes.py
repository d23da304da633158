"""Passes and fusion: constant folding (incl. shape arithmetic), BatchNorm folded into Conv, elementwise
prologues and epilogues fused into the kernel of their reduction, concat inputs stored in place, views that
never copy; and the inspect CLI."""
import os
import re
import subprocess
import sys

import numpy as np
from onnx import helper, numpy_helper

from runtime import OnnxRunner
from runtime.onnx_import import import_onnx
from runtime.program import build_program

from rt_helpers import ONNX_DATA, node_model, ort_run

rng = np.random.default_rng(3)


def kernel_ops(program) -> list[list[str]]:
  return [k.tags.get("ops", []) for k in program.kernels]


def test_shape_arithmetic_folds_away_and_a_reshape_is_only_the_output_copy():
  x = rng.standard_normal((2, 3, 4)).astype(np.float32)
  nodes = [helper.make_node("Shape", ["x"], ["s"]),
           helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.array([0], np.int64))),
           helper.make_node("Gather", ["s", "k"], ["n"], axis=0),
           helper.make_node("Constant", [], ["m1"], value=numpy_helper.from_array(np.array([-1], np.int64))),
           helper.make_node("Concat", ["n", "m1"], ["shape"], axis=0),
           helper.make_node("Reshape", ["x", "shape"], ["y0"])]
  model = node_model(nodes, {"x": x}, {})
  p = build_program(import_onnx(model))
  assert p.op_counts() == {"Reshape": 1}  # shape arithmetic ran at compile time
  assert len(p.kernels) == 1              # the output's own buffer is the one copy; the reshape is a view
  np.testing.assert_array_equal(OnnxRunner(model)(x=x)["y0"], x.reshape(2, 12))


def test_batchnorm_folds_into_conv_and_the_relu_fuses_into_its_kernel():
  x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
  consts = {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "s": rng.uniform(0.5, 2, 4).astype(np.float32),
            "b": rng.standard_normal(4).astype(np.float32), "m": rng.standard_normal(4).astype(np.float32),
            "v": rng.uniform(0.5, 2, 4).astype(np.float32)}
  nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
           helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"], epsilon=1e-3),
           helper.make_node("Relu", ["n"], ["y0"])]
  model = node_model(nodes, {"x": x}, consts)
  r = OnnxRunner(model)
  assert r.program.op_counts() == {"Conv": 1, "Relu": 1}
  assert kernel_ops(r.program) == [["Conv", "Relu"]]  # one fused kernel (it reads the padding through gated loads)
  np.testing.assert_allclose(r(x=x)["y0"], ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-5)
  unfolded = OnnxRunner(model, config={"fold_batchnorm": False})
  assert unfolded.program.op_counts()["BatchNormalization"] == 1
  assert kernel_ops(unfolded.program) == [["Conv", "BatchNormalization", "Relu"]]  # still one kernel
  np.testing.assert_allclose(unfolded(x=x)["y0"], r(x=x)["y0"], rtol=1e-4, atol=1e-5)


def test_residual_add_and_relu_fuse_into_the_conv_epilogue():
  x = rng.standard_normal((1, 4, 5, 5)).astype(np.float32)
  w = rng.standard_normal((4, 4, 1, 1)).astype(np.float32)
  nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
           helper.make_node("Add", ["x", "c"], ["a"]),
           helper.make_node("Relu", ["a"], ["y0"])]
  model = node_model(nodes, {"x": x}, {"w": w})
  r = OnnxRunner(model)
  assert kernel_ops(r.program) == [["Conv", "Add", "Relu"]]
  np.testing.assert_allclose(r(x=x)["y0"], ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_a_pure_elementwise_chain_is_one_kernel():
  x = rng.standard_normal((3, 40)).astype(np.float32)
  nodes = [helper.make_node("Mul", ["x", "k"], ["a"]), helper.make_node("Sigmoid", ["a"], ["b"]),
           helper.make_node("Sub", ["b", "x"], ["c"]), helper.make_node("Tanh", ["c"], ["y0"])]
  model = node_model(nodes, {"x": x}, {"k": np.float32(0.5) * np.ones((1, 40), np.float32)})
  r = OnnxRunner(model)
  assert kernel_ops(r.program) == [["Mul", "Sigmoid", "Sub", "Tanh"]]
  np.testing.assert_allclose(r(x=x)["y0"], ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_a_value_read_twice_gets_its_own_buffer_unless_its_readers_meet_again():
  x = rng.standard_normal((3, 4)).astype(np.float32)
  nodes = [helper.make_node("Exp", ["x"], ["e"]),
           helper.make_node("Relu", ["e"], ["y0"]),
           helper.make_node("Neg", ["e"], ["y1"])]
  r = OnnxRunner(node_model(nodes, {"x": x}, {}, outputs=("y0", "y1")))
  assert kernel_ops(r.program) == [["Exp"], ["Relu"], ["Neg"]]
  out = r(x=x)
  np.testing.assert_allclose(out["y0"], -out["y1"], atol=1e-6)
  nodes = [helper.make_node("Exp", ["x"], ["e"]),
           helper.make_node("Relu", ["e"], ["r"]),
           helper.make_node("Sub", ["r", "e"], ["y0"])]
  r = OnnxRunner(node_model(nodes, {"x": x}, {}))   # relu(e) - e: one expression of e, computed once
  assert kernel_ops(r.program) == [["Exp", "Relu", "Sub"]]
  np.testing.assert_allclose(r(x=x)["y0"], np.zeros_like(x), atol=1e-6)


def test_inspect_cli_prints_kernels_strategies_and_fallbacks():
  model = os.path.join(ONNX_DATA, "light", "light_squeezenet.onnx")
  out = subprocess.run([sys.executable, "-m", "runtime.inspect", model], capture_output=True, text=True,
                       timeout=300, check=True).stdout
  for needle in ("inputs:", "data_0: [1, 3, 224, 224] float32", "outputs:", "Conv=26", "kernels:",
                 "fallback ops: none", "Conv+Relu", "planned arena:"):
    assert needle in out, needle
  # which conv strategies win depends on the target's vector width; every conv kernel names its strategy
  assert re.search(r"\b(im2col|pointwise|direct|direct_cm)\b", out), out[-2000:]


def test_per_channel_mul_and_add_fold_into_conv():
  x = rng.standard_normal((1, 3, 6, 6)).astype(np.float32)
  consts = {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "b": rng.standard_normal(4).astype(np.float32),
            "scale": rng.standard_normal((4, 1, 1)).astype(np.float32),
            "shift": rng.standard_normal((1, 4, 1, 1)).astype(np.float32),
            "full": rng.standard_normal((1, 4, 6, 6)).astype(np.float32)}
  nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
           helper.make_node("Mul", ["scale", "c"], ["m"]),
           helper.make_node("Add", ["m", "shift"], ["a"]),
           helper.make_node("Add", ["a", "full"], ["y0"])]  # varies spatially: must not fold
  model = node_model(nodes, {"x": x}, consts)
  r = OnnxRunner(model)
  assert r.program.op_counts() == {"Conv": 1, "Add": 1}
  np.testing.assert_allclose(r(x=x)["y0"], ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-5)


def _writer_of(program, value: str) -> list[str]:
  """The ops of the kernels whose first (written) buffer holds `value` (a concat's buffer holds its output)."""
  buf = next(b for b, info in program.bufs.items() if info.value == value)
  return [op for k in program.kernels if k.kind == "c" and k.params[0] == ("buf", buf) for op in k.tags.get("ops", ["copy"])]


def test_concat_inputs_are_stored_in_place_by_their_producers():
  x = rng.standard_normal((1, 3, 6, 6)).astype(np.float32)
  w1 = rng.standard_normal((4, 3, 1, 1)).astype(np.float32)
  w2 = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
  nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]),
           helper.make_node("Relu", ["a"], ["ar"]),
           helper.make_node("Conv", ["x", "w2"], ["b"], pads=[1, 1, 1, 1]),
           helper.make_node("Exp", ["b"], ["e"]),           # b is also read here: still placed, read in place
           helper.make_node("Concat", ["ar", "b", "x"], ["c"], axis=1),
           helper.make_node("Sub", ["c", "c"], ["z"]),
           helper.make_node("Concat", ["c", "e"], ["y0"], axis=1)]
  model = node_model(nodes, {"x": x}, {"w1": w1, "w2": w2})
  r = OnnxRunner(model)
  p = r.program
  assert len(p.kernels) == 4  # two convs, the copy of x and exp, each into the output (padding is read gated)
  assert _writer_of(p, "y0") == ["Conv", "Conv", "Relu", "Concat", "Exp"]  # Concat: the copy of x
  want = ort_run(model, {"x": x})[0]
  for _ in range(2):  # the second run sees the first run's arena contents
    np.testing.assert_allclose(r(x=x)["y0"], want, rtol=1e-4, atol=1e-5)
  off = OnnxRunner(model, config={"zero_copy_concat": False})
  assert len(off.program.kernels) > len(p.kernels)
  np.testing.assert_allclose(off(x=x)["y0"], want, rtol=1e-4, atol=1e-5)


def test_concat_on_a_later_axis_stores_strided_slices():
  x = rng.standard_normal((2, 3, 4)).astype(np.float32)
  nodes = [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Neg", ["x"], ["n"]),
           helper.make_node("Concat", ["e", "n"], ["c"], axis=1),  # slices of axis 1 are strided when N=2
           helper.make_node("Relu", ["c"], ["y0"])]
  model = node_model(nodes, {"x": x}, {})
  r = OnnxRunner(model)
  assert _writer_of(r.program, "c") == ["Exp", "Neg"]
  np.testing.assert_allclose(r(x=x)["y0"], np.maximum(np.concatenate([np.exp(x), -x], axis=1), 0), rtol=1e-6)


def _bn_relu_conv(scale, extra_reader=False, group=1):
  x = rng.standard_normal((1, 4, 7, 7)).astype(np.float32)
  consts = {"s": scale.astype(np.float32), "b": rng.standard_normal(4).astype(np.float32),
            "m": rng.standard_normal(4).astype(np.float32), "v": rng.uniform(0.5, 2, 4).astype(np.float32),
            "w": rng.standard_normal((6, 4 // group, 3, 3)).astype(np.float32),
            "cb": rng.standard_normal(6).astype(np.float32)}
  nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["n"], epsilon=1e-3),
           helper.make_node("Relu", ["n"], ["r"]),
           helper.make_node("Conv", ["r", "w", "cb"], ["y0"], pads=[1, 1, 1, 1], group=group)]
  outputs = ("y0", "r") if extra_reader else ("y0",)
  return node_model(nodes, {"x": x}, consts, outputs=outputs), x


def test_positive_batchnorm_scale_moves_into_the_conv_after_relu():
  for group in (1, 2):
    model, x = _bn_relu_conv(rng.uniform(0.2, 2, 4), group=group)
    r = OnnxRunner(model)
    assert r.program.op_counts() == {"Add": 1, "Relu": 1, "Conv": 1}  # one pass instead of BN's two
    np.testing.assert_allclose(r(x=x)["y0"], ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_batchnorm_scale_stays_when_a_scale_is_not_positive_or_the_relu_has_another_reader():
  for scale, extra in ((np.array([0.5, -0.3, 1.0, 2.0]), False), (np.array([0.5, 0.0, 1.0, 2.0]), False),
                       (rng.uniform(0.2, 2, 4), True)):
    model, x = _bn_relu_conv(scale, extra_reader=extra)
    r = OnnxRunner(model)
    assert r.program.op_counts().get("BatchNormalization") == 1
    ours, ref = r(x=x), ort_run(model, {"x": x})
    np.testing.assert_allclose(ours["y0"], ref[0], rtol=1e-4, atol=1e-4)


def test_batchnorm_scale_stays_when_the_shift_would_overflow():
  model, x = _bn_relu_conv(np.array([1e-44, 0.5, 1.0, 2.0]))  # b / a overflows float32 in channel 0
  r = OnnxRunner(model)
  assert r.program.op_counts().get("BatchNormalization") == 1
  np.testing.assert_allclose(r(x=x)["y0"], ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-4)
