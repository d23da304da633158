"""Differential fuzzing of views: random chains of view and shape ops (Slice with any step, Pad including crops and
huge fused pads, Concat, Split, Expand, Transpose, Reshape, Gather, DepthToSpace/SpaceToDepth, Squeeze/Unsqueeze,
Flatten, Tile), optionally ended by a window, reduce, arg or resize op, on inputs with extent-1 and empty axes and
extreme values. Each graph is built with onnx.helper and run by OnnxRunner (CPU) and by onnxruntime.

Per graph the outcome is one of: equal (same shape and dtype, values within tolerance, and a second run of ours
bit-identical to the first), refused (our typed refusal of the model), invalid (onnxruntime rejects the graph: the
generator made something ONNX does not allow, nothing to compare), failed (anything else: a wrong value, shape or
dtype, a run that differs from the one before, an untyped exception). A crash of generated code kills this process,
so it is run as a child (the suite's test and bench/fuzz_views.py); the line `case N` on stderr before each graph
names the one that crashed.

  python tests/runtime/view_fuzz.py --graphs N --seed S     (last stdout line: a dict of the counts)
"""
import argparse
import os
import sys
import traceback

import numpy as np
import onnx
from onnx import helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the checkout

from rt_helpers import memory_cache, ort_run  # noqa: E402
from runtime import OnnxRunner  # noqa: E402
from runtime.errors import MemoryBudgetError, ModelError, UnsupportedDtypeError, UnsupportedOpError  # noqa: E402

REFUSALS = (UnsupportedOpError, UnsupportedDtypeError, ModelError, MemoryBudgetError)
I64_MIN, I64_MAX = -2 ** 63, 2 ** 63 - 1
OPSET = 17
MAX_ELEMS = 1 << 16          # an intermediate larger than this ends the chain (onnxruntime materialises every value)
EXTREMES = np.array([np.inf, -np.inf, 3.4e38, -3.4e38, 0.0, -0.0, 1e-38, 1.0], np.float32)


class Chain:
  """A graph under construction: nodes, initialisers, and the current value's name and static shape."""

  def __init__(self, x: np.ndarray):
    self.x, self.nodes, self.consts, self.n = x, [], {}, 0
    self.cur, self.shape, self.desc = "x", tuple(x.shape), []

  def const(self, arr) -> str:
    name = f"c{len(self.consts)}"
    self.consts[name] = np.asarray(arr)
    return name

  def add(self, op: str, ins: list, n_out: int = 1, **attrs) -> list[str]:
    outs = [f"v{self.n}_{i}" for i in range(n_out)]
    self.n += 1
    self.nodes.append(helper.make_node(op, ins, outs, **attrs))
    self.desc.append(op + (f"{attrs}" if attrs else "") + "".join(
      f" {self.consts[i].tolist()}" for i in ins if i in self.consts))
    return outs

  def model(self, out: str | None = None) -> bytes:
    g_in = [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, self.x.shape)]
    g = helper.make_graph(self.nodes, "fuzz", g_in, [onnx.ValueInfoProto(name=out or self.cur)],
                          [numpy_helper.from_array(a, n) for n, a in self.consts.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
    m.ir_version = 8
    return m.SerializeToString()

  def settle(self, name: str) -> bool:
    """Make `name` the current value if shape inference gives it a static shape; False ends the chain."""
    try:
      m = onnx.shape_inference.infer_shapes(onnx.load_from_string(self.model(name)), strict_mode=True)
    except Exception:   # the generator made an invalid node: onnxruntime would reject it too
      return False
    for vi in list(m.graph.value_info) + list(m.graph.output):
      if vi.name == name:
        dims = vi.type.tensor_type.shape.dim
        if not vi.type.tensor_type.HasField("shape") or any(not d.HasField("dim_value") for d in dims):
          return False
        shape = tuple(d.dim_value for d in dims)
        if any(d < 0 for d in shape) or int(np.prod(shape, dtype=np.int64)) > MAX_ELEMS:
          return False
        self.cur, self.shape = name, shape
        return True
    return False


def _index_bound(rng, d: int) -> int:
  pick = rng.integers(8)
  if pick == 0:
    return int(rng.choice([I64_MIN, I64_MAX, -2 ** 40, 2 ** 40]))
  return int(rng.integers(-d - 3, d + 4))


def op_slice(c: Chain, rng) -> bool:
  r = len(c.shape)
  if not r:
    return False
  axes = sorted(rng.choice(r, int(rng.integers(1, r + 1)), replace=False).tolist())
  starts, ends, steps = [], [], []
  for a in axes:
    d = c.shape[a]
    starts.append(_index_bound(rng, d))
    ends.append(_index_bound(rng, d))
    if ends[-1] == I64_MAX:   # onnxruntime reads an INT64_MAX end as "to the start" for a negative step (ONNX: clamp to dim-1)
      ends[-1] = 2 ** 40
    steps.append(int(rng.choice([1, 1, 2, 3, -1, -1, -2, -3, d + 1, -(d + 1), 2 ** 40, -2 ** 40])))
  ins = [c.cur, c.const(np.array(starts, np.int64)), c.const(np.array(ends, np.int64)), c.const(np.array(axes, np.int64)),
         c.const(np.array(steps, np.int64))]
  return c.settle(c.add("Slice", ins)[0])


def op_pad(c: Chain, rng) -> bool:
  r = len(c.shape)
  if not r:
    return False
  before = [int(rng.integers(-min(d, 2), 4)) for d in c.shape]
  after = [int(rng.integers(-min(d + min(b, 0), 2), 4)) for d, b in zip(c.shape, before)]  # crops leave >= 0
  mode = "edge" if rng.integers(4) == 0 and all(d > 0 for d in c.shape) else "constant"
  ins = [c.cur, c.const(np.array(before + after, np.int64))]
  if mode == "constant" and rng.integers(2):
    ins.append(c.const(np.array(float(rng.choice([1.5, -np.inf, 0.0])), np.float32)))
  return c.settle(c.add("Pad", ins, mode=mode)[0])


def op_huge_pad_slice(c: Chain, rng) -> bool:
  """A pad far larger than the input (fused, so never allocated by us) then a slice that steps across it."""
  r = len(c.shape)
  if not r or int(np.prod(c.shape)) > 16:
    return False
  a = int(rng.integers(r))
  p = int(rng.choice([10 ** 5, 10 ** 6, 3 * 10 ** 6]))
  pads = [0] * (2 * r)
  pads[a + (r if rng.integers(2) else 0)] = p
  padded = c.add("Pad", [c.cur, c.const(np.array(pads, np.int64))])[0]
  step = int(p // int(rng.choice([4, 7, 8, 13]))) * int(rng.choice([-1, 1]))
  start = -1 if step < 0 else int(rng.integers(0, 3))
  end = I64_MIN if step < 0 else I64_MAX
  ins = [padded, c.const(np.array([start], np.int64)), c.const(np.array([end], np.int64)), c.const(np.array([a], np.int64)),
         c.const(np.array([step], np.int64))]
  return c.settle(c.add("Slice", ins)[0])


def op_concat(c: Chain, rng) -> bool:
  r = len(c.shape)
  if not r:
    return False
  k = int(rng.integers(2, 4))
  return c.settle(c.add("Concat", [c.cur] * k, axis=int(rng.integers(-r, r)))[0])


def op_split(c: Chain, rng) -> bool:
  r = len(c.shape)
  if not r:
    return False
  a = int(rng.integers(r))
  d = c.shape[a]
  cut = int(rng.integers(0, d + 1))
  outs = c.add("Split", [c.cur, c.const(np.array([cut, d - cut], np.int64))], n_out=2, axis=a)
  return c.settle(outs[int(rng.integers(2))])


def op_expand(c: Chain, rng) -> bool:
  shape = [int(rng.choice([1, 2, 3])) if d == 1 else d for d in c.shape]
  if rng.integers(3) == 0:
    shape = [int(rng.choice([1, 2]))] + shape
  return c.settle(c.add("Expand", [c.cur, c.const(np.array(shape, np.int64))])[0])


def op_transpose(c: Chain, rng) -> bool:
  if len(c.shape) < 2:
    return False
  return c.settle(c.add("Transpose", [c.cur], perm=rng.permutation(len(c.shape)).tolist())[0])


def op_reshape(c: Chain, rng) -> bool:
  shape = list(c.shape)
  if len(shape) >= 2 and rng.integers(2):
    i = int(rng.integers(len(shape) - 1))
    shape[i:i + 2] = [shape[i] * shape[i + 1]]
  elif shape:
    i = int(rng.integers(len(shape)))
    divs = [k for k in range(1, shape[i] + 1) if shape[i] % k == 0] or [1]
    k = int(rng.choice(divs))
    shape[i:i + 1] = [k, shape[i] // k] if shape[i] else [0, int(rng.integers(1, 4))]
  else:
    shape = [1]
  target = list(shape)
  for i, d in enumerate(target):   # 0 copies the input's dim at that position (allowzero=0)
    if i < len(c.shape) and d == c.shape[i] and d != 0 and rng.integers(3) == 0:
      target[i] = 0
  if 0 not in shape and rng.integers(2):
    target[int(rng.integers(len(target)))] = -1
  elif 0 in c.shape and 0 in shape and rng.integers(2):
    # an empty input: a -1 beside 0-copies of its dims (the known product is not 0)
    i = int(rng.integers(len(target)))
    if all(t != 0 or j == i for j, t in enumerate(shape)):
      target[i] = -1
  return c.settle(c.add("Reshape", [c.cur, c.const(np.array(target, np.int64))])[0])


def op_gather(c: Chain, rng) -> bool:
  r = len(c.shape)
  if not r:
    return False
  a = int(rng.integers(r))
  d = c.shape[a]
  if d == 0:
    return False
  ishape = tuple(int(v) for v in rng.integers(1, 4, int(rng.integers(0, 3))))
  idx = rng.integers(-d, d, ishape).astype(np.int64)
  return c.settle(c.add("Gather", [c.cur, c.const(idx)], axis=a)[0])


def op_depth_space(c: Chain, rng) -> bool:
  if len(c.shape) != 4:
    return False
  _, ch, h, w = c.shape
  b = int(rng.choice([2, 3]))
  if rng.integers(2) and ch % (b * b) == 0:
    return c.settle(c.add("DepthToSpace", [c.cur], blocksize=b, mode=str(rng.choice(["DCR", "CRD"])))[0])
  if h % b == 0 and w % b == 0:
    return c.settle(c.add("SpaceToDepth", [c.cur], blocksize=b)[0])
  return False


def op_squeeze(c: Chain, rng) -> bool:
  ones = [i for i, d in enumerate(c.shape) if d == 1]
  if ones and rng.integers(2):
    axes = [i - len(c.shape) if rng.integers(2) else i for i in ones if rng.integers(2)] or [ones[0]]
    return c.settle(c.add("Squeeze", [c.cur, c.const(np.array(axes, np.int64))])[0])
  if len(c.shape) >= 5:
    return False
  r = len(c.shape) + 1
  return c.settle(c.add("Unsqueeze", [c.cur, c.const(np.array([int(rng.integers(-r, r))], np.int64))])[0])


def op_flatten(c: Chain, rng) -> bool:
  r = len(c.shape)
  return c.settle(c.add("Flatten", [c.cur], axis=int(rng.integers(-r, r + 1)))[0])


def op_tile(c: Chain, rng) -> bool:
  if not c.shape:
    return False
  reps = [int(rng.choice([1, 1, 2, 3])) for _ in c.shape]
  return c.settle(c.add("Tile", [c.cur, c.const(np.array(reps, np.int64))])[0])


VIEW_OPS = [op_slice, op_slice, op_slice, op_pad, op_pad, op_huge_pad_slice, op_concat, op_split, op_expand, op_transpose,
            op_transpose, op_reshape, op_reshape, op_gather, op_depth_space, op_squeeze, op_flatten, op_tile]


def tail_reduce(c: Chain, rng) -> bool:
  r = len(c.shape)
  if not r:
    return False
  axes = sorted(rng.choice(r, int(rng.integers(1, r + 1)), replace=False).tolist())
  op = str(rng.choice(["ReduceSum", "ReduceMax", "ReduceMin", "ReduceMean"]))
  keep = int(rng.integers(2))
  if op in ("ReduceMax", "ReduceMin", "ReduceMean") and any(c.shape[a] == 0 for a in axes):
    return False   # no identity (max/min) or a 0/0 mean: onnxruntime and we may legitimately differ
  if op == "ReduceSum":
    return c.settle(c.add(op, [c.cur, c.const(np.array(axes, np.int64))], keepdims=keep)[0])
  return c.settle(c.add(op, [c.cur], axes=axes, keepdims=keep)[0])


def tail_arg(c: Chain, rng) -> bool:
  r = len(c.shape)
  if not r:
    return False
  a = int(rng.integers(-r, r))
  if c.shape[a] == 0:
    return False
  op = str(rng.choice(["ArgMax", "ArgMin"]))
  return c.settle(c.add(op, [c.cur], axis=a, keepdims=int(rng.integers(2)), select_last_index=int(rng.integers(2)))[0])


def _as_nchw(c: Chain, rng) -> bool:
  if len(c.shape) == 4:
    return True
  if len(c.shape) > 4 or 0 in c.shape:
    return False
  shape = [1] * (4 - len(c.shape)) + list(c.shape)
  return c.settle(c.add("Reshape", [c.cur, c.const(np.array(shape, np.int64))])[0])


def tail_pool(c: Chain, rng) -> bool:
  if not _as_nchw(c, rng) or 0 in c.shape:
    return False
  _, _, h, w = c.shape
  k = [int(rng.integers(1, min(h, 3) + 1)), int(rng.integers(1, min(w, 3) + 1))]
  pads = [int(rng.integers(0, k[0])), int(rng.integers(0, k[1])), int(rng.integers(0, k[0])), int(rng.integers(0, k[1]))]
  strides = [int(rng.integers(1, 3)), int(rng.integers(1, 3))]
  if rng.integers(2):
    return c.settle(c.add("MaxPool", [c.cur], kernel_shape=k, pads=pads, strides=strides)[0])
  return c.settle(c.add("AveragePool", [c.cur], kernel_shape=k, pads=pads, strides=strides,
                        count_include_pad=int(rng.integers(2)))[0])


def tail_resize(c: Chain, rng) -> bool:
  if not _as_nchw(c, rng) or 0 in c.shape:
    return False
  s = float(rng.choice([0.5, 1.0, 1.5, 2.0, 3.0]))
  mode = str(rng.choice(["nearest", "linear"]))
  ins = [c.cur, "", c.const(np.array([1, 1, s, s], np.float32))]
  return c.settle(c.add("Resize", ins, mode=mode)[0])


def tail_elementwise(c: Chain, rng) -> bool:
  return c.settle(c.add("Add", [c.cur, c.const(np.array(0.5, np.float32))])[0])


TAILS = [tail_reduce, tail_arg, tail_arg, tail_pool, tail_resize, tail_elementwise]
SUMMING = ("ReduceSum", "ReduceMean", "AveragePool", "Resize")


def random_case(rng) -> Chain:
  rank = int(rng.integers(0, 5))
  shape = tuple(int(rng.choice([0, 1, 1, 2, 3, 4, 5])) if rng.integers(12) else 0 for _ in range(rank))
  shape = tuple(d if rng.integers(8) else 0 for d in shape) if rng.integers(6) == 0 else tuple(max(d, 1) for d in shape)
  x = rng.uniform(-4, 4, shape).astype(np.float32)
  if x.size and rng.integers(2):  # repeated values: arg ops must pick the first (or last) of equals
    x = np.round(x).astype(np.float32)
  c = Chain(x)
  for _ in range(int(rng.integers(1, 6))):
    fn = VIEW_OPS[int(rng.integers(len(VIEW_OPS)))]
    n_nodes = len(c.nodes)
    if not fn(c, rng):
      del c.nodes[n_nodes:]
      c.desc = c.desc[:n_nodes]
  if rng.integers(5) < 3:
    n_nodes = len(c.nodes)
    if not TAILS[int(rng.integers(len(TAILS)))](c, rng):
      del c.nodes[n_nodes:]
      c.desc = c.desc[:n_nodes]
  summing = any(n.op_type in SUMMING for n in c.nodes)
  if summing:  # an infinite pad value inside an interpolation or sum has no specified result (inf - inf, 0 * inf)
    for n in c.nodes:
      if n.op_type == "Pad" and len(n.input) > 2 and not np.isfinite(c.consts[n.input[2]]):
        c.consts[n.input[2]] = np.array(1.5, np.float32)
  if x.size and not summing and rng.integers(3) == 0:  # extremes only where no sum's order could change the result
    flat = c.x.reshape(-1)
    flat[rng.integers(0, flat.size, max(1, flat.size // 4))] = rng.choice(EXTREMES, max(1, flat.size // 4))
    if any(n.op_type == "MaxPool" for n in c.nodes):  # onnxruntime pads MaxPool with -FLT_MAX, the spec with -inf:
      flat[np.isneginf(flat)] = -3.4e38               # a window of pad and -inf has no one answer
  return c


def check(c: Chain) -> tuple[str, str]:
  model, feeds = c.model(), {"x": c.x}
  try:
    want = ort_run(model, feeds)[0]
  except Exception as e:  # onnxruntime rejects the graph: nothing to compare against
    return "invalid", f"{type(e).__name__}: {str(e)[:200]}"
  try:
    r = OnnxRunner(model, device="CPU", cache=memory_cache())
    name = r.program.outputs[0]
    got = r(**feeds)[name].copy()
    again = r(**feeds)[name]
  except REFUSALS as e:
    return "refused", f"{type(e).__name__}: {e}"
  except Exception:
    return "failed", traceback.format_exc(limit=4)
  if got.shape != want.shape or got.dtype != want.dtype:
    return "failed", f"shape/dtype {got.shape} {got.dtype}, onnxruntime {want.shape} {want.dtype}"
  if got.tobytes() != np.ascontiguousarray(again).tobytes():
    return "failed", "a second run differs from the first"
  try:
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, equal_nan=True)
  except AssertionError as e:
    return "failed", str(e)[:1500]
  return "equal", ""


def run(graphs: int, seed: int, out=sys.stderr) -> dict:
  counts = {"graphs": graphs, "seed": seed, "compared": 0, "equal": 0, "refused": 0, "invalid": 0, "failed": 0}
  failures = []
  for i in range(graphs):
    rng = np.random.default_rng([seed, i])
    c = random_case(rng)
    print(f"case {i}: x{c.x.shape} " + " -> ".join(c.desc), file=out, flush=True)
    outcome, why = check(c)
    counts[outcome] += 1
    counts["compared"] += outcome in ("equal", "failed")
    if outcome == "failed":
      failures.append(f"seed {seed} case {i}: x{c.x.shape} {' -> '.join(c.desc)}: {why}")
      print(f"FAILED {failures[-1]}", file=out, flush=True)
  counts["failures"] = failures
  return counts


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--graphs", type=int, default=100)
  p.add_argument("--seed", type=int, default=0)
  a = p.parse_args(argv)
  if a.graphs < 0:
    p.error("--graphs must be >= 0")
  counts = run(a.graphs, a.seed)
  print(repr(counts), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
