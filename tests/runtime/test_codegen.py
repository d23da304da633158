"""The code generator: one pipeline for every front end, replay without Python per kernel, the strategies the
chooser picks, the vector paths (tiles, edges, strided loads, inner reductions) against onnxruntime, and the
semantics generated C must keep (NaN/Inf propagation, no signal on integer division by zero, clamped gathers)."""
import ctypes
import json
import math
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from onnx import helper

import runtime.artifact
import runtime.cache
from runtime import compiler
import runtime.codegen.conv
import runtime.codegen.optimise
import runtime.codegen.render
import runtime.compiler
import runtime.jit
import runtime.link
import runtime.program
import runtime.runner
import runtime.tensor
from runtime import OnnxRunner
from runtime.codegen import ir
from runtime.codegen.ir import View
from runtime.jit import TinyJit
from runtime.onnx_import import import_onnx
from runtime.program import CompileCache
from runtime.tensor import Tensor

from rt_helpers import node_model, ort_run, tiny_model

R = np.random.default_rng(2024)


def f32(*shape, lo=-2.0, hi=2.0):
  return R.uniform(lo, hi, shape).astype(np.float32)


def parity(model, feeds, rtol=1e-4, atol=1e-5, device="CPU"):
  r = OnnxRunner(model, device=device)
  ours = r(**feeds)
  for name, ref in zip(r.program.outputs, ort_run(model, feeds)):
    np.testing.assert_allclose(ours[name], ref, rtol=rtol, atol=atol, err_msg=name)
  return r


def schedules(r) -> list[str]:
  return [s for k in r.program.kernels for s in k.tags.get("schedules", [])]


# --------------------------------------------------------------------------------------------- one pipeline

STAGES = ["run_passes", "lower", "optimise", "render_kernels", "compile_program", "link"]
FRONT_ENDS = [runtime.program, runtime.link, runtime.runner, runtime.tensor, runtime.jit, runtime.artifact]


@pytest.fixture
def stage_calls(monkeypatch):
  """Counts every call of each pipeline stage, wherever a front end imported it from."""
  calls = {name: 0 for name in STAGES}
  for name in STAGES:
    real = getattr(runtime.program, name, None) or getattr(runtime.link, name)

    def counted(*a, _real=real, _name=name, **k):
      calls[_name] += 1
      return _real(*a, **k)
    for mod in FRONT_ENDS:
      if getattr(mod, name, None) is real:
        monkeypatch.setattr(mod, name, counted)
  return calls


def test_onnx_runner_tensor_realize_and_tinyjit_go_through_the_same_stages(stage_calls):
  x = f32(2, 5)
  OnnxRunner(tiny_model("Relu", {"x": x}), cache=CompileCache(use_disk=False))
  assert all(v >= 1 for v in stage_calls.values()), stage_calls
  for k in stage_calls:
    stage_calls[k] = 0
  (Tensor(x) * 3 + 1).relu().realize()
  assert all(v >= 1 for v in stage_calls.values()), stage_calls
  for k in stage_calls:
    stage_calls[k] = 0
  f = TinyJit(lambda a: (a * 2).exp())
  for _ in range(3):
    f(Tensor(f32(4)))
  assert all(v >= 1 for v in stage_calls.values()), stage_calls


def test_machine_code_is_compiled_in_one_place_the_link_stage():
  """Every front end (a model, a graph, a realize, a TinyJit capture, an artifact) compiles by linking: no module
  but link.py calls compile_program, and link reports where the code came from."""
  root = os.path.dirname(runtime.link.__file__)
  callers = set()
  for d, _, files in os.walk(root):
    for f in files:
      if f.endswith(".py"):
        with open(os.path.join(d, f)) as fh:
          if "compile_program(" in fh.read():
            callers.add(os.path.relpath(os.path.join(d, f), root))
  assert callers == {"link.py"}
  cache = CompileCache(use_disk=False)
  model = tiny_model("Relu", {"x": f32(2, 5)})
  assert OnnxRunner(model, cache=cache).cache_source == "compile"
  assert OnnxRunner(model, cache=cache).cache_source == "memory"


def test_replay_enters_no_python_per_kernel():
  x = f32(1, 3, 16, 16)
  nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
           helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
           helper.make_node("Sigmoid", ["p"], ["y0"])]
  r = OnnxRunner(node_model(nodes, {"x": x}, {"w": f32(8, 3, 3, 3)}))
  assert len(r.program.kernels) >= 2 and not r.program.fallbacks
  events = []
  sys.setprofile(lambda frame, event, arg: events.append((event, frame.f_code.co_name)))
  try:
    r.linked.run()
  finally:
    sys.setprofile(None)
  python_calls = [name for event, name in events if event == "call"]
  assert python_calls == ["run"], python_calls  # Linked.run itself, then one C call walks the whole list


def test_a_fallback_op_runs_from_the_call_list_and_is_reported():
  x = f32(1, 2, 4, 4)   # a 9x9 output is no multiple of the stride: the phase lowering leaves it to the reference kernel
  model = tiny_model("ConvTranspose", {"x": x}, consts={"w": f32(2, 3, 3, 3)}, attrs={"strides": [2, 2]})
  r = parity(model, {"x": x})
  assert r.program.fallbacks == ["ConvTranspose"]
  assert [k.tags.get("fallback") for k in r.program.kernels if k.kind == "host"] == [True]


CONV_T_CASES = [  # (x shape, weight shape (C, M/group, kh, kw), attrs): what U-Net, FCN and GAN decoders use, and edges
    ((1, 8, 6, 7), (8, 4, 2, 2), {"strides": [2, 2]}),
    ((2, 8, 5, 5), (8, 3, 4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 6, 5, 4), (6, 5, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}),
    ((1, 4, 6, 6), (4, 4, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 4, 5, 6), (4, 2, 3, 5), {"pads": [2, 1, 0, 3]}),
    ((1, 8, 4, 5), (8, 2, 4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1], "group": 2}),
    ((1, 6, 4, 4), (6, 1, 3, 3), {"strides": [3, 3], "group": 6}),
    ((1, 4, 5, 5), (4, 3, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 4, 5, 5), (4, 3, 4, 4), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 4, 3, 4), (4, 3, 3, 3), {"strides": [2, 2], "output_shape": [6, 8]}),
    ((1, 3, 4, 6), (3, 2, 2, 4), {"strides": [2, 3], "pads": [0, 1, 0, 0]}),
    ((1, 1, 1, 1), (1, 1, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}),
    ((1, 3, 4, 4), (3, 2, 1, 1), {"strides": [2, 2]}),            # taps reach one phase of four: the reference
    ((1, 3, 4, 4), (3, 2, 3, 3), {"dilations": [2, 2]}),          # dilations: the reference
    ((1, 3, 5), (3, 2, 3), {"strides": [2]}),                     # 1-D: 2*4 + 3 = 11, no multiple of 2: the reference
    ((1, 4, 9), (4, 3, 16), {"strides": [8], "pads": [4, 4]}),    # 1-D, a vocoder's upsampler
    ((2, 6, 7), (6, 2, 4), {"strides": [2], "pads": [1, 1], "group": 3}),
    ((1, 2, 3, 3, 3), (2, 2, 2, 2, 2), {"strides": [2, 2, 2]}),   # 3-D: the reference
]


@pytest.mark.parametrize("xs,ws,attrs", CONV_T_CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_a_transposed_conv_runs_as_its_strides_phases_of_convs_and_matches_onnxruntime(xs, ws, attrs, bias):
  """Each phase of the stride (output rows s*i + p) is a stride-1 conv with the taps k = p + pad (mod s) reversed,
  stored side by side and read interleaved; the output sizes ONNX derives (pads, output_padding, auto_pad,
  output_shape) decide where the phases start. Every case agrees with onnxruntime and repeats bit-identically; a
  case the phases cannot express runs on the reference kernel, reported as a fallback."""
  x = f32(*xs)
  consts = {"w": f32(*ws)} | ({"b": f32(ws[1] * attrs.get("group", 1))} if bias else {})
  r = parity(tiny_model("ConvTranspose", {"x": x}, consts=consts, attrs=attrs), {"x": x})
  first = np.array(r(x=x)["y0"], copy=True)
  assert np.array_equal(first, r(x=x)["y0"])
  lowered = len(xs) in (3, 4) and "dilations" not in attrs and ws[2:] != (1, 1) and xs[2:] != (5,)
  assert r.program.fallbacks == ([] if lowered else ["ConvTranspose"])


@pytest.mark.parametrize("device,dtype", [("REF", np.float32), ("CPU", np.float16), ("REF", np.float16)])
def test_a_value_placed_into_a_concat_slot_reaches_a_reference_kernel_contiguous(device, dtype):
  """A Concat input stored into its (strided) slot of the concat's buffer is copied into a plain block before a
  reference kernel reads it (reference kernels read row-major data from an offset)."""
  rng = np.random.default_rng(0)
  a, k = rng.random((2, 3, 12, 8)).astype(dtype), rng.random((2, 3, 6, 8)).astype(dtype)
  nodes = [helper.make_node("Identity", ["k"], ["kr"]), helper.make_node("Concat", ["a", "kr"], ["p"], axis=2),
           helper.make_node("Identity", ["p"], ["y0"])]
  r = OnnxRunner(node_model(nodes, {"a": a, "k": k}, {}), device=device, cache=CompileCache(use_disk=False))
  for _ in range(2):
    np.testing.assert_array_equal(r(a=a, k=k)["y0"], np.concatenate([a, k], axis=2))


def test_a_zero_size_batch_compiles_and_runs_to_empty_outputs():
  """Found by the model-file fuzz: a batch of 0 through Conv, Flatten and Gemm raised a bare AssertionError in
  the index arithmetic (division by the zero extent) and, past that, an unplanned output buffer."""
  x = np.zeros((0, 1, 8, 8), np.float32)
  rng = np.random.default_rng(0)
  nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
           helper.make_node("Flatten", ["r"], ["f"]), helper.make_node("Gemm", ["f", "g"], ["y0"])]
  consts = {"w": rng.standard_normal((4, 1, 3, 3)).astype(np.float32),
            "g": rng.standard_normal((256, 5)).astype(np.float32)}
  r = OnnxRunner(node_model(nodes, {"x": x}, consts), cache=CompileCache(use_disk=False))
  y = r(x=x)["y0"]
  assert y.shape == (0, 5) and y.dtype == np.float32


def test_an_error_inside_a_fallback_kernel_surfaces_from_run(monkeypatch):
  """It cannot unwind through the C call list: it is kept and raised once the list returns."""
  x = f32(1, 2, 4, 4)
  r = OnnxRunner(tiny_model("ConvTranspose", {"x": x}, consts={"w": f32(2, 3, 3, 3)}, attrs={"dilations": [2, 2]}))
  assert r.program.fallbacks == ["ConvTranspose"]

  def broken(*a, **k):
    raise RuntimeError("kernel failed")
  with monkeypatch.context() as m:
    m.setattr(np, "matmul", broken)  # the reference ConvTranspose multiplies with np.matmul
    with pytest.raises(RuntimeError, match="kernel failed"):
      r.linked.run()
  r.linked.run()  # reported once; the program runs again


# ------------------------------------------------------------------------------------------------ chooser

@pytest.mark.parametrize("xs,ws,attrs,strategy", [
    ((1, 16, 20, 20), (16, 1, 3, 3), {"group": 16, "pads": [1, 1, 1, 1]}, "direct"),   # depthwise 3x3
    ((1, 32, 20, 20), (32, 1, 5, 5), {"group": 32, "pads": [2, 2, 2, 2]}, "direct_cm"),  # ... 5x5: channel lanes
    ((1, 18, 20, 20), (18, 1, 5, 5), {"group": 18, "pads": [2, 2, 2, 2]}, "direct"),     # ... no whole vectors
    ((1, 32, 9, "vl"), (32, 1, 3, 3), {"group": 32, "pads": [1, 1, 1, 1], "strides": [2, 2]}, "direct_cm"),  # short
    ((1, 32, 9, "2*vl"), (32, 1, 3, 3), {"group": 32, "pads": [1, 1, 1, 1], "strides": [2, 2]}, "direct"),  # strided
    ((1, 1, 40, 60), (8, 1, 4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, "direct"),  # tiny Cin
    ((1, 40, 12, 7), (48, 40, 1, 1), {}, "pointwise"),                                    # 1x1, short rows
    ((1, 200, 5, 5), (42, 200, 1, 1), {}, "direct"),                                      # 1x1, tiny output
    ((1, 96, 12, 20), (42, 96, 1, 1), {}, "pointwise"),                                   # 1x1, many channels
    ((1, 96, 12, "vl+3"), (48, 96, 1, 1), {}, ("direct_cm", "pointwise")),               # ... whole channel vectors
    ((1, 96, 20, 20), (48, 96, 1, 1), {"strides": [2, 2]}, "pointwise"),                 # ... strided (subsampled)
    ((1, 40, 10, 10), (48, 40, 1, 1), {}, "direct"),                                      # 1x1, few channels
    ((1, 12, 64, 64), (16, 12, 4, 4), {"strides": [4, 4]}, "direct_cm"),                 # patchify
    ((1, 24, 17, 40), (20, 6, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}, "im2col"),      # grouped
    ((1, 12, 17, "vl-3"), (18, 12, 3, 3), {"pads": [1, 1, 1, 1]}, "im2col"),             # short rows
    ((1, 12, 17, "vl+3"), (18, 12, 3, 3), {"pads": [1, 1, 1, 1]}, "direct"),             # one vector + overlap
    ((1, 12, 17, "vl+3"), (32, 12, 3, 3), {"pads": [1, 1, 1, 1]}, "direct_cm"),          # whole channel vectors
    ((1, 24, 17, "vl+3"), (32, 24, 3, 3), {"pads": [1, 1, 1, 1]}, "winograd"),           # ... 16+ in and out
    ((1, 24, 9, "2*vl+6"), (32, 24, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, "direct_cm"),  # strided
    ((1, 12, 9, "2*vl"), (32, 12, 3, 3), {"pads": [1, 1, 1, 1]}, "direct"),              # rows of two vectors
    ((1, 3, 64, 64), (18, 3, 5, 5), {"strides": [4, 4]}, "im2col"),                      # overlapping stride 4
    ((1, 12, 9, 40), (20, 12, 3, 3), {"pads": [1, 1, 1, 1]}, "direct"),                  # long rows
])
def test_the_conv_chooser_picks_the_documented_strategy(xs, ws, attrs, strategy):
  """Row lengths written in terms of vl are relative to this target's float vector (4 lanes with SSE, 8 with AVX2,
  16 with AVX-512), since the chooser's row rules count vectors. Output channels 32 and 48 fill whole vectors at
  every width, 18 and 42 at none. A pair names the strategy with AVX-512's width and with a narrower one."""
  vl = compiler.vector_bytes() // 4
  xs = tuple(eval(d, {"vl": vl}) if isinstance(d, str) else d for d in xs)   # expressions of vl in the table above
  x = f32(*xs)
  consts = {"w": (R.standard_normal(ws) * 0.3).astype(np.float32), "b": f32(ws[0])}
  r = parity(tiny_model("Conv", {"x": x}, consts=consts, attrs=attrs), {"x": x}, rtol=1e-4, atol=1e-4)
  if isinstance(strategy, tuple):   # (with AVX-512's width, with a narrower one)
    strategy = strategy[0] if vl >= runtime.codegen.conv.CM_WIDE_VL else strategy[1]
  assert [k.tags.get("strategy") for k in r.program.kernels if k.tags.get("strategy")] == [strategy]


def test_batch_one_fully_connected_layers_are_gemv_loops_and_batched_ones_blas():
  a1, a8 = f32(1, 96), f32(8, 96)
  consts = {"w": f32(64, 96), "c": f32(64)}
  for a, want in ((a1, "gemv"), (a8, "blas")):
    r = parity(tiny_model("Gemm", {"a": a}, consts=consts, attrs={"transB": 1}), {"a": a}, rtol=1e-4, atol=1e-4)
    assert [k.tags.get("strategy") for k in r.program.kernels] == [want]
  # a GEMV over constant weights is a dot product per output row (lanes along K), whatever their layout
  for transB, w in ((1, consts["w"]), (0, np.ascontiguousarray(consts["w"].T))):
    r = parity(tiny_model("Gemm", {"a": a1}, consts={"w": w, "c": consts["c"]}, attrs={"transB": transB}),
               {"a": a1}, rtol=1e-4, atol=1e-4)
    assert schedules(r)[0].startswith("inner"), schedules(r)


def test_a_reduction_whose_output_lanes_would_each_load_a_cache_line_of_its_own_vectorises_along_the_reduction():
  """GlobalAveragePool over 40x40 planes and a softmax's row max: with lanes along the output (channels, rows)
  every vector was a gather of 16 elements a plane or a row apart. Lanes along the reduction's contiguous axis
  read whole vectors. Matches onnxruntime and gives the same bits twice."""
  for op, x, attrs in (("GlobalAveragePool", f32(1, 48, 40, 40), None), ("Softmax", f32(40, 96), {"axis": -1})):
    r = parity(tiny_model(op, {"x": x}, attrs=attrs), {"x": x}, rtol=1e-5, atol=1e-6)
    assert schedules(r)[0].startswith("inner"), schedules(r)
    assert not any("(vf){b" in k.source for k in r.program.kernels), schedules(r)
    first = r(x=x)
    assert all(np.array_equal(first[k], v) for k, v in r(x=x).items())


def test_a_per_channel_gate_on_a_convs_input_is_multiplied_into_the_weight_vector_once_per_step_not_per_copy(monkeypatch):
  """A squeeze-and-excitation gate s[c] on a 1x1 conv's input, y[k, p] = sum_c x[c, p] * s[c] * w[k, c], with lanes
  along k and copies along p: x[c, p] * s[c] cost every copy a scalar multiply and a register broadcast besides
  its multiply-add. s[c] * w[k, c] is the same for every copy: one vector multiply per step, and each copy is
  one multiply-add with its x from memory. The source is checked as built for AVX-512 (rendered, not run: the
  heuristics give this conv that schedule there); on this CPU it matches onnxruntime, the same bits twice and
  at 2 threads."""
  x, s = f32(1, 192, 10, 10), f32(1, 192, 1, 1)
  consts = {"w": (R.standard_normal((64, 192, 1, 1)) * 0.1).astype(np.float32), "b": f32(64)}
  nodes = [helper.make_node("Mul", ["x", "s"], ["m"]), helper.make_node("Conv", ["m", "w", "b"], ["y0"])]
  model = node_model(nodes, {"x": x, "s": s}, consts)
  with monkeypatch.context() as m:
    m.setenv("PYMODELD_CPU_TARGET", "x86-64-v4")
    built = runtime.program.build_program(import_onnx(model))
  conv = next(k for k in built.kernels if "Conv" in k.tags.get("ops", []))
  assert conv.tags.get("strategy") == "direct_cm" and " up " in conv.tags["schedules"][0], conv.tags
  assert not re.search(r"\(b\d+\[[^\]]+\] \* b\d+\[[^\]]+\]\)", conv.source)   # no scalar x * s per copy
  r = parity(model, {"x": x, "s": s}, rtol=1e-4, atol=1e-4)
  first = r(x=x, s=s)["y0"]
  assert np.array_equal(first, r(x=x, s=s)["y0"])
  assert np.array_equal(first, OnnxRunner(model, threads=2)(x=x, s=s)["y0"])


def test_blas_conv_bands_with_a_short_last_band_match_onnxruntime(monkeypatch):
  import runtime.codegen.conv as conv
  monkeypatch.setattr(conv, "IM2COL_BAND_BYTES", 20 << 10)  # several bands, the last one short
  x = f32(2, 16, 23, max(4, compiler.vector_bytes() // 4 - 2))   # output rows shorter than a vector: im2col
  consts = {"w": (R.standard_normal((24, 16, 3, 3)) * 0.2).astype(np.float32), "b": f32(24)}
  r = parity(tiny_model("Conv", {"x": x}, consts=consts, attrs={"pads": [1, 2, 1, 0], "dilations": [1, 2]}),
             {"x": x}, rtol=1e-4, atol=1e-4)
  assert next(k.tags["band_rows"] for k in r.program.kernels if "band_rows" in k.tags) < 23


# ------------------------------------------------------------------------------------------- vector paths

@pytest.mark.parametrize("stride", [1, 2, 4])
@pytest.mark.parametrize("dtype", [np.float32, np.uint8])
def test_strided_vector_loads_match_onnxruntime(stride, dtype):
  """A conv stem on (cast) input: the im2col pack reads the input with the conv's stride along its vector."""
  x = (R.integers(0, 255, (1, 3, 64, 96)) if dtype == np.uint8 else R.standard_normal((1, 3, 64, 96))).astype(dtype)
  nodes = [helper.make_node("Cast", ["x"], ["f"], to=1), helper.make_node("Mul", ["f", "s"], ["m"]),
           helper.make_node("Conv", ["m", "w", "b"], ["y0"], strides=[stride, stride], kernel_shape=[4, 4])]
  consts = {"s": np.float32(1 / 128) * np.ones(1, np.float32), "w": (R.standard_normal((16, 3, 4, 4)) * 0.2).astype(np.float32),
            "b": f32(16)}
  r = parity(node_model(nodes, {"x": x}, consts), {"x": x}, rtol=1e-4, atol=1e-4)
  assert stride == 1 or any(s.startswith("tile") for s in schedules(r)), schedules(r)


@pytest.mark.parametrize("shape,k,pads,strides", [
    ((1, 4, 30, 45), [3, 3], [1, 1, 1, 1], [1, 1]),       # tiles along 45 with edge tiles and a tail
    ((1, 2, 17, 70), [3, 5], [1, 2, 1, 2], [1, 1]),
    ((1, 3, 33, 66), [3, 3], [1, 1, 1, 1], [2, 2]),       # strided windows
    ((1, 5, 19, 100), [7, 7], [3, 3, 3, 3], [1, 1]),
])
def test_padded_windows_vector_tiles_match_onnxruntime(shape, k, pads, strides):
  x = f32(*shape)
  for op in ("MaxPool", "AveragePool"):
    parity(tiny_model(op, {"x": x}, attrs={"kernel_shape": k, "pads": pads, "strides": strides}), {"x": x},
           rtol=1e-5, atol=1e-5)
  w = (R.standard_normal((shape[1], 1) + tuple(k)) * 0.3).astype(np.float32)
  parity(tiny_model("Conv", {"x": x}, consts={"w": w}, attrs={"group": shape[1], "pads": pads, "strides": strides}),
         {"x": x}, rtol=1e-4, atol=1e-4)
  # NaN propagates through the vector max, the edge lanes and the tail exactly as on the reference backend
  # (onnxruntime's MaxPool lets a NaN through only in some positions; a NaN here must reach the output)
  xn = x.copy()
  xn.reshape(-1)[::97] = np.nan
  m = tiny_model("MaxPool", {"x": xn}, attrs={"kernel_shape": k, "pads": pads, "strides": strides})
  got, ref = OnnxRunner(m)(x=xn)["y0"], OnnxRunner(m, device="REF")(x=xn)["y0"]
  assert np.isnan(got).any()
  np.testing.assert_array_equal(got, ref)


def test_a_padded_window_input_is_computed_in_place_with_its_border_filled():
  """conv -> conv (zero padding) -> maxpool (-inf padding): each producer stores into the interior of its
  consumer's padded buffer and fills the border in the same kernel; the graph input is read through gated
  loads, never copied."""
  x = f32(1, 3, 21, 37)
  nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
           helper.make_node("Conv", ["c1", "w2", "b2"], ["c2"], pads=[2, 1, 0, 1], kernel_shape=[3, 3]),
           helper.make_node("Neg", ["c2"], ["n"]),
           helper.make_node("MaxPool", ["n"], ["y0"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])]
  consts = {"w1": f32(8, 3, 3, 3), "w2": f32(16, 8, 3, 3), "b2": np.abs(f32(16)) + 1}  # outputs mostly < 0
  r = parity(node_model(nodes, {"x": x}, consts), {"x": x}, rtol=1e-4, atol=1e-4)
  ops = [k.tags.get("ops") for k in r.program.kernels]
  assert ops == [["Conv", "pad"], ["Conv", "Neg", "pad"], ["MaxPool"]], ops


def test_an_upcast_remainder_runs_in_halving_blocks():
  upcast_widths = runtime.codegen.optimise.upcast_widths
  assert upcast_widths(13, 8) == [8, 4, 1] and upcast_widths(24, 16) == [16, 8] and upcast_widths(16, 16) == [16]
  x = f32(1, 24, 15, 13)   # 13 output columns upcast by 8: blocks of 8, 4 and 1
  consts = {"w": f32(48, 24, 4, 4) * 0.2, "b": f32(48)}
  parity(tiny_model("Conv", {"x": x}, consts=consts, attrs={"strides": [1, 1]}), {"x": x}, rtol=1e-4, atol=1e-4)


def test_lanes_along_output_channels_sweep_the_image_per_block_of_channels():
  x = f32(1, 6, 32, 48)
  consts = {"w": f32(64, 6, 4, 4) * 0.2, "b": f32(64)}
  r = parity(tiny_model("Conv", {"x": x}, consts=consts, attrs={"strides": [4, 4]}), {"x": x}, rtol=1e-4, atol=1e-4)
  assert r.program.kernels[0].tags["strategy"] == "direct_cm" and schedules(r)[0].startswith("tile il"), schedules(r)


@pytest.mark.parametrize("width", [7, 14, 28])
def test_lanes_along_output_channels_upcast_enough_columns_to_hide_the_fma_latency(width, monkeypatch):
  """With lanes along 2 vectors of output channels, a 14-wide output row is upcast by 7 columns (14 accumulators
  with AVX-512's registers), not by 2 (4 accumulators, each FMA waiting on the previous one's latency); the count
  covers the row in the fewest issue slots within the target's accumulators."""
  opt = runtime.codegen.optimise
  monkeypatch.setattr(runtime.codegen.conv, "choose_conv", lambda **kw: "direct_cm")   # at any vector width
  vl = compiler.vector_bytes() // 4
  x = f32(1, 24, 2 * width, 2 * width)
  consts = {"w": f32(4 * vl, 24, 3, 3) * 0.2, "b": f32(4 * vl)}
  r = parity(tiny_model("Conv", {"x": x}, consts=consts, attrs={"strides": [2, 2], "pads": [1, 1, 1, 1]}), {"x": x},
             rtol=1e-4, atol=1e-4)
  assert r.program.kernels[0].tags["strategy"] == "direct_cm"
  m = re.fullmatch(r"tile il\d+x(\d+) up i\d+x(\d+)", schedules(r)[0])
  assert m, schedules(r)
  chunks, up, most = int(m[1]) // vl, int(m[2]), opt.max_accumulators(vl)
  assert opt.FMA_CHAINS <= chunks * up <= most
  assert opt.upcast_cost(width, up, chunks) == min(opt.upcast_cost(width, u, chunks) for u in range(1, most // chunks + 1))
  assert opt.upcast_cost(14, 7, 2) == 14 * 2 < opt.upcast_cost(14, 2, 2)


def test_a_channel_lane_convs_weights_for_each_block_of_channels_are_one_contiguous_run_in_reduction_order(monkeypatch):
  """Blocks of B output channels read (Cg, kh, kw, B) weights each: a stride of B floats per reduction step, not one
  of all M channels (a new page every step or two on a wide layer, which the prefetchers do not follow)."""
  monkeypatch.setattr(runtime.codegen.conv, "choose_conv", lambda **kw: "direct_cm")
  vl = compiler.vector_bytes() // 4
  M, B = 8 * vl, 2 * vl
  x = f32(1, 24, 9, 9)
  w = f32(M, 24, 3, 3) * 0.2
  r = parity(tiny_model("Conv", {"x": x}, consts={"w": w, "b": f32(M)}, attrs={"pads": [1, 1, 1, 1]}), {"x": x},
             rtol=1e-4, atol=1e-4)
  [k] = r.program.kernels
  want = np.moveaxis(w.reshape(M // B, B, 24, 3, 3), 1, -1).reshape(-1)
  assert any(np.array_equal(np.asarray(c).reshape(-1), want) for c in r.program.consts.values()), "no blocked weights"
  assert schedules(r)[0].startswith("tile il") and f"x{B} " in schedules(r)[0], schedules(r)



@pytest.mark.parametrize("C,hw,k,attrs", [
    (32, (13, 11), 5, {"pads": [2, 2, 2, 2]}),                                   # 5x5, odd plane
    (48, (20, 20), 7, {"pads": [3, 1, 2, 3], "strides": [2, 2]}),                # 7x7, asymmetric pads, strided
    (64, (9, "vl"), 3, {"pads": [1, 1, 1, 1], "strides": [2, 2]}),               # strided 3x3, short rows
    (32, (1, 17), 5, {"pads": [2, 2, 2, 2], "dilations": [1, 2]}),               # a 1-high plane, dilated
    (32, (6, 6), 5, {"pads": [0, 0, 0, 0]}),                                     # no padding, 2x2 outputs
])
def test_a_depthwise_conv_with_lanes_along_channels_matches_onnxruntime_bit_identically_at_any_thread_count(
        C, hw, k, attrs):
  """5x5 and 7x7 depthwise convs (and strided 3x3 ones over short rows) run with lanes along the channels: one
  kernel copies the input (its Relu fused in) into channel blocks through register transposes, and the conv reads
  a tap of vl channels as one contiguous load, skipping taps in the padding for the whole vector."""
  vl = compiler.vector_bytes() // 4
  x = f32(1, C, *(eval(d, {"vl": vl}) if isinstance(d, str) else d for d in hw))
  w = (R.standard_normal((C, 1, k, k)) * 0.3).astype(np.float32)
  nodes = [helper.make_node("Relu", ["x"], ["r"]),
           helper.make_node("Conv", ["r", "w", "b"], ["y0"], group=C, kernel_shape=[k, k], **attrs)]
  model = node_model(nodes, {"x": x}, {"w": w, "b": f32(C)})
  r = parity(model, {"x": x}, rtol=1e-5, atol=1e-5)
  conv = [kk for kk in r.program.kernels if kk.tags.get("strategy")]
  copy = [kk for kk in r.program.kernels if "channel blocks" in kk.tags.get("ops", [])]
  assert [kk.tags["strategy"] for kk in conv] == ["direct_cm"] and len(copy) == 1, [kk.tags for kk in r.program.kernels]
  assert copy[0].tags["ops"] == ["Relu", "channel blocks"] and " up " in copy[0].tags["schedules"][0], copy[0].tags
  one = np.array(r(x=x)["y0"])
  assert np.array_equal(np.array(r(x=x)["y0"]), one)
  for threads in (2, 3):
    r.threads = threads
    assert np.array_equal(np.array(r(x=x)["y0"]), one), f"{threads} threads differ from one"


def test_a_depthwise_conv_whose_channels_fill_no_whole_vector_keeps_lanes_along_its_rows():
  x = f32(1, 18, 12, 12)
  w = (R.standard_normal((18, 1, 5, 5)) * 0.3).astype(np.float32)
  r = parity(tiny_model("Conv", {"x": x}, consts={"w": w}, attrs={"group": 18, "pads": [2, 2, 2, 2]}), {"x": x},
             rtol=1e-5, atol=1e-5)
  assert [k.tags.get("strategy") for k in r.program.kernels] == ["direct"]


@pytest.mark.parametrize("hw", [(10, 10), (5, 5), (7, 9)])
def test_a_channel_lane_conv_stores_each_channels_columns_as_one_run_after_a_register_transpose(hw, monkeypatch):
  """Lanes along output channels hold values a whole plane apart. The upcast copies (consecutive output columns) are
  transposed in registers, so each channel's columns are stored as one contiguous run, not lane by lane (including
  a copy count that is not a power of two, padded to one for the transpose). A target whose vector is narrower
  than that power of two (4 lanes and 5 copies) keeps the lane-by-lane stores."""
  monkeypatch.setattr(runtime.codegen.conv, "choose_conv", lambda **kw: "direct_cm")
  vl = compiler.vector_bytes() // 4
  x = f32(1, 24, *hw)
  consts = {"w": f32(2 * vl, 24, 3, 3) * 0.2, "b": f32(2 * vl)}
  r = parity(tiny_model("Conv", {"x": x}, consts=consts, attrs={"pads": [1, 1, 1, 1]}), {"x": x}, rtol=1e-4, atol=1e-4)
  [k] = r.program.kernels
  assert k.tags["strategy"] == "direct_cm" and " up " in schedules(r)[0], schedules(r)
  up = int(schedules(r)[0].rsplit("x", 1)[1])
  if 1 << (up - 1).bit_length() <= vl:
    assert "__builtin_shufflevector(" in k.source and "_o[_j]" not in k.source


def test_direct_conv_tiles_upcast_the_output_channels():
  x = f32(1, 1, 60, 90)
  consts = {"w": f32(8, 1, 4, 4), "b": f32(8)}
  r = parity(tiny_model("Conv", {"x": x}, consts=consts, attrs={"strides": [2, 2], "pads": [1, 1, 1, 1]}),
             {"x": x}, rtol=1e-4, atol=1e-4)
  assert any("up" in s for s in schedules(r)), schedules(r)


@pytest.mark.parametrize("shape", [(1, 37, 9, 13), (2, 5, 50, 3), (1, 300, 7, 7)])
def test_inner_reductions_with_vector_tails_match_onnxruntime(shape):
  x = f32(*shape)
  parity(tiny_model("GlobalAveragePool", {"x": x}), {"x": x}, rtol=1e-5, atol=1e-6)
  parity(tiny_model("ReduceMax", {"x": x}, consts={"a": np.array([-1], np.int64)}, opset=18), {"x": x})
  parity(tiny_model("Softmax", {"x": x}), {"x": x}, rtol=1e-5, atol=1e-6)


def test_merged_axes_elementwise_over_a_transposed_view():
  x = f32(3, 40, 17)
  nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[2, 0, 1]), helper.make_node("Sigmoid", ["t"], ["y0"])]
  parity(node_model(nodes, {"x": x}, {}), {"x": x}, rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------------------------------------ threads

def _split_model():
  x = f32(1, 8, 96, 128)
  nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y0"])]
  return node_model(nodes, {"x": x}, {"w": f32(32, 8, 3, 3), "b": f32(32)}), x


def test_a_kernel_split_across_threads_computes_the_same_bits():
  m, x = _split_model()
  r = OnnxRunner(m, threads=1)
  assert any(k.tags.get("par") for k in r.program.kernels)
  one = r(x=x)["y0"]
  for n in (2, 3, 7):
    r.linked.run(n)
    np.testing.assert_array_equal(r.linked.outputs["y0"], one)
  np.testing.assert_array_equal(OnnxRunner(m, threads=2)(x=x)["y0"], one)


def test_a_forked_child_runs_split_kernels_with_its_own_workers():
  m, x = _split_model()
  r = OnnxRunner(m, threads=2)
  want = r(x=x)["y0"]   # the parent's worker threads exist now; a child does not inherit them
  code = os.fork()
  if code == 0:  # child: must not wait for workers it does not have
    try:
      r.linked.run(2)
      os._exit(0 if np.array_equal(r.linked.outputs["y0"], want) else 1)
    finally:
      os._exit(2)
  deadline = time.monotonic() + 60
  while time.monotonic() < deadline:
    pid, status = os.waitpid(code, os.WNOHANG)
    if pid:
      assert os.waitstatus_to_exitcode(status) == 0
      return
    time.sleep(0.05)
  os.kill(code, 9)
  os.waitpid(code, 0)
  pytest.fail("the forked child hung in a split kernel")


# ------------------------------------------------------------------------------------------------ semantics

@pytest.mark.parametrize("op,attrs,opset", [("HardSwish", {}, 14), ("Mish", {}, 18), ("Swish", {"alpha": 0.7}, 24),
                                             ("ThresholdedRelu", {"alpha": 0.3}, 13)])
def test_the_activations_of_mobilenet_v3_and_yolo_are_generated_code_in_the_convs_epilogue(op, attrs, opset):
  """HardSwish, Mish, Swish and ThresholdedRelu were reference fallbacks: a host kernel after every conv, run by
  numpy. They are expressions like Relu's, fused into the producing conv, and agree with the reference on ordinary
  and special values (NaN, infinities, signed zeros, the bends at -3 and 3)."""
  x = R.uniform(-6, 6, (1, 4, 9, 9)).astype(np.float32)
  x[0, 0, 0, :8] = [np.nan, np.inf, -np.inf, -0.0, 0.0, -3.0, 3.0, 90.0]
  w = np.zeros((4, 4, 1, 1), np.float32)
  w[:, :, 0, 0] = np.eye(4)   # an identity conv: the activation sees x itself
  nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node(op, ["c"], ["y0"], **attrs)]
  model = node_model(nodes, {"x": x}, {"w": w}, opset=opset)
  runner = OnnxRunner(model, cache=CompileCache(use_disk=False))
  assert [k.tags.get("ops") for k in runner.program.kernels] == [["Conv", op]]
  with np.errstate(invalid="ignore", over="ignore"):   # the reference computes inf / inf on the way to its NaN
    ours, ref = runner(x=x)["y0"], OnnxRunner(model, device="REF")(x=x)["y0"]
  np.testing.assert_array_equal(np.isnan(ours), np.isnan(ref))
  np.testing.assert_allclose(ours, ref, rtol=2e-6, atol=1e-7)
  assert np.array_equal(np.signbit(ours[0, 0, 0, 3:5]), np.signbit(ref[0, 0, 0, 3:5]))   # -0 and +0 kept apart


def test_nan_and_inf_propagate_like_the_reference():
  x = np.array([[np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0, -1.0, 88.0, -88.0, 1e-38] * 4], np.float32)
  for op in ("Relu", "Sigmoid", "Tanh", "Elu", "LeakyRelu", "Abs", "Neg", "Softplus"):
    m = tiny_model(op, {"x": x})
    ours, ref = OnnxRunner(m)(x=x)["y0"], OnnxRunner(m, device="REF")(x=x)["y0"]
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(ref), err_msg=op)
    np.testing.assert_allclose(ours[~np.isnan(ours)], ref[~np.isnan(ref)], rtol=1e-6, err_msg=op)
  lo, hi = np.array(-0.5, np.float32), np.array(0.5, np.float32)
  clip = OnnxRunner(tiny_model("Clip", {"x": x}, consts={"lo": lo, "hi": hi}))(x=x)["y0"]
  assert np.isnan(clip[0, 0]) and clip[0, 1] == 0.5 and clip[0, 2] == -0.5  # NaN is not clipped away


def _host_runs(level):
  """Whether this CPU executes code built for an x86-64 ISA level (x86-64-v3: AVX2, FMA, BMI2 among others)."""
  need = {"x86-64": set(), "x86-64-v3": {"avx2", "fma", "bmi2", "f16c", "movbe"}}[level]
  try:
    with open("/proc/cpuinfo") as f:
      flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
  except OSError:
    return False
  return sys.platform == "linux" and os.uname().machine == "x86_64" and need <= set(flags)


@pytest.mark.parametrize("level", [None, "x86-64-v3", "x86-64"])
def test_max_and_min_of_every_pair_of_special_values_follow_the_scalar_rule_bit_for_bit(level, monkeypatch):
  """max(a, b) is (a > b || a != a) ? a : b and min likewise, in elementwise loops and in vector reductions, at this
  CPU's vector width, AVX2's and SSE's: a NaN in either operand wins (the first one's own bits when both are NaN) and
  of two equal zeros the second is kept. The ISA's max/min instructions differ where the first operand is NaN."""
  if level is not None:
    if not _host_runs(level):
      pytest.skip(f"this CPU does not run {level} code")
    monkeypatch.setenv("PYMODELD_CPU_TARGET", level)
  special = np.array([np.nan, -np.inf, np.inf, -0.0, 0.0, 1.0, -1.0, 3e38], np.float32)
  special = np.concatenate([special, np.array([0x7fc12345, 0xffc00001], np.uint32).view(np.float32)])   # NaN payloads
  a, b = (np.tile(g.ravel(), 3) for g in np.meshgrid(special, special, indexing="ij"))   # 300 pairs: vectors and a tail
  for op, rule in (("Max", np.greater), ("Min", np.less)):
    want = np.where(rule(a, b) | (a != a), a, b).view(np.uint32)
    out = OnnxRunner(tiny_model(op, {"a": a, "b": b}), cache=CompileCache(use_disk=False))(a=a, b=b)["y0"]
    np.testing.assert_array_equal(out.view(np.uint32), want, err_msg=op)
    # a reduction over a stacked axis of two: acc = op(op(identity, a), b), one vector lane per pair
    ab = np.stack([a, b])
    model = tiny_model(f"Reduce{op}", {"ab": ab}, attrs={"axes": [0], "keepdims": 0}, opset=13)
    runner = OnnxRunner(model, cache=CompileCache(use_disk=False))
    assert any(f"v{op.lower()}(" in k.source for k in runner.program.kernels)   # the vector form is what is checked
    np.testing.assert_array_equal(runner(ab=ab)["y0"].view(np.uint32), want, err_msg=f"Reduce{op}")


def test_integer_division_and_modulo_by_zero_give_zero_not_a_signal():
  a = np.array([7, -7, 5, np.iinfo(np.int64).min], np.int64)
  b = np.array([0, 0, 0, -1], np.int64)
  for op, attrs in (("Div", {}), ("Mod", {}), ("Mod", {"fmod": 1})):
    out = OnnxRunner(tiny_model(op, {"a": a, "b": b}, attrs=attrs))(a=a, b=b)["y0"]
    assert out[:3].tolist() == [0, 0, 0]


def test_a_gather_with_run_time_indices_is_clamped_into_the_axis():
  """Indices computed in the graph are clamped by the generated code (never read out of bounds); indices that
  are a graph input are range-checked on the host first (an InputError, tests/runtime/test_onnx_cases.py)."""
  x = f32(5, 3)
  i = np.array([0, 4, -1, 99, -99], np.int64)
  nodes = [helper.make_node("Add", ["i", "zero"], ["j"]), helper.make_node("Gather", ["x", "j"], ["y0"], axis=0)]
  model = node_model(nodes, {"x": x, "i": i}, {"zero": np.zeros(1, np.int64)})
  out = OnnxRunner(model, cache=CompileCache(use_disk=False))(x=x, i=i)["y0"]
  np.testing.assert_array_equal(out[:3], x[[0, 4, 4]])
  np.testing.assert_array_equal(out[3], x[4])   # out of range: clamped, never read out of bounds
  np.testing.assert_array_equal(out[4], x[0])


# ------------------------------------------------------------------------------------------------- the IR

def test_index_arithmetic_collapses_reshape_div_mod_chains():
  c, h, w = ir.var("c", 64), ir.var("h", 7), ir.var("w", 9)
  flat = c * 63 + h * 9 + w
  assert (flat // 63) * 63 + ((flat // 9) % 7) * 9 + flat % 9 is flat
  r, k = ir.var("r", 172800), ir.var("k", 8)
  assert (r * 8 + k) // 1382400 is ir.const(0) and (r * 8 + k) % 1382400 is r * 8 + k


def _exhaustive(e, vs, fn):
  """Every point of vs' ranges: e evaluated by substitution equals fn(*point)."""
  for point in np.ndindex(*[v.arg[1] for v in vs]):
    got = ir.substitute(e, {v: ir.const(int(p)) for v, p in zip(vs, point)})
    assert got.is_const and got.arg == fn(*point), (point, got)


def test_a_flattened_index_divided_by_a_leading_block_loses_its_trailing_dims():
  # a channel shuffle: (c*HW + h*W + w) // (4*HW) is c // 4 and the modulo keeps the trailing dims
  c, h, w = ir.var("c", 12), ir.var("h", 3), ir.var("w", 5)
  flat = c * 15 + h * 5 + w
  assert ir.idiv(flat, 60) is ir.idiv(c, 4)
  assert ir.imod(flat, 60) is ir.add(ir.mul(ir.imod(c, 4), 15), h * 5, w)
  _exhaustive(ir.idiv(flat + 7, 60), [c, h, w], lambda c, h, w: (c * 15 + h * 5 + w + 7) // 60)
  _exhaustive(ir.imod(flat - 7, 45), [c, h, w], lambda c, h, w: (c * 15 + h * 5 + w - 7) % 45)


def test_a_gated_load_index_simplifies_within_the_gate():
  # a padded view of a reshaped tensor: (x + 27) % 28 is x - 1 wherever 1 <= x < 29 lets the load happen
  x, y = ir.var("x", 30), ir.var("y", 30)
  idx = ir.add(ir.mul(ir.imod(y + 27, 28), 28), ir.imod(x + 27, 28))
  gate = ir.all_of(ir.alu("ge", x, ir.const(1)), ir.alu("lt", x, ir.const(29)),
                   ir.alu("ge", y, ir.const(1)), ir.alu("lt", y, ir.const(29)))
  buf = ir.Buf("b", np.dtype(np.float32), 28 * 28)
  ld = ir.load(buf, idx, gate)
  assert not any(n.op in ("DIV", "MOD") for n in ir.walk(ld.srcs[0]))
  for px, py in np.ndindex(30, 30):
    if 1 <= px < 29 and 1 <= py < 29:
      sub = {x: ir.const(px), y: ir.const(py)}
      assert ir.substitute(ld.srcs[0], sub).arg == ir.substitute(idx, sub).arg


def test_substitutions_are_remembered_up_to_a_bound_and_a_remembered_one_is_the_same_node():
  x, y = ir.var("x", 200), ir.var("y", 60)
  e = ir.imod(x * 60 + y + 5, 7) + ir.idiv(x * 60 + y, 13) * 3
  first = ir.substitute(e, {x: ir.add(y, 1)})
  assert ir.substitute(e, {x: ir.add(y, 1)}) is first
  for px, py in np.ndindex(200, 60):   # more distinct substitutions than the bound
    got = ir.substitute(e, {x: ir.const(px), y: ir.const(py)})
    if (px * 60 + py) % 97 == 0:
      assert got.arg == (px * 60 + py + 5) % 7 + (px * 60 + py) // 13 * 3
  assert len(ir._SUBSTITUTED) <= ir._SUBSTITUTED_MAX
  assert ir.substitute(e, {x: ir.add(y, 1)}) is first   # computed again after the cache was cleared: interned


@pytest.mark.parametrize("op,axis,opset,shape", [
    ("Softmax", -1, 17, (4, 24, 40)), ("LogSoftmax", -1, 17, (4, 24, 40)), ("Softmax", 1, 17, (4, 24, 40)),
    ("Softmax", 1, 11, (4, 24, 40)),   # opset 11: the axes from 1 on, flattened
    ("Softmax", -1, 17, (3, 5, 700)), ("LogSoftmax", 1, 11, (3, 5, 70))])   # long rows: lanes along each row
def test_a_softmax_runs_its_max_and_its_sum_as_vector_kernels_of_their_own(op, axis, opset, shape):
  """One kernel holding both reductions had no vector schedule (every exp scalar); the max and the sum of
  exp(x - max) are each realized per row by a kernel of one reduction, then the result is elementwise."""
  x = f32(*shape, lo=-30.0, hi=30.0)
  x[0, 0] = 1e30   # rows of huge values: only the subtracted max keeps exp finite
  r = parity(tiny_model(op, {"x": x}, attrs={"axis": axis}, opset=opset), {"x": x})
  ops = [k.tags.get("ops") for k in r.program.kernels]
  assert ops == [[f"{op} (max)"], [f"{op} (sum)"], [op]], ops
  reductions = [s for k in r.program.kernels[:2] for s in k.tags["schedules"]]
  assert "scalar" not in reductions, reductions   # (a plain elementwise loop is left to the C compiler)


@pytest.mark.parametrize("op,shape,attrs", [("LayerNormalization", (64, 300), {"axis": -1}),
                                            ("LayerNormalization", (8, 24, 40), {"axis": 1}),
                                            ("LayerNormalization", (50, 40), {"axis": -1}),
                                            ("InstanceNormalization", (2, 24, 9, 11), {}),
                                            ("InstanceNormalization", (1, 20, 33, 35), {})])
def test_a_normalization_runs_its_mean_and_its_variance_as_vector_kernels_of_their_own(op, shape, attrs):
  """As for softmax: the variance nests the mean, and one kernel holding both had no vector schedule."""
  x = f32(*shape, lo=-5.0, hi=5.0) + 20.0   # a mean far from 0: the variance is taken about it (two-pass)
  c = shape[1] if op == "InstanceNormalization" else math.prod(shape[attrs["axis"]:])
  scale, bias = f32(c), f32(c)
  if op == "LayerNormalization":
    scale, bias = scale.reshape(shape[attrs["axis"]:]), bias.reshape(shape[attrs["axis"]:])
  # (float32 differences about a mean of 20 carry ~1e-5 of rounding, whatever the order of the sums)
  r = parity(tiny_model(op, {"x": x}, attrs=attrs, consts={"s": scale, "b": bias}), {"x": x}, atol=1e-4)
  ops = [k.tags.get("ops") for k in r.program.kernels]
  assert ops[:2] == [[f"{op} (mean)"], [f"{op} (variance)"]], ops
  reductions = [s for k in r.program.kernels[:2] for s in k.tags["schedules"]]
  assert "scalar" not in reductions, reductions


def test_a_short_axis_is_tiled_with_narrower_vectors():
  """Output rows of vl - 3 (13 with 16 lanes, 5 with 8) are tiled with the widest power of two that fits (8, 4)."""
  vl = compiler.vector_bytes() // 4
  if vl < 8:
    pytest.skip("with 4 float lanes there is no narrower vector")
  out_w = vl - 3
  x = f32(1, 8, 27, 2 * (out_w - 1) + 3)
  r = parity(tiny_model("MaxPool", {"x": x}, attrs={"kernel_shape": [3, 3], "strides": [2, 2]}), {"x": x})
  lanes = 1 << (out_w.bit_length() - 1)
  assert any(s.startswith("tile") and s.endswith(f"x{lanes}") for s in schedules(r)), schedules(r)


def test_a_program_holds_each_conv_and_gemm_weight_once():
  x, a = f32(1, 8, 12, 12), f32(1, 72)
  m = tiny_model("Conv", {"x": x}, consts={"w": f32(16, 8, 3, 3), "b": f32(16)})
  assert sum(v.nbytes for v in OnnxRunner(m).program.consts.values()) == (16 * 72 + 16) * 4
  g = tiny_model("Gemm", {"a": a}, consts={"w": f32(40, 72), "c": f32(40)}, attrs={"transB": 1})
  r = parity(g, {"a": a})
  assert sum(v.nbytes for v in r.program.consts.values()) == (40 * 72 + 40) * 4
  assert "(vf){b" not in r.program.kernels[0].source  # the transposed weights are laid out for vector loads


def test_the_gcc_vectoriser_runs_its_dynamic_cost_model():
  # gcc -O2 alone leaves loops whose trip count is no multiple of the vector length scalar
  assert runtime.compiler._vectorizer_flags("/usr/bin/gcc|gcc (Debian 12.2.0) 12.2.0|x86_64-linux-gnu") == \
      ("-fvect-cost-model=dynamic",)
  assert runtime.compiler._vectorizer_flags("/usr/bin/clang|Debian clang version 16|x86_64-pc-linux-gnu") == ()


def test_openblas_runs_on_one_thread_from_its_first_use_whatever_the_runtime_threads():
  """The runtime's pool splits sgemm calls itself (render_gemm); OpenBLAS workers spinning beside it took its cores."""
  code = "from runtime import blas; print(blas.get_threads())"
  env = dict(os.environ, PYMODELD_RUNTIME_THREADS="3", OPENBLAS_NUM_THREADS="2")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
  assert out.stdout.strip() in ("1", "None"), out.stderr  # None: no OpenBLAS found beside numpy


def test_views_restride_where_memory_allows_and_refuse_otherwise():
  v = View.contiguous((2, 3, 4))
  assert v.reshape((6, 4)).strides == (4, 1)
  assert v.permute((0, 2, 1)).reshape((2, 12)) is None
  p = View.contiguous((1, 4, 5, 5)).pad((0, 0, 1, 1), (0, 0, 1, 1))
  s = p.shrink((0, 0, 0, 0), (1, 1, 2, 2), (1, 4, 4, 4))
  assert s.mask == ((0, 1), (0, 4), (1, 3), (1, 3)) and s.strides == (0, 25, 10, 2)


# ------------------------------------------------------------------------------------------------- search

def test_the_measured_search_picks_measured_choices_and_caches_them(tmp_path, monkeypatch):
  import runtime.search as search
  monkeypatch.setenv("PYMODELD_CACHE_DIR", str(tmp_path / "c"))
  monkeypatch.setenv("PYMODELD_SEARCH", "1")
  x = f32(1, 16, 24, 24)
  consts = {"w": (R.standard_normal((24, 16, 3, 3)) * 0.2).astype(np.float32), "b": f32(24)}
  model = tiny_model("Conv", {"x": x}, consts=consts, attrs={"pads": [1, 1, 1, 1]})
  parity(model, {"x": x}, rtol=1e-4, atol=1e-4)
  db = search._load_db()
  assert any("strategy" in v and v["strategy"] in ("direct", "direct_cm", "im2col", "im2col+micro", "winograd", "winograd+micro")
             and len(v["times"]) >= 2
             for v in db.values())
  timed = []
  monkeypatch.setattr(search, "_best", lambda times: timed.append(times) or min(times, key=times.get))
  OnnxRunner(model, cache=CompileCache(disk_dir=str(tmp_path / "k")))
  assert timed == []  # every choice came from the cache


def test_an_and_of_any_number_of_constant_conjuncts_folds():
  """The vector path substitutes true for the gate conjuncts a tile has checked: a conjunction of several can be
  left with constants only."""
  t, f, v = ir.const(True, ir.BOOL), ir.const(False, ir.BOOL), ir.alu("ge", ir.var("q", 9), 3)
  for n in (2, 3, 4, 5):
    assert ir.alu("and", *[t] * n).is_const and ir.alu("and", *[t] * n).arg
    assert ir.alu("and", *[t] * (n - 1), f).is_const and not ir.alu("and", *[t] * (n - 1), f).arg
    assert ir.alu("and", *[t] * (n - 1), v) is v


def test_a_bad_search_cache_is_ignored(tmp_path, monkeypatch):
  import runtime.search as search
  monkeypatch.setenv("PYMODELD_CACHE_DIR", str(tmp_path / "c"))
  monkeypatch.setenv("PYMODELD_SEARCH", "1")
  x = f32(1, 4, 8, 8)
  model = tiny_model("Conv", {"x": x}, consts={"w": f32(40, 4, 3, 3)}, attrs={"pads": [1, 1, 1, 1]})
  OnnxRunner(model, cache=CompileCache(use_disk=False))
  path = search._db_path()
  db = json.loads(open(path).read())
  for v in db.values():
    if "strategy" in v:
      v["strategy"] = "rm -rf /"           # not one of the strategies: searched again
    else:
      v["choice"] = "tile nonsense"
  open(path, "w").write(json.dumps(db))
  parity(model, {"x": x}, rtol=1e-4, atol=1e-4)
  open(path, "wb").write(b"\x00garbage")
  parity(model, {"x": x}, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows", [4, 13, 40])
def test_a_bool_computed_from_a_vector_reduction_is_stored_as_zero_or_one_bytes(rows):
  """A comparison on the accumulator of a vector-tiled reduction is a mask of 0 / -1 lanes: it is stored to the
  bool output as 0 / 1 (it was stored through a float vector, which the C compiler refused)."""
  x = f32(rows, 6)
  x[::3] = -np.inf   # every third row's max is -inf: both outcomes occur
  nodes = [helper.make_node("ReduceMax", ["x", "a"], ["m"], keepdims=0),
           helper.make_node("Equal", ["m", "ninf"], ["y0"])]
  model = node_model(nodes, {"x": x}, {"a": np.array([1], np.int64), "ninf": np.array(-np.inf, np.float32)}, opset=18)
  r = OnnxRunner(model, cache=CompileCache(use_disk=False))
  got = r(x=x)["y0"]
  assert any(s.startswith("tile") for s in schedules(r)), schedules(r)
  np.testing.assert_array_equal(got, x.max(axis=1) == -np.inf)
  assert got.view(np.uint8).max() == 1


@pytest.mark.parametrize("to", [np.float64, np.float16])
def test_a_blas_matmul_whose_epilogue_casts_writes_the_cast_values(to):
  """sgemm writes float32; with a Cast in the fused epilogue the output buffer has another element type, so the
  product goes through a float32 scratch (written straight into the float64 output, the epilogue read each pair of
  float32 results, and bytes sgemm never wrote, as one float64: the answer changed with the arena's contents)."""
  a, b = f32(2, 8, 16), f32(2, 16, 6)
  nodes = [helper.make_node("MatMul", ["a", "b"], ["p"]),
           helper.make_node("Cast", ["p"], ["c"], to=int(helper.np_dtype_to_tensor_dtype(np.dtype(to)))),
           helper.make_node("Tanh", ["c"], ["y0"])]
  r = OnnxRunner(node_model(nodes, {"a": a, "b": b}, {}), cache=CompileCache(use_disk=False))
  assert any(k.tags.get("strategy") == "blas" for k in r.program.kernels)
  got = r(a=a, b=b)["y0"]
  assert got.dtype == to
  np.testing.assert_allclose(got, np.tanh((a @ b).astype(to)), rtol=2e-3 if to == np.float16 else 1e-5, atol=1e-6)


def test_erf_is_computed_by_our_vectorised_polynomial_to_a_few_ulp_including_its_special_values():
  """Erf (and exact GELU) runs on our branch-free polynomial (pm_erff, verf per vector lane), not a libm call per
  element, so loops over it vectorise and every target computes the same values."""
  x = np.concatenate([np.linspace(-6, 6, 20011), [0.0, -0.0, 1e-30, -1e-20, 3.9999, 4.0, 4.5, np.inf, -np.inf, np.nan]])
  x = x.astype(np.float32)
  r = OnnxRunner(tiny_model("Erf", {"x": x}))
  [k] = [k for k in r.program.kernels if k.kind == "c"]
  assert re.search(r"\b(verf|pm_erff)\(", k.source) and not re.search(r"\berff\(", k.source)
  got = r(x=x)["y0"]
  ref = np.array([math.erf(v) for v in x.astype(np.float64)])
  fin = np.isfinite(ref)
  assert np.all(np.abs(got[fin] - ref[fin]) <= 8 * np.spacing(np.abs(ref[fin]).astype(np.float32)) + 1e-45)
  assert np.isnan(got[-1]) and got[-3] == 1.0 and got[-2] == -1.0 and np.signbit(got[20012])


def _diamond_model(producer: str, activation: str, extra_reader: str | None = None):
  """producer (a 3x3 conv or a MatMul by constant weights) whose output x feeds an activation written the way
  exporters write it: SiLU x * sigmoid(x), or exact GELU x * 0.5 * (1 + erf(x / sqrt 2)); extra_reader another
  reader of x outside the diamond."""
  h: list = []
  if producer == "conv":
    feeds, consts = {"x": f32(1, 8, 12, 12)}, {"w": f32(16, 8, 3, 3), "b": f32(16)}
    h.append(helper.make_node("Conv", ["x", "w", "b"], ["v"], pads=[1, 1, 1, 1]))
  else:
    feeds, consts = {"x": f32(24, 40)}, {"w": f32(40, 56)}
    h.append(helper.make_node("MatMul", ["x", "w"], ["v"]))
  if activation == "silu":
    h += [helper.make_node("Sigmoid", ["v"], ["s"]), helper.make_node("Mul", ["v", "s"], ["y0"])]
  else:
    consts.update({"r2": np.array(np.sqrt(2), np.float32), "one": np.array(1, np.float32), "half": np.array(0.5, np.float32)})
    h += [helper.make_node("Div", ["v", "r2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
          helper.make_node("Add", ["e", "one"], ["p"]), helper.make_node("Mul", ["v", "p"], ["m"]),
          helper.make_node("Mul", ["m", "half"], ["y0"])]
  outs = ("y0",)
  if extra_reader:
    h.append(helper.make_node(extra_reader, ["v"], ["y1"]))
    outs = ("y0", "y1")
  return node_model(h, feeds, consts, outputs=outs), feeds


@pytest.mark.parametrize("producer,activation", [("conv", "silu"), ("conv", "gelu"), ("matmul", "silu"), ("matmul", "gelu")])
def test_an_activation_that_reads_its_input_twice_is_the_epilogue_of_the_kernel_producing_that_input(producer, activation):
  """x * sigmoid(x) reads x through two nodes; x used to be stored by its conv or GEMM and read back by a kernel of its
  own. The readers meet again in one elementwise node, so the diamond is the producer's epilogue, computing x once."""
  model, feeds = _diamond_model(producer, activation)
  r = parity(model, feeds)
  [k] = [k for k in r.program.kernels if k.kind == "c"]
  assert k.tags["ops"][0] in ("Conv", "MatMul") and "Mul" in k.tags["ops"], k.tags["ops"]
  first = np.array(r(**feeds)["y0"], copy=True)
  assert np.array_equal(first, r(**feeds)["y0"])


def test_a_value_read_outside_the_diamond_too_is_stored_once_and_read_by_both():
  model, feeds = _diamond_model("conv", "silu", extra_reader="Relu")
  r = parity(model, feeds)
  assert len([k for k in r.program.kernels if k.kind == "c"]) == 3


DIAMOND_UNARY = ("Sigmoid", "Tanh", "Relu", "Neg", "Abs", "Erf", "Softplus", "LeakyRelu", "Clip", "Mul", "Add", "Div")


def _random_diamond(rng):
  """A producer (3x3 conv, MatMul by constant weights, ReduceSum keeping its axis, or Softmax) whose output v starts
  1-3 chains of 0-3 elementwise ops that are combined pairwise into one value; sometimes another node reads v or a
  chain's value too (the diamond does not converge), and sometimes that is a graph output."""
  nodes, consts, n = [], {}, [0]

  def name(p):
    n[0] += 1
    return f"{p}{n[0]}"

  kind = rng.choice(["conv", "matmul", "reduce", "softmax"])
  if kind == "conv":
    feeds = {"x": f32(1, 4, 7, 9)}
    consts["w"], consts["b"] = f32(6, 4, 3, 3), f32(6)
    nodes.append(helper.make_node("Conv", ["x", "w", "b"], ["v"], pads=[1, 1, 1, 1]))
  elif kind == "matmul":
    feeds, consts["w"] = {"x": f32(5, 33)}, f32(33, 20)
    nodes.append(helper.make_node("MatMul", ["x", "w"], ["v"]))
  elif kind == "reduce":
    feeds, consts["ax"] = {"x": f32(3, 17, 6)}, np.array([1], np.int64)
    nodes.append(helper.make_node("ReduceSum", ["x", "ax"], ["v"], keepdims=1))
  else:
    feeds = {"x": f32(4, 19)}
    nodes.append(helper.make_node("Softmax", ["x"], ["v"], axis=1))
  ends, inner = [], []
  for _ in range(int(rng.integers(1, 4))):
    cur = "v"
    for _ in range(int(rng.integers(0, 4))):
      op, out = str(rng.choice(DIAMOND_UNARY)), name("u")
      if op in ("Mul", "Add", "Div"):
        c = name("c")
        consts[c] = np.array(rng.uniform(0.5, 2.0), np.float32)
        nodes.append(helper.make_node(op, [cur, c], [out]))
      elif op == "Clip":
        lo, hi = name("lo"), name("hi")
        consts[lo], consts[hi] = np.array(-1.0, np.float32), np.array(1.5, np.float32)
        nodes.append(helper.make_node(op, [cur, lo, hi], [out]))
      else:
        nodes.append(helper.make_node(op, [cur], [out]))
      inner.append(out)
      cur = out
    ends.append(cur)
  while len(ends) > 1:
    a, b = ends.pop(), ends.pop()
    out = name("m")
    nodes.append(helper.make_node(str(rng.choice(["Mul", "Add", "Sub", "Max"])), [a, b], [out]))
    ends.append(out)
  nodes.append(helper.make_node("Identity", [ends[0]], ["y0"]))
  outs = ["y0"]
  if rng.random() < 0.35:
    src = str(rng.choice(["v"] + inner))
    nodes.append(helper.make_node(str(rng.choice(["Relu", "Exp"])), [src], ["y1"]))
    outs.append("y1")
  if rng.random() < 0.2:
    outs.append("v")
  return node_model(nodes, feeds, consts, outputs=tuple(outs)), feeds


@pytest.mark.parametrize("seed", range(24))
def test_random_diamonds_of_elementwise_chains_after_a_reduction_match_onnxruntime_and_repeat_bit_identically(seed):
  model, feeds = _random_diamond(np.random.default_rng(seed))
  r = parity(model, feeds, rtol=1e-4, atol=1e-5)
  first = {k: np.array(v, copy=True) for k, v in r(**feeds).items()}
  again = r(**feeds)
  assert all(np.array_equal(v, again[k], equal_nan=True) for k, v in first.items())


POW_SPECIALS = [0.0, -0.0, np.inf, -np.inf, np.nan, -1.0, -3.5, 1e-30, 1e-38, 1e30, 3e38, 1.0]


@pytest.mark.parametrize("p", [0.75, 0.5, 0.25, -0.5, -0.75, 1.5, 2.75, -3.25, 2.0, 3.0, -1.0, -2.0])
def test_pow_by_a_constant_quarter_or_small_integer_is_square_roots_and_products_within_a_few_ulp_of_c_pow(p):
  """Pow(x, p) with one constant p (and LRN's beta) runs as square roots, products and one division instead of powf per
  element (a libm call per lane in vector code). Every finite result is within 3 ulp of C pow rounded to float32,
  and the special values are C pow's (for a non-integer p, -0 gives +0 or +inf and -inf gives +inf or +0)."""
  x = np.concatenate([np.geomspace(1e-6, 1e6, 5003), -np.geomspace(1e-3, 1e3, 101), POW_SPECIALS]).astype(np.float32)
  r = OnnxRunner(tiny_model("Pow", {"x": x}, consts={"p": np.array(p, np.float32)}))
  assert not any(re.search(r"\bpowf?\(", k.source) for k in r.program.kernels if k.kind == "c")
  got = r(x=x)["y0"]

  def c_pow(v):
    odd = p.is_integer() and int(p) % 2 == 1
    try:
      return math.pow(v, p)
    except OverflowError:
      return -math.inf if odd and v < 0 else math.inf
    except ValueError:   # 0 to a negative power, or a negative base to a non-integer one
      return (math.copysign(math.inf, v) if odd else math.inf) if v == 0 else math.nan
  with np.errstate(over="ignore"):
    ref = np.array([c_pow(float(v)) for v in x]).astype(np.float32)
  assert np.array_equal(np.isnan(got), np.isnan(ref))
  fin = np.isfinite(ref) & (ref != 0) & (np.abs(ref) >= np.finfo(np.float32).tiny)
  ulp = np.abs(got[fin].view(np.int32).astype(np.int64) - ref[fin].view(np.int32).astype(np.int64))
  assert ulp.max() <= 3, (x[fin][ulp.argmax()], got[fin][ulp.argmax()], ref[fin][ulp.argmax()])
  edge = (ref == 0) | np.isinf(ref)
  assert np.array_equal(got[edge], ref[edge]) and np.array_equal(np.signbit(got[edge]), np.signbit(ref[edge]))


def test_pow_by_any_other_constant_or_a_run_time_exponent_stays_c_pow():
  x = np.geomspace(1e-3, 1e3, 64).astype(np.float32)
  for p in (0.3, 1.0, 0.0, 5.0, 4.25):
    r = OnnxRunner(tiny_model("Pow", {"x": x}, consts={"p": np.array(p, np.float32)}))
    assert any(re.search(r"\bpowf\(", k.source) for k in r.program.kernels if k.kind == "c"), p
    np.testing.assert_allclose(r(x=x)["y0"], np.power(x, np.float32(p)), rtol=1e-6)
  y = np.full(64, 0.75, np.float32)
  r = OnnxRunner(tiny_model("Pow", {"x": x, "y": y}))
  np.testing.assert_allclose(r(x=x, y=y)["y0"], np.power(x, y), rtol=1e-6)


def test_a_kernel_whose_only_long_loop_is_its_upcast_axis_is_split_in_whole_upcast_blocks_bit_identically():
  """A 1x1 conv with few input channels runs as generated loops, lanes along the pixels and the output channels
  upcast: the upcast axis is the loop its threads split (in blocks of the upcast, the remainder in the last part)."""
  x = f32(1, 48, 40, 40)
  w = (np.random.default_rng(5).standard_normal((100, 48, 1, 1)) * 0.1).astype(np.float32)
  model = tiny_model("Conv", {"x": x}, consts={"w": w})
  r = OnnxRunner(model, cache=CompileCache(use_disk=False))
  [k] = [k for k in r.program.kernels if k.kind == "c"]
  up = int(k.tags["schedules"][0].split(" up ")[1].split("x")[1])
  assert k.tags["strategy"] == "direct" and k.tags["par"] == -(-100 // up), k.tags
  one = np.array(r(x=x)["y0"])
  np.testing.assert_allclose(one, ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-4)
  for threads in (2, 3):
    r.threads = threads
    assert np.array_equal(np.array(r(x=x)["y0"]), one), f"{threads} threads differ from one"


@pytest.mark.parametrize("vec_fn, scalar_fn", [("vexp", "pm_expf"), ("verf", "pm_erff"), ("vtanh", "pm_tanhf")])
def test_the_vector_transcendentals_compute_their_scalar_twins_bit_for_bit_over_the_whole_range(vec_fn, scalar_fn):
  """vexp's 2^k scaling (one scalef on AVX-512, two exact power-of-two factors elsewhere) rounds once, and its clamp
  (the ISA's max and min where there are, which keep a NaN as the compare-and-select form does) gives the same
  values, so every lane equals pm_expf: in the normal range, into the denormals, at the overflow to inf and for NaN
  and the infinities. verf and vtanh (which calls vexp) equal pm_erff and pm_tanhf the same way."""
  vl = compiler.vector_bytes() // 4
  rng = np.random.default_rng(5)
  x = np.concatenate([np.linspace(-110, 95, 1 << 16), rng.uniform(-104, 89, 1 << 16), rng.standard_normal(1 << 12),
                      [0.0, -0.0, 88.72, 88.73, -87.3, -103.9, -104.5, np.inf, -np.inf, np.nan]]).astype(np.float32)
  x = np.concatenate([x, np.zeros(-len(x) % vl, np.float32)])
  src = (runtime.codegen.render.PRELUDE + runtime.codegen.render.vector_prelude(vl) +
         "void k_exp_check(void* const* args) {\n"
         "  const float* x = (const float*)args[0]; float* v = (float*)args[1]; float* s = (float*)args[2];\n"
         f"  for (i64 i = 0; i < {len(x)}; i += {vl}) vf_store(v + i, {vec_fn}(vf_load(x + i)));\n"
         f"  for (i64 i = 0; i < {len(x)}; i++) s[i] = {scalar_fn}(x[i]);\n"
         "}\n")
  target = OnnxRunner(tiny_model("Exp", {"x": x[:vl]}), cache=CompileCache(use_disk=False)).program.machine_target
  [k] = runtime.cache.KernelCache(use_disk=False).get_many([(src, "k_exp_check")], target)[0]
  vec, sc = np.empty_like(x), np.empty_like(x)
  args = (ctypes.c_void_p * 3)(x.ctypes.data, vec.ctypes.data, sc.ctypes.data)
  ctypes.CFUNCTYPE(None, ctypes.c_void_p)(k.address)(args)
  assert np.array_equal(vec.view(np.uint32), sc.view(np.uint32))
  assert np.isnan(sc[np.isnan(x)]).all()
  if vec_fn != "vexp":
    return
  assert np.all(sc[np.isfinite(x) & (x < -104)] == 0) and np.isinf(sc[x > 88.73]).all() and np.isnan(sc[np.isnan(x)]).all()
  assert (sc[(x > -103.9) & (x < -87.4)] > 0).all()   # the denormal range is reached, not flushed


def test_a_1d_transposed_conv_of_a_matmul_result_stores_the_gemm_before_seeing_it_as_2d():
  """The 1-D form reshapes its input to a height of 1; a MatMul's result is a GEMM still pending in its own shape,
  which an assertion refused when it was reshaped unstored."""
  x = f32(1, 6, 16)
  nodes = [helper.make_node("MatMul", ["x", "m"], ["a"]),
           helper.make_node("ConvTranspose", ["a", "w"], ["y0"], strides=[2], pads=[1, 1])]
  r = parity(node_model(nodes, {"x": x}, {"m": f32(16, 16), "w": f32(6, 3, 4)}), {"x": x})
  assert r.program.fallbacks == []


@pytest.mark.parametrize("op,mode", [("DepthToSpace", "DCR"), ("DepthToSpace", "CRD"), ("SpaceToDepth", "DCR")])
def test_depth_to_space_and_back_are_views_read_by_the_next_kernel(op, mode):
  """A pixel shuffle (super-resolution heads, PixelShuffle exports) is a reshape, a transpose and a reshape: the
  Relu after it reads through the view, one kernel, no reference kernel copying it."""
  x = f32(2, 8, 6, 4)
  nodes = [helper.make_node(op, ["x"], ["d"], blocksize=2, **({"mode": mode} if op == "DepthToSpace" else {})),
           helper.make_node("Relu", ["d"], ["y0"])]
  r = parity(node_model(nodes, {"x": x}, {}), {"x": x})
  assert r.program.fallbacks == [] and len([k for k in r.program.kernels if k.kind == "c"]) == 1


def test_group_normalization_is_compiled_as_per_group_row_statistics():
  """Diffusion U-Nets and detection necks normalise by groups: the statistics run as vector row reductions over
  (N, groups, the rest), not as the reference kernel."""
  x = f32(2, 16, 7, 9)
  m = tiny_model("GroupNormalization", {"x": x}, consts={"s": f32(16), "b": f32(16)}, attrs={"num_groups": 4}, opset=21)
  r = parity(m, {"x": x})
  assert r.program.fallbacks == []
  assert any("GroupNormalization" in k.tags.get("ops", []) for k in r.program.kernels if k.kind == "c")
