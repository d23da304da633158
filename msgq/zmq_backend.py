"""ZMQ backend (opt-in with env ZMQ=1): TCP pub/sub for consumers on another machine.

Invariants:
- Ports: every process computes an endpoint's port from the namespace, the endpoint and two shared facts
  (msgq's table of known services, KNOWN_ENDPOINTS, and the kernel's ephemeral port range), so a publisher
  and its subscribers agree without talking. Candidates are the ports in 8023..65535 outside the range in
  /proc/sys/net/ipv4/ip_local_port_range (read at every call; the Linux default 32768-60999 if unreadable):
  the kernel hands ports of that range to outgoing connections, which could take a service's port at any time.
  An endpoint probes the candidates in order from FNV-1a-64(key) mod their number (key = the endpoint in the
  default namespace, `<OPENPILOT_PREFIX> 0x1f <endpoint>` in a named one, so two runs on one machine do not
  meet), and takes the first port not taken before it: the known services take theirs one by one in sorted
  name order, any other endpoint skips all of theirs. So no two known services of one namespace share a port,
  and an endpoint outside the table never takes a service's port (two such endpoints may still meet).
  msgq imports nothing of ours, so the table is msgq's own copy of the services list (a test keeps it equal).
- A publisher that bound its port leaves a claim file `zmq_pub.<endpoint>` (pid, start time, port) in the
  namespace's runtime dir and removes it when it closes. When a bind finds the port taken, the claims of this
  user's namespaces and /proc/net/tcp say who holds it: another copy of this publisher, another endpoint or
  namespace whose port is the same, or a program that is not on this bus. The error is MultiplePublishersError
  in every case and its message names the port, the holder and the fix. Claims are only read for that message.
- Every connection is authenticated and encrypted with CURVE. The keys derive from the namespace's secret:
  32 random bytes in `zmq.key` in the owner-only runtime dir, made once (atomically) by the first socket of
  the namespace. A publisher serves with the derived server key; a subscriber must know the derived server
  public key to complete the handshake, and it verifies the publisher holds the matching secret one. So a
  peer without the secret (another user, whose runtime dir is its own; another namespace, whose secret
  differs) neither receives a run's messages nor injects any: it cannot finish a handshake. Binding a port
  first only makes the real publisher fail with MultiplePublishersError; its subscribers get nothing.
- Publishers bind loopback unless MSGQ_ZMQ_BIND_ADDR says otherwise. For a consumer on another machine,
  copy `zmq.key` to that machine's runtime dir for the same OPENPILOT_PREFIX (msgq/README.md); both machines
  must have the same ephemeral port range and the same KNOWN_ENDPOINTS to compute the same ports.
- pyzmq is imported only when this backend is used.
"""
import functools
import hashlib
import math
import os
import pwd
import secrets
import stat

from msgq import namespace
from msgq.env import MSGQ_ENV
from msgq.errors import IpcError, MultiplePublishersError
from msgq.segment import check_endpoint, own_identity, process_alive

FNV_OFFSET, FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3
PORT_BASE, PORT_MAX = 8023, 65535   # both inclusive
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
LINUX_DEFAULT_EPHEMERAL = (32768, 60999)
KEY_FILE, KEY_BYTES = "zmq.key", 32
CLAIM_PREFIX = "zmq_pub."

# The services whose ports never clash within a namespace: cereal's services list (cereal/services.py), copied
# because msgq imports nothing of ours; tests/msgq/test_zmq_ports.py fails when the two differ. Ports are
# assigned in sorted order, so the order written here does not matter.
KNOWN_ENDPOINTS = frozenset({
  "narrowRoadCameraState", "wideRoadCameraState", "cabinCameraState", "extrinsicsCalibration", "lateralDelay",
  "modelV2", "drivingModelData", "cameraOdometry", "usbGpuState", "driverStateV2", "driverMonitoringState",
  "carState", "carControl", "deviceState", "engageRequest", "selfdriveState", "managerState",
})


def fnv1a64(data: bytes) -> int:
  h = FNV_OFFSET
  for b in data:
    h = ((h ^ b) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
  return h


def ephemeral_range() -> tuple[int, int]:
  """The kernel's range for outgoing connections' local ports (inclusive); the Linux default if unreadable."""
  try:
    with open(EPHEMERAL_RANGE_FILE) as f:
      lo, hi = (int(v) for v in f.read().split())
  except (OSError, ValueError):
    return LINUX_DEFAULT_EPHEMERAL
  return (lo, hi) if 0 < lo <= hi <= 65535 else LINUX_DEFAULT_EPHEMERAL


def _candidate_blocks(ephemeral: tuple[int, int]) -> tuple[tuple[int, int], ...]:
  """The inclusive port blocks of PORT_BASE..PORT_MAX outside `ephemeral`, in ascending order."""
  lo, hi = ephemeral
  blocks = ((PORT_BASE, min(PORT_MAX, lo - 1)), (max(PORT_BASE, hi + 1), PORT_MAX))
  return tuple((a, b) for a, b in blocks if a <= b)


def _nth_candidate(blocks: tuple[tuple[int, int], ...], i: int) -> int:
  for a, b in blocks:
    if i <= b - a:
      return a + i
    i -= b - a + 1
  raise IndexError(i)


def _probe(key: str, blocks: tuple[tuple[int, int], ...], taken) -> int:
  """The first candidate port not in `taken`, walking the candidates cyclically from the key's hash."""
  count = sum(b - a + 1 for a, b in blocks)
  start = fnv1a64(key.encode()) % count
  for step in range(count):
    port = _nth_candidate(blocks, (start + step) % count)
    if port not in taken:
      return port
  raise AssertionError("unreachable: there are more candidates than known endpoints")


def _key(prefix: str, endpoint: str) -> str:
  return f"{prefix}\x1f{endpoint}" if prefix else endpoint


@functools.lru_cache(maxsize=32)
def _service_ports(prefix: str, ephemeral: tuple[int, int]) -> tuple[tuple[tuple[int, int], ...], dict[str, int]]:
  """(candidate blocks, {known endpoint: port}) of one namespace: each service in sorted order takes the first
  candidate from its hash that no service before it took. Deterministic, so every process gets the same map."""
  blocks = _candidate_blocks(ephemeral)
  count = sum(b - a + 1 for a, b in blocks)
  if count <= len(KNOWN_ENDPOINTS):
    raise IpcError(f"the kernel's ephemeral port range {ephemeral[0]}-{ephemeral[1]} ({EPHEMERAL_RANGE_FILE}) leaves "
                   f"{count} ports of {PORT_BASE}-{PORT_MAX} for the ZMQ backend, which needs more than "
                   f"{len(KNOWN_ENDPOINTS)}: narrow it (sysctl net.ipv4.ip_local_port_range), or use the shared-memory bus")
  ports: dict[str, int] = {}
  for endpoint in sorted(KNOWN_ENDPOINTS):
    ports[endpoint] = _probe(_key(prefix, endpoint), blocks, ports.values())
  return blocks, ports


def port_for(endpoint: str, prefix: str | None = None, ephemeral: tuple[int, int] | None = None) -> int:
  """The endpoint's port in namespace `prefix` (default: the current one), outside the ephemeral port range
  `ephemeral` (default: the kernel's, read now)."""
  prefix = (namespace.prefix() if prefix is None else prefix) or ""
  blocks, ports = _service_ports(prefix, ephemeral_range() if ephemeral is None else tuple(ephemeral))
  if endpoint in ports:
    return ports[endpoint]
  return _probe(_key(prefix, endpoint), blocks, set(ports.values()))


# -- who holds a port: only read to word the error when a bind finds the port taken ------------------------

def _write_claim(path: str, port: int) -> bool:
  """Record that this process's publisher holds `port` (atomic replace); False if the runtime dir refused it."""
  pid, start = own_identity()
  tmp = os.path.join(os.path.dirname(path), f".{CLAIM_PREFIX}tmp{pid}_{secrets.token_hex(4)}")   # never a claim's name
  try:
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600), "w") as f:
      f.write(f"{pid} {start} {port}\n")
    os.replace(tmp, path)
    return True
  except OSError:
    try:
      os.unlink(tmp)
    except OSError:
      pass
    return False


def _read_claim(path: str) -> tuple[int, int, int] | None:
  """(pid, start time, port) of a claim file, or None if it is gone or malformed."""
  try:
    with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)) as f:
      pid, start, port = (int(v) for v in f.read(64).split())
    return pid, start, port
  except (OSError, ValueError):
    return None


def _live_claims(port: int):
  """(namespace dir, endpoint, pid) of every live publisher of this user that claims `port`, the current
  namespace's first. A claim whose process is gone (crashed without closing) is ignored."""
  own = namespace.runtime_dir()
  base = os.path.dirname(own)
  try:
    others = sorted(e.path for e in os.scandir(base) if e.is_dir(follow_symlinks=False) and e.path != own)
  except OSError:
    others = []
  for ns_dir in [own, *others]:
    try:
      names = sorted(n for n in os.listdir(ns_dir) if n.startswith(CLAIM_PREFIX))
    except OSError:
      continue
    for name in names:
      claim = _read_claim(os.path.join(ns_dir, name))
      if claim is not None and claim[2] == port and process_alive(claim[0], claim[1]):
        yield ns_dir, name[len(CLAIM_PREFIX):], claim[0]


def _process_name(pid: int) -> str:
  if pid == os.getpid():
    return f"pid {pid}, this process"
  try:
    with open(f"/proc/{pid}/comm") as f:
      return f"pid {pid}, {f.read().strip()}"
  except OSError:
    return f"pid {pid}"


def _socket_holder(port: int) -> str:
  """Who has a TCP socket on local port `port`, as far as /proc shows: a process of this user by pid and name,
  another user by name; listeners first."""
  found = []
  for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
      with open(table) as f:
        rows = f.readlines()[1:]
    except OSError:
      continue
    for row in rows:
      cols = row.split()
      if len(cols) > 9 and int(cols[1].rsplit(":", 1)[1], 16) == port:
        found.append((cols[3] != "0A", int(cols[7]), cols[9]))   # 0A = LISTEN
  if not found:
    return "a program this process cannot see"
  _, uid, inode = min(found)
  if uid != os.getuid():
    try:
      return f"uid {uid} ({pwd.getpwuid(uid).pw_name}), another user"
    except KeyError:
      return f"uid {uid}, another user"
  link = f"socket:[{inode}]"
  pids = [os.getpid()] + sorted(int(n) for n in os.listdir("/proc") if n.isdigit() and int(n) != os.getpid())
  for pid in pids:
    try:
      fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
      continue   # gone, or not ours to read
    for fd in fds:
      try:
        if os.readlink(f"/proc/{pid}/fd/{fd}") == link:
          return _process_name(pid)
      except OSError:
        continue   # closed while we looked
  return "a process of yours"


def _port_taken_message(endpoint: str, port: int) -> str:
  """The one-line reason a bind of `port` for `endpoint` failed with EADDRINUSE, naming the holder and the fix."""
  own = namespace.runtime_dir()
  here = f"port {port} is already bound"
  for ns_dir, holder_endpoint, pid in _live_claims(port):
    who = _process_name(pid)
    if ns_dir == own and holder_endpoint == endpoint:
      return f"{here} by another copy of its publisher ({who}): stop it, or use another OPENPILOT_PREFIX"
    if ns_dir == own:
      return (f"{here} by this namespace's publisher of {holder_endpoint!r} ({who}): both endpoints map to this port "
              f"(only the known services of one namespace never share one); rename one of them")
    return (f"{here} by the publisher of {holder_endpoint!r} in namespace {os.path.basename(ns_dir)!r} ({who}), whose "
            f"port is the same by chance: use another OPENPILOT_PREFIX (every ZMQ port moves with it)")
  return (f"{here} by {_socket_holder(port)}, not by a publisher of this namespace: free port {port}, or use "
          f"another OPENPILOT_PREFIX (every ZMQ port moves with it)")


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
    self._claim: str | None = None
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
        raise MultiplePublishersError(f"endpoint {self.endpoint!r}: {_port_taken_message(self.endpoint, self.port)}") from e
      raise IpcError(f"endpoint {self.endpoint!r}: cannot bind {bind_addr}:{self.port}: {e}") from e
    claim = os.path.join(namespace.runtime_dir(), CLAIM_PREFIX + self.endpoint)
    self._claim = claim if _write_claim(claim, self.port) else None
    self._send = self.sock.send
    self._noblock = zmq.NOBLOCK

  def send(self, data) -> None:
    self._send(data, self._noblock, copy=len(data) < 65536)

  def all_readers_updated(self) -> bool:
    raise IpcError("all_readers_updated is not available with the ZMQ backend")

  def close(self) -> None:
    self.sock.close()
    claim, self._claim = self._claim, None
    if claim is not None and _read_claim(claim) == (*own_identity(), self.port):
      try:
        os.unlink(claim)   # a claim another copy wrote after this one (a takeover) is left alone
      except OSError:
        pass

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
