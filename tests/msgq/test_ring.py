"""The shared-memory ring within one process: delivery, wrap-around, overrun, conflate, limits, errors."""
import os
import stat
import threading
import time

import pytest

import msgq
from msgq.ring import max_message_size
from msgq.segment import HEADER_SIZE, H_W
from msgq import futex
from msgq.segment import H_E


def test_send_receive_in_order_and_empty_is_none():
  pub, sub = msgq.pub_sock("a"), msgq.sub_sock("a")
  assert sub.receive(non_blocking=True) is None
  for i in range(10):
    pub.send(b"msg%d" % i)
  assert msgq.drain_sock_raw(sub) == [b"msg%d" % i for i in range(10)]
  assert sub.receive(non_blocking=True) is None
  assert sub.dropped == 0


def test_zero_length_message_is_delivered():
  pub, sub = msgq.pub_sock("a"), msgq.sub_sock("a")
  pub.send(b"")
  pub.send(b"x")
  assert sub.receive(non_blocking=True) == b""
  assert sub.receive(non_blocking=True) == b"x"


def test_wrap_around_keeps_every_message_intact():
  size = 4096
  pub, sub = msgq.pub_sock("a", segment_size=size), msgq.sub_sock("a", segment_size=size)
  for i in range(400):  # many laps of the ring, with sizes that leave odd gaps at the end
    msg = bytes([i % 251]) * (i * 37 % 900)
    pub.send(msg)
    assert sub.receive(non_blocking=True) == msg
  assert pub._impl.seg.hdr[H_W] > 10 * size
  assert sub.dropped == 0


def test_overrun_reader_skips_to_newest_and_counts_drops():
  size = 4096
  pub, sub = msgq.pub_sock("a", segment_size=size), msgq.sub_sock("a", segment_size=size)
  pub.send(b"first")
  assert sub.receive(non_blocking=True) == b"first"
  for i in range(100):
    pub.send(i.to_bytes(4, "little") * 50)
  assert sub.receive(non_blocking=True) == (99).to_bytes(4, "little") * 50
  assert sub.dropped == 99
  assert sub.receive(non_blocking=True) is None
  pub.send(b"after")
  assert sub.receive(non_blocking=True) == b"after"
  assert sub.dropped == 99


def test_drop_counter_counts_unread_backlog_of_a_lapped_reader():
  size = 4096
  pub, sub = msgq.pub_sock("a", segment_size=size), msgq.sub_sock("a", segment_size=size)
  for i in range(10):
    pub.send(bytes([i]) * 200)
  assert [sub.receive(non_blocking=True)[0] for _ in range(4)] == [0, 1, 2, 3]
  for i in range(10, 60):  # laps the reader, which still had 6 unread
    pub.send(bytes([i]) * 200)
  assert msgq.drain_sock_raw(sub) == [bytes([59]) * 200]
  assert sub.dropped == 6 + 49


def test_conflate_returns_only_newest_without_counting_drops():
  pub = msgq.pub_sock("a")
  sub = msgq.sub_sock("a", conflate=True)
  plain = msgq.sub_sock("a")
  for i in range(7):
    pub.send(b"%d" % i)
  assert msgq.drain_sock_raw(sub) == [b"6"]
  assert len(msgq.drain_sock_raw(plain)) == 7
  assert sub.dropped == 0


def test_late_joiner_sees_only_new_messages():
  pub = msgq.pub_sock("a")
  early = msgq.sub_sock("a")
  pub.send(b"old")
  late = msgq.sub_sock("a")
  assert late.receive(non_blocking=True) is None
  pub.send(b"new")
  assert late.receive(non_blocking=True) == b"new"
  assert msgq.drain_sock_raw(early) == [b"old", b"new"]


def test_subscriber_before_publisher_gets_first_message():
  sub = msgq.sub_sock("a")
  pub = msgq.pub_sock("a")
  pub.send(b"hello")
  assert sub.receive(non_blocking=True) == b"hello"


def test_oversize_message_raises_and_limit_is_exact():
  size = 3000
  pub, sub = msgq.pub_sock("a", segment_size=size), msgq.sub_sock("a", segment_size=size)
  limit = max_message_size(size)
  assert 3 * ((limit + 16 + 7) // 8 * 8) <= size
  pub.send(b"y" * limit)
  assert sub.receive(non_blocking=True) == b"y" * limit
  with pytest.raises(msgq.MessageTooLargeError, match=str(limit + 1)):
    pub.send(b"z" * (limit + 1))
  pub.send(b"still works")
  assert sub.receive(non_blocking=True) == b"still works"


def test_segment_size_mismatch_is_an_error():
  msgq.pub_sock("a", segment_size=8192)
  with pytest.raises(msgq.SegmentSizeError, match="8192"):
    msgq.sub_sock("a", segment_size=16384)
  with pytest.raises(msgq.SegmentSizeError):
    msgq.sub_sock("a")  # default size differs too


@pytest.mark.parametrize("size", [100, 4097, -8, 1.5])
def test_bad_segment_size_is_refused(size):
  with pytest.raises(ValueError, match="segment_size"):
    msgq.pub_sock("a", segment_size=size)


@pytest.mark.parametrize("endpoint", ["", "a/b", "..", "x\0"])
def test_bad_endpoint_is_refused(endpoint):
  with pytest.raises(ValueError, match="endpoint"):
    msgq.sub_sock(endpoint)


def test_foreign_file_is_refused(namespace):
  path = os.path.join(namespace.shm_dir, "junk")
  with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
    f.write(b"\x01" * (HEADER_SIZE + 8192))
  with pytest.raises(msgq.IpcError, match="magic"):
    msgq.sub_sock("junk", segment_size=8192)
  os.chmod(path, 0o644)
  with pytest.raises(msgq.IpcError, match="0600"):
    msgq.sub_sock("junk", segment_size=8192)


def test_segment_and_dir_are_owner_only(namespace):
  msgq.pub_sock("a")
  st = os.stat(os.path.join(namespace.shm_dir, "a"))
  assert stat.S_IMODE(st.st_mode) == 0o600
  assert stat.S_IMODE(os.stat(namespace.shm_dir).st_mode) == 0o700
  assert os.listdir(namespace.shm_dir) == ["a"]  # no temporary files left behind


def test_second_publisher_in_same_process_raises_until_first_closes():
  first = msgq.pub_sock("a")
  with pytest.raises(msgq.MultiplePublishersError, match="live publisher"):
    msgq.pub_sock("a")
  sub = msgq.sub_sock("a")
  first.send(b"1")
  first.close()
  second = msgq.pub_sock("a")
  second.send(b"2")
  assert msgq.drain_sock_raw(sub) == [b"1", b"2"]


def test_reader_table_is_full_at_64_live_readers_and_nobody_is_evicted():
  pub = msgq.pub_sock("a")
  readers = [msgq.sub_sock("a") for _ in range(msgq.NUM_READERS)]
  with pytest.raises(msgq.IpcError, match="reader slots"):
    msgq.sub_sock("a")
  pub.send(b"all of you")
  assert all(r.receive(non_blocking=True) == b"all of you" for r in readers)
  readers.pop().close()
  extra = msgq.sub_sock("a")  # a freed slot is reused
  pub.send(b"again")
  assert extra.receive(non_blocking=True) == b"again"


def test_all_readers_updated_and_wait_for_readers():
  pub = msgq.pub_sock("a")
  assert not pub.all_readers_updated()  # no readers yet
  with pytest.raises(TimeoutError):
    pub.wait_for_readers(timeout=0.05)
  sub = msgq.sub_sock("a")
  assert pub.all_readers_updated()
  pub.send(b"x")
  assert not pub.all_readers_updated()
  sub.receive()
  pub.wait_for_readers(timeout=1.0)


def test_blocking_receive_times_out_with_none():
  sub = msgq.sub_sock("a", timeout=100)
  start = time.monotonic()
  assert sub.receive() is None
  assert time.monotonic() - start >= 0.1


def test_blocking_receive_wakes_on_send_from_another_thread():
  pub, sub = msgq.pub_sock("a"), msgq.sub_sock("a", timeout=30_000)
  timer = threading.Timer(0.05, pub.send, args=(b"wake",))
  timer.start()
  assert sub.receive() == b"wake"
  timer.join()


def test_poller_without_futex_waitv_still_honours_timeouts_and_wakes(monkeypatch):
  monkeypatch.setattr(futex, "_have_waitv", False)  # as on a kernel older than 5.16
  poller = msgq.Poller()
  _a, b = msgq.sub_sock("a", poller=poller), msgq.sub_sock("b", poller=poller)
  start = time.monotonic()
  assert poller.poll(100) == []
  assert time.monotonic() - start >= 0.1
  pub = msgq.pub_sock("b")
  timer = threading.Timer(0.05, pub.send, args=(b"x",))
  timer.start()
  assert poller.poll(30_000) == [b]
  timer.join()


def test_shared_memory_sockets_refuse_a_remote_address():
  with pytest.raises(msgq.IpcError, match="ZMQ=1"):
    msgq.sub_sock("a", addr="192.168.1.5")


def test_publisher_dying_mid_write_leaves_nothing_half_written_visible():
  pub, sub = msgq.pub_sock("a", segment_size=4096), msgq.sub_sock("a", segment_size=4096)
  pub.send(b"complete")
  seg = pub._impl.seg
  w = seg.hdr[H_W]
  seg.hdr[H_E] = w + 512  # as if it died after reserving and scribbling, before publishing W
  seg.data[w % 4096:w % 4096 + 512] = b"\xff" * 512
  pub.close()
  assert sub.receive(non_blocking=True) == b"complete"
  assert sub.receive(non_blocking=True) is None
  heir = msgq.pub_sock("a", segment_size=4096)
  heir.send(b"next")
  assert sub.receive(non_blocking=True) == b"next"
  assert sub.dropped == 0


def test_poller_over_many_sockets_reports_exactly_the_ready_ones():
  poller = msgq.Poller()
  subs = [msgq.sub_sock(f"s{i}", poller=poller) for i in range(20)]
  pubs = [msgq.pub_sock(f"s{i}") for i in range(20)]
  timer = threading.Timer(0.05, pubs[17].send, args=(b"x",))
  timer.start()
  assert poller.poll(30_000) == [subs[17]]
  timer.join()
  pubs[3].send(b"y")
  assert poller.poll(0) == [subs[3], subs[17]]
