"""The control-socket listener never waits on one peer: idle, silent or half-open connections cannot starve
real clients, and a client treats a busy server (EAGAIN on connect) as one to retry, never as a crash."""
import socket
import time

import numpy as np
import pytest

from visionipc import VisionIpcClient, available_streams, listener, protocol
from visionipc.endpoints import control_socket_path


def _idle_connections(path: str, count: int) -> list[socket.socket]:
  """Connect `count` peers that never send a request (those the backlog refuses are left out)."""
  peers = []
  for _ in range(count):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_NONBLOCK)
    try:
      s.connect(path)
      peers.append(s)
    except BlockingIOError:
      s.close()
  return peers


def test_many_idle_connections_do_not_starve_a_real_client(local_server):
  server = local_server(2)
  peers = _idle_connections(control_socket_path("camerad"), 200)
  try:
    client = VisionIpcClient("camerad", 0)
    assert client.connect(blocking=True, timeout=listener.PEER_TIMEOUT_S / 2)  # well before any idle one times out
    server.send(0, np.zeros(client.buffer_len, np.uint8), frame_id=5)
    assert client.recv(5000).frame_id == 5
    assert available_streams("camerad", block=True, timeout=listener.PEER_TIMEOUT_S / 2) == {0}
    client.close()
  finally:
    for s in peers:
      s.close()


def test_a_peer_that_sends_nothing_is_closed_after_its_deadline_and_the_oldest_give_way_to_new_ones(local_server):
  local_server(2)
  peers = _idle_connections(control_socket_path("camerad"), listener.MAX_PEERS + 8)
  try:
    time.sleep(0.5)
    oldest = peers[0]
    oldest.settimeout(5)
    assert oldest.recv(64) == b""  # evicted for a newer peer: the listener keeps at most MAX_PEERS waiting
    newest = peers[-1]
    newest.settimeout(listener.PEER_TIMEOUT_S + 10)
    start = time.monotonic()
    assert newest.recv(64) == b""  # closed at its deadline
    assert time.monotonic() - start <= listener.PEER_TIMEOUT_S + 5
  finally:
    for s in peers:
      s.close()


def test_a_peer_that_hangs_up_after_its_request_does_not_stop_the_listener(local_server):
  local_server(2)
  for _ in range(20):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(control_socket_path("camerad"))
    s.send(protocol.encode_request(protocol.KIND_BUFFERS, 0))
    s.close()  # gone before the reply with its fds
  assert VisionIpcClient("camerad", 0).connect(True, timeout=10)


@pytest.fixture
def full_backlog():
  """A control socket that never accepts, its backlog filled: every connect gets EAGAIN."""
  path = control_socket_path("busy")
  sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
  sock.bind(path)
  sock.listen(0)
  peers = _idle_connections(path, 64)
  yield path
  for s in peers:
    s.close()
  sock.close()


def test_a_client_treats_a_busy_server_as_not_there_yet_and_its_timeouts_hold(full_backlog):
  client = VisionIpcClient("busy", 0)
  assert client.connect(blocking=False) is False
  start = time.monotonic()
  assert client.connect(blocking=True, timeout=0.3) is False
  assert client.recv(timeout_ms=100) is None
  assert available_streams("busy", block=True, timeout=0.2) == set()
  assert time.monotonic() - start < 0.3 + 0.1 + 0.2 + 2.0  # the waits above, plus a loaded machine's slack
