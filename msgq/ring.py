"""The per-message path of the shared-memory ring: one writer, many readers (protocol in msgq/README.md)."""
import gc
import os
import time
import weakref

from msgq import futex
from msgq.futex import full_fence
from msgq.errors import IpcError, MessageTooLargeError, MultiplePublishersError
from msgq.env import MSGQ_ENV
from msgq.segment import (H_COUNT, H_E, H_FUTEX, H_L, H_PUB_PID, H_PUB_UID, H_W, NUM_READERS, S_DROPPED, S_POS,
                          SLEEP_FLAGS, WRAP, Segment)

_U32 = 0xFFFFFFFF
# A blocking receive first spins this long on W (yielding the CPU each turn): a futex sleep/wake costs
# ~10 us of scheduler latency, more than a whole message exchange. 0 disables spinning (env MSGQ_SPIN_US).
# Without the yield, spinning on a loaded 2-core machine made latency 10x worse, not better.
SPIN_S = MSGQ_ENV.number("MSGQ_SPIN_US", 100) / 1e6
_NO_SLEEPERS = bytes(NUM_READERS)

# Bumped in every forked child: a publisher made before the fork must not become a second writer there.
# (Cheaper than os.getpid() per send, which is a syscall.)
_fork_generation = 0


def _after_fork_in_child() -> None:
  global _fork_generation
  _fork_generation += 1


os.register_at_fork(after_in_child=_after_fork_in_child)


def max_message_size(size: int) -> int:
  """Largest payload with 3 * align8(16 + n) <= size: the ring always holds at least three records."""
  return (size // 3) // 8 * 8 - 16


# This process's publishers by claim uid. An entry goes when its object does, so an endpoint whose publisher
# object was dropped without close() (the reference releases it then too) can be taken over by this process.
_own_publishers: "weakref.WeakValueDictionary[int, ShmPublisher]" = weakref.WeakValueDictionary()


def _claim(seg: Segment) -> int:
  try:
    return seg.claim_publisher(_own_publishers.__contains__)
  except MultiplePublishersError:
    if seg.hdr[H_PUB_PID] != os.getpid():
      raise
    gc.collect()  # a publisher that only a garbage cycle still holds is gone too
    return seg.claim_publisher(_own_publishers.__contains__)


class ShmPublisher:
  def __init__(self, endpoint, segment_size: int = 0):
    self.seg = Segment(endpoint, segment_size)
    self.endpoint = self.seg.endpoint
    try:
      self.uid = _claim(self.seg)
    except BaseException:
      self.seg.close()
      raise
    _own_publishers[self.uid] = self
    self.max_size = max_message_size(self.seg.size)
    hdr = self.seg.hdr
    self._w, self._count = hdr[H_W], hdr[H_COUNT]  # taking over continues where the last publisher stopped
    self._generation = _fork_generation

  def send(self, data) -> None:
    seg = self.seg
    hdr, words, size = seg.hdr, seg.data_words, seg.size
    n = len(data)
    if n > self.max_size:
      raise MessageTooLargeError(f"endpoint {self.endpoint!r}: message of {n} bytes exceeds the limit of "
                                 f"{self.max_size} bytes for a {size}-byte segment")
    if hdr[H_PUB_UID] != self.uid or _fork_generation != self._generation:
      raise MultiplePublishersError(f"endpoint {self.endpoint!r}: this publisher no longer owns the segment "
                                    f"(taken over, or used from a forked child)")
    total = (n + 23) & ~7
    w = self._w
    off = w % size
    if off + total > size:  # does not fit before the end: mark the wrap and start over at offset 0
      hdr[H_E] = w - off + size + total
      words[off >> 3] = WRAP
      w += size - off
      off = 0
    else:
      hdr[H_E] = w + total
    seq = self._count
    i = off >> 3
    words[i + 1] = seq
    words[i] = n
    if n:
      seg.data[off + 16:off + 16 + n] = data
    hdr[H_COUNT] = seq + 1
    hdr[H_W] = self._w = w + total
    hdr[H_L] = w  # after W: a reader that sees this L also sees a W past its record
    self._count = seq + 1
    hdr[H_FUTEX] = (seq + 1) & _U32
    full_fence()  # W and FUTEX visible before we look for sleepers (pairs with the reader's fence)
    if seg.mm[SLEEP_FLAGS:SLEEP_FLAGS + NUM_READERS] != _NO_SLEEPERS:
      futex.wake(seg.futex_addr)

  def all_readers_updated(self) -> bool:
    seg = self.seg
    slots = seg.live_readers()
    w = seg.hdr[H_W]
    return bool(slots) and all(seg.hdr[seg.slot_word(s, S_POS)] == w for s in slots)

  def close(self) -> None:
    if self.seg.fd >= 0:
      self.seg.release_publisher(self.uid)
      self.seg.close()

  def __del__(self):
    try:
      self.close()
    except Exception:
      pass


class ShmSubscriber:
  def __init__(self, endpoint, conflate: bool = False, segment_size: int = 0):
    self.seg = Segment(endpoint, segment_size)
    self.endpoint = self.seg.endpoint
    self.conflate = conflate
    self.timeout_s: float | None = None
    self.dropped = 0
    self._slot, self._uid = self.seg.join_reader()
    self._slot_pos = self.seg.slot_word(self._slot, S_POS)
    self._r = self.seg.hdr[self._slot_pos]
    self._expected = self.seg.hdr[H_COUNT]  # seq of the next message; may lag by racing sends, never leads
    self._max_len = max_message_size(self.seg.size)

  def ready(self) -> bool:
    return self.seg.hdr[H_W] > self._r

  def set_sleeping(self, sleeping: bool) -> None:
    """Ask the writer to wake us (the Poller sets this on every socket before it waits)."""
    self.seg.mm[SLEEP_FLAGS + self._slot] = 1 if sleeping else 0

  def receive(self, non_blocking: bool = False):
    msg = self._read()
    if msg is not None or non_blocking:
      return msg
    seg = self.seg
    hdr, mm, flag = seg.hdr, seg.mm, SLEEP_FLAGS + self._slot
    now = time.monotonic()
    deadline = None if self.timeout_s is None else now + self.timeout_s
    spin_until, r, clock, yield_cpu = now + SPIN_S, self._r, time.monotonic, os.sched_yield
    if deadline is not None and deadline < spin_until:
      spin_until = deadline
    while hdr[H_W] == r and clock() < spin_until:
      yield_cpu()  # on a busy machine the process we wait for may need this very core
    try:
      while True:
        mm[flag] = 1
        full_fence()  # our flag visible before we look at W (pairs with the writer's fence)
        seen = hdr[H_FUTEX]
        msg = self._read()
        if msg is not None:
          return msg
        remaining = None
        if deadline is not None:
          remaining = deadline - time.monotonic()
          if remaining <= 0:
            return None
        futex.wait(seg.futex_addr, seen, remaining)
    finally:
      mm[flag] = 0

  def _read(self):
    seg = self.seg
    hdr = seg.hdr
    r = self._r
    if hdr[H_W] <= r:
      return None
    if self.conflate:
      r = max(r, hdr[H_L])  # L may still name a record we already read
    words, size = seg.data_words, seg.size
    while True:
      off = r % size
      n = words[off >> 3]
      if n == WRAP:
        if hdr[H_E] - size > r:
          r = self._overrun()
          continue
        r += size - off
        continue
      if n > self._max_len or off + 16 + n > size:  # not a record the writer could have made
        if hdr[H_E] - size > r:
          r = self._overrun()
          continue
        raise IpcError(f"endpoint {self.endpoint!r}: corrupt record at position {r} (length {n})")
      seq = words[(off >> 3) + 1]
      msg = seg.data[off + 16:off + 16 + n].tobytes()
      if hdr[H_E] - size > r:  # the writer reached our bytes while we copied: the copy is garbage
        r = self._overrun()
        continue
      break
    if seq > self._expected and not self.conflate:
      self.dropped += seq - self._expected
      hdr[seg.slot_word(self._slot, S_DROPPED)] = self.dropped
    self._expected = seq + 1
    self._r = r = r + ((n + 23) & ~7)
    hdr[self._slot_pos] = r
    return msg

  def _overrun(self) -> int:
    """We were lapped: continue at the newest message; _read counts what was skipped from its seq."""
    return max(self._r, self.seg.hdr[H_L])

  def close(self) -> None:
    if self.seg.fd >= 0:
      self.seg.leave_reader(self._slot, self._uid)
      self.seg.close()

  def __del__(self):
    try:
      self.close()
    except Exception:
      pass
