"""The per-message path of the shared-memory ring: one writer, many readers (protocol in msgq/README.md)."""
import gc
import os
import time
import weakref

from msgq import futex
from msgq.futex import full_fence
from msgq.errors import MessageTooLargeError, MultiplePublishersError, SegmentTruncatedError
from msgq.env import MSGQ_ENV
from msgq.segment import (H_COUNT, H_E, H_FUTEX, H_L, H_PUB_PID, H_PUB_UID, H_W, NUM_READERS, S_DROPPED, S_POS,
                          SLEEP_FLAGS, WRAP, Segment)

_U32 = 0xFFFFFFFF
# A blocking receive first spins this long on W (yielding the CPU each turn): a futex sleep/wake costs
# ~10 us of scheduler latency, more than a whole message exchange. 0 disables spinning (env MSGQ_SPIN_US).
# Without the yield, spinning on a loaded 2-core machine made latency 10x worse, not better.
SPIN_S = MSGQ_ENV.number("MSGQ_SPIN_US", 100) / 1e6
_NO_SLEEPERS = bytes(NUM_READERS)
_lseek = os.lseek

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
    if _lseek(seg.fd, 0, 2) != seg.file_len:  # the file's length, before touching its memory (README: truncation)
      seg.check_intact()
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
    self.resyncs = 0  # times the header or a record was inconsistent and the reader started over at the newest
    self._slot, self._uid = self.seg.join_reader()
    self._slot_pos = self.seg.slot_word(self._slot, S_POS)
    self._max_len = max_message_size(self.seg.size)
    self._r, self._synced = 0, True
    self._expected: int | None = None  # seq of the next message; None: take the next record's as it comes
    self._joined_at: int | None = None
    self._joined_count = 0
    self._join()

  def ready(self) -> bool:
    self.seg.check_intact()
    return self.seg.hdr[H_W] != self._r  # a W behind us is a corrupt header: _read resynchronises

  def set_sleeping(self, sleeping: bool) -> None:
    """Ask the writer to wake us (the Poller sets this on every socket before it waits). Clearing the flag of
    a truncated segment does nothing (it runs on the way out of a wait), setting it raises."""
    if sleeping:
      self.seg.check_intact()
    elif not self.seg.intact():
      return
    self.seg.mm[SLEEP_FLAGS + self._slot] = 1 if sleeping else 0

  def receive(self, non_blocking: bool = False):
    msg = self._read()
    if msg is not None or non_blocking:
      return msg
    seg = self.seg
    hdr, mm, flag, fd, file_len = seg.hdr, seg.mm, SLEEP_FLAGS + self._slot, seg.fd, seg.file_len
    now = time.monotonic()
    deadline = None if self.timeout_s is None else now + self.timeout_s
    spin_until, r, clock, yield_cpu = now + SPIN_S, self._r, time.monotonic, os.sched_yield
    if deadline is not None and deadline < spin_until:
      spin_until = deadline
    while _lseek(fd, 0, 2) == file_len and hdr[H_W] == r and clock() < spin_until:
      yield_cpu()  # on a busy machine the process we wait for may need this very core
    truncated = False
    try:
      while True:
        if _lseek(fd, 0, 2) != file_len:
          truncated = True
          seg.check_intact()
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
    except SegmentTruncatedError:
      truncated = True
      raise
    finally:
      if not truncated:
        mm[flag] = 0

  def _read(self):
    """The next message, or None. Every position and record is checked against the ring's geometry and the
    message sequence; anything the writer could not have made drops the reader out of sync (_lose_sync), so a
    corrupt header word can neither replay old messages nor wedge the reader, and each call does bounded work."""
    seg = self.seg
    if _lseek(seg.fd, 0, 2) != seg.file_len:  # the file's length, before touching its memory (README: truncation)
      seg.check_intact()
    if not self._synced and not self._resync():
      return None
    hdr = seg.hdr
    r = self._r
    w = hdr[H_W]
    if w == r:
      return None
    words, size = seg.data_words, seg.size
    jumped = w < r or self.conflate  # a W behind us is corrupt; conflate always starts at the newest
    if jumped:
      r, w = self._newest(r, w)
    for _ in range(4):  # a wrap marker, a record, one overrun jump, a record: more means corruption
      if r is None:
        return self._lose_sync()
      off = r % size
      n = words[off >> 3]
      total = (n + 23) & ~7
      if n == WRAP or n > self._max_len or off + total > size or r + total > w:
        if hdr[H_E] - size > r:  # lapped: the writer reused our bytes; continue at the newest record
          (r, w), jumped = self._newest(r, hdr[H_W]), True
        elif n == WRAP and r - off + size < w:
          r += size - off
        else:  # not a record the writer could have made
          return self._lose_sync()
        continue
      seq = words[(off >> 3) + 1]
      msg = seg.data[off + 16:off + 16 + n].tobytes()
      if hdr[H_E] - size > r:  # the writer reached our bytes while we copied: the copy is garbage
        (r, w), jumped = self._newest(r, hdr[H_W]), True
        continue
      break
    else:
      return self._lose_sync()
    expected = self._expected
    if seq >= hdr[H_COUNT]:  # COUNT is stored before W: a record W covers has a smaller seq (zeros never do)
      return self._lose_sync()
    if expected is not None and seq != expected:
      if not jumped or seq < expected:  # out of sequence: stale bytes that a corrupt word pointed us at
        return self._lose_sync()
      if not self.conflate:
        self._count_dropped(seq - expected)
    self._expected = seq + 1
    self._r = r = r + total
    hdr[self._slot_pos] = r
    return msg

  def _newest(self, r: int, w: int) -> tuple[int | None, int]:
    """(where to read next, W) for a reader at r that was lapped or conflates: the newest record (L), or r if
    that is newer. None if L is not a position the writer could have stored with this W."""
    newest = self.seg.hdr[H_L]
    if newest >= w:  # L is stored after W: a send racing us may move L to or past the W we read: look again
      w = self.seg.hdr[H_W]
    if newest >= w or w - newest > self.seg.size:
      return None, w
    return (max(newest, r) if r <= w else newest), w

  def _lose_sync(self) -> None:
    """The ring holds something the writer cannot have made: stop trusting our position until _resync finds
    a consistent header. Waiting readers park on the current W, so they sleep until the next send."""
    self._synced = False
    self.resyncs += 1
    self._r = self.seg.hdr[H_W]
    return None

  def _consistent_header(self) -> tuple[int, int, int] | None:
    """(W, L, seq of the record at L) if the header is one the writer made whole (it rewrites W, L and COUNT
    on every send): the newest record starts at L, ends exactly at W and carries seq COUNT - 1. None while a
    send is half stored or a word is corrupt. An empty ring (W = 0) gives (0, 0, -1)."""
    seg, size = self.seg, self.seg.size
    hdr = seg.hdr
    w, newest, count = hdr[H_W], hdr[H_L], hdr[H_COUNT]
    if w == 0 and count == 0:
      return 0, 0, -1
    if newest >= w or w - newest > size:
      return None
    off = newest % size
    n = seg.data_words[off >> 3]
    total = (n + 23) & ~7
    if n > self._max_len or off + total > size or newest + total != w:
      return None
    seq = seg.data_words[(off >> 3) + 1]
    if seq + 1 != count or hdr[H_E] - size > newest or hdr[H_W] != w:
      return None
    return w, newest, seq

  def _join(self) -> None:
    """Start at W, knowing the seq of the next record there, so that drops count from the first message on.
    COUNT and W are stored apart, so they are read from a consistent header (a few tries while a writer
    races us); with a header that does not settle (a corrupt word, a writer that died mid-send) the reader
    starts out of sync and takes the newest record of the first consistent header as its first message."""
    for _ in range(100):
      header = self._consistent_header()
      if header is not None:
        self._r, self._expected = header[0], header[2] + 1
        self.seg.hdr[self._slot_pos] = self._r
        return
      os.sched_yield()
    self._r, self._expected, self._synced = self.seg.hdr[self._slot_pos], None, False
    self._joined_at, self._joined_count = self._r, self.seg.hdr[H_COUNT]

  def _resync(self) -> bool:
    """Find our place again once the writer has made the header whole: continue right after the newest
    record if we already have it (nothing lost), else read it next and count the messages skipped up to it.
    A reader that joined out of sync starts where it joined if that is still a record, else at the newest
    one, counting what it skipped from the COUNT it saw then."""
    header = self._consistent_header()
    if header is None:
      return False
    w, newest, seq = header
    if self._expected is None:
      joined, self._joined_at = self._joined_at, None  # (tried once: if it was garbage, the newest next time)
      if joined is not None and not joined & 7 and w - self.seg.size <= joined <= newest:
        self._r = joined
      else:
        self._r = newest
        if joined is not None and self._joined_count <= seq:
          self._count_dropped(seq - self._joined_count)
    elif seq < self._expected:  # had it already (or the writer restarted its count): go on from W
      self._r, self._expected = w, seq + 1
    else:
      self._r = newest
      self._count_dropped(seq - self._expected)
      self._expected = seq
    self._synced = True
    self.seg.hdr[self._slot_pos] = self._r
    return True

  def _count_dropped(self, n: int) -> None:
    self.dropped += n
    self.seg.hdr[self.seg.slot_word(self._slot, S_DROPPED)] = self.dropped

  def close(self) -> None:
    if self.seg.fd >= 0:
      self.seg.leave_reader(self._slot, self._uid)
      self.seg.close()

  def __del__(self):
    try:
      self.close()
    except Exception:
      pass
