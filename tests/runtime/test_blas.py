"""Direct cblas_sgemm binding: C = A @ B + beta * C on row-major and transposed views, and the conv path that
accumulates per-tap GEMMs in BLAS matches its numpy fallback."""
import numpy as np
import pytest

from runtime import blas
from runtime.graph import Spec
from runtime.kernels import build_kernel

rng = np.random.default_rng(5)
needs_sgemm = pytest.mark.skipif(not blas.gemm_available(), reason="cblas_sgemm not found in numpy's OpenBLAS")


@needs_sgemm
@pytest.mark.parametrize("m,k,n", [(5, 7, 9), (32, 128, 300), (1, 3, 4)])
def test_gemm_call_matches_numpy_on_every_layout(m, k, n):
  A = rng.standard_normal((m, k)).astype(np.float32)
  B = rng.standard_normal((k, n)).astype(np.float32)
  wide = rng.standard_normal((k, n + 5)).astype(np.float32)[:, 2:2 + n]  # leading dimension > n
  for a in (A, np.asfortranarray(A)):
    for b in (B, np.asfortranarray(B), wide):
      C = rng.standard_normal((m, n)).astype(np.float32)
      before = C.copy()
      blas.gemm_call(a, b, C, beta=1.0)()
      np.testing.assert_allclose(C, before + a @ b, rtol=1e-4, atol=1e-4)
      blas.gemm_call(a, b, C)()
      np.testing.assert_allclose(C, a @ b, rtol=1e-4, atol=1e-4)


def test_gemm_call_refuses_what_blas_cannot_read():
  a = np.ones((4, 4), np.float32)
  assert blas.gemm_call(a[::2, ::2], a, np.ones((2, 4), np.float32)) is None      # no unit stride
  assert blas.gemm_call(a.astype(np.float64), a, a) is None                       # not float32
  if blas.gemm_available():
    with pytest.raises(ValueError, match="gemm shapes"):
      blas.gemm_call(a, a[:3], a)


def _shifted_conv(x, w):
  f32 = np.dtype(np.float32)
  k = build_kernel("Conv", {"pads": [1, 1, 1, 1]}, [Spec(x.shape, f32), Spec(w.shape, f32)], [None, w], "t")
  o = np.empty(k.out_specs[0].shape, np.float32)
  scratch = [np.empty(s.shape, s.dtype) for s in k.scratch_specs]
  k.bind([x, w], [o], scratch)()
  return o, len(scratch)


@needs_sgemm
def test_shifted_conv_accumulating_in_blas_equals_the_numpy_path(monkeypatch):
  x = rng.standard_normal((2, 32, 9, 11)).astype(np.float32)
  w = rng.standard_normal((16, 32, 3, 3)).astype(np.float32)  # fewer outputs than inputs: per-tap GEMMs
  fast, n_fast = _shifted_conv(x, w)
  monkeypatch.setattr(blas, "gemm_available", lambda: False)
  slow, n_slow = _shifted_conv(x, w)
  assert n_slow == n_fast + 1  # the numpy path needs a temporary for each tap's product
  np.testing.assert_allclose(fast, slow, rtol=1e-4, atol=1e-4)
