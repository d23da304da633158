"""Order steps by their buffer dependencies.

Each step lists the buffer *versions* it reads and the versions it writes (a write of buffer b creates
version v+1 from v). Edges:
- RAW: a reader of (b, v) runs after the writer that produced (b, v);
- WAR: the writer producing (b, v+1) runs after every reader of (b, v) (other than itself);
- WAW: the writer of (b, v+1) runs after the writer of (b, v).
Kahn's algorithm emits the order, preferring the lowest original index, so an already valid order is kept.
A cycle (no order satisfies the edges) raises ScheduleCycleError."""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from .errors import ScheduleCycleError


@dataclass
class StepDeps:
  reads: list[tuple[str, int]] = field(default_factory=list)
  writes: list[tuple[str, int]] = field(default_factory=list)  # (buffer, version produced)
  label: str = ""


def schedule(steps: list[StepDeps]) -> list[int]:
  writer: dict[tuple[str, int], int] = {}
  for i, s in enumerate(steps):
    for bv in s.writes:
      if bv in writer:
        raise ScheduleCycleError(f"buffer {bv[0]!r} version {bv[1]} written by steps "
                                 f"{steps[writer[bv]].label!r} and {s.label!r}")
      writer[bv] = i
  readers: dict[tuple[str, int], list[int]] = {}
  for i, s in enumerate(steps):
    for bv in s.reads:
      readers.setdefault(bv, []).append(i)
  succ: list[set[int]] = [set() for _ in steps]

  def edge(a: int, b: int):
    if a != b:
      succ[a].add(b)
  for i, s in enumerate(steps):
    for bv in s.reads:  # RAW
      if bv in writer:
        edge(writer[bv], i)
    for b, v in s.writes:
      for r in readers.get((b, v - 1), []):  # WAR
        edge(r, i)
      if (b, v - 1) in writer:  # WAW
        edge(writer[(b, v - 1)], i)
  indeg = [0] * len(steps)
  for a in range(len(steps)):
    for b in succ[a]:
      indeg[b] += 1
  ready = [i for i, d in enumerate(indeg) if d == 0]
  heapq.heapify(ready)
  order = []
  while ready:
    i = heapq.heappop(ready)
    order.append(i)
    for j in succ[i]:
      indeg[j] -= 1
      if indeg[j] == 0:
        heapq.heappush(ready, j)
  if len(order) != len(steps):
    stuck = [steps[i].label or str(i) for i, d in enumerate(indeg) if d > 0]
    raise ScheduleCycleError(f"cycle in step dependencies among: {stuck[:8]}")
  return order
