"""Maximum/minimum against a constant, vectorised.

Why: numpy's maximum/minimum (numpy 2.x, float32) run a scalar loop when one operand is a Python scalar
or any stride-0 broadcast, about 5x slower than the same ufunc on two contiguous arrays. A contiguous
array is viewed as rows of ROW elements and combined with one shared row filled with the constant: both
operands are then contiguous in the inner loop and numpy takes its SIMD path. The result is bit-identical
to `ufunc(x, value)` (NaN propagates, -0.0 vs 0.0 follows the ufunc).

Invariants: rows are filled with `fill`, never calloc'ed (reading calloc's untouched zero pages made some
row lengths 10x slower); rows are cached per (value, dtype) and never written after creation."""
from __future__ import annotations

import numpy as np

ROW = 16384  # elements: long enough that the per-row loop overhead vanishes, small enough to stay in cache
_rows: dict = {}


def const_row(value, dtype) -> np.ndarray:
  dtype = np.dtype(dtype)
  key = (dtype.str, np.asarray(value, dtype).tobytes())
  row = _rows.get(key)
  if row is None:
    row = np.empty(ROW, dtype)
    row.fill(value)
    row.flags.writeable = False
    _rows[key] = row
  return row


def _flat(a: np.ndarray):
  return a.reshape(-1) if a.flags.c_contiguous else None


def bound_const_op(ufunc, src: np.ndarray, value, dst: np.ndarray):
  """A zero-argument callable computing dst = ufunc(src, value); src may be dst. Falls back to the plain
  ufunc call where the arrays are not contiguous or the dtypes differ."""
  fs, fd = _flat(src), _flat(dst)
  if fs is None or fd is None or src.shape != dst.shape or src.dtype != dst.dtype or src.dtype.kind not in "fiu":
    return lambda: ufunc(src, value, out=dst)
  row = const_row(value, src.dtype)
  n = fs.size // ROW * ROW
  body = (fs[:n].reshape(-1, ROW), fd[:n].reshape(-1, ROW))
  tail = (fs[n:], fd[n:], row[:fs.size - n])
  if n == 0:
    return lambda: ufunc(tail[0], tail[2], out=tail[1])
  if n == fs.size:
    return lambda: ufunc(body[0], row, out=body[1])

  def run():
    ufunc(body[0], row, out=body[1])
    ufunc(tail[0], tail[2], out=tail[1])
  return run
