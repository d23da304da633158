"""Opt-in measured search (env PYMODELD_SEARCH=1), like tinygrad's BEAM: instead of trusting the heuristics,
compile a few alternatives, time them on real-sized buffers and keep the fastest.

Two choices are searched:
- each convolution's strategy (direct loops, im2col + sgemm, pointwise sgemm), timed as a one-conv program;
- each loop nest's schedule (scalar, or vector tiles of 1, 2 or 4 vectors with an upcast of 1-8).
Results are cached on disk by a key of what was searched (the conv's shapes and attributes, or the kernel's
rendered source) and the device target, in <cache dir>/search-v1.json: a JSON file of plain choices, each
validated against the allowed values before use (a bad file is ignored and searched again). Timing uses the
real constants (index tables must stay in bounds) and deterministic pseudo-random data for everything else.
"""
from __future__ import annotations

import ctypes
import json
import os
import time

import numpy as np

from . import compiler, config
from .cache import DEFAULT_KERNELS, safe_dir
from .codegen import render
from .codegen.ir import LoopKernel
from .codegen.optimise import MAX_ACCUMULATORS, Schedule
from .digest import digest

DB_NAME = "search-v1.json"
RUNS = 5


def _db_path() -> str:
  return os.path.join(safe_dir(config.cache_dir()), DB_NAME)


def _load_db() -> dict:
  try:
    fd = os.open(_db_path(), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
  except OSError:
    return {}
  try:
    with os.fdopen(fd, "rb") as f:
      data = json.loads(f.read(16 << 20))
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


def _key(*parts) -> str:
  return digest("search", *parts)


def _best(times: dict) -> str:
  return min(times, key=times.get)


# ------------------------------------------------------------------------------------------- conv strategy

def conv_strategy(signature: dict, default: str, candidates: list[str], measure) -> str:
  """The measured best of candidates for a conv with this signature; measure(strategy) -> seconds."""
  key = _key("conv", signature, compiler.cpu_target())
  got = _load_db().get(key)
  if isinstance(got, dict) and got.get("strategy") in candidates:
    return got["strategy"]
  times = {}
  for s in candidates:
    try:
      times[s] = measure(s)
    except Exception:  # noqa: BLE001  (a candidate that does not build is simply not chosen)
      continue
  choice = _best(times) if times else default
  _store(key, {"strategy": choice, "times": times})
  return choice


# -------------------------------------------------------------------------------------------- loop schedules

def schedule_candidates(k: LoopKernel, default: Schedule) -> list[Schedule]:
  out = [default, Schedule(default.order, vl=default.vl)]
  if default.mode == "scalar" or default.tile_var is None:
    return out
  t = default.tile_var
  vl = default.vl
  ext = t.arg[1]
  for chunks in (1, 2, 4):
    if chunks * vl > max(ext, vl):
      continue
    ups = [(None, 1)]
    for v in default.order:
      if v is t or v in k.dyn:
        continue
      ups += [(v, u) for u in (2, 4, 8) if v.arg[1] % u == 0 and u * chunks <= MAX_ACCUMULATORS]
    for var, u in ups:
      out.append(Schedule(default.order, default.mode, t, chunks * vl, var, u, vl))
  seen, unique = set(), []
  for s in out:
    d = s.describe()
    if d not in seen:
      seen.add(d)
      unique.append(s)
  return unique[:16]


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


def best_schedule(k: LoopKernel, default: Schedule, target_name: str, consts: dict) -> Schedule:
  base = render.render_loop(k, default, default.vl)
  key = _key("loop", base.source, target_name)
  cands = schedule_candidates(k, default)
  got = _load_db().get(key)
  if isinstance(got, dict) and isinstance(got.get("choice"), str):
    for s in cands:
      if s.describe() == got["choice"]:
        return s
  arrays = _buffers(k, consts)
  times = {}
  for s in cands:
    r = render.render_loop(k, s, default.vl)
    (lk,), _ = DEFAULT_KERNELS.get_many([(r.source, r.name)], target_name)
    args = np.array([arrays[b].ctypes.data for b in render._collect([k] + list(k.after))[0]], np.uint64)
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lk.address)
    fn(args.ctypes.data)
    best = float("inf")
    for _ in range(RUNS):
      t0 = time.perf_counter()
      fn(args.ctypes.data)
      best = min(best, time.perf_counter() - t0)
    times[s.describe()] = best
  choice = _best(times)
  _store(key, {"choice": choice, "times": times})
  return next(s for s in cands if s.describe() == choice)
