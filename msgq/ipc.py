"""The commaai/msgq socket API over our backends: shared-memory ring (default), ZMQ (env ZMQ=1) and the
fake/gated wrapper (env CEREAL_FAKE=1). The backend is chosen from the env when a socket connects."""
import os
import time

from msgq import futex, ring
from msgq.errors import IpcError
from msgq.fake import FakeSubscriber, fake_enabled
from msgq.ring import ShmPublisher, ShmSubscriber
from msgq.env import MSGQ_ENV
from msgq.segment import H_FUTEX
from msgq.zmq_backend import ZmqPublisher, ZmqSubscriber

MAX_POLLER_SOCKETS = 128  # futex_waitv's limit


def zmq_enabled() -> bool:
  return MSGQ_ENV.flag("ZMQ")


class Context:
  """A token, as in commaai/msgq; our backends keep no per-context state."""

  def term(self) -> None:
    pass


context = Context()


class PubSocket:
  def __init__(self):
    self._impl = None

  def connect(self, ctx: Context, endpoint, segment_size: int = 0) -> None:
    self._impl = ZmqPublisher(endpoint, segment_size) if zmq_enabled() else ShmPublisher(endpoint, segment_size)
    self.send = self._impl.send  # bound once: no extra call layer on the hot path

  def send(self, data) -> None:
    raise IpcError("PubSocket.send before connect")

  @property
  def endpoint(self) -> str:
    return self._impl.endpoint

  def all_readers_updated(self) -> bool:
    return self._impl.all_readers_updated()

  def wait_for_readers(self, timeout: float = 1.0, interval: float = 0.001) -> None:
    """Wait until at least one reader exists and every reader has read everything; else TimeoutError."""
    deadline = time.monotonic() + timeout
    while not self.all_readers_updated():
      if time.monotonic() >= deadline:
        raise TimeoutError(f"endpoint {self.endpoint!r}: readers not caught up after {timeout} s")
      time.sleep(interval)

  def close(self) -> None:
    if self._impl is not None:
      self._impl.close()


class SubSocket:
  def __init__(self):
    self._impl = self._base = None

  def connect(self, ctx: Context, endpoint, address: str = "127.0.0.1", conflate: bool = False,
              segment_size: int = 0) -> None:
    if isinstance(address, bytes):
      address = address.decode()
    if zmq_enabled():
      base = ZmqSubscriber(endpoint, address, conflate, segment_size)
    else:
      if address not in ("127.0.0.1", "localhost"):
        raise IpcError(f"address {address!r}: the shared-memory backend is local only; set ZMQ=1 for remote")
      base = ShmSubscriber(endpoint, conflate, segment_size)
    self._base = base
    self._impl = FakeSubscriber(base) if fake_enabled() else base
    self.receive = self._impl.receive

  def receive(self, non_blocking: bool = False):
    raise IpcError("SubSocket.receive before connect")

  def setTimeout(self, timeout_ms) -> None:
    """Blocking receive gives up after timeout_ms and returns None; None or a negative value waits forever."""
    self._base.timeout_s = None if timeout_ms is None or timeout_ms < 0 else timeout_ms / 1000.0

  @property
  def endpoint(self) -> str:
    return self._base.endpoint

  @property
  def dropped(self) -> int:
    """Messages this reader lost because the writer overran it (always 0 on ZMQ, which cannot tell)."""
    return self._base.dropped

  @property
  def resyncs(self) -> int:
    """Times this reader found the ring inconsistent (a corrupt header word or record) and found its place
    again from the writer's next consistent header (always 0 on ZMQ)."""
    return getattr(self._base, "resyncs", 0)

  def close(self) -> None:
    if self._base is not None:
      self._base.close()


class Poller:
  """Waits on many SubSockets at once, from any thread, with exact timeouts (futex_waitv on the segments)."""

  def __init__(self):
    self._sockets: list[SubSocket] = []
    self._fake = fake_enabled()

  def registerSocket(self, sock: SubSocket) -> None:
    if len(self._sockets) >= MAX_POLLER_SOCKETS:
      raise IpcError(f"a Poller holds at most {MAX_POLLER_SOCKETS} sockets")
    if self._sockets and type(sock._base) is not type(self._sockets[0]._base):
      raise IpcError("a Poller cannot mix shared-memory and ZMQ sockets")
    self._sockets.append(sock)

  def poll(self, timeout_ms: int) -> list[SubSocket]:
    """Sockets with a message ready, waiting at most timeout_ms (-1 = until one is ready)."""
    timeout_ms = -1 if timeout_ms is None else timeout_ms
    if self._fake:  # as in the reference: every socket, at once; the gate sits in receive()
      return list(self._sockets)
    ready = [s for s in self._sockets if s._base.ready()]
    if ready or timeout_ms == 0 or not self._sockets:
      return ready
    deadline = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000.0
    if isinstance(self._sockets[0]._base, ZmqSubscriber):
      return self._poll_zmq(deadline)
    bases = [s._base for s in self._sockets]
    spin_until = time.monotonic() + ring.SPIN_S  # as in ShmSubscriber.receive: cheaper than a futex sleep
    if deadline is not None:
      spin_until = min(spin_until, deadline)
    while time.monotonic() < spin_until:
      ready = [s for s, b in zip(self._sockets, bases) if b.ready()]
      if ready:
        return ready
      os.sched_yield()
    try:
      while True:
        for b in bases:
          b.set_sleeping(True)
        futex.full_fence()
        words = [(b.seg.futex_addr, b.seg.hdr[H_FUTEX]) for b in bases]
        ready = [s for s in self._sockets if s._base.ready()]
        if ready or (deadline is not None and time.monotonic() >= deadline):
          return ready
        futex.wait_many(words, deadline)
    finally:
      for b in bases:
        b.set_sleeping(False)

  def _poll_zmq(self, deadline: float | None) -> list[SubSocket]:
    import zmq
    poller = zmq.Poller()
    for s in self._sockets:
      poller.register(s._base.sock, zmq.POLLIN)
    timeout = None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
    events = dict(poller.poll(timeout))
    return [s for s in self._sockets if s._base.sock in events]


def pub_sock(endpoint, segment_size: int = 0) -> PubSocket:
  sock = PubSocket()
  sock.connect(context, endpoint, segment_size)
  return sock


def sub_sock(endpoint, poller: Poller | None = None, addr: str = "127.0.0.1", conflate: bool = False,
             timeout: int | None = None, segment_size: int = 0) -> SubSocket:
  sock = SubSocket()
  sock.connect(context, endpoint, addr, conflate, segment_size)
  if timeout is not None:
    sock.setTimeout(timeout)
  if poller is not None:
    poller.registerSocket(sock)
  return sock


def drain_sock_raw(sock: SubSocket, wait_for_one: bool = False) -> list[bytes]:
  """Every message waiting on sock (blocking for the first one if wait_for_one)."""
  msgs = []
  while True:
    msg = sock.receive(non_blocking=not (wait_for_one and not msgs))
    if msg is None:
      return msgs
    msgs.append(msg)
