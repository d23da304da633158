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


def _kernel(vl: int, packed: str = "a", mr: int = 0):
  if packed == "a":
    body = ("i64* d = (i64*)args[0];\n"
            "pm_gemm(d[0], d[1], d[2], (const float*)args[1], (const float*)args[2], d[3], (float*)args[3], d[4], "
            "(float*)args[4], 0);")
  else:   # args: dims (m, n, k, rs, cs, ldc), A, packed B, C, packing scratch
    body = ("i64* d = (i64*)args[0];\n"
            "pm_gemm_b(d[0], d[1], d[2], (const float*)args[1], d[3], d[4], (const float*)args[2], (float*)args[3], d[5], "
            "(float*)args[4], 0);")
  head = render.PRELUDE + render.vector_prelude(vl) + gemm.source(vl, packed, mr)
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
@pytest.mark.parametrize("short", [False, True])
def test_micro_gemm_matches_numpy_and_repeats_bit_identically(vl, short):
  """short: a register tile of fewer rows than the registers hold (what panel_rows picks for a short M)."""
  mr = gemm.gemm_geometry(vl)[0] // 2 + 1 if short else gemm.gemm_geometry(vl)[0]
  fn = _kernel(vl, "a", mr)
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


@pytest.mark.parametrize("vl", WIDTHS)
def test_a_scalar_splat_into_vector_lanes_keeps_every_value_bit_for_bit(vl):
  """render.splat is what the vector code broadcasts a lane-invariant scalar with (and the register tile its A
  values): -0 stays -0 and a NaN keeps its payload, where 0 + x made -0 into +0."""
  head = render.PRELUDE + render.vector_prelude(vl)
  body = f"vf_store((float*)args[1], {render.splat('((const float*)args[0])[0]')});"
  name = render.kernel_name(head + body)
  (k,), _ = DEFAULT_KERNELS.get_many([(f"{head}\nvoid {name}(void* const* restrict args) {{\n{body}\n}}\n", name)],
                                     target_for("CPU").name)
  fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(k.address)
  for v in (-0.0, 0.0, np.inf, -3.5e-41, np.float32(np.nan).view(np.uint32) | 0x1234):
    x = np.array([v], np.uint32 if isinstance(v, np.integer) else np.float32).view(np.float32)
    out = np.zeros(vl, np.float32)
    keep = [x, out]
    fn(np.array([a.ctypes.data for a in keep], np.uint64).ctypes.data)
    assert (out.view(np.uint32) == x.view(np.uint32)[0]).all(), (v, out)
  assert "a[0] - (vf){}" in gemm.source(vl)   # the register tile's broadcast: folded into the FMA's operand


@pytest.mark.parametrize("vl", WIDTHS)
@pytest.mark.parametrize("transposed", [False, True])
def test_micro_gemm_with_packed_weights_as_b_matches_numpy_at_any_strides_of_a_and_repeats_bit_identically(vl, transposed):
  for m, n, k in SHAPES:
    mr = gemm.panel_rows(m, vl)
    fn = _kernel(vl, "b", mr)
    a = R.standard_normal((m, k)).astype(np.float32)
    b = R.standard_normal((k, n)).astype(np.float32)
    lda = (m if transposed else k) + 2   # A's rows (or columns) wider than it: only the m x k block is read
    held = np.full((k, lda) if transposed else (m, lda), np.nan, np.float32)
    if transposed:
      held[:, :m] = a.T
    else:
      held[:, :k] = a
    bp = gemm.pack_b(b, gemm.gemm_geometry(vl)[1]).reshape(-1)
    ldc = n + 5
    outs = []
    for _ in range(2):
      c = np.full((max(m, 1), ldc), np.nan, np.float32)
      ap = np.zeros(max(1, gemm.scratch_floats_a(m, k, mr)), np.float32)
      dims = np.array([m, n, k, 1 if transposed else lda, lda if transposed else 1, ldc], np.int64)
      keep = [dims, held if held.size else np.zeros(1, np.float32), bp if bp.size else np.zeros(1, np.float32), c, ap]
      fn(np.array([x.ctypes.data for x in keep], np.uint64).ctypes.data)
      assert np.all(np.isnan(c[:m, n:])), f"vl {vl}: {(m, n, k)} wrote past column n"
      outs.append(c[:m, :n].copy())
    ref = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(outs[0], ref, rtol=1e-4, atol=1e-4 * max(1.0, np.sqrt(k)), err_msg=f"vl {vl}: {(m, n, k)}")
    assert np.array_equal(outs[0], outs[1]), f"vl {vl}: {(m, n, k)} differs between two runs"


def test_row_panels_are_balanced_within_the_register_tile():
  most, _ = gemm.gemm_geometry(16)
  assert [gemm.panel_rows(m, 16) for m in (1, 5, most, most + 1, 16, 2 * most + 1)] == \
      [1, 5, most, -(-(most + 1) // 2), 8, -(-(2 * most + 1) // 3)]
  for m in range(1, 200):
    mr = gemm.panel_rows(m, 16)
    assert mr <= most and -(-m // mr) == -(-m // most) and -(-m // mr) * mr - m < -(-m // mr)


def test_packed_b_panels_are_k_major_and_zero_padded():
  b = np.arange(3 * 5, dtype=np.float32).reshape(3, 5)
  p = gemm.pack_b(b, 4)
  assert p.shape == (2, 3, 4)
  assert np.array_equal(p[0, 2], b[2, :4]) and np.array_equal(p[1, :, 0], b[:, 4]) and not p[1, :, 1:].any()
  assert gemm.packed_b_size(3, 5, 4) == p.size


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


def test_a_conv_gemm_runs_transposed_where_that_pads_fewer_products():
  assert conv.transpose_gemm(16, 512, 49)        # 7x7 pixels: a quarter of two 32-column panels is padding
  assert conv.transpose_gemm(16, 256, 196)
  assert not conv.transpose_gemm(16, 64, 3136)   # many pixels, whole panels of channels either way
  assert not conv.transpose_gemm(16, 16, 4096)   # 16 channels would pad half a 32-column panel


def test_the_transposed_gemms_rows_are_an_odd_number_of_cache_lines_apart():
  """C^T's epilogue reads down its columns: rows a power of two of bytes apart share one L1 set and evict each
  other, so a pitch of an even number of whole lines gets one line more; any other pitch is kept."""
  assert conv.skewed_pitch(1024, 4) == 1040 and conv.skewed_pitch(64, 4) == 80 and conv.skewed_pitch(32, 4) == 48
  assert conv.skewed_pitch(16, 4) == 16 and conv.skewed_pitch(48, 4) == 48 and conv.skewed_pitch(100, 4) == 100
  assert conv.skewed_pitch(32, 2) == 32 and conv.skewed_pitch(64, 2) == 96   # 2-byte elements: 32 to a line


def test_heuristic_leaves_sparse_tiles_to_sgemm():
  t = {"gemm": "auto", "vl": 16}
  mr, nr = gemm.gemm_geometry(16)
  assert conv.choose_gemm(t, 4 * mr, 100 * nr, F32)
  assert conv.choose_gemm(t, mr + 1, 100 * nr, F32)   # two balanced panels: hardly any padding rows
  assert not conv.choose_gemm(t, 4 * mr, 1, F32) and not conv.choose_gemm(t, 4 * mr, nr + 1, F32)  # padding columns
  assert conv.choose_gemm(dict(t, gemm="micro"), 1, 1, F32) and not conv.choose_gemm(dict(t, gemm="blas"), 64, 4096, F32)
  assert not conv.choose_gemm(t, 4 * mr, 4096, F32, forced=False) and conv.choose_gemm(t, 1, 1, F32, forced=True)
  assert not conv.choose_gemm(t, 4 * mr, 4096, np.dtype(np.float16))


def _conv_model(x, w, attrs):
  return tiny_model("Conv", {"x": x}, consts={"w": w, "b": R.standard_normal(w.shape[0]).astype(np.float32)}, attrs=attrs)


@pytest.mark.parametrize("xs,ws,attrs,strategy", [
  ((1, 64, 9, 3), (37, 64, 3, 3), {"pads": [1, 1, 1, 1]}, "im2col"),     # rows shorter than any vector: im2col
  ((2, 96, 9, 11), (50, 96, 1, 1), {}, "pointwise"),                                         # batch of 2
  ((1, 80, 6, 6), (58, 40, 1, 1), {"group": 2}, "pointwise"),                               # grouped: per group
  ((1, 72, 11, 5), (31, 72, 3, 3), {"strides": [2, 2]}, "im2col"),      # strided, output rows of 2
  ((1, 96, 3, 40), (64, 96, 1, 1), {}, "pointwise"),    # 64 channels: transposed, C^T's rows a skewed pitch apart
])
@pytest.mark.parametrize("transposed", [False, True])
def test_convs_through_the_micro_kernel_match_onnxruntime(monkeypatch, xs, ws, attrs, strategy, transposed):
  """transposed: C^T = X^T W^T (pm_gemm_b, the weights packed as B), which transpose_gemm picks for few pixels."""
  monkeypatch.setenv("PYMODELD_GEMM", "micro")
  monkeypatch.setattr(conv, "IM2COL_BAND_BYTES", 40 << 10)     # several bands, the last one short
  monkeypatch.setattr(conv, "TRANSPOSE_MIN_GAIN", -1.0 if transposed else 1e9)
  x = R.standard_normal(xs).astype(np.float32)
  w = (R.standard_normal(ws) * 0.1).astype(np.float32)
  model = _conv_model(x, w, attrs)
  r = OnnxRunner(model)
  first = {k: np.array(v) for k, v in r(x=x).items()}
  [k] = [k for k in r.program.kernels if k.tags.get("strategy")]
  assert (k.tags["strategy"], k.tags["gemm"]) == (strategy, "micro")
  assert ("pm_gemm_b(" if transposed else "pm_gemm(") in k.source and "sgemm" not in k.params[-1]
  np.testing.assert_allclose(first["y0"], ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-4)
  again = r(x=x)
  assert all(np.array_equal(first[n], again[n]) for n in first)


def test_blas_mode_keeps_sgemm(monkeypatch):
  monkeypatch.setenv("PYMODELD_GEMM", "blas")
  x = R.standard_normal((1, 64, 9, 3)).astype(np.float32)   # rows shorter than any vector: im2col at every width
  r = OnnxRunner(_conv_model(x, R.standard_normal((62, 64, 3, 3)).astype(np.float32), {"pads": [1, 1, 1, 1]}))
  assert [k.tags.get("gemm") for k in r.program.kernels if k.tags.get("strategy")] == ["blas"]


@pytest.mark.parametrize("op", ["Conv", "Conv transposed", "MatMul"])
def test_micro_kernel_gemms_split_across_threads_give_bit_identical_results_for_every_thread_count(monkeypatch, op):
  """A large micro-kernel GEMM is cut into column (Conv) or row (transposed Conv, MatMul) panels run by the
  program's threads; each C element is computed by the same tile in the same order, so 1, 2 and 3 threads agree
  bit for bit."""
  monkeypatch.delenv(config.GEMM_ENV, raising=False)
  monkeypatch.setenv(config.WINOGRAD_ENV, "0")   # the 3x3 conv stays this test's im2col GEMM
  monkeypatch.setattr(conv, "TRANSPOSE_MIN_GAIN", -1.0 if op == "Conv transposed" else 1e9)
  if op.startswith("Conv"):
    x = R.standard_normal((1, 128, 64, 3)).astype(np.float32)   # rows shorter than any vector, many channels:
    model = _conv_model(x, (R.standard_normal((126, 128, 3, 3)) * 0.1).astype(np.float32), {"pads": [1, 1, 1, 1]})
    # im2col at every width (126 output channels fill no whole vector, so the lanes do not go along them)
  else:
    x = R.standard_normal((200, 300)).astype(np.float32)
    model = tiny_model("MatMul", {"x": x}, consts={"w": (R.standard_normal((300, 250)) * 0.1).astype(np.float32)})
  r = OnnxRunner(model, threads=1)
  [k] = [k for k in r.program.kernels if k.tags.get("gemm")]
  assert k.tags["gemm"] == "micro" and ("extern", "pm_split") in [tuple(p) for p in k.params]
  assert ("pm_gemm(" in k.source) == (op == "Conv")
  one = np.array(r(x=x)["y0"])
  np.testing.assert_allclose(one, ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-4)
  for threads in (2, 3):
    r.threads = threads
    assert np.array_equal(np.array(r(x=x)["y0"]), one), f"{threads} threads differ from one"


def test_the_search_measures_micro_kernel_candidates_only_where_the_target_may_use_them(monkeypatch):
  x = R.standard_normal((1, 64, 9, 9)).astype(np.float32)
  graph = import_onnx(_conv_model(x, R.standard_normal((64, 64, 3, 3)).astype(np.float32), {"pads": [1, 1, 1, 1]}))
  offered = []
  monkeypatch.setattr(search, "conv_strategy", lambda sig, default, cands, measure: offered.append(cands) or cands[0])
  for mode in ("auto", "blas"):
    monkeypatch.setenv(config.GEMM_ENV, mode)
    measured_conv_strategies(graph, {"x": Spec(x.shape, x.dtype)}, "CPU", {})
  assert [any(c.endswith(conv.MICRO) for c in cands) for cands in offered] == [True, False]


@pytest.mark.parametrize("op,xs,ws,attrs", [
  ("MatMul", (37, 70), (70, 45), {}),
  ("MatMul", (2, 3, 29, 40), (40, 64), {}),                              # batched activations, one weight matrix
  ("Gemm", (50, 33), (33, 70), {"alpha": 0.5, "beta": 2.0}),             # alpha folded into the packed weights
  ("Gemm", (33, 50), (70, 33), {"transA": 1, "transB": 1}),              # A read down its columns, B laid out (N, K)
  ("MatMul", (16, 2 * gemm.KC + 5), (2 * gemm.KC + 5, 96), {}),          # several K blocks, two balanced row panels
])
def test_matmuls_by_constant_weights_run_on_the_micro_kernel_and_match_onnxruntime(monkeypatch, op, xs, ws, attrs):
  monkeypatch.delenv(config.GEMM_ENV, raising=False)
  monkeypatch.setenv(config.THREADS_ENV, "1")
  x = R.standard_normal(xs).astype(np.float32)
  consts = {"w": (R.standard_normal(ws) * 0.1).astype(np.float32)}
  if op == "Gemm":
    consts["c"] = R.standard_normal(ws[0] if attrs.get("transB") else ws[1]).astype(np.float32)
  model = tiny_model(op, {"x": x}, attrs=attrs, consts=consts)
  r = OnnxRunner(model)
  [k] = [k for k in r.program.kernels if k.tags.get("gemm")]
  assert k.tags["gemm"] == "micro" and "pm_gemm_b(" in k.source and "sgemm" not in str(k.params)
  first = {n: np.array(v) for n, v in r(x=x).items()}
  np.testing.assert_allclose(first["y0"], ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-4)
  again = r(x=x)
  assert all(np.array_equal(first[n], again[n]) for n in first)


def test_a_matmul_by_run_time_weights_stays_on_sgemm(monkeypatch):
  monkeypatch.delenv(config.GEMM_ENV, raising=False)
  monkeypatch.setenv(config.THREADS_ENV, "1")
  a, b = R.standard_normal((40, 50)).astype(np.float32), R.standard_normal((50, 64)).astype(np.float32)
  model = tiny_model("MatMul", {"a": a, "b": b})
  r = OnnxRunner(model)
  assert [k.tags.get("gemm") for k in r.program.kernels if k.tags.get("gemm")] == ["blas"]
  np.testing.assert_allclose(r(a=a, b=b)["y0"], a @ b, rtol=1e-4, atol=1e-4)
