"""Pooling kernels: MaxPool / AveragePool and the global pools.

Strategies (chosen at build time, each bit-identical for max and within float rounding for averages):
- rows of k along the last axis only (stride = kernel, no pads): one reduction across the rows;
- same-size stride-1 pools: flat shifted passes over the unpadded input, edge outputs from clipped taps;
- whole-plane shifted passes over a padded copy (window_reduce.py) at stride 1, and for unpadded strided max;
- otherwise one axis at a time with taps clipped to the outputs they reach (no padded copy); a strided
  last axis reduces its interior outputs with flat passes and one strided pick.

Invariants: padding behaves as the reduction's identity (-inf / dtype min for max, 0 for sums, divided by
the count of cells the op's count_include_pad says to count); scratch is re-filled on every call."""
from __future__ import annotations

from functools import partial

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..errors import ModelError, UnsupportedOpError
from ..graph import Spec
from .base import Kernel, numel, register
from .window_reduce import bind_flat_pool, flat_pool_scratch
from ..limits import check_tensor
from .nn import PaddedCopy, avg_pool_divisors, window_geometry, windows

FLAT_POOL = True  # tests switch it off to compare the flat and the per-axis paths

@register("MaxPool", "AveragePool")
def pool(op, attrs, specs, consts):
  x = specs[0]
  if len(x.shape) < 3:
    raise ModelError(f"{op} input must be (N, C, spatial...), got shape {x.shape}")
  N, C, *S = x.shape
  K = list(attrs["kernel_shape"])
  ceil_mode = bool(attrs.get("ceil_mode", 0))
  out_sp, pb, pe, need_end, strides, dil = window_geometry(op, attrs, S, K, ceil_mode)
  if int(attrs.get("_n_outputs", 1)) > 1:
    raise UnsupportedOpError(f"{op} with the Indices output")
  if op == "MaxPool" and int(attrs.get("storage_order", 0)) != 0:
    raise UnsupportedOpError("MaxPool storage_order=1")
  padded = any(pb) or any(need_end)
  pad_shape = tuple(s + b + e for s, b, e in zip(S, pb, need_end))
  is_max = op == "MaxPool"
  fill = (-np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min) if is_max else 0
  KK = numel(K)
  recip = None if is_max else avg_pool_divisors(S, K, pb, pe, need_end, out_sp, strides, dil,
                                                 int(attrs.get("count_include_pad", 0)) == 1, x.dtype)
  out_spec = Spec((N, C) + tuple(out_sp), x.dtype)
  if not padded and list(strides) == K and all(d == 1 for d in dil) and all(k == 1 for k in K[:-1]) \
          and out_sp[-1] * K[-1] == S[-1]:
    return _row_pool(op, is_max, x, K[-1], out_spec)
  # same-size stride-1 pools (the 3x3, pad 1 branch pools of Inception): flat passes over the unpadded
  # input straight into the output, the few edge outputs recomputed with clipped taps; no padded copy
  if FLAT_POOL and padded and tuple(out_sp) == tuple(S) and all(st == 1 for st in strides) and \
          all(d == 1 for d in dil) and any(k > 1 for k in K):
    return _same_size_pool(op, is_max, x, K, pb, fill, recip, out_spec)
  # whole-plane shifted passes (window_reduce.py) beat per-axis taps at stride 1, and for strided max pools
  # without pads (the taps' strided max has no SIMD path); strided sums and padded copies favour the taps
  if FLAT_POOL and (all(st == 1 for st in strides) or (is_max and not padded)):
    return _flat_pool(op, is_max, x, K, strides, dil, out_sp, pb, padded, pad_shape, fill, recip, out_spec)
  # separable: reduce one spatial axis at a time (sum of k_d taps per axis instead of their product).
  # Padding is skipped rather than materialised (a tap then only touches the outputs whose window position
  # is inside the input, as padding with the reduction's identity would give) where every axis keeps two
  # taps that reach all outputs to start the reduction; otherwise a padded copy is cheaper.
  copy_pad = padded and any(len(_full_taps(n, k, st, dl, od, b)) < 2 and k > 1
                            for n, k, st, dl, od, b in zip(S, K, strides, dil, out_sp, pb))
  src_sp, src_pb = (pad_shape, [0] * len(K)) if copy_pad else (tuple(S), pb)
  stage_shapes = [(C,) + tuple(out_sp[:d + 1]) + tuple(src_sp[d + 1:]) for d in range(len(K) - 1)]
  scratch = [Spec(sh, x.dtype) for sh in stage_shapes] + ([Spec((C,) + pad_shape, x.dtype)] if copy_pad else [])
  # a strided last axis reduces its interior outputs as flat shifted passes (window_reduce.py) into this work array
  last_flat = FLAT_POOL and strides[-1] > 1 and K[-1] > 1
  if last_flat:
    scratch.append(Spec((C * numel(out_sp[:-1]) * src_sp[-1],), x.dtype))

  def bind(ins, outs, scr):
    xa, o = ins[0], outs[0]
    red = np.maximum if is_max else np.add
    plan = []
    pad_scr = scr[len(stage_shapes)] if copy_pad else None
    for n in range(N):
      src = xa[n]
      if copy_pad:
        plan.append(partial(PaddedCopy(pad_scr, pb, S, fill), src))
        src = pad_scr
      for d, (k, st, dl, od) in enumerate(zip(K, strides, dil, out_sp)):
        last = d == len(K) - 1
        dst = o[n] if last else scr[d]
        if last and last_flat:
          plan += _last_axis_plan(src, dst, k, st, dl, od, src_pb[d], red, fill, scr[-1])
        else:
          plan += _pool_axis_plan(src, dst, 1 + d, k, st, dl, od, src_pb[d], red, fill)
        src = dst

    def run():
      for call in plan:
        call()
      if recip is not None:
        np.multiply(o, recip, out=o)
    return run
  return Kernel(op, [out_spec], bind, scratch, flops=numel(out_spec.shape) * KK)


def _same_size_pool(op, is_max, x, K, pb, fill, recip, out_spec):
  """Stride 1, output as large as the input. Per axis d (flat stride s_d, pads pb_d before), output q reads
  input q - pb_d * s_d + t * s_d for t < k_d: one shifted reduction over the whole flat array writes every
  output whose window stays inside its own plane and row; the outputs within pb_d of either end of axis d
  (where the flat window would wrap into a neighbour) are then overwritten from clipped taps."""
  N, C, *S = x.shape
  axes = [d for d, k in enumerate(K) if k > 1]
  planes = N * C
  scratch = [Spec((planes,) + tuple(S), x.dtype)] if len(axes) > 1 else []

  def bind(ins, outs, scr):
    red = np.maximum if is_max else np.add
    src = ins[0].reshape((planes,) + tuple(S), copy=False)
    out = outs[0].reshape((planes,) + tuple(S), copy=False)
    plan = []
    for i, d in enumerate(axes):
      dst = out if (len(axes) - 1 - i) % 2 == 0 else scr[0]
      plan += _same_size_axis_plan(src, dst, d, K[d], pb[d], red, fill)
      src = dst
    if recip is not None:
      plan.append(partial(np.multiply, out, recip, out=out))

    def run():
      for call in plan:
        call()
    return run
  return Kernel(op, [out_spec], bind, scratch, flops=numel(out_spec.shape) * numel(K))


def _same_size_axis_plan(src, dst, d, k, before, red, fill):
  """Calls reducing spatial axis d of src (planes, *S) into dst (same shape, never src), stride 1."""
  n = src.shape[1 + d]
  step = numel(src.shape[2 + d:])
  flat_src, flat_dst = src.reshape(-1), dst.reshape(-1)
  m = flat_src.size - (k - 1) * step  # <= 0 only when the axis is shorter than the window: all edges
  plan = []
  if m > 0:
    out = flat_dst[before * step:before * step + m]
    taps = [flat_src[t * step:t * step + m] for t in range(k)]
    plan = [partial(red, taps[0], taps[1], out=out)] + [partial(red, out, t, out=out) for t in taps[2:]]
  after = k - 1 - before
  for a, b in ((0, min(before, n)), (max(n - after, before), n)):
    if b > a:
      edge = dst[(slice(None),) * (1 + d) + (slice(a, b),)]
      plan += _pool_axis_plan(src, edge, 1 + d, k, 1, 1, b - a, before - a, red, fill)
  return plan


def _flat_pool(op, is_max, x, K, strides, dil, out_sp, pb, padded, pad_shape, fill, recip, out_spec):
  """Pool as whole-array shifted reductions (see window_reduce.py)."""
  N, C, *S = x.shape
  scratch = flat_pool_scratch(N * C, pad_shape, x.dtype, padded)

  def bind(ins, outs, scr):
    xa = ins[0]
    planes = xa.reshape((N * C,) + tuple(S), copy=False)
    pads = None
    if padded:
      def pads(first, stop):
        return partial(PaddedCopy(scr[0][:stop - first], pb, S, fill), planes[first:stop])
    return bind_flat_pool(xa, outs[0], scr, pads, np.maximum if is_max else np.add, K, strides, dil, out_sp,
                          recip)
  return Kernel(op, [out_spec], bind, scratch, flops=numel(out_spec.shape) * numel(K))


def _last_axis_plan(src, dst, k, st, dl, od, pad_begin, red, fill, work):
  """Reduce the last axis of src into dst with stride st > 1. Outputs whose window lies inside the input
  come from shifted reductions over the whole flattened src (contiguous runs, SIMD) and one strided pick;
  the few edge outputs whose window reaches into padding use the clipped taps."""
  n = src.shape[-1]
  lo = -(-pad_begin // st)
  hi = (n - 1 + pad_begin - (k - 1) * dl) // st  # last output whose window ends inside the input
  hi = min(hi, od - 1)
  if lo > hi or not src.flags.c_contiguous:
    return _pool_axis_plan(src, dst, src.ndim - 1, k, st, dl, od, pad_begin, red, fill)
  flat = src.reshape(-1)
  m = flat.size - (k - 1) * dl
  acc = work[:m]
  taps = [flat[t * dl:t * dl + m] for t in range(k)]
  rows = flat.size // n
  item = flat.itemsize
  start = acc[lo * st - pad_begin:]
  picked = as_strided(start, shape=(rows, hi - lo + 1), strides=(n * item, st * item), writeable=False)
  try:
    inner = dst[..., lo:hi + 1].reshape(rows, hi - lo + 1, copy=False)
  except ValueError:  # dst's leading axes do not merge into rows without a copy: keep the taps
    return _pool_axis_plan(src, dst, src.ndim - 1, k, st, dl, od, pad_begin, red, fill)
  plan = [partial(red, taps[0], taps[1], out=acc)] + [partial(red, acc, t, out=acc) for t in taps[2:]]
  plan.append(partial(np.copyto, inner, picked))
  for a, b in ((0, lo), (hi + 1, od)):
    if b > a:
      plan += _pool_axis_plan(src, dst[..., a:b], src.ndim - 1, k, st, dl, b - a, pad_begin - a * st, red, fill)
  return plan


def _tap_ranges(n, k, st, dl, od, pad_begin):
  """(tap, first output, last output) for each tap of a pooling axis that reads the input anywhere."""
  ranges = []
  for t in range(k):
    first = max(0, -(-(pad_begin - t * dl) // st))
    last = min(od - 1, (n - 1 + pad_begin - t * dl) // st)
    if first <= last:
      ranges.append((t, first, last))
  return ranges


def _full_taps(n, k, st, dl, od, pad_begin):
  return [t for t, first, last in _tap_ranges(n, k, st, dl, od, pad_begin) if first == 0 and last == od - 1]


def _pool_axis_plan(src, dst, ax, k, st, dl, od, pad_begin, red, fill):
  """Zero-argument calls reducing axis `ax` of src into dst: output i, tap t reads input
  i * st + t * dl - pad_begin where that lies inside src (outside is padding, the reduction's identity)."""
  def axis(sl):
    return (slice(None),) * ax + (sl,)
  full, some = [], []  # taps reaching every output / only some
  for t, first, last in _tap_ranges(src.shape[ax], k, st, dl, od, pad_begin):
    i0 = first * st + t * dl - pad_begin
    tap = src[axis(slice(i0, i0 + (last - first) * st + 1, st))]
    if first == 0 and last == od - 1:
      full.append(tap)
    else:
      some.append((first, last + 1, tap))
  ops = []
  if len(full) >= 2:
    ops.append(partial(red, full[0], full[1], out=dst))  # two taps start the reduction: no copy or fill pass
    ops += [partial(red, dst, t, out=dst) for t in full[2:]]
  elif full and some:  # pair the full tap with a partial one; copy it where that one does not reach
    a, b, t = some.pop(0)
    ops.append(partial(red, full[0][axis(slice(a, b))], t, out=dst[axis(slice(a, b))]))
    for sl in (slice(0, a), slice(b, od)):
      if sl.stop > sl.start:
        ops.append(partial(np.copyto, dst[axis(sl)], full[0][axis(sl)]))
  elif full:
    ops.append(partial(np.copyto, dst, full[0]))
  else:
    ops.append(partial(dst.fill, fill))
  ops += [partial(red, dst[axis(slice(a, b))], t, out=dst[axis(slice(a, b))]) for a, b, t in some]
  return ops


def _row_pool(op, is_max, x, k, out_spec):
  """Non-overlapping windows along the last axis only (kernel (1, ..., 1, k), stride = kernel): the per-tap
  loop would have an inner loop of one element, so view the input as rows of k and reduce across them."""
  def bind(ins, outs, scr):
    rows, o = ins[0].reshape(-1, k), outs[0].reshape(-1)
    if is_max:
      cols = [rows[:, i] for i in range(k)]

      def run():
        np.copyto(o, cols[0])
        for c in cols[1:]:
          np.maximum(o, c, out=o)
      return run
    w = np.full(k, 1.0 / k, x.dtype)
    return lambda: np.matmul(rows, w, out=o)  # one BLAS gemv
  return Kernel(op, [out_spec], bind, flops=numel(x.shape))


@register("GlobalAveragePool", "GlobalMaxPool")
def global_pool(op, attrs, specs, consts):
  x = specs[0]
  if len(x.shape) < 3:
    raise ModelError(f"{op} input must be (N, C, spatial...), got shape {x.shape}")
  axes = tuple(range(2, len(x.shape)))
  out = Spec(x.shape[:2] + (1,) * len(axes), x.dtype)
  fn = np.mean if op == "GlobalAveragePool" else np.max

  rows, cols = numel(x.shape[:2]), numel(x.shape[2:])
  if op == "GlobalAveragePool" and x.dtype.kind == "f" and cols:
    weights = np.full(cols, 1.0 / cols, x.dtype)  # the mean as one BLAS GEMV: ~10x numpy's mean

    def bind_gemv(ins, outs, scr):
      a, o = ins[0].reshape(rows, cols, copy=False), outs[0].reshape(rows, copy=False)
      return lambda: np.matmul(a, weights, out=o)
    return Kernel(op, [out], bind_gemv, flops=numel(x.shape))

  def bind(ins, outs, scr):
    a, o = ins[0], outs[0]
    return lambda: fn(a, axis=axes, keepdims=True, out=o)
  return Kernel(op, [out], bind, flops=numel(x.shape))


@register("LpPool", "GlobalLpPool")
def lp_pool(op, attrs, specs, consts):
  """(sum over the window of |x|^p)^(1/p), zero padding (a rare op: a padded temporary per call)."""
  x = specs[0]
  if len(x.shape) < 3 or x.dtype.kind != "f":
    raise ModelError(f"{op} input must be float (N, C, spatial...), got {x.dtype} {x.shape}")
  N, C, *S = x.shape
  p = int(attrs.get("p", 2))
  if p < 1:
    raise ModelError(f"{op} p={p} must be positive")
  if op == "GlobalLpPool":
    axes = tuple(range(2, len(x.shape)))

    def bind_global(ins, outs, scr):
      a, o = ins[0], outs[0]
      return lambda: np.copyto(o, np.sum(np.abs(a) ** p, axis=axes, keepdims=True) ** (1.0 / p), casting="unsafe")
    return Kernel(op, [Spec((N, C) + (1,) * len(S), x.dtype)], bind_global, flops=numel(x.shape))
  K = list(attrs["kernel_shape"])
  out_sp, pb, pe, need_end, strides, dil = window_geometry(op, attrs, S, K, bool(attrs.get("ceil_mode", 0)))
  pad_shape = (N, C) + tuple(s + b + e for s, b, e in zip(S, pb, need_end))
  check_tensor(pad_shape, x.dtype, f"{op} padded input")
  interior = (slice(None), slice(None)) + tuple(slice(b, b + s) for b, s in zip(pb, S))
  red = tuple(range(2, 2 + len(S)))

  def bind(ins, outs, scr):
    a, o = ins[0], outs[0]

    def run():
      P = np.zeros(pad_shape, x.dtype)
      P[interior] = np.abs(a) ** p
      sums = windows(P, K, out_sp, strides, dil, (N, C)).sum(axis=red)
      np.copyto(o, sums ** (1.0 / p), casting="unsafe")
    return run
  return Kernel(op, [Spec((N, C) + tuple(out_sp), x.dtype)], bind, flops=numel(out_sp) * N * C * numel(K))
