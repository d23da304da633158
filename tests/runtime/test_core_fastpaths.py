"""The speed paths of the CPU kernels compute exactly what the plain numpy call (and onnxruntime) computes:
vectorised max/min against a constant row, and the ops that use it, at sizes that cross the row length."""
import numpy as np
import pytest

from runtime import OnnxRunner
from runtime.kernels.rowconst import ROW, bound_const_op, const_row

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
    ours = OnnxRunner(model)(**feeds)
    ref = ort_run(model, feeds)
    for r, name in zip(ref, sorted(ours)):
        np.testing.assert_allclose(ours[name], r, rtol=rtol, atol=atol)


@pytest.mark.parametrize("shape", [(1, 3, 70, 90), (2, ROW // 2), (1, ROW)])
def test_relu_and_one_sided_clip_match_onnxruntime_across_rows(shape):
    x = R.standard_normal(shape).astype(np.float32)
    _parity(tiny_model("Relu", {"x": x}), {"x": x})
    _parity(tiny_model("Clip", {"x": x}, consts={"lo": np.array(-0.3, np.float32)}), {"x": x})
    _parity(tiny_model("Clip", {"x": x}, attrs={"max": 0.4}, opset=6), {"x": x})
