"""The server's writes into a frame buffer (visionipc/_fill.c): word order, and a refused fill writes nothing."""
import numpy as np
import pytest

from visionipc import FrameSizeError, VisionIpcClient, protocol
from visionipc._fill import complete, fill, start


def trailer_buffer():
  """An aligned trailer plus a 64-byte image, as numpy arrays over fresh memory."""
  return np.zeros(protocol.TRAILER.size // 8, np.uint64), np.zeros(64, np.uint8)


def test_fill_copies_and_writes_every_trailer_word():
  trailer, dst = trailer_buffer()
  src = np.arange(64, dtype=np.uint8)
  assert fill(dst, trailer, src, 7, 42, 1000, 2000, True) == 64
  assert np.array_equal(dst, src)
  assert trailer.tolist() == [7, 7, 42, 1000, 2000, 1]
  assert fill(dst, trailer, bytes(64), 2**64 - 1, 0, 0, 0, False) == 64
  assert trailer.tolist() == [2**64 - 1, 2**64 - 1, 0, 0, 0, 0] and not dst.any()
  floats = np.arange(16, dtype=np.float32)  # an ndarray is read directly: its length is in bytes too
  assert fill(dst, trailer, floats, 8, 0, 0, 0, True) == 64 and dst.tobytes() == floats.tobytes()
  assert fill(dst, trailer, memoryview(src.tobytes()), 9, 0, 0, 0, True) == 64 and np.array_equal(dst, src)


def test_a_zero_copy_fill_is_start_then_complete():
  trailer, _ = trailer_buffer()
  start(trailer, 9)
  assert trailer.tolist() == [9, 0, 0, 0, 0, 0]  # being filled: gen_start != gen_end
  complete(trailer, 9, np.int64(3), 4, 5, 1)  # numpy integers are integers
  assert trailer.tolist() == [9, 9, 3, 4, 5, 1]


@pytest.mark.parametrize("field, value", [(4, -1), (5, 2**64), (6, 1.5), (3, "7")])
def test_an_out_of_range_field_is_refused_before_anything_is_written(field, value):
  trailer, dst = trailer_buffer()
  args = [dst, trailer, np.full(64, 5, np.uint8), 1, 2, 3, 4, True]
  args[field] = value
  name = ["generation", "frame_id", "timestamp_sof", "timestamp_eof"][field - 3]
  with pytest.raises(ValueError, match=rf"{name} must be an integer in \[0, 2\*\*64\), got {value!r}"):
    fill(*args)
  assert not trailer.any() and not dst.any()


def test_a_source_of_another_length_is_reported_and_not_copied():
  trailer, dst = trailer_buffer()
  assert fill(dst, trailer, bytes(63), 1, 0, 0, 0, True) == 63
  assert fill(dst, trailer, bytes(65), 1, 0, 0, 0, True) == 65
  assert not trailer.any() and not dst.any()


def test_bad_buffers_are_typed_errors():
  trailer, dst = trailer_buffer()
  with pytest.raises(TypeError, match="C-contiguous bytes-like object, got list"):
    fill(dst, trailer, [0] * 64, 1, 0, 0, 0, True)
  with pytest.raises(TypeError, match="C-contiguous bytes-like object, got numpy.ndarray"):
    fill(dst, trailer, np.zeros(128, np.uint8)[::2], 1, 0, 0, 0, True)
  with pytest.raises(ValueError, match="trailer must be 6 aligned uint64 words, got 40 bytes"):
    start(trailer[:5], 1)
  with pytest.raises(ValueError, match="got 48 bytes at offset 1 mod 8"):
    start(np.zeros(56, np.uint8)[1:49], 1)
  with pytest.raises(BufferError, match="not writable"):  # a read-only destination
    fill(bytes(64), trailer, bytes(64), 1, 0, 0, 0, True)
  with pytest.raises(TypeError, match=r"complete\(\) takes 6 arguments, got 2"):
    complete(trailer, 1)
  assert not trailer.any()


def test_a_refused_send_leaves_the_ring_and_the_frames_clients_hold(local_server):
  """A send() refused for its size or its fields must not take a buffer: the client's frame in the buffer
  the server fills next stays valid, and the next good frame goes to that buffer with the next generation."""
  server = local_server(2)
  client = VisionIpcClient("camerad", 0)
  assert client.connect(blocking=True, timeout=10)
  server.send(0, bytes(4608), 0)
  server.send(0, bytes(4608), 1)
  held = [client.recv(1000), client.recv(1000)]
  assert [b.idx for b in held] == [0, 1]
  with pytest.raises(FrameSizeError, match="frame is 4609 bytes, buffers hold 4608"):
    server.send(0, bytes(4609), 2)
  with pytest.raises(ValueError, match="frame_id must be an integer"):
    server.send(0, bytes(4608), -2)
  with pytest.raises(ValueError, match="timestamp_sof must be an integer"):
    server.send_buffer(server.get_buffer(0, idx=1), 2, timestamp_sof=2**64)
  assert held[0].still_valid()  # buffer 0, the next in the ring, was not touched
  server.send(0, np.full(4608, 9, np.uint8), 3)
  got = client.recv(1000)
  assert got.idx == 0 and got.frame_id == 3 and got.generation == held[1].generation + 2  # +1: get_buffer's
  assert not held[0].still_valid() and np.all(np.frombuffer(got.data, np.uint8) == 9) and got.still_valid()
  client.close()
