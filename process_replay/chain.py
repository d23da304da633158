"""Chain replay: camerad's recorded frames through modeld and dmonitoringmodeld into dmonitoringd and
selfdrived, every daemon a real process on its own gated sockets, each consuming the others' *replayed*
outputs instead of the logged ones.

Invariants:
- Time is the log's: the route's inputs (car stub messages, camera states with their frames) and the outputs
  the daemons produce (stamped trigger + processing_time, as in a single-process replay) are delivered in
  logMonoTime order, ties broken by a sequence number that depends only on that order. Outputs the route
  logged for a chain daemon are dropped.
- A daemon's step runs while other daemons step (each lives in its own namespace), but nothing is ever
  published to a daemon that is stepping, and a step's outputs are delivered before any event at or after
  their stamp. So what every daemon sees before every step is a function of the route alone: the outputs are
  byte-identical run after run, and with -j 1 or -j N.
- A daemon that dies or stalls mid-chain is a ReplayError naming it (and the step); all daemons are stopped.
"""
from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass, field
from typing import Callable

from cereal.messaging import log_from_bytes
from cereal.route import Route
from process_replay.configs import CHAIN, get_config, owner_of
from process_replay.harness import LogMessage, ProcessRunner, count_services, load_messages


@dataclass
class ChainResult:
  outputs: list[bytes]                 # every daemon's outputs, in delivery (logMonoTime) order
  steps: dict = field(default_factory=dict)
  route_s: float = 0.0
  startup_s: float = 0.0
  step_s: float = 0.0
  counts: dict = field(default_factory=dict)


def chain_inputs(msgs: list[LogMessage]) -> list[LogMessage]:
  """The route's events that no chain daemon produces (the daemons' logged outputs are replaced)."""
  return [m for m in msgs if owner_of(m.which) is None]


def replay_chain(route: Route, seconds: float | None = None, messages: list[LogMessage] | None = None,
                 runners: dict[str, ProcessRunner] | None = None, env: dict | None = None,
                 on_event: Callable[[int, int], None] | None = None) -> ChainResult:
  """Replay the chain over `route`. `runners`: launched ProcessRunners by daemon name to use (residents stay
  up afterwards); missing ones are created and stopped after. on_event(done, total) reports progress."""
  msgs = load_messages(route, seconds) if messages is None else messages
  inputs = chain_inputs(msgs)
  route_s = (msgs[-1].log_mono_time - msgs[0].log_mono_time) / 1e9 if msgs else 0.0
  cfgs = {name: get_config(name) for name in CHAIN}
  given = dict(runners or {})
  own = {name: ProcessRunner(cfgs[name], env=env) for name in CHAIN if name not in given}
  active = {**given, **own}
  seq = itertools.count()
  heap = [(m.log_mono_time, next(seq), m) for m in inputs]
  heapq.heapify(heap)
  batches = {name: [] for name in CHAIN}
  pending = {name: set(cfgs[name].trigger) for name in CHAIN}
  busy: dict[str, int] = {}            # daemon -> stamp of the step it is running
  outputs: list[tuple[int, int, bytes]] = []
  subscribers = {}                     # service -> the daemons that read it
  for name in CHAIN:
    for s in cfgs[name].pubs:
      subscribers.setdefault(s, []).append(name)
  total, done = len(heap), 0

  def finish(name: str) -> None:
    busy.pop(name)
    for data in active[name].finish_step():
      evt = log_from_bytes(data)
      order = next(seq)
      outputs.append((evt.logMonoTime, order, data))
      heapq.heappush(heap, (evt.logMonoTime, order, LogMessage(evt.logMonoTime, evt.which(), data)))

  t0 = time.monotonic()
  try:
    for r in active.values():
      r.launch()   # every import at once, while the others start
    for name in CHAIN:
      active[name].start(route, [m for m in inputs if m.which in cfgs[name].pubs])
    t1 = time.monotonic()
    while heap or busy:
      t_next = heap[0][0] if heap else None
      due = sorted((stamp, name) for name, stamp in busy.items() if t_next is None or stamp <= t_next)
      if due:
        finish(due[0][1])   # its outputs may now be the next event
        continue
      t, _, msg = heapq.heappop(heap)
      done += 1
      for name in subscribers.get(msg.which, ()):
        if name in busy:   # never publish into a daemon while it steps
          finish(name)
        batches[name].append(msg)
        pending[name].discard(msg.which)
        if not pending[name]:
          active[name].begin_step(batches[name])
          busy[name] = t + int(cfgs[name].processing_time * 1e9)
          batches[name], pending[name] = [], set(cfgs[name].trigger)
      if on_event is not None and done % 50 == 0:
        on_event(done, total)
    t2 = time.monotonic()
    steps = {name: active[name].steps for name in CHAIN}
    for name in CHAIN:
      (active[name].stop if name in own else active[name].finish_route)()
  except BaseException:
    for r in active.values():
      r.stop()
    raise
  outputs.sort()
  data = [d for _, _, d in outputs]
  return ChainResult(data, steps, route_s, t1 - t0, t2 - t1, count_services(data))
