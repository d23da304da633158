"""The doorbell: a client polling for a periodic frame takes it as soon as the buffer's generation words agree,
before the server has published its announcement; the announcement that follows is dropped as a duplicate.
Nothing may be delivered early, twice or out of order because of it."""
import threading
import time

import numpy as np
import pytest

from visionipc import VisionIpcClient, VisionIpcServer
from visionipc.pacing import LATE_LEADS

PERIOD_S = 0.05
LEAD_S = 0.008  # a wide poll window (8 ms before the due time, 24 after), so a loaded machine's scheduling
# jitter cannot push a frame out of it


@pytest.fixture
def server(local_server):
  return local_server(4)


@pytest.fixture
def client(server):
  c = VisionIpcClient("camerad", 0, spin_lead_s=LEAD_S)
  assert c.connect(blocking=True, timeout=10)
  yield c
  c.close()


class HeldAnnouncements:
  """Stands in for a stream's publisher and keeps every announcement back until release()."""

  def __init__(self, server: VisionIpcServer, stream: int):
    self._stream = server._streams[stream]
    self._real = self._stream.publisher
    self.held: list[bytes] = []
    self._stream.publisher = self

  def send(self, data) -> None:
    self.held.append(bytes(data))

  def release(self) -> None:
    self.discard()
    for msg in self.held:
      self._real.send(msg)

  def discard(self) -> None:
    """Give the stream its publisher back; what was held is never sent."""
    self._stream.publisher = self._real


def fill(buf, value: int) -> None:
  np.frombuffer(buf.data, np.uint8)[:] = value


def learn_period(server: VisionIpcServer, client: VisionIpcClient) -> float:
  """Send periodic frames until the client polls for the next one; returns when that one is due."""
  due = time.monotonic()
  for frame_id in range(40):
    time.sleep(max(0.0, due - time.monotonic()))
    server.send(0, np.full(server._streams[0].mappings[0].len, frame_id, np.uint8), frame_id)
    assert client.recv(1000).frame_id == frame_id
    due += PERIOD_S
    if client._pacing.poll_window() is not None:
      return due
  pytest.fail("40 frames at 50 ms never made the client's arrivals periodic (machine far too loaded?)")


def at(when: float, action) -> threading.Thread:
  """Run `action` in a producer thread at monotonic time `when` (the client is in recv() meanwhile)."""
  def run():
    time.sleep(max(0.0, when - time.monotonic()))
    action()
  thread = threading.Thread(target=run)
  thread.start()
  return thread


def test_a_polling_client_takes_the_frame_at_its_doorbell_before_the_announcement(server, client):
  due = learn_period(server, client)
  held = HeldAnnouncements(server, 0)

  def produce():
    buf = server.get_buffer(0)
    fill(buf, 0xAB)
    server.send_buffer(buf, frame_id=77, timestamp_sof=123, timestamp_eof=456, valid=False)

  producer = at(due, produce)
  buf = client.recv(2000)
  producer.join()
  assert buf is not None, "the frame was only announced, never published: the doorbell must deliver it"
  assert (buf.frame_id, buf.timestamp_sof, buf.timestamp_eof, buf.valid) == (77, 123, 456, False)
  assert (client.frame_id, client.timestamp_sof, client.timestamp_eof, client.valid) == (77, 123, 456, False)
  assert np.all(np.frombuffer(buf.data, np.uint8) == 0xAB) and buf.still_valid()
  assert len(held.held) == 1, "the announcement was still held back when the frame was taken"

  held.release()  # the announcement of the frame already delivered arrives late: a duplicate
  assert client.recv(100) is None
  assert (client.skipped_overwritten, client.bad_announcements) == (0, 0)
  assert client._pacing.period is not None, "a dropped duplicate must not count as an arrival"
  server.send(0, np.zeros(buf.len, np.uint8), frame_id=78)
  assert client.recv(1000).frame_id == 78


def test_a_fill_in_progress_or_with_bad_fields_never_rings(server, client):
  due = learn_period(server, client)
  started = []
  producer = at(due, lambda: started.append(server.get_buffer(0)))  # filling, never sent
  assert client.recv(int((PERIOD_S + (1 + LATE_LEADS) * LEAD_S) * 1000)) is None  # past the whole window
  producer.join()
  buf = started[0]
  with pytest.raises(ValueError, match=r"-5"):
    server.send_buffer(buf, frame_id=-5)
  assert not client._sub.receive(non_blocking=True), "a frame with bad fields was announced"
  assert client.recv(50) is None, "a frame with bad fields rang the doorbell"
  server.send_buffer(buf, frame_id=5)
  got = client.recv(1000)
  assert got is not None and got.frame_id == 5 and got.generation == buf.generation


def test_frames_filled_out_of_ring_order_still_arrive_once_each_in_order(server, client):
  due = learn_period(server, client)
  order = [2, 0, 3, 1, 1, 2]
  got = []
  for i, idx in enumerate(order):
    def produce(idx=idx, frame_id=100 + i):
      buf = server.get_buffer(0, idx=idx)
      fill(buf, frame_id)
      server.send_buffer(buf, frame_id)
    producer = at(due, produce)
    buf = client.recv(2000)
    producer.join()
    assert buf is not None
    got.append((buf.frame_id, buf.idx, int(np.frombuffer(buf.data, np.uint8)[0])))
    due += PERIOD_S
  assert got == [(100 + i, idx, 100 + i) for i, idx in enumerate(order)]
  assert client.recv(50) is None, "a frame was delivered twice"


def test_two_fills_announced_in_reverse_order_both_arrive_in_announcement_order(server, client):
  due = learn_period(server, client)

  def produce():
    first, second = server.get_buffer(0), server.get_buffer(0)
    server.send_buffer(second, 201)  # the newer fill first, then the older one
    time.sleep(0.005)
    server.send_buffer(first, 200)

  producer = at(due, produce)
  got = [client.recv(2000), client.recv(2000)]
  producer.join()
  assert [b.frame_id if b is not None else None for b in got] == [201, 200]


def test_a_server_restart_after_a_doorbell_frame_loses_nothing_from_the_new_server(local_server):
  old = local_server(4)
  client = VisionIpcClient("camerad", 0, spin_lead_s=LEAD_S)
  assert client.connect(blocking=True, timeout=10)
  due = learn_period(old, client)
  held = HeldAnnouncements(old, 0)  # the server dies between ringing the doorbell and publishing the announcement
  size = old._streams[0].mappings[0].len
  producer = at(due, lambda: old.send(0, np.zeros(size, np.uint8), 999))
  rung = client.recv(2000)
  producer.join()
  assert rung is not None and rung.frame_id == 999
  held.discard()
  old.close()
  new = local_server(4)  # same name, new server_id and buffers; its generations restart at 1
  got = []
  for frame_id in range(rung.generation + 2):  # up to and past the generation the doorbell delivered
    new.send(0, np.full(size, frame_id & 0xFF, np.uint8), frame_id)
    buf = client.recv(2000)
    assert buf is not None, f"frame {frame_id} of the new server (generation {frame_id + 1}) was lost"
    assert buf.server_id == new.server_id
    got.append((buf.frame_id, int(np.frombuffer(buf.data, np.uint8)[0])))
  assert got == [(f, f & 0xFF) for f in range(rung.generation + 2)] and client.reconnects == 1
  client.close()
