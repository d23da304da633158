"""The control-socket listener of a VisionIpcServer: answers buffer and stream-list requests on its own thread.

Invariants:
- It never waits on one peer. The listening socket and every connection are non-blocking and served from one
  selector: a peer that connects and sends nothing, or half a request, only holds a slot until its deadline
  (PEER_TIMEOUT_S) and is then closed; a reply that does not fit in the peer's socket buffer at once drops
  that peer. So idle or stuck connections cannot fill the backlog and starve real clients.
- At most MAX_PEERS connections wait for their request at once; accepting one more closes the oldest.
- It holds only immutable state (the replies and read-only fds fixed at start, see server.py), never the
  server object: dropping the server closes it, and closing stops this thread before any fd it sends closes.
- A stale socket file of a dead server is replaced; a live server of the same name is an error.
"""
import errno
import logging
import os
import selectors
import socket
import struct
import threading
import time

from visionipc import protocol
from visionipc.errors import VisionIpcError

PEER_TIMEOUT_S = 2.0
MAX_PEERS = 64
BACKLOG = 128

log = logging.getLogger("visionipc.server")


class ControlListener:
  """Serves `streams` ({stream id: (descriptor bytes, read-only fds)}) of server `name` at `path`."""

  def __init__(self, path: str, name: str, server_id: int, streams: dict[int, tuple[list[bytes], list[int]]]):
    self.path, self.name, self.server_id, self.streams = path, name, server_id, streams
    self._sock = bind_control_socket(path, name)
    self._sock.setblocking(False)
    self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    self._peers: dict[socket.socket, float] = {}  # connection -> deadline (insertion order = age)
    self._thread = threading.Thread(target=self._serve, name=f"vipc-{name}", daemon=True)
    self._thread.start()

  def close(self) -> None:
    if self._thread is None:
      return
    os.write(self._wake_w, b"x")
    self._thread.join(timeout=5)
    self._thread = None
    for fd in (self._wake_r, self._wake_w):
      os.close(fd)
    self._sock.close()
    try:
      os.unlink(self.path)
    except FileNotFoundError:
      pass

  def _serve(self) -> None:
    sel = selectors.DefaultSelector()
    sel.register(self._sock, selectors.EVENT_READ)
    sel.register(self._wake_r, selectors.EVENT_READ)
    try:
      while True:
        timeout = None
        if self._peers:
          timeout = max(0.0, next(iter(self._peers.values())) - time.monotonic())
        for key, _ in sel.select(timeout):
          if key.fileobj == self._wake_r:
            return
          if key.fileobj is self._sock:
            self._accept(sel)
          else:
            self._answer(sel, key.fileobj)
        now = time.monotonic()
        for conn in [c for c, deadline in self._peers.items() if deadline <= now]:
          log.warning("visionipc %s: dropped a client that sent no request within %.1f s", self.name, PEER_TIMEOUT_S)
          self._drop(sel, conn)
    finally:
      for conn in list(self._peers):
        self._drop(sel, conn)
      sel.close()

  def _accept(self, sel) -> None:
    while True:
      try:
        conn, _ = self._sock.accept()
      except (BlockingIOError, InterruptedError):
        return
      except OSError as e:  # e.g. out of fds: the waiting peers are served, this one waits in the backlog
        log.warning("visionipc %s: accept failed: %s", self.name, e)
        return
      conn.setblocking(False)
      if len(self._peers) >= MAX_PEERS:
        self._drop(sel, next(iter(self._peers)))
      self._peers[conn] = time.monotonic() + PEER_TIMEOUT_S
      sel.register(conn, selectors.EVENT_READ)

  def _drop(self, sel, conn: socket.socket) -> None:
    del self._peers[conn]
    sel.unregister(conn)
    conn.close()

  def _answer(self, sel, conn: socket.socket) -> None:
    try:
      data, _, flags, _ = conn.recvmsg(protocol.REQUEST.size + 1)
    except (BlockingIOError, InterruptedError):
      return
    except OSError as e:
      log.warning("visionipc %s: client request failed: %s", self.name, e)
      self._drop(sel, conn)
      return
    try:
      if data:
        reply, fds = self._reply(data, flags)
        socket.send_fds(conn, [reply], fds, socket.MSG_NOSIGNAL)
    except OSError as e:  # a full or vanished peer: it gets nothing, and nobody waits on it
      log.warning("visionipc %s: could not answer a client: %s", self.name, e)
    self._drop(sel, conn)

  def _reply(self, data: bytes, flags: int) -> tuple[bytes, list[int]]:
    try:
      if flags & socket.MSG_TRUNC:
        raise protocol.ProtocolError("request too long")
      kind, stream = protocol.decode_request(data)
    except protocol.ProtocolError as e:
      log.warning("visionipc %s: bad request: %s", self.name, e)
      return protocol.encode_reply(protocol.STATUS_BAD_REQUEST, self.server_id, 0, []), []
    served = self.streams.get(stream) if kind == protocol.KIND_BUFFERS else None
    if served is None:
      status = protocol.STATUS_OK if kind == protocol.KIND_LIST else protocol.STATUS_UNKNOWN_STREAM
      body = [struct.pack("<I", s) for s in sorted(self.streams)]
      return protocol.encode_reply(status, self.server_id, stream, body), []
    descriptors, fds = served
    return protocol.encode_reply(protocol.STATUS_OK, self.server_id, stream, descriptors), fds


def bind_control_socket(path: str, name: str) -> socket.socket:
  probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
  try:
    probe.connect(path)
    live = True
  except BlockingIOError:  # a listener whose backlog is full is live too
    live = True
  except OSError as e:
    if e.errno not in (errno.ECONNREFUSED, errno.ENOENT):
      raise
    live = False  # nobody there; a stale file from a dead server is replaced below
  finally:
    probe.close()
  if live:
    raise VisionIpcError(f"a visionipc server named {name!r} is already running in this namespace ({path})")
  try:
    os.unlink(path)
  except FileNotFoundError:
    pass
  sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
  try:
    sock.bind(path)
    os.chmod(path, 0o600)
    sock.listen(BACKLOG)
  except BaseException:
    sock.close()
    raise
  return sock
