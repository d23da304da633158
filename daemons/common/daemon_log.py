"""How the model daemons speak: one line per event, `<process>: <what>`, in words a user knows.

Invariants:
- Every line goes to stderr, flushed at once, from both daemons: stderr is where their one-line errors go,
  so a user who redirects stdout still sees why a daemon stopped and what it did before; the manager reads a
  child's stdout and stderr from one pipe, so its log keeps each child's lines in order either way.
- A line says what is happening when it happens, in order: "compiling ..." before a compile, "... ready in
  N s (...)" after it; no time is given for work not done yet.
- Camera geometry is said as `1928x1208 NV12, stride 2048` (modeld: one such phrase per camera, named),
  never as the tuple the frame programs are keyed by.
- The kernel count of a compile is the machine-code cache's compiles during it; when another thread may
  compile at the same time (modeld's big model loading beside the small one) the count is left out rather
  than be someone else's.
"""
from __future__ import annotations

import sys
import time
from typing import Callable

from runtime.program import DEFAULT_CACHE

Say = Callable[[str], None]


def make_log(process: str, stream=None) -> Say:
  """log(msg) prints `process: msg` on stderr (or `stream`), flushed."""
  def log(msg: str) -> None:
    print(f"{process}: {msg}", file=stream or sys.stderr, flush=True)
  return log


def frame_words(width: int, height: int, stride: int) -> str:
  """One camera stream's geometry as a user reads it."""
  return f"{width}x{height} NV12, stride {stride}"


def road_geometry_words(geometry, main: str = "narrow", extra: str = "wide") -> str:
  """modeld's program geometry ((main), (extra)), each (width, height, stride, uv_offset, frame length), in
  words, each camera named; one camera that feeds both model inputs is said once."""
  main_geometry, extra_geometry = geometry
  text = f"{main} {frame_words(*main_geometry[:3])}"
  if extra_geometry is None or extra_geometry is main_geometry:
    return f"{text} (both model inputs)"
  return f"{text}, {extra} {frame_words(*extra_geometry[:3])}"


def devices_words(table: dict[str, str]) -> str:
  """A frame program's device table ({'warp': 'CPU', 'model': 'CPU'}) as `warp on CPU, model on CPU`."""
  return ", ".join(f"{part} on {device}" for part, device in table.items())


def kernels_compiled() -> int:
  """Kernels this process has compiled to machine code so far (the runtime's cache, not its hits)."""
  return DEFAULT_CACHE.kernels.stats.compiles


def _parts(program) -> list:
  return [r for r in (*getattr(program, "runners", ()), getattr(program, "index", None)) if r is not None]


def compiled_words(program, compiled: int, exclusive: bool = True) -> str:
  """What a capture cost: `from cache` when no part of the frame program compiled anything, else the kernels
  it compiled (`compiled` is the cache's count over the capture, trusted only when `exclusive`)."""
  built = sum(getattr(r, "cache_source", "") == "compile" for r in _parts(program))
  if not built:
    return "from cache"
  if not exclusive:
    return "compiled"
  # the runtime's progress lines count one program's kernels; a frame program of several parts compiles more
  return f"compiled {compiled} kernel{'s' * (compiled != 1)}" + (f" in {built} programs" if built > 1 else "")


def timed_capture(log: Say, what: str, geometry_text: str, capture: Callable[[], object], exclusive: bool = True):
  """Say that `what` is being compiled for this geometry, run `capture()` (it returns the frame program), then
  say it is ready with its time and what it compiled. Returns what capture() returned."""
  log(f"compiling {what} for {geometry_text} ...")
  t0, before = time.monotonic(), kernels_compiled()
  program = capture()
  done = compiled_words(program, kernels_compiled() - before, exclusive)
  log(f"{what.removeprefix('the ')} ready in {time.monotonic() - t0:.1f} s ({done})")
  return program
