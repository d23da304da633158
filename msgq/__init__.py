"""msgq: pub/sub transport with the commaai/msgq Python API. See msgq/README.md for the ring's invariants."""
from msgq.errors import (EventTimeoutError, IpcError, MessageTooLargeError, MultiplePublishersError, NamespaceError,
                         SegmentSizeError, SegmentTruncatedError)
from msgq.fake import (Event, SocketEventHandle, delete_fake_prefix, fake_event_handle, get_fake_prefix,
                       set_fake_prefix, toggle_fake_events, wait_for_one_event)
from msgq.ipc import Context, Poller, PubSocket, SubSocket, context, drain_sock_raw, pub_sock, sub_sock
from msgq.segment import DEFAULT_SEGMENT_SIZE, NUM_READERS

__all__ = [
  "Context", "Poller", "PubSocket", "SubSocket", "context", "drain_sock_raw", "pub_sock", "sub_sock",
  "IpcError", "MultiplePublishersError", "NamespaceError", "SegmentSizeError", "SegmentTruncatedError", "MessageTooLargeError", "EventTimeoutError",
  "Event", "SocketEventHandle", "toggle_fake_events", "set_fake_prefix", "get_fake_prefix",
  "delete_fake_prefix", "fake_event_handle", "wait_for_one_event", "DEFAULT_SEGMENT_SIZE", "NUM_READERS",
]
