"""Thin socket helpers over msgq: segment sizes come from the services table, receives decode to Events."""
import msgq
from msgq import Poller, drain_sock_raw  # noqa: F401  (re-exported)

from cereal.messaging.decode import log_from_bytes
from cereal.services import SERVICE_LIST


def _segment_size(endpoint: str, segment_size: int | None) -> int:
  """An explicit size wins; a known service uses its table size (both ends must agree); else msgq's default."""
  if segment_size is not None:
    return segment_size
  service = SERVICE_LIST.get(endpoint)
  return service.queue_size if service is not None else 0


def pub_sock(endpoint: str, segment_size: int | None = None):
  return msgq.pub_sock(endpoint, segment_size=_segment_size(endpoint, segment_size))


def sub_sock(endpoint: str, poller=None, addr: str = "127.0.0.1", conflate: bool = False,
             timeout: int | None = None, segment_size: int | None = None):
  return msgq.sub_sock(endpoint, poller=poller, addr=addr, conflate=conflate, timeout=timeout,
                       segment_size=_segment_size(endpoint, segment_size))


def drain_sock(sock, wait_for_one: bool = False) -> list:
  """Every queued message, decoded, oldest first."""
  return [log_from_bytes(m) for m in drain_sock_raw(sock, wait_for_one=wait_for_one)]


def recv_sock(sock, wait: bool = False):
  """The newest queued message (older ones are dropped), or None; with wait, block for the first one."""
  newest = None
  while True:
    dat = sock.receive() if wait and newest is None else sock.receive(non_blocking=True)
    if dat is None:
      break
    newest = dat
  return None if newest is None else log_from_bytes(newest)


def recv_one(sock):
  """Block (up to the socket's timeout) for one message; None on timeout."""
  dat = sock.receive()
  return None if dat is None else log_from_bytes(dat)


def recv_one_or_none(sock):
  dat = sock.receive(non_blocking=True)
  return None if dat is None else log_from_bytes(dat)


def recv_one_retry(sock):
  """Block until a message arrives, whatever the socket's timeout."""
  while True:
    dat = sock.receive()
    if dat is not None:
      return log_from_bytes(dat)
