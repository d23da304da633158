"""PubMaster: one publisher socket per service, opened only by the service's owning process."""
import time

from cereal.env import CEREAL_ENV
from cereal.messaging.errors import ServiceOwnershipError
from cereal.messaging.message import service_info
from cereal.messaging.sockets import pub_sock

PROCESS_ENV = "PYMODELD_PROCESS"


class PubMaster:
  """PubMaster(services, process=None, allow_foreign=False).

  `process` defaults to env PYMODELD_PROCESS (the manager sets it for each child). A service whose owner in
  services.py is not `process` raises ServiceOwnershipError before any socket opens, unless allow_foreign
  (tests, tools, the replay harness, which publish on behalf of others).
  """

  def __init__(self, services, process: str | None = None, allow_foreign: bool = False):
    self.process = process if process is not None else (CEREAL_ENV.get(PROCESS_ENV) or None)
    services = list(dict.fromkeys(services))
    for s in services:
      owner = service_info(s).owner
      if not allow_foreign and owner != self.process:
        raise ServiceOwnershipError(s, owner, self.process)
    self.sock = {s: pub_sock(s) for s in services}

  def _socket(self, s: str):
    try:
      return self.sock[s]
    except KeyError:
      raise ValueError(f"service {s!r} was not opened by this PubMaster (opened: {sorted(self.sock)})") from None

  def send(self, s: str, dat) -> None:
    """Publish bytes or an Event builder; a builder must carry service `s`."""
    sock = self._socket(s)
    if not isinstance(dat, (bytes, bytearray, memoryview)):
      carried = dat.which()
      if carried != s:
        raise ValueError(f"message carries {carried!r} but was sent on {s!r}")
      dat = dat.to_bytes()
    sock.send(dat)

  def close(self) -> None:
    for sock in self.sock.values():
      sock.close()

  def all_readers_updated(self, s: str) -> bool:
    return self._socket(s).all_readers_updated()

  def wait_for_readers_to_update(self, s: str, timeout: float, dt: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while True:
      if self.all_readers_updated(s):
        return True
      if time.monotonic() >= deadline:
        return False
      time.sleep(dt)
