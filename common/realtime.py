"""Realtime scheduling and core pinning for the camera pipeline, as openpilot's config_realtime_process does on
its device: the calling thread runs SCHED_FIFO at a fixed priority and/or is pinned to some cores.

Why: a normal (CFS) process woken while another runs can be queued on that busy CPU although the other CPU
is idle; on the 2-vCPU VM we measure on, a VisionIPC client woken during camerad's copy of a frame then waits
for the whole copy and takes the frame ~200 us late, in up to every frame of a run. Two ways out, both from the
reference: SCHED_FIFO tasks are placed by priority (the CPU running the lowest priority, an idle one first),
and a client pinned off the producer's core cannot be queued there at all (the reference pins modeld and
dmonitoringmodeld to core 7, camerad elsewhere). bench/vipc_latency.py measures each kind of client.

Both are set per process from the environment (a daemon started alone gets neither; the manager, when
PYMODELD_CORES is unset, pins camerad and modeld: default_pins):
- PYMODELD_REALTIME=1: SCHED_FIFO at the reference priorities (PRIORITIES). The reference applies it only on its
  device; on a PC realtime Python loops hold their CPU against everything at normal priority (the kernel keeps
  5 % of each CPU for those by default, sched_rt_runtime_us).
- PYMODELD_CORES="camerad=0 modeld=1 dmonitoringmodeld=1": entries `process=cpu-list` (taskset -c syntax, e.g.
  `0-3,6`) separated by spaces; a process not named keeps its affinity.
A daemon reads both at start-up (scheduling_plan: a bad value is a ValueError naming it, before any model is
loaded) and applies them just before its frame loop (SchedulingPlan.apply). What is not permitted (no
CAP_SYS_NICE and RLIMIT_RTPRIO below the priority; a core outside the process's cpuset) is reported in the
returned status and the process runs on without it. Only the calling thread changes (Linux scheduling is per
thread); threads it starts later inherit it, those started before keep theirs, so a daemon applies the plan
after starting background work (e.g. a model load).
Unlike the reference's config_realtime_process this leaves the garbage collector on: timed with gc.callbacks
over a 90 s manager run, no process ran a single collection after its first 10 s (the frame loops do not
accumulate container objects), while the start-up collections did find cycles that a disabled GC would leak.
"""
import os
import re
from dataclasses import dataclass
from typing import Callable, Iterable

from common.env import COMMON_ENV

REALTIME_ENV = "PYMODELD_REALTIME"
CORES_ENV = "PYMODELD_CORES"
# SCHED_FIFO priorities of the reference (commaai/openpilot: modeld and dmonitoringmodeld call sites,
# camerad from the priority comments of common/realtime.py)
PRIORITIES = {"camerad": 54, "modeld": 54, "dmonitoringmodeld": 5}
SCHEDULING_HELP = (f"environment: {REALTIME_ENV}=1 runs the frame loop SCHED_FIFO at the reference priority "
                   f"(camerad 54, modeld 54, dmonitoringmodeld 5); {CORES_ENV}='camerad=0 modeld=1 "
                   "dmonitoringmodeld=1' pins each named process to its cores (taskset -c lists; the manager "
                   "pins camerad and modeld unless it is set). What is not permitted is logged and the process "
                   "runs on.")


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


def realtime_requested(environ=None) -> bool:
  """PYMODELD_REALTIME: 1/true/yes on, 0/false/no or unset/empty off; anything else is an EnvError (a
  ValueError)."""
  return COMMON_ENV.flag(REALTIME_ENV, False, environ)


def parse_cpu_list(text: str) -> frozenset[int]:
  """'0-3,6' -> {0, 1, 2, 3, 6} (the cpu-list syntax of taskset -c and /sys); ValueError naming a bad part."""
  cores = set()
  for part in text.split(","):
    match = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip(), re.ASCII)
    first, last = (int(match[1]), int(match[2] or match[1])) if match else (0, -1)
    if last < first:
      raise ValueError(f"bad CPU list {text!r}: {part.strip()!r} is not a core number or an ascending range a-b")
    _check_cores({first, last})  # before expanding, so that '0-999999999' is an error, not a huge set
    cores.update(range(first, last + 1))
  return _check_cores(cores)


def cores_requested(process: str, environ=None) -> frozenset[int] | None:
  """The cores PYMODELD_CORES names for `process`, or None if it names none. Every entry is checked, so a typo
  in another process's entry is reported by each daemon."""
  if process not in PRIORITIES:
    raise ValueError(f"unknown process {process!r}; known: {sorted(PRIORITIES)}")
  pins: dict[str, frozenset[int]] = {}
  for entry in COMMON_ENV.get(CORES_ENV, "", environ).split():
    name, eq, cpu_list = entry.partition("=")
    if not eq or name not in PRIORITIES or name in pins:
      why = "repeated" if name in pins else f"not process=cpu-list with a process of {sorted(PRIORITIES)}"
      raise ValueError(f"{CORES_ENV}: entry {entry!r} is {why}")
    try:
      pins[name] = parse_cpu_list(cpu_list)
    except ValueError as e:
      raise ValueError(f"{CORES_ENV}: entry {entry!r}: {e}") from None
  return pins.get(process)


def default_pins(allowed: Iterable[int] | None = None) -> str:
  """The manager's PYMODELD_CORES when none is set: camerad on the first CPU it may use, modeld on the last, so
  modeld's camera client is never queued behind camerad's copy of a frame (bench/vipc_latency.py, "pinned"
  rows). dmonitoringmodeld is left free: on 2 CPUs it would share modeld's core and the two models, whose
  frames come at the same time, each ran ~2x as long (bench/dm_latency.py). '' (nothing) on one CPU."""
  cpus = sorted(os.sched_getaffinity(0) if allowed is None else allowed)
  return f"camerad={cpus[0]} modeld={cpus[-1]}" if len(cpus) >= 2 else ""


def stack_pins(environ=None) -> str:
  """PYMODELD_CORES for the whole stack (the manager, the full-stack benches): the environment's if set ('' pins
  nothing), else default_pins()."""
  return COMMON_ENV.get(CORES_ENV, default_pins(), environ)


def _check_cores(cores: int | Iterable[int]) -> frozenset[int]:
  wanted = frozenset([cores] if isinstance(cores, int) else cores)
  count = os.cpu_count() or 1
  bad = sorted((c for c in wanted if not isinstance(c, int) or isinstance(c, bool) or not 0 <= c < count), key=str)
  if not wanted or bad:
    raise ValueError(f"cores must be CPU numbers in 0..{count - 1}, got {sorted(wanted, key=str) if wanted else 'none'}"
                     + (f" (bad: {bad})" if bad else ""))
  return wanted


def config_realtime_process(cores: int | Iterable[int] | None, priority: int | None) -> RealtimeStatus:
  """Pin the calling thread to `cores` (None: keep its affinity) and run it SCHED_FIFO at `priority` (None:
  keep its scheduler)."""
  low, high = os.sched_get_priority_min(os.SCHED_FIFO), os.sched_get_priority_max(os.SCHED_FIFO)
  if priority is not None and (not isinstance(priority, int) or isinstance(priority, bool)
                               or not low <= priority <= high):
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
  if priority is not None:
    try:
      os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
      applied = priority
    except PermissionError:
      problems.append(f"SCHED_FIFO priority {priority} not permitted (needs CAP_SYS_NICE or RLIMIT_RTPRIO >= "
                      f"{priority}); running at normal priority")
  return RealtimeStatus(applied, pinned, "; ".join(problems) or None)


@dataclass(frozen=True)
class SchedulingPlan:
  """What the environment asks for one daemon, read (and checked) at its start-up."""
  priority: int | None
  cores: frozenset[int] | None

  def apply(self, log: Callable[[str], None]) -> RealtimeStatus | None:
    """Apply the plan to the calling thread (just before the frame loop) and log the outcome; None if it asks
    for nothing."""
    if self.priority is None and self.cores is None:
      return None
    status = config_realtime_process(self.cores, self.priority)
    log(f"scheduling: {status.describe()}")
    return status


def scheduling_plan(process: str, environ=None) -> SchedulingPlan:
  """The plan of `process` (a key of PRIORITIES) from PYMODELD_REALTIME and PYMODELD_CORES."""
  cores = cores_requested(process, environ)
  return SchedulingPlan(PRIORITIES[process] if realtime_requested(environ) else None, cores)
