"""Padding read through gated loads: a Pad or a window's padding feeding a conv or a pool is never a kernel of
its own (the consumer gates its loads at the border, the vector tiles that cross it masking their lanes), an
explicit zero Pad folds into the conv's padding, and a 1x1 conv's loops are vector code or BLAS, never scalar.
Every case is checked against onnxruntime and for bit-identical results across runs."""
import numpy as np
import pytest
from onnx import helper

import runtime.codegen.conv as conv
from runtime import OnnxRunner, compiler

from rt_helpers import checked, memory_cache, node_model

R = np.random.default_rng(77)


def f32(*shape):
  return R.uniform(-2.0, 2.0, shape).astype(np.float32)


def weights(*shape):
  return (R.standard_normal(shape) * 0.3).astype(np.float32)


def kernel_ops(r) -> list[list[str]]:
  return [k.tags.get("ops", []) for k in r.program.kernels]


def pad_kernels(r) -> list[list[str]]:
  """Kernels that only pad or copy (no op of the model's computes in them)."""
  return [ops for ops in kernel_ops(r) if all(o.lower() == "pad" for o in ops)]


def schedules(r) -> list[str]:
  return [s for k in r.program.kernels for s in k.tags.get("schedules", [])]


def test_a_pad_feeding_a_conv_is_a_gated_load_not_a_kernel():
  x = f32(1, 8, 19, 37)
  nodes = [helper.make_node("Pad", ["x", "p"], ["xp"], mode="constant"),
           helper.make_node("Conv", ["xp", "w"], ["y0"], pads=[1, 1, 1, 1])]
  consts = {"p": np.array([0, 0, 1, 2, 0, 0, 2, 0], np.int64), "w": weights(16, 8, 3, 3)}
  r = checked(node_model(nodes, {"x": x}, consts), {"x": x})
  assert kernel_ops(r) == [["Conv"]], kernel_ops(r)


def test_a_zero_pad_of_an_expression_folds_into_the_conv_and_is_never_stored_padded():
  x = f32(1, 8, 20, 33)
  nodes = [helper.make_node("Relu", ["x"], ["rx"]),
           helper.make_node("Pad", ["rx", "p"], ["xp"], mode="constant"),
           helper.make_node("Conv", ["xp", "w", "b"], ["y0"], pads=[0, 1, 1, 0], strides=[2, 1])]
  consts = {"p": np.array([0, 0, 2, 1, 0, 0, 0, 3], np.int64), "w": weights(16, 8, 3, 3), "b": f32(16)}
  r = checked(node_model(nodes, {"x": x}, consts), {"x": x})
  assert pad_kernels(r) == [], kernel_ops(r)
  assert all("Pad" not in ops for ops in kernel_ops(r)), kernel_ops(r)   # no kernel stores the padded tensor


def test_a_nonzero_pad_feeding_a_conv_is_read_through_its_mask():
  x = f32(1, 4, 18, 40)
  nodes = [helper.make_node("Pad", ["x", "p", "v"], ["xp"], mode="constant"),
           helper.make_node("Conv", ["xp", "w"], ["y0"], pads=[1, 1, 1, 1])]
  consts = {"p": np.array([0, 0, 1, 3, 0, 0, 2, 1], np.int64), "v": np.array(0.75, np.float32), "w": weights(8, 4, 3, 3)}
  r = checked(node_model(nodes, {"x": x}, consts), {"x": x})
  assert pad_kernels(r) == [], kernel_ops(r)


@pytest.mark.parametrize("consumer", [
    lambda: [helper.make_node("Add", ["xp", "y"], ["y0"])],
    lambda: [helper.make_node("MaxPool", ["xp"], ["y0"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
    lambda: [helper.make_node("AveragePool", ["xp"], ["y0"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])],
])
def test_a_pad_feeding_an_elementwise_op_or_a_pool_is_one_kernel_with_its_consumer(consumer):
  feeds = {"x": f32(1, 4, 10, 20), "y": f32(1, 4, 12, 23)}
  nodes = [helper.make_node("Pad", ["x", "p"], ["xp"])] + consumer()
  used = {i for n in nodes for i in n.input}
  feeds = {k: v for k, v in feeds.items() if k in used}
  r = checked(node_model(nodes, feeds, {"p": np.array([0, 0, 1, 1, 0, 0, 1, 2], np.int64)}), feeds)
  assert len(r.program.kernels) == 1 and "pad" not in r.program.kernels[0].tags.get("ops"), kernel_ops(r)


@pytest.mark.parametrize("xs,ws,attrs", [
    ((1, 3, 64, 64), (16, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),        # a stem: strided masked loads
    ((1, 16, 30, 56), (16, 16, 3, 3), {"pads": [1, 1, 1, 1]}),                         # masked tiles at both ends
    ((1, 16, 12, 20), (16, 1, 3, 3), {"pads": [2, 1, 0, 2], "group": 16}),             # depthwise, uneven pads
    ((1, 8, 11, 13), (16, 8, 3, 3), {"pads": [1, 1, 1, 1], "dilations": [2, 2]}),       # narrow rows, dilated
    ((1, 8, 9, 45), (16, 8, 5, 5), {"pads": [2, 4, 2, 4], "strides": [1, 4]}),          # stride 4: a gather
    ((1, 8, 10, 33), (24, 8, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((2, 4, 7, 70), (8, 4, 1, 9), {"pads": [0, 8, 0, 8]}),                             # pads as wide as a tile
])
def test_a_padded_conv_on_a_buffer_reads_through_gated_loads(xs, ws, attrs):
  x = f32(*xs)
  x[..., 0] = np.nan   # a gated lane never reads across the border, but a NaN inside it propagates
  model = node_model([helper.make_node("Conv", ["x", "w", "b"], ["y0"], **attrs)], {"x": x},
                     {"w": weights(*ws), "b": f32(ws[0])})
  r = checked(model, {"x": x})
  assert pad_kernels(r) == [], kernel_ops(r)


@pytest.mark.parametrize("xs,ws,attrs", [
    ((1, 24, 14, 14), (64, 24, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 16, 13, 11), (32, 16, 3, 3), {"pads": [2, 1, 0, 2], "strides": [2, 1]}),
])
def test_lanes_along_the_channels_read_a_padded_input_through_gated_loads(monkeypatch, xs, ws, attrs):
  """direct_cm (a measured choice may force it on any ungrouped conv): the gates depend on the upcast output
  columns, so each copy is guarded, and what the copies share (the weights' vectors) is computed once outside."""
  monkeypatch.setattr(conv, "choose_conv", lambda **kw: "direct_cm")
  x = f32(*xs)
  r = checked(node_model([helper.make_node("Conv", ["x", "w", "b"], ["y0"], **attrs)], {"x": x},
                         {"w": weights(*ws), "b": f32(ws[0])}), {"x": x})
  assert [k.tags.get("strategy") for k in r.program.kernels] == ["direct_cm"]
  assert pad_kernels(r) == [], kernel_ops(r)


def test_the_vector_tiles_that_cross_a_border_mask_their_lanes():
  x = f32(1, 3, 64, 64)
  model = node_model([helper.make_node("Conv", ["x", "w"], ["y0"], strides=[2, 2], pads=[3, 3, 3, 3])], {"x": x},
                     {"w": weights(16, 3, 7, 7)})
  r = checked(model, {"x": x})
  [k] = r.program.kernels
  assert k.tags["schedules"][0].startswith("tile"), k.tags
  assert "vf_maskload" in k.source   # the edge tiles are vector code, not a scalar loop per element


def test_a_direct_convs_border_tiles_add_their_terms_without_a_lane_select(monkeypatch):
  """Finite weights and an input read as it is: a tap past a row's end reads 0 and adds 0 * w, which leaves the
  sum as it was, so the tiles crossing the left and right borders are plain FMAs on masked loads (a lane select
  per term cost four instructions where an FMA costs one); a Pad's nonzero fill still selects."""
  monkeypatch.setenv("PYMODELD_WINOGRAD", "0")   # the conv in its direct form
  x = f32(1, 16, 30, 56)
  r = checked(node_model([helper.make_node("Conv", ["x", "w"], ["y0"], pads=[1, 1, 1, 1])], {"x": x},
                         {"w": weights(16, 16, 3, 3)}), {"x": x})
  [k] = r.program.kernels
  body = k.source.split(f"void {k.name}(")[-1]
  assert k.tags.get("strategy") == "direct" and "vf_maskload" in body and "vsel(" not in body


@pytest.mark.parametrize("op,attrs", [
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
])
def test_a_padded_pool_on_a_buffer_reads_through_gated_loads(op, attrs):
  x = -np.abs(f32(1, 8, 23, 41))   # all below 0: a max pool that read a zero from the border would show it
  r = checked(node_model([helper.make_node(op, ["x"], ["y0"], **attrs)], {"x": x}, {}), {"x": x})
  assert pad_kernels(r) == [], kernel_ops(r)


@pytest.mark.parametrize("winograd", ["1", "0"])
def test_a_pointwise_conv_feeding_a_padded_conv_needs_no_pad_kernel(monkeypatch, winograd):
  """The 3x3 conv as winograd (its input transform gates its loads at the border) and in its direct form."""
  monkeypatch.setenv("PYMODELD_WINOGRAD", winograd)
  x = f32(1, 96, 14, 40)   # rows of 40: the row-lane strategies (shorter ones take lanes along channels)
  nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"]), helper.make_node("Relu", ["c1"], ["r1"]),
           helper.make_node("Conv", ["r1", "w2"], ["y0"], pads=[1, 1, 1, 1])]
  consts = {"w1": weights(32, 96, 1, 1), "b1": f32(32), "w2": weights(32, 32, 3, 3)}
  r = checked(node_model(nodes, {"x": x}, consts), {"x": x})
  assert [k.tags.get("strategy") for k in r.program.kernels if k.tags.get("strategy")] == \
      ["pointwise", "winograd" if winograd == "1" else "direct"]
  assert pad_kernels(r) == [], kernel_ops(r)


def pointwise_then_depthwise(h, w) -> OnnxRunner:
  """A 1x1 conv (64 input channels: generated loops, "direct") and Clip, then a padded 3x3 depthwise conv."""
  x = f32(1, 64, h, w)
  nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"]), helper.make_node("Clip", ["c1", "lo", "hi"], ["r1"]),
           helper.make_node("Conv", ["r1", "w2"], ["y0"], pads=[1, 1, 1, 1], group=64)]
  consts = {"w1": weights(64, 64, 1, 1), "b1": f32(64), "lo": np.float32(0), "hi": np.float32(6), "w2": weights(64, 1, 3, 3)}
  r = checked(node_model(nodes, {"x": x}, consts), {"x": x})
  assert r.program.kernels[0].tags["strategy"] == "direct", r.program.kernels[0].tags
  return r


@pytest.mark.parametrize("h,w", [(12, 12), (6, 6), (7, 10)])
def test_a_pointwise_conv_with_short_rows_is_stored_plainly_and_its_padded_consumer_gates_its_loads(h, w):
  """A 12-wide row takes narrow or overlapping vectors when stored into a padded buffer, while the plain store
  merges the rows into one long vector axis: the 1x1 conv stores plainly (no pad in its kernel, its rows merged)
  and the depthwise conv after it reads the border through gated loads."""
  if compiler.vector_bytes() // 4 < 8:
    pytest.skip("with 4 float lanes these rows are whole vectors")
  r = pointwise_then_depthwise(h, w)
  assert kernel_ops(r) == [["Conv", "Clip"], ["Conv"]], kernel_ops(r)
  assert "mx" in r.program.kernels[0].tags["schedules"][0], r.program.kernels[0].tags


def test_a_pointwise_conv_whose_rows_fill_whole_vectors_is_computed_into_the_padded_buffer():
  r = pointwise_then_depthwise(5, 2 * (compiler.vector_bytes() // 4))
  assert kernel_ops(r) == [["Conv", "Clip", "pad"], ["Conv"]], kernel_ops(r)


def test_a_channel_shuffle_feeding_a_padded_conv_is_stored_padded_once_and_read_as_vectors():
  """A shuffle's loads are div/mod over the position: gated at a border they are not affine along a row, so
  the shuffle is computed into the conv's padded buffer (its kernel a Reshape, not a pad of its own) and the
  depthwise conv over it stays vector code."""
  x = f32(1, 160, 12, 28)   # 40 input channels per group: the grouped 1x1 conv is one sgemm per group
  nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], group=4), helper.make_node("Relu", ["c1"], ["r1"]),
           helper.make_node("Reshape", ["r1", "s1"], ["g"]), helper.make_node("Transpose", ["g"], ["gt"], perm=[0, 2, 1, 3, 4]),
           helper.make_node("Reshape", ["gt", "s2"], ["sh"]),
           helper.make_node("Conv", ["sh", "w2"], ["y0"], pads=[1, 1, 1, 1], group=32)]
  consts = {"w1": weights(32, 40, 1, 1), "s1": np.array([1, 4, 8, 12, 28], np.int64),
            "s2": np.array([1, 32, 12, 28], np.int64), "w2": weights(32, 1, 3, 3)}
  r = checked(node_model(nodes, {"x": x}, consts), {"x": x})
  assert pad_kernels(r) == [], kernel_ops(r)
  assert [k.tags.get("strategy") for k in r.program.kernels] == ["pointwise", None, "direct"], kernel_ops(r)
  [dw] = [k for k in r.program.kernels if k.tags.get("ops") == ["Conv"] and k.tags.get("strategy") == "direct"]
  assert dw.tags["schedules"][0].startswith("tile"), dw.tags


@pytest.mark.parametrize("xs,m,band_bytes,strategy,stride", [
    ((1, 520, 7, 7), 42, None, "pointwise", 1),      # a 7x7 plane: one band, its rows merged into one vector axis
    ((1, 96, 14, 30), 42, None, "pointwise", 1),
    ((2, 128, 20, 24), 42, 16 << 10, "pointwise", 1),  # several bands: the band's rows are a run-time extent
    ((1, 96, 7, 7), 42, None, "direct", 1),          # a tiny output: generated loops
    ((1, 40, 10, 10), 48, None, "direct", 1),
    ((1, 520, 7, 7), 48, None, ("direct_cm", "pointwise"), 1),   # whole vectors of output channels, short rows
    ((1, 96, 14, 30), 48, None, ("direct_cm", "pointwise"), 1),
    ((1, 520, 14, 14), 48, None, "pointwise", 2),   # strided: its input subsampled by a vector loop kernel first
    ((2, 256, 28, 28), 48, 16 << 10, "pointwise", 2),
    ((1, 520, 13, 15), 48, None, "pointwise", 3),
])
def test_a_one_by_one_convs_loops_are_never_scalar(monkeypatch, xs, m, band_bytes, strategy, stride):
  """m = 42 output channels fill no whole vector (at 4, 8 or 16 lanes), 48 fill them at every width; a pair names
  the strategy with AVX-512's width and with a narrower one."""
  if band_bytes is not None:
    monkeypatch.setattr(conv, "EPILOGUE_BAND_BYTES", band_bytes)
  if isinstance(strategy, tuple):
    strategy = strategy[0] if compiler.vector_bytes() // 4 >= conv.CM_WIDE_VL else strategy[1]
  x = f32(*xs)
  out_sp = [-(-d // stride) for d in xs[2:]]
  nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[stride, stride]), helper.make_node("Relu", ["c"], ["r"]),
           helper.make_node("Add", ["r", "x2"], ["y0"])]
  x2 = f32(xs[0], m, *out_sp)
  r = checked(node_model(nodes, {"x": x, "x2": x2}, {"w": weights(m, xs[1], 1, 1), "b": f32(m)}), {"x": x, "x2": x2})
  assert [k.tags.get("strategy") for k in r.program.kernels if k.tags.get("strategy")] == [strategy]
  assert schedules(r) and not any(s == "scalar" for s in schedules(r)), schedules(r)


def test_a_strided_one_by_one_conv_computes_its_subsampled_input_as_vector_code():
  x = f32(1, 300, 17, 22)   # the inner axis unstrided: plain loads a scalar elementwise nest would be left with
  nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Conv", ["a", "w"], ["y0"], strides=[3, 1])]
  r = checked(node_model(nodes, {"x": x}, {"w": weights(40, 300, 1, 1)}), {"x": x})
  assert [k.tags.get("strategy") for k in r.program.kernels] == [None, "pointwise"]
  assert r.program.kernels[0].tags["ops"][-1] == "subsample"
  assert not any(s == "scalar" for s in schedules(r)), schedules(r)


def test_a_masked_load_whose_lane_mask_every_upcast_copy_shares_compiles():
  """A depthwise 3x3 whose reduction skips on the rows' gate only (the columns' gate left on the load): the
  upcast rows run in guard blocks, and the lane mask of their loads, the same for every copy, is computed before
  the guards (named inside one copy's block it would not be visible in the next's)."""
  from runtime import compiler
  from runtime.codegen import ir, optimise, render
  C, H, W = 8, 12, 40
  f = np.dtype(np.float32)
  xb, wb, ob = ir.Buf("bx", f, C * H * W), ir.Buf("bw", f, C * 9), ir.Buf("bo", f, C * H * W)
  c, h, w = ir.var("c", C), ir.var("h", H), ir.var("w", W)
  kh, kw = ir.var("r_kh", 3), ir.var("r_kw", 3)
  ph, pw = ir.add(h, kh, -1), ir.add(w, kw, -1)
  row_conds = [ir.alu("ge", ph, 0), ir.alu("lt", ph, H)]
  rows = ir.all_of(*row_conds)
  # one flat conjunction, as a window's gate is: the columns' conjuncts are no subexpression of their own
  xv = ir.load(xb, ir.add(ir.mul(c, H * W), ir.mul(ph, W), pw), ir.all_of(*row_conds, ir.alu("ge", pw, 0), ir.alu("lt", pw, W)))
  wv = ir.load(wb, ir.add(ir.mul(c, 9), ir.mul(kh, 3), kw))
  value = ir.reduce("sum", [kh, kw], ir.alu("mul", xv, wv), rows)
  k = ir.LoopKernel("k", [c, h, w], (C, H, W), [ir.Store(ob, ir.add(ir.mul(c, H * W), ir.mul(h, W), w), value)], {})
  lk, sched = optimise.optimise(k, 16)
  assert sched.mode == "tile" and sched.up_var is not None and sched.up_var.arg[0] == "h", sched.describe()
  src = render.render_loop(lk, sched, 16).source
  assert "vf_maskload" in src
  compiler.compile_one(src)


@pytest.mark.parametrize("xs,k,pads", [   # 5x5 windows over channels that fill no whole vector (else channel lanes)
    ((2, 20, 5, 5), 5, [2, 2, 2, 2]),
    ((1, 40, 7, 7), 3, [1, 1, 1, 1]),
    ((1, 16, 10, 10), 3, [2, 1, 0, 1]),    # rows as wide as the input's, one more row on top and one fewer below
    ((1, 8, 6, 11), 3, [1, 1, 1, 1]),      # rows of 11: under FLAT_MAX_ROW_LANES of 8 lanes and of 16
])
def test_a_depthwise_conv_on_small_planes_runs_each_plane_as_one_vector_axis(xs, k, pads):
  """Rows shorter than a vector would take narrow tiles: the plane's positions are one flat axis instead, the taps
  that cross a row's end select zero from a constant table. An inf at the end of a row, which such a tap would
  read from the next row, must not reach the outputs it does not belong to."""
  if compiler.vector_bytes() // 4 < 8:
    pytest.skip("with 4 float lanes these rows fill their vectors")
  x = f32(*xs)
  x[:, :, :, -1] = np.inf
  x[0, 0, 0, 0] = np.nan
  nodes = [helper.make_node("Conv", ["x", "w"], ["y0"], pads=pads, group=xs[1])]
  r = checked(node_model(nodes, {"x": x}, {"w": weights(xs[1], 1, k, k)}), {"x": x})
  [k] = r.program.kernels
  [sched] = k.tags["schedules"]
  assert k.tags["strategy"] == "direct" and "mx" in sched, sched   # the plane's rows merged into the vector axis


@pytest.mark.parametrize("xs,m,k,pads", [   # output channels that fill no whole vector: not lanes along channels
    ((2, 32, 14, 14), 42, 3, [1, 1, 1, 1]),
    ((1, 64, 7, 7), 66, 3, [1, 1, 1, 1]),
    ((1, 24, 10, 13), 40, 3, [2, 1, 0, 1]),   # one more row on top, one fewer below: the band's rows shift
    ((1, 16, 13, 13), 16, 5, [2, 2, 2, 2]),
])
def test_an_im2col_conv_on_short_rows_packs_each_band_as_one_flat_vector_axis_with_the_same_bits(monkeypatch, xs, m, k,
                                                                                                  pads):
  """A GEMM kernel's nests share the native vector width, so a band of rows shorter than a vector was packed by
  scalar loops; its positions are one flat axis now (the depthwise flat planes' table and gate). The columns it
  packs are the same values, so the conv gives the same bits as the row form, an inf at a row's end included."""
  if compiler.vector_bytes() // 4 < 16:
    pytest.skip("with narrower vectors these convs run direct (rows of several vectors)")
  monkeypatch.setenv("PYMODELD_WINOGRAD", "0")   # the 3x3 convs stay im2col GEMMs
  x = f32(*xs)
  x[:, :, :, -1] = np.inf
  x[0, 0, 0, 0] = np.nan
  model = node_model([helper.make_node("Conv", ["x", "w"], ["y0"], pads=pads)], {"x": x}, {"w": weights(m, xs[1], k, k)})
  r = checked(model, {"x": x})
  pack = r.program.kernels[0].tags["schedules"][0]
  assert r.program.kernels[0].tags["strategy"].startswith("im2col") and pack.startswith("tile pf"), pack
  monkeypatch.setattr(conv, "_flat_pack", lambda *a: False)
  rows = OnnxRunner(model, cache=memory_cache())
  assert not rows.program.kernels[0].tags["schedules"][0].startswith("tile pf")
  np.testing.assert_array_equal(r(x=x)["y0"], rows(x=x)["y0"])
