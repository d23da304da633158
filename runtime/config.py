"""Everything the runtime reads from its environment, in one place (each variable is in README.md's table).

The measured search (search.py) is on by default within a time budget per program build: PYMODELD_SEARCH=0 turns
it off, PYMODELD_SEARCH_BUDGET_S sets the budget.

Values are read when asked for, not at import, so a process (or a test) that changes its environment is seen.
A malformed value is a ValueError naming the variable. The runtime dir (where the USB+AMD simulator's presence
and fault files live) is not derived from anything of ours: the caller names it with set_runtime_dir() (a path
or a zero-argument callable, e.g. msgq.namespace.runtime_dir) or env PYMODELD_RUNTIME_DIR.
"""
from __future__ import annotations

import os
from typing import Callable

CACHE_DIR_ENV = "PYMODELD_CACHE_DIR"
DISK_CACHE_ENV = "PYMODELD_DISK_CACHE"
THREADS_ENV = "PYMODELD_RUNTIME_THREADS"
SEARCH_ENV = "PYMODELD_SEARCH"
SEARCH_BUDGET_ENV = "PYMODELD_SEARCH_BUDGET_S"
# seconds one program build may spend searching (compiling and timing candidates): a resnet50-sized model's cold
# search stays within half a minute, and the choices it could not reach are searched by later builds
DEFAULT_SEARCH_BUDGET_S = 20.0
RUNTIME_DIR_ENV = "PYMODELD_RUNTIME_DIR"
CPU_LRU_ENV = "PYMODELD_CPU_LRU_BYTES"
USB_PRESENT_ENV = "PYMODELD_USB_AMD"
USB_FAULT_ENV = "PYMODELD_USB_FAULT"
USB_VRAM_ENV = "PYMODELD_USB_VRAM_MB"
USB_LRU_ENV = "PYMODELD_USB_LRU_BYTES"
USB_BANDWIDTH_ENV = "PYMODELD_USB_BANDWIDTH_MBPS"
USB_LATENCY_ENV = "PYMODELD_USB_LATENCY_US"
MEMORY_BUDGET_ENV = "PYMODELD_MEMORY_BUDGET_BYTES"
DEFAULT_MEMORY_BUDGET = 4 << 30
CPU_TARGET_ENV = "PYMODELD_CPU_TARGET"
CACHE_MAX_ENV = "PYMODELD_CACHE_MAX_MB"
ARENA_CHECK_ENV = "PYMODELD_ARENA_CHECK"
GEMM_ENV = "PYMODELD_GEMM"
GEMM_MODES = ("auto", "micro", "blas")
WINOGRAD_ENV = "PYMODELD_WINOGRAD"
# link-time arena layouts for finding reads of bytes a kernel never wrote and buffers that share bytes while both
# are live: the planned layout with every fresh byte 0x00, or each planned buffer in bytes of its own, all 0xFF
ARENA_CHECKS = ("zero", "spread")
DEFAULT_CACHE_MAX_MB = 512
# the x86-64 ISA levels a CPU target may name -> the width in bytes of their widest float vector register
CPU_TARGETS = {"x86-64": 16, "x86-64-v2": 16, "x86-64-v3": 32, "x86-64-v4": 64}

# every variable read below (tests/test_env.py checks README.md's table against this)
VARIABLES = ("DEV", "JIT", "CC", CACHE_DIR_ENV, DISK_CACHE_ENV, THREADS_ENV, SEARCH_ENV, SEARCH_BUDGET_ENV, RUNTIME_DIR_ENV,
             CPU_LRU_ENV, USB_PRESENT_ENV, USB_FAULT_ENV, USB_VRAM_ENV, USB_LRU_ENV, USB_BANDWIDTH_ENV, USB_LATENCY_ENV,
             MEMORY_BUDGET_ENV, CPU_TARGET_ENV, CACHE_MAX_ENV, ARENA_CHECK_ENV, GEMM_ENV, WINOGRAD_ENV)

_runtime_dir: str | Callable[[], str] | None = None


def _get(name: str) -> str | None:
  v = os.environ.get(name)
  return v if v is not None and v.strip() != "" else None


# the project's one boolean dialect (msgq.env's flags say the same; the runtime imports nothing of ours)
TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes"), ("0", "false", "no")


def _flag(name: str, default: bool) -> bool:
  """1/true/yes or 0/false/no (any case); unset or empty gives `default`; anything else is a ValueError naming it."""
  v = (_get(name) or "").strip().lower()
  if not v:
    return default
  if v not in TRUE_WORDS + FALSE_WORDS:
    raise ValueError(f"{name} must be 1/true/yes or 0/false/no, got {v!r}")
  return v in TRUE_WORDS


def _int(name: str, default: int, minimum: int = 0) -> int:
  v = _get(name)
  if v is None:
    return default
  try:
    n = int(v)
  except ValueError:
    raise ValueError(f"{name} must be an integer, got {v!r}") from None
  if n < minimum:
    raise ValueError(f"{name} must be >= {minimum}, got {v!r}")
  return n


def _float(name: str, default: float, minimum: float = 0.0) -> float:
  v = _get(name)
  if v is None:
    return default
  try:
    f = float(v)
  except ValueError:
    raise ValueError(f"{name} must be a number, got {v!r}") from None
  if not f >= minimum:
    raise ValueError(f"{name} must be >= {minimum}, got {v!r}")
  return f


def default_device() -> str:
  return _get("DEV") or "CPU"


def jit_enabled() -> bool:
  return _flag("JIT", True)


def cc() -> str | None:
  """The C compiler named by env CC (None: pick clang, gcc or cc from PATH)."""
  return _get("CC")


def cache_dir() -> str:
  return _get(CACHE_DIR_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "pymodeld")


def cache_max_bytes() -> int:
  """The bound on the disk caches' entries together (kernels and programs); the least recently used go first."""
  return _int(CACHE_MAX_ENV, DEFAULT_CACHE_MAX_MB, minimum=1) << 20


def disk_cache_enabled() -> bool:
  return _flag(DISK_CACHE_ENV, True)


def search_enabled() -> bool:
  """The measured search of conv strategies and loop schedules (search.py, like tinygrad's BEAM): on unless
  PYMODELD_SEARCH is 0/false/no. It runs when a program is built, within search_budget_s(), and its results are
  cached on disk per kernel and CPU, so a model's later starts measure nothing."""
  return _flag(SEARCH_ENV, True)


def search_everything() -> bool:
  """PYMODELD_SEARCH set to 1/true/yes, not left to its default: every choice is searched, however small its kernel
  (by default only kernels whose work can pay for their measurement are)."""
  return _get(SEARCH_ENV) is not None and _flag(SEARCH_ENV, True)


def search_budget_s() -> float:
  """Seconds of searching one program build may spend (PYMODELD_SEARCH_BUDGET_S; 0: only results already cached
  are used). An item being measured when it runs out is finished; no new one starts."""
  return _float(SEARCH_BUDGET_ENV, DEFAULT_SEARCH_BUDGET_S)


def gemm_mode() -> str:
  """Who computes the GEMMs of convolutions with constant weights: "auto" (the generated micro-kernel where
  codegen/conv.py's heuristic or the measured search picks it, else sgemm), "micro" (it wherever it applies)
  or "blas" (sgemm always)."""
  v = (_get(GEMM_ENV) or "auto").strip().lower()
  if v not in GEMM_MODES:
    raise ValueError(f"{GEMM_ENV} must be one of {', '.join(GEMM_MODES)}, got {v!r}")
  return v


def winograd_enabled() -> bool:
  """Whether 3x3 convs may run as Winograd's F(2x2, 3x3) (codegen/conv.py), by the heuristic or the search: on unless
  PYMODELD_WINOGRAD is 0/false/no (for bit-for-bit infinities: a transform can turn an infinite input into NaN)."""
  return _flag(WINOGRAD_ENV, True)


def runtime_threads() -> int:
  return _int(THREADS_ENV, 1, minimum=1)


def cpu_lru_bytes() -> int:
  return _int(CPU_LRU_ENV, 64 << 20)


def memory_budget_bytes() -> int:
  """The load-time memory budget (runtime/limits.py): no tensor and no planned arena may exceed it."""
  return _int(MEMORY_BUDGET_ENV, DEFAULT_MEMORY_BUDGET, minimum=1)


def cpu_target() -> str | None:
  """The x86-64 ISA level the generated kernels are compiled for (-march=LEVEL, and vectors of its width)
  instead of this CPU's own (-march=native); None: the host's. It stands in for another CPU of that level.
  The level must run here: forcing one above the host's ISA fails when a kernel runs (illegal instruction)."""
  v = _get(CPU_TARGET_ENV)
  if v is not None and v not in CPU_TARGETS:
    raise ValueError(f"{CPU_TARGET_ENV} must be one of {', '.join(CPU_TARGETS)}, got {v!r}")
  return v


def arena_check() -> str | None:
  """How link() lays out and fills a program's arena, for checking that outputs do not depend on it (None: the
  planned layout, its bytes as the allocator hands them over). "zero": the planned layout, every byte zeroed.
  "spread": no two planned buffers share a byte, whatever their lifetimes, and every byte is 0xFF (a NaN in
  every float type, -1 in every signed integer). A correct program gives bit-identical outputs under both."""
  v = _get(ARENA_CHECK_ENV)
  if v is not None and v not in ARENA_CHECKS:
    raise ValueError(f"{ARENA_CHECK_ENV} must be one of {', '.join(ARENA_CHECKS)}, got {v!r}")
  return v


def usb_presence_env() -> bool | None:
  """PYMODELD_USB_AMD as a flag (None when unset: the presence file decides)."""
  return _flag(USB_PRESENT_ENV, False) if _get(USB_PRESENT_ENV) is not None else None


def usb_fault_env() -> str | None:
  return _get(USB_FAULT_ENV)


def usb_vram_bytes() -> int:
  return _int(USB_VRAM_ENV, 256, minimum=1) << 20


def usb_lru_bytes() -> int:
  return _int(USB_LRU_ENV, 64 << 20)


def usb_bandwidth_bytes_s() -> float:
  return _float(USB_BANDWIDTH_ENV, 350.0, minimum=1e-6) * 1e6


def usb_latency_s() -> float:
  return _float(USB_LATENCY_ENV, 100.0) * 1e-6


def set_runtime_dir(where: str | Callable[[], str] | None) -> None:
  """Name the directory for the simulator's presence and fault files: a path, or a callable returning one
  (evaluated at each use, so it can follow a per-run namespace). None forgets it."""
  global _runtime_dir
  _runtime_dir = where


def runtime_dir() -> str:
  """The runtime dir set by set_runtime_dir(), else env PYMODELD_RUNTIME_DIR; an error when neither is set."""
  where = _runtime_dir
  if callable(where):
    where = where()
  where = where or _get(RUNTIME_DIR_ENV)
  if not where:
    raise FileNotFoundError(f"no runtime dir: the caller sets it with runtime.config.set_runtime_dir() or env "
                            f"{RUNTIME_DIR_ENV} (the manager and the daemons use their namespace's runtime dir)")
  return where
