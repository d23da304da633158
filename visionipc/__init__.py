"""visionipc: camera frames in shared memory, with the API of commaai/msgq's msgq.visionipc.

Invariants (details in README.md and each module's docstring):
- Pixels never cross a socket: buffers are sealed memfds whose fds a client receives once; each frame is a
  small versioned little-endian announcement on the bus topic `visionipc_<server>_<stream>`.
- Every fill is bracketed by a generation word (start, end), so a reader can prove after use that its frame
  was not overwritten (`VisionBuf.still_valid()`).
- A restarted server is noticed from its server_id and clients reconnect on their own in recv().
- Peer input is validated; errors are typed (errors.py) and name the offending value.
"""
import enum

from visionipc.buffer import VisionBuf
from visionipc.client import VisionIpcClient, available_streams
from visionipc.errors import FrameSizeError, GeometryError, ProtocolError, UnknownStreamError, VisionIpcError
from visionipc.nv12 import get_nv12_info
from visionipc.server import VisionIpcServer


class VisionStreamType(enum.IntEnum):
  VISION_STREAM_NARROW_ROAD = 0
  VISION_STREAM_CABIN = 1
  VISION_STREAM_WIDE_ROAD = 2
  # names of older openpilot trees (same ids)
  VISION_STREAM_ROAD = 0
  VISION_STREAM_DRIVER = 1


VISION_STREAM_NARROW_ROAD = VisionStreamType.VISION_STREAM_NARROW_ROAD
VISION_STREAM_WIDE_ROAD = VisionStreamType.VISION_STREAM_WIDE_ROAD
VISION_STREAM_CABIN = VisionStreamType.VISION_STREAM_CABIN

__all__ = ["VisionIpcServer", "VisionIpcClient", "VisionBuf", "VisionStreamType", "get_nv12_info",
           "available_streams", "VISION_STREAM_NARROW_ROAD", "VISION_STREAM_WIDE_ROAD", "VISION_STREAM_CABIN",
           "VisionIpcError", "FrameSizeError", "GeometryError", "UnknownStreamError", "ProtocolError"]
