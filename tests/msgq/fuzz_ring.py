"""Property: random interleavings of sends, slow readers and header corruption never crash, hang, replay or
corrupt what the ring hands out.

A hypothesis state machine drives one publisher and three readers on a small real segment: sends of random
sizes, non-blocking and blocking receives (each reader at its own pace, so some are lapped), and writes of
random values into the header words a writer owns or into a record's length and seq words. Each payload
carries its send index and a CRC of itself. Invariants, per reader:
- a message is intact unless record bytes were corrupted; its index only grows (no replay, no duplicate);
- with no corruption since it joined, received + dropped == sent since it joined (exact accounting);
- a blocking receive returns within its timeout plus scheduling slack; nothing raises.
`run(examples)` runs it (tests/msgq/test_ring_fuzz.py in a child process, bench/fuzz_bus.py for longer)."""
import os
import struct
import sys
import tempfile
import time
import zlib

from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test
from hypothesis.configuration import set_hypothesis_home_dir

import msgq
from msgq.namespace import Namespace
from msgq.segment import H_COUNT, H_E, H_L, H_W


def peak_rss_kb() -> int:
  """This process's own peak RSS (VmHWM): ru_maxrss carries across exec the peak of the process that started it,
  so a child of a large test run would see no growth below that."""
  with open("/proc/self/status") as f:
    return int(next(line.split()[1] for line in f if line.startswith("VmHWM:")))


SIZE = 4096
READERS = 3
SLACK_S = 2.0  # a loaded machine may not run us for a while; a hang is far longer


def payload(index: int, size: int) -> bytes:
  body = bytes([index % 251]) * size
  return struct.pack("<II", index, zlib.crc32(body)) + body


def parse(msg: bytes) -> tuple[int, bool]:
  """(index, intact) of a delivered message (index -1 when too short to carry one)."""
  if len(msg) < 8:
    return -1, False
  index, crc = struct.unpack_from("<II", msg)
  return index, zlib.crc32(msg[8:]) == crc


class RingMachine(RuleBasedStateMachine):
  @initialize()
  def open(self):
    self.ns = Namespace().__enter__()
    self.pub = msgq.pub_sock("fuzz", segment_size=SIZE)
    self.subs = [msgq.sub_sock("fuzz", segment_size=SIZE) for _ in range(READERS)]
    self.sent = 0
    self.last = [-1] * READERS        # newest index each reader got
    self.received = [0] * READERS
    self.joined_at = [0] * READERS    # sent count when the reader (re)joined
    self.clean = [True] * READERS     # no corruption since it joined
    self.bytes_corrupted = False
    self.header_dirty = False         # a header word was written since the last send (which rewrites them)

  def teardown(self):
    if hasattr(self, "ns"):
      for s in self.subs:
        s.close()
      self.pub.close()
      self.ns.__exit__(None, None, None)

  @rule(size=st.integers(0, SIZE // 3 - 32), count=st.integers(1, 40))
  def send(self, size, count):
    for _ in range(count):
      self.pub.send(payload(self.sent, size))
      self.sent += 1
    self.header_dirty = False

  def _take(self, i: int, msg) -> None:
    if msg is None:
      return
    index, intact = parse(msg)
    if not self.bytes_corrupted:  # (a header forged to point at bytes never written can fool anyone)
      assert intact, f"reader {i} got a torn or corrupt message"
    if intact:
      assert index > self.last[i], f"reader {i} got index {index} after {self.last[i]}: a replay"
      assert index < self.sent
      self.last[i] = index
    self.received[i] += 1

  @rule(i=st.integers(0, READERS - 1), n=st.integers(1, 50))
  def drain(self, i, n):
    for _ in range(n):
      msg = self.subs[i].receive(non_blocking=True)
      self._take(i, msg)
      if msg is None:
        break

  @rule(i=st.integers(0, READERS - 1), timeout_ms=st.integers(0, 30))
  def receive_blocking(self, i, timeout_ms):
    self.subs[i].setTimeout(timeout_ms)
    start = time.monotonic()
    self._take(i, self.subs[i].receive())
    assert time.monotonic() - start <= timeout_ms / 1000 + SLACK_S, "a blocking receive outlived its timeout"

  @rule(i=st.integers(0, READERS - 1))
  def rejoin(self, i):
    self.subs[i].close()
    self.subs[i] = msgq.sub_sock("fuzz", segment_size=SIZE)
    # a reader that joins a corrupt header may take the newest message sent before it as its first
    self.last[i], self.received[i], self.joined_at[i], self.clean[i] = -1, 0, self.sent, not self.header_dirty

  @rule(word=st.sampled_from([H_W, H_E, H_L, H_COUNT]),
        value=st.one_of(st.integers(0, (1 << 64) - 1), st.integers(-2 * SIZE, 2 * SIZE)))
  def corrupt_header(self, word, value):
    hdr = self.pub._impl.seg.hdr
    hdr[word] = (hdr[word] + value) % (1 << 64) if abs(value) <= 2 * SIZE else value
    self.clean = [False] * READERS
    self.header_dirty = True
    self.bytes_corrupted = True  # a header forged by the same user can point at any bytes; replays stay caught

  @precondition(lambda self: self.sent > 0)
  @rule(which=st.sampled_from(["len", "seq"]), value=st.integers(0, (1 << 64) - 1), back=st.integers(0, 3))
  def corrupt_record(self, which, value, back):
    seg = self.pub._impl.seg
    at = seg.hdr[H_L] - back * 8 * 4
    words = seg.data_words
    words[(((at % SIZE) >> 3) + (which == "seq")) % (SIZE // 8)] = value
    self.clean = [False] * READERS
    self.bytes_corrupted = True

  @invariant()
  def counts_add_up_while_nothing_was_corrupted(self):
    if not hasattr(self, "subs"):
      return
    for i, sub in enumerate(self.subs):
      assert sub.dropped >= 0 and sub.resyncs >= 0
      if self.clean[i]:
        pending = self.sent - self.joined_at[i] - self.received[i] - sub.dropped
        assert pending >= 0, f"reader {i}: {self.received[i]} received + {sub.dropped} dropped > sent"
        msg = sub.receive(non_blocking=True)  # (a peek by receiving: then it is accounted for)
        if msg is not None:
          self._take(i, msg)
        elif pending:
          # nothing left to read, so everything sent was received or counted as dropped
          raise AssertionError(f"reader {i}: {pending} messages neither received nor counted as dropped")


_scratch = tempfile.TemporaryDirectory(prefix="pymodeld-hypothesis-")
set_hypothesis_home_dir(_scratch.name)  # its caches stay out of the checkout (no database is used)


def run(examples: int, randomize: bool = False) -> dict:
  """Search `examples` runs of the machine (derandomized, so the suite is repeatable, unless `randomize`)."""
  rss_before = peak_rss_kb()
  run_state_machine_as_test(RingMachine, settings=settings(
    max_examples=examples, stateful_step_count=40, database=None, deadline=None, derandomize=not randomize,
    suppress_health_check=list(HealthCheck)))
  return {"rss_growth_kb": peak_rss_kb() - rss_before,
          "leftover_shm": [d for d in os.listdir("/dev/shm") if d.startswith(f"msgq_ns{os.getpid()}_")]}


if __name__ == "__main__":
  out = run(int(sys.argv[1]) if len(sys.argv) > 1 else 30, randomize="--random" in sys.argv)
  print(out)
  sys.exit(1 if out["leftover_shm"] else 0)
