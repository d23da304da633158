"""Typed errors of visionipc. All derive from VisionIpcError; each message names the offending value."""


class VisionIpcError(Exception):
  """Base class of every visionipc failure."""


class FrameSizeError(VisionIpcError, ValueError):
  """send() got data whose length differs from the stream's buffer length."""


class GeometryError(VisionIpcError, ValueError):
  """Buffer geometry (width, height, stride, uv_offset, size, count) that cannot describe an NV12 ring."""


class UnknownStreamError(VisionIpcError, KeyError):
  """A stream the server does not serve (or one not created on this server)."""

  def __str__(self) -> str:  # KeyError would repr() the message
    return str(self.args[0]) if self.args else ""


class ProtocolError(VisionIpcError):
  """A malformed, truncated or inconsistent message from the peer (descriptor, announcement, request)."""
