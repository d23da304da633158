"""A frame file's index is bounded by what its records region can hold and checked while it is read, and a record
by the compressed bound of one frame: a sparse file declaring a huge index, or an entry claiming a gigabyte record,
is a FrameFileError at once, in bounded memory."""
import os

import pytest

from bounded_child import refusal_in_bounded_memory
from visionipc.framefile import FOOTER, FOOTER_MAGIC, HEADER, INDEX_ENTRY, RECORD, FrameFileError, FrameReader, FrameWriter
from visionipc.nv12 import get_nv12_info

W, H = 64, 48


def one_frame_file(path) -> int:
  """A valid file of one frame; returns where its records end (its index's offset)."""
  stride, y_height, _, size = get_nv12_info(W, H)
  uv_offset = stride * y_height
  with FrameWriter(str(path), W, H, stride, uv_offset, size) as w:
    w.write(bytes(size), frame_id=1)
  index_offset, _, _ = FOOTER.unpack(path.read_bytes()[-FOOTER.size:])
  return index_offset


def with_index(path, index_offset: int, entries: list[bytes], count: int) -> None:
  """Keep the header and records, then write `entries` as the first of `count` index entries (the rest sparse)."""
  with open(path, "r+b") as f:
    f.truncate(index_offset)
    f.seek(index_offset)
    f.write(b"".join(entries))
    f.truncate(index_offset + count * INDEX_ENTRY.size)
    f.seek(0, os.SEEK_END)
    f.write(FOOTER.pack(index_offset, count, FOOTER_MAGIC))


def test_a_sparse_file_declaring_a_huge_index_is_refused_in_bounded_memory(tmp_path):
  path = tmp_path / "sparse.nv12z"
  with_index(path, one_frame_file(path), [], 100_000_000)   # a 4 GB index in a file of a few KB on disk
  out = refusal_in_bounded_memory("visionipc.framefile.FrameReader", "visionipc.framefile.FrameFileError", path, 1 << 30)
  assert "more than its records region can hold" in out


def test_an_index_entry_claiming_a_record_past_a_frames_compressed_bound_is_refused(tmp_path):
  path = tmp_path / "big.nv12z"
  index_offset = one_frame_file(path)
  with open(path, "r+b") as f:   # make the records region large (sparse), then point one entry at all of it
    f.truncate(1 << 30)
  entry = INDEX_ENTRY.pack(1, 0, 0, HEADER.size, (1 << 30) - HEADER.size - RECORD.size)
  with_index(path, 1 << 30, [entry], 1)
  assert index_offset < (1 << 30)
  with pytest.raises(FrameFileError, match="compressed bound"):
    FrameReader(str(path))
