"""Our own decompositions of ONNX ops that no kernel implements and whose schema gives no function body:
each op becomes ONNX nodes of ops the compiler lowers (Cast, Mul, Round, Reshape ...), built at import from the
node, its attributes and its inputs' static types, and checked like any node of the model.

Invariants: a decomposition computes what onnx's reference kernel computes, in the same dtypes (numpy's
promotion where the reference relies on it), so the cases it makes pass agree within their tolerance; it needs
static shapes only where the reference's result shape does, and refuses (UnsupportedOpError or
UnsupportedDtypeError naming the op and the reason) what it does not cover; a model that breaks the op's spec
(an axis out of range, a scale that fits no quantisation layout) is a ModelError. Every value it makes is named
under a per-node prefix, so no name can collide with the model's."""
from __future__ import annotations

from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .errors import ModelError, UnsupportedDtypeError, UnsupportedOpError
from .graph import ONNX_DTYPE_NAMES, ONNX_DTYPES
from .limits import check_tensor

BODY_OPSET = 18   # the opset the nodes of a decomposition are read under (input-form axes, Round, Cast)
# the most copies of a body a decomposition or the importer writes out (steps of a recurrence or a Scan, batch
# entries): each is a handful of nodes, so a longer loop is refused rather than made into a graph that large
MAX_UNROLL = 4096
DECOMPOSITIONS: dict[str, Callable] = {}


def decomposition(op: str):
  def deco(fn):
    DECOMPOSITIONS[op] = fn
    return fn
  return deco


class Body:
  """The nodes a decomposition emits, named under `prefix`."""

  def __init__(self, node: onnx.NodeProto, types: dict, where: str, prefix: str, opset: int):
    self.node, self.types, self.where, self.prefix, self.opset = node, types, where, prefix, opset
    self.nodes: list[onnx.NodeProto] = []
    self.attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    self.n = 0

  def name(self) -> str:
    self.n += 1
    return f"{self.prefix}{self.n}"

  def op(self, op_type: str, inputs: list, out: str | None = None, **attrs) -> str:
    out = out or self.name()
    self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
    return out

  def const(self, value) -> str:
    return self.op("Constant", [], value=numpy_helper.from_array(np.asarray(value)))

  def input(self, i: int) -> str:
    return self.node.input[i] if i < len(self.node.input) else ""

  def type_of(self, name: str) -> tuple[int, tuple | None]:
    """(ONNX element type, static shape or None) of a value, from the model's declarations and inference."""
    t = self.types.get(name)
    if t is None or not t.HasField("tensor_type"):
      raise UnsupportedOpError(f"{self.where}: the type of input {name!r} is not known at load")
    tt = t.tensor_type
    shape = None
    if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
      shape = tuple(int(d.dim_value) for d in tt.shape.dim)
    return int(tt.elem_type), shape

  def shape_of(self, name: str) -> tuple:
    shape = self.type_of(name)[1]
    if shape is None:
      raise UnsupportedOpError(f"{self.where}: the shape of input {name!r} is not known at load")
    return shape

  def fits(self, shape, dtype, what: str) -> None:
    """A constant we are about to build from shapes and attributes must fit the memory budget (it is checked
    before numpy allocates it, so absurd attribute values are a MemoryBudgetError, not a MemoryError)."""
    check_tensor(shape, dtype, f"{self.where}: {what}")

  def unrolls(self, n: int, what: str) -> None:
    if n > MAX_UNROLL:
      raise UnsupportedOpError(f"{self.where}: {self.node.op_type} over {n} {what} is not supported (at most {MAX_UNROLL})")

  def dtype(self, code: int, what: str) -> np.dtype:
    if code not in ONNX_DTYPES:
      raise UnsupportedDtypeError(f"{self.where}: {self.node.op_type} {what} of element type "
                                  f"{ONNX_DTYPE_NAMES.get(code, code)} is not supported")
    return ONNX_DTYPES[code]


def decompose(node: onnx.NodeProto, types: dict, where: str, prefix: str, opset: int) -> list[onnx.NodeProto] | None:
  """The nodes standing in for `node` (read under `opset`), or None when we have no decomposition of its op."""
  fn = DECOMPOSITIONS.get(node.op_type)
  if fn is None:
    return None
  b = Body(node, types, where, prefix, opset)
  fn(b)
  return b.nodes


def _code(dt: np.dtype) -> int:
  return helper.np_dtype_to_tensor_dtype(np.dtype(dt))


# ---------------------------------------------------------------- QuantizeLinear, DequantizeLinear

QUANT_RANGES = {TensorProto.UINT8: (0, 255), TensorProto.INT8: (-128, 127), TensorProto.UINT16: (0, 65535),
                TensorProto.INT16: (-32768, 32767)}


def _spread(b: Body, value: str, x_shape: tuple, axis: int, block: int) -> str:
  """A scale or zero point laid over x the way onnx's reference does: a scalar (or one element) as a scalar, a
  vector along `axis`, or (block > 0) blocks of `block` along `axis`, the last block cut to x's extent."""
  shape = b.shape_of(value)
  rank = len(x_shape)
  if len(shape) == 0:
    return value
  if int(np.prod(shape)) == 1:
    return b.op("Reshape", [value, b.const(np.zeros(0, np.int64))])
  if not -rank <= axis < rank:
    raise ModelError(f"{b.where}: axis {axis} out of range for rank {rank}")
  axis %= rank
  if block == 0:
    if len(shape) != 1 or shape[0] != x_shape[axis]:
      raise ModelError(f"{b.where}: a scale or zero point of shape {list(shape)} is neither one value nor one "
                       f"per index of axis {axis} of {list(x_shape)}")
    dims = [1] * rank
    dims[axis] = shape[0]
    return b.op("Reshape", [value, b.const(np.array(dims, np.int64))])
  if block < 0:
    raise ModelError(f"{b.where}: block_size {block} is negative")
  n = shape[axis] if len(shape) == rank else -1
  if len(shape) != rank or any(s != d for i, (s, d) in enumerate(zip(shape, x_shape)) if i != axis) or \
          not (n - 1) * block < x_shape[axis] <= n * block:
    raise ModelError(f"{b.where}: a blocked scale or zero point of shape {list(shape)} does not cover "
                     f"{list(x_shape)} in blocks of {block} along axis {axis}")
  wide = shape[:axis + 1] + (block,) + shape[axis + 1:]
  rep = b.op("Expand", [b.op("Unsqueeze", [value, b.const(np.array([axis + 1], np.int64))]),
                        b.const(np.array(wide, np.int64))])
  full = shape[:axis] + (n * block,) + shape[axis + 1:]
  flat = b.op("Reshape", [rep, b.const(np.array(full, np.int64))])
  if n * block == x_shape[axis]:
    return flat
  return b.op("Slice", [flat, b.const(np.array([0], np.int64)), b.const(np.array([x_shape[axis]], np.int64)),
                        b.const(np.array([axis], np.int64))])


@decomposition("DequantizeLinear")
def dequantize_linear(b: Body):
  """y = (float32(x) - zero_point) * scale, as the reference computes it (in float32, or float64 where numpy
  promotes float32 with a 32-bit integer zero point), then cast to the scale's type or output_dtype."""
  x, scale, zp = b.input(0), b.input(1), b.input(2)
  xt, x_shape = b.type_of(x)[0], b.shape_of(x)
  b.dtype(xt, "input")
  st = b.type_of(scale)[0]
  b.dtype(st, "scale")
  out_t = int(b.attrs.get("output_dtype", 0)) or st
  b.dtype(out_t, "output")
  axis, block = int(b.attrs.get("axis", 1)), int(b.attrs.get("block_size", 0))
  if zp and b.type_of(zp)[0] != xt:
    raise ModelError(f"{b.where}: the zero point's type {ONNX_DTYPE_NAMES.get(b.type_of(zp)[0])} differs from the input's")
  # the reference takes x to float32 first, then numpy promotes float32 with a 32-bit integer zero point to float64
  calc = TensorProto.DOUBLE if zp and ONNX_DTYPES[xt].itemsize >= 4 else TensorProto.FLOAT
  dx = b.op("Cast", [x], to=TensorProto.FLOAT)
  if calc != TensorProto.FLOAT:
    dx = b.op("Cast", [dx], to=calc)
  if zp:
    dx = b.op("Sub", [dx, b.op("Cast", [_spread(b, zp, x_shape, axis, block)], to=calc)])
  y = b.op("Mul", [dx, b.op("Cast", [_spread(b, scale, x_shape, axis, block)], to=calc)])
  b.op("Cast", [y], out=b.node.output[0], to=out_t)


@decomposition("QuantizeLinear")
def quantize_linear(b: Body):
  """y = clip(rint(x / scale) + zero_point) to the output type's range, as the reference computes it: the
  division in numpy's promotion of x's and the scale's types (or `precision`), rounding half to even, the sum in
  int32. Integer outputs of 8 and 16 bits only (the float8, 4- and 2-bit types are refused)."""
  x, scale, zp = b.input(0), b.input(1), b.input(2)
  xt = b.type_of(x)[0]
  st = b.type_of(scale)[0]
  x_shape = b.shape_of(x)
  out_t = int(b.attrs.get("output_dtype", 0))
  if zp:
    zt = b.type_of(zp)[0]
    if out_t and out_t != zt:
      raise ModelError(f"{b.where}: output_dtype {out_t} differs from the zero point's type {zt}")
    out_t = zt
  out_t = out_t or TensorProto.UINT8
  if out_t not in QUANT_RANGES:
    raise UnsupportedDtypeError(f"{b.where}: QuantizeLinear to {ONNX_DTYPE_NAMES.get(out_t, out_t)} is not supported "
                                f"(only uint8, int8, uint16, int16)")
  precision = int(b.attrs.get("precision", 0))
  calc_dt = b.dtype(precision, "precision") if precision else \
      np.result_type(b.dtype(xt, "input"), b.dtype(st, "scale"))
  calc = _code(calc_dt)
  axis, block = int(b.attrs.get("axis", 1)), int(b.attrs.get("block_size", 0))
  q = b.op("Div", [b.op("Cast", [x], to=calc), b.op("Cast", [_spread(b, scale, x_shape, axis, block)], to=calc)])
  i = b.op("Cast", [b.op("Round", [q])], to=TensorProto.INT32)
  if zp:
    i = b.op("Add", [i, b.op("Cast", [_spread(b, zp, x_shape, axis, block)], to=TensorProto.INT32)])
  lo, hi = QUANT_RANGES[out_t]
  i = b.op("Min", [b.op("Max", [i, b.const(np.int32(lo))]), b.const(np.int32(hi))])
  b.op("Cast", [i], out=b.node.output[0], to=out_t)


# ---------------------------------------------------------------- RNN, GRU, LSTM

RNN_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
RNN_DEFAULT_ACTIVATIONS = {"RNN": ["tanh"], "GRU": ["sigmoid", "tanh"], "LSTM": ["sigmoid", "tanh", "tanh"]}


def _i64(*v) -> np.ndarray:
  return np.array(v, np.int64)


def _part(b: Body, value: str, axis: int, start: int, end: int) -> str:
  return b.op("Slice", [value, b.const(_i64(start)), b.const(_i64(end)), b.const(_i64(axis))])


def _row(b: Body, value: str, i: int) -> str:
  """value[i] (the first axis taken away)."""
  return b.op("Gather", [value, b.const(np.int64(i))], axis=0)


@decomposition("RNN")
@decomposition("GRU")
@decomposition("LSTM")
def recurrent(b: Body):
  """The recurrence unrolled over the sequence (its length is static): per step one MatMul of the state with
  the recurrent weights, the input's product with the input weights done for every step in one MatMul first,
  the gates in the order and form of onnx's reference (GRU's linear_before_reset both ways, LSTM's peepholes).
  With sequence_lens (forward only), as the spec reads: past its length a batch entry keeps its state and outputs
  zeros. The reference ignores clip and any activations but the defaults, so we refuse those rather than compute
  something it does not; input_forget likewise."""
  op, G = b.node.op_type, RNN_GATES[b.node.op_type]
  X, W, R, B, seq_lens, init_h = (b.input(i) for i in range(6))
  init_c, P = (b.input(6), b.input(7)) if op == "LSTM" else ("", "")
  direction = b.attrs.get("direction", b"forward")
  direction = direction.decode() if isinstance(direction, bytes) else direction
  if direction not in ("forward", "reverse", "bidirectional"):
    raise ModelError(f"{b.where}: direction {direction!r} is not forward, reverse or bidirectional")
  nd = 2 if direction == "bidirectional" else 1
  if seq_lens and direction != "forward":
    raise UnsupportedOpError(f"{b.where}: {op} with sequence_lens in direction {direction!r} is not supported")
  if "clip" in b.attrs:
    raise UnsupportedOpError(f"{b.where}: {op} with clip is not supported")
  if int(b.attrs.get("input_forget", 0)):
    raise UnsupportedOpError(f"{b.where}: LSTM with input_forget is not supported")
  acts = [a.decode() if isinstance(a, bytes) else a for a in b.attrs.get("activations", [])]
  if acts and [a.lower() for a in acts] != RNN_DEFAULT_ACTIVATIONS[op] * nd:
    raise UnsupportedOpError(f"{b.where}: {op} activations {acts} are not supported (only the defaults)")
  if "activation_alpha" in b.attrs or "activation_beta" in b.attrs:
    raise UnsupportedOpError(f"{b.where}: {op} with activation_alpha or activation_beta is not supported")
  layout = int(b.attrs.get("layout", 0))
  if layout not in (0, 1):
    raise ModelError(f"{b.where}: layout {layout} is not 0 or 1")
  xt, xs = b.type_of(X)[0], b.shape_of(X)
  x_dt = b.dtype(xt, "input")
  ws, rs = b.shape_of(W), b.shape_of(R)
  if len(xs) != 3 or len(ws) != 3 or len(rs) != 3:
    raise ModelError(f"{b.where}: X {list(xs)}, W {list(ws)} and R {list(rs)} must be 3-D")
  seq, batch = (xs[1], xs[0]) if layout else (xs[0], xs[1])
  H = rs[2]
  if ws[0] != nd or rs[0] != nd or ws[1] != G * H or rs[1] != G * H or ws[2] != xs[2] or \
          int(b.attrs.get("hidden_size", H)) != H:
    raise ModelError(f"{b.where}: W {list(ws)} and R {list(rs)} do not fit {nd} direction(s), {G} gate(s), "
                     f"hidden size {b.attrs.get('hidden_size', H)} and X {list(xs)}")
  if seq == 0:
    raise UnsupportedOpError(f"{b.where}: {op} over an empty sequence is not supported")
  b.unrolls(seq * nd, "steps")
  swap = {"perm": [1, 0, 2]}
  if layout:
    X = b.op("Transpose", [X], **swap)
    init_h = b.op("Transpose", [init_h], **swap) if init_h else ""
    init_c = b.op("Transpose", [init_c], **swap) if init_c else ""
  zeros = b.const(np.zeros((batch, H), x_dt))
  ys, hs, cs = [], [], []
  for d in range(nd):
    WT = b.op("Transpose", [_row(b, W, d)])
    Rd = _row(b, R, d)
    XW = b.op("MatMul", [X, WT])                                  # [seq, batch, G*H]
    Wb = Rb = None
    if B:
      Bd = _row(b, B, d)
      Wb, Rb = _part(b, Bd, 0, 0, G * H), _part(b, Bd, 0, G * H, 2 * G * H)
    h = _row(b, init_h, d) if init_h else zeros
    c = (_row(b, init_c, d) if init_c else zeros) if op == "LSTM" else None
    if op == "GRU":
      RzrT, RhT = b.op("Transpose", [_part(b, Rd, 0, 0, 2 * H)]), b.op("Transpose", [_part(b, Rd, 0, 2 * H, 3 * H)])
      bzr = b.op("Add", [_part(b, Wb, 0, 0, 2 * H), _part(b, Rb, 0, 0, 2 * H)]) if B else None
      Wbh, Rbh = (_part(b, Wb, 0, 2 * H, 3 * H), _part(b, Rb, 0, 2 * H, 3 * H)) if B else (None, None)
    else:
      RT = b.op("Transpose", [Rd])
      bsum = b.op("Add", [Wb, Rb]) if B else None
    if op == "LSTM" and P:
      Pd = _row(b, P, d)
      p_i, p_o, p_f = (_part(b, Pd, 0, k * H, (k + 1) * H) for k in range(3))
    out = [None] * seq
    lens = b.op("Unsqueeze", [b.op("Cast", [seq_lens], to=TensorProto.INT64), b.const(_i64(1))]) if seq_lens else None
    for t in (range(seq) if d == 0 and direction != "reverse" else range(seq - 1, -1, -1)):
      h_prev, c_prev = h, c
      xw = _row(b, XW, t)                                         # [batch, G*H]
      if op == "RNN":
        g = b.op("Add", [xw, b.op("MatMul", [h, RT])])
        h = b.op("Tanh", [b.op("Add", [g, bsum]) if B else g])
      elif op == "GRU":
        g = b.op("Add", [_part(b, xw, 1, 0, 2 * H), b.op("MatMul", [h, RzrT])])
        g = b.op("Sigmoid", [b.op("Add", [g, bzr]) if B else g])
        z, r = _part(b, g, 1, 0, H), _part(b, g, 1, H, 2 * H)
        xh = _part(b, xw, 1, 2 * H, 3 * H)
        if int(b.attrs.get("linear_before_reset", 0)):
          hr = b.op("MatMul", [h, RhT])
          pre = b.op("Add", [xh, b.op("Mul", [r, b.op("Add", [hr, Rbh]) if B else hr])])
          pre = b.op("Add", [pre, Wbh]) if B else pre
        else:
          pre = b.op("Add", [xh, b.op("MatMul", [b.op("Mul", [r, h]), RhT])])
          pre = b.op("Add", [b.op("Add", [pre, Wbh]), Rbh]) if B else pre
        hh = b.op("Tanh", [pre])
        one = b.const(np.ones((), x_dt))
        h = b.op("Add", [b.op("Mul", [b.op("Sub", [one, z]), hh]), b.op("Mul", [z, h])])
      else:
        g = b.op("Add", [xw, b.op("MatMul", [h, RT])])
        g = b.op("Add", [g, bsum]) if B else g
        gi, go, gf, gc = (_part(b, g, 1, k * H, (k + 1) * H) for k in range(4))
        if P:
          gi, gf = b.op("Add", [gi, b.op("Mul", [p_i, c])]), b.op("Add", [gf, b.op("Mul", [p_f, c])])
        i, f = b.op("Sigmoid", [gi]), b.op("Sigmoid", [gf])
        c = b.op("Add", [b.op("Mul", [f, c]), b.op("Mul", [i, b.op("Tanh", [gc])])])
        o = b.op("Sigmoid", [b.op("Add", [go, b.op("Mul", [p_o, c])]) if P else go])
        h = b.op("Mul", [o, b.op("Tanh", [c])])
      out[t] = h
      if lens is not None:   # [batch, 1]: this step lies inside the entry's sequence
        valid = b.op("Less", [b.const(np.int64(t)), lens])
        out[t] = b.op("Where", [valid, h, zeros])
        h = b.op("Where", [valid, h, h_prev])
        c = b.op("Where", [valid, c, c_prev]) if c is not None else None
    ys.append(b.op("Concat", [b.op("Unsqueeze", [y, b.const(_i64(0, 1))]) for y in out], axis=0))  # [seq, 1, batch, H]
    hs.append(b.op("Unsqueeze", [h, b.const(_i64(0))]))
    cs.append(b.op("Unsqueeze", [c, b.const(_i64(0))]) if c is not None else None)
  outs = list(b.node.output) + ["", "", ""]
  results = [(outs[0], ys, [2, 0, 1, 3]), (outs[1], hs, [1, 0, 2]), (outs[2] if op == "LSTM" else "", cs, [1, 0, 2])]
  for name, parts, perm in results:
    if not name:
      continue
    axis = 1 if parts is ys else 0
    if layout:
      b.op("Transpose", [b.op("Concat", parts, axis=axis) if nd > 1 else parts[0]], out=name, perm=perm)
    else:
      b.op("Concat", parts, out=name, axis=axis) if nd > 1 else b.op("Identity", [parts[0]], out=name)


# ---------------------------------------------------------------- Einsum

def _einsum_terms(eq: str, ranks: list[int], where: str) -> tuple[list[list[str]], list[str]]:
  """Each operand's labels and the output's, '...' spelled out as labels of their own (digits, which the
  equation cannot use), right-aligned across operands as numpy broadcasts them."""
  eq = eq.replace(" ", "")
  lhs, arrow, rhs = eq.partition("->")
  terms = lhs.split(",")
  if len(terms) != len(ranks) or any(not (c.isalpha() or c in ".,->") for c in eq):
    raise ModelError(f"{where}: equation {eq!r} does not fit {len(ranks)} input(s)")
  widths = []
  for t, r in zip(terms, ranks):
    n = len(t.replace("...", ""))
    if t.count("...") > 1 or ("..." not in t and n != r) or n > r or t.replace("...", "").count("."):
      raise ModelError(f"{where}: term {t!r} of {eq!r} does not fit an input of rank {r}")
    widths.append(r - n if "..." in t else 0)
  E = max(widths, default=0)
  if E > 10:
    raise UnsupportedOpError(f"{where}: Einsum with more than 10 dims under '...' is not supported")
  ell = [str(i) for i in range(E)]
  labels = [list(t.replace("...", "\0")) for t in terms]
  labels = [sum(([*ell[E - w:]] if c == "\0" else [c] for c in ls), []) for ls, w in zip(labels, widths)]
  if arrow:
    if rhs.replace("...", "").count(".") or rhs.count("...") > 1:
      raise ModelError(f"{where}: output term {rhs!r} of {eq!r} is malformed")
    out = sum((ell if c == "\0" else [c] for c in rhs.replace("...", "\0")), [])
  else:   # implicit output: '...' first, then every letter that appears once, in alphabetical order
    counts: dict = {}
    for ls in labels:
      for c in ls:
        counts[c] = counts.get(c, 0) + 1
    out = ell + sorted(c for c, k in counts.items() if k == 1 and c.isalpha())
  if len(set(out)) != len(out) or any(c not in sum(labels, []) for c in out):
    raise ModelError(f"{where}: output labels {out} of {eq!r} repeat or are not among the inputs'")
  return labels, out


@decomposition("Einsum")
def einsum(b: Body):
  """Each operand's repeated labels taken to their diagonal (times an identity mask, summed over one copy),
  the operands laid over one axis per label (Transpose, Unsqueeze), multiplied with broadcasting, summed over
  the labels the output lacks and transposed into the output's order."""
  eq = b.attrs["equation"]
  eq = eq.decode() if isinstance(eq, bytes) else eq
  names = list(b.node.input)
  shapes = [b.shape_of(n) for n in names]
  dt = b.dtype(b.type_of(names[0])[0], "input")
  labels, out = _einsum_terms(eq, [len(s) for s in shapes], b.where)
  order = list(dict.fromkeys(c for ls in labels for c in ls))   # one axis per label, by first appearance
  sizes: dict = {}
  vals = []
  for name, shape, ls in zip(names, shapes, labels):
    ls, shape = list(ls), list(shape)
    for c, d in zip(ls, shape):
      if d != 1 and sizes.setdefault(c, d) != d and sizes[c] != 1:
        raise ModelError(f"{b.where}: label {c!r} of {eq!r} has sizes {sizes[c]} and {d}")
      sizes[c] = max(sizes.get(c, 1), d)
    while len(set(ls)) != len(ls):   # a repeated label: its diagonal
      c = next(c for c in ls if ls.count(c) > 1)
      p, q = ls.index(c), ls.index(c, ls.index(c) + 1)
      if shape[p] != shape[q]:
        raise ModelError(f"{b.where}: repeated label {c!r} of {eq!r} has sizes {shape[p]} and {shape[q]}")
      b.fits((shape[p], shape[p]), dt, "the diagonal's mask")
      mask = np.ones([shape[p] if i in (p, q) else 1 for i in range(len(shape))], dt)
      mask[...] = np.eye(shape[p], dtype=dt).reshape(mask.shape)
      name = b.op("ReduceSum", [b.op("Mul", [name, b.const(mask)]), b.const(_i64(q))], keepdims=0)
      del ls[q], shape[q]
    mine = sorted(ls, key=order.index)
    if mine != ls:
      name = b.op("Transpose", [name], perm=[ls.index(c) for c in mine])
    missing = [i for i, c in enumerate(order) if c not in mine]
    if missing:
      name = b.op("Unsqueeze", [name, b.const(_i64(*missing))])
    vals.append(name)
  y = vals[0]
  for v in vals[1:]:
    y = b.op("Mul", [y, v])
  gone = [i for i, c in enumerate(order) if c not in out]
  kept = [c for c in order if c in out]
  if gone:
    y = b.op("ReduceSum", [y, b.const(_i64(*gone))], keepdims=0)
  perm = [kept.index(c) for c in out]
  if perm != list(range(len(perm))):
    b.op("Transpose", [y], out=b.node.output[0], perm=perm)
  else:
    b.op("Identity", [y], out=b.node.output[0])


# ---------------------------------------------------------------- MatMulInteger, ConvInteger, ReverseSequence

def _int32_less(b: Body, x: str, zp: str, zp_axes: list[int] | None = None) -> str:
  """int32(x) - zp, the zero point broadcast as numpy does (or along zp_axes added to a vector one), as the
  reference kernels compute it."""
  x = b.op("Cast", [x], to=TensorProto.INT32)
  if not zp:
    return x
  z = b.op("Cast", [zp], to=TensorProto.INT32)
  if zp_axes and len(b.shape_of(zp)) == 1:
    z = b.op("Unsqueeze", [z, b.const(_i64(*zp_axes))])
  return b.op("Sub", [x, z])


@decomposition("MatMulInteger")
def matmul_integer(b: Body):
  a, bb = _int32_less(b, b.input(0), b.input(2)), _int32_less(b, b.input(1), b.input(3))
  b.op("MatMul", [a, bb], out=b.node.output[0])


@decomposition("ConvInteger")
def conv_integer(b: Body):
  rank = len(b.shape_of(b.input(1)))
  x = _int32_less(b, b.input(0), b.input(2))
  w = _int32_less(b, b.input(1), b.input(3), list(range(1, rank)))
  b.op("Conv", [x, w], out=b.node.output[0])
  b.nodes[-1].attribute.extend(b.node.attribute)   # as given, whatever their values (the Conv checks them)


@decomposition("ReverseSequence")
def reverse_sequence(b: Body):
  """y[.., t, .., i, ..] = x[.., lens[i] - 1 - t, .., i, ..] for t < lens[i], else x itself: per batch entry a
  Gather along the time axis with indices computed from the run-time lengths (each length clamped into the axis,
  so no index leaves it), the entries concatenated back."""
  x, lens = b.input(0), b.input(1)
  shape = b.shape_of(x)
  rank = len(shape)
  bax, tax = int(b.attrs.get("batch_axis", 1)), int(b.attrs.get("time_axis", 0))
  if rank < 2 or {bax, tax} - {0, 1} or bax == tax:
    raise ModelError(f"{b.where}: batch_axis {bax} and time_axis {tax} must be 0 and 1 of a rank >= 2 input")
  T, N = shape[tax], shape[bax]
  if b.shape_of(lens) != (N,):
    raise ModelError(f"{b.where}: sequence_lens of shape {list(b.shape_of(lens))} is not one length per batch entry ({N})")
  b.unrolls(N, "batch entries")
  t = b.const(np.arange(T, dtype=np.int64).reshape(1, T))
  n = b.op("Unsqueeze", [b.op("Cast", [lens], to=TensorProto.INT64), b.const(_i64(1))])          # [N, 1]
  n = b.op("Min", [b.op("Max", [n, b.const(np.int64(0))]), b.const(np.int64(T))])
  rev = b.op("Sub", [b.op("Sub", [n, b.const(np.int64(1))]), t])
  idx = b.op("Where", [b.op("Less", [t, n]), rev, b.op("Expand", [t, b.const(_i64(N, T))])])      # [N, T]
  parts = []
  for i in range(N):
    xi = _row(b, x, i) if bax == 0 else b.op("Gather", [x, b.const(np.int64(i))], axis=1)     # time axis now 0
    parts.append(b.op("Unsqueeze", [b.op("Gather", [xi, _row(b, idx, i)], axis=0), b.const(_i64(bax))]))
  b.op("Concat", parts, out=b.node.output[0], axis=bax)


# ---------------------------------------------------------------- DFT

def _dft_matrices(n: int, L: int, onesided: bool) -> tuple[np.ndarray, np.ndarray]:
  """C[j, k] = cos(2 pi j k / L) and S[j, k] = sin(2 pi j k / L) in float64, for the n input positions j (those
  past L, which numpy's fft cuts, get zeros) and the L output bins k, or the first L // 2 + 1 when one-sided."""
  j = np.arange(n)[:, None]
  k = np.arange((L // 2 + 1) if onesided else L)[None, :]
  ang = 2 * np.pi * ((j * k) % L) / L
  return np.cos(ang) * (j < L), np.sin(ang) * (j < L)


@decomposition("DFT")
def dft(b: Body):
  """The transform as products with constant cosine and sine matrices along the axis, in float64, cast back to
  the input's type: forward, one-sided forward (the first L // 2 + 1 bins) and one-sided inverse (numpy's
  irfft: a real signal from the first L // 2 + 1 bins, the others taken as their conjugates). The axis and
  dft_length must be known at load."""
  x = b.input(0)
  shape = b.shape_of(x)
  xt = b.type_of(x)[0]
  b.dtype(xt, "input")
  rank = len(shape)
  if b.input(1):
    raise UnsupportedOpError(f"{b.where}: DFT with a dft_length input is not supported")
  if b.input(2):
    raise UnsupportedOpError(f"{b.where}: DFT with an axis input is not supported (its value is known only at run time)")
  axis = int(b.attrs.get("axis", 1 if b.opset < 20 else -2))
  if rank < 2 or shape[-1] not in (1, 2) or not -rank <= axis < rank or axis % rank == rank - 1:
    raise ModelError(f"{b.where}: input {list(shape)} and axis {axis} do not make a signal of real or complex values")
  axis %= rank
  inverse, onesided = bool(b.attrs.get("inverse", 0)), bool(b.attrs.get("onesided", 0))
  n = shape[axis]
  L = 2 * (n - 1) if inverse and onesided else n
  if L <= 0:
    raise UnsupportedOpError(f"{b.where}: DFT of length {L} is not supported")
  b.fits((n, max(L, n)), np.float64, "the transform's matrices")
  perm = [i for i in range(rank - 1) if i != axis] + [axis]
  back = [perm.index(i) for i in range(rank - 1)]
  f64 = b.op("Cast", [x], to=TensorProto.DOUBLE)
  re = b.op("Transpose", [b.op("Gather", [f64, b.const(np.int64(0))], axis=rank - 1)], perm=perm)
  im = b.op("Transpose", [b.op("Gather", [f64, b.const(np.int64(1))], axis=rank - 1)], perm=perm) \
      if shape[-1] == 2 else None

  def mm(v, m):
    return b.op("MatMul", [v, b.const(np.ascontiguousarray(m))])

  def add(p, q, sign=1.0):
    if q is None:
      return p
    return b.op("Add" if sign > 0 else "Sub", [p, q])

  if inverse and onesided:   # irfft: x_j = (sum_k w_k (Re X_k cos - Im X_k sin)) / L over the first L // 2 + 1 bins
    bins = L // 2 + 1
    k = np.arange(n)[:, None]
    j = np.arange(L)[None, :]
    w = np.where((k == 0) | ((L % 2 == 0) & (k == L // 2)), 1.0, 2.0) * (k < bins)
    ang = 2 * np.pi * ((k * j) % L) / L
    C, S = w * np.cos(ang) / L, w * np.sin(ang) / L
    parts = [add(mm(re, C), mm(im, S) if im is not None else None, -1.0)]
  elif inverse:
    # onnx's reference computes this one in single precision (numpy's fft keeps complex64), so the exact zeros
    # of a real signal's round trip come out near 2e-7 there, past its cases' tolerance of 1e-7: refused until
    # a reference of its own can check it
    raise UnsupportedOpError(f"{b.where}: DFT inverse of a two-sided spectrum is not supported")
  else:           # X = sum x e^{-i..}: real re C + im S, imaginary im C - re S
    C, S = _dft_matrices(n, L, onesided)
    real = add(mm(re, C), mm(im, S) if im is not None else None)
    imag = b.op("Neg", [mm(re, S)]) if im is None else b.op("Sub", [mm(im, C), mm(re, S)])
    parts = [real, imag]
  outs = [b.op("Unsqueeze", [b.op("Transpose", [p], perm=back), b.const(_i64(rank - 1))]) for p in parts]
  y = b.op("Concat", outs, axis=rank - 1) if len(outs) > 1 else outs[0]
  b.op("Cast", [y], out=b.node.output[0], to=xt)


@decomposition("QLinearMatMul")
def qlinear_matmul(b: Body):
  """y = saturate(rint((int32(a) - a_zp) @ (int32(b) - b_zp) * (a_scale * b_scale / y_scale) + y_zp)), the
  product's scaling in float64 as numpy promotes the reference's int32 by float; 8-bit outputs only."""
  a, a_s, a_z, bb, b_s, b_z, y_s, y_z = (b.input(i) for i in range(8))
  out_t = b.type_of(y_z)[0] if y_z else b.type_of(a)[0]
  if out_t not in QUANT_RANGES:
    raise UnsupportedDtypeError(f"{b.where}: QLinearMatMul to {ONNX_DTYPE_NAMES.get(out_t, out_t)} is not supported")
  for s in (a_s, b_s, y_s):
    b.dtype(b.type_of(s)[0], "scale")
  c = b.op("MatMul", [_int32_less(b, a, a_z), _int32_less(b, bb, b_z)])
  scale = b.op("Cast", [b.op("Div", [b.op("Mul", [a_s, b_s]), y_s])], to=TensorProto.DOUBLE)
  d = b.op("Mul", [b.op("Cast", [c], to=TensorProto.DOUBLE), scale])
  if y_z:
    d = b.op("Add", [d, b.op("Cast", [y_z], to=TensorProto.DOUBLE)])
  lo, hi = QUANT_RANGES[out_t]
  d = b.op("Min", [b.op("Max", [b.op("Round", [d]), b.const(np.float64(lo))]), b.const(np.float64(hi))])
  b.op("Cast", [d], out=b.node.output[0], to=out_t)


# ---------------------------------------------------------------- ai.onnx.preview.training: Adagrad, Momentum, Adam

TRAINING_DOMAIN = "ai.onnx.preview.training"
TRAINING_OPS = frozenset({"Adagrad", "Momentum", "Adam"})
ML_DOMAIN = "ai.onnx.ml"
# ops of domains besides ai.onnx that we decompose, by domain
DOMAIN_OPS = {TRAINING_DOMAIN: TRAINING_OPS, ML_DOMAIN: frozenset({"Binarizer", "ArrayFeatureExtractor"})}


def _optimizer_groups(b: Body, groups: int) -> tuple[str, str, list[list[str]]]:
  """(R, T, [[X_i, G_i, ...] per tensor]) of an optimizer node whose inputs are R, T and `groups` runs of n."""
  ins = list(b.node.input)
  n = (len(ins) - 2) // groups
  if n < 1 or len(ins) != 2 + groups * n or len(b.node.output) != (groups - 1) * n:
    raise ModelError(f"{b.where}: {len(ins)} inputs and {len(b.node.output)} outputs do not make {groups} runs of tensors")
  for name in ins[2:]:
    if b.type_of(name)[0] != TensorProto.FLOAT or b.type_of(ins[0])[0] != TensorProto.FLOAT:
      raise UnsupportedDtypeError(f"{b.where}: {b.node.op_type} of tensors other than float32 is not supported")
  return ins[0], ins[1], [[ins[2 + k * n + i] for k in range(groups)] for i in range(n)]


def _f32(b: Body, name: str) -> float:
  return b.const(np.float32(b.attrs.get(name, 0.0)))


def _lin(b: Body, a: str, x: str, c: str) -> str:
  """a * x + c"""
  return b.op("Add", [b.op("Mul", [a, x]), c])


@decomposition("Adagrad")
def adagrad(b: Body):
  """The reference's update: r' = r / (1 + t * decay_factor), g' = norm_coefficient * x + g, h' = h + g'^2,
  x' = x - r' * g' / (sqrt(h') + epsilon); in float32."""
  R, T, tensors = _optimizer_groups(b, 3)
  t = b.op("Cast", [T], to=TensorProto.FLOAT)
  r = b.op("Div", [R, _lin(b, t, _f32(b, "decay_factor"), b.const(np.float32(1)))])
  n = len(tensors)
  for i, (x, g, h) in enumerate(tensors):
    gr = _lin(b, _f32(b, "norm_coefficient"), x, g)
    h2 = b.op("Add", [h, b.op("Mul", [gr, gr])], out=b.node.output[n + i])
    den = b.op("Add", [b.op("Sqrt", [h2]), _f32(b, "epsilon")])
    b.op("Sub", [x, b.op("Div", [b.op("Mul", [r, gr]), den])], out=b.node.output[i])


@decomposition("Momentum")
def momentum(b: Body):
  """The reference's update: g' = norm_coefficient * x + g, v' = alpha * v + (beta if t > 0 else 1) * g',
  x' = x - r * v' (standard) or x - r * (g' + alpha * v') (nesterov); in float32."""
  R, T, tensors = _optimizer_groups(b, 3)
  mode = b.attrs.get("mode", b"standard")
  mode = mode.decode() if isinstance(mode, bytes) else mode
  if mode not in ("standard", "nesterov"):
    raise ModelError(f"{b.where}: mode {mode!r} is not standard or nesterov")
  beta = b.op("Where", [b.op("Greater", [T, b.const(np.int64(0))]), _f32(b, "beta"), b.const(np.float32(1))])
  n = len(tensors)
  for i, (x, g, v) in enumerate(tensors):
    gr = _lin(b, _f32(b, "norm_coefficient"), x, g)
    v2 = b.op("Add", [b.op("Mul", [_f32(b, "alpha"), v]), b.op("Mul", [beta, gr])], out=b.node.output[n + i])
    step = v2 if mode == "standard" else _lin(b, _f32(b, "alpha"), v2, gr)
    b.op("Sub", [x, b.op("Mul", [R, step])], out=b.node.output[i])


@decomposition("Adam")
def adam(b: Body):
  """The reference's update: g' = norm_coefficient * x + g, v' = alpha * v + (1 - alpha) * g',
  h' = beta * h + (1 - beta) * g'^2, r' = r * sqrt(1 - beta^t) / (1 - alpha^t) if t > 0 else r,
  x' = (1 - norm_coefficient_post) * (x - r' * (v' / (sqrt(h') + epsilon))); in float32."""
  R, T, tensors = _optimizer_groups(b, 4)
  alpha, beta = float(np.float32(b.attrs.get("alpha", 0.9))), float(np.float32(b.attrs.get("beta", 0.999)))
  t = b.op("Cast", [T], to=TensorProto.FLOAT)
  one = b.const(np.float32(1))
  bias = b.op("Div", [b.op("Sqrt", [b.op("Sub", [one, b.op("Pow", [b.const(np.float32(beta)), t])])]),
                      b.op("Sub", [one, b.op("Pow", [b.const(np.float32(alpha)), t])])])
  r = b.op("Where", [b.op("Greater", [T, b.const(np.int64(0))]), b.op("Mul", [R, bias]), R])
  n = len(tensors)
  post = b.const(np.float32(1) - np.float32(b.attrs.get("norm_coefficient_post", 0.0)))
  for i, (x, g, v, h) in enumerate(tensors):
    gr = _lin(b, _f32(b, "norm_coefficient"), x, g)
    v2 = b.op("Add", [b.op("Mul", [b.const(np.float32(alpha)), v]), b.op("Mul", [b.const(np.float32(1 - alpha)), gr])],
              out=b.node.output[n + i])
    h2 = b.op("Add", [b.op("Mul", [b.const(np.float32(beta)), h]),
                      b.op("Mul", [b.const(np.float32(1 - beta)), b.op("Mul", [gr, gr])])], out=b.node.output[2 * n + i])
    den = b.op("Add", [b.op("Sqrt", [h2]), _f32(b, "epsilon")])
    x2 = b.op("Sub", [x, b.op("Mul", [r, b.op("Div", [v2, den])])])
    b.op("Mul", [post, x2], out=b.node.output[i])


# ---------------------------------------------------------------- GridSample

def _reflect(b: Body, v: str, lo: float, hi: float) -> str:
  """onnx's reference reflection of a coordinate into [lo, hi]: by the nearer border, repeatedly."""
  f = lambda a: b.const(np.float32(a))   # noqa: E731
  below, above = b.op("Less", [v, f(lo)]), b.op("Greater", [v, f(hi)])
  dx = b.op("Where", [below, b.op("Sub", [f(lo), v]), b.op("Sub", [v, f(hi)])])
  n = b.op("Floor", [b.op("Div", [dx, f(hi - lo)])])
  r = b.op("Sub", [dx, b.op("Mul", [n, f(hi - lo)])])
  half = b.op("Div", [n, f(2)])
  even = b.op("Equal", [b.op("Floor", [half]), half])
  up, down = b.op("Add", [f(lo), r]), b.op("Sub", [f(hi), r])
  return b.op("Where", [below, b.op("Where", [even, up, down]), b.op("Where", [above, b.op("Where", [even, down, up]), v])])


def _cubic_coeffs(b: Body, t: str) -> list[str]:
  """Keys' cubic convolution weights (A = -0.75) of the four taps around a point t in [0, 1) past the first."""
  A = -0.75

  def poly(x: str, coeffs) -> str:   # Horner: ((c0 x + c1) x + c2) x + c3
    acc = b.const(np.float32(coeffs[0]))
    for c in coeffs[1:]:
      acc = b.op("Add", [b.op("Mul", [acc, x]), b.const(np.float32(c))])
    return acc
  one = b.const(np.float32(1))
  far = [A, -5 * A, 8 * A, -4 * A]          # |x| in [1, 2)
  near = [A + 2, -(A + 3), 0.0, 1.0]        # |x| in [0, 1)
  return [poly(b.op("Add", [t, one]), far), poly(t, near), poly(b.op("Sub", [one, t]), near),
          poly(b.op("Sub", [b.const(np.float32(2)), t]), far)]


@decomposition("GridSample")
def grid_sample(b: Body):
  """onnx's reference GridSample: each output point's grid coordinates (last axis x, y, z ... for the spatial
  axes last to first) denormalised in float64 to float32 pixel coordinates, rounded half to even (nearest), pulled
  into the borders (border, reflection) when outside them; then its taps (1, 2 or 4 per axis for nearest, linear,
  cubic) fetched from the flattened image by GatherElements, each index clamped (border), reflected (reflection)
  or zero-weighted when outside (zeros), and summed with the product of their per-axis weights."""
  X, G = b.input(0), b.input(1)
  xs, gs = b.shape_of(X), b.shape_of(G)
  if b.dtype(b.type_of(X)[0], "input") != np.float32 or b.dtype(b.type_of(G)[0], "grid") != np.float32:
    raise UnsupportedDtypeError(f"{b.where}: GridSample of other than float32 values and grid is not supported")
  r = len(xs) - 2
  if r < 1 or len(gs) != r + 2 or gs[0] != xs[0] or gs[-1] != r:
    raise ModelError(f"{b.where}: grid {list(gs)} does not fit input {list(xs)}")
  N, C, dims, out_sp = xs[0], xs[1], xs[2:], gs[1:-1]
  mode = b.attrs.get("mode", b"linear" if b.opset >= 20 else b"bilinear")
  mode = mode.decode() if isinstance(mode, bytes) else mode
  mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
  pad = b.attrs.get("padding_mode", b"zeros")
  pad = pad.decode() if isinstance(pad, bytes) else pad
  align = bool(b.attrs.get("align_corners", 0))
  if mode not in ("nearest", "linear", "cubic") or pad not in ("zeros", "border", "reflection"):
    raise ModelError(f"{b.where}: mode {mode!r} or padding_mode {pad!r} is not one GridSample knows")
  if min(dims) < 1 or (pad == "reflection" and align and min(dims) < 2):
    raise UnsupportedOpError(f"{b.where}: GridSample of an input {list(xs)} with padding {pad!r} is not supported")
  Q, P = int(np.prod(out_sp)), int(np.prod(dims))
  f32 = lambda a: b.const(np.float32(a))   # noqa: E731
  strides = [int(np.prod(dims[i + 1:])) for i in range(r)]
  per_axis = []   # per spatial axis: [(flat index part [N, 1, Q] int64, weight [N, 1, Q] float32 or None)]
  for i, d in enumerate(dims):
    g = b.op("Reshape", [b.op("Gather", [G, b.const(np.int64(r - 1 - i))], axis=-1), b.const(_i64(N, 1, Q))])
    g = b.op("Add", [b.op("Cast", [g], to=TensorProto.DOUBLE), b.const(np.float64(1))])
    x = b.op("Mul", [g, b.const(np.float64((d - 1) / 2))]) if align else \
        b.op("Div", [b.op("Sub", [b.op("Mul", [g, b.const(np.float64(d))]), b.const(np.float64(1))]), b.const(np.float64(2))])
    x = b.op("Cast", [x], to=TensorProto.FLOAT)
    if mode == "nearest":
      x = b.op("Round", [x])
    lo, hi = (0.0, d - 1.0) if align else (-0.5, d - 0.5)
    if pad != "zeros":
      outside = b.op("Or", [b.op("Less", [x, f32(lo)]), b.op("Greater", [x, f32(hi)])])
      pulled = b.op("Clip", [x, f32(0), f32(d - 1)]) if pad == "border" else _reflect(b, x, lo, hi)
      x = b.op("Where", [outside, pulled, x])
    if mode == "nearest":
      taps = [(x, None)]
    else:
      x0 = b.op("Floor", [x])
      t = b.op("Sub", [x, x0])
      if mode == "linear":
        taps = [(x0, b.op("Sub", [f32(1), t])), (b.op("Add", [x0, f32(1)]), t)]
      else:
        taps = [(b.op("Add", [x0, f32(k)]), w) for k, w in zip((-1, 0, 1, 2), _cubic_coeffs(b, t))]
    fetched = []
    for idx, w in taps:
      if pad == "reflection":
        idx = _reflect(b, idx, lo, hi)
      i64 = b.op("Cast", [idx], to=TensorProto.INT64)   # truncation, as the reference's int()
      clamped = b.op("Clip", [i64, b.const(np.int64(0)), b.const(np.int64(d - 1))])
      if pad == "zeros":
        inside = b.op("Cast", [b.op("Equal", [clamped, i64])], to=TensorProto.FLOAT)
        w = inside if w is None else b.op("Mul", [w, inside])
      fetched.append((b.op("Mul", [clamped, b.const(np.int64(strides[i]))]), w))
    per_axis.append(fetched)
  flat_x = b.op("Reshape", [X, b.const(_i64(N, C, P))])
  full = b.const(_i64(N, C, Q))
  total = None
  for combo in np.ndindex(*[len(t) for t in per_axis]):
    flat, weight = None, None
    for i, k in enumerate(combo):
      part, w = per_axis[i][k]
      flat = part if flat is None else b.op("Add", [flat, part])
      weight = w if weight is None else (weight if w is None else b.op("Mul", [weight, w]))
    v = b.op("GatherElements", [flat_x, b.op("Expand", [flat, full])], axis=2)
    v = v if weight is None else b.op("Mul", [v, weight])
    total = v if total is None else b.op("Add", [total, v])
  b.op("Reshape", [total, b.const(_i64(N, C, *out_sp))], out=b.node.output[0])


# ---------------------------------------------------------------- BatchNormalization (training), TensorScatter

def batchnorm_in_training(node: onnx.NodeProto) -> bool:
  """BatchNormalization with training_mode=1, which the inference kernel refuses and we decompose."""
  return any(a.name == "training_mode" and a.i == 1 for a in node.attribute)


# ops a kernel implements except in variants these pick out, which are decomposed instead
VARIANTS = {"BatchNormalization": batchnorm_in_training}


@decomposition("BatchNormalization")
def batchnorm_training(b: Body):
  """Training mode as onnx's reference computes it: the batch's mean and (population) variance over every axis
  but 1 normalise x; the running statistics are mean * momentum + batch statistic * (1 - momentum)."""
  if b.opset < 14:
    raise UnsupportedOpError(f"{b.where}: BatchNormalization in training mode before opset 14 is not supported")
  x, scale, bias, mean, var = (b.input(i) for i in range(5))
  shape = b.shape_of(x)
  rank = len(shape)
  if rank < 2:
    raise ModelError(f"{b.where}: input {list(shape)} has no channel axis")
  dt = b.dtype(b.type_of(x)[0], "input")
  axes = b.const(_i64(0, *range(2, rank)))
  chan = b.const(_i64(-1, *([1] * (rank - 2))))
  m = b.op("ReduceMean", [x, axes], keepdims=1)
  d = b.op("Sub", [x, m])
  v = b.op("ReduceMean", [b.op("Mul", [d, d]), axes], keepdims=1)
  eps = b.const(np.asarray(b.attrs.get("epsilon", 1e-5), dt))
  y = b.op("Div", [b.op("Mul", [b.op("Reshape", [scale, chan]), d]), b.op("Sqrt", [b.op("Add", [v, eps])])])
  b.op("Add", [y, b.op("Reshape", [bias, chan])], out=b.node.output[0])
  mom = float(b.attrs.get("momentum", 0.9))
  flat = b.const(_i64(-1))
  for k, (run, stat) in enumerate(((mean, m), (var, v)), start=1):
    if k < len(b.node.output) and b.node.output[k]:
      b.op("Add", [b.op("Mul", [run, b.const(np.asarray(mom, dt))]),
                   b.op("Mul", [b.op("Reshape", [stat, flat]), b.const(np.asarray(1 - mom, dt))])], out=b.node.output[k])


@decomposition("TensorScatter")
def tensor_scatter(b: Body):
  """present = past with update written along `axis` at each batch entry's run-time write index (wrapping
  around in circular mode): per batch entry, every cache position reads the update slice it receives (a Gather
  with indices computed from the write index, each clamped into the update) where one lands, else the past."""
  past, update, idx = b.input(0), b.input(1), b.input(2)
  ps, us = b.shape_of(past), b.shape_of(update)
  rank = len(ps)
  axis = int(b.attrs.get("axis", -2))
  mode = b.attrs.get("mode", b"linear")
  mode = mode.decode() if isinstance(mode, bytes) else mode
  if not -rank <= axis < rank or mode not in ("linear", "circular"):
    raise ModelError(f"{b.where}: axis {axis} or mode {mode!r} does not fit a rank {rank} cache")
  axis %= rank
  if axis == 0 or len(us) != rank or any(p != u for i, (p, u) in enumerate(zip(ps, us)) if i != axis) or us[axis] > ps[axis]:
    raise ModelError(f"{b.where}: update {list(us)} does not fit cache {list(ps)} along axis {axis}")
  N, L, U = ps[0], ps[axis], us[axis]
  if U == 0:
    b.op("Identity", [past], out=b.node.output[0])
    return
  b.unrolls(N, "batch entries")
  s = b.const(np.arange(L, dtype=np.int64).reshape(1, L))
  w = b.op("Unsqueeze", [b.op("Cast", [idx], to=TensorProto.INT64), b.const(_i64(1))]) if idx else b.const(np.zeros((N, 1), np.int64))
  k = b.op("Sub", [s, w])                                                        # [N, L]
  if mode == "circular":
    k = b.op("Mod", [k, b.const(np.int64(L))])
  lands = b.op("And", [b.op("GreaterOrEqual", [k, b.const(np.int64(0))]), b.op("Less", [k, b.const(np.int64(U))])])
  k = b.op("Clip", [k, b.const(np.int64(0)), b.const(np.int64(U - 1))])
  along = b.const(_i64(L, *([1] * (rank - 1 - axis))))                           # a position along axis - 1 of an entry
  parts = []
  for n in range(N):
    got = b.op("Gather", [_row(b, update, n), _row(b, k, n)], axis=axis - 1)
    where = b.op("Reshape", [_row(b, lands, n), along])
    parts.append(b.op("Unsqueeze", [b.op("Where", [where, got, _row(b, past, n)]), b.const(_i64(0))]))
  b.op("Concat", parts, out=b.node.output[0], axis=0)


# ---------------------------------------------------------------- ai.onnx.ml: Binarizer, ArrayFeatureExtractor

@decomposition("Binarizer")
def binarizer(b: Body):
  """x > threshold as x's type (1 or 0), as the reference computes it."""
  x = b.input(0)
  dt = b.dtype(b.type_of(x)[0], "input")
  b.op("Cast", [b.op("Greater", [x, b.const(np.asarray(b.attrs.get("threshold", 0.0), dt))])], out=b.node.output[0],
       to=b.type_of(x)[0])


@decomposition("ArrayFeatureExtractor")
def array_feature_extractor(b: Body):
  """x[..., indices] with the run-time indices flattened, a vector's result as one row (as onnxruntime and the
  reference do); each index must lie in the last axis (a Gather, which checks graph-input indices per call)."""
  x, idx = b.input(0), b.input(1)
  xs, n = b.shape_of(x), int(np.prod(b.shape_of(idx)))
  flat = b.op("Reshape", [idx, b.const(_i64(-1))])
  y = b.op("Gather", [x, flat], axis=len(xs) - 1)
  shape = (1, n) if len(xs) == 1 else (*xs[:-1], n)
  b.op("Reshape", [y, b.const(_i64(*shape))], out=b.node.output[0])


@decomposition("QLinearConv")
def qlinear_conv(b: Body):
  """As the reference: an int32 Conv of the zero-point-shifted input and weights (a per-channel weight zero point
  along the output channels) plus the int32 bias, scaled by x_scale * w_scale / y_scale in float64 (a per-channel
  w_scale along the channels), shifted by y_zero_point, saturated to 8 bits and rounded half to even."""
  x, x_s, x_z, w, w_s, w_z, y_s, y_z = (b.input(i) for i in range(8))
  bias = b.input(8)
  rank = len(b.shape_of(w))
  out_t = b.type_of(y_z)[0] if y_z else b.type_of(x)[0]
  if out_t not in (TensorProto.UINT8, TensorProto.INT8):
    raise UnsupportedDtypeError(f"{b.where}: QLinearConv to {ONNX_DTYPE_NAMES.get(out_t, out_t)} is not supported")
  M = b.shape_of(w)[0]
  wz_axes = list(range(1, rank)) if w_z and b.shape_of(w_z) == (M,) else None
  b.op("Conv", [_int32_less(b, x, x_z), _int32_less(b, w, w_z, wz_axes)] + ([bias] if bias else []))
  b.nodes[-1].attribute.extend(b.node.attribute)
  res = b.nodes[-1].output[0]
  ws = w_s
  if int(np.prod(b.shape_of(w_s))) > 1:
    ws = b.op("Unsqueeze", [w_s, b.const(_i64(0, *range(2, rank)))])
  scale = b.op("Cast", [b.op("Div", [b.op("Mul", [x_s, ws]), y_s])], to=TensorProto.DOUBLE)
  r = b.op("Mul", [b.op("Cast", [res], to=TensorProto.DOUBLE), scale])
  if y_z:
    r = b.op("Add", [r, b.op("Cast", [y_z], to=TensorProto.DOUBLE)])
  lo, hi = QUANT_RANGES[out_t]
  r = b.op("Round", [b.op("Clip", [r, b.const(np.float64(lo)), b.const(np.float64(hi))])])
  b.op("Cast", [r], out=b.node.output[0], to=out_t)


@decomposition("MaxUnpool")
def max_unpool(b: Body):
  """x's values scattered to their flat run-time indices (as MaxPool's Indices give them, over the whole tensor)
  in zeros of the inferred shape, (in - 1) * stride - pads + kernel per spatial axis, as the reference computes
  it. An output_shape input (known only at run time) is refused."""
  x, idx = b.input(0), b.input(1)
  if b.input(2):
    raise UnsupportedOpError(f"{b.where}: MaxUnpool with an output_shape input is not supported")
  xs = b.shape_of(x)
  r = len(xs) - 2
  kernel = list(b.attrs.get("kernel_shape", []))
  strides = list(b.attrs.get("strides", [1] * r))
  pads = list(b.attrs.get("pads", [0] * 2 * r))
  if r < 1 or len(kernel) != r or len(strides) != r or len(pads) != 2 * r or b.shape_of(idx) != xs:
    raise ModelError(f"{b.where}: kernel_shape {kernel}, strides {strides}, pads {pads} or indices do not fit {list(xs)}")
  out = list(xs[:2]) + [(xs[2 + i] - 1) * strides[i] - pads[i] - pads[r + i] + kernel[i] for i in range(r)]
  if min(out) < 1:
    raise ModelError(f"{b.where}: the inferred output shape {out} is empty or negative")
  dt = b.dtype(b.type_of(x)[0], "input")
  b.fits(out, dt, "the unpooled output")
  total = int(np.prod(out))
  flat = b.op("ScatterElements", [b.const(np.zeros(total, dt)), b.op("Reshape", [idx, b.const(_i64(-1))]),
                                  b.op("Reshape", [x, b.const(_i64(-1))])], axis=0)
  b.op("Reshape", [flat, b.const(_i64(*out))], out=b.node.output[0])


# ---------------------------------------------------------------- MaxPool with its Indices output

def maxpool_with_indices(node: onnx.NodeProto) -> bool:
  """MaxPool asked for its Indices output, which the pooling kernel refuses and we decompose."""
  return len(node.output) > 1 and bool(node.output[1])


VARIANTS["MaxPool"] = maxpool_with_indices


@decomposition("MaxPool")
def maxpool_indices(b: Body):
  """2-D MaxPool with Indices as onnx's reference computes them: per window the first tap inside the image that is
  greater than every earlier one, its flat index over the whole tensor (row-major, or column-major within the
  image with storage_order=1). The taps are strided slices of the input padded with -inf and of a constant
  tensor of flat indices; which taps lie inside the image is known at load. Explicit pads only (no auto_pad,
  no ceil_mode)."""
  x = b.input(0)
  xs = b.shape_of(x)
  if len(xs) != 4:
    raise UnsupportedOpError(f"{b.where}: MaxPool with Indices of other than a 4-D input is not supported")
  auto_pad = b.attrs.get("auto_pad", b"NOTSET")
  auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
  if auto_pad != "NOTSET" or int(b.attrs.get("ceil_mode", 0)):
    raise UnsupportedOpError(f"{b.where}: MaxPool with Indices and auto_pad or ceil_mode is not supported")
  dt = b.dtype(b.type_of(x)[0], "input")
  if dt.kind != "f":
    raise UnsupportedDtypeError(f"{b.where}: MaxPool with Indices of {dt} is not supported")
  N, C, H, W = xs
  kh, kw = list(b.attrs.get("kernel_shape", []))
  sh, sw = list(b.attrs.get("strides", [1, 1]))
  dh, dw = list(b.attrs.get("dilations", [1, 1]))
  pt, pl, pb, pr = list(b.attrs.get("pads", [0, 0, 0, 0]))
  if min(kh, kw, sh, sw, dh, dw) < 1 or min(pt, pl, pb, pr) < 0:
    raise ModelError(f"{b.where}: kernel, strides, dilations or pads are not positive")
  OH, OW = (H + pt + pb - (kh - 1) * dh - 1) // sh + 1, (W + pl + pr - (kw - 1) * dw - 1) // sw + 1
  if OH < 1 or OW < 1:
    raise ModelError(f"{b.where}: the window does not fit the padded input")
  b.fits((N, C, H + pt + pb, W + pl + pr), np.int64, "the padded flat indices")
  b.fits((N, C, OH, OW, kh, kw), np.int64, "the taps' flat indices")
  order = int(b.attrs.get("storage_order", 0))
  plane = np.arange(H)[:, None] * W + np.arange(W)[None, :] if order == 0 else np.arange(H)[:, None] + np.arange(W)[None, :] * H
  flat = (np.arange(N * C).reshape(N, C, 1, 1) * H * W + plane).astype(np.int64)
  flat = np.pad(flat, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=-1)
  inside = np.pad(np.ones((H, W), bool), ((pt, pb), (pl, pr)))
  padded = b.op("Pad", [x, b.const(_i64(0, 0, pt, pl, 0, 0, pb, pr)), b.const(np.asarray(-np.inf, dt))])
  best_v = best_i = best_ok = None
  for i in range(kh):
    for j in range(kw):
      h0, w0 = i * dh, j * dw
      rows, cols = slice(h0, h0 + (OH - 1) * sh + 1, sh), slice(w0, w0 + (OW - 1) * sw + 1, sw)
      v = b.op("Slice", [padded, b.const(_i64(h0, w0)), b.const(_i64(h0 + (OH - 1) * sh + 1, w0 + (OW - 1) * sw + 1)),
                         b.const(_i64(2, 3)), b.const(_i64(sh, sw))])
      idx = b.const(np.ascontiguousarray(flat[:, :, rows, cols]))
      ok = b.const(np.ascontiguousarray(inside[rows, cols]))
      if best_v is None:
        best_v, best_i, best_ok = v, idx, ok
        continue
      # a tap inside the image wins when greater, or when nothing inside the image has been seen yet
      better = b.op("And", [ok, b.op("Or", [b.op("Greater", [v, best_v]), b.op("Not", [best_ok])])])
      best_v = b.op("Where", [better, v, best_v])
      best_i = b.op("Where", [better, idx, best_i])
      best_ok = b.op("Or", [best_ok, ok])
  b.op("Identity", [best_v], out=b.node.output[0])
  b.op("Identity", [best_i], out=b.node.output[1])


# ---------------------------------------------------------------- OneHot

@decomposition("OneHot")
def one_hot(b: Body):
  """As onnx's reference: indices (negative ones counted from depth) compared in float64 with range(depth) laid
  along `axis`, then onehot * (on - off) + off in the values' type. The depth sets the output's shape, so it must
  fold to a constant at load (an initializer, or Shape arithmetic); the Range it feeds refuses it otherwise."""
  ind, depth, values = b.input(0), b.input(1), b.input(2)
  rank = len(b.shape_of(ind))
  axis = int(b.attrs.get("axis", -1))
  if not -rank - 1 <= axis <= rank:
    raise ModelError(f"{b.where}: axis {axis} out of range for indices of rank {rank}")
  axis %= rank + 1
  vt = b.type_of(values)[0]
  b.dtype(vt, "values")
  f64 = TensorProto.DOUBLE
  d = b.op("Cast", [b.op("Reshape", [depth, b.const(np.zeros(0, np.int64))])], to=f64)
  targets = b.op("Range", [b.const(np.float64(0)), d, b.const(np.float64(1))])
  targets = b.op("Reshape", [targets, b.const(_i64(*[-1 if i == axis else 1 for i in range(rank + 1)]))])
  x = b.op("Cast", [ind], to=f64)
  x = b.op("Where", [b.op("Less", [x, b.const(np.float64(0))]), b.op("Add", [x, d]), x])
  hot = b.op("Cast", [b.op("Equal", [targets, b.op("Unsqueeze", [x, b.const(_i64(axis))])])], to=vt)
  off, on = _row(b, values, 0), _row(b, values, 1)
  b.op("Add", [b.op("Mul", [hot, b.op("Sub", [on, off])]), off], out=b.node.output[0])


# ---------------------------------------------------------------- RoiAlign

@decomposition("RoiAlign")
def roi_align(b: Body):
  """As onnx's reference, in float64: per region (run-time boxes and batch indices) a fixed grid of
  sampling_ratio^2 points per output bin, each bilinearly interpolated from its four neighbours (a point more than
  one pixel outside the image counts zero; one past the last row or column takes that row or column), the bin
  their average (avg) or the greatest weighted neighbour (max). sampling_ratio 0 (a grid sized by each region)
  is refused: its shape is known only at run time."""
  X, rois, bidx = b.input(0), b.input(1), b.input(2)
  xs, rs = b.shape_of(X), b.shape_of(rois)
  if len(xs) != 4 or len(rs) != 2 or rs[1] != 4 or b.shape_of(bidx) != (rs[0],):
    raise ModelError(f"{b.where}: X {list(xs)}, rois {list(rs)} and batch_indices do not fit")
  b.dtype(b.type_of(X)[0], "input")
  s = int(b.attrs.get("sampling_ratio", 0))
  if s <= 0:
    raise UnsupportedOpError(f"{b.where}: RoiAlign with sampling_ratio {s} (a grid sized by each region) is not supported")
  b.unrolls(s, "samples per bin side")
  mode = b.attrs.get("mode", b"avg")
  mode = (mode.decode() if isinstance(mode, bytes) else mode).lower()
  ctm = b.attrs.get("coordinate_transformation_mode", b"half_pixel")
  half = (ctm.decode() if isinstance(ctm, bytes) else ctm).lower() == "half_pixel"
  if mode not in ("avg", "max"):
    raise ModelError(f"{b.where}: mode {mode!r} is not avg or max")
  N, C, H, W = xs
  R, OH, OW = rs[0], int(b.attrs.get("output_height", 1)), int(b.attrs.get("output_width", 1))
  if OH < 1 or OW < 1:
    raise ModelError(f"{b.where}: output_height {OH} and output_width {OW} must be positive")
  b.fits((R, C, OH * s, OW * s), np.float64, "the sampled points")
  f64 = TensorProto.DOUBLE
  d = lambda v: b.const(np.float64(v))   # noqa: E731
  box = b.op("Sub", [b.op("Mul", [b.op("Cast", [rois], to=f64), d(float(np.float32(b.attrs.get("spatial_scale", 1.0))))]),
                     d(0.5 if half else 0.0)])
  col = lambda k: b.op("Gather", [box, b.const(_i64(k))], axis=1)   # noqa: E731  [R, 1]
  axes = []   # per axis (y, then x): [(position part, weight)] for the low and high neighbour, and whether inside
  for start, end, size, out in ((col(1), col(3), H, OH), (col(0), col(2), W, OW)):
    extent = b.op("Sub", [end, start])
    if not half:
      extent = b.op("Max", [extent, d(1.0)])
    bin_ = b.op("Div", [extent, d(float(out))])
    steps = np.array([p + (i + 0.5) / s for p in range(out) for i in range(s)], np.float64).reshape(1, out * s)
    v = b.op("Add", [start, b.op("Mul", [bin_, b.const(steps)])])            # [R, out * s]
    inside = b.op("Not", [b.op("Or", [b.op("Less", [v, d(-1.0)]), b.op("Greater", [v, d(float(size))])])])
    v = b.op("Max", [v, d(0.0)])
    low = b.op("Floor", [v])
    last = b.op("GreaterOrEqual", [low, d(size - 1.0)])
    low = b.op("Where", [last, d(size - 1.0), low])
    v = b.op("Where", [last, low, v])
    high = b.op("Where", [last, low, b.op("Add", [low, d(1.0)])])
    frac = b.op("Sub", [v, low])
    axes.append((low, high, b.op("Sub", [d(1.0), frac]), frac, inside))
  (ylo, yhi, hy, ly, yin), (xlo, xhi, hx, lx, xin) = axes
  row = lambda t: b.op("Unsqueeze", [t, b.const(_i64(2))])   # noqa: E731  [R, OH*s, 1]
  colx = lambda t: b.op("Unsqueeze", [t, b.const(_i64(1))])  # noqa: E731  [R, 1, OW*s]
  ok = b.op("Cast", [b.op("And", [row(yin), colx(xin)])], to=f64)
  Xb = b.op("Gather", [b.op("Cast", [b.op("Reshape", [X, b.const(_i64(N, C, H * W))])], to=f64), bidx], axis=0)  # [R, C, HW]
  Q = OH * s * OW * s
  full = b.const(_i64(R, C, Q))
  vals = []
  for yy, wy in ((ylo, hy), (yhi, ly)):
    for xx, wx in ((xlo, hx), (xhi, lx)):
      pos = b.op("Add", [b.op("Mul", [row(yy), d(float(W))]), colx(xx)])                      # [R, OH*s, OW*s]
      pos = b.op("Reshape", [b.op("Cast", [pos], to=TensorProto.INT64), b.const(_i64(R, 1, Q))])
      w = b.op("Reshape", [b.op("Mul", [b.op("Mul", [row(wy), colx(wx)]), ok]), b.const(_i64(R, 1, Q))])
      vals.append(b.op("Mul", [b.op("GatherElements", [Xb, b.op("Expand", [pos, full])], axis=2), w]))
  if mode == "avg":
    v = b.op("Add", [b.op("Add", [vals[0], vals[1]]), b.op("Add", [vals[2], vals[3]])])
  else:
    v = b.op("Max", vals)
  v = b.op("Reshape", [v, b.const(_i64(R, C, OH, s, OW, s))])
  if mode == "avg":
    v = b.op("Div", [b.op("ReduceSum", [v, b.const(_i64(3, 5))], keepdims=0), d(float(s * s))])
  else:
    v = b.op("ReduceMax", [v, b.const(_i64(3, 5))], keepdims=0)
  b.op("Cast", [v], out=b.node.output[0], to=b.type_of(X)[0])
