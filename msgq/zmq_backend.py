"""ZMQ backend (opt-in with env ZMQ=1): TCP pub/sub for consumers on another machine.

Each endpoint gets a deterministic port, 8023 + FNV-1a-64(endpoint) % (65535 - 8023), as the last
commaai/msgq ZMQ backend did, so both ends agree without configuration. Publishers bind loopback unless
MSGQ_ZMQ_BIND_ADDR says otherwise. pyzmq is imported only when this backend is used.
"""
import math

from msgq.env import MSGQ_ENV
from msgq.errors import IpcError, MultiplePublishersError
from msgq.segment import check_endpoint

FNV_OFFSET, FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3
PORT_BASE, PORT_MAX = 8023, 65535


def fnv1a64(data: bytes) -> int:
  h = FNV_OFFSET
  for b in data:
    h = ((h ^ b) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
  return h


def port_for(endpoint: str) -> int:
  return PORT_BASE + fnv1a64(endpoint.encode()) % (PORT_MAX - PORT_BASE)


def _context():
  import zmq
  return zmq, zmq.Context.instance()


class ZmqPublisher:
  def __init__(self, endpoint, segment_size: int = 0):
    zmq, ctx = _context()
    self.endpoint = check_endpoint(endpoint)
    self.port = port_for(self.endpoint)
    self.sock = ctx.socket(zmq.PUB)
    self.sock.setsockopt(zmq.LINGER, 0)
    bind_addr = MSGQ_ENV.get("MSGQ_ZMQ_BIND_ADDR", "127.0.0.1")
    try:
      self.sock.bind(f"tcp://{bind_addr}:{self.port}")
    except zmq.ZMQError as e:
      self.sock.close()
      if e.errno == zmq.EADDRINUSE:
        raise MultiplePublishersError(f"endpoint {self.endpoint!r}: port {self.port} is already bound") from e
      raise IpcError(f"endpoint {self.endpoint!r}: cannot bind {bind_addr}:{self.port}: {e}") from e
    self._send = self.sock.send
    self._noblock = zmq.NOBLOCK

  def send(self, data) -> None:
    self._send(data, self._noblock, copy=len(data) < 65536)

  def all_readers_updated(self) -> bool:
    raise IpcError("all_readers_updated is not available with the ZMQ backend")

  def close(self) -> None:
    self.sock.close()


class ZmqSubscriber:
  def __init__(self, endpoint, address: str = "127.0.0.1", conflate: bool = False, segment_size: int = 0):
    zmq, ctx = _context()
    self.endpoint = check_endpoint(endpoint)
    self.port = port_for(self.endpoint)
    self.sock = ctx.socket(zmq.SUB)
    self.sock.setsockopt(zmq.LINGER, 0)
    if conflate:
      self.sock.setsockopt(zmq.CONFLATE, 1)
    self.sock.setsockopt(zmq.RECONNECT_IVL_MAX, 500)
    self.sock.setsockopt(zmq.SUBSCRIBE, b"")
    self.sock.connect(f"tcp://{address}:{self.port}")
    self.timeout_s: float | None = None
    self.dropped = 0  # ZMQ does not report drops
    self._zmq = zmq

  def ready(self) -> bool:
    return bool(self.sock.poll(0))

  def receive(self, non_blocking: bool = False):
    zmq = self._zmq
    if not non_blocking:
      timeout = -1 if self.timeout_s is None else math.ceil(self.timeout_s * 1000)  # zmq polls in whole ms
      if not self.sock.poll(timeout):
        return None
    try:
      return self.sock.recv(zmq.NOBLOCK)
    except zmq.Again:
      return None

  def close(self) -> None:
    self.sock.close()
