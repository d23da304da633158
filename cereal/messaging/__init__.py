"""cereal.messaging: openpilot's messaging API over msgq.

  new_message(service, size=None, **kw)   an Event builder, logMonoTime = time.monotonic_ns(), valid=True
  PubMaster(services, process=None, allow_foreign=False).send(service, builder|bytes)
  SubMaster(services, poll=None, ...).update(timeout_ms); sm[s], sm.alive[s], sm.all_checks(), ...
  log_from_bytes(dat, service=None)       decode, raising MessageDecodeError on malformed bytes
  pub_sock / sub_sock / drain_sock / drain_sock_raw / recv_sock / recv_one / recv_one_or_none / recv_one_retry

Invariants: one clock (CLOCK_MONOTONIC; ns in logMonoTime, seconds in SubMaster); publisher and subscriber
take a service's segment size from services.py; only a service's owner may open it in a PubMaster; a
malformed message never escapes as anything but MessageDecodeError, and never aborts the process.
"""
# openpilot's cereal.messaging re-exports the transport's names; tools written against it expect them here
from msgq import (Context, IpcError, MultiplePublishersError, PubSocket, SocketEventHandle, SubSocket,  # noqa: F401
                  context, delete_fake_prefix, fake_event_handle, get_fake_prefix, set_fake_prefix,
                  toggle_fake_events, wait_for_one_event)

from cereal import log  # noqa: F401
from cereal.messaging.decode import log_from_bytes  # noqa: F401
from cereal.messaging.errors import (MessageDecodeError, MessagingError, ServiceOwnershipError,  # noqa: F401
                                     UnknownServiceError)
from cereal.messaging.message import new_message, service_info  # noqa: F401
from cereal.messaging.pubmaster import PROCESS_ENV, PubMaster  # noqa: F401
from cereal.messaging.sockets import (Poller, drain_sock, drain_sock_raw, pub_sock, recv_one,  # noqa: F401
                                      recv_one_or_none, recv_one_retry, recv_sock, sub_sock)
from cereal.messaging.submaster import SubMaster  # noqa: F401
from cereal.services import SERVICE_LIST  # noqa: F401


def reset_context() -> None:
  """openpilot calls this in forked children; msgq keeps no per-context state, so there is nothing to reset."""
