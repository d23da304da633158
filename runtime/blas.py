"""BLAS thread count for the numpy kernels (numpy's bundled OpenBLAS, reached through ctypes).

Why: on a 2-core machine shared with other processes, a multi-threaded BLAS waits for a descheduled
worker thread on every call, which made whole models several times slower; the runtime therefore runs its
kernels with an explicit thread count (default 1, env PYMODELD_RUNTIME_THREADS). Where the library cannot
be found, `set_threads` is a no-op and `available()` is False."""
from __future__ import annotations

import ctypes
import glob
import os

import numpy as np

_lib = None
_set = _get = None


def _load():
    global _lib, _set, _get
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
                return


def available() -> bool:
    _load()
    return bool(_lib)


def default_threads() -> int:
    v = os.environ.get("PYMODELD_RUNTIME_THREADS", "1")
    try:
        n = int(v)
    except ValueError:
        raise ValueError(f"PYMODELD_RUNTIME_THREADS must be a positive integer, got {v!r}") from None
    if n < 1:
        raise ValueError(f"PYMODELD_RUNTIME_THREADS must be a positive integer, got {v!r}")
    return n


def get_threads() -> int | None:
    _load()
    return int(_get()) if _lib else None


def set_threads(n: int) -> None:
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"BLAS thread count must be a positive integer, got {n!r}")
    _load()
    if _lib and _get() != n:
        _set(n)
