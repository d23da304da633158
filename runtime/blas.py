"""numpy's bundled OpenBLAS reached through ctypes: its thread count, and sgemm for the numpy kernels and for
the generated code (which gets the function pointer at link time).

OpenBLAS always runs on one thread here (set when the library is first loaded, and again before each run of a
program). Why: its idle workers spin after each call, and on a machine with few cores they took the cores from the
runtime's own worker pool, which splits kernels, the micro-kernel GEMM and large sgemm calls (in column blocks,
each one single-threaded sgemm) across the program's threads; two thread pools made 2 threads slower than one. On a
2-core machine shared with other processes, a multi-threaded BLAS also waited for a descheduled worker on every
call. Where the library cannot be found, `set_threads` is a no-op and `available()` is False.

`gemm_call` binds a float32 C = A @ B + beta * C on fixed arrays straight to cblas_sgemm: numpy's matmul
has no beta, and accumulating GEMMs (beta = 1) save a temporary and an add pass per call. Where sgemm
cannot be found, `gemm_call` returns None and callers keep their numpy path."""
from __future__ import annotations

import ctypes
import glob
import os

import numpy as np


_lib = None
_set = _get = _sgemm = None
ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112  # CBLAS enums


def _load():
  global _lib, _set, _get, _sgemm
  if _lib is not None:
    return
  _lib = False
  libdir = os.path.join(os.path.dirname(np.__file__), "..", "numpy.libs")
  for path in glob.glob(os.path.join(libdir, "*openblas*")):
    try:
      lib = ctypes.CDLL(path)
    except OSError:
      continue
    for prefix, suffix in (("scipy_openblas_", "64_"), ("openblas_", ""), ("scipy_openblas_", ""),
                           ("openblas_", "64_")):
      s = getattr(lib, f"{prefix}set_num_threads{suffix}", None)
      g = getattr(lib, f"{prefix}get_num_threads{suffix}", None)
      if s is not None and g is not None:
        s.argtypes, g.restype = [ctypes.c_int], ctypes.c_int
        _lib, _set, _get = lib, s, g
        s(1)  # from the first use on: never OpenBLAS's own default of one per core
        cblas = "scipy_cblas_sgemm" if prefix.startswith("scipy") else "cblas_sgemm"
        gemm = getattr(lib, cblas + ("64_" if suffix else ""), None)
        if gemm is not None:
          integer = ctypes.c_int64 if suffix else ctypes.c_int
          gemm.restype = None
          gemm.argtypes = ([ctypes.c_int] * 3 + [integer] * 3 + [ctypes.c_float, ctypes.c_void_p, integer,
                           ctypes.c_void_p, integer, ctypes.c_float, ctypes.c_void_p, integer])
          _sgemm = (gemm, integer)
        return


def available() -> bool:
  _load()
  return bool(_lib)


def get_threads() -> int | None:
  _load()
  return int(_get()) if _lib else None


def set_threads(n: int) -> None:
  if not isinstance(n, int) or n < 1:
    raise ValueError(f"BLAS thread count must be a positive integer, got {n!r}")
  _load()
  if _lib and _get() != n:
    _set(n)


def gemm_available() -> bool:
  _load()
  return _sgemm is not None


def _operand(a: np.ndarray):
  """(transpose flag, leading dimension) of a 2-D float32 view BLAS can read in place, or None."""
  if a.ndim != 2 or a.dtype != np.float32:
    return None
  (s0, s1), item = a.strides, a.itemsize
  if (s1 == item or a.shape[1] == 1) and s0 % item == 0 and s0 // item >= max(a.shape[1], 1):
    return NO_TRANS, s0 // item
  if (s0 == item or a.shape[0] == 1) and s1 % item == 0 and s1 // item >= max(a.shape[0], 1):
    return TRANS, s1 // item
  return None


def gemm_call(A: np.ndarray, B: np.ndarray, C: np.ndarray, beta: float = 0.0):
  """A zero-argument callable computing C = A @ B + beta * C in place, or None when sgemm is unavailable
  or an operand's layout is not one BLAS reads directly. The arrays must outlive the callable."""
  _load()
  if _sgemm is None:
    return None
  ops = [_operand(A), _operand(B), _operand(C)]
  if any(o is None for o in ops) or ops[2][0] != NO_TRANS:
    return None
  (m, k), (k2, n) = A.shape, B.shape
  if C.shape != (m, n) or k != k2:
    raise ValueError(f"gemm shapes differ: A {A.shape} @ B {B.shape} -> C {C.shape}")
  fn, integer = _sgemm
  args = (ROW_MAJOR, ops[0][0], ops[1][0], integer(m), integer(n), integer(k), ctypes.c_float(1.0),
          ctypes.c_void_p(A.ctypes.data), integer(ops[0][1]), ctypes.c_void_p(B.ctypes.data), integer(ops[1][1]),
          ctypes.c_float(beta), ctypes.c_void_p(C.ctypes.data), integer(ops[2][1]))
  return lambda: fn(*args)


def sgemm_int_ctype() -> str | None:
  """The C type of the found sgemm's integer arguments (ILP64 builds take int64), or None without sgemm."""
  _load()
  if _sgemm is None:
    return None
  return "int64_t" if _sgemm[1] is ctypes.c_int64 else "int"


def sgemm_address() -> int:
  """The address of cblas_sgemm, for generated code to call (the caller checked sgemm_int_ctype())."""
  _load()
  return ctypes.cast(_sgemm[0], ctypes.c_void_p).value
