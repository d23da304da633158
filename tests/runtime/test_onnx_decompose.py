"""Ops with no kernel and no function body in the spec that the importer decomposes into ops the compiler lowers
(QuantizeLinear, DequantizeLinear): each agrees with onnx's reference kernel, gives the same bits on a second
run, runs with no reference (numpy) fallback, and what it does not cover is refused naming the op."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from rt_helpers import memory_cache
from runtime import ModelError, OnnxRunner, UnsupportedDtypeError, UnsupportedOpError
from runtime.errors import MemoryBudgetError
from runtime.onnx_decompose import MAX_UNROLL


def _model(node, inputs: dict, opset=21) -> bytes:
  g = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in inputs.items()],
                        [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in node.output])
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


def _agrees(node, inputs: dict, opset=21, compiled=True):
  model = _model(node, inputs, opset)
  r = OnnxRunner(model, cache=memory_cache())
  got, again = r(**inputs), r(**inputs)
  want = ReferenceEvaluator(model).run(None, inputs)
  for name, w in zip(node.output, want):
    assert got[name].dtype == w.dtype and got[name].shape == w.shape, (got[name].dtype, w.dtype, got[name].shape, w.shape)
    np.testing.assert_array_equal(got[name], w)
    assert got[name].tobytes() == again[name].tobytes()
  assert not compiled or not r.program.fallbacks   # float16 values run on the reference kernels, by design


RNG = np.random.default_rng(4)
X = (RNG.standard_normal((2, 3, 4)) * 40).astype(np.float32)
# values at .5 steps round half to even, as np.rint does
HALVES = np.array([[-2.5, -1.5, -0.5, 0.5], [1.5, 2.5, 3.5, 400.0], [-400.0, 7.5, 8.5, 0.0]], np.float32)


@pytest.mark.parametrize("zp", [np.uint8(128), np.int8(-3), np.int16(-300), np.uint16(1000)], ids=str)
def test_quantize_linear_per_tensor_rounds_half_to_even_and_saturates_like_the_reference(zp):
  zp = np.asarray(zp)
  _agrees(helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"]), {"x": HALVES, "s": np.array(1.0, np.float32), "z": zp})
  _agrees(helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"]), {"x": X, "s": np.array(0.7, np.float32), "z": zp})


def test_quantize_linear_per_axis_and_blocked_agree_with_the_reference():
  s = np.array([0.5, 1.0, 2.0], np.float32)
  z = np.array([0, 10, -10], np.int8)
  _agrees(helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], axis=1), {"x": X, "s": s, "z": z})
  sb = np.abs(RNG.standard_normal((2, 3, 2))).astype(np.float32) + 0.1   # blocks of 3 over an axis of 4: 2 blocks, the last cut
  zb = RNG.integers(0, 30, (2, 3, 2)).astype(np.uint8)
  _agrees(helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], axis=2, block_size=3), {"x": X, "s": sb, "z": zb})


def test_quantize_linear_without_a_zero_point_gives_uint8():
  _agrees(helper.make_node("QuantizeLinear", ["x", "s"], ["y"]), {"x": np.abs(X), "s": np.array(0.3, np.float32)})


@pytest.mark.parametrize("x", [RNG.integers(-128, 128, (2, 3, 4)).astype(np.int8), RNG.integers(0, 65536, (2, 3, 4)).astype(np.uint16),
                               RNG.integers(-2**31, 2**31, (2, 3, 4)).astype(np.int32)], ids=lambda a: str(a.dtype))
def test_dequantize_linear_per_tensor_and_per_axis_agree_with_the_reference(x):
  _agrees(helper.make_node("DequantizeLinear", ["x", "s", "z"], ["y"]), {"x": x, "s": np.array(0.25, np.float32), "z": x.reshape(-1)[:1].reshape(())})
  _agrees(helper.make_node("DequantizeLinear", ["x", "s", "z"], ["y"], axis=-1),
          {"x": x, "s": np.array([0.5, 1, 2, 4], np.float32), "z": x[0, 0]})
  _agrees(helper.make_node("DequantizeLinear", ["x", "s"], ["y"], axis=-1),
          {"x": x, "s": np.array([0.5, 1, 2, 4], np.float16)}, compiled=False)


def test_dequantize_linear_blocked_agrees_with_the_reference():
  x = RNG.integers(-128, 128, (2, 6)).astype(np.int8)
  _agrees(helper.make_node("DequantizeLinear", ["x", "s"], ["y"], axis=1, block_size=4),
          {"x": x, "s": np.array([[0.5, 2.0], [1.5, 3.0]], np.float32)})


def test_dynamic_quantize_linear_runs_through_its_function_body_and_our_quantize():
  _agrees(helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "scale", "zp"]), {"x": X}, opset=21)


def test_quantize_linear_to_a_float8_type_is_refused_naming_the_op_and_type():
  node = helper.make_node("QuantizeLinear", ["x", "s"], ["y"], output_dtype=TensorProto.FLOAT8E4M3FN)
  with pytest.raises(UnsupportedDtypeError, match="QuantizeLinear to FLOAT8E4M3FN"):
    OnnxRunner(_model(node, {"x": X, "s": np.array(1, np.float32)}), cache=memory_cache())


def test_a_scale_that_fits_no_quantisation_layout_is_a_model_error():
  node = helper.make_node("DequantizeLinear", ["x", "s"], ["y"], axis=1)
  with pytest.raises(ModelError, match="DequantizeLinear.*neither one value nor one per index"):
    OnnxRunner(_model(node, {"x": X.astype(np.int8), "s": np.ones(5, np.float32)}), cache=memory_cache())


def _recurrent(op, nd, layout, extra=(), **attrs):
  G, H, I, S, N = {"RNN": 1, "GRU": 3, "LSTM": 4}[op], 5, 3, 4, 2
  rng = np.random.default_rng(7)
  f = lambda *s: rng.standard_normal(s).astype(np.float32)   # noqa: E731
  feeds = {"x": f(N, S, I) if layout else f(S, N, I), "w": f(nd, G * H, I), "r": f(nd, G * H, H), "b": f(nd, 2 * G * H)}
  names = ["x", "w", "r", "b", "", "h0"]
  feeds["h0"] = f(N, nd, H) if layout else f(nd, N, H)
  if op == "LSTM":
    names.append("c0")
    feeds["c0"] = f(N, nd, H) if layout else f(nd, N, H)
    if "p" in extra:
      names.append("p")
      feeds["p"] = f(nd, 3 * H)
  outs = ["y", "yh", "yc"][:3 if op == "LSTM" else 2]
  direction = "bidirectional" if nd == 2 else attrs.pop("direction", "forward")
  return helper.make_node(op, names, outs, hidden_size=H, layout=layout, direction=direction, **attrs), feeds


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("nd,layout", [(1, 0), (2, 1)], ids=["forward", "bidirectional-batch-first"])
def test_recurrent_ops_unrolled_over_the_sequence_agree_with_the_reference(op, nd, layout):
  node, feeds = _recurrent(op, nd, layout, extra=("p",))
  _agrees_close(node, feeds)


def test_a_reverse_gru_with_linear_before_reset_agrees_with_the_reference():
  node, feeds = _recurrent("GRU", 1, 0, direction="reverse", linear_before_reset=1)
  _agrees_close(node, feeds)


@pytest.mark.parametrize("attrs", [{"clip": 1.0}, {"activations": ["Relu"]}], ids=["clip", "activations"])
def test_recurrent_attributes_the_reference_ignores_are_refused(attrs):
  node, feeds = _recurrent("RNN", 1, 0, **attrs)
  with pytest.raises(UnsupportedOpError, match="RNN"):
    OnnxRunner(_model(node, feeds, opset=14), cache=memory_cache())


def _agrees_close(node, feeds):
  model = _model(node, feeds, opset=14)
  r = OnnxRunner(model, cache=memory_cache())
  got, again = r(**feeds), r(**feeds)
  for name, w in zip(node.output, ReferenceEvaluator(model).run(None, feeds)):
    assert got[name].dtype == w.dtype
    np.testing.assert_allclose(got[name], w, rtol=1e-5, atol=1e-6)
    assert got[name].tobytes() == again[name].tobytes()
  assert not r.program.fallbacks


EINSUMS = [("bij,bjk->bik", [(5, 2, 3), (5, 3, 4)]), ("...ii->...i", [(3, 5, 5)]), ("ij,jk", [(2, 3), (3, 4)]),
           ("i,j->ij", [(3,), (4,)]), ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)]), ("ii", [(4, 4)]),
           ("ijk->kji", [(2, 3, 4)]), ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)])]


@pytest.mark.parametrize("eq,shapes", EINSUMS, ids=[e for e, _ in EINSUMS])
def test_einsum_agrees_with_numpy(eq, shapes):
  rng = np.random.default_rng(8)
  feeds = {f"x{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
  model = _model(helper.make_node("Einsum", list(feeds), ["y"], equation=eq), feeds, opset=12)
  r = OnnxRunner(model, cache=memory_cache())
  got = r(**feeds)["y"]
  np.testing.assert_allclose(got, np.einsum(eq, *feeds.values()), rtol=1e-5, atol=1e-5)
  assert got.tobytes() == r(**feeds)["y"].tobytes() and not r.program.fallbacks


def test_an_einsum_whose_terms_do_not_fit_its_inputs_is_a_model_error():
  x = np.zeros((2, 3), np.float32)
  with pytest.raises(ModelError, match="Einsum.*does not fit"):
    OnnxRunner(_model(helper.make_node("Einsum", ["x"], ["y"], equation="ijk->i"), {"x": x}, opset=12), cache=memory_cache())


def test_matmul_integer_and_conv_integer_agree_with_the_reference():
  rng = np.random.default_rng(9)
  a, bm = rng.integers(0, 256, (4, 3)).astype(np.uint8), rng.integers(0, 256, (3, 5)).astype(np.uint8)
  _agrees(helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"]),
          {"a": a, "b": bm, "az": np.array([12], np.uint8), "bz": np.array([200], np.uint8)}, opset=10, compiled=False)
  x, w = rng.integers(-128, 128, (1, 2, 5, 5)).astype(np.int8), rng.integers(-128, 128, (3, 2, 3, 3)).astype(np.int8)
  _agrees(helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], pads=[1, 1, 1, 1]),
          {"x": x, "w": w, "xz": np.array(3, np.int8), "wz": np.array([1, -2, 5], np.int8)}, opset=10, compiled=False)


@pytest.mark.parametrize("batch_axis,time_axis", [(0, 1), (1, 0)])
def test_reverse_sequence_with_run_time_lengths_agrees_with_the_reference(batch_axis, time_axis):
  x = np.arange(4 * 5 * 3, dtype=np.float32).reshape((4, 5, 3) if batch_axis == 0 else (5, 4, 3))
  node = helper.make_node("ReverseSequence", ["x", "lens"], ["y"], batch_axis=batch_axis, time_axis=time_axis)
  model = _model(node, {"x": x, "lens": np.array([5, 1, 3, 0], np.int64)}, opset=10)
  r = OnnxRunner(model, cache=memory_cache())
  for lens in (np.array([5, 1, 3, 2], np.int64), np.array([1, 4, 5, 2], np.int64)):   # read on every call
    want = ReferenceEvaluator(model).run(None, {"x": x, "lens": lens})[0]
    np.testing.assert_array_equal(r(x=x, lens=lens)["y"], want)
  assert not r.program.fallbacks


@pytest.mark.parametrize("onesided", [0, 1])
@pytest.mark.parametrize("complex_in", [False, True])
def test_dft_forward_agrees_with_numpys_fft(onesided, complex_in):
  rng = np.random.default_rng(10)
  x = rng.standard_normal((2, 6, 3, 2 if complex_in else 1)).astype(np.float32)
  signal = x[..., 0] + 1j * x[..., 1] if complex_in else x[..., 0]
  want = np.fft.fft(signal.astype(np.complex128), axis=1)[:, :(4 if onesided else 6)]
  r = OnnxRunner(_model(helper.make_node("DFT", ["x"], ["y"], axis=1, onesided=onesided), {"x": x}, opset=17),
                 cache=memory_cache())
  got = r(x=x)["y"]
  np.testing.assert_allclose(got, np.stack([want.real, want.imag], -1).astype(np.float32), rtol=1e-5, atol=1e-5)


def test_dft_one_sided_inverse_agrees_with_numpys_irfft():
  rng = np.random.default_rng(11)
  x = rng.standard_normal((1, 5, 3, 2)).astype(np.float32)
  r = OnnxRunner(_model(helper.make_node("DFT", ["x"], ["y"], axis=1, inverse=1, onesided=1), {"x": x}, opset=17),
                 cache=memory_cache())
  want = np.fft.irfft((x[..., 0] + 1j * x[..., 1]).astype(np.complex128), n=8, axis=1)[..., None]
  np.testing.assert_allclose(r(x=x)["y"], want.astype(np.float32), rtol=1e-5, atol=1e-5)


def test_a_dft_axis_given_at_run_time_is_refused_naming_the_op():
  x = np.zeros((1, 4, 1), np.float32)
  model = _model(helper.make_node("DFT", ["x", "", "axis"], ["y"]), {"x": x, "axis": np.array(1, np.int64)}, opset=20)
  with pytest.raises(UnsupportedOpError, match="DFT with an axis input"):
    OnnxRunner(model, cache=memory_cache())


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
def test_qlinear_matmul_agrees_with_the_reference(dt):
  rng = np.random.default_rng(12)
  info = np.iinfo(dt)
  q = lambda *s: rng.integers(info.min, info.max + 1, s).astype(dt)   # noqa: E731
  feeds = {"a": q(2, 3, 4), "as": np.array([0.02], np.float32), "az": q(1), "b": q(4, 5), "bs": np.array([0.05], np.float32),
           "bz": q(1), "ys": np.array([0.3], np.float32), "yz": q(1)}
  _agrees(helper.make_node("QLinearMatMul", list(feeds), ["y"]), feeds, opset=10, compiled=False)


OPTIMIZERS = [("Adagrad", 3, {"decay_factor": 0.1, "epsilon": 1e-5, "norm_coefficient": 0.001}),
              ("Momentum", 3, {"alpha": 0.95, "beta": 0.1, "mode": "nesterov", "norm_coefficient": 0.01}),
              ("Adam", 4, {"alpha": 0.9, "beta": 0.85, "epsilon": 0.01, "norm_coefficient": 0.001, "norm_coefficient_post": 0.02})]


@pytest.mark.parametrize("op,groups,attrs", OPTIMIZERS, ids=[o for o, _, _ in OPTIMIZERS])
@pytest.mark.parametrize("t", [0, 3])
def test_training_optimizers_of_the_preview_domain_agree_with_the_reference(op, groups, attrs, t):
  rng = np.random.default_rng(13)
  names = [f"{k}{i}" for k in "xgvh"[:groups] for i in range(2)]
  feeds = {"r": np.array(0.1, np.float32), "t": np.array(t, np.int64)}
  feeds.update({n: np.abs(rng.standard_normal((3,) if n.endswith("0") else (2, 2))).astype(np.float32) for n in names})
  outs = [f"o{i}" for i in range(2 * (groups - 1))]
  node = helper.make_node(op, list(feeds), outs, domain="ai.onnx.preview.training", **attrs)
  g = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                                      for n, a in feeds.items()], [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs])
  model = helper.make_model(g, opset_imports=[helper.make_opsetid("ai.onnx.preview.training", 1)]).SerializeToString()
  r = OnnxRunner(model, cache=memory_cache())
  got = r(**feeds)
  for name, w in zip(outs, ReferenceEvaluator(model).run(None, feeds)):
    np.testing.assert_allclose(got[name], w, rtol=1e-5, atol=1e-6)
  assert not r.program.fallbacks


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [0, 1])
def test_grid_sample_agrees_with_the_reference_inside_and_far_outside_the_image(mode, padding_mode, align_corners):
  rng = np.random.default_rng(14)
  feeds = {"x": rng.standard_normal((2, 3, 4, 5)).astype(np.float32),
           "grid": (rng.standard_normal((2, 3, 6, 2)) * 1.6).astype(np.float32)}   # some points two images away
  node = helper.make_node("GridSample", ["x", "grid"], ["y"], mode=mode, padding_mode=padding_mode, align_corners=align_corners)
  model = _model(node, feeds, opset=20)
  r = OnnxRunner(model, cache=memory_cache())
  got = r(**feeds)["y"]
  np.testing.assert_allclose(got, ReferenceEvaluator(model).run(None, feeds)[0], rtol=1e-4, atol=1e-5)
  assert got.tobytes() == r(**feeds)["y"].tobytes()


def test_volumetric_grid_sample_agrees_with_the_reference():
  rng = np.random.default_rng(15)
  feeds = {"x": rng.standard_normal((1, 2, 3, 4, 2)).astype(np.float32),
           "grid": (rng.standard_normal((1, 2, 3, 2, 3)) * 1.2).astype(np.float32)}
  model = _model(helper.make_node("GridSample", ["x", "grid"], ["y"], mode="linear"), feeds, opset=20)
  got = OnnxRunner(model, cache=memory_cache())(**feeds)["y"]
  np.testing.assert_allclose(got, ReferenceEvaluator(model).run(None, feeds)[0], rtol=1e-4, atol=1e-5)


def test_batch_normalization_in_training_mode_agrees_with_the_reference():
  rng = np.random.default_rng(16)
  feeds = {"x": rng.standard_normal((2, 3, 4, 5)).astype(np.float32), "s": rng.standard_normal(3).astype(np.float32),
           "bias": rng.standard_normal(3).astype(np.float32), "mean": rng.standard_normal(3).astype(np.float32),
           "var": np.abs(rng.standard_normal(3)).astype(np.float32)}
  node = helper.make_node("BatchNormalization", list(feeds), ["y", "rm", "rv"], training_mode=1, momentum=0.8, epsilon=1e-3)
  model = _model(node, feeds, opset=15)
  got = OnnxRunner(model, cache=memory_cache())(**feeds)
  for name, w in zip(node.output, ReferenceEvaluator(model).run(None, feeds)):
    np.testing.assert_allclose(got[name], w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["linear", "circular"])
@pytest.mark.parametrize("axis", [-2, 1])
def test_tensor_scatter_writes_at_run_time_indices_like_the_reference(mode, axis):
  rng = np.random.default_rng(17)
  past = rng.standard_normal((3, 6, 4) if axis == 1 else (3, 2, 6, 4)).astype(np.float32)
  upd_shape = list(past.shape)
  upd_shape[axis] = 3
  feeds = {"past": past, "update": rng.standard_normal(upd_shape).astype(np.float32), "idx": np.array([0, 2, 3], np.int64)}
  if mode == "circular":
    feeds["idx"] = np.array([5, 4, 1], np.int64)
  model = _model(helper.make_node("TensorScatter", ["past", "update", "idx"], ["y"], mode=mode, axis=axis), feeds, opset=24)
  r = OnnxRunner(model, cache=memory_cache())
  np.testing.assert_array_equal(r(**feeds)["y"], ReferenceEvaluator(model).run(None, feeds)[0])
  assert not r.program.fallbacks


def _ml_model(node, feeds) -> bytes:
  g = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                                      for n, a in feeds.items()], [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)])
  return helper.make_model(g, opset_imports=[helper.make_opsetid("ai.onnx.ml", 1), helper.make_opsetid("", 13)]).SerializeToString()


@pytest.mark.parametrize("x_shape", [(3, 4), (5,)])
def test_ml_binarizer_and_array_feature_extractor_agree_with_the_reference(x_shape):
  rng = np.random.default_rng(18)
  x = rng.standard_normal(x_shape).astype(np.float32)
  for node, feeds in ((helper.make_node("Binarizer", ["x"], ["y"], domain="ai.onnx.ml", threshold=0.3), {"x": x}),
                      (helper.make_node("ArrayFeatureExtractor", ["x", "i"], ["y"], domain="ai.onnx.ml"),
                       {"x": x, "i": np.array([[2], [0], [3]], np.int64)})):
    model = _ml_model(node, feeds)
    np.testing.assert_array_equal(OnnxRunner(model, cache=memory_cache())(**feeds)["y"],
                                  ReferenceEvaluator(model).run(None, feeds)[0])


def test_qlinear_conv_with_per_channel_weights_agrees_with_the_reference():
  rng = np.random.default_rng(19)
  feeds = {"x": rng.integers(0, 256, (1, 2, 5, 5)).astype(np.uint8), "xs": np.array(0.05, np.float32), "xz": np.array(100, np.uint8),
           "w": rng.integers(0, 256, (3, 2, 3, 3)).astype(np.uint8), "ws": np.array([0.01, 0.02, 0.005], np.float32),
           "wz": np.array([120, 128, 130], np.uint8), "ys": np.array(0.4, np.float32), "yz": np.array(90, np.uint8),
           "bias": rng.integers(-500, 500, 3).astype(np.int32)}
  _agrees(helper.make_node("QLinearConv", list(feeds), ["y"], pads=[1, 1, 1, 1]), feeds, opset=10, compiled=False)


def test_max_unpool_scatters_to_the_flat_indices_like_the_reference():
  x = np.array([[[[1, 2], [3, 4]]], [[[5, 6], [7, 8]]]], np.float32)
  idx = np.array([[[[5, 7], [13, 15]]], [[[16, 19], [29, 30]]]], np.int64)   # flat over the whole (2, 1, 4, 4) output
  feeds = {"x": x, "i": idx}
  _agrees(helper.make_node("MaxUnpool", ["x", "i"], ["y"], kernel_shape=[2, 2], strides=[2, 2]), feeds, opset=11,
          compiled=False)


def test_sequence_lens_stops_each_entry_at_its_length_keeping_its_state_and_writing_zeros():
  """(onnx's reference ignores sequence_lens: each entry is checked against it run on that entry's sequence)"""
  node, feeds = _recurrent("LSTM", 1, 0, extra=("p",))
  names = list(node.input)
  names[4] = "lens"
  node = helper.make_node("LSTM", names, list(node.output), hidden_size=5)
  feeds = dict(feeds, lens=np.array([4, 2], np.int32))
  got = OnnxRunner(_model(node, feeds, opset=14), cache=memory_cache())(**feeds)
  plain = helper.make_node("LSTM", ["x", "w", "r", "b", "", "h0", "c0", "p"], list(node.output), hidden_size=5)
  for entry, n in ((0, 4), (1, 2)):
    part = {k: v for k, v in feeds.items() if k != "lens"}
    part["x"], part["h0"], part["c0"] = feeds["x"][:n, entry:entry + 1], feeds["h0"][:, entry:entry + 1], feeds["c0"][:, entry:entry + 1]
    y, yh, yc = ReferenceEvaluator(_model(plain, part, opset=14)).run(None, part)
    np.testing.assert_allclose(got["y"][:n, :, entry:entry + 1], y, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got["y"][n:, :, entry], 0)
    np.testing.assert_allclose(got["yh"][:, entry:entry + 1], yh, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["yc"][:, entry:entry + 1], yc, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("attrs", [{"kernel_shape": [2, 2], "strides": [2, 2], "storage_order": 1},
                                   {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}], ids=str)
def test_max_pool_with_indices_agrees_with_the_reference(attrs):
  """(with unit strides onnx's reference takes another path, whose indices of a padded input are not the flat ones:
  strided windows are compared here)"""
  rng = np.random.default_rng(20)
  feeds = {"x": rng.standard_normal((2, 3, 6, 7)).astype(np.float32)}
  feeds["x"][0, 0, :2, :2] = 1.5   # ties: the first tap wins
  _agrees(helper.make_node("MaxPool", ["x"], ["y", "i"], **attrs), feeds, opset=12)


def test_a_decomposition_constant_over_the_memory_budget_is_refused_before_it_is_allocated():
  feeds = {"x": np.zeros((1, 1, 2, 2), np.float32), "i": np.zeros((1, 1, 2, 2), np.int64)}
  node = helper.make_node("MaxUnpool", ["x", "i"], ["y"], kernel_shape=[1 << 40, 1 << 40])
  with pytest.raises(MemoryBudgetError, match="MaxUnpool"):
    OnnxRunner(_model(node, feeds, opset=11), cache=memory_cache())


def test_a_recurrence_longer_than_we_unroll_is_refused_naming_the_op():
  node, feeds = _recurrent("RNN", 1, 0)
  feeds["x"] = np.zeros((MAX_UNROLL + 1, 2, 3), np.float32)
  with pytest.raises(UnsupportedOpError, match=f"RNN over {MAX_UNROLL + 1} steps"):
    OnnxRunner(_model(node, feeds, opset=14), cache=memory_cache())


def _one_hot_model(depth_from_shape: bool, axis: int) -> bytes:
  f, i64 = TensorProto.FLOAT, TensorProto.INT64
  nodes = [helper.make_node("OneHot", ["i", "depth", "values"], ["y"], axis=axis)]
  inits = [numpy_helper.from_array(np.array([2.0, 5.0], np.float32), "values")]
  if depth_from_shape:   # depth = x.shape[1], folded at load
    nodes[:0] = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "one"], ["depth"], axis=0)]
    inits.append(numpy_helper.from_array(np.array(1, np.int64), "one"))
  else:
    inits.append(numpy_helper.from_array(np.array(4.0, np.float32), "depth"))
  g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("i", i64, [2, 3]), helper.make_tensor_value_info("x", f, [1, 4])],
                        [helper.make_tensor_value_info("y", f, None)], inits)
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)]).SerializeToString()


@pytest.mark.parametrize("depth_from_shape", [False, True], ids=["initializer", "shape"])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot_with_a_depth_known_at_load_agrees_with_the_reference(depth_from_shape, axis):
  feeds = {"i": np.array([[0, 3, -1], [5, -4, 2]], np.int64), "x": np.zeros((1, 4), np.float32)}
  model = _one_hot_model(depth_from_shape, axis)
  r = OnnxRunner(model, cache=memory_cache())
  np.testing.assert_array_equal(r(**feeds)["y"], ReferenceEvaluator(model).run(None, feeds)[0])
  assert not r.program.fallbacks


def test_one_hot_with_a_depth_given_at_run_time_is_refused_naming_the_op():
  feeds = {"i": np.zeros((2,), np.int64), "depth": np.array(3, np.int64), "values": np.array([0, 1], np.float32)}
  with pytest.raises(UnsupportedOpError, match="OneHot.*must be a compile-time constant"):
    OnnxRunner(_model(helper.make_node("OneHot", ["i", "depth", "values"], ["y"]), feeds, opset=11), cache=memory_cache())


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("ctm", ["half_pixel", "output_half_pixel"])
def test_roi_align_with_run_time_regions_agrees_with_the_reference(mode, ctm):
  rng = np.random.default_rng(21)
  feeds = {"x": rng.standard_normal((2, 3, 7, 9)).astype(np.float32),
           "rois": np.array([[0, 0, 8, 6], [1.5, 2.2, 4.1, 3.3], [-3, -2, 12, 11], [6, 5, 6.2, 5.1]], np.float32),
           "bi": np.array([0, 1, 1, 0], np.int64)}
  node = helper.make_node("RoiAlign", ["x", "rois", "bi"], ["y"], mode=mode, coordinate_transformation_mode=ctm,
                          output_height=3, output_width=4, sampling_ratio=2, spatial_scale=0.9)
  model = _model(node, feeds, opset=16)
  r = OnnxRunner(model, cache=memory_cache())
  np.testing.assert_allclose(r(**feeds)["y"], ReferenceEvaluator(model).run(None, feeds)[0], rtol=1e-5, atol=1e-6)
