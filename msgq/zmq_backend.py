"""ZMQ backend (opt-in with env ZMQ=1): TCP pub/sub for consumers on another machine.

Invariants:
- Ports are per namespace: 8023 + FNV-1a-64(key) % (65535 - 8023) with key = the endpoint in the default
  namespace (the last commaai/msgq ZMQ backend's port, so both ends agree without configuration) and
  `<OPENPILOT_PREFIX> 0x1f <endpoint>` in a named one, so two runs on one machine do not meet.
- Every connection is authenticated and encrypted with CURVE. The keys derive from the namespace's secret:
  32 random bytes in `zmq.key` in the owner-only runtime dir, made once (atomically) by the first socket of
  the namespace. A publisher serves with the derived server key; a subscriber must know the derived server
  public key to complete the handshake, and it verifies the publisher holds the matching secret one. So a
  peer without the secret (another user, whose runtime dir is its own; another namespace, whose secret
  differs) neither receives a run's messages nor injects any: it cannot finish a handshake. Binding a port
  first only makes the real publisher fail with MultiplePublishersError; its subscribers get nothing.
- Publishers bind loopback unless MSGQ_ZMQ_BIND_ADDR says otherwise. For a consumer on another machine,
  copy `zmq.key` to that machine's runtime dir for the same OPENPILOT_PREFIX (msgq/README.md).
- pyzmq is imported only when this backend is used.
"""
import hashlib
import math
import os
import secrets
import stat

from msgq import namespace
from msgq.env import MSGQ_ENV
from msgq.errors import IpcError, MultiplePublishersError
from msgq.segment import check_endpoint

FNV_OFFSET, FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3
PORT_BASE, PORT_MAX = 8023, 65535
KEY_FILE, KEY_BYTES = "zmq.key", 32


def fnv1a64(data: bytes) -> int:
  h = FNV_OFFSET
  for b in data:
    h = ((h ^ b) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
  return h


def port_for(endpoint: str, prefix: str | None = None) -> int:
  """The endpoint's port in namespace `prefix` (default: the current one)."""
  prefix = namespace.prefix() if prefix is None else prefix
  key = endpoint if not prefix else f"{prefix}\x1f{endpoint}"
  return PORT_BASE + fnv1a64(key.encode()) % (PORT_MAX - PORT_BASE)


def namespace_secret() -> bytes:
  """The namespace's ZMQ secret, made on first use: 32 bytes in an owner-only file of the runtime dir."""
  path = os.path.join(namespace.runtime_dir(), KEY_FILE)
  try:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
  except FileNotFoundError:
    tmp = f"{path}.tmp{os.getpid()}_{secrets.token_hex(4)}"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600), "wb") as f:
      f.write(secrets.token_bytes(KEY_BYTES))
    try:
      os.link(tmp, path)  # atomic: a racing socket of the namespace either wins or reads the winner's
    except FileExistsError:
      pass
    finally:
      os.unlink(tmp)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
  with open(fd, "rb") as f:
    st = os.fstat(f.fileno())
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
      raise IpcError(f"ZMQ key {path} must be a regular file owned by uid {os.getuid()} with mode 0600")
    secret = f.read(KEY_BYTES + 1)
  if len(secret) != KEY_BYTES:
    raise IpcError(f"ZMQ key {path} holds {len(secret)} bytes, not {KEY_BYTES}: remove it to make a new one")
  return secret


def _curve_keys(zmq, role: bytes) -> tuple[bytes, bytes]:
  """(public, secret) z85 CURVE keys of `role` (server or client), derived from the namespace secret."""
  from zmq.utils import z85
  secret = z85.encode(hashlib.sha256(b"pymodeld zmq " + role + b"\0" + namespace_secret()).digest())
  return zmq.curve_public(secret), secret


def _context():
  import zmq
  if not zmq.has("curve"):
    raise IpcError("the ZMQ backend authenticates peers with CURVE, which this libzmq was built without")
  return zmq, zmq.Context.instance()


class ZmqPublisher:
  def __init__(self, endpoint, segment_size: int = 0):
    zmq, ctx = _context()
    self.endpoint = check_endpoint(endpoint)
    self.port = port_for(self.endpoint)
    public, secret = _curve_keys(zmq, b"server")
    self.sock = ctx.socket(zmq.PUB)
    self.sock.setsockopt(zmq.LINGER, 0)
    self.sock.curve_server = True
    self.sock.curve_publickey, self.sock.curve_secretkey = public, secret
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

  def __del__(self):
    try:
      self.close()  # frees the port at once, as a dropped shared-memory publisher frees its endpoint
    except Exception:
      pass


class ZmqSubscriber:
  def __init__(self, endpoint, address: str = "127.0.0.1", conflate: bool = False, segment_size: int = 0):
    zmq, ctx = _context()
    self.endpoint = check_endpoint(endpoint)
    self.port = port_for(self.endpoint)
    server_public, _ = _curve_keys(zmq, b"server")
    public, secret = _curve_keys(zmq, b"client")
    self.sock = ctx.socket(zmq.SUB)
    self.sock.setsockopt(zmq.LINGER, 0)
    self.sock.curve_serverkey = server_public
    self.sock.curve_publickey, self.sock.curve_secretkey = public, secret
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

  def __del__(self):
    try:
      self.close()
    except Exception:
      pass
