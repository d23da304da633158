"""Element-indexed kernels: GatherElements, GatherND, ScatterElements, ScatterND, Trilu, EyeLike, CumSum, CumProd.

Invariants: indices that come from an input are checked on every call (negative ones count from the end, as
ONNX says) and an index outside its axis raises InputError naming the op, never an out-of-bounds access or a
raw IndexError. Scalar inputs that do not change a shape (Trilu's k, CumSum's axis) may come from an input and
are read at run time. These are rare ops: they compute with temporaries on each call."""
from __future__ import annotations

import numpy as np

from ..errors import InputError, ModelError
from ..graph import Spec, dtype_from_onnx
from ..limits import check_tensor
from .base import Kernel, norm_axis, numel, opt, register

REDUCTIONS = {"none": None, "add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _int_indices(spec: Spec, op: str):
  if spec.dtype.kind not in "iu":
    raise ModelError(f"{op} indices must be integers, got {spec.dtype}")


def _normalized(idx: np.ndarray, size, op: str) -> np.ndarray:
  """Indices with negatives counted from the end; raises InputError for any outside [-size, size)."""
  idx = idx.astype(np.int64)
  size = np.asarray(size, np.int64)
  bad = (idx < -size) | (idx >= size)
  if np.any(bad):
    raise InputError(f"{op}: index {int(idx[bad].reshape(-1)[0])} is out of range for size(s) {size.tolist()}")
  return np.where(idx < 0, idx + size, idx)


def _scalar(a: np.ndarray, op: str, what: str) -> int:
  if a.size != 1:
    raise InputError(f"{op}: {what} must be a scalar, got shape {a.shape}")
  return int(a.reshape(-1)[0])


@register("GatherElements")
def gather_elements(op, attrs, specs, consts):
  x, idx = specs[0], specs[1]
  _int_indices(idx, op)
  rank = len(x.shape)
  axis = norm_axis(int(attrs.get("axis", 0)), rank, op)
  if len(idx.shape) != rank or any(i > d for k, (i, d) in enumerate(zip(idx.shape, x.shape)) if k != axis):
    raise ModelError(f"{op}: indices {idx.shape} must have the rank of data {x.shape} and fit it off axis {axis}")

  def bind(ins, outs, scr):
    a, i, o = ins[0], ins[1], outs[0]
    # the data's other axes are cut to the indices' extent (take_along_axis broadcasts, ONNX does not)
    sub = a[tuple(slice(0, n) if k != axis else slice(None) for k, n in enumerate(idx.shape))]

    def run():
      np.copyto(o, np.take_along_axis(sub, _normalized(i, x.shape[axis], op), axis=axis))
    return run
  return Kernel(op, [Spec(idx.shape, x.dtype)], bind)


@register("GatherND")
def gather_nd(op, attrs, specs, consts):
  x, idx = specs[0], specs[1]
  _int_indices(idx, op)
  b = int(attrs.get("batch_dims", 0))
  if not idx.shape or not 0 <= b < min(len(x.shape), len(idx.shape)) or x.shape[:b] != idx.shape[:b]:
    raise ModelError(f"{op}: batch_dims {b} does not fit data {x.shape} and indices {idx.shape}")
  k = idx.shape[-1]
  if not 1 <= k <= len(x.shape) - b:
    raise ModelError(f"{op}: the last indices dim {k} must be in [1, {len(x.shape) - b}] for data {x.shape}")
  shape = idx.shape[:-1] + x.shape[b + k:]
  limits = np.asarray(x.shape[b:b + k], np.int64)

  def bind(ins, outs, scr):
    a, i, o = ins[0], ins[1], outs[0]
    nb = numel(x.shape[:b])

    def run():
      ii = _normalized(i, limits, op).reshape(nb, -1, k)
      flat = a.reshape((nb,) + x.shape[b:])
      res = np.stack([flat[n][tuple(ii[n].T)] for n in range(nb)])
      np.copyto(o, res.reshape(shape))
    return run
  return Kernel(op, [Spec(shape, x.dtype)], bind)


def _reduction(attrs, op):
  r = attrs.get("reduction", "none")
  if r not in REDUCTIONS:
    raise ModelError(f"{op} reduction {r!r} is not one of {sorted(REDUCTIONS)}")
  return REDUCTIONS[r]


@register("ScatterElements", "Scatter")
def scatter_elements(op, attrs, specs, consts):
  x, idx, upd = specs[0], specs[1], specs[2]
  _int_indices(idx, op)
  rank = len(x.shape)
  axis = norm_axis(int(attrs.get("axis", 0)), rank, op)
  ufunc = _reduction(attrs, op)
  if idx.shape != upd.shape or len(idx.shape) != rank or upd.dtype != x.dtype or \
          any(i > d for k, (i, d) in enumerate(zip(idx.shape, x.shape)) if k != axis):
    raise ModelError(f"{op}: indices {idx.shape} and updates {upd.shape} must match and fit data {x.shape}")

  def bind(ins, outs, scr):
    a, i, u, o = ins[0], ins[1], ins[2], outs[0]

    def run():
      ii = _normalized(i, x.shape[axis], op)
      where = list(np.indices(idx.shape, sparse=True))
      where[axis] = ii
      res = a.copy()  # the output may not alias data: write into a copy, then copy out
      if ufunc is None:
        res[tuple(where)] = u
      else:
        ufunc.at(res, tuple(where), u)
      np.copyto(o, res)
    return run
  return Kernel(op, [x], bind)


@register("ScatterND")
def scatter_nd(op, attrs, specs, consts):
  x, idx, upd = specs[0], specs[1], specs[2]
  _int_indices(idx, op)
  ufunc = _reduction(attrs, op)
  k = idx.shape[-1] if idx.shape else 0
  if not 1 <= k <= len(x.shape) or upd.shape != idx.shape[:-1] + x.shape[k:] or upd.dtype != x.dtype:
    raise ModelError(f"{op}: indices {idx.shape} and updates {upd.shape} do not fit data {x.shape}")
  limits = np.asarray(x.shape[:k], np.int64)

  def bind(ins, outs, scr):
    a, i, u, o = ins[0], ins[1], ins[2], outs[0]

    def run():
      ii = _normalized(i, limits, op).reshape(-1, k)
      uu = u.reshape((-1,) + x.shape[k:])
      res = a.copy()
      if ufunc is None:
        res[tuple(ii.T)] = uu
      else:
        ufunc.at(res, tuple(ii.T), uu)
      np.copyto(o, res)
    return run
  return Kernel(op, [x], bind)


@register("Trilu")
def trilu(op, attrs, specs, consts):
  x = specs[0]
  if len(x.shape) < 2:
    raise ModelError(f"Trilu needs rank >= 2, got {x.shape}")
  upper = int(attrs.get("upper", 1))
  k_const = 0 if opt(specs, 1) is None else (None if consts[1] is None else _scalar(consts[1], op, "k"))
  rows, cols = x.shape[-2:]

  def bind(ins, outs, scr):
    a, o = ins[0], outs[0]

    def run():
      k = k_const if k_const is not None else _scalar(ins[1], op, "k")
      keep = np.tri(rows, cols, k - 1, dtype=bool) if upper else np.tri(rows, cols, k, dtype=bool)
      if upper:
        keep = ~keep
      np.copyto(o, np.where(keep, a, np.zeros((), a.dtype)))
    return run
  return Kernel(op, [x], bind)


@register("EyeLike")
def eye_like(op, attrs, specs, consts):
  x = specs[0]
  if len(x.shape) != 2:
    raise ModelError(f"EyeLike needs a 2-D input, got {x.shape}")
  dt = dtype_from_onnx(int(attrs["dtype"]), "EyeLike dtype") if "dtype" in attrs else x.dtype
  check_tensor(x.shape, dt, "EyeLike")  # the value is built here, at load
  val = np.eye(x.shape[0], x.shape[1], int(attrs.get("k", 0)), dtype=dt)

  def bind(ins, outs, scr):
    o = outs[0]
    return lambda: np.copyto(o, val)
  return Kernel(op, [Spec(x.shape, dt)], bind, const_value=val)  # depends on the shape only


@register("CumSum", "CumProd")
def cumulative(op, attrs, specs, consts):
  x = specs[0]
  if x.dtype.kind not in "fiu":
    raise ModelError(f"{op} on dtype {x.dtype}")
  scan, identity = (np.cumsum, 0) if op == "CumSum" else (np.cumprod, 1)
  rank = len(x.shape)
  axis_const = None if consts[1] is None else norm_axis(_scalar(consts[1], op, "axis"), rank, op)
  if numel(specs[1].shape) != 1 or specs[1].dtype.kind not in "iu":
    raise ModelError(f"{op} axis must be one integer, got {specs[1].dtype} {specs[1].shape}")
  exclusive, reverse = int(attrs.get("exclusive", 0)), int(attrs.get("reverse", 0))

  def bind(ins, outs, scr):
    a, o = ins[0], outs[0]

    def run():
      if axis_const is not None:
        ax = axis_const
      else:
        ax = _scalar(ins[1], op, "axis")
        if not -rank <= ax < rank:
          raise InputError(f"{op} axis {ax} is out of range for rank {rank}")
        ax %= rank
      v = np.flip(a, ax) if reverse else a
      c = scan(v, axis=ax, dtype=x.dtype)
      if exclusive and c.shape[ax]:
        first = np.full_like(np.take(c, [0], axis=ax), identity)
        c = np.concatenate([first, np.delete(c, -1, axis=ax)], axis=ax)
      np.copyto(o, np.flip(c, ax) if reverse else c)
    return run
  return Kernel(op, [x], bind)
