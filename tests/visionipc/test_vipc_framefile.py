"""Frame files: exact round trip, random access, crash recovery, and clear errors for bad input."""
import os

import numpy as np
import pytest

from visionipc.framefile import FrameFileError, FrameReader, FrameWriter
from visionipc.nv12 import padded_nv12_layout

W, H = 1344, 760
SIZE, STRIDE, UV_OFFSET = padded_nv12_layout(W, H)


def frames(n):
  rng = np.random.default_rng(5)
  out = []
  for i in range(n):
    frame = np.zeros(SIZE, np.uint8)
    frame[: UV_OFFSET] = rng.integers(0, 256, UV_OFFSET, dtype=np.uint8) if i % 2 else i  # noise and flat frames
    out.append(frame.tobytes())
  return out


def write(path, data, close=True):
  writer = FrameWriter(str(path), W, H, STRIDE, UV_OFFSET, SIZE)
  for i, frame in enumerate(data):
    writer.write(frame, frame_id=100 + i, timestamp_sof=10 * i, timestamp_eof=10 * i + 5)
  if close:
    writer.close()
  return writer


def test_round_trip_is_exact_with_random_access(tmp_path):
  data = frames(6)
  write(tmp_path / "f.nv12z", data)
  with FrameReader(str(tmp_path / "f.nv12z")) as reader:
    assert len(reader) == 6 and not reader.recovered
    assert tuple(reader.geometry) == (W, H, STRIDE, UV_OFFSET, SIZE)
    assert reader.frame_ids() == list(range(100, 106))
    for i in (4, 0, 5, 2, -1):
      frame = reader.get(i)
      assert frame.data == data[i]
      assert (frame.frame_id, frame.timestamp_sof, frame.timestamp_eof) == (100 + i % 6, 10 * (i % 6), 10 * (i % 6) + 5)
    assert [f.data for f in reader] == data
    with pytest.raises(IndexError, match="frame index 6 out of range"):
      reader.get(6)
  assert os.path.getsize(tmp_path / "f.nv12z") < 4 * SIZE  # flat frames and padding compress


def test_a_file_whose_writer_died_is_recovered_up_to_the_last_whole_frame(tmp_path):
  data = frames(3)
  writer = write(tmp_path / "f.nv12z", data, close=False)
  writer._file.flush()  # the process "dies" here: no index, no footer
  with open(tmp_path / "f.nv12z", "ab") as f:
    f.write(b"FREC\xff\xff")  # and a torn record header at the end
  reader = FrameReader(str(tmp_path / "f.nv12z"))
  assert reader.recovered and len(reader) == 3
  assert [f.data for f in reader] == data


def test_corruption_and_wrong_input_are_clear_errors(tmp_path):
  path = tmp_path / "f.nv12z"
  writer = FrameWriter(str(path), W, H, STRIDE, UV_OFFSET, SIZE)
  with pytest.raises(FrameFileError, match=f"frame 7 is 10 bytes, the file holds {SIZE}-byte frames"):
    writer.write(bytes(10), frame_id=7)
  writer.close()
  with pytest.raises(ValueError, match="stride 100 is smaller"):
    FrameWriter(str(tmp_path / "g"), W, H, 100, UV_OFFSET, SIZE)
  (tmp_path / "junk").write_bytes(b"not a frame file at all" * 10)
  with pytest.raises(FrameFileError, match="not a frame file"):
    FrameReader(str(tmp_path / "junk"))
  write(path, frames(2))
  raw = bytearray(path.read_bytes())
  raw[64 + 32 + 40] ^= 0xFF  # flip a byte inside the first compressed frame
  path.write_bytes(bytes(raw))
  reader = FrameReader(str(path))
  with pytest.raises(FrameFileError, match="frame 0 .* is corrupt"):
    reader.get(0)
  assert len(reader.get(1).data) == SIZE  # the other frames stay readable
