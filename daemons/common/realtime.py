"""Realtime scheduling for the camera pipeline, as openpilot's config_realtime_process does on its device:
the calling thread runs SCHED_FIFO at a fixed priority, optionally pinned to some cores.

Why: a normal (CFS) process woken while another runs can be queued on that busy CPU although the other CPU
is idle; on the 2-vCPU VM we measure on, a VisionIPC client woken during camerad's copy of a frame then waits
for the whole copy and takes the frame ~200 us late, in up to every frame of a run. SCHED_FIFO tasks are
placed by priority instead (the CPU running the lowest priority, an idle one first), so the client polls on
the other CPU and takes the frame at its doorbell (bench/vipc_latency.py measures both kinds of client).

Opt-in with PYMODELD_REALTIME=1: the reference applies it only on its device, and on a PC realtime Python
loops hold their CPU against everything at normal priority (the kernel keeps 5 % of each CPU for those by
default, sched_rt_runtime_us). Not permitted (no CAP_SYS_NICE and RLIMIT_RTPRIO below the priority) is
reported in the returned status and the process runs on at normal priority; a bad value is a ValueError.
Only the calling thread changes (Linux scheduling is per thread); threads it starts later inherit it, those
started before keep theirs, so a daemon calls this after starting background work (e.g. a model load).
"""
import os
from dataclasses import dataclass
from typing import Iterable

REALTIME_ENV = "PYMODELD_REALTIME"
# SCHED_FIFO priorities of the reference (commaai/openpilot: modeld and dmonitoringmodeld call sites,
# camerad from the priority comments of common/realtime.py)
PRIORITIES = {"camerad": 54, "modeld": 54, "dmonitoringmodeld": 5}


@dataclass(frozen=True)
class RealtimeStatus:
  priority: int | None            # SCHED_FIFO priority in force, None if the scheduler was left as it was
  cores: frozenset[int] | None    # the CPU affinity set, None if left as it was
  problem: str | None = None      # what was asked for and not applied, and why

  def describe(self) -> str:
    applied = [f"SCHED_FIFO priority {self.priority}"] if self.priority is not None else []
    applied += [f"cores {sorted(self.cores)}"] if self.cores is not None else []
    text = ", ".join(applied) if applied else "normal scheduling"
    return f"{text} ({self.problem})" if self.problem else text


def realtime_requested(environ=os.environ) -> bool:
  """PYMODELD_REALTIME: 1/true/yes on, 0/false/no or unset/empty off; anything else is a ValueError."""
  value = environ.get(REALTIME_ENV, "").strip().lower()
  if value in ("1", "true", "yes"):
    return True
  if value in ("", "0", "false", "no"):
    return False
  raise ValueError(f"{REALTIME_ENV} must be 1/true/yes or 0/false/no, got {environ[REALTIME_ENV]!r}")


def _check_cores(cores: int | Iterable[int]) -> frozenset[int]:
  wanted = frozenset([cores] if isinstance(cores, int) else cores)
  count = os.cpu_count() or 1
  bad = sorted((c for c in wanted if not isinstance(c, int) or isinstance(c, bool) or not 0 <= c < count), key=str)
  if not wanted or bad:
    raise ValueError(f"cores must be CPU numbers in 0..{count - 1}, got {sorted(wanted, key=str) if wanted else 'none'}"
                     + (f" (bad: {bad})" if bad else ""))
  return wanted


def config_realtime_process(cores: int | Iterable[int] | None, priority: int) -> RealtimeStatus:
  """Pin the calling thread to `cores` (None: keep its affinity) and run it SCHED_FIFO at `priority`."""
  low, high = os.sched_get_priority_min(os.SCHED_FIFO), os.sched_get_priority_max(os.SCHED_FIFO)
  if not isinstance(priority, int) or isinstance(priority, bool) or not low <= priority <= high:
    raise ValueError(f"SCHED_FIFO priority must be an integer in {low}..{high}, got {priority!r}")
  wanted = None if cores is None else _check_cores(cores)
  problems = []
  pinned = None
  if wanted is not None:
    try:
      os.sched_setaffinity(0, wanted)
      pinned = frozenset(os.sched_getaffinity(0))
    except OSError as e:  # e.g. a cpuset that excludes them
      problems.append(f"cores {sorted(wanted)} not applied: {e.strerror}")
  applied = None
  try:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    applied = priority
  except PermissionError:
    problems.append(f"SCHED_FIFO priority {priority} not permitted (needs CAP_SYS_NICE or RLIMIT_RTPRIO >= "
                    f"{priority}); running at normal priority")
  return RealtimeStatus(applied, pinned, "; ".join(problems) or None)


def apply_if_requested(process: str, log, environ=os.environ) -> RealtimeStatus | None:
  """What a daemon calls before its frame loop: realtime at the reference priority of `process` if
  PYMODELD_REALTIME asks for it (no pinning: the reference's core 7 is a device fact), logging the outcome."""
  if not realtime_requested(environ):
    return None
  status = config_realtime_process(None, PRIORITIES[process])
  log(f"realtime: {status.describe()}")
  return status
