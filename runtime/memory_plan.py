"""Memory planner: place intermediate buffers at 256-byte aligned offsets of one arena per device.

Invariants (tested as properties):
- a buffer's lifetime is [first step that touches it, last step that touches it]; two buffers whose
  lifetimes intersect never overlap in the arena;
- every offset is a multiple of ALIGN and sizes round up to ALIGN;
- held buffers (graph inputs, weights, mutable state) are never planned;
- frees at step i happen before allocations at step i+1 (a buffer last used at step i-1 can give its
  memory to one first used at step i, never to one used at step i-1 itself).
Placement is first-fit over a sorted free list with coalescing."""
from __future__ import annotations

from dataclasses import dataclass

ALIGN = 256


def align(n: int) -> int:
  return (max(n, 1) + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class Plan:
  offsets: dict[str, tuple[str, int]]  # buffer -> (device, byte offset)
  arena_bytes: dict[str, int]           # device -> arena size
  naive_bytes: int                      # what one allocation per buffer would have cost


def lifetimes(step_buffers: list[list[str]], held: set[str], live_out: set[str]) -> dict[str, list[int]]:
  life: dict[str, list[int]] = {}
  for i, bufs in enumerate(step_buffers):
    for b in bufs:
      if b in held:
        continue
      if b not in life:
        life[b] = [i, i]
      else:
        life[b][1] = i
  end = len(step_buffers)
  for b in live_out:
    if b in life:
      life[b][1] = end
  return life


class FreeList:
  """First-fit allocator over [0, inf) with coalescing; tracks the high-water mark."""

  def __init__(self):
    self.free: list[tuple[int, int]] = []  # sorted (offset, size)
    self.top = 0

  def alloc(self, size: int) -> int:
    for i, (off, sz) in enumerate(self.free):
      if sz >= size:
        if sz == size:
          self.free.pop(i)
        else:
          self.free[i] = (off + size, sz - size)
        return off
    # grow: extend a trailing free block if it touches the top
    if self.free and self.free[-1][0] + self.free[-1][1] == self.top:
      off, sz = self.free.pop()
      self.top = off + size
      return off
    off = self.top
    self.top += size
    return off

  def release(self, off: int, size: int):
    self.free.append((off, size))
    self.free.sort()
    merged = []
    for o, s in self.free:
      if merged and merged[-1][0] + merged[-1][1] == o:
        merged[-1] = (merged[-1][0], merged[-1][1] + s)
      else:
        merged.append((o, s))
    self.free = merged


def plan_memory(step_buffers: list[list[str]], sizes: dict[str, int], devices: dict[str, str],
                held: set[str], live_out: set[str]) -> Plan:
  """step_buffers[i]: buffers step i touches; sizes: bytes; devices: buffer -> device name."""
  life = lifetimes(step_buffers, held, live_out)
  events = []  # (time, kind 0=free 1=alloc, buffer); a free at last+1 sorts before allocs at that time
  for b, (first, last) in life.items():
    events.append((first, 1, b))
    events.append((last + 1, 0, b))
  events.sort(key=lambda e: (e[0], e[1], e[2]))
  lanes: dict[str, FreeList] = {}
  offsets = {}
  for _, kind, b in events:
    dev = devices.get(b, "CPU")
    lane = lanes.setdefault(dev, FreeList())
    size = align(sizes[b])
    if kind == 1:
      offsets[b] = (dev, lane.alloc(size))
    else:
      lane.release(offsets[b][1], size)
  return Plan(offsets, {d: lane.top for d, lane in lanes.items()},
              sum(align(sizes[b]) for b in life))
