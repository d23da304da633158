"""Allocators: a range allocator that really frees, and an LRU caching layer with a byte cap.

Invariants:
- RangeAllocator hands out non-overlapping, `alignment`-aligned [offset, offset+size) ranges of a fixed
  space; `free` returns a range and coalesces it with its free neighbours, so alloc/free cycles never leak
  (unlike a bump pointer). used_bytes == 0 exactly when nothing is allocated.
- LRUAllocator sits on a backend (`_alloc(nbytes) -> handle`, `_free(handle)`): freed handles are parked by
  size class and reused by a later alloc of the same class. Parked bytes never exceed `cap_bytes` (the
  least recently parked are released first); `trim()` releases them all; a failing backend alloc trims
  and retries once before raising MemoryError with the usage figures.
- A free may name a fence (a device timeline value): the memory is reused only once `completed()` has
  reached it, so a queued command never sees its memory handed to someone else.
"""
from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable


class OutOfDeviceMemory(MemoryError):
  """The device (or simulated VRAM) has no free range large enough."""


def size_class(nbytes: int) -> int:
  """Round up to 256 bytes below 4 KiB, else to one of 8 steps per power of two (<= 12.5% waste)."""
  if nbytes <= 0:
    raise ValueError(f"allocation size must be positive, got {nbytes}")
  if nbytes <= 4096:
    return (nbytes + 255) & ~255
  step = 1 << (nbytes.bit_length() - 4)
  return (nbytes + step - 1) // step * step


class RangeAllocator:
  """First-fit allocator with coalescing over [0, size). Offsets are the handles."""

  def __init__(self, size: int, alignment: int = 256):
    if size <= 0 or alignment <= 0 or alignment & (alignment - 1):
      raise ValueError(f"bad range allocator geometry: size={size}, alignment={alignment}")
    self.size, self.alignment = size, alignment
    self._free_starts: list[int] = [0]        # sorted starts of free ranges
    self._free_len: dict[int, int] = {0: size}
    self._used: dict[int, int] = {}            # offset -> rounded length
    self.used_bytes = 0

  def alloc(self, nbytes: int) -> int:
    if nbytes <= 0:
      raise ValueError(f"allocation size must be positive, got {nbytes}")
    need = (nbytes + self.alignment - 1) // self.alignment * self.alignment
    for i, start in enumerate(self._free_starts):
      length = self._free_len[start]
      if length >= need:
        del self._free_starts[i], self._free_len[start]
        if length > need:
          bisect.insort(self._free_starts, start + need)
          self._free_len[start + need] = length - need
        self._used[start] = need
        self.used_bytes += need
        return start
    raise OutOfDeviceMemory(f"cannot allocate {nbytes} bytes: {self.used_bytes} of {self.size} used, "
                            f"largest free range {self.largest_free()} bytes")

  def free(self, offset: int) -> None:
    length = self._used.pop(offset, None)
    if length is None:
      raise ValueError(f"free of offset {offset}, which is not allocated (double free?)")
    self.used_bytes -= length
    start, end = offset, offset + length
    i = bisect.bisect_left(self._free_starts, start)
    if i < len(self._free_starts) and self._free_starts[i] == end:       # merge with the range after
      end += self._free_len.pop(end)
      del self._free_starts[i]
    if i > 0:                                                            # merge with the range before
      prev = self._free_starts[i - 1]
      if prev + self._free_len[prev] == start:
        start = prev
        del self._free_starts[i - 1]
        del self._free_len[prev]
    bisect.insort(self._free_starts, start)
    self._free_len[start] = end - start

  def largest_free(self) -> int:
    return max(self._free_len.values(), default=0)

  @property
  def free_ranges(self) -> int:
    return len(self._free_starts)


@dataclass
class AllocatorStats:
  live_bytes: int = 0       # handed out and not freed
  cached_bytes: int = 0     # parked in the LRU cache
  pending_bytes: int = 0    # freed, waiting for their fence
  hits: int = 0
  misses: int = 0
  allocs: int = 0
  frees: int = 0
  peak_live_bytes: int = 0


class LRUAllocator:
  """Caching allocator over a backend. Subclasses implement _alloc(nbytes) -> handle and _free(handle)."""

  def __init__(self, cap_bytes: int = 64 << 20, completed: Callable[[], int] = lambda: 1 << 62):
    self.cap_bytes = cap_bytes
    self._completed = completed
    self._cache: OrderedDict[tuple, list] = OrderedDict()   # (class, options) -> handles, LRU order
    self._pending: list[tuple[int, int, Any, Any]] = []      # (fence, class, options, handle)
    self._sizes: dict[int, int] = {}                         # id(handle) -> size class
    self.stats = AllocatorStats()
    self._lock = threading.RLock()     # a Buffer may be garbage-collected on any thread

  # backend hooks
  def _alloc(self, nbytes: int, options: Any) -> Any:
    raise NotImplementedError

  def _free(self, handle: Any) -> None:
    raise NotImplementedError

  def alloc(self, nbytes: int, options: Any = None) -> Any:
    with self._lock:
      return self._alloc_locked(size_class(nbytes), options)

  def _alloc_locked(self, cls: int, options: Any) -> Any:
    self._reclaim()
    bucket = self._cache.get((cls, options))
    if bucket:
      handle = bucket.pop()
      if not bucket:
        del self._cache[(cls, options)]
      self.stats.cached_bytes -= cls
      self.stats.hits += 1
    else:
      self.stats.misses += 1
      try:
        handle = self._alloc(cls, options)
      except MemoryError:
        self.trim()
        handle = self._alloc(cls, options)
    self._sizes[id(handle)] = cls
    self.stats.allocs += 1
    self.stats.live_bytes += cls
    self.stats.peak_live_bytes = max(self.stats.peak_live_bytes, self.stats.live_bytes)
    return handle

  def free(self, handle: Any, options: Any = None, fence: int = 0, recycle: bool = True) -> None:
    """Return a handle. recycle=False releases it to the backend at once instead of caching it (for
    memory another device may still read: the reader's own reference keeps it valid meanwhile)."""
    with self._lock:
      self._free_locked(handle, options, fence, recycle)

  def _free_locked(self, handle: Any, options: Any, fence: int, recycle: bool) -> None:
    cls = self._sizes.pop(id(handle), None)
    if cls is None:
      raise ValueError("free of a handle this allocator did not hand out (double free?)")
    self.stats.frees += 1
    self.stats.live_bytes -= cls
    if not recycle:
      self._free(handle)
      return
    self.stats.pending_bytes += cls
    self._pending.append((fence, cls, options, handle))
    self._reclaim()

  def _reclaim(self) -> None:
    """Move freed handles whose fence has passed into the cache, then enforce the cap."""
    if not self._pending:
      return
    done = self._completed()
    still = []
    for fence, cls, options, handle in self._pending:
      if fence > done:
        still.append((fence, cls, options, handle))
        continue
      self.stats.pending_bytes -= cls
      key = (cls, options)
      self._cache.setdefault(key, []).append(handle)
      self._cache.move_to_end(key)
      self.stats.cached_bytes += cls
    self._pending = still
    while self.stats.cached_bytes > self.cap_bytes:
      self._evict_oldest()

  def _evict_oldest(self) -> None:
    key, bucket = next(iter(self._cache.items()))
    self._free(bucket.pop(0))
    self.stats.cached_bytes -= key[0]
    if not bucket:
      del self._cache[key]

  def trim(self) -> int:
    """Release every cached (and fence-passed) handle to the backend; returns the bytes released."""
    with self._lock:
      self._reclaim()
      released = self.stats.cached_bytes
      while self._cache:
        self._evict_oldest()
      return released
