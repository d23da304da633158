"""Host memory that generated kernels read: arrays whose data starts on an ALIGN boundary (256 bytes, a multiple
of every cache line and vector width the kernels are built for).

Why: numpy and the protobuf decoder leave arrays 16-byte aligned. A kernel that streams weights as vectors from
there (measured: a direct conv with lanes along the output channels) splits cache lines on its loads; which arrays
landed where changed from run to run, so a program's speed did. The arena, its scratch and the staged inputs are
allocated aligned; constants are copied aligned once, when they are decoded or built.
"""
from __future__ import annotations

import numpy as np

from .memory_plan import ALIGN


def aligned_bytes(nbytes: int, alloc=None) -> np.ndarray:
  """A uint8 array of nbytes whose data pointer is ALIGN-aligned (alloc(n): the uint8 array to carve it from)."""
  raw = alloc(nbytes + ALIGN) if alloc else np.empty(nbytes + ALIGN, np.uint8)
  shift = (-raw.ctypes.data) % ALIGN
  return raw[shift:shift + nbytes]


def aligned_copy(a: np.ndarray) -> np.ndarray:
  """a itself when it is C-contiguous and ALIGN-aligned, else an aligned C-contiguous copy (same dtype, shape,
  values and bits)."""
  if a.ctypes.data % ALIGN == 0 and a.flags.c_contiguous:
    return a
  out = aligned_bytes(a.nbytes).view(a.dtype).reshape(a.shape)
  out[...] = a
  return out
