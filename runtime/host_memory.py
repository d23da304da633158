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


SHARE_MIN_BYTES = 4096   # constants below this are left as they are: sharing them saves nothing worth a compare


def share_identical(consts: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """consts with every set of byte-identical arrays (same dtype and shape) made one array object, which link and the
  OpenCL device then place once.

  Why: each kernel lays out (packs) the constant operand it reads, so a weight that several nodes share (an unrolled
  RNN's W and R at every step, tied weights) was held once per node: an 8-step LSTM layer held 11 MiB of packed
  weights for its 1.5 MiB, and each step read its own copy through the caches. A sampled fingerprint picks the
  candidates and the whole bytes decide, so two arrays are shared only when every byte is equal (NaN payloads and
  signed zeros included). Names starting "out:" (a constant output, handed to the caller) are never shared."""
  seen: dict[tuple, list[np.ndarray]] = {}
  out = {}
  for name, a in consts.items():
    if name.startswith("out:") or a.nbytes < SHARE_MIN_BYTES or not a.flags.c_contiguous:
      out[name] = a
      continue
    flat = a.reshape(-1).view(np.uint8)
    key = (a.dtype.str, a.shape, flat[::max(1, flat.size // 64)].tobytes(), flat[-64:].tobytes())
    same = seen.setdefault(key, [])
    match = next((b for b in same if np.array_equal(flat, b.reshape(-1).view(np.uint8))), None)
    if match is None:
      same.append(a)
    out[name] = a if match is None else match
  return out
