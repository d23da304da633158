"""The generated register-blocked GEMM (runtime/codegen/gemm.py): against numpy in float64 on awkward shapes
(dimensions of 0 and 1, primes, not multiples of the tile, the K block or the column block), for every vector
width this CPU runs, each twice for bit-identical output; and convolutions through it against onnxruntime."""
import ctypes

import numpy as np
import pytest

from runtime import OnnxRunner, compiler, config
from runtime.cache import DEFAULT_KERNELS
from runtime.codegen import conv, gemm, render
from runtime.codegen.ir import F32
from runtime import search
from runtime.graph import Spec
from runtime.onnx_import import import_onnx
from runtime.program import measured_conv_strategies, target_for

from rt_helpers import ort_run, tiny_model

R = np.random.default_rng(11)
WIDTHS = [vl for vl in sorted(gemm.REGISTERS) if 4 * vl <= compiler.vector_bytes()]
SHAPES = [(1, 1, 1), (0, 5, 3), (5, 0, 3), (4, 6, 0), (1, 37, 13), (13, 1, 37), (7, 33, 5), (29, 97, 257),
          (gemm.MC_ROWS + 11, 2 * 16 + 3, 2 * gemm.KC + 3), (31, 1031, 67), (17, 3000, 19)]


def _kernel(vl: int):
  body = ("i64* d = (i64*)args[0];\n"
          "pm_gemm(d[0], d[1], d[2], (const float*)args[1], (const float*)args[2], d[3], (float*)args[3], d[4], "
          "(float*)args[4]);")
  head = render.PRELUDE + render.vector_prelude(vl) + gemm.source(vl)
  name = render.kernel_name(head + body)
  (k,), _ = DEFAULT_KERNELS.get_many([(f"{head}\nvoid {name}(void* const* restrict args) {{\n{body}\n}}\n", name)],
                                     target_for("CPU").name)
  return ctypes.CFUNCTYPE(None, ctypes.c_void_p)(k.address)


def _run(fn, vl, a_packed, b, m, n, k, ldb, ldc):
  c = np.full((max(m, 1), ldc), np.nan, np.float32)  # every element of the m x n block must be written
  bp = np.zeros(max(1, gemm.scratch_floats(n, k, vl)), np.float32)
  dims = np.array([m, n, k, ldb, ldc], np.int64)
  keep = [dims, a_packed, b, c, bp]
  args = np.array([x.ctypes.data for x in keep], np.uint64)
  fn(args.ctypes.data)
  return c[:m, :n].copy(), c[:m, n:]


@pytest.mark.parametrize("vl", WIDTHS)
def test_micro_gemm_matches_numpy_and_repeats_bit_identically(vl):
  fn = _kernel(vl)
  mr, _ = gemm.gemm_geometry(vl)
  for m, n, k in SHAPES:
    a = R.standard_normal((m, k)).astype(np.float32)
    ldb = n + 3   # B and C rows wider than n: the kernel reads and writes only the n columns
    b = R.standard_normal((max(k, 1), ldb)).astype(np.float32)
    ap = gemm.pack_a(a[None], mr).reshape(-1)
    ap = ap if ap.size else np.zeros(1, np.float32)
    c1, pad1 = _run(fn, vl, ap, b, m, n, k, ldb, n + 5)
    c2, _ = _run(fn, vl, ap, b, m, n, k, ldb, n + 5)
    ref = a.astype(np.float64) @ b[:k, :n].astype(np.float64)
    np.testing.assert_allclose(c1, ref, rtol=1e-4, atol=1e-4 * max(1.0, np.sqrt(k)), err_msg=f"vl {vl}: {(m, n, k)}")
    assert np.array_equal(c1, c2), f"vl {vl}: {(m, n, k)} differs between two runs"
    assert np.all(np.isnan(pad1)), f"vl {vl}: {(m, n, k)} wrote past column n"


def test_packed_a_panels_are_k_major_and_zero_padded():
  a = np.arange(2 * 5 * 3, dtype=np.float32).reshape(2, 5, 3)
  p = gemm.pack_a(a, 4)
  assert p.shape == (2, 2, 3, 4)
  assert np.array_equal(p[1, 0, 2], a[1, :4, 2]) and np.array_equal(p[0, 1, :, 0], a[0, 4]) and not p[:, 1, :, 1:].any()
  assert gemm.packed_a_size(5, 3, 4) == p[0].size


def test_tile_is_derived_from_the_vector_width():
  for vl, regs in gemm.REGISTERS.items():
    mr, nr = gemm.gemm_geometry(vl)
    assert nr == gemm.NR_VECTORS * vl and mr * gemm.NR_VECTORS + gemm.NR_VECTORS + 1 <= regs and mr >= 1


def test_heuristic_leaves_sparse_tiles_to_sgemm():
  t = {"gemm": "auto", "vl": 16}
  mr, nr = gemm.gemm_geometry(16)
  assert conv.choose_gemm(t, 4 * mr, 100 * nr, F32)
  assert not conv.choose_gemm(t, mr + 1, 100 * nr, F32) and not conv.choose_gemm(t, 4 * mr, 1, F32)  # padding rows, columns
  assert conv.choose_gemm(dict(t, gemm="micro"), 1, 1, F32) and not conv.choose_gemm(dict(t, gemm="blas"), 64, 4096, F32)
  assert not conv.choose_gemm(t, 4 * mr, 4096, F32, forced=False) and conv.choose_gemm(t, 1, 1, F32, forced=True)
  assert not conv.choose_gemm(t, 4 * mr, 4096, np.dtype(np.float16))


def _conv_model(x, w, attrs):
  return tiny_model("Conv", {"x": x}, consts={"w": w, "b": R.standard_normal(w.shape[0]).astype(np.float32)}, attrs=attrs)


@pytest.mark.parametrize("xs,ws,attrs,strategy", [
  ((1, 64, 9, 9), (37, 64, 3, 3), {"pads": [1, 1, 1, 1]}, "im2col"),                       # short rows: im2col
  ((2, 96, 9, 11), (50, 96, 1, 1), {}, "pointwise"),                                         # batch of 2
  ((1, 80, 6, 6), (58, 40, 1, 1), {"group": 2}, "pointwise"),                               # grouped: per group
  ((1, 72, 11, 11), (31, 72, 3, 3), {"strides": [2, 2]}, "im2col"),
])
def test_convs_through_the_micro_kernel_match_onnxruntime(monkeypatch, xs, ws, attrs, strategy):
  monkeypatch.setenv("PYMODELD_GEMM", "micro")
  monkeypatch.setattr(conv, "IM2COL_BAND_BYTES", 40 << 10)     # several bands, the last one short
  x = R.standard_normal(xs).astype(np.float32)
  w = (R.standard_normal(ws) * 0.1).astype(np.float32)
  model = _conv_model(x, w, attrs)
  r = OnnxRunner(model)
  first = {k: np.array(v) for k, v in r(x=x).items()}
  [k] = [k for k in r.program.kernels if k.tags.get("strategy")]
  assert (k.tags["strategy"], k.tags["gemm"]) == (strategy, "micro")
  assert "pm_gemm(" in k.source and "sgemm" not in k.params[-1]
  np.testing.assert_allclose(first["y0"], ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-4)
  again = r(x=x)
  assert all(np.array_equal(first[n], again[n]) for n in first)


def test_blas_mode_keeps_sgemm(monkeypatch):
  monkeypatch.setenv("PYMODELD_GEMM", "blas")
  x = R.standard_normal((1, 64, 9, 9)).astype(np.float32)
  r = OnnxRunner(_conv_model(x, R.standard_normal((64, 64, 3, 3)).astype(np.float32), {"pads": [1, 1, 1, 1]}))
  assert [k.tags.get("gemm") for k in r.program.kernels if k.tags.get("strategy")] == ["blas"]


def test_auto_leaves_conv_gemms_to_sgemm_when_the_process_runs_programs_on_several_threads(monkeypatch):
  """The micro-kernel runs on one thread; sgemm splits a GEMM across PYMODELD_THREADS of them."""
  monkeypatch.delenv(config.GEMM_ENV, raising=False)
  monkeypatch.setenv(config.THREADS_ENV, "2")
  assert target_for("CPU").gemm == "blas"
  monkeypatch.setenv(config.GEMM_ENV, "micro")
  assert target_for("CPU").gemm == "micro"   # asked for by name, it is used on any thread count
  monkeypatch.delenv(config.GEMM_ENV)
  monkeypatch.setenv(config.THREADS_ENV, "1")
  assert target_for("CPU").gemm == "auto"


def test_the_search_measures_micro_kernel_candidates_only_where_the_target_may_use_them(monkeypatch):
  x = R.standard_normal((1, 64, 9, 9)).astype(np.float32)
  graph = import_onnx(_conv_model(x, R.standard_normal((64, 64, 3, 3)).astype(np.float32), {"pads": [1, 1, 1, 1]}))
  offered = []
  monkeypatch.setattr(search, "conv_strategy", lambda sig, default, cands, measure: offered.append(cands) or cands[0])
  monkeypatch.delenv(config.GEMM_ENV, raising=False)
  for threads in ("1", "2"):
    monkeypatch.setenv(config.THREADS_ENV, threads)
    measured_conv_strategies(graph, {"x": Spec(x.shape, x.dtype)}, "CPU", {})
  assert [any(c.endswith(conv.MICRO) for c in cands) for cands in offered] == [True, False]
