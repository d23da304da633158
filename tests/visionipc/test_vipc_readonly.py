"""Clients get frame memory they cannot write: read-only fds of memfds sealed against future writes, mapped
PROT_READ. A client that tries every way to write pixels fails, and other clients keep seeing the frame."""
import ctypes
import fcntl
import mmap
import os

import numpy as np
import pytest

from visionipc import VisionIpcClient

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def _frame(server, client, value: int):
  server.send(0, np.full(client.buffer_len, value, np.uint8), frame_id=value)
  buf = client.recv(5000)
  assert buf is not None and buf.frame_id == value
  return buf


def test_a_client_cannot_write_the_pixels_other_clients_see(local_server):
  server = local_server(2)
  client = VisionIpcClient("camerad", 0)
  assert client.connect(True, timeout=10)
  buf = _frame(server, client, 7)
  fd, length = buf.fd, client._buffers[0].mmap_len
  assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
  with pytest.raises(OSError):
    os.pwrite(fd, b"\xff", 0)
  with pytest.raises(OSError):
    mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
  # reopening the memory read-write through /proc gets a new open file, but the seal still refuses writes
  rw = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)
  try:
    with pytest.raises(PermissionError):
      os.pwrite(rw, b"\xff", 0)
    with pytest.raises(PermissionError):
      mmap.mmap(rw, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
  finally:
    os.close(rw)
  # the client's own mapping cannot be made writable either
  mm = client._buffers[0].mm
  view = np.frombuffer(mm, np.uint8)
  addr = view.ctypes.data
  assert _libc.mprotect(ctypes.c_void_p(addr), length, mmap.PROT_READ | mmap.PROT_WRITE) == -1
  with pytest.raises((TypeError, ValueError)):
    buf.data[0] = 1
  with pytest.raises(ValueError):
    buf.y[0, 0] = 1
  # nothing changed for anyone: the frame is intact and another client sees the server's pixels
  assert buf.still_valid() and bytes(buf.data) == bytes([7]) * client.buffer_len
  other = VisionIpcClient("camerad", 0)
  assert other.connect(True, timeout=10)
  seen = _frame(server, other, 9)
  assert bytes(seen.data) == bytes([9]) * other.buffer_len
  client.close()
  other.close()


def test_the_server_still_fills_the_buffers_it_sealed(local_server):
  server = local_server(2)
  client = VisionIpcClient("camerad", 0)
  assert client.connect(True, timeout=10)
  for value in (1, 2, 3, 4):  # both buffers, twice: copying send and zero-copy get_buffer
    if value % 2:
      _frame(server, client, value)
    else:
      buf = server.get_buffer(0)
      buf.y[...] = value
      buf.uv[...] = value
      server.send_buffer(buf, value)
      got = client.recv(5000)
      assert got.frame_id == value and bytes(got.data) == bytes([value]) * client.buffer_len
  client.close()
