"""VisionIpcClient: maps a stream's buffers once, then turns bus announcements into zero-copy VisionBufs.

Invariants:
- The announcement subscriber exists from construction, so frames announced between connect() and the
  first recv() are not lost.
- A frame whose buffer was refilled before recv() reached it (a slow in-order reader) is handed out as the
  reference does, with its announced metadata, and reads `still_valid() == False` from the start; it is counted
  in `delivered_overwritten`. With `skip_overwritten=True` (the daemons and the logger) it is skipped instead
  and counted in `skipped_overwritten`, so recv() returns only frames whose buffer holds exactly the announced
  generation at that moment.
- An announcement from another server_id means the server restarted: recv() reconnects by itself (no
  blocking) and continues; ids of replaced servers are remembered so their leftover announcements are dropped.
- With periodic frames the client sleeps until just before the next one is due and polls from there
  (pacing.py), so the hand-off does not pay an idle CPU's wake-up. Never under the fake (gated) backend,
  whose every receive() is a replay step.
- While polling with no announcement queued, the client also watches the doorbell: the generation words of
  the buffer the server fills next. They agree once the fill and the announcement fields in the trailer are
  complete (buffer.py), so the frame is taken before the server has even encoded its announcement; that
  announcement is dropped when it comes. The doorbell only rings for a generation newer than any taken, and
  only with no announcement queued: a producer publishes a frame's announcement before it rings the next
  doorbell, so a frame taken there is the next one in announcement order, and at most one is pending.
- Nothing from the peer is trusted: descriptors, fds and announcements are validated before use, and a bad
  one is a ProtocolError (connect) or a counted, dropped announcement (recv) — never a read past a buffer.
  An announcement must name a generation newer than any taken from its buffer (so a replayed one never
  delivers a frame twice), one the buffer has held, and, while the buffer still holds it, agree with what the
  fill stamped into the trailer (frame_id, sof, eof, valid).
- A server that is busy (full backlog, slow answer) is retried like a missing one; no attempt outlives the
  caller's timeout (recv's, at least _RETRY_S for the answer).
"""
import errno
import os
import socket
import time

from msgq import sub_sock
from msgq.fake import fake_enabled
from visionipc import protocol
from visionipc.buffer import BufferMapping, VisionBuf
from visionipc.endpoints import announce_endpoint, check_name, check_stream, control_socket_path
from visionipc.errors import ProtocolError, UnknownStreamError, VisionIpcError
from visionipc.pacing import DEFAULT_LEAD_S, ArrivalPacing

_RETRY_S = 0.02
_CONTROL_TIMEOUT_S = 2.0
# no server, or one too busy to take us now (a full backlog is EAGAIN, a slow answer a timeout): try again
_UNREACHABLE = (FileNotFoundError, ConnectionRefusedError, ConnectionResetError, BrokenPipeError, BlockingIOError,
                TimeoutError)


def _request(name: str, kind: int, stream: int, deadline: float | None = None):
  """One control-socket round trip -> (reply bytes, fds), within _CONTROL_TIMEOUT_S and the time.monotonic()
  `deadline` if given. Raises an _UNREACHABLE error if no server answers by then."""
  timeout = _CONTROL_TIMEOUT_S if deadline is None else min(_CONTROL_TIMEOUT_S, deadline - time.monotonic())
  s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
  try:
    s.settimeout(max(timeout, 0.001))
    s.connect(control_socket_path(name))
    s.sendall(protocol.encode_request(kind, stream))
    reply, fds, flags, _ = socket.recv_fds(s, protocol.MAX_REPLY_BYTES + 1, protocol.MAX_BUFFERS + 1)
  finally:
    s.close()
  if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or not reply:
    _close_all(fds)
    if not reply:
      raise ConnectionResetError(errno.ECONNRESET, f"visionipc server {name!r} closed without answering")
    raise ProtocolError(f"reply from visionipc server {name!r} was truncated")
  return reply, fds


def _close_all(fds) -> None:
  for fd in fds:
    try:
      os.close(fd)
    except OSError:
      pass


def available_streams(name: str, block: bool = False, timeout: float | None = None) -> set[int]:
  """Streams served by `name`; empty if no server (block=True waits for one, up to `timeout` s if given)."""
  check_name(name)
  deadline = None if timeout is None else time.monotonic() + timeout
  while True:
    try:
      reply, fds = _request(name, protocol.KIND_LIST, protocol.STREAM_LIST, deadline)
      _close_all(fds)
      return protocol.decode_stream_list(reply)
    except _UNREACHABLE:
      if not block or (deadline is not None and time.monotonic() >= deadline):
        return set()
      time.sleep(_RETRY_S)


class VisionIpcClient:
  def __init__(self, name: str, stream: int, conflate: bool = False, spin_lead_s: float = DEFAULT_LEAD_S,
               skip_overwritten: bool = False):
    """spin_lead_s: how long before a periodic frame is due the client starts polling (0: always sleep).
    skip_overwritten: never hand out a frame whose buffer was already refilled (see the module docstring)."""
    self.name = check_name(name)
    self.stream = check_stream(stream)
    self.conflate, self.skip_overwritten = conflate, skip_overwritten
    self._sub = sub_sock(announce_endpoint(name, self.stream), conflate=conflate)
    self._pacing = ArrivalPacing(0.0 if fake_enabled() else spin_lead_s)
    self._buffers: list[BufferMapping] = []
    self.server_id: int | None = None
    self._replaced_servers: set[int] = set()
    self._last_idx: int | None = None  # buffer of the last frame taken off the bus or the doorbell
    self._newest_generation = 0  # newest generation taken so far (delivered or found overwritten)
    self._taken: list[int] = []  # per buffer, the generation last taken from it
    self._rung_generation = 0  # taken from the doorbell, its announcement not yet seen
    self.frame_id = self.timestamp_sof = self.timestamp_eof = 0
    self.valid = False
    self.skipped_overwritten = 0   # announced frames already overwritten when recv() reached them, skipped
    self.delivered_overwritten = 0  # the same, handed out (still_valid() False) as the reference does
    self.bad_announcements = 0     # dropped: malformed, out of range, replayed, or not matching the buffer's trailer
    self.reconnects = 0
    self._recv_deadline = 0.0  # the running recv()'s; bounds a reconnect made inside it
    self.ab_doorbell = True  # off only for bench/vipc_latency.py --ab doorbell, which measures what it is worth

  available_streams = staticmethod(available_streams)

  # ---- connection

  def is_connected(self) -> bool:
    return bool(self._buffers)

  def connect(self, blocking: bool = True, timeout: float | None = None) -> bool:
    """Map the stream's buffers. False if no server answers (within `timeout` s, which also bounds a
    non-blocking attempt; a busy server counts as not there yet). A server without this stream raises
    UnknownStreamError; a malformed reply raises ProtocolError."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
      try:
        self._connect_once(deadline)
        return True
      except _UNREACHABLE:
        if not blocking or (deadline is not None and time.monotonic() >= deadline):
          return False
        time.sleep(_RETRY_S)

  def _connect_once(self, deadline: float | None = None) -> None:
    reply, fds = _request(self.name, protocol.KIND_BUFFERS, self.stream, deadline)
    mappings: list[BufferMapping] = []
    try:
      status, server_id, stream, count = protocol.decode_reply_header(reply)
      if status == protocol.STATUS_UNKNOWN_STREAM:
        served = sorted(protocol.decode_stream_ids(reply, count))
        raise UnknownStreamError(f"visionipc server {self.name!r} has no stream {self.stream}; it serves {served}")
      if status != protocol.STATUS_OK or stream != self.stream:
        raise ProtocolError(f"server {self.name!r} answered {protocol.STATUS_NAMES[status]!r} for stream {stream} "
                            f"to a request for stream {self.stream}")
      descs = protocol.decode_buffer_descs(reply, count)
      if len(fds) != count:
        raise ProtocolError(f"server {self.name!r} described {count} buffers but passed {len(fds)} fds")
      geometry = descs[0][1:]
      for i, (fd, desc) in enumerate(zip(fds, descs)):
        if desc[1:] != geometry:
          raise ProtocolError(f"buffer {i} of stream {self.stream} differs in geometry from buffer 0")
        mappings.append(BufferMapping.attach(fd, desc, i))
    except BaseException:
      for m in mappings:
        m.close()
      _close_all(fds[len(mappings):])
      raise
    if self.server_id is not None and self.server_id != server_id:
      self._replaced_servers.add(self.server_id)
      self.reconnects += 1
    same_server = server_id == self.server_id and len(mappings) == len(self._taken)
    self._drop_buffers()
    self._buffers, self.server_id = mappings, server_id
    if not same_server:  # a new server has its own phase, ring position and generations
      self._pacing.reset()
      self._last_idx, self._newest_generation, self._rung_generation = None, 0, 0
      self._taken = [0] * len(mappings)

  def _drop_buffers(self) -> None:
    for m in self._buffers:
      m.close()
    self._buffers = []

  def _try_connect(self) -> bool:
    """One non-blocking connect attempt from recv(): a server that is missing, lacks this stream or
    misbehaves leaves the client disconnected (recv() returns None and retries later) instead of raising.
    It waits for an answer until recv()'s deadline, and at least _RETRY_S (a reply needs the server's turn)."""
    try:
      return self.connect(blocking=False, timeout=max(_RETRY_S, self._recv_deadline - time.monotonic()))
    except VisionIpcError:
      return False

  # ---- receiving

  def recv(self, timeout_ms: int = 100) -> VisionBuf | None:
    """The next announced frame (the newest one with conflate), or None after `timeout_ms`.
    Connects (and after a server restart reconnects) by itself; while that fails it just returns None."""
    deadline = self._recv_deadline = time.monotonic() + max(timeout_ms, 0) / 1000
    while True:
      if not self._buffers and not self._try_connect():  # never connected, or the server restarted
        remaining = deadline - time.monotonic()
        if remaining <= 0:
          return None
        time.sleep(min(_RETRY_S, remaining))
        continue
      msg = None
      window = self._pacing.poll_window()
      if window is not None:  # both waits below return a queued announcement at once
        start, end = window
        if time.monotonic() < start:
          msg = self._sleep_for_announcement(min(start, deadline))
          if msg is None and start <= deadline:
            self._pacing.woke_late(time.monotonic() - start)
        if msg is None:
          frame, msg = self._poll(min(end, deadline))
          if frame is not None:
            return frame
      if msg is None:
        msg = self._sleep_for_announcement(deadline)
        if msg is None:
          return None
      frame = self._frame_from(msg, time.monotonic())
      if frame is not None:
        return frame
      # a skipped announcement: keep going (non-blocking once the deadline passed) until the queue is empty

  def _sleep_for_announcement(self, until: float) -> bytes | None:
    self._sub.setTimeout(max(0.0, (until - time.monotonic()) * 1000))  # fractional ms: the lead is ~1 ms
    return self._sub.receive()

  def _poll(self, until: float) -> tuple[VisionBuf | None, bytes | None]:
    """Poll until `until` for the next frame: (frame, None) from the doorbell, (None, announcement) from
    the bus, or (None, None). Queued announcements go first, so frames still come in order; only with the
    queue empty is the doorbell of the buffer the server fills next the next frame."""
    receive, clock, yield_cpu = self._sub.receive, time.monotonic, os.sched_yield
    # The doorbell hands a frame over ~85 us sooner at p50 than its announcement (bench/results/vipc_ab_doorbell.json)
    bell = self._doorbell() if self.ab_doorbell else None
    rung = bell.trailer if bell is not None else None  # rings when its gen_end passes every generation taken
    while True:
      msg = receive(True)
      if msg is not None:
        return None, msg
      if rung is not None and rung[1] > self._newest_generation:
        frame = self._frame_from_doorbell(bell)
        if frame is not None:
          return frame, None
      if clock() >= until:
        return None, None
      yield_cpu()  # the producer may need this very core

  def _doorbell(self) -> BufferMapping | None:
    """The buffer the server fills after the last frame we saw (servers fill their ring in order), or None
    before the first frame. A producer that picks buffers out of order just never rings it."""
    if self._last_idx is None:
      return None
    return self._buffers[(self._last_idx + 1) % len(self._buffers)]

  def _frame_from_doorbell(self, mapping: BufferMapping) -> VisionBuf | None:
    """The frame whose generation words just agreed, with the announcement fields the server wrote before
    the second one; None if a new fill started meanwhile (then its announcement or next doorbell follows)."""
    trailer = mapping.trailer
    generation = trailer[1]
    frame_id, sof, eof, valid = trailer[2], trailer[3], trailer[4], trailer[5] == 1
    if trailer[0] != generation:
      return None
    buf = VisionBuf(mapping, generation, frame_id, sof, eof, valid, self.server_id)
    self._took(mapping.idx, generation, time.monotonic())
    self._rung_generation = generation
    self.frame_id, self.timestamp_sof, self.timestamp_eof, self.valid = frame_id, sof, eof, valid
    return buf

  def _took(self, idx: int, generation: int, arrived: float) -> None:
    """Book a frame taken off the bus or the doorbell (delivered, or found overwritten)."""
    self._pacing.arrived(arrived)
    self._last_idx, self._newest_generation = idx, max(generation, self._newest_generation)
    self._taken[idx] = generation

  def _frame_from(self, msg: bytes, arrived: float) -> VisionBuf | None:
    try:
      idx, server_id, generation, frame_id, sof, eof, valid = protocol.decode_announce(msg)
    except ProtocolError:
      self.bad_announcements += 1
      return None
    if server_id != self.server_id:
      if server_id in self._replaced_servers:
        return None  # leftover from a server that has since been replaced
      self._drop_buffers()  # restarted: the old buffers no longer carry this server's frames
      if not self._try_connect():
        return None
      if server_id != self.server_id:
        self._replaced_servers.add(server_id)  # a leftover from an instance we never connected to
        return None
    if idx >= len(self._buffers):
      self.bad_announcements += 1
      return None
    if generation == self._rung_generation:
      self._rung_generation = 0
      return None  # its frame came through the doorbell already
    if generation <= self._taken[idx]:  # each fill of a buffer has a newer generation: a replay or duplicate
      self.bad_announcements += 1
      return None
    mapping = self._buffers[idx]
    trailer = mapping.trailer
    gen_start, gen_end = trailer[0], trailer[1]
    if gen_start != generation or gen_end != generation:
      if gen_start < generation and gen_end < generation:  # announced after its fill, so never one of ours
        self.bad_announcements += 1
        return None
      self._took(idx, generation, arrived)
      if self.skip_overwritten:
        self.skipped_overwritten += 1
        return None
      self.delivered_overwritten += 1
      return self._deliver(mapping, generation, frame_id, sof, eof, valid, server_id)
    if (trailer[2], trailer[3], trailer[4], trailer[5]) != (frame_id, sof, eof, valid):
      self.bad_announcements += 1  # not what the server stamped into this fill: not its announcement
      return None
    self._took(idx, generation, arrived)
    return self._deliver(mapping, generation, frame_id, sof, eof, valid, server_id)

  def _deliver(self, mapping, generation, frame_id, sof, eof, valid, server_id) -> VisionBuf:
    self.frame_id, self.timestamp_sof, self.timestamp_eof, self.valid = frame_id, sof, eof, valid
    return VisionBuf(mapping, generation, frame_id, sof, eof, valid, server_id)

  # ---- geometry of the connected stream (from buffer 0)

  def _first(self) -> BufferMapping:
    if not self._buffers:
      raise VisionIpcError(f"client of {self.name!r} stream {self.stream} is not connected")
    return self._buffers[0]

  width = property(lambda self: self._first().width)
  height = property(lambda self: self._first().height)
  stride = property(lambda self: self._first().stride)
  uv_offset = property(lambda self: self._first().uv_offset)
  buffer_len = property(lambda self: self._first().len)
  num_buffers = property(lambda self: len(self._buffers))

  def close(self) -> None:
    self._drop_buffers()
    if hasattr(self._sub, "close"):
      self._sub.close()

  def __enter__(self) -> "VisionIpcClient":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
