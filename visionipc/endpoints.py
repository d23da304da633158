"""Names: server names, stream ids, the control-socket path and the announcement topic of a stream."""
import os

from msgq.namespace import runtime_dir
from visionipc.errors import VisionIpcError
from visionipc.protocol import STREAM_LIST

_MAX_NAME = 64


def check_name(name: str) -> str:
  if not isinstance(name, str) or not name or len(name) > _MAX_NAME or not all(c.isalnum() or c in "_-" for c in name):
    raise ValueError(f"visionipc server name must be 1..{_MAX_NAME} chars of [A-Za-z0-9_-], got {name!r}")
  return name


def check_stream(stream: int) -> int:
  if isinstance(stream, bool) or not isinstance(stream, int) or not 0 <= stream < STREAM_LIST:
    raise ValueError(f"stream must be an int in 0..{STREAM_LIST - 1}, got {stream!r}")
  return int(stream)


def control_socket_path(name: str) -> str:
  path = os.path.join(runtime_dir(), f"visionipc_{check_name(name)}.sock")
  if len(path.encode()) >= 108:  # sun_path limit
    raise VisionIpcError(f"control socket path is too long for a Unix socket ({len(path)} bytes): {path}")
  return path


def announce_endpoint(name: str, stream: int) -> str:
  return f"visionipc_{check_name(name)}_{check_stream(stream)}"
