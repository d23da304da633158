"""Reductions (Reduce*, ArgMax/ArgMin, TopK) with ONNX axes/keepdims/noop_with_empty_axes semantics."""
from __future__ import annotations

import numpy as np

from ..errors import ModelError
from ..graph import Spec
from .base import Kernel, need_const, norm_axis, numel, opt, register

REDUCERS = {
    "ReduceSum": lambda a, ax, o: np.sum(a, axis=ax, keepdims=True, out=o),
    "ReduceMean": lambda a, ax, o: np.mean(a, axis=ax, keepdims=True, out=o),
    "ReduceMax": lambda a, ax, o: np.max(a, axis=ax, keepdims=True, out=o),
    "ReduceMin": lambda a, ax, o: np.min(a, axis=ax, keepdims=True, out=o),
    "ReduceProd": lambda a, ax, o: np.prod(a, axis=ax, keepdims=True, out=o),
    "ReduceSumSquare": lambda a, ax, o: np.sum(np.square(a), axis=ax, keepdims=True, out=o),
    "ReduceL1": lambda a, ax, o: np.sum(np.abs(a), axis=ax, keepdims=True, out=o),
    "ReduceL2": lambda a, ax, o: np.sqrt(np.sum(np.square(a), axis=ax, keepdims=True), out=o),
    "ReduceLogSum": lambda a, ax, o: np.log(np.sum(a, axis=ax, keepdims=True), out=o),
    "ReduceLogSumExp": lambda a, ax, o: np.log(np.sum(np.exp(a), axis=ax, keepdims=True), out=o),
}


@register(*REDUCERS)
def reduce_op(op, attrs, specs, consts):
  x = specs[0]
  rank = len(x.shape)
  if "axes" in attrs:
    axes = list(attrs["axes"])
  elif opt(specs, 1) is not None:
    axes = [int(v) for v in need_const(consts, 1, f"{op} axes")]
  else:
    axes = []
  if not axes:
    if int(attrs.get("noop_with_empty_axes", 0)):
      def bind_id(ins, outs, scr):
        a, o = ins[0], outs[0]
        return lambda: np.copyto(o, a)
      return Kernel(op, [x], bind_id)
    axes = list(range(rank))
  axes = tuple(sorted({norm_axis(a, rank, op) for a in axes}))
  keep = int(attrs.get("keepdims", 1))
  kept = tuple(1 if i in axes else s for i, s in enumerate(x.shape))
  shape = kept if keep else tuple(s for i, s in enumerate(x.shape) if i not in axes)
  fn = REDUCERS[op]

  def bind(ins, outs, scr):
    a, o = ins[0], outs[0].reshape(kept)
    return lambda: fn(a, axes, o)
  return Kernel(op, [Spec(shape, x.dtype)], bind, flops=numel(x.shape))


@register("ArgMax", "ArgMin")
def argmax(op, attrs, specs, consts):
  x = specs[0]
  rank = len(x.shape)
  axis = norm_axis(int(attrs.get("axis", 0)), rank, op)
  keep = int(attrs.get("keepdims", 1))
  last = int(attrs.get("select_last_index", 0))
  kept = tuple(1 if i == axis else s for i, s in enumerate(x.shape))
  shape = kept if keep else tuple(s for i, s in enumerate(x.shape) if i != axis)
  fn = np.argmax if op == "ArgMax" else np.argmin
  n = x.shape[axis]
  if n == 0:
    raise ModelError(f"{op} over an empty axis {axis}")

  def bind(ins, outs, scr):
    a, o = ins[0], outs[0].reshape(kept)
    if last:
      flipped = np.flip(a, axis=axis)

      def run():
        np.copyto(o, (n - 1) - np.expand_dims(fn(flipped, axis=axis), axis))
      return run
    return lambda: np.copyto(o, np.expand_dims(fn(a, axis=axis), axis))
  return Kernel(op, [Spec(shape, np.dtype(np.int64))], bind)


@register("TopK")
def topk(op, attrs, specs, consts):
  """The k largest (or smallest) entries along axis and their indices, in order, the lower index first among equal
  values (ONNX's rule; `sorted=0` allows any order, and this order is one). K is an input from opset 10 on and must
  be a constant: the outputs' shape depends on it. NaN sorts as numpy sorts it (above every number)."""
  x = specs[0]
  rank = len(x.shape)
  axis = norm_axis(int(attrs.get("axis", -1)), rank, op)
  if "k" in attrs:
    k = int(attrs["k"])
  else:
    kv = np.asarray(need_const(consts, 1, f"{op} K (the outputs' shape depends on it)")).reshape(-1)
    if kv.size != 1:
      raise ModelError(f"{op}: K must hold one value, got {kv.size}")
    k = int(kv[0])
  n = x.shape[axis]
  if not 0 <= k <= n:
    raise ModelError(f"{op}: K = {k} is outside [0, {n}] along axis {axis} of {list(x.shape)}")
  largest = int(attrs.get("largest", 1))
  shape = tuple(k if i == axis else d for i, d in enumerate(x.shape))

  def bind(ins, outs, scr):
    a, vals, idx = ins[0], outs[0], outs[1]

    def run():
      if largest:   # descending with ties by ascending index: a stable ascending sort of the reversed axis, reversed
        order = (n - 1) - np.flip(np.argsort(np.flip(a, axis), axis=axis, kind="stable"), axis)
      else:
        order = np.argsort(a, axis=axis, kind="stable")
      top = np.take(order, np.arange(k), axis=axis)
      np.copyto(idx, top)
      np.copyto(vals, np.take_along_axis(a, top, axis=axis))
    return run
  return Kernel(op, [Spec(shape, x.dtype), Spec(shape, np.dtype(np.int64))], bind, flops=numel(x.shape))
