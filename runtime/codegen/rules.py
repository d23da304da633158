"""Lowering rules: one function per ONNX op turning input Lazy values into output Lazy values.

A rule gets (ctx, node, inputs, input specs, input constants); the output specs are already known (the
reference kernels inferred and validated them when the graph was folded), so a rule only builds expressions.
It raises NotLowered for a variant it does not handle, and the op then runs on its reference kernel.

Semantics follow the reference kernels (numpy), which follow ONNX: max/min and clip propagate NaN, integer
Div truncates toward zero, integer Mod follows the divisor's sign unless fmod=1, Round is half-to-even.
Convolutions, Gemm and MatMul live in conv.py.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import UnsupportedOpError
from ..kernels.nn import avg_pool_divisors, bn_affine, window_geometry
from ..kernels.shape_ops import depth_space_geometry, slice_range, source_coords
from . import ir
from . import optimise as opt
from .ir import BOOL, INDEX, E
from .lazy import Lazy, broadcast_shapes, combine, gate_loads
from .lower import NotLowered

RULES: dict = {}


def rule(*ops):
  def deco(fn):
    for op in ops:
      RULES[op] = fn
    return fn
  return deco


def out_spec(ctx, node, i=0):
  return ctx.specs[node.outputs[i]]


def c(value, dtype) -> E:
  return ir.const(value, dtype)


def pow_const(x: E, p: float) -> E:
  """x ** p for a constant float exponent p, as ONNX Pow (C's pow) gives it.

  p in 2, 3, -1, -2 becomes products and a division, and a non-integer multiple of 1/4 within (-4, 4) (LRN's beta of
  0.75, 0.5, -0.25) becomes square roots of |x| times a power of it. Any other p stays pow per element, a libm call
  that vector code makes once per lane (LRN's powf was a sixth of inception_v1's time).
  Results: p = 2, -1 and 0.5 round once, as a correctly rounded pow does; the others round at each of at most six
  steps and stay within a few units in the last place (tests/runtime/test_codegen.py holds the bound). Special values
  are pow's: for a non-integer p, -0 and +0 give +0 (p > 0) or +inf (p < 0), -inf gives +inf or +0, any other
  negative x and NaN give NaN (sqrt of a negative)."""
  whole = float(p).is_integer()
  if whole and p not in (2.0, 3.0, -1.0, -2.0) or not whole and (abs(p) >= 4 or not (4 * p).is_integer()):
    return ir.alu("pow", x, c(p, x.dtype))
  dt = x.dtype

  def power(v: E, n: int) -> E:   # v ** n for n in 1..3, multiplied left to right
    return v if n == 1 else ir.alu("mul", power(v, n - 1), v)
  if whole:
    r = power(x, int(abs(p)))
  else:
    # |x| where pow's result does not depend on x's sign (+-0, -inf); other negatives stay negative, for sqrt's NaN
    y = ir.where(ir.alu("or", ir.alu("ge", x, c(0, dt)), ir.alu("eq", x, c(-math.inf, dt))), ir.alu("abs", x), x)
    quarters = int(abs(p) * 4)
    s = ir.alu("sqrt", y)
    q = ir.alu("sqrt", s)
    r = {1: q, 2: s, 3: ir.alu("mul", s, q)}[quarters % 4]
    if quarters >= 4:
      r = ir.alu("mul", power(y, quarters // 4), r)
  return ir.alu("div", c(1, dt), r) if p < 0 else r


def ew(ctx, f, srcs: list[Lazy], dtype=None, cost: int = 1) -> Lazy:
  """Elementwise f over srcs with broadcasting; the sources may carry one reduction between them (several sources
  built on the same one: x * sigmoid(x) of a conv), and only where it is not broadcast (a reduction repeated per
  output element would be recomputed)."""
  shape = broadcast_shapes(*[s.shape for s in srcs])
  n = math.prod(shape)
  srcs = list(srcs)
  kept = None
  for i, s in enumerate(srcs):
    if s.red is not None:
      if s.size != n or (not isinstance(s.red, str) and s.shape != shape) or \
              kept is not None and not same_reduction(kept, s):
        srcs[i] = ctx.realize(s)
      elif kept is None:
        kept = s
  return combine(f, srcs, dtype, shape, cost)


def same_reduction(a: Lazy, b: Lazy) -> bool:
  """Whether a and b (same shape) hold one and the same reduction, so an expression of both computes it once: the
  same pending GEMM (its accumulator placeholders), or the same REDUCE nodes (interned) at every index."""
  if a.shape != b.shape:
    return False
  if not isinstance(a.red, str) or not isinstance(b.red, str):
    return a.red is b.red
  idx = [ir.var(f"same{d}", max(1, e)) for d, e in enumerate(a.shape)]
  ra = {x for x in ir.walk(a.at(idx)) if x.op == "REDUCE"}
  return bool(ra) and ra == {x for x in ir.walk(b.at(idx)) if x.op == "REDUCE"}


# ------------------------------------------------------------------------------------------------- unary

def _f(x: E, v) -> E:
  return c(v, x.dtype)


def _max(a, b):
  return ir.alu("max", a, b)


def _min(a, b):
  return ir.alu("min", a, b)


def unary_expr(op: str, attrs: dict, x: E) -> E:
  dt = x.dtype
  zero = c(0, dt)
  if op == "Relu":
    return ir.where(ir.alu("lt", x, zero), zero, x)
  if op == "LeakyRelu":
    a = float(attrs.get("alpha", 0.01))
    return ir.where(ir.alu("lt", x, zero), ir.alu("mul", x, _f(x, a)), x)
  if op == "Sigmoid":
    return ir.alu("recip", ir.alu("add", ir.alu("exp", ir.alu("neg", x)), _f(x, 1)))
  if op == "HardSigmoid":
    a, b = float(attrs.get("alpha", 0.2)), float(attrs.get("beta", 0.5))
    return _min(_max(ir.alu("add", ir.alu("mul", x, _f(x, a)), _f(x, b)), zero), _f(x, 1))
  if op in ("Elu", "Selu"):
    alpha = float(attrs.get("alpha", 1.0 if op == "Elu" else 1.67326319217681884765625))
    neg = ir.alu("mul", ir.alu("sub", ir.alu("exp", _min(x, zero)), _f(x, 1)), _f(x, alpha))
    y = ir.alu("add", _max(x, zero), neg)
    if op == "Selu":
      y = ir.alu("mul", y, _f(x, float(attrs.get("gamma", 1.05070102214813232421875))))
    return y
  if op == "Celu":
    alpha = float(attrs.get("alpha", 1.0))
    neg = ir.alu("mul", ir.alu("sub", ir.alu("exp", ir.alu("div", _min(x, zero), _f(x, alpha))), _f(x, 1)),
                 _f(x, alpha))
    return ir.alu("add", _max(x, zero), neg)
  if op == "Softplus":  # log(1 + e^x) = max(x, 0) + log(1 + e^-|x|)
    return ir.alu("add", _max(x, zero), ir.alu("log1p", ir.alu("exp", ir.alu("neg", ir.alu("abs", x)))))
  if op == "Swish":   # x * sigmoid(alpha x)
    a = float(attrs.get("alpha", 1.0))
    return ir.alu("mul", x, unary_expr("Sigmoid", {}, x if a == 1.0 else ir.alu("mul", x, _f(x, a))))
  if op == "HardSwish":   # x * max(0, min(1, x / 6 + 1 / 2)), the products in the reference's order
    return ir.alu("mul", x, _min(_max(ir.alu("add", ir.alu("mul", x, _f(x, 1 / 6)), _f(x, 0.5)), zero), _f(x, 1)))
  if op == "Mish":   # x * tanh(softplus(x))
    return ir.alu("mul", x, ir.alu("tanh", unary_expr("Softplus", {}, x)))
  if op == "ThresholdedRelu":
    return ir.where(ir.alu("gt", x, _f(x, float(attrs.get("alpha", 1.0)))), x, zero)
  if op == "Softsign":
    return ir.alu("div", x, ir.alu("add", ir.alu("abs", x), _f(x, 1)))
  if op == "Gelu":
    if attrs.get("approximate", "none") == "tanh":
      x3 = ir.alu("mul", ir.alu("mul", x, x), x)
      inner = ir.alu("mul", ir.alu("add", x, ir.alu("mul", x3, _f(x, 0.044715))), _f(x, math.sqrt(2 / math.pi)))
      t = ir.alu("tanh", inner)
    else:
      t = ir.alu("erf", ir.alu("mul", x, _f(x, 1 / math.sqrt(2))))
    return ir.alu("mul", x, ir.alu("mul", ir.alu("add", t, _f(x, 1)), _f(x, 0.5)))
  simple = {"Neg": "neg", "Abs": "abs", "Sqrt": "sqrt", "Exp": "exp", "Log": "log", "Reciprocal": "recip",
            "Floor": "floor", "Ceil": "ceil", "Sign": "sign", "Sin": "sin", "Cos": "cos", "Tan": "tan",
            "Not": "not", "Round": "rint", "Erf": "erf", "Tanh": "tanh"}
  if op in simple:
    return ir.alu(simple[op], x)
  raise NotLowered(op)


UNARY_OPS = ["Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "Tanh", "Elu", "Selu", "Celu", "Softplus", "Softsign",
             "Gelu", "Erf", "Neg", "Abs", "Sqrt", "Exp", "Log", "Reciprocal", "Floor", "Ceil", "Sign", "Sin",
             "Cos", "Tan", "Not", "Round", "Swish", "HardSwish", "Mish", "ThresholdedRelu"]


@rule(*UNARY_OPS)
def unary(ctx, node, ins, specs, consts):
  attrs = node.attrs
  if node.op in ("Neg", "Abs", "Sign") and specs[0].dtype.kind not in "fi":
    raise NotLowered(node.op)
  return [ew(ctx, lambda a: unary_expr(node.op, attrs, a), [ins[0]], cost=_cost(node.op))]


def _cost(op: str) -> int:
  """Rough ops per element (a transcendental counts as several), for the recompute-or-realize choice."""
  return {"Gelu": 8, "Sigmoid": 5, "Elu": 6, "Selu": 7, "Celu": 7, "Softplus": 9, "HardSigmoid": 3, "Exp": 4,
          "Log": 4, "Tanh": 5, "Erf": 5, "Sin": 4, "Cos": 4, "Tan": 5, "Sqrt": 2, "Swish": 6, "HardSwish": 4,
          "Mish": 14}.get(op, 1)


# ------------------------------------------------------------------------------------------------ binary

COMPARE = {"Equal": "eq", "Less": "lt", "Greater": "gt", "LessOrEqual": "le", "GreaterOrEqual": "ge"}
LOGIC = {"And": "and", "Or": "or", "Xor": "xor"}


@rule("Add", "Sub", "Mul", "Div", "Pow", "Mod", "PRelu", "BitShift", *COMPARE, *LOGIC)
def binary(ctx, node, ins, specs, consts):
  op = node.op
  a, b = ins[0], ins[1]
  out = out_spec(ctx, node)
  if op in COMPARE:
    return [ew(ctx, lambda x, y: ir.alu(COMPARE[op], x, y), [a, b], BOOL)]
  if op in LOGIC:
    return [ew(ctx, lambda x, y: ir.alu(LOGIC[op], x, y), [a, b], BOOL)]
  if op in ("Add", "Sub", "Mul", "Div"):
    name = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div"}[op]
    return [ew(ctx, lambda x, y: ir.alu(name, x, y), [a, b])]
  if op == "Pow":
    dt = out.dtype
    e = consts[1]
    if dt.kind == "f" and e is not None and e.size and e.dtype.kind in "fiu" and np.all(e == e.reshape(-1)[0]):
      p = float(e.reshape(-1)[0])   # one exponent for every element: multiplies and square roots where they do (pow_const)
      if broadcast_shapes(a.shape, b.shape) == a.shape:
        return [ew(ctx, lambda x: pow_const(x, float(np.asarray(p, dt))), [a], dt, cost=4)]
    if dt.kind == "f":
      return [ew(ctx, lambda x, y: ir.alu("pow", x, ir.cast(y, dt)), [a, b], dt, cost=4)]
    return [ew(ctx, lambda x, y: ir.cast(ir.alu("pow", ir.cast(x, np.float64), ir.cast(y, np.float64)), dt),
               [a, b], dt, cost=4)]
  if op == "Mod":
    if int(node.attrs.get("fmod", 0)) == 0 and specs[0].dtype.kind == "f":
      raise NotLowered("float Mod with fmod=0 (the divisor's sign) runs on its reference kernel")
    fmod = int(node.attrs.get("fmod", 0)) == 1
    return [ew(ctx, lambda x, y: ir.alu("fmod" if fmod else "mod", x, y), [a, b])]
  if op == "BitShift":
    name = "shl" if node.attrs.get("direction", "") == "LEFT" else "shr"
    if specs[0].dtype.kind != "u":
      raise NotLowered(op)
    return [ew(ctx, lambda x, y: ir.alu(name, x, ir.cast(y, x.dtype)), [a, b])]
  # PRelu (legacy opsets: a 1-D slope of C values is per channel)
  if int(node.attrs.get("_opset", 17)) < 7 and len(b.shape) == 1 and len(a.shape) > 2 and \
          b.shape[0] == a.shape[1] and b.shape[0] != 1:
    b = b.reshape((b.shape[0],) + (1,) * (len(a.shape) - 2))
  return [ew(ctx, lambda x, s: ir.where(ir.alu("lt", x, c(0, x.dtype)), ir.alu("mul", x, s), x), [a, b])]


@rule("Min", "Max", "Sum", "Mean")
def variadic(ctx, node, ins, specs, consts):
  op = node.op
  dt = specs[0].dtype
  if op == "Mean" and dt.kind != "f":
    raise NotLowered(op)
  name = {"Min": "min", "Max": "max", "Sum": "add", "Mean": "add"}[op]
  n = len(ins)

  def f(*xs):
    acc = xs[0]
    for x in xs[1:]:
      acc = ir.alu(name, acc, x)
    return ir.alu("div", acc, c(n, dt)) if op == "Mean" and n > 1 else acc
  return [ew(ctx, f, list(ins), cost=n)]


@rule("Cast", "CastLike")
def cast(ctx, node, ins, specs, consts):
  to = out_spec(ctx, node).dtype
  return [ew(ctx, lambda x: ir.cast(x, to), [ins[0]], to)]


@rule("Where")
def where(ctx, node, ins, specs, consts):
  return [ew(ctx, lambda cnd, a, b: ir.where(cnd, a, b), list(ins), specs[1].dtype)]


@rule("Clip")
def clip(ctx, node, ins, specs, consts):
  x = ins[0]
  dt = specs[0].dtype
  bounds = []  # (kind, Lazy)
  if "min" in node.attrs or "max" in node.attrs:
    if "min" in node.attrs:
      bounds.append(("max", Lazy.constant(node.attrs["min"], dt)))
    if "max" in node.attrs:
      bounds.append(("min", Lazy.constant(node.attrs["max"], dt)))
  else:
    for i, kind in ((1, "max"), (2, "min")):
      if i < len(ins) and ins[i] is not None:
        bounds.append((kind, ins[i].reshape(())))
  kinds = [k for k, _ in bounds]

  def f(v, *bs):
    for k, b in zip(kinds, bs):
      v = ir.alu(k, v, b)
    return v
  return [ew(ctx, f, [x] + [b for _, b in bounds], cost=2)]


# ------------------------------------------------------------------------------------------------- views

@rule("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")
def reshape(ctx, node, ins, specs, consts):
  return [_movable(ctx, ins[0]).reshape(out_spec(ctx, node).shape)]


def _movable(ctx, x: Lazy) -> Lazy:
  """x ready for a movement op: a pending BLAS result is realized (its epilogue runs in its own layout)."""
  return ctx.realize(x) if x.red is not None and not isinstance(x.red, str) else x


@rule("Dropout")
def dropout(ctx, node, ins, specs, consts):
  """Inference is the identity (and an all-true mask); training mode, or a training_mode read at run time,
  runs on the reference kernel (its seeded mask)."""
  opset = int(node.attrs.get("_opset", 13))
  if opset < 7 and int(node.attrs.get("is_test", 0)) == 0:
    raise NotLowered("Dropout in training mode")
  if opset >= 12 and len(node.inputs) > 2 and node.inputs[2]:
    t = consts[2]
    if t is None or bool(np.asarray(t).reshape(-1)[0]):
      raise NotLowered("Dropout in training mode")
  outs = [ins[0]]
  if len(node.outputs) > 1:
    outs.append(Lazy.constant(True, BOOL, specs[0].shape))
  return outs


@rule("DepthToSpace", "SpaceToDepth")
def depth_space(ctx, node, ins, specs, consts):
  """A reshape into blocks, a transpose and a reshape: a view the reader's kernel indexes through."""
  x = _movable(ctx, ins[0])
  split, perm, out = depth_space_geometry(node.op, node.attrs, x.shape)
  return [x.reshape(split).permute(list(perm)).reshape(out)]


@rule("Transpose")
def transpose(ctx, node, ins, specs, consts):
  x = _movable(ctx, ins[0])
  perm = list(node.attrs.get("perm", list(range(len(x.shape)))[::-1]))
  return [x.permute(perm)]


def slice_params(shape, starts, ends, axes, steps):
  """ONNX Slice -> per-axis (start, step, length), clamped by the reference kernel's one definition."""
  rank = len(shape)
  st, sp, ln = [0] * rank, [1] * rank, list(shape)
  for s, e, a, step in zip(starts, ends, axes, steps):
    a = a % rank
    st[a], sp[a], ln[a] = slice_range(shape[a], s, e, step)
  return st, sp, ln


@rule("Slice")
def slice_op(ctx, node, ins, specs, consts):
  x = _movable(ctx, ins[0])
  if "starts" in node.attrs:
    starts, ends = list(node.attrs["starts"]), list(node.attrs["ends"])
    axes = list(node.attrs.get("axes", range(len(starts))))
    steps = [1] * len(starts)
  else:
    starts, ends = [int(v) for v in consts[1]], [int(v) for v in consts[2]]
    axes = [int(v) for v in consts[3]] if len(consts) > 3 and consts[3] is not None else list(range(len(starts)))
    steps = [int(v) for v in consts[4]] if len(consts) > 4 and consts[4] is not None else [1] * len(starts)
  st, sp, ln = slice_params(x.shape, starts, ends, axes, steps)
  out = x.shrink(st, sp, ln)
  assert out.shape == out_spec(ctx, node).shape, (out.shape, out_spec(ctx, node).shape)
  return [out]


@rule("Expand")
def expand(ctx, node, ins, specs, consts):
  return [_movable(ctx, ins[0]).broadcast_to(out_spec(ctx, node).shape)]


@rule("Tile")
def tile(ctx, node, ins, specs, consts):
  x = _movable(ctx, ins[0])
  src = x.shape
  fn = x.fn
  shape = out_spec(ctx, node).shape
  # an empty source axis makes the output empty too: no index is ever evaluated there, so it is not wrapped (mod 0)
  return [Lazy(shape, x.dtype, lambda idx: fn([ir.imod(i, d) if d else i for i, d in zip(idx, src)]), red=x.red,
               cost=x.cost, reads=x.reads)]


@rule("Split")
def split(ctx, node, ins, specs, consts):
  x = _movable(ctx, ins[0])
  axis = int(node.attrs.get("axis", 0)) % len(x.shape)
  outs, start = [], 0
  for o in node.outputs:
    shape = ctx.specs[o].shape if o else None
    n = shape[axis]
    st = [start if d == axis else 0 for d in range(len(x.shape))]
    outs.append(x.shrink(st, [1] * len(st), list(shape)))
    start += n
  return outs


@rule("Concat")
def concat(ctx, node, ins, specs, consts):
  out = node.outputs[0]
  spec = out_spec(ctx, node)
  axis = int(node.attrs["axis"]) % len(spec.shape)
  home = ctx._home_of(out) if out in ctx.placement or out in ctx.homes else None
  if home is None:
    buf = ctx._new_buf(spec.shape, spec.dtype, "output" if out in ctx.graph.outputs else "planned", out)
    home = (buf, ir.View.contiguous(spec.shape))
    ctx.homes[out] = home
  buf, view = home
  start = 0
  for name, lz in zip(node.inputs, ins):
    n = lz.shape[axis]
    if n:
      placed = ctx.values.get(name)
      sl = view.shrink([start if d == axis else 0 for d in range(len(spec.shape))], [1] * len(spec.shape),
                       list(lz.shape))
      if not (placed is not None and placed.view is not None and placed.view[0] == buf and placed.view[1] == sl):
        if name in ctx.placement and ctx.placement[name][0] is node and name not in ctx.placed:
          ctx.realize(lz, name)
        else:
          ctx.emit_store(_movable(ctx, lz), buf, sl, {"ops": lz.tags.get("ops", []) + ["Concat"]})
    start += n
  return [Lazy.of_buffer(buf, view)]


@rule("Pad")
def pad(ctx, node, ins, specs, consts):
  x = _movable(ctx, ins[0])
  rank = len(x.shape)
  mode = node.attrs.get("mode", "constant")
  if "pads" in node.attrs:
    pads = list(node.attrs["pads"])
    value = float(node.attrs.get("value", 0.0))
    axes = list(range(rank))
  else:
    pads = [int(v) for v in consts[1]]
    value = consts[2].reshape(()).item() if len(consts) > 2 and consts[2] is not None else 0
    if len(ins) > 2 and ins[2] is not None and consts[2] is None:
      raise NotLowered("Pad with a dynamic value")
    axes = [int(a) % rank for a in consts[3]] if len(consts) > 3 and consts[3] is not None else list(range(rank))
  before, after = [0] * rank, [0] * rank
  for i, a in enumerate(axes):
    before[a], after[a] = pads[i], pads[i + len(axes)]
  if mode == "constant":
    return [x.pad(before, after, value)]
  # edge / reflect / wrap: an index map onto the (cropped) source
  crop = x.pad([min(0, b) for b in before], [min(0, a) for a in after])
  pos_b = [max(0, b) for b in before]
  src = crop.shape
  fn = crop.fn

  def mapped(idx):
    out = []
    for i, b, d in zip(idx, pos_b, src):
      j = ir.add(i, -b)
      if mode == "edge":
        j = _max(_min(j, ir.const(d - 1)), ir.const(0))
      elif mode == "wrap":
        j = ir.imod(j, d)
      else:  # reflect (pads shorter than the axis): -j before the start, 2(d-1)-j past the end
        j = ir.where(ir.alu("lt", j, ir.const(0)), ir.mul(j, -1), j)
        j = ir.where(ir.alu("gt", j, ir.const(d - 1)), ir.add(2 * (d - 1), ir.mul(j, -1)), j)
      out.append(j)
    return fn(out)
  if mode == "reflect" and any(b >= d or a >= d for b, a, d in zip(pos_b, after, src) if b or a):
    raise NotLowered("reflect padding longer than the axis")
  return [Lazy(out_spec(ctx, node).shape, x.dtype, mapped, red=x.red, cost=x.cost + 2, reads=x.reads)]


@rule("Gather")
def gather(ctx, node, ins, specs, consts):
  x = _movable(ctx, ins[0])
  axis = int(node.attrs.get("axis", 0)) % len(x.shape)
  dim = x.shape[axis]
  idx_shape = specs[1].shape
  ci = consts[1]
  if ci is not None:
    table = Lazy.of_buffer(ctx.const_buf(np.where(ci < 0, ci + dim, ci).astype(np.int64)),
                           ir.View.contiguous(ci.shape)) if ci.size > 1 else None
    scalar = int(ci.reshape(-1)[0]) % dim if ci.size == 1 else None
  else:
    table, scalar = ctx.plain(ins[1]), None
  fn = x.fn
  r = len(idx_shape)

  def gathered(idx):
    inner = idx[axis:axis + r]
    if scalar is not None:
      j = ir.const(scalar)
    else:
      j = ir.cast(table.at(inner) if inner else table.at([]), INDEX)
      if ci is None:  # indices read at run time: wrap negatives, clamp into the axis (never out of bounds)
        j = ir.where(ir.alu("lt", j, ir.const(0)), ir.add(j, dim), j)
        j = _max(_min(j, ir.const(dim - 1)), ir.const(0))
    return fn(idx[:axis] + [j] + idx[axis + r:])
  reads = x.reads | (table.reads if table is not None else frozenset())
  return [Lazy(out_spec(ctx, node).shape, x.dtype, gathered, red=x.red, cost=x.cost + 1, reads=reads)]


# ------------------------------------------------------------------------------------------- reductions

def overlap(K, strides, dil) -> int:
  """How many windows read each input element (1 for a patchify conv whose stride equals its kernel)."""
  return max(1, math.prod(-(-((k - 1) * d + 1) // s) for k, s, d in zip(K, strides, dil)))


def padded_input(ctx, x: Lazy, pads_begin, pads_end, value):
  """x (N, C, *spatial) for windows that pad it with the reduction's identity (`value`). Returns (x, pads_begin,
  pads_end) for the windows over the result. A value some kernel must compute first anyway (it holds a
  reduction, or it is an expression whose loads are not affine along the rows, such as a channel shuffle the
  windows could not read as vectors) is computed straight into a padded buffer whose border that kernel also
  fills, so the windows read it without gates (no padding left), unless that costs a reduction the long vector
  axis its plain store would have (_short_rows_merge): it is then realized plainly and read through gated
  loads. Anything else (a value in a buffer already, a pending BLAS result, an affine expression) is read
  through gated loads where the windows cross the border: no kernel copies it into a padded buffer, and the
  vector path evaluates the gates lane by lane only in the tiles that cross it."""
  if not any(pads_begin) and not any(pads_end):
    return x, pads_begin, pads_end
  nd = len(pads_begin)
  if x.view is None and x.red == "reduce" and _short_rows_merge(x, ctx.target.get("vl", 16)):
    return ctx.realize(x), pads_begin, pads_end
  if x.view is None and (x.red == "reduce" or (x.red is None and not _affine_rows(x, pads_begin, pads_end))):
    return ctx.padded_home(x, list(pads_begin), list(pads_end), value), [0] * nd, [0] * nd
  return x, pads_begin, pads_end


PADDED_STORE_MIN_LANES = 0.8   # the share of vector lanes a row-tiled store into a padded buffer must keep


def row_lanes(w: int, vl: int, narrow: bool = True) -> float:
  """The share of the native vl lanes that rows w wide keep busy when tiled along themselves (narrow vectors for
  a row shorter than vl, unless narrow=False; an overlapping last tile otherwise); 1.0 for a row a vector cannot
  tile at all."""
  lanes = opt.lanes_for(w, vl, narrow)
  return w / (-(-w // lanes) * vl) if lanes else 1.0


def short_rows(w: int, vl: int) -> bool:
  return row_lanes(w, vl) < PADDED_STORE_MIN_LANES


def _short_rows_merge(x: Lazy, vl: int) -> bool:
  """Whether a reduction stored into a padded buffer would give up vector lanes that its plain store keeps: its
  rows are short for the vector (tiled with narrow or overlapping vectors that keep less than
  PADDED_STORE_MIN_LANES of the native lanes busy), while the plain store merges them into one long affine axis (a 1x1 conv's pixels:
  each load's index stays free of div/mod over the merged position). Such a value is realized plainly, and the
  windows read it through gated loads, which cost only the tiles that cross the border."""
  if len(x.shape) < 2:
    return False
  h, w = x.shape[-2:]
  if h < 2 or not short_rows(w, vl):
    return False
  u = ir.var("_rows", h * w)
  idx = [ir.var(f"_lead{d}", s) for d, s in enumerate(x.shape[:-2])] + [ir.idiv(u, w), ir.imod(u, w)]
  return not opt.has_divmod(x.at(idx), u)


def _affine_rows(x: Lazy, pads_begin, pads_end) -> bool:
  """Whether every load of x's expression, read at padded window positions through gated loads, is affine in
  the last axis (what a vector along a row needs: an index computed by div/mod over a position that may lie
  in the padding, as a reshape's is, is not)."""
  lead = len(x.shape) - len(pads_begin)
  sizes = x.shape[lead:]
  # a window position as the windows form it: an output position plus a tap, less the padding before
  rows = [ir.var(f"_row{d}", s) for d, s in enumerate(sizes)]
  taps = [ir.var(f"_tap{d}", b + e + 1) for d, (b, e) in enumerate(zip(pads_begin, pads_end))]
  pos = [ir.add(r, k, -b) for r, k, b in zip(rows, taps, pads_begin)]
  t = rows[-1]
  if t.op != "VAR":
    return True
  idx = [ir.var(f"_lead{d}", s) for d, s in enumerate(x.shape[:lead])] + pos
  e = gate_loads(x.at(idx), window_gate(pos, sizes, pads_begin, pads_end))
  return all(ir.coef(n.srcs[0], t) is not None for n in ir.walk(e) if n.op == "LOAD")


def window_gate(pos: list[E], sizes, pads_begin, pads_end) -> E:
  """Validity of window positions: only the bounds padding can cross are tested (lower ones where there is
  padding before, upper ones where windows run past the end)."""
  conds = []
  for p, sz, b, e in zip(pos, sizes, pads_begin, pads_end):
    if b > 0:
      conds.append(ir.alu("ge", p, ir.const(0)))
    if e > 0:
      conds.append(ir.alu("lt", p, ir.const(sz)))
  return ir.all_of(*conds)


def _reduce_axes(node, specs, consts) -> list[int] | None:
  rank = len(specs[0].shape)
  if "axes" in node.attrs:
    axes = list(node.attrs["axes"])
  elif len(consts) > 1 and consts[1] is not None:
    axes = [int(v) for v in consts[1]]
  else:
    axes = []
  if not axes:
    return None if int(node.attrs.get("noop_with_empty_axes", 0)) else list(range(rank))
  return sorted({a % rank for a in axes})


def reduce_lazy(ctx, x: Lazy, axes: list[int], op: str, keep: bool, body=None, gate_fn=None) -> Lazy:
  """Reduction of x over axes: the output index maps onto the kept axes, a fresh variable runs each reduced
  axis. body(value) shapes the summand (e.g. x * x), op is a REDUCE op."""
  x = ctx.prologue(x, 1)
  rank = len(x.shape)
  out_shape = tuple(1 if d in axes else s for d, s in enumerate(x.shape)) if keep else \
      tuple(s for d, s in enumerate(x.shape) if d not in axes)
  fn, uid = x.fn, ctx.uid()

  def f(idx):
    full, it = [], iter(idx)
    rv = []
    for d in range(rank):
      if d in axes:
        if keep:
          next(it)
        v = ir.var(f"r{uid}_{d}", x.shape[d])
        rv.append(v)
        full.append(v)
      else:
        full.append(next(it))
    val = fn(full)
    return ir.reduce(op, rv, body(val) if body else val)
  return Lazy(out_shape, x.dtype if op not in ("argmax", "argmin", "argmax_last", "argmin_last") else INDEX, f,
              red="reduce", cost=x.cost + 1, reads=x.reads)


REDUCERS = {"ReduceSum": "sum", "ReduceMean": "sum", "ReduceMax": "max", "ReduceMin": "min", "ReduceProd": "prod",
            "ReduceSumSquare": "sum", "ReduceL1": "sum", "ReduceL2": "sum", "ReduceLogSum": "sum",
            "ReduceLogSumExp": "sum"}


@rule(*REDUCERS)
def reduce_op(ctx, node, ins, specs, consts):
  op = node.op
  x = ins[0]
  dt = specs[0].dtype
  axes = _reduce_axes(node, specs, consts)
  if axes is None:
    return [x]
  if op in ("ReduceMean", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp") and dt.kind != "f":
    raise NotLowered(op)
  keep = bool(int(node.attrs.get("keepdims", 1)))
  body = {"ReduceSumSquare": lambda v: ir.alu("mul", v, v), "ReduceL1": lambda v: ir.alu("abs", v),
          "ReduceL2": lambda v: ir.alu("mul", v, v), "ReduceLogSumExp": lambda v: ir.alu("exp", v)}.get(op)
  r = reduce_lazy(ctx, x, axes, REDUCERS[op], keep, body)
  n = math.prod(specs[0].shape[a] for a in axes)
  post = {"ReduceMean": lambda v: ir.alu("mul", v, c(1.0 / n, dt)) if n else ir.alu("div", v, c(0, dt)),
          "ReduceL2": lambda v: ir.alu("sqrt", v), "ReduceLogSum": lambda v: ir.alu("log", v),
          "ReduceLogSumExp": lambda v: ir.alu("log", v)}.get(op)
  if op == "ReduceMean":
    post = lambda v: ir.alu("div", v, c(n, dt))  # noqa: E731  (numpy's mean divides by the count)
  return [combine(post, [r]) if post else r]


@rule("ArgMax", "ArgMin")
def argmax(ctx, node, ins, specs, consts):
  x = ins[0]
  axis = int(node.attrs.get("axis", 0)) % len(x.shape)
  keep = bool(int(node.attrs.get("keepdims", 1)))
  op = ("argmax" if node.op == "ArgMax" else "argmin") + ("_last" if int(node.attrs.get("select_last_index", 0))
                                                           else "")
  return [reduce_lazy(ctx, x, [axis], op, keep)]


@rule("GlobalAveragePool", "GlobalMaxPool")
def global_pool(ctx, node, ins, specs, consts):
  x = ins[0]
  axes = list(range(2, len(x.shape)))
  is_avg = node.op == "GlobalAveragePool"
  if is_avg and x.dtype.kind != "f":
    raise NotLowered(node.op)
  r = reduce_lazy(ctx, x, axes, "sum" if is_avg else "max", True)
  if not is_avg:
    return [r]
  n = math.prod(x.shape[2:])
  return [combine(lambda v: ir.alu("mul", v, c(1.0 / n, x.dtype)), [r])]


@rule("MaxPool", "AveragePool")
def pool(ctx, node, ins, specs, consts):
  attrs = node.attrs
  x = ins[0]
  N, C, *S = x.shape
  K = list(attrs["kernel_shape"])
  ceil_mode = bool(attrs.get("ceil_mode", 0))
  out_sp, pb, pe, need_end, strides, dil = window_geometry(node.op, attrs, S, K, ceil_mode)
  if len(node.outputs) > 1 or int(attrs.get("_n_outputs", 1)) > 1:
    raise NotLowered("pool with indices")
  is_max = node.op == "MaxPool"
  if not is_max and x.dtype.kind != "f":
    raise NotLowered("integer average pool")
  dt = x.dtype
  recip = None
  if not is_max:
    recip_arr = avg_pool_divisors(S, K, pb, pe, need_end, out_sp, strides, dil,
                                  int(attrs.get("count_include_pad", 0)) == 1, dt)
    recip = recip_arr.reshape(-1)[0].item() if np.all(recip_arr == recip_arr.reshape(-1)[0]) else \
        Lazy.of_buffer(ctx.const_buf(recip_arr), ir.View.contiguous(recip_arr.shape))
  fill = (-math.inf if dt.kind == "f" else int(np.iinfo(dt).min)) if is_max else 0
  x, pb, need_end = padded_input(ctx, x, pb, need_end, fill)   # padding: a padded buffer or gated loads
  x = ctx.prologue(x, overlap(K, strides, dil))
  S = list(x.shape[2:])
  fn, uid = x.fn, ctx.uid()

  def f(idx):
    n, ch, *o = idx
    rv = [ir.var(f"r{uid}_{d}", k) for d, k in enumerate(K)]
    pos = [ir.add(ir.mul(od, s), ir.mul(r, dl), -p) for od, r, s, dl, p in zip(o, rv, strides, dil, pb)]
    gate = window_gate(pos, S, pb, need_end)
    val = gate_loads(fn([n, ch] + pos), gate)
    return ir.reduce("max" if is_max else "sum", rv, val, gate)
  r = Lazy((N, C) + tuple(out_sp), dt, f, red="reduce", cost=x.cost + 1, reads=x.reads)
  if recip is None:
    return [r]
  if isinstance(recip, float):
    return [combine(lambda v: ir.alu("mul", v, c(recip, dt)), [r])]
  return [combine(lambda v, w: ir.alu("mul", v, w), [r, recip.broadcast_to(r.shape)])]


ROW_INNER_MIN_VECTORS = 12   # reduced vectors per row from which a row reduction's lanes run along the row


def _row_tags(ctx, x: Lazy, axes: list[int], op: str, what: str) -> dict:
  """Tags of a realized row reduction: lanes along the row (the lowering asks for "inner": vector loads of one
  sequential stream, partial sums per lane) where the reduced axes are x's trailing ones and span at least
  ROW_INNER_MIN_VECTORS vectors; lanes across rows otherwise (each lane sums its own row in order, its loads
  gathered: short rows would leave an inner reduction's lanes idle in their remainders and final combines)."""
  trailing = axes == list(range(len(x.shape) - len(axes), len(x.shape)))
  long_rows = math.prod(x.shape[a] for a in axes) >= ROW_INNER_MIN_VECTORS * ctx.target.get("vl", 16)
  return {"ops": [f"{op} ({what})"], **({"vector_reduce": True} if trailing and long_rows else {})}


@rule("Softmax", "LogSoftmax", "Hardmax")
def softmax(ctx, node, ins, specs, consts):
  x = ctx.prologue(ins[0], 3)
  rank = len(x.shape)
  opset = int(node.attrs.get("_opset", 13))
  axis = int(node.attrs.get("axis", -1 if opset >= 13 else 1)) % rank
  axes = [axis] if opset >= 13 else list(range(axis, rank))
  if x.dtype.kind != "f":
    raise NotLowered(node.op)
  fn, uid, dt = x.fn, ctx.uid(), x.dtype

  def sub_idx(idx, tag):
    rv = {d: ir.var(f"r{uid}{tag}_{d}", x.shape[d]) for d in axes}
    return [rv.get(d, i) for d, i in enumerate(idx)], list(rv.values())

  if node.op == "Hardmax":  # one-hot of the first maximum along the (flattened) axes
    def hard(idx):
      if len(axes) != 1:
        raise NotLowered("legacy Hardmax over several axes")
      full, rv = sub_idx(idx, "a")
      am = ir.reduce("argmax", rv, fn(full))
      return ir.cast(ir.alu("eq", idx[axis], am), dt)
    if len(axes) != 1:
      raise NotLowered("legacy Hardmax over several axes")
    return [Lazy(x.shape, dt, hard, red="reduce", cost=x.cost + 2, reads=x.reads)]

  # three kernels: the max and the sum of exp(x - max) each realized per row (a kernel of one reduction runs it
  # in vector lanes), then the elementwise result. One kernel holding both reductions had no vector schedule.
  m = ctx.realize(reduce_lazy(ctx, x, axes, "max", True), tags=_row_tags(ctx, x, axes, node.op, "max"))
  shifted = combine(lambda v, mv: ir.alu("sub", v, mv), [x, m])
  s = ctx.realize(reduce_lazy(ctx, shifted, axes, "sum", True, lambda v: ir.alu("exp", v)), tags=_row_tags(ctx, x, axes, node.op, "sum"))
  if node.op == "LogSoftmax":
    return [combine(lambda d, sv: ir.alu("sub", d, ir.alu("log", sv)), [shifted, s])]
  return [combine(lambda d, sv: ir.alu("div", ir.alu("exp", d), sv), [shifted, s])]


@rule("LRN")
def lrn(ctx, node, ins, specs, consts):
  x = ctx.prologue(ins[0], int(node.attrs["size"]))
  size = int(node.attrs["size"])
  alpha, beta, bias = (float(node.attrs.get("alpha", 1e-4)), float(node.attrs.get("beta", 0.75)),
                       float(node.attrs.get("bias", 1.0)))
  C = x.shape[1]
  lo = (size - 1) // 2
  fn, uid, dt = x.fn, ctx.uid(), x.dtype

  def f(idx):
    r = ir.var(f"r{uid}", size)
    ch = ir.add(idx[1], r, -lo)
    gate = ir.all_of(ir.alu("ge", ch, ir.const(0)), ir.alu("lt", ch, ir.const(C)))
    v = gate_loads(fn([idx[0], ch] + idx[2:]), gate)
    s = ir.reduce("sum", [r], ir.alu("mul", v, v), gate)
    den = pow_const(ir.alu("add", ir.alu("mul", s, c(alpha / size, dt)), c(bias, dt)), float(np.asarray(beta, dt)))
    return ir.alu("div", fn(idx), den)
  return [Lazy(x.shape, dt, f, red="reduce", cost=x.cost + 4, reads=x.reads)]


@rule("BatchNormalization")
def batchnorm(ctx, node, ins, specs, consts):
  if any(v is None for v in consts[1:5]) or int(node.attrs.get("training_mode", 0)) or len(node.outputs) > 1:
    raise NotLowered("BatchNormalization with run-time parameters")
  x = ins[0]
  a, b = bn_affine(*consts[1:5], float(node.attrs.get("epsilon", 1e-5)))
  shape_c = (x.shape[1],) + (1,) * (len(x.shape) - 2)
  la = Lazy.of_buffer(ctx.const_buf(a.astype(x.dtype)), ir.View.contiguous((x.shape[1],))).reshape(shape_c)
  lb = Lazy.of_buffer(ctx.const_buf(b.astype(x.dtype)), ir.View.contiguous((x.shape[1],))).reshape(shape_c)
  return [ew(ctx, lambda v, s, t: ir.alu("add", ir.alu("mul", v, s), t), [x, la, lb], cost=2)]


def _row_stats(ctx, x: Lazy, axes: list[int], spread, op: str) -> tuple[Lazy, Lazy]:
  """(mean, spread(var)) over axes, each realized per row (keepdims) by a kernel of one reduction, which runs in
  vector lanes; one kernel holding both reductions (the variance's nests the mean) had no vector schedule. The
  variance is two-pass, as numpy computes it: the mean of (x - mean)^2."""
  n = math.prod(x.shape[a] for a in axes)
  dt = x.dtype
  mean = ctx.realize(combine(lambda v: ir.alu("div", v, c(n, dt)), [reduce_lazy(ctx, x, axes, "sum", True)]),
                     tags=_row_tags(ctx, x, axes, op, "mean"))
  centered = combine(lambda v, m: ir.alu("sub", v, m), [x, mean])
  sq = reduce_lazy(ctx, centered, axes, "sum", True, lambda v: ir.alu("mul", v, v))
  spread_of = ctx.realize(combine(lambda v: spread(ir.alu("div", v, c(n, dt))), [sq]), tags=_row_tags(ctx, x, axes, op, "variance"))
  return mean, spread_of


@rule("InstanceNormalization")
def instance_norm(ctx, node, ins, specs, consts):
  x = ctx.prologue(ins[0], 3)
  if x.dtype.kind != "f":
    raise NotLowered(node.op)
  eps = float(node.attrs.get("epsilon", 1e-5))
  dt = x.dtype
  mean, den = _row_stats(ctx, x, list(range(2, len(x.shape))), lambda v: ir.alu("sqrt", ir.alu("add", v, c(eps, dt))),
                         node.op)
  shape_c = (x.shape[1],) + (1,) * (len(x.shape) - 2)
  sc, bi = ctx.plain(ins[1]).reshape(shape_c), ctx.plain(ins[2]).reshape(shape_c)
  return [combine(lambda v, m, d, s, b: ir.alu("add", ir.alu("mul", ir.alu("div", ir.alu("sub", v, m), d), s), b),
                  [x, mean, den, sc, bi])]


@rule("GroupNormalization")
def group_norm(ctx, node, ins, specs, consts):
  """x seen as (N, groups, the rest) normalised per row as InstanceNormalization does, then scaled per channel
  (opset 21) or per group (opset 18's definition, each group's value repeated over its channels)."""
  x = ctx.prologue(ins[0], 3)
  if x.dtype != np.float32:   # the reference computes a float16 input's statistics in float32 (stash_type)
    raise NotLowered(node.op)
  G, eps, dt = int(node.attrs["num_groups"]), float(node.attrs.get("epsilon", 1e-5)), x.dtype
  N, C = x.shape[:2]
  xg = x.reshape((N, G, math.prod(x.shape[1:]) // G))
  mean, den = _row_stats(ctx, xg, [2], lambda v: ir.alu("sqrt", ir.alu("add", v, c(eps, dt))), node.op)
  normed = combine(lambda v, m, d: ir.alu("div", ir.alu("sub", v, m), d), [xg, mean, den]).reshape(x.shape)
  shape_c = (C,) + (1,) * (len(x.shape) - 2)

  def per_channel(lz: Lazy) -> Lazy:
    if lz.shape == (C,):
      return lz.reshape(shape_c)
    return lz.reshape((G, 1)).expand((G, C // G)).reshape(shape_c)
  sc, bi = per_channel(ctx.plain(ins[1])), per_channel(ctx.plain(ins[2]))
  return [combine(lambda v, s, b: ir.alu("add", ir.alu("mul", v, s), b), [normed, sc, bi])]


@rule("LayerNormalization")
def layer_norm(ctx, node, ins, specs, consts):
  x = ctx.prologue(ins[0], 3)
  if x.dtype.kind != "f":
    raise NotLowered(node.op)
  rank = len(x.shape)
  axis = int(node.attrs.get("axis", -1)) % rank
  eps = float(node.attrs.get("epsilon", 1e-5))
  dt = x.dtype
  mean, inv = _row_stats(ctx, x, list(range(axis, rank)),
                         lambda v: ir.alu("recip", ir.alu("sqrt", ir.alu("add", v, c(eps, dt)))), node.op)
  srcs = [x, mean, inv, ctx.plain(ins[1])] + ([ctx.plain(ins[2])] if len(ins) > 2 and ins[2] is not None else [])

  def f(v, m, i, s, b=None):
    y = ir.alu("mul", ir.alu("mul", ir.alu("sub", v, m), i), s)
    return ir.alu("add", y, b) if b is not None else y
  outs = [combine(f, srcs, shape=x.shape)]
  for o, stat in zip(node.outputs[1:], (mean, inv)):
    sdt = ctx.specs[o].dtype if o else dt
    outs.append(combine(lambda v, t=sdt: ir.cast(v, t), [stat], dtype=sdt))
  return outs


# ------------------------------------------------------------------------------------------------ resize

def _source_coords(mode, out_len, in_len, scale):
  """The reference kernel's coordinates (one definition of the modes); a mode it does not know is not lowered."""
  try:
    return source_coords(mode, out_len, in_len, scale)
  except UnsupportedOpError as e:
    raise NotLowered(str(e)) from None


def _nearest(coords, in_len, how):
  fl = np.floor(coords)
  if how == "round_prefer_floor":
    idx = np.where(coords - fl == 0.5, fl, np.round(coords))
  elif how == "round_prefer_ceil":
    idx = np.where(coords - fl == 0.5, np.ceil(coords), np.round(coords))
  elif how == "floor":
    idx = fl
  elif how == "ceil":
    idx = np.ceil(coords)
  else:
    raise NotLowered(f"Resize nearest_mode {how!r}")
  return np.clip(idx, 0, in_len - 1).astype(np.int64)


@rule("Resize", "Upsample")
def resize(ctx, node, ins, specs, consts):
  x = ctx.prologue(_movable(ctx, ins[0]), 4)
  attrs = node.attrs
  mode = attrs.get("mode", "nearest")
  mode = "linear" if mode == "bilinear" else mode
  if mode not in ("nearest", "linear"):
    raise NotLowered(f"Resize mode {mode!r}")
  out_shape = out_spec(ctx, node).shape
  opset = int(attrs.get("_opset", 13))
  if node.op == "Upsample" or opset < 11:
    ctm, nearest_mode = "asymmetric", "floor"
  else:
    ctm = attrs.get("coordinate_transformation_mode", "half_pixel")
    nearest_mode = attrs.get("nearest_mode", "round_prefer_floor")
  scales = [o / i for o, i in zip(out_shape, x.shape)]
  if node.op == "Upsample":
    sc = list(attrs["scales"]) if "scales" in attrs else [float(v) for v in consts[1]]
    scales = sc
  elif opset < 11:
    scales = [float(v) for v in consts[1]]
  elif not (len(consts) > 3 and consts[3] is not None and consts[3].size):
    sc = consts[2] if len(consts) > 2 else None
    if sc is not None and sc.size:
      scales = [float(v) for v in sc]
  plan = []  # per axis: None, or (index table, second index table or None, weight table or None)
  for i, o, s in zip(x.shape, out_shape, scales):
    if i == o and s == 1.0:
      plan.append(None)
      continue
    crd = _source_coords(ctm, o, i, s)
    if mode == "nearest":
      plan.append((_nearest(crd, i, nearest_mode), None, None))
    else:
      crd = np.clip(crd, 0, i - 1)
      i0 = np.floor(crd).astype(np.int64)
      plan.append((i0, np.minimum(i0 + 1, i - 1), (crd - i0).astype(x.dtype)))
  tables = []
  for p in plan:
    if p is None:
      tables.append(None)
      continue
    bufs = [Lazy.of_buffer(ctx.const_buf(a), ir.View.contiguous(a.shape)) if a is not None else None for a in p]
    tables.append(bufs)
  fn, dt = x.fn, x.dtype

  def f(idx):
    terms = [(list(idx), None)]  # (source index, weight)
    for d, t in enumerate(tables):
      if t is None:
        terms = [(ix[:d] + [idx[d]] + ix[d + 1:], w) for ix, w in terms]
        continue
      i0 = ir.cast(t[0].at([idx[d]]), INDEX)
      if t[1] is None:
        terms = [(ix[:d] + [i0] + ix[d + 1:], w) for ix, w in terms]
        continue
      i1, wt = ir.cast(t[1].at([idx[d]]), INDEX), t[2].at([idx[d]])
      one_minus = ir.alu("sub", c(1, dt), wt)
      new = []
      for ix, w in terms:
        new.append((ix[:d] + [i0] + ix[d + 1:], one_minus if w is None else ir.alu("mul", w, one_minus)))
        new.append((ix[:d] + [i1] + ix[d + 1:], wt if w is None else ir.alu("mul", w, wt)))
      terms = new
    if mode == "nearest":
      return fn(terms[0][0])
    total = None
    for ix, w in terms:
      v = fn(ix) if w is None else ir.alu("mul", fn(ix), w)
      total = v if total is None else ir.alu("add", total, v)
    return total
  reads = x.reads | frozenset(b.view[0] for t in tables if t for b in t if b is not None)
  return [Lazy(out_shape, dt, f, red=x.red, cost=x.cost + 4, reads=reads)]


# ------------------------------------------------------------------------------------ Tensor frontend ops

@rule("_Copy")
def copy(ctx, node, ins, specs, consts):
  """A real copy (Tensor.clone): realized now, so a later assign to its source cannot change it."""
  return [ctx.realize(combine(lambda a: a, [ins[0]], cost=0))]


@rule("_Assign")
def assign(ctx, node, ins, specs, consts):
  """Write input 0 into the held (or input) buffer named by attrs['target']; readers of the old content ran
  first (the lowering orders them before this node and realizes them before the write)."""
  target = node.attrs["target"]
  dst = ctx.values[target]
  value = ins[0]
  if dst.view[0] in value.reads:  # reads what it overwrites: compute into a temporary first
    value = ctx.realize(combine(lambda a: a, [value], cost=0))
  ctx.emit_store(value.broadcast_to(dst.shape), dst.view[0], dst.view[1], {"ops": ["_Assign"]})
  return [dst]
