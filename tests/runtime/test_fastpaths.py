"""The speed paths of the reference (numpy) kernels compute exactly what the plain numpy call (and
onnxruntime) computes: vectorised max/min against a constant row, whole-plane pools, the conv layouts. These
kernels run on the REF device (they are the reference backend), so every runner here is on REF."""
import numpy as np
import pytest

from runtime import OnnxRunner
from runtime.graph import Spec
from runtime.kernels import build_kernel
from runtime.kernels.const_operand import ROW, bound_const_op, const_row
from runtime.program import CompileCache

from rt_helpers import ort_run, tiny_model

R = np.random.default_rng(77)


def with_specials(n, dtype=np.float32):
  x = R.standard_normal(n).astype(dtype)
  if n >= 4:
    x[:4] = [np.nan, -np.nan, -0.0, np.inf]
  return x


@pytest.mark.parametrize("n", [1, 7, ROW - 1, ROW, 2 * ROW, 3 * ROW + 5])
@pytest.mark.parametrize("ufunc,value", [(np.maximum, 0.0), (np.minimum, 0.5), (np.maximum, -1.25)])
def test_bound_const_op_bit_identical_to_ufunc(n, ufunc, value):
  x = with_specials(n)
  want = ufunc(x, np.float32(value))
  out = np.full_like(x, 42.0)
  bound_const_op(ufunc, x, value, out)()
  assert out.tobytes() == want.tobytes()  # NaN payloads and the sign of zero included
  bound_const_op(ufunc, x, value, x)()  # in place
  assert x.tobytes() == want.tobytes()


def test_bound_const_op_reads_current_values_each_call():
  x = R.standard_normal(ROW + 3).astype(np.float32)
  out = np.empty_like(x)
  run = bound_const_op(np.maximum, x, 0, out)
  run()
  x[:] = -x
  run()
  np.testing.assert_array_equal(out, np.maximum(x, 0))


def test_bound_const_op_non_contiguous_and_int_fall_back_correctly():
  x = R.standard_normal((6, 2 * ROW)).astype(np.float32)[:, ::2]  # strided view
  out = np.empty(x.shape, np.float32)
  bound_const_op(np.maximum, x, 0, out)()
  np.testing.assert_array_equal(out, np.maximum(x, 0))
  xi = R.integers(-50, 50, ROW + 9).astype(np.int64)
  oi = np.empty_like(xi)
  bound_const_op(np.minimum, xi, 3, oi)()
  np.testing.assert_array_equal(oi, np.minimum(xi, 3))


def test_const_rows_are_shared_and_read_only():
  a, b = const_row(0, np.float32), const_row(0.0, np.float32)
  assert a is b and not a.flags.writeable and a.shape == (ROW,) and not a.any()
  assert const_row(0, np.float64) is not a


def _parity(model, feeds, rtol=0, atol=0):
  ours = OnnxRunner(model, device="REF")(**feeds)
  ref = ort_run(model, feeds)
  for r, name in zip(ref, sorted(ours)):
    np.testing.assert_allclose(ours[name], r, rtol=rtol, atol=atol)


@pytest.mark.parametrize("shape", [(1, 3, 70, 90), (2, ROW // 2), (1, ROW)])
def test_relu_and_one_sided_clip_match_onnxruntime_across_rows(shape):
  x = R.standard_normal(shape).astype(np.float32)
  _parity(tiny_model("Relu", {"x": x}), {"x": x})
  _parity(tiny_model("Clip", {"x": x}, consts={"lo": np.array(-0.3, np.float32)}), {"x": x})
  _parity(tiny_model("Clip", {"x": x}, attrs={"max": 0.4}, opset=6), {"x": x})


# ---- pools as whole-plane shifted passes (runtime/kernels/window_reduce.py), chunked by planes

POOLS = [
    ("MaxPool", (2, 40, 30, 30), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),  # several chunks + a remainder
    ("AveragePool", (2, 40, 30, 30), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    ("AveragePool", (1, 5, 9, 11), {"kernel_shape": [3, 2], "pads": [2, 0, 1, 1], "count_include_pad": 1}),
    ("MaxPool", (1, 4, 12, 13), {"kernel_shape": [3, 3], "dilations": [2, 3], "pads": [2, 1, 0, 2]}),
    ("MaxPool", (1, 70, 64, 64), {"kernel_shape": [2, 2], "strides": [2, 2]}),  # strided, no pads
    ("MaxPool", (1, 3, 11, 13), {"kernel_shape": [3, 2], "strides": [2, 3]}),  # strides that skip tail columns
    ("MaxPool", (2, 3, 17), {"kernel_shape": [4], "pads": [1, 2]}),  # 1-D
    ("AveragePool", (1, 2, 5, 6, 7), {"kernel_shape": [2, 3, 2], "pads": [1, 0, 1, 0, 1, 1]}),  # 3-D
    ("MaxPool", (1, 6, 8, 8), {"kernel_shape": [1, 3], "pads": [0, 1, 0, 1]}),  # a window of one along H
]
# strided with pads: taps along the leading axes, the last axis' interior as flat passes, its edges as taps
STRIDED = [
    ("MaxPool", (2, 5, 23, 21), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("MaxPool", (1, 4, 22, 22), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 0, 1, 1]}),
    ("MaxPool", (1, 3, 20, 31), {"kernel_shape": [2, 3], "strides": [2, 3], "pads": [1, 2, 0, 2],
                                 "dilations": [1, 2]}),
    ("MaxPool", (1, 3, 19, 19), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    ("AveragePool", (1, 7, 28, 28), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("AveragePool", (1, 7, 27, 26), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                                     "count_include_pad": 1}),
    ("MaxPool", (2, 3, 40), {"kernel_shape": [5], "strides": [3], "pads": [2, 2]}),  # 1-D
]
POOLS += STRIDED
# same size at stride 1: flat passes over the unpadded input, edges from clipped taps
SAME = [
    ("AveragePool", (1, 30, 14, 14), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    ("AveragePool", (2, 6, 9, 8), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    ("MaxPool", (1, 9, 7, 7), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    ("MaxPool", (1, 4, 10, 11), {"kernel_shape": [4, 2], "pads": [1, 0, 2, 1]}),  # uneven pads
    ("MaxPool", (1, 3, 2, 2), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),  # every output is an edge
    ("AveragePool", (1, 3, 1, 6), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    ("MaxPool", (2, 3, 12), {"kernel_shape": [5], "pads": [2, 2]}),  # 1-D
    ("AveragePool", (1, 2, 4, 5, 6), {"kernel_shape": [3, 3, 3], "pads": [1, 1, 1, 1, 1, 1]}),  # 3-D
]
POOLS += SAME


@pytest.mark.parametrize("op,shape,attrs", POOLS, ids=[f"{p[0]}-{i}" for i, p in enumerate(POOLS)])
def test_flat_pools_match_onnxruntime(op, shape, attrs):
  x = R.standard_normal(shape).astype(np.float32)
  _parity(tiny_model(op, {"x": x}, attrs=attrs), {"x": x}, rtol=1e-5, atol=1e-6)


AGREE = POOLS[:5] + STRIDED + SAME


@pytest.mark.parametrize("op,shape,attrs", AGREE, ids=[f"{p[0]}-{i}" for i, p in enumerate(AGREE)])
def test_flat_pools_agree_with_the_per_axis_taps(op, shape, attrs, monkeypatch):
  import runtime.kernels.pool as pool
  x = R.standard_normal(shape).astype(np.float32)
  if op == "MaxPool":
    x.reshape(-1)[:3] = [np.nan, np.inf, -np.inf]  # max propagates NaN on both paths
  model = tiny_model(op, {"x": x}, attrs=attrs)
  flat = OnnxRunner(model, device="REF", cache=CompileCache(use_disk=False))(x=x)["y0"]
  monkeypatch.setattr(pool, "FLAT_POOL", False)
  taps = OnnxRunner(model, device="REF", cache=CompileCache(use_disk=False))(x=x)["y0"]
  if op == "MaxPool":
    assert flat.tobytes() == taps.tobytes()
  else:
    np.testing.assert_allclose(flat, taps, rtol=1e-5, atol=1e-6)


def test_flat_pool_reads_new_input_values_on_every_call():
  x = R.standard_normal((1, 8, 20, 20)).astype(np.float32)
  runner = OnnxRunner(tiny_model("MaxPool", {"x": x}, attrs={"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
                      device="REF")
  first = runner(x=x)["y0"]
  second = runner(x=-x)["y0"]
  ref = ort_run(tiny_model("MaxPool", {"x": x}, attrs={"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}), {"x": -x})
  np.testing.assert_array_equal(second, ref[0])
  assert not np.array_equal(first, second)


@pytest.mark.parametrize("op,attrs", [("Elu", {"alpha": 0.7}), ("Selu", {}), ("Celu", {"alpha": 1.6}, )])
def test_elu_family_via_exp_matches_onnxruntime_including_extremes(op, attrs):
  x = (R.standard_normal((3, 5000)) * 4).astype(np.float32)
  x[0, :7] = [np.inf, -np.inf, 100.0, -100.0, -1e-6, 0.0, -0.0]
  opset = 12 if op == "Celu" else 17
  _parity(tiny_model(op, {"x": x}, attrs=attrs, opset=opset), {"x": x}, rtol=1e-5, atol=1e-6)


# ---- conv layouts: channels-first im2col (NN GEMM) where rows are long or a strided conv has few channels

CONVS = [
    ((1, 40, 20, 32), (24, 40, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),  # strided, few channels
    ((1, 20, 12, 30), (16, 20, 3, 3), {"pads": [1, 1, 1, 1]}),  # long output rows
    ((2, 24, 14, 14), (40, 24, 1, 1), {"strides": [2, 2]}),  # strided 1x1
    ((2, 24, 14, 15), (40, 24, 1, 1), {}),  # pointwise: the GEMM accumulates onto the bias (beta = 1)
    ((2, 24, 14, 15), (40, 6, 1, 1), {"group": 4}),  # grouped pointwise: one GEMM per group onto the bias
    ((2, 64, 32, 32), (64, 1, 3, 3), {"group": 64, "pads": [1, 1, 1, 1]}),  # depthwise GEMV, several chunks
    ((2, 16, 64, 64), (32, 16, 3, 3), {"pads": [1, 1, 1, 1]}),  # im2col in bands of output rows (last one short)
    ((1, 3, 120, 130), (16, 3, 7, 7), {"pads": [3, 2, 3, 1], "strides": [2, 2]}),  # banded, strided
    ((1, 40, 20, 21), (40, 1, 5, 3), {"group": 40, "pads": [2, 0, 1, 2], "dilations": [1, 2]}),
    ((1, 100, 9, 10), (20, 100, 3, 3), {"strides": [2, 2], "pads": [1, 0, 1, 1]}),  # many channels: channels-last
    ((1, 100, 9, 10), (20, 100, 3, 3), {"pads": [1, 1, 1, 1], "dilations": [2, 1]}),  # many channels, stride 1
]


@pytest.mark.parametrize("xs,ws,attrs", CONVS, ids=[f"conv-{i}" for i in range(len(CONVS))])
def test_conv_layouts_match_onnxruntime(xs, ws, attrs):
  x = R.standard_normal(xs).astype(np.float32)
  consts = {"w": (R.standard_normal(ws) * 0.2).astype(np.float32), "b": R.standard_normal(ws[0]).astype(np.float32)}
  _parity(tiny_model("Conv", {"x": x}, consts=consts, attrs=attrs), {"x": x}, rtol=1e-4, atol=1e-4)
  del consts["b"]  # and without a bias (no row of ones in the columns)
  _parity(tiny_model("Conv", {"x": x}, consts=consts, attrs=attrs), {"x": x}, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(2, 300, 13, 13), (1, 7, 5), (1, 4, 3, 5, 2)])
def test_global_average_pool_as_gemv_matches_onnxruntime(shape):
  x = R.standard_normal(shape).astype(np.float32)
  _parity(tiny_model("GlobalAveragePool", {"x": x}), {"x": x}, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bias", [True, False])
def test_shifted_conv_in_bands_of_output_rows_matches_onnxruntime(bias, monkeypatch):
  import runtime.kernels.nn as nn
  monkeypatch.setattr(nn, "SHIFTED_BAND_MIN_ACC_BYTES", 0)  # band even this small conv,
  monkeypatch.setattr(nn, "SHIFTED_BAND_BYTES", 16 << 10)  # in several bands, the last one short
  x = R.standard_normal((2, 24, 23, 30)).astype(np.float32)
  consts = {"w": (R.standard_normal((12, 24, 3, 3)) * 0.2).astype(np.float32)}
  if bias:
    consts["b"] = R.standard_normal(12).astype(np.float32)
  model = tiny_model("Conv", {"x": x}, consts=consts, attrs={"pads": [1, 2, 1, 0], "dilations": [1, 2]})
  runner = OnnxRunner(model, device="REF", cache=CompileCache(use_disk=False))
  assert _conv_scratch(x, consts, {"pads": [1, 2, 1, 0], "dilations": [1, 2]})[0].shape[0] == 24  # per-tap strategy
  np.testing.assert_allclose(runner(x=x)["y0"], ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_banded_im2col_agrees_with_the_whole_column_matrix(monkeypatch):
  import runtime.kernels.nn as nn
  x = R.standard_normal((2, 16, 64, 64)).astype(np.float32)
  consts = {"w": (R.standard_normal((32, 16, 3, 3)) * 0.2).astype(np.float32),
            "b": R.standard_normal(32).astype(np.float32)}
  model = tiny_model("Conv", {"x": x}, consts=consts, attrs={"pads": [1, 1, 1, 1]})
  banded = OnnxRunner(model, device="REF", cache=CompileCache(use_disk=False))
  assert _conv_scratch(x, consts, {"pads": [1, 1, 1, 1]})[-1].shape[-1] < 64 * 64  # a band, not all columns
  monkeypatch.setattr(nn, "BLOCKED_IM2COL", False)
  whole = OnnxRunner(model, device="REF", cache=CompileCache(use_disk=False))
  assert _conv_scratch(x, consts, {"pads": [1, 1, 1, 1]})[-1].shape[-1] == 64 * 64
  np.testing.assert_allclose(banded(x=x)["y0"], whole(x=x)["y0"], rtol=1e-5, atol=1e-5)


def _conv_scratch(x, consts, attrs):
  """The scratch specs of the reference Conv kernel for these shapes (which strategy it chose)."""
  specs = [Spec(x.shape, x.dtype)] + [Spec(a.shape, a.dtype) for a in consts.values()]
  return build_kernel("Conv", attrs, specs, [None] + list(consts.values()), "Conv").scratch_specs
