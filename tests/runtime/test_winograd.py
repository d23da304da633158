"""Winograd F(2x2, 3x3) convs: which convs the chooser and the search give it, parity with onnxruntime over odd
sizes, pads, batches and fused prologues and epilogues, the same bits at any thread count, NaN where the direct
form has it, and the layout of the transforms' kernels."""
import numpy as np
import pytest
from onnx import helper

import runtime.codegen.conv as conv
import runtime.program
import runtime.search
from runtime import OnnxRunner
from runtime.onnx_import import import_onnx

from rt_helpers import memory_cache, node_model, ort_run

R = np.random.default_rng(33)


def f32(*shape):
  return R.uniform(-2, 2, shape).astype(np.float32)


def conv_model(x, M, *, pads=(1, 1, 1, 1), relu_in=False, residual=False, **attrs):
  """Conv(3x3) + bias, optionally with a Relu before it and a residual Add and Relu after it."""
  C = x.shape[1]
  w = (R.standard_normal((M, C, 3, 3)) * np.sqrt(2 / (9 * C))).astype(np.float32)
  nodes, src, inputs = [], "x", {"x": x}
  if relu_in:
    nodes.append(helper.make_node("Relu", ["x"], ["xr"]))
    src = "xr"
  nodes.append(helper.make_node("Conv", [src, "w", "b"], ["c" if residual else "y0"], kernel_shape=[3, 3],
                                pads=list(pads), **attrs))
  if residual:
    inputs["s"] = f32(x.shape[0], M, x.shape[2] + pads[0] + pads[2] - 2, x.shape[3] + pads[1] + pads[3] - 2)
    nodes += [helper.make_node("Add", ["c", "s"], ["a"]), helper.make_node("Relu", ["a"], ["y0"])]
  return node_model(nodes, inputs, {"w": w, "b": f32(M) * 0.1}), inputs


def strategies(r) -> list:
  return [k.tags["strategy"] for k in r.program.kernels if k.tags.get("strategy") and k.tags.get("ops") != ["pad"]]


@pytest.mark.parametrize("xs,M,kw", [
    ((1, 16, 28, 28), 16, {}),
    ((1, 24, 17, 19), 18, {}),                                  # odd output: the last tiles half outside
    ((1, 32, 17, 21), 20, {"pads": (0, 0, 0, 0)}),              # no padding
    ((1, 20, 16, 23), 24, {"pads": (2, 0, 1, 3)}),              # uneven padding
    ((2, 16, 14, 14), 32, {}),                                  # a batch
    ((1, 24, 20, 20), 32, {"relu_in": True, "residual": True}),  # prologue and epilogue fused
])
def test_a_3x3_stride_1_conv_runs_as_winograd_matching_onnxruntime_with_the_same_bits_at_any_thread_count(xs, M, kw):
  x = f32(*xs)
  model, feeds = conv_model(x, M, **kw)
  r = OnnxRunner(model, cache=memory_cache())
  assert strategies(r) == ["winograd"], [k.tags for k in r.program.kernels]
  one = {k: np.array(v) for k, v in r(**feeds).items()}
  np.testing.assert_allclose(one["y0"], ort_run(model, feeds)[0], rtol=1e-4, atol=1e-4)
  assert np.array_equal(np.array(r(**feeds)["y0"]), one["y0"])
  for threads in (2, 3):
    r.threads = threads
    assert np.array_equal(np.array(r(**feeds)["y0"]), one["y0"]), f"{threads} threads differ from one"


def test_winograd_puts_nan_exactly_where_the_direct_conv_does():
  """The transforms add and subtract inputs and products but never multiply one by zero, so a NaN reaches only the
  outputs whose 3x3 window holds it, as in the direct form."""
  x = f32(1, 16, 20, 20)
  x[0, 3, 5, 7] = x[0, 9, 12, 0] = np.nan
  model, feeds = conv_model(x, 16)
  r = OnnxRunner(model, cache=memory_cache())
  assert strategies(r)[0] == "winograd"
  ours, ref = np.array(r(**feeds)["y0"]), ort_run(model, feeds)[0]
  assert np.isnan(ref).any() and np.array_equal(np.isnan(ours), np.isnan(ref))
  np.testing.assert_allclose(np.nan_to_num(ours), np.nan_to_num(ref), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("xs,M,attrs,why", [
    ((1, 32, 20, 20), 32, {"strides": [2, 2]}, "strided"),
    ((1, 32, 20, 20), 32, {"dilations": [2, 2], "pads": [2, 2, 2, 2]}, "dilated"),
    ((1, 32, 20, 20), 32, {"group": 2}, "grouped"),
    ((1, 12, 20, 20), 32, {}, "few input channels"),
    ((1, 32, 20, 20), 12, {}, "few output channels"),
    ((1, 64, 7, 7), 64, {}, "a small output"),
    ((1, 32, 160, 160), 32, {}, "a large output with few channels"),
    ((1, 128, 64, 3), 126, {}, "rows of fewer tiles than the transforms' vectors need"),
])
def test_the_chooser_keeps_winograd_off_convs_it_does_not_pay_for_or_compute(xs, M, attrs, why):
  x = f32(*xs)
  G = attrs.get("group", 1)
  consts = {"w": (R.standard_normal((M, xs[1] // G, 3, 3)) * 0.1).astype(np.float32)}
  a = {"pads": [1, 1, 1, 1], **attrs}
  model = node_model([helper.make_node("Conv", ["x", "w"], ["y0"], kernel_shape=[3, 3], **a)], {"x": x}, consts)
  built = runtime.program.build_program(import_onnx(model), measure=False)
  assert "winograd" not in [k.tags.get("strategy") for k in built.kernels], why


def test_the_search_times_winograd_only_for_the_convs_it_computes(monkeypatch):
  seen = {}

  def record(signature, default, candidates, measure):
    seen[tuple(signature["w"])] = list(candidates)
    return ""
  monkeypatch.setattr(runtime.search, "conv_strategy", record)
  x = f32(1, 16, 12, 12)
  nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
           helper.make_node("Conv", ["a", "w2"], ["y0"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])]
  consts = {"w1": f32(32, 16, 3, 3), "w2": f32(24, 32, 3, 3)}
  graph = import_onnx(node_model(nodes, {"x": x}, consts))
  runtime.program.build_program(graph, measure=True)
  assert "winograd" in seen[(32, 16, 3, 3)] and not any(c.startswith("winograd") for c in seen[(24, 32, 3, 3)]), seen


def test_a_forced_winograd_on_a_conv_it_cannot_compute_is_ignored():
  x = f32(1, 32, 20, 20)
  model = node_model([helper.make_node("Conv", ["x", "w"], ["y0"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                                       strides=[2, 2])], {"x": x}, {"w": f32(32, 32, 3, 3)})
  built = runtime.program.build_program(import_onnx(model), measure=False, force_conv={"y0": "winograd"})
  assert [k.tags.get("strategy") for k in built.kernels if k.tags.get("strategy")] != ["winograd"]


def test_the_input_transform_is_one_kernel_computing_the_16_tile_positions_from_shared_loads():
  """One kernel (not 16) stores V: lanes along a row of tiles, the tile positions as constant copies, so each
  position's sum of four inputs is its own expression and no select over positions is left in the source (an
  unpadded conv: a padded one selects zero for the taps past the border)."""
  x = f32(1, 32, 30, 34)
  model, _ = conv_model(x, 32, pads=(0, 0, 0, 0))
  built = runtime.program.build_program(import_onnx(model), measure=False)
  transform = [k for k in built.kernels if "winograd input" in k.tags.get("ops", [])]
  assert len(transform) == 1 and " up " in transform[0].tags["schedules"][0], [k.tags for k in built.kernels]
  assert "vsel" not in transform[0].source.split("void k_")[-1]


def test_the_products_plane_pitch_spreads_the_16_streams_the_output_transform_reads_over_the_l1_sets():
  """At 64 channels of 28x28 tiles each stream starts 64 * 784 floats (49 pages) after the last: at that pitch all
  16 fall in one L1 set. The chosen pitch puts each in a set of its own."""
  def crowd(pitch, planes):
    sets = [(s * planes * pitch * 4) % 4096 // 64 for s in range(16)]
    return max(sets.count(v) for v in sets)
  assert crowd(784, 64) == 16 and crowd(conv._spread_pitch(784, 64, 16, 4), 64) == 1
  for n, planes in ((196, 128), (49, 256), (3136, 32), (100, 40)):
    p = conv._spread_pitch(n, planes, 16, 4)
    assert p >= n and crowd(p, planes) == min(crowd(q, planes) for q in range(n, n + 1025)), (n, planes, p)


def test_pymodeld_winograd_0_keeps_every_conv_in_its_direct_or_gemm_form_under_its_own_program_key(monkeypatch):
  x = f32(1, 32, 28, 28)
  model, feeds = conv_model(x, 32)
  on = runtime.program.build_program(import_onnx(model), measure=False)
  monkeypatch.setenv("PYMODELD_WINOGRAD", "0")
  off = runtime.program.build_program(import_onnx(model), measure=False)
  assert "winograd" in [k.tags.get("strategy") for k in on.kernels]
  assert "winograd" not in [k.tags.get("strategy") for k in off.kernels]
  assert on.target != off.target and on.program_key != off.program_key
  r = OnnxRunner(model, cache=memory_cache())
  np.testing.assert_allclose(np.array(r(**feeds)["y0"]), ort_run(model, feeds)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", ["winograd over 7x7 tiles", "grouped 1x1 conv"])
def test_sgemms_per_group_split_across_threads_by_group_with_the_same_bits(monkeypatch, case):
  """Each group's GEMM was cut into 64-column blocks for the threads, so GEMMs of fewer columns (winograd's 16 over
  a 14x14 output: 49 tiles) ran on one thread, group after group. The split now runs over every group's blocks."""
  if case.startswith("winograd"):
    x = f32(1, 128, 14, 14)
    model, feeds = conv_model(x, 32)
    groups = 16
  else:
    x = f32(1, 256, 14, 14)
    w = (R.standard_normal((128, 64, 1, 1)) * 0.1).astype(np.float32)
    model = node_model([helper.make_node("Conv", ["x", "w"], ["y0"], group=4)], {"x": x}, {"w": w})
    feeds, groups = {"x": x}, 4
    monkeypatch.setenv("PYMODELD_GEMM", "blas")   # (its heuristic gives this one the micro-kernel)
  r = OnnxRunner(model, cache=memory_cache())
  gemm = [k for k in r.program.kernels if k.tags.get("gemm") == "blas"]
  assert len(gemm) == 1 and f"pm_parts = {groups} * " in gemm[0].source, [k.tags for k in r.program.kernels]
  one = np.array(r(**feeds)["y0"])
  np.testing.assert_allclose(one, ort_run(model, feeds)[0], rtol=1e-4, atol=1e-4)
  for threads in (2, 3):
    r.threads = threads
    assert np.array_equal(np.array(r(**feeds)["y0"]), one), f"{threads} threads differ from one"
