"""Fake/gated backend for deterministic replay (env CEREAL_FAKE=1), with the commaai/msgq event API.

Invariants:
- Per (OPENPILOT_PREFIX, identifier, endpoint) there is at most one state file in runtime_dir(), named by
  FNV-1a-64 of `prefix \\x1f identifier \\x1f endpoint`: an `enabled` byte and the paths of two events.
- An event is a named FIFO opened O_RDWR|O_NONBLOCK: set = write one byte, clear = drain, peek = readable.
  Any process of the namespace can open it by path, so nothing depends on fork-inherited fds.
- The handle created with override=True owns the FIFOs and the state file and removes them on close.
- A gated receive: if enabled, set recv_called, wait for recv_ready, clear it, then receive for real.
"""
import itertools
import mmap
import os
import select
import time

from msgq import namespace
from msgq.env import MSGQ_ENV
from msgq.errors import EventTimeoutError, IpcError
from msgq.zmq_backend import fnv1a64

FAKE_ENV, FAKE_PREFIX_ENV, FAKE_TIMEOUT_ENV = "CEREAL_FAKE", "CEREAL_FAKE_PREFIX", "CEREAL_FAKE_TIMEOUT"
_STATE_SIZE, _PATH_MAX = 520, 256
_counter = itertools.count()


def toggle_fake_events(enabled: bool) -> None:
  """Sockets and pollers created from now on (here and in children started later) are fake/gated."""
  if enabled:
    os.environ[FAKE_ENV] = "1"
  else:
    os.environ.pop(FAKE_ENV, None)


def fake_enabled() -> bool:
  return MSGQ_ENV.flag(FAKE_ENV)


def set_fake_prefix(prefix: str) -> None:
  os.environ[FAKE_PREFIX_ENV] = prefix


def get_fake_prefix() -> str:
  return MSGQ_ENV.get(FAKE_PREFIX_ENV)


def delete_fake_prefix() -> None:
  os.environ.pop(FAKE_PREFIX_ENV, None)


class Event:
  """One-bit cross-process event on a named FIFO; Event() without a path is a placeholder with fd -1."""

  def __init__(self, path: str | None = None):
    self.path = path
    self._fd = os.open(path, os.O_RDWR | os.O_NONBLOCK) if path else -1

  @property
  def fd(self) -> int:
    return self._fd

  def _need_fd(self) -> int:
    if self._fd < 0:
      raise IpcError("event has no backing FIFO (no handle state for this endpoint)")
    return self._fd

  def set(self) -> None:
    try:
      os.write(self._need_fd(), b"\x01")
    except BlockingIOError:  # already full of set bytes: it is set
      pass

  def clear(self) -> int:
    fd, drained = self._need_fd(), 0
    while True:
      try:
        chunk = os.read(fd, 4096)
      except BlockingIOError:
        return drained
      drained += len(chunk)

  def peek(self) -> bool:
    return bool(select.select([self._need_fd()], [], [], 0)[0])

  def wait(self, timeout: float = -1) -> None:
    """Return once set (without clearing); raise EventTimeoutError after timeout seconds (-1 = forever)."""
    if wait_for_one_event([self], timeout) != 0:
      raise AssertionError("unreachable")

  def close(self) -> None:
    if self._fd >= 0:
      os.close(self._fd)
      self._fd = -1

  def __del__(self):
    self.close()


def wait_for_one_event(events: list[Event], timeout: float = -1) -> int:
  """Index of the first set event; EventTimeoutError after timeout seconds (-1 = forever). EINTR-safe."""
  poller = select.poll()
  for i, ev in enumerate(events):
    poller.register(ev._need_fd(), select.POLLIN)
  index = {ev.fd: i for i, ev in enumerate(events)}
  deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
  while True:
    remaining_ms = None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000 + 0.999))
    ready = poller.poll(remaining_ms)
    if ready:
      return min(index[fd] for fd, _ in ready)
    if deadline is not None and time.monotonic() >= deadline:
      raise EventTimeoutError(f"event wait timed out after {timeout} s")


def _state_path(endpoint: str, identifier: str) -> str:
  key = f"{namespace.prefix() or ''}\x1f{identifier}\x1f{endpoint}".encode()
  return os.path.join(namespace.runtime_dir(), f"fake_{fnv1a64(key):016x}")


def _inode(path: str) -> int | None:
  try:
    return os.stat(path).st_ino
  except FileNotFoundError:
    return None


class SocketEventHandle:
  """The harness side (override=True: creates and owns the events) or a socket's view (override=False)."""

  def __init__(self, endpoint: str, identifier: str = "", override: bool = True):
    self.endpoint, self.identifier = endpoint, identifier
    self.state_path = _state_path(endpoint, identifier)
    self._owned: list[str] = []
    self._mm = None
    if override:
      self._create()
    elif os.path.exists(self.state_path):
      self._attach()
    if self._mm is None:
      self.recv_called_event, self.recv_ready_event = Event(), Event()

  def _create(self) -> None:
    base = os.path.join(namespace.runtime_dir(), f"event_{os.getpid()}_{next(_counter)}")
    paths = [f"{base}.0", f"{base}.1"]
    for p in paths:
      os.mkfifo(p, 0o600)
      self._owned.append(p)
    state = bytearray(_STATE_SIZE)
    for i, p in enumerate(paths):
      raw = p.encode()
      if len(raw) >= _PATH_MAX:
        raise IpcError(f"event path too long: {p!r}")
      state[8 + i * _PATH_MAX:8 + i * _PATH_MAX + len(raw)] = raw
    tmp = f"{self.state_path}.tmp{os.getpid()}"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
      f.write(state)
    os.replace(tmp, self.state_path)
    self._attach()

  def _attach(self) -> None:
    fd = os.open(self.state_path, os.O_RDWR)
    try:
      self._state_inode = os.fstat(fd).st_ino
      self._mm = mmap.mmap(fd, _STATE_SIZE)
    finally:
      os.close(fd)
    paths = [bytes(self._mm[8 + i * _PATH_MAX:8 + (i + 1) * _PATH_MAX]).rstrip(b"\0").decode() for i in range(2)]
    self.recv_called_event, self.recv_ready_event = Event(paths[0]), Event(paths[1])

  @property
  def enabled(self) -> bool:
    return self._mm is not None and self._mm[0] != 0

  @enabled.setter
  def enabled(self, value: bool) -> None:
    if self._mm is None:
      raise IpcError(f"no fake event state for endpoint {self.endpoint!r}; create it with override=True")
    self._mm[0] = 1 if value else 0

  def close(self) -> None:
    """Drop the shared state (and, for the owner, the files); events keep their fds until they are freed."""
    if self._mm is not None:
      still_ours = bool(self._owned) and _inode(self.state_path) == self._state_inode
      self._mm.close()
      self._mm = None
      if still_ours:  # a newer owner may have replaced the state; leave theirs alone
        self._owned.append(self.state_path)
    for p in self._owned:
      try:
        os.unlink(p)
      except FileNotFoundError:
        pass
    self._owned = []

  def __del__(self):
    try:
      self.close()
    except Exception:
      pass


def fake_event_handle(endpoint: str, identifier: str | None = None, override: bool = True,
                      enable: bool = False) -> SocketEventHandle:
  handle = SocketEventHandle(endpoint, get_fake_prefix() if identifier is None else identifier, override)
  if override:
    handle.enabled = enable
  return handle


class FakeSubscriber:
  """Wraps a real subscriber; receive() parks at the gate while the endpoint's handle is enabled."""

  def __init__(self, inner):
    self.inner = inner
    self.endpoint = inner.endpoint
    self._identifier = get_fake_prefix()
    self._handle = SocketEventHandle(self.endpoint, self._identifier, override=False)
    self._gate_timeout = MSGQ_ENV.number(FAKE_TIMEOUT_ENV, -1)  # unset: wait forever, as the reference does

  def _gate(self) -> None:
    if self._handle._mm is None:  # the harness may create the handle after we connected
      if not os.path.exists(self._handle.state_path):
        return
      self._handle = SocketEventHandle(self.endpoint, self._identifier, override=False)
    if self._handle.enabled:
      self._handle.recv_called_event.set()
      self._handle.recv_ready_event.wait(self._gate_timeout)
      self._handle.recv_ready_event.clear()

  def receive(self, non_blocking: bool = False):
    self._gate()
    return self.inner.receive(non_blocking)

  def ready(self) -> bool:
    return True

  def __getattr__(self, name):
    return getattr(self.inner, name)
