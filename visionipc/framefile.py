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
- A frame file is outside input. The reader opens only a regular file, never through a symlink, never
  waiting on a FIFO; its declared geometry must lie within MAX_DIMENSION / MAX_FRAME_BYTES and agree with the
  size the first record's zstd frame declares, so a tiny file cannot make a consumer map gigabytes; errors name
  the problem and never echo the file's bytes. A writer creates its file exclusively and never through a link.
"""
import errno
import os
import stat
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
# the largest frame a file may declare: 4096x4096 padded NV12 fits, with room (tici's 1928x1208 is 4.8 MB)
MAX_DIMENSION = 4096
MAX_FRAME_BYTES = 32 << 20


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


def check_frame_geometry(width: int, height: int, size: int, stride: int, uv_offset: int) -> None:
  """check_geometry, plus the sane maximum a frame file may declare (ValueError naming the value)."""
  check_geometry(width, height, size, stride, uv_offset)
  if max(width, height) > MAX_DIMENSION or size > MAX_FRAME_BYTES:
    raise ValueError(f"frame {width}x{height} of {size} bytes is larger than a frame file may hold "
                     f"({MAX_DIMENSION} px a side, {MAX_FRAME_BYTES >> 20} MiB a frame)")


def open_regular(path: str, dir_fd: int | None = None) -> int:
  """fd of `path` opened read-only: never through a symlink, never blocking on a FIFO or device, and only if it
  is a regular file (FrameFileError otherwise)."""
  try:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
  except OSError as e:
    why = "it is a symlink (refused)" if e.errno == errno.ELOOP else e.strerror   # O_NOFOLLOW met a link
    raise FrameFileError(f"{path}: cannot open: {why}") from None
  if not stat.S_ISREG(os.fstat(fd).st_mode):
    os.close(fd)
    raise FrameFileError(f"{path}: not a regular file")
  return fd


def create_file(path: str, dir_fd: int | None = None, exclusive: bool = True, mode: int = 0o600) -> int:
  """fd of a file opened for writing, never through a symlink someone planted; `exclusive`: it must be new."""
  flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_EXCL if exclusive else os.O_TRUNC)
  try:
    return os.open(path, flags, mode, dir_fd=dir_fd)
  except FileExistsError:
    raise FrameFileError(f"{path}: already exists (a file or link left there); refusing to write through it") from None
  except OSError as e:
    why = "it is a symlink (refused)" if e.errno == errno.ELOOP else e.strerror
    raise FrameFileError(f"{path}: cannot create: {why}") from None


class FrameWriter:
  def __init__(self, path: str, width: int, height: int, stride: int, uv_offset: int, size: int, level: int = 1,
               dir_fd: int | None = None, exclusive: bool = False):
    """A frame file at `path` (relative to `dir_fd` if given), never written through a symlink; `exclusive`:
    an existing file there is an error rather than replaced (routes)."""
    try:
      check_frame_geometry(width, height, size, stride, uv_offset)
    except ValueError as e:
      raise FrameFileError(f"{path}: {e}") from None
    self.path = path
    self.geometry = Geometry(width, height, stride, uv_offset, size)
    self._compressor = zstandard.ZstdCompressor(level=level, write_checksum=True, write_content_size=True)
    self._index: list[bytes] = []
    self._file = os.fdopen(create_file(path, dir_fd, exclusive, 0o600 if exclusive else 0o666), "wb")
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
  def __init__(self, path: str, fd: int | None = None):
    """Read the frame file at `path`; or, given `fd` (from open_regular, taken over), that file, `path` naming it."""
    self.path = path
    self._fd = open_regular(path) if fd is None else fd
    try:
      self._file_size = os.fstat(self._fd).st_size
      self.geometry = self._read_header()
      self.recovered = False
      self._index = self._read_index()
      if self._index is None:
        self.recovered = True
        self._index = self._scan_records()
      self._check_declared_size()
    except BaseException:
      os.close(self._fd)
      raise
    self._decompressor = zstandard.ZstdDecompressor()

  def _read_header(self) -> Geometry:
    raw = os.pread(self._fd, HEADER.size, 0)
    if len(raw) < HEADER.size or raw[:8] != HEADER_MAGIC:   # its bytes are not echoed: they may be anyone's
      raise FrameFileError(f"{self.path}: not a frame file (no {HEADER_MAGIC.decode()} header)")
    _, version, codec, width, height, stride, uv_offset, size = HEADER.unpack(raw)
    if version != VERSION or codec != CODEC_ZSTD:
      raise FrameFileError(f"{self.path}: unsupported version {version} / codec {codec} (this reader: {VERSION}/{CODEC_ZSTD})")
    try:
      check_frame_geometry(width, height, size, stride, uv_offset)
    except ValueError as e:
      raise FrameFileError(f"{self.path}: bad geometry in header: {e}") from None
    return Geometry(width, height, stride, uv_offset, size)

  def _check_declared_size(self) -> None:
    """The header's frame size must be what the records hold: the first record's zstd frame declares it."""
    if not self._index:
      return
    _, _, _, offset, clen = self._index[0]
    head = os.pread(self._fd, min(clen, 32), offset + RECORD.size)
    try:
      declared = zstandard.frame_content_size(head)
    except zstandard.ZstdError:
      raise FrameFileError(f"{self.path}: record 0 is not a zstd frame") from None
    if declared != self.geometry.size:
      raise FrameFileError(f"{self.path}: the header declares {self.geometry.size}-byte frames but record 0 holds "
                           f"{declared if declared >= 0 else 'an unknown number of'} bytes")

  def _read_index(self) -> list[tuple[int, int, int, int, int]] | None:
    """The footer's index, or None when the footer is missing or inconsistent (writer died)."""
    if self._file_size < HEADER.size + FOOTER.size:
      return None
    index_offset, count, magic = FOOTER.unpack(os.pread(self._fd, FOOTER.size, self._file_size - FOOTER.size))
    if magic != FOOTER_MAGIC or index_offset + count * INDEX_ENTRY.size + FOOTER.size != self._file_size:
      return None
    # every entry names its own record of at least RECORD.size bytes, so the records region bounds the count
    # (a sparse file declaring a huge index is refused before anything is built from it)
    if count > (index_offset - HEADER.size) // RECORD.size:
      raise FrameFileError(f"{self.path}: the index declares {count} frames, more than its records region can hold")
    max_clen = self._compress_bound()
    entries, pos, end = [], index_offset, index_offset + count * INDEX_ENTRY.size
    while pos < end:   # read and checked a chunk at a time: a bad entry stops the read where it is
      raw = os.pread(self._fd, min(end - pos, INDEX_ENTRY.size * 4096), pos)
      if not raw or len(raw) % INDEX_ENTRY.size:
        raise FrameFileError(f"{self.path}: short read of the index at byte {pos}")
      for entry in INDEX_ENTRY.iter_unpack(raw):
        offset, clen = entry[3], entry[4]
        if offset < HEADER.size or offset + RECORD.size + clen > index_offset or clen > max_clen:
          raise FrameFileError(f"{self.path}: index entry {len(entries)} points outside the records or past a "
                               f"frame's compressed bound (offset {offset}, length {clen})")
        entries.append(entry)
      pos += len(raw)
    return entries

  def _compress_bound(self) -> int:
    """The most bytes zstd can take for one frame of this geometry (its ZSTD_compressBound, with a margin)."""
    size = self.geometry.size
    return size + (size >> 7) + (1 << 12)

  def _scan_records(self) -> list[tuple[int, int, int, int, int]]:
    entries, offset, max_clen = [], HEADER.size, self._compress_bound()
    while offset + RECORD.size <= self._file_size:
      magic, clen, frame_id, sof, eof = RECORD.unpack(os.pread(self._fd, RECORD.size, offset))
      if magic != RECORD_MAGIC or offset + RECORD.size + clen > self._file_size or clen > max_clen:
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
