"""Sliding-window max/sum over whole flattened planes: every ufunc call is one long contiguous run.

Why: a pooling window reduced tap by tap over (C, H, W) views runs numpy's inner loop once per row (a few
dozen elements) or over a strided axis, where max/min have no SIMD path; both make pools 5-10x slower
than a pass over contiguous memory. Here the input (zero-, or -inf-padded when the op has pads) is seen as
one flat array. Along spatial axis d, the window tap t of position p reads p + t * dil_d * step_d, where
step_d is that axis' flat stride, so reducing axis d is `k_d - 1` calls of `red(a[0:n], a[shift:shift+n])`
over the whole array. Positions whose window crosses a row, plane or image edge compute junk, but no output
reads them: an output's window always lies inside its own padded plane. The output is then one strided
copy (or, for averages, one multiply by the per-output divisor) from the wanted positions.

Invariants: the padded copy, the two work arrays and nothing else are scratch; `run()` allocates nothing;
reads never pass the end of the flat array (each pass shortens the valid length by its largest shift)."""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..graph import Spec
from .base import numel


CHUNK_BYTES = 192 << 10  # padded input per chunk of planes: the chunk and both work arrays stay in L2


def planes_per_chunk(pad_shape, dtype) -> int:
  return max(1, CHUNK_BYTES // (numel(pad_shape) * np.dtype(dtype).itemsize))


def flat_pool_scratch(lead: int, pad_shape, dtype, padded: bool) -> list[Spec]:
  """Scratch specs: (padded copy of one chunk of planes if any), then two flat work arrays of a chunk."""
  chunk = min(lead, planes_per_chunk(pad_shape, dtype))
  total = chunk * numel(pad_shape)
  specs = [Spec((chunk,) + tuple(pad_shape), dtype)] if padded else []
  return specs + [Spec((total,), dtype), Spec((total,), dtype)]


def bind_flat_pool(x, out, scratch, pad_copies, red, kernel, strides, dil, out_sp, recip):
  """Zero-argument callable pooling x (N, C, *S) into out (N, C, *out_sp), one chunk of planes at a time.

  `pad_copies(first, stop)` is None (no pads) or returns a callable filling scratch[0][:stop - first] with
  planes first..stop of x and the padding value; `red` is np.maximum or np.add; `recip` (shape out_sp)
  scales sums into averages, or None."""
  planes = x.reshape((-1,) + x.shape[2:], copy=False)
  outs = out.reshape((-1,) + tuple(out_sp), copy=False)
  pad_shape = scratch[0].shape[1:] if pad_copies is not None else planes.shape[1:]
  chunk = min(planes.shape[0], planes_per_chunk(pad_shape, x.dtype))
  calls = []
  for first in range(0, planes.shape[0], chunk):
    stop = min(first + chunk, planes.shape[0])
    if pad_copies is not None:
      calls.append(pad_copies(first, stop))
      src = scratch[0][:stop - first]
    else:
      src = planes[first:stop]
    calls += _chunk_calls(src, outs[first:stop], scratch[-2], scratch[-1], red, kernel, strides, dil, out_sp,
                          recip)

  def run():
    for c in calls:
      c()
  return run


def _chunk_calls(src, o, work_a, work_b, red, kernel, strides, dil, out_sp, recip):
  pad_shape = src.shape[1:]
  flat = src.reshape(-1, copy=False)
  steps = [numel(pad_shape[d + 1:]) for d in range(len(pad_shape))]
  calls, n, cur = [], flat.size, flat
  targets = [work_a, work_b]
  for d, (k, dl) in enumerate(zip(kernel, dil)):
    if k == 1:
      continue
    shift = dl * steps[d]
    m = n - (k - 1) * shift
    dst = targets[len(calls) % 2][:m]
    calls.append(_reduce_shifted(red, cur, dst, shift, k, m))
    cur, n = dst, m
  item = flat.itemsize
  # the wanted positions of the last result: (planes, *out) with the window strides
  view_strides = (numel(pad_shape) * item,) + tuple(s * st * item for s, st in zip(strides, steps))
  picked = as_strided(cur, shape=(src.shape[0],) + tuple(out_sp), strides=view_strides, writeable=False)
  if recip is None:
    calls.append(lambda: np.copyto(o, picked))
  else:
    calls.append(lambda: np.multiply(picked, recip, out=o))
  return calls


def _reduce_shifted(red, a, dst, shift, k, m):
  """dst[:m] = red over t < k of a[t * shift : t * shift + m] (dst is never a)."""
  taps = [a[t * shift:t * shift + m] for t in range(k)]

  def run():
    red(taps[0], taps[1], out=dst)
    for t in taps[2:]:
      red(dst, t, out=dst)
  return run
