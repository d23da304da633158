"""Errors raised by every backend. All are IpcError subclasses, so callers can catch one type."""


class IpcError(Exception):
  """A bus operation failed (bad segment, no free reader slot, unsupported operation...)."""


class NamespaceError(IpcError, PermissionError):
  """A namespace directory that is not ours to use (another user's, a symlink, not a directory); the message
  is one line that names it and says how to fix it."""


class MultiplePublishersError(IpcError):
  """A second live publisher tried to open an endpoint that already has one."""


class SegmentSizeError(IpcError):
  """Publisher and subscriber (or two processes) disagree on an endpoint's segment size."""


class SegmentTruncatedError(IpcError):
  """An endpoint's segment file was truncated (or grown) under an open socket; its memory cannot be trusted
  or touched any more. Close the socket and restart the namespace's processes."""


class MessageTooLargeError(IpcError, ValueError):
  """A message larger than the segment allows (a third of it, so the ring always holds a few)."""


class EventTimeoutError(RuntimeError):
  """A fake-backend event wait ran out of time (RuntimeError, as in commaai/msgq)."""
