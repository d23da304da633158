"""Frame files: recorded NV12 frames of one camera, compressed per frame, with an index for random access.

Layout (all little-endian):
  HEADER   magic b"NV12FRMS", version, codec, width, height, stride, uv_offset, size   (64 bytes)
  records  RECORD (magic b"FREC", compressed length, frame_id, sof, eof) + zstd frame, one per frame
  index    INDEX_ENTRY (frame_id, sof, eof, record offset, compressed length) per frame
  FOOTER   index offset, count, magic b"NV12IDX\\0"
Invariants:
- Every frame is exactly `size` bytes (the whole padded buffer, padding included), so a file round-trips
  byte-for-byte and a frame can be sent straight into a VisionIPC buffer of the same geometry.
- Each zstd frame carries a content checksum and its decompressed size is checked: corruption is a
  FrameFileError, never wrong pixels.
- A file whose writer died before close() (no footer) is still readable: the reader rebuilds the index by
  walking the records and stops at the first incomplete one (`reader.recovered` is then True).
"""
import os
import struct
from typing import Iterator, NamedTuple

import zstandard

from visionipc.nv12 import check_geometry

VERSION = 1
CODEC_ZSTD = 1
HEADER = struct.Struct("<8sHHIIIIQ28x")
RECORD = struct.Struct("<4sIQQQ")
INDEX_ENTRY = struct.Struct("<QQQQI4x")
FOOTER = struct.Struct("<QQ8s")
HEADER_MAGIC, RECORD_MAGIC, FOOTER_MAGIC = b"NV12FRMS", b"FREC", b"NV12IDX\0"

# file name per camera stream in a recorded route directory (named after openpilot's f/e/d camera files)
STREAM_FILE_NAMES = {"road": "fcamera.nv12z", "wide": "ecamera.nv12z", "cabin": "dcamera.nv12z"}


class FrameFileError(ValueError):
  """A frame file that is not one, is corrupt, or does not match the data given to it."""


class Frame(NamedTuple):
  frame_id: int
  timestamp_sof: int
  timestamp_eof: int
  data: bytes


class Geometry(NamedTuple):
  width: int
  height: int
  stride: int
  uv_offset: int
  size: int


class FrameWriter:
  def __init__(self, path: str, width: int, height: int, stride: int, uv_offset: int, size: int, level: int = 1):
    check_geometry(width, height, size, stride, uv_offset)
    self.path = path
    self.geometry = Geometry(width, height, stride, uv_offset, size)
    self._compressor = zstandard.ZstdCompressor(level=level, write_checksum=True, write_content_size=True)
    self._index: list[bytes] = []
    self._file = open(path, "wb")
    self._file.write(HEADER.pack(HEADER_MAGIC, VERSION, CODEC_ZSTD, width, height, stride, uv_offset, size))
    self._offset = HEADER.size

  def write(self, data, frame_id: int, timestamp_sof: int = 0, timestamp_eof: int = 0) -> None:
    """Append one frame; `data` is any bytes-like object of exactly `size` bytes (e.g. VisionBuf.data)."""
    if self._file is None:
      raise FrameFileError(f"{self.path}: writer is closed")
    n = memoryview(data).nbytes
    if n != self.geometry.size:
      raise FrameFileError(f"{self.path}: frame {frame_id} is {n} bytes, the file holds {self.geometry.size}-byte frames")
    blob = self._compressor.compress(data)
    self._file.write(RECORD.pack(RECORD_MAGIC, len(blob), frame_id, timestamp_sof, timestamp_eof))
    self._file.write(blob)
    self._index.append(INDEX_ENTRY.pack(frame_id, timestamp_sof, timestamp_eof, self._offset, len(blob)))
    self._offset += RECORD.size + len(blob)

  def __len__(self) -> int:
    return len(self._index)

  def close(self) -> None:
    if self._file is None:
      return
    self._file.write(b"".join(self._index))
    self._file.write(FOOTER.pack(self._offset, len(self._index), FOOTER_MAGIC))
    self._file.close()
    self._file = None

  def __enter__(self) -> "FrameWriter":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


class FrameReader:
  def __init__(self, path: str):
    self.path = path
    self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
      self._file_size = os.fstat(self._fd).st_size
      self.geometry = self._read_header()
      self.recovered = False
      self._index = self._read_index()
      if self._index is None:
        self.recovered = True
        self._index = self._scan_records()
    except BaseException:
      os.close(self._fd)
      raise
    self._decompressor = zstandard.ZstdDecompressor()

  def _read_header(self) -> Geometry:
    raw = os.pread(self._fd, HEADER.size, 0)
    if len(raw) < HEADER.size or raw[:8] != HEADER_MAGIC:
      raise FrameFileError(f"{self.path}: not a frame file (bad magic {raw[:8]!r})")
    _, version, codec, width, height, stride, uv_offset, size = HEADER.unpack(raw)
    if version != VERSION or codec != CODEC_ZSTD:
      raise FrameFileError(f"{self.path}: unsupported version {version} / codec {codec} (this reader: {VERSION}/{CODEC_ZSTD})")
    try:
      check_geometry(width, height, size, stride, uv_offset)
    except ValueError as e:
      raise FrameFileError(f"{self.path}: bad geometry in header: {e}") from None
    return Geometry(width, height, stride, uv_offset, size)

  def _read_index(self) -> list[tuple[int, int, int, int, int]] | None:
    """The footer's index, or None when the footer is missing or inconsistent (writer died)."""
    if self._file_size < HEADER.size + FOOTER.size:
      return None
    index_offset, count, magic = FOOTER.unpack(os.pread(self._fd, FOOTER.size, self._file_size - FOOTER.size))
    if magic != FOOTER_MAGIC or index_offset + count * INDEX_ENTRY.size + FOOTER.size != self._file_size:
      return None
    raw = os.pread(self._fd, count * INDEX_ENTRY.size, index_offset)
    entries = [INDEX_ENTRY.unpack_from(raw, i * INDEX_ENTRY.size) for i in range(count)]
    for *_, offset, clen in entries:
      if offset < HEADER.size or offset + RECORD.size + clen > index_offset:
        raise FrameFileError(f"{self.path}: index entry points outside the records (offset {offset}, length {clen})")
    return entries

  def _scan_records(self) -> list[tuple[int, int, int, int, int]]:
    entries, offset = [], HEADER.size
    while offset + RECORD.size <= self._file_size:
      magic, clen, frame_id, sof, eof = RECORD.unpack(os.pread(self._fd, RECORD.size, offset))
      if magic != RECORD_MAGIC or offset + RECORD.size + clen > self._file_size:
        break
      entries.append((frame_id, sof, eof, offset, clen))
      offset += RECORD.size + clen
    return entries

  def __len__(self) -> int:
    return len(self._index)

  def get(self, i: int) -> Frame:
    if not -len(self._index) <= i < len(self._index):
      raise IndexError(f"{self.path}: frame index {i} out of range (file has {len(self._index)} frames)")
    frame_id, sof, eof, offset, clen = self._index[i]
    raw = os.pread(self._fd, RECORD.size + clen, offset)
    magic, rec_len, rec_id, _, _ = RECORD.unpack_from(raw)
    if magic != RECORD_MAGIC or rec_len != clen or rec_id != frame_id or len(raw) != RECORD.size + clen:
      raise FrameFileError(f"{self.path}: record {i} at offset {offset} does not match the index")
    try:
      data = self._decompressor.decompress(raw[RECORD.size:], max_output_size=self.geometry.size)
    except zstandard.ZstdError as e:
      raise FrameFileError(f"{self.path}: frame {i} (frame_id {frame_id}) is corrupt: {e}") from None
    if len(data) != self.geometry.size:
      raise FrameFileError(f"{self.path}: frame {i} decompressed to {len(data)} bytes, expected {self.geometry.size}")
    return Frame(frame_id, sof, eof, data)

  __getitem__ = get

  def __iter__(self) -> Iterator[Frame]:
    for i in range(len(self._index)):
      yield self.get(i)

  def frame_ids(self) -> list[int]:
    return [entry[0] for entry in self._index]

  def close(self) -> None:
    if self._fd >= 0:
      os.close(self._fd)
      self._fd = -1

  def __enter__(self) -> "FrameReader":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
