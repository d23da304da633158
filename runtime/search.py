"""Measured search, on by default within a time budget per program build (like tinygrad's BEAM): instead of
trusting the heuristics, compile a few alternatives, time them on real-sized buffers and keep the fastest.

Two choices are searched, every candidate of which computes the same values (up to float reassociation):
- each convolution's strategy (direct loops, im2col or pointwise through sgemm or the GEMM micro-kernel), timed
  as a one-conv program;
- each loop nest's schedule (scalar, or vector tiles of 1, 2 or 4 vectors with an upcast of 1-8).

Budget (config.search_budget_s, env PYMODELD_SEARCH_BUDGET_S): a build searches its items largest first by
estimated work (a conv's multiply-adds, a loop nest's iterations), conv strategies within CONV_SHARE of the budget
and loop schedules within the rest. An item started is finished; none starts after its deadline; a candidate's
timing is bounded by time_runs. An item left so keeps the heuristic's choice, is not stored, and is recorded in the
program as left. A cached program is final by default, so a model's second start searches nothing; with
PYMODELD_SEARCH=1 set, the program cache builds a program with items left again, and results accumulate across
starts. Unless PYMODELD_SEARCH=1 asks for every item, items under MIN_WORK are not
searched (what they could save per run does not pay for their compiles); nor is an item with one candidate.

Cache: results are stored in <cache dir>/search-v7.json by a key of what was searched (the conv's shapes and
attributes, or the kernel's rendered source with its variables renamed in order) and the machine it was measured
on (the program target, whose name holds this CPU's model and feature flags, a forced ISA level and the C
compiler): a result measured on one CPU is never used on another. The file is a JSON object of plain choices,
opened without following links and read up to MAX_DB_BYTES; each choice is validated against the candidates
before use, and a damaged or oversized file is read as empty (searched again, then rewritten). Timing uses the
real constants (index tables must stay in bounds) and deterministic pseudo-random data elsewhere. (v4: results
timed before every constant was copied to aligned memory measured whatever alignment numpy gave; v5: conv strategies
timed before the channel-lane convs kept enough accumulators for the FMA latency and read their weights block by
block: neither is reused; v6: depthwise convs gained the channel-lane strategy, which v5 never timed; v7: 3x3 convs gained winograd.)

Outcomes: every item decided by a result, or left by the budget, is recorded in the program
(Program.search_records, part of its key) and in its kernels' tags ("search": {"strategy": ..., "schedule": ...})
for runtime.inspect. A program rendered again from an artifact replays its own records (Session(replay=...)): it
measures nothing and reads no file, so it comes out exactly as it was stored.
"""
from __future__ import annotations

import ctypes
import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import compiler, config
from .cache import DEFAULT_KERNELS, safe_dir
from .codegen import ir, render
from .codegen.ir import LoopKernel
from .codegen.optimise import Schedule
from .digest import digest

DB_NAME = "search-v7.json"
MAX_DB_BYTES = 16 << 20
RUNS = 5                # timed runs of a candidate, at most
MEASURE_S = 0.05        # a candidate's timed runs stop once they add up to this...
LOSING = 2.0            # ...or once its best is this many times the best of the item's candidates timed before it
MIN_WORK = 1 << 22      # multiply-adds (or loop iterations) of the smallest item searched by default
CONV_SHARE = 0.75       # the part of the budget conv strategies may take; loop schedules have the rest
LEFT = {"left": "budget"}   # the record of an item the budget did not reach


def _db_path() -> str:
  return os.path.join(safe_dir(config.cache_dir()), DB_NAME)


def _load_db() -> dict:
  try:
    fd = os.open(_db_path(), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
  except OSError:
    return {}
  try:
    with os.fdopen(fd, "rb") as f:
      data = json.loads(f.read(MAX_DB_BYTES))   # a larger file is cut, so not JSON: it is treated as empty
    return data if isinstance(data, dict) else {}
  except (OSError, ValueError, UnicodeDecodeError):
    return {}


def _store(key: str, value: dict) -> None:
  db = _load_db()
  db[key] = value
  path = _db_path()
  tmp = f"{path}.{os.getpid()}.tmp"
  try:
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
      json.dump(db, f)
    os.replace(tmp, path)
  except OSError:
    try:
      os.unlink(tmp)
    except OSError:
      pass


def _machine(target_name: str) -> list:
  """What a measurement depends on besides the kernel: the program target (its name holds this CPU's model and
  feature flags), a forced ISA level and the C compiler."""
  return [target_name, config.cpu_target(), compiler.compiler()[1]]


def _now() -> float:
  """The clock budgets are kept by."""
  return time.monotonic()


def _key(*parts) -> str:
  return digest("search", *parts)


def _best(times: dict) -> str:
  return min(times, key=times.get)


def _seconds(t: float) -> float:
  """Times are kept to 4 significant digits: what ranks candidates, and short in a program's tags."""
  return float(f"{t:.4g}")


def time_runs(run: Callable[[], None], rival: float = math.inf) -> float:
  """The best of a few timed runs of `run` after one untimed one (first-touch faults and cold caches are not the
  kernel's). Bounded: at most RUNS, fewer once they add up to MEASURE_S or once it is LOSING times `rival`."""
  run()
  best, spent = math.inf, 0.0
  for _ in range(RUNS):
    t0 = time.perf_counter()
    run()
    t = time.perf_counter() - t0
    best, spent = min(best, t), spent + t
    if spent >= MEASURE_S or best > LOSING * rival:
      break
  return best


def _valid_times(times, candidates: list[str]) -> dict | None:
  if not isinstance(times, dict):
    return None
  out = {c: times[c] for c in candidates if c in times}
  if not all(isinstance(t, float) and math.isfinite(t) and t >= 0 for t in out.values()):
    return None
  return out


# ------------------------------------------------------------------------------------------- one build's search

@dataclass
class Measure:
  """How to measure one conv's candidates (measure(strategy) -> seconds) in a build's search, and after
  conv_strategy the record it decided (None: the heuristic's choice, unrecorded)."""
  session: "Session"
  work: int
  fn: Callable[[str], float]
  record: dict | None = None

  def __call__(self, strategy: str) -> float:
    return self.fn(strategy)


@dataclass
class Session:
  """One program build's search: what it may search (measure) and how much (its budget from `start`), the
  results it may use (the on-disk cache, or with `replay` a program's own records and nothing else), its
  progress lines, and `records`: every item it decided by a result or left, by key (Program.search_records)."""
  target_name: str
  replay: dict | None = None
  measure: bool = True
  budget_s: float = field(default_factory=config.search_budget_s)
  everything: bool = field(default_factory=config.search_everything)
  start: float = field(default_factory=lambda: _now())
  records: dict = field(default_factory=dict)
  measured: int = 0       # items measured so far
  _known: dict | None = None
  _shown: float = 0.0

  def __post_init__(self):
    if self.replay is not None:
      self.measure = False
      self._known = dict(self.replay) if isinstance(self.replay, dict) else {}

  @property
  def machine(self) -> list:
    return _machine(self.target_name)

  def known(self) -> dict:
    if self._known is None:
      self._known = _load_db()   # read once per build, when the first item is looked up
    return self._known

  def worth(self, work: int, candidates: list) -> bool:
    """Whether an item is looked up at all: one with a choice to make, and unless every item is asked for (or a
    program's records are replayed, whatever asked for them) work enough to pay for its measurement."""
    return len(candidates) > 1 and (self.everything or self.replay is not None or work >= MIN_WORK)

  def lookup(self, key: str, candidates: list[str], what: str) -> dict | None:
    """A valid result for this item (what: "strategy" or "choice"), the record LEFT when a replayed program left
    it, else None. A result is cleaned to the candidates it names (a stale or damaged one is None)."""
    got = self.known().get(key)
    if self.replay is not None and got == LEFT:
      return dict(LEFT)
    if not isinstance(got, dict) or got.get(what) not in candidates:
      return None
    times = _valid_times(got.get("times"), candidates)
    if times is None:
      return None
    out = {what: got[what], "times": times}
    if what == "choice" and isinstance(got.get("heuristic"), str):
      out["heuristic"] = got["heuristic"]
    return out if (self.replay is None or out == got) else None

  def may_start(self, share: float) -> bool:
    return self.measure and _now() < self.start + share * self.budget_s

  def decided(self, key: str, record: dict | None) -> dict | None:
    if record is not None:
      self.records[key] = record
    return record

  def found(self, key: str, record: dict) -> dict:
    """A result just measured: stored on disk and known to the rest of this build."""
    self.known()[key] = record
    _store(key, record)
    return self.decided(key, record)

  def progress(self, done: int, total: int, label: str, last: bool = False) -> None:
    """A line on stderr once the search passes compiler.PROGRESS_AFTER_S, then at most every PROGRESS_EVERY_S, and
    one at the end, in the compile progress's words."""
    elapsed = _now() - self.start
    if self.measure and elapsed > compiler.PROGRESS_AFTER_S and (elapsed - self._shown >= compiler.PROGRESS_EVERY_S or last):
      self._shown = elapsed
      print(f"runtime: searched {done}/{total} {label} ({elapsed:.1f} s of a {self.budget_s:g} s budget)",
            file=sys.stderr, flush=True)

  def spent(self, left: int, total: int, label: str) -> None:
    if left and self.measure:
      print(f"runtime: search budget spent: {left} of {total} {label} left to the heuristics (a larger "
            f"PYMODELD_SEARCH_BUDGET_S, or PYMODELD_SEARCH=1 on a later start, searches them)", file=sys.stderr, flush=True)


def pending(records: dict) -> bool:
  """Whether a program's search records hold an item its budget did not reach."""
  return any(r == LEFT for r in records.values())


# ------------------------------------------------------------------------------------------- conv strategy

def conv_key(signature: dict, target_name: str) -> str:
  return _key("conv", signature, _machine(target_name))


def conv_strategy(signature: dict, default: str, candidates: list[str], measure: Measure) -> str:
  """The strategy for a conv with this signature: a known result, else the measured best of candidates when the
  build's search may still start one (measure.session), else `default` (the heuristic's). measure.record is set to
  what was decided (None when nothing was)."""
  s = measure.session
  if not s.worth(measure.work, candidates):
    return default
  key = conv_key(signature, s.target_name)
  got = s.lookup(key, candidates, "strategy")
  if got is not None:
    measure.record = s.decided(key, got)
    return got.get("strategy", default)
  if not s.measure:
    return default
  if not s.may_start(CONV_SHARE):
    measure.record = s.decided(key, dict(LEFT))
    return default
  s.measured += 1
  times: dict = {}
  for c in candidates:
    try:
      times[c] = _seconds(measure(c))
    except Exception:  # noqa: BLE001  (a candidate that does not build is simply not chosen)
      continue
  if not times:
    return default
  measure.record = s.found(key, {"strategy": _best(times), "times": times})
  return measure.record["strategy"]


# -------------------------------------------------------------------------------------------- loop schedules

def schedule_candidates(k: LoopKernel, default: Schedule) -> list[Schedule]:
  """The heuristic's schedule first, then scalar loops and the vector tilings of its tile variable (at most 16)."""
  keep = default.overlap_ok   # a property of the kernel, not of the schedule: every candidate splits and overlaps alike
  out = [default, Schedule(default.order, vl=default.vl, overlap_ok=keep, most=default.most)]
  t = default.tile_var
  if default.mode != "scalar" and t is not None:
    vl = default.vl
    for chunks in (1, 2, 4):
      if chunks * vl > max(t.arg[1], vl):
        continue
      ups = [(None, 1)]
      for v in default.order:
        if v is t or v in k.dyn:
          continue
        ups += [(v, u) for u in (2, 4, 8) if v.arg[1] % u == 0 and u * chunks <= default.most]
      for var, u in ups:
        out.append(Schedule(default.order, default.mode, t, chunks * vl, var, u, vl, keep, default.most))
  seen, unique = set(), []
  for s in out:
    d = s.describe()
    if d not in seen:
      seen.add(d)
      unique.append(s)
  return unique[:16]


def loop_work(k: LoopKernel) -> int:
  """Iterations of a loop kernel and its `after` nests, each output point counted once per term it reduces."""
  total = 0
  for n in [k] + list(k.after):
    terms = 1
    for st in n.stores:
      for e in ir.walk(st.value):
        if e.op == "REDUCE":
          terms = max(terms, math.prod(v.arg[1] for v in e.arg[1]))
    total += math.prod(n.shape) * terms
  return total


def _buffers(k: LoopKernel, consts: dict) -> dict:
  rng = np.random.default_rng(0)
  arrays = {}
  for b in render._collect([k] + list(k.after))[0]:
    if b.name in consts:
      a = np.ascontiguousarray(consts[b.name]).reshape(-1)
      arrays[b] = a if a.size else np.zeros(1, b.dtype)
    elif b.dtype.kind == "f":
      arrays[b] = rng.standard_normal(b.size).astype(b.dtype)
    else:
      arrays[b] = np.zeros(b.size, b.dtype)  # run-time indices are clamped: zeros are in range
  return arrays


def _time_schedules(k: LoopKernel, cands: list[Schedule], vl: int, target_name: str, consts: dict) -> dict:
  """Seconds per schedule description; the candidates are compiled in one batch (one at a time if the batch
  fails, skipping those that do not compile)."""
  rendered = [render.render_loop(k, s, vl) for s in cands]
  try:
    loaded = DEFAULT_KERNELS.get_many([(r.source, r.name) for r in rendered], target_name)[0]
  except Exception:  # noqa: BLE001
    loaded = []
    for r in rendered:
      try:
        loaded.append(DEFAULT_KERNELS.get_many([(r.source, r.name)], target_name)[0][0])
      except Exception:  # noqa: BLE001  (a candidate that does not compile is simply not chosen)
        loaded.append(None)
  arrays = _buffers(k, consts)
  args = np.array([arrays[b].ctypes.data for b in render._collect([k] + list(k.after))[0]], np.uint64)
  times: dict = {}
  for s, r, lk in zip(cands, rendered, loaded):
    if lk is None:
      continue
    if r.par:   # a kernel whose rows the runner may split takes its row range: all of them
      fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)(lk.address)
      run = lambda fn=fn, rows=r.par: fn(args.ctypes.data, 0, rows)  # noqa: E731
    else:
      fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lk.address)
      run = lambda fn=fn: fn(args.ctypes.data)  # noqa: E731
    times[s.describe()] = _seconds(time_runs(run, min(times.values(), default=math.inf)))
  return times


def _loop_names(k: LoopKernel, source: str) -> dict:
  """The kernel's loop and reduction variables -> canonical names, in the order the source first names them: two
  kernels that differ only in their variables' names (the same conv in two towers) share a key and a result."""
  names = set()
  for n in [k] + list(k.after):
    for st in n.stores:
      names.update(e.arg[0] for part in (st.index, st.value) for e in ir.walk(part) if e.op == "VAR")
    names.update(v.arg[0] for v in n.vars if v.op == "VAR")
  found = {}
  for name in names:
    m = re.search(rf"\bv_{re.escape(name)}\b", source)
    if m:
      found[name] = m.start()
  return {name: f"x{i}" for i, name in enumerate(sorted(found, key=found.get))}


def _rename(description: str, names: dict) -> str:
  """A schedule's description with its variables renamed ("tile i46x32 up i45x8" -> "tile x3x32 up x2x8")."""
  out = []
  for word in description.split(" "):
    m = re.fullmatch(r"(.+)x(\d+)", word)
    out.append(f"{names.get(m[1], m[1])}x{m[2]}" if m else word)
  return " ".join(out)


def _loop_key(k: LoopKernel, sched: Schedule, session: Session) -> tuple[str, dict]:
  r = render.render_loop(k, sched, sched.vl)
  names = _loop_names(k, r.source)
  source = r.source.replace(r.name, "kernel")
  if names:
    source = re.sub(r"\bv_(" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)) + r")\b",
                    lambda m: "v_" + names[m[1]], source)
  return _key("loop", source, session.machine), names


def best_schedules(session: Session, kernels: list, target_name: str, consts: dict) -> list:
  """Per (LoopKernel, heuristic Schedule): (the schedule to use, its record in the kernel's own variable names, or
  None), searched largest first. Results are keyed and stored with canonical variable names."""
  out: list = [(sched, None) for _, sched in kernels]
  if session.replay is not None and not session.known():
    return out   # a program with no records: nothing to look up (keying renders every kernel once more)
  items = []
  for i, (k, sched) in enumerate(kernels):
    cands = schedule_candidates(k, sched)
    work = loop_work(k)
    if session.worth(work, cands):
      items.append((work, i, cands))
  items.sort(key=lambda it: -it[0])   # stable: equal work keeps program order
  keyed = []
  for work, i, cands in items:
    key, names = _loop_key(*kernels[i], session)
    keyed.append((i, cands, key, names, [_rename(s.describe(), names) for s in cands]))
  unknown = {key for i, cands, key, names, canon in keyed if session.lookup(key, canon, "choice") is None}
  total, left, start = len(unknown) if session.measure else 0, set(), session.measured
  for i, cands, key, names, canon in keyed:
    k, sched = kernels[i]
    got = session.lookup(key, canon, "choice")
    if got is None and session.measure:
      if not session.may_start(1.0):
        left.add(key)
        got = dict(LEFT)
      else:
        session.measured += 1
        times = {_rename(d, names): t for d, t in _time_schedules(k, cands, sched.vl, target_name, consts).items()}
        done = session.measured - start
        session.progress(done, total, "kernel schedules", last=done == total)
        if times:
          got = session.found(key, {"choice": _best(times), "heuristic": canon[0], "times": times})
    if got is not None:
      session.decided(key, got)
      chosen = next((s for s, c in zip(cands, canon) if c == got.get("choice")), sched)
      own = {c: s.describe() for s, c in zip(cands, canon)}   # the record as this kernel names its variables
      out[i] = (chosen, got if got == LEFT else {"choice": own[got["choice"]], "heuristic": own.get(got.get("heuristic"), ""),
                                                  "times": {own[c]: t for c, t in got["times"].items()}})
  session.spent(len(left), total, "kernel schedules")
  return out
