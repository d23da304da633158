"""Frame buffers: memfd shared memory with an overwrite-detecting trailer, and the VisionBuf frame handle.

Invariants:
- A buffer is one memfd of `mmap_len` bytes, sealed against shrinking and growing, so a mapping can never
  fault past its end, and against future writes once the server has mapped it: no later mapping can be
  writable, whoever opens it and however (a reopen through /proc included). Clients get a read-only fd.
  Image bytes are [0, len); the trailer (gen_start, gen_end, then the announcement fields: protocol.TRAILER)
  sits at `trailer_offset` (8-byte aligned, past the image).
- Only the server writes. A fill is: gen_start = g (new, never reused), pixels, the announcement fields
  (frame_id, sof, eof, valid), gen_end = g, then the announcement on the bus. A reader that finds
  gen_start == gen_end == g after using the pixels knows the frame was not touched meanwhile (each word is one
  aligned 8-byte store), and one that finds them equal before reading the fields has the frame's complete
  announcement (the doorbell, see client.py). The server writes the trailer through _fill.c, which fences
  these stores: a large memcpy may use non-temporal stores, which x86 does not keep in order with others.
- Clients map read-only (PROT_READ, read-only numpy views): a consumer cannot corrupt a frame other clients see.
- Every page is mapped up front (MAP_POPULATE; VIPC_PREFAULT=0 opts out): no page faults on the hot path.
"""
import fcntl
import mmap
import os
import sys

import numpy as np

from visionipc import protocol
from visionipc.env import VISIONIPC_ENV
from visionipc.errors import ProtocolError
from visionipc.nv12 import check_geometry

if sys.byteorder != "little":
  raise ImportError("visionipc buffers use little-endian trailer words; big-endian hosts are not supported")

_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
F_SEAL_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x0010)  # Linux >= 5.1; not every Python names it
_TRAILER_ALIGN = 64


def _populate_flag() -> int:
  """MAP_POPULATE unless VIPC_PREFAULT=0: every page of a buffer is mapped once, when it is attached, so a
  consumer never page-faults on the hot path when what it reads moves (a new warp after recalibration touches
  other rows), and its RSS does not creep up as it does. As msgq does (MSGQ_PREALLOC)."""
  return mmap.MAP_POPULATE if VISIONIPC_ENV.flag("VIPC_PREFAULT", True) else 0


def _trailer_offset(length: int) -> int:
  return (length + _TRAILER_ALIGN - 1) // _TRAILER_ALIGN * _TRAILER_ALIGN


class BufferMapping:
  """One mapped buffer of a stream: geometry, the mmap and numpy views over it (shared by all its frames)."""

  def __init__(self, fd: int, idx: int, width: int, height: int, stride: int, uv_offset: int, length: int,
               mmap_len: int, trailer_offset: int, writable: bool):
    self.fd, self.idx = fd, idx
    self.client_fd = -1  # the server's read-only fd of the same memory, the one clients get
    self.stream: int | None = None  # set by the owning server
    self.width, self.height, self.stride, self.uv_offset = width, height, stride, uv_offset
    self.len, self.mmap_len, self.trailer_offset = length, mmap_len, trailer_offset
    prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
    self.mm = mmap.mmap(fd, mmap_len, mmap.MAP_SHARED | _populate_flag(), prot=prot)
    self.data = memoryview(self.mm)[:length]
    self.y = np.ndarray((height, width), np.uint8, self.mm, 0, (stride, 1))
    self.uv = np.ndarray((height // 2, width), np.uint8, self.mm, uv_offset, (stride, 1))
    # native uint64 words: each item store/load is one aligned 8-byte access (the host is little-endian)
    self.trailer = memoryview(self.mm)[trailer_offset:trailer_offset + protocol.TRAILER.size].cast("Q")
    if not writable:
      for view in (self.y, self.uv):
        view.flags.writeable = False

  @classmethod
  def create(cls, name: str, idx: int, width: int, height: int, size: int, stride: int,
             uv_offset: int) -> "BufferMapping":
    """Allocate a fresh memfd (server side), map it writable, then seal it so that no other mapping can be."""
    trailer_offset = _trailer_offset(size)
    mmap_len = trailer_offset + _TRAILER_ALIGN
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
      os.ftruncate(fd, mmap_len)
      fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
      mapping = cls(fd, idx, width, height, stride, uv_offset, size, mmap_len, trailer_offset, writable=True)
    except BaseException:
      os.close(fd)
      raise
    try:
      fcntl.fcntl(fd, fcntl.F_ADD_SEALS, F_SEAL_FUTURE_WRITE | fcntl.F_SEAL_SEAL)
      mapping.client_fd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    except BaseException:
      mapping.close()
      raise
    return mapping

  @classmethod
  def attach(cls, fd: int, desc: tuple[int, ...], expected_idx: int) -> "BufferMapping":
    """Map a received fd read-only after proving its descriptor cannot lead to a read past the memory."""
    idx, width, height, stride, uv_offset, length, mmap_len, trailer_offset = desc
    if idx != expected_idx:
      raise ProtocolError(f"buffer descriptor {expected_idx} claims index {idx}")
    try:
      check_geometry(width, height, length, stride, uv_offset)
    except ValueError as e:
      raise ProtocolError(f"buffer {idx}: bad geometry: {e}") from None
    if trailer_offset % 8 or trailer_offset < length or trailer_offset + protocol.TRAILER.size > mmap_len:
      raise ProtocolError(f"buffer {idx}: trailer offset {trailer_offset} does not fit between len {length} "
                          f"and mmap_len {mmap_len}")
    actual = os.fstat(fd).st_size
    if actual < mmap_len:
      raise ProtocolError(f"buffer {idx}: descriptor says {mmap_len} bytes but the memory is {actual} bytes")
    try:
      seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError:
      seals = 0
    if not seals & fcntl.F_SEAL_SHRINK:
      raise ProtocolError(f"buffer {idx}: memory is not sealed against shrinking (it could vanish under a reader)")
    return cls(fd, idx, width, height, stride, uv_offset, length, mmap_len, trailer_offset, writable=False)

  def descriptor(self) -> bytes:
    return protocol.encode_buffer_desc(self.idx, self.width, self.height, self.stride, self.uv_offset, self.len,
                                       self.mmap_len, self.trailer_offset)

  def close(self) -> None:
    """Close the fd. The mapping itself is unmapped by the garbage collector once no frame handle or view
    uses it, so a consumer that still holds a frame never faults."""
    for fd in (self.fd, self.client_fd):
      if fd >= 0:
        os.close(fd)
    self.fd = self.client_fd = -1


class VisionBuf:
  """One frame in one shared buffer: zero-copy views plus the metadata it was announced with.

  `data` (memoryview of the `len` image bytes), `y` (height x width) and `uv` (height/2 x width, interleaved
  U,V bytes) all alias shared memory. Call `still_valid()` after using the pixels: False means the server
  reused the buffer meanwhile and what was read may be a mix of two frames.
  """
  __slots__ = ("_m", "generation", "frame_id", "timestamp_sof", "timestamp_eof", "valid", "server_id")

  def __init__(self, mapping: BufferMapping, generation: int, frame_id: int = 0, timestamp_sof: int = 0,
               timestamp_eof: int = 0, valid: bool = True, server_id: int = 0):
    self._m = mapping
    self.generation, self.frame_id, self.server_id = generation, frame_id, server_id
    self.timestamp_sof, self.timestamp_eof, self.valid = timestamp_sof, timestamp_eof, valid

  data = property(lambda self: self._m.data)
  y = property(lambda self: self._m.y)
  uv = property(lambda self: self._m.uv)
  width = property(lambda self: self._m.width)
  height = property(lambda self: self._m.height)
  stride = property(lambda self: self._m.stride)
  uv_offset = property(lambda self: self._m.uv_offset)
  len = property(lambda self: self._m.len)
  idx = property(lambda self: self._m.idx)
  fd = property(lambda self: self._m.fd)

  @property
  def stamped_frame_id(self) -> int:
    """The frame_id the server stamped into the buffer's trailer (the reference's tail check)."""
    return self._m.trailer[2]  # word order: protocol.TRAILER

  def still_valid(self) -> bool:
    """True iff the buffer still holds exactly the frame this handle was given (no fill started since)."""
    trailer = self._m.trailer
    return trailer[0] == self.generation and trailer[1] == self.generation

  def __repr__(self) -> str:
    return (f"VisionBuf(idx={self.idx}, {self.width}x{self.height}, stride={self.stride}, "
            f"frame_id={self.frame_id}, generation={self.generation})")
