"""Wire formats of visionipc: explicit, versioned, little-endian (struct '<'); never raw in-memory structs.

Control socket (Unix SOCK_SEQPACKET, one request and one reply per connection):
  request   REQUEST            magic b"VIPQ", version, kind (buffers | list), stream
  reply     REPLY_HEADER       magic b"VIPR", version, status, server_id, stream, count
            then `count` BUFFER_DESC (status OK, kind buffers; the fds ride in one SCM_RIGHTS message)
            or `count` uint32 stream ids (kind list).
Announcement (one msgq message per frame on topic `visionipc_<server>_<stream>`):
            ANNOUNCE           magic b"VIPA", version, idx, server_id, generation, frame_id, sof, eof, valid
Buffer memory (memfd, sealed against shrinking): image bytes [0, len), then at `trailer_offset` six
little-endian uint64: generation-at-start, generation-at-end, then the frame's announcement fields frame_id,
sof, eof, valid (0/1). The fields are written before generation-at-end, so a buffer whose two generation
words agree also carries its complete announcement (the doorbell a polling client reads; see client.py).
Version 2: version 1 had only the frame_id stamp after the generation words.
"""
import struct

from visionipc.errors import ProtocolError

VERSION = 2
STREAM_LIST = 0xFFFFFFFF  # request kind "list" uses this stream id, as the reference does
MAX_BUFFERS = 127
MAX_STREAMS = 64

KIND_BUFFERS = 0
KIND_LIST = 1

STATUS_OK = 0
STATUS_UNKNOWN_STREAM = 1
STATUS_BAD_REQUEST = 2
STATUS_NAMES = {STATUS_OK: "ok", STATUS_UNKNOWN_STREAM: "unknown stream", STATUS_BAD_REQUEST: "bad request"}

REQUEST = struct.Struct("<4sHHI")
REPLY_HEADER = struct.Struct("<4sHHQII")
BUFFER_DESC = struct.Struct("<IIIIIQQQ")  # idx, width, height, stride, uv_offset, len, mmap_len, trailer_offset
ANNOUNCE = struct.Struct("<4sHHIQQQQQ?7x")
TRAILER = struct.Struct("<QQQQQQ")  # gen_start, gen_end, frame_id, sof, eof, valid

REQUEST_MAGIC = b"VIPQ"
REPLY_MAGIC = b"VIPR"
ANNOUNCE_MAGIC = b"VIPA"

MAX_REPLY_BYTES = REPLY_HEADER.size + MAX_BUFFERS * BUFFER_DESC.size


def _check_magic(kind: str, magic: bytes, expected: bytes, version: int) -> None:
  if magic != expected:
    raise ProtocolError(f"bad {kind} magic {magic!r} (expected {expected!r})")
  if version != VERSION:
    raise ProtocolError(f"{kind} version {version} is not supported (this side speaks version {VERSION})")


def encode_request(kind: int, stream: int) -> bytes:
  return REQUEST.pack(REQUEST_MAGIC, VERSION, kind, stream)


def decode_request(data: bytes) -> tuple[int, int]:
  if len(data) != REQUEST.size:
    raise ProtocolError(f"request is {len(data)} bytes, expected {REQUEST.size}")
  magic, version, kind, stream = REQUEST.unpack(data)
  _check_magic("request", magic, REQUEST_MAGIC, version)
  if kind not in (KIND_BUFFERS, KIND_LIST):
    raise ProtocolError(f"unknown request kind {kind}")
  return kind, stream


def encode_reply(status: int, server_id: int, stream: int, body: list[bytes]) -> bytes:
  return REPLY_HEADER.pack(REPLY_MAGIC, VERSION, status, server_id, stream, len(body)) + b"".join(body)


def decode_reply_header(data: bytes) -> tuple[int, int, int, int]:
  """(status, server_id, stream, count) after checking magic, version and that the body length matches."""
  if len(data) < REPLY_HEADER.size:
    raise ProtocolError(f"reply is {len(data)} bytes, shorter than its {REPLY_HEADER.size}-byte header")
  magic, version, status, server_id, stream, count = REPLY_HEADER.unpack_from(data)
  _check_magic("reply", magic, REPLY_MAGIC, version)
  if status not in STATUS_NAMES:
    raise ProtocolError(f"reply has unknown status {status}")
  return status, server_id, stream, count


def decode_stream_ids(data: bytes, count: int) -> set[int]:
  """The uint32 stream ids in a reply body (list replies, and unknown-stream replies naming what exists)."""
  if count > MAX_STREAMS or len(data) != REPLY_HEADER.size + 4 * count:
    raise ProtocolError(f"stream list of {count} entries does not match the reply length {len(data)}")
  return set(struct.unpack_from(f"<{count}I", data, REPLY_HEADER.size))


def decode_stream_list(data: bytes) -> set[int]:
  status, _, _, count = decode_reply_header(data)
  if status != STATUS_OK:
    raise ProtocolError(f"stream list request failed: {STATUS_NAMES[status]}")
  return decode_stream_ids(data, count)


def encode_buffer_desc(idx, width, height, stride, uv_offset, length, mmap_len, trailer_offset) -> bytes:
  return BUFFER_DESC.pack(idx, width, height, stride, uv_offset, length, mmap_len, trailer_offset)


def decode_buffer_descs(data: bytes, count: int) -> list[tuple[int, ...]]:
  if count == 0 or count > MAX_BUFFERS:
    raise ProtocolError(f"reply announces {count} buffers (allowed 1..{MAX_BUFFERS})")
  if len(data) != REPLY_HEADER.size + count * BUFFER_DESC.size:
    raise ProtocolError(f"reply of {len(data)} bytes does not hold exactly {count} buffer descriptors")
  return [BUFFER_DESC.unpack_from(data, REPLY_HEADER.size + i * BUFFER_DESC.size) for i in range(count)]


def encode_announce(idx: int, server_id: int, generation: int, frame_id: int, sof: int, eof: int,
                    valid: bool) -> bytes:
  return ANNOUNCE.pack(ANNOUNCE_MAGIC, VERSION, 0, idx, server_id, generation, frame_id, sof, eof, valid)


def decode_announce(data: bytes) -> tuple[int, int, int, int, int, int, bool]:
  """(idx, server_id, generation, frame_id, sof, eof, valid)."""
  if len(data) != ANNOUNCE.size:
    raise ProtocolError(f"announcement is {len(data)} bytes, expected {ANNOUNCE.size}")
  magic, version, _, idx, server_id, generation, frame_id, sof, eof, valid = ANNOUNCE.unpack(data)
  _check_magic("announcement", magic, ANNOUNCE_MAGIC, version)
  return idx, server_id, generation, frame_id, sof, eof, valid
