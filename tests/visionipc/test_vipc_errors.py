"""VisionIPC failure paths: every bad input is a typed error naming the value, or None after a timeout."""
import fcntl
import os
import socket
import threading
import time

import numpy as np
import pytest

from visionipc import (FrameSizeError, GeometryError, ProtocolError, UnknownStreamError, VisionIpcClient,
                       VisionIpcError, VisionIpcServer, protocol)
from visionipc.endpoints import control_socket_path


@pytest.fixture
def server(local_server):
  return local_server(2)


def test_send_with_the_wrong_length_names_both_sizes(server):
  with pytest.raises(FrameSizeError, match=r"4607 bytes, buffers hold 4608"):
    server.send(0, bytes(4607))
  with pytest.raises(UnknownStreamError, match=r"no stream 3"):
    server.send(3, bytes(4608))
  with pytest.raises(UnknownStreamError, match=r"no stream \[0\]"):
    server.send([0], bytes(4608))


def test_send_copies_any_layout_of_the_right_size_and_refuses_what_is_not_bytes(server):
  client = VisionIpcClient("camerad", 0)
  assert client.connect(blocking=True, timeout=10)
  pixels = np.arange(2 * 4608, dtype=np.uint8)
  for frame_id, data in enumerate([pixels[:4608].reshape(72, 64), pixels[::2], pixels[:4608].view(np.float32),
                                   bytearray(pixels[:4608])]):
    server.send(0, data, frame_id)
    buf = client.recv(1000)
    assert buf.frame_id == frame_id and bytes(buf.data) == np.ascontiguousarray(data).tobytes()
  with pytest.raises(TypeError, match="C-contiguous bytes-like object or a numpy array, got list"):
    server.send(0, [0] * 4608)
  client.close()


@pytest.mark.parametrize("args, message", [
  ((0, 2, 64, 48, 4608, 32, 3072), "stride 32 is smaller than the width 64"),
  ((0, 2, 64, 48, 4000, 64, 3072), "size 4000 too small"),
  ((0, 2, 64, 48, 4608, 64, 100), "uv_offset 100 overlaps"),
  ((0, 2, 63, 48, 9999, 64, 3072), "even width and height"),
  ((0, 0, 64, 48, 4608, 64, 3072), "num_buffers must be 1..127"),
  ((0, 200, 64, 48, 4608, 64, 3072), "num_buffers must be 1..127"),
])
def test_impossible_geometry_is_refused(args, message):
  with VisionIpcServer("camerad") as srv, pytest.raises(GeometryError, match=message):
    srv.create_buffers_with_sizes(*args)


def test_server_misuse_is_an_error(server):
  with pytest.raises(VisionIpcError, match="before start_listener"):
    server.create_buffers(1, 2, 64, 48)
  with pytest.raises(ValueError, match="stream must be an int"):
    VisionIpcServer("other").create_buffers(-1, 2, 64, 48)
  with pytest.raises(ValueError, match="server name"):
    VisionIpcServer("../etc")
  with pytest.raises(VisionIpcError, match="already running"):
    VisionIpcServer("camerad").start_listener()
  stale = server.get_buffer(0)
  server.get_buffer(0, idx=stale.idx)  # the same buffer handed out again: the first handle is stale
  with pytest.raises(VisionIpcError, match="not the one being filled"):
    server.send_buffer(stale, 1)
  with pytest.raises(IndexError, match="buffers 0..1, got index 5"):
    server.get_buffer(0, idx=5)


def test_missing_server_gives_false_or_none_after_the_timeout():
  client = VisionIpcClient("nobody", 0)
  assert client.connect(blocking=False) is False
  start = time.monotonic()
  assert client.connect(blocking=True, timeout=0.3) is False
  assert time.monotonic() - start >= 0.3
  assert client.recv(timeout_ms=100) is None
  assert not client.is_connected()
  with pytest.raises(VisionIpcError, match="not connected"):
    _ = client.width


def test_unknown_stream_names_the_served_streams(server):
  with pytest.raises(UnknownStreamError, match=r"no stream 2; it serves \[0\]"):
    VisionIpcClient("camerad", 2).connect(blocking=True, timeout=5)
  assert VisionIpcClient("camerad", 2).recv(timeout_ms=100) is None  # recv() stays lenient: None, no raise


def test_malformed_announcements_are_dropped_and_counted(server):
  client = VisionIpcClient("camerad", 0)
  assert client.connect(True, timeout=10)
  server.send(0, np.zeros(4608, np.uint8), frame_id=1)
  rogue = server._streams[0].publisher  # what a confused or hostile publisher could put on the topic
  rogue.send(b"garbage")
  rogue.send(protocol.encode_announce(99, server.server_id, 1, 1, 0, 0, True))  # index past the ring
  rogue.send(protocol.encode_announce(0, server.server_id, 12345, 1, 0, 0, True))  # generation never filled
  assert client.recv(5000).frame_id == 1
  assert client.recv(200) is None
  assert client.bad_announcements == 3 and client.skipped_overwritten == 0


class FakeServer:
  """A control socket that answers every request with a crafted reply and fds (a buggy or hostile server)."""

  def __init__(self, reply: bytes, fds: list[int]):
    self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    self.sock.bind(control_socket_path("fake"))
    self.sock.listen(4)
    self.reply, self.fds = reply, fds
    self.thread = threading.Thread(target=self.serve, daemon=True)
    self.thread.start()

  def serve(self):
    conn, _ = self.sock.accept()
    with conn:
      conn.recv(64)
      socket.send_fds(conn, [self.reply], self.fds)

  def close(self):
    self.thread.join(timeout=10)
    self.sock.close()
    for fd in self.fds:
      os.close(fd)


def sealed_memfd(size: int, seal: bool = True) -> int:
  fd = os.memfd_create("fake", os.MFD_ALLOW_SEALING)
  os.ftruncate(fd, size)
  if seal:
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
  return fd


def desc(length=4608, mmap_len=4672, stride=64, uv_offset=3072, trailer=4608, idx=0):
  return protocol.encode_buffer_desc(idx, 64, 48, stride, uv_offset, length, mmap_len, trailer)


@pytest.mark.parametrize("body, memfd_size, seal, message", [
  ([desc(mmap_len=1 << 20)], 4672, True, "descriptor says 1048576 bytes but the memory is 4672"),
  ([desc(length=1 << 20, mmap_len=(1 << 20) + 64, trailer=1 << 20)], 4672, True, "memory is 4672"),
  ([desc(stride=8)], 4672, True, "bad geometry"),
  ([desc(trailer=4670)], 4672, True, "trailer offset 4670"),
  ([desc(idx=3)], 4672, True, "claims index 3"),
  ([desc()], 4672, False, "not sealed against shrinking"),
  ([desc(), desc(idx=1)], 4672, True, "described 2 buffers but passed 1 fds"),
])
def test_bad_descriptors_are_refused_before_mapping(body, memfd_size, seal, message):
  fd = sealed_memfd(memfd_size, seal)
  fake = FakeServer(protocol.encode_reply(protocol.STATUS_OK, 7, 0, body), [fd])
  try:
    with pytest.raises(ProtocolError, match=message):
      VisionIpcClient("fake", 0).connect(blocking=False)
  finally:
    fake.close()


def test_reply_with_a_wrong_version_is_refused():
  reply = bytearray(protocol.encode_reply(protocol.STATUS_OK, 7, 0, [desc()]))
  reply[4] = 9
  fake = FakeServer(bytes(reply), [sealed_memfd(4672)])
  try:
    with pytest.raises(ProtocolError, match="version 9 is not supported"):
      VisionIpcClient("fake", 0).connect(blocking=False)
  finally:
    fake.close()


def test_garbage_request_gets_a_bad_request_reply_and_the_server_keeps_serving(server):
  s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
  s.settimeout(10)
  s.connect(control_socket_path("camerad"))
  s.send(b"hello, server")
  status, *_ = protocol.decode_reply_header(s.recv(4096))
  s.close()
  assert status == protocol.STATUS_BAD_REQUEST
  assert VisionIpcClient("camerad", 0).connect(True, timeout=10)
