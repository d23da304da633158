"""VisionIpcServer: owns the buffer rings, hands their fds to clients once, announces each frame on the bus.

Invariants:
- Streams are created before start_listener(); after that the set of streams and buffers never changes, so
  the listener thread only reads immutable state.
- Every fill gets a new generation number (server-wide counter, never reused); see buffer.py for the order
  of writes. The announcement is published only after the fill is complete.
- server_id is a random 64-bit number per server instance; clients use it to notice a restart.
- The control socket lives in the namespace's owner-only runtime dir and is served by listener.py, which holds
  the fixed replies and read-only fds but not the server: a server that is closed, deleted or collected
  releases its socket and its announcement endpoints at once, so a new one of the same name may start.
- Clients get each buffer as a read-only fd of a memfd sealed against future writes (buffer.py): only the
  server's own mapping, made before the seal, can write pixels.
"""
import gc
import os
import secrets
import weakref

import numpy as np

from msgq import pub_sock
from visionipc import protocol
from visionipc.buffer import BufferMapping, VisionBuf
from visionipc.endpoints import announce_endpoint, check_name, check_stream, control_socket_path
from visionipc.errors import FrameSizeError, GeometryError, UnknownStreamError, VisionIpcError
from visionipc.listener import ControlListener
from visionipc.nv12 import check_geometry, tight_nv12_layout

try:
  from visionipc import _fill
except ImportError as e:  # a checkout used without installing it
  raise ImportError("visionipc._fill (visionipc/_fill.c) is not built: run `pip install -e .` in the repository "
                    "(needs a C compiler and the Python headers)") from e


# This process's serving servers by control-socket path: one that only a garbage cycle still holds is gone,
# and a new server of its name collects it (which closes it) instead of finding the name taken.
_serving: "weakref.WeakValueDictionary[str, VisionIpcServer]" = weakref.WeakValueDictionary()


class _Stream:
  def __init__(self, mappings: list[BufferMapping], publisher):
    self.mappings = mappings
    self.publisher = publisher
    self.next_idx = 0


class VisionIpcServer:
  def __init__(self, name: str):
    self.name = check_name(name)
    self.server_id = secrets.randbits(64) | 1  # never 0, so a zeroed announcement can't match
    self._streams: dict[int, _Stream] = {}
    self._generation = 0
    self._listener: ControlListener | None = None

  # ---- setup

  def create_buffers(self, stream: int, num_buffers: int, *size) -> None:
    """Tight NV12 buffers (stride = width, uv_offset = width*height, size = width*height*3/2).

    create_buffers(stream, num_buffers, width, height) as commaai/msgq has it, or openpilot's older
    create_buffers(stream, num_buffers, rgb, width, height); only rgb=False (NV12) is served."""
    if len(size) == 3 and isinstance(size[0], bool):
      rgb, width, height = size
      if rgb:
        raise GeometryError(f"server {self.name!r}: RGB buffers are not served, only NV12 (rgb=False)")
    elif len(size) == 2:
      width, height = size
    else:
      raise TypeError(f"create_buffers(stream, num_buffers, width, height) or (stream, num_buffers, rgb, width, "
                      f"height), got {len(size) + 2} arguments")
    self.create_buffers_with_sizes(stream, num_buffers, width, height, *tight_nv12_layout(width, height))

  def create_buffers_with_sizes(self, stream: int, num_buffers: int, width: int, height: int, size: int,
                                stride: int, uv_offset: int) -> None:
    stream = check_stream(stream)
    if self._listener is not None:
      raise VisionIpcError(f"server {self.name!r}: create stream {stream} before start_listener()")
    if stream in self._streams:
      raise VisionIpcError(f"server {self.name!r} already has stream {stream}")
    if len(self._streams) >= protocol.MAX_STREAMS:
      raise GeometryError(f"server {self.name!r} already has the maximum of {protocol.MAX_STREAMS} streams")
    if not isinstance(num_buffers, int) or not 1 <= num_buffers <= protocol.MAX_BUFFERS:
      raise GeometryError(f"num_buffers must be 1..{protocol.MAX_BUFFERS}, got {num_buffers!r}")
    try:
      check_geometry(width, height, size, stride, uv_offset)
    except ValueError as e:
      raise GeometryError(str(e)) from None
    mappings = []
    try:
      for i in range(num_buffers):
        mappings.append(BufferMapping.create(f"visionbuf_{self.name}_{stream}_{i}", i, width, height, size,
                                             stride, uv_offset))
      publisher = pub_sock(announce_endpoint(self.name, stream))
    except BaseException:
      for m in mappings:
        m.close()
      raise
    for m in mappings:
      m.stream = stream
    self._streams[stream] = _Stream(mappings, publisher)

  def start_listener(self) -> None:
    if self._listener is not None:
      return
    served = {stream: ([m.descriptor() for m in st.mappings], [m.client_fd for m in st.mappings])
              for stream, st in self._streams.items()}
    path = control_socket_path(self.name)
    if path in _serving:
      gc.collect()
    self._listener = ControlListener(path, self.name, self.server_id, served)
    _serving[path] = self

  # ---- producing frames

  def _stream(self, stream: int) -> _Stream:
    try:
      return self._streams[stream]
    except (KeyError, TypeError):
      raise UnknownStreamError(f"server {self.name!r} has no stream {stream!r}; it has {sorted(self._streams)}") \
        from None

  def get_buffer(self, stream: int, idx: int | None = None) -> VisionBuf:
    """The next buffer of the ring (or buffer `idx`), marked as being filled: write its pixels, then
    send_buffer() it. Any client still holding this buffer's previous frame now sees still_valid() False."""
    mapping, generation = self._start_fill(self._stream(stream), idx)
    return VisionBuf(mapping, generation, server_id=self.server_id)

  def send_buffer(self, buf: VisionBuf, frame_id: int = 0, timestamp_sof: int = 0, timestamp_eof: int = 0,
                  valid: bool = True) -> None:
    """Publish a buffer filled after get_buffer(); zero-copy."""
    mapping = buf._m
    if buf.server_id != self.server_id or mapping.trailer[0] != buf.generation:
      raise VisionIpcError(f"buffer {buf.idx} (generation {buf.generation}) is not the one being filled on "
                           f"server {self.name!r}; call get_buffer() again")
    st = self._streams.get(mapping.stream)
    if st is None or st.mappings[mapping.idx] is not mapping:  # e.g. a client's frame
      raise VisionIpcError(f"buffer {mapping.idx} does not belong to server {self.name!r}")
    _fill.complete(mapping.trailer, buf.generation, frame_id, timestamp_sof, timestamp_eof, valid)
    self._announce(st, mapping, buf.generation, frame_id, timestamp_sof, timestamp_eof, valid)
    buf.frame_id, buf.timestamp_sof, buf.timestamp_eof, buf.valid = frame_id, timestamp_sof, timestamp_eof, valid

  def send(self, stream: int, data, frame_id: int = 0, timestamp_sof: int = 0, timestamp_eof: int = 0,
           valid: bool = True) -> None:
    """Copy `data` (bytes-like of exactly the buffer length) into the next buffer and announce it.
    The fill is one C call (_fill.c: one memcpy between the ordered trailer stores, GIL held for the copy);
    nothing is written if `data` has the wrong size or a field is out of range."""
    st = self._stream(stream)
    idx = st.next_idx
    mapping, generation = st.mappings[idx], self._generation + 1
    try:
      copied = _fill.fill(mapping.data, mapping.trailer, data, generation, frame_id, timestamp_sof, timestamp_eof,
                          valid)
    except TypeError:
      if not isinstance(data, np.ndarray):
        raise TypeError(f"frame data must be a C-contiguous bytes-like object or a numpy array, got "
                        f"{type(data).__name__}") from None
      copied = _fill.fill(mapping.data, mapping.trailer, np.ascontiguousarray(data), generation, frame_id,
                          timestamp_sof, timestamp_eof, valid)  # e.g. a strided view
    if copied != mapping.len:  # nothing was written
      raise FrameSizeError(f"stream {stream} of server {self.name!r}: frame is {copied} bytes, "
                           f"buffers hold {mapping.len}")
    self._generation, st.next_idx = generation, (idx + 1) % len(st.mappings)
    self._announce(st, mapping, generation, frame_id, timestamp_sof, timestamp_eof, valid)

  def _start_fill(self, st: _Stream, idx: int | None = None) -> tuple[BufferMapping, int]:
    """Take the next buffer of the ring (or buffer `idx`) and give it a new generation in its gen_start word."""
    if idx is None:
      idx = st.next_idx
      st.next_idx = (idx + 1) % len(st.mappings)
    elif not isinstance(idx, int) or not 0 <= idx < len(st.mappings):
      raise IndexError(f"stream {st.mappings[0].stream} has buffers 0..{len(st.mappings) - 1}, got index {idx!r}")
    self._generation += 1
    mapping = st.mappings[idx]
    _fill.start(mapping.trailer, self._generation)
    return mapping, self._generation

  def _announce(self, st: _Stream, mapping: BufferMapping, generation: int, frame_id: int, timestamp_sof: int,
                timestamp_eof: int, valid: bool) -> None:
    """Publish the announcement of a complete fill (its gen_end, the doorbell, is already stored)."""
    # A client polling on this very CPU can only see the doorbell once we give the CPU up: let it take the
    # frame now, before the announcement is encoded and published (bench/vipc_latency.py measures both).
    os.sched_yield()
    st.publisher.send(protocol.encode_announce(mapping.idx, self.server_id, generation, frame_id, timestamp_sof,
                                               timestamp_eof, valid))
    # A reader the kernel woke onto this CPU would otherwise wait behind whatever the producer does next
    # (e.g. filling the next stream's buffer): let it take the frame first.
    os.sched_yield()

  # ---- teardown

  def close(self) -> None:
    """Stop serving and release every buffer and endpoint (also what dropping the server does)."""
    if self._listener is not None:
      self._listener.close()  # before the fds it sends are closed
      self._listener = None
    for st in self._streams.values():
      for m in st.mappings:
        m.close()
      if hasattr(st.publisher, "close"):
        st.publisher.close()
    self._streams.clear()

  def __enter__(self) -> "VisionIpcServer":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def __del__(self):
    try:
      self.close()
    except Exception:
      pass

