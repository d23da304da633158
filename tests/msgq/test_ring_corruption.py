"""A corrupt segment header, by a same-user process or a stray write, never makes a reader replay old messages,
wedge, spin past its timeout or die; a truncated segment file is a typed error, never SIGBUS.

Readers check every position against the ring's geometry and the message sequence on each read, and start
over at the newest message (counting a drop and a resync) when something does not add up."""
import os
import signal
import time

import pytest

import msgq
import msgq.namespace
from msgq.segment import H_COUNT, H_E, H_L, H_W, HEADER_SIZE

SIZE = 4096


def _ring(conflate=False):
  pub = msgq.pub_sock("corrupt", segment_size=SIZE)
  sub = msgq.sub_sock("corrupt", segment_size=SIZE, timeout=100, conflate=conflate)
  for i in range(300):  # several laps, so the data area is full of old records a bad word could point at
    pub.send(b"old%03d" % i)
    assert sub.receive() == b"old%03d" % i
  return pub, sub, pub._impl.seg.hdr


def _recovers(pub, sub) -> None:
  """After the damage: no old message comes back, and each next real one arrives."""
  assert [m for m in msgq.drain_sock_raw(sub) if m.startswith(b"old")] == []
  for i in range(3):
    pub.send(b"new%d" % i)
    assert sub.receive() == b"new%d" % i


def test_a_huge_write_position_neither_spins_past_the_timeout_nor_delivers_garbage():
  pub, sub, hdr = _ring()
  hdr[H_W] = 1 << 62
  start = time.monotonic()
  assert sub.receive() is None
  assert time.monotonic() - start < 2.0  # 100 ms asked; the old reader spun on through garbage for seconds
  assert sub.resyncs == 1
  _recovers(pub, sub)
  assert sub.dropped == 0  # the writer's next send made the header whole again: nothing was lost


@pytest.mark.parametrize("word, delta", [(H_W, SIZE), (H_W, 8), (H_W, -64), (H_W, -SIZE), (H_L, -SIZE),
                                         (H_L, 1 << 40), (H_E, 1 << 40), (H_COUNT, 1000)])
def test_a_bumped_header_word_never_replays_old_messages_or_wedges_the_reader(word, delta):
  pub, sub, hdr = _ring()
  hdr[word] = (hdr[word] + delta) % (1 << 64)
  _recovers(pub, sub)
  assert sub.dropped == 0
  if word == H_W:
    assert sub.resyncs == 1  # the reader noticed, and says so


def test_messages_queued_before_a_bumped_write_position_still_arrive_and_then_the_new_ones():
  pub, sub, hdr = _ring()
  for i in range(5):
    pub.send(b"queued%d" % i)
  hdr[H_W] += SIZE  # the old reader went on through a whole lap of stale records (268 of them in the report)
  assert msgq.drain_sock_raw(sub) == [b"queued%d" % i for i in range(5)]
  _recovers(pub, sub)
  assert (sub.dropped, sub.resyncs) == (0, 1)


def test_a_reader_that_cannot_tell_what_it_missed_resynchronises_to_the_newest_and_counts_the_skipped():
  pub, sub, hdr = _ring()
  hdr[H_W] += 8
  assert sub.receive(non_blocking=True) is None  # out of sync: waits for a header the writer made whole
  for i in range(4):
    pub.send(b"new%d" % i)
  assert msgq.drain_sock_raw(sub) == [b"new3"]  # the newest, with the three before it counted as dropped
  assert (sub.dropped, sub.resyncs) == (3, 1)


def test_a_corrupt_record_length_or_sequence_number_resynchronises_instead_of_raising():
  pub, sub, hdr = _ring()
  data = pub._impl.seg.data_words
  pub.send(b"victim")
  data[(sub._base._r % SIZE) >> 3] = 1 << 30  # a length far past the segment
  assert sub.receive(non_blocking=True) is None
  _recovers(pub, sub)
  assert sub.dropped == 1  # the victim, counted from the sequence numbers once the writer sent again
  pub.send(b"victim2")
  data[((sub._base._r % SIZE) >> 3) + 1] = 3  # a sequence number from long ago: a stale record
  assert sub.receive(non_blocking=True) is None
  _recovers(pub, sub)
  assert (sub.dropped, sub.resyncs) == (2, 2)


def test_a_conflating_reader_survives_a_corrupt_newest_position():
  pub, sub, hdr = _ring(conflate=True)
  pub.send(b"queued")
  hdr[H_L] = hdr[H_W] + 8
  assert sub.receive(non_blocking=True) is None
  _recovers(pub, sub)


_TRUNCATE = """
import os, sys, msgq
from msgq.segment import HEADER_SIZE
pub = msgq.pub_sock("trunc", segment_size=4096)
sub = msgq.sub_sock("trunc", segment_size=4096, timeout=200)
pub.send(b"before")
assert sub.receive() == b"before"
os.truncate(pub._impl.seg.path, int(sys.argv[1]))   # what a same-user process could do to the file
for what, op in (("send", lambda: pub.send(b"after")), ("receive", sub.receive),
                 ("non-blocking receive", lambda: sub.receive(non_blocking=True))):
  try:
    op()
    print(what, "NO ERROR")
  except msgq.SegmentTruncatedError as e:
    print(what, "TYPED", "truncated" in str(e))
poller = msgq.Poller()
poller.registerSocket(sub)
try:
  poller.poll(100)
except msgq.SegmentTruncatedError:
  print("poll TYPED True")
pub.close(); sub.close()   # tidying up touches nothing that is gone
del pub, sub
print("EXIT OK")
"""


@pytest.mark.parametrize("length", [0, HEADER_SIZE, HEADER_SIZE + 100])
def test_a_truncated_segment_file_is_a_typed_error_for_publisher_and_reader_never_sigbus(spawn_python, length):
  child = spawn_python(_TRUNCATE, length)
  out, err = child.communicate(timeout=60)
  assert child.returncode >= 0, f"killed by {signal.Signals(-child.returncode).name}: {err}"
  assert child.returncode == 0, err
  assert out.split("\n")[:5] == ["send TYPED True", "receive TYPED True", "non-blocking receive TYPED True",
                                 "poll TYPED True", "EXIT OK"], out + err


def test_a_blocked_reader_whose_file_is_truncated_gets_a_typed_error_at_its_timeout_not_sigbus(spawn_python):
  child = spawn_python("""
    import msgq
    sub = msgq.sub_sock("trunc", segment_size=4096, timeout=1000)
    print("waiting", flush=True)
    try:
      sub.receive()
      print("NO ERROR")
    except msgq.SegmentTruncatedError:
      print("TYPED")
  """)
  assert child.stdout.readline().strip() == "waiting"
  time.sleep(0.3)  # asleep in the futex by now
  os.truncate(os.path.join(msgq.namespace.shm_dir(), "trunc"), 0)
  out, err = child.communicate(timeout=60)
  assert child.returncode == 0, err
  assert out.strip() == "TYPED", out + err
