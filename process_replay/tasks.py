"""Replay tasks: one (route, process) replay each, run inline, in a process pool or on Ray, then judged
against the references. Everything here is importable by worker processes (python -m process_replay runs it).

Invariants:
- run_task never raises for a replay or route problem: it returns a TaskResult with `error` set, so one bad
  task never hides the others' results.
- run_tasks returns results in task order whatever order they finish in, so -j N and -j 1 report the same.
"""
from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from multiprocessing import get_context

from process_replay.configs import get_config
from process_replay.references import RefMissingError, load_ref, save_ref, truncate
from cereal.route import Route, RouteError
from process_replay.compare import compare_logs
from process_replay.compare import format_diff, format_diff_long
from process_replay.harness import ReplayError, load_messages, replay

ROUTES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "routes")


@dataclass
class TaskResult:
  route: str
  proc: str
  outputs: list = field(default_factory=list)
  steps: int = 0
  route_s: float = 0.0
  wall_s: float = 0.0
  step_s: float = 0.0        # of wall_s, the time spent stepping (launch and loading excluded)
  end_ns: int = 0            # replayed inputs end here (references are cut to it for --seconds)
  error: str = ""

  @property
  def realtime_factor(self) -> float:
    return self.route_s / self.wall_s if self.wall_s > 0 else 0.0

  @property
  def step_realtime_factor(self) -> float:
    return self.route_s / self.step_s if self.step_s > 0 else 0.0


def run_task(route_path: str, proc: str, seconds: float | None = None, env: dict | None = None,
             on_step=None) -> TaskResult:
  """Replay one (route, process); a ReplayError becomes TaskResult.error. Runs in a worker (-j) or Ray task.
  on_step(step, total) reports progress (inline runs only)."""
  name = os.path.basename(os.path.normpath(route_path))
  t0 = time.monotonic()
  try:
    with Route(route_path) as route:
      msgs = load_messages(route, seconds)
      cfg = get_config(proc)
      total = sum(m.which == cfg.trigger[0] for m in msgs)
      report = (lambda step, runner: on_step(step, total)) if on_step is not None else None
      result = replay(cfg, route, messages=msgs, env=env, on_step=report)
  except (ReplayError, RouteError) as e:
    return TaskResult(name, proc, error=f"{type(e).__name__}: {e}", wall_s=time.monotonic() - t0)
  end_ns = msgs[0].log_mono_time + int(seconds * 1e9) if seconds is not None and msgs else 0
  return TaskResult(name, proc, result.outputs, result.steps, result.route_s, time.monotonic() - t0, result.step_s,
                    end_ns)


def resolve_routes(names) -> list[str]:
  if not names:
    if not os.path.isdir(ROUTES_DIR):
      raise SystemExit(f"no sample routes in {ROUTES_DIR}; make them with python -m process_replay.make_routes")
    return sorted(os.path.join(ROUTES_DIR, n) for n in os.listdir(ROUTES_DIR)
                  if os.path.isfile(os.path.join(ROUTES_DIR, n, "header.json")))
  out = []
  for n in names:
    path = n if os.path.isdir(n) else os.path.join(ROUTES_DIR, n)
    if not os.path.isfile(os.path.join(path, "header.json")):
      raise SystemExit(f"--routes: {n!r} is neither a route directory nor a sample route in {ROUTES_DIR}")
    out.append(path)
  return out


class Progress:
  def __init__(self, total: int, stream=sys.stderr):
    self.total, self.done, self.stream = total, 0, stream
    self.tty = stream.isatty()

  def _bar(self, fraction: float) -> str:
    filled = int(30 * fraction)
    return f"[{'#' * filled}{'.' * (30 - filled)}]"

  def step(self, label: str, step: int, total: int) -> None:
    """Within-task progress; drawn only on a terminal, at most every 10 steps."""
    if self.tty and step % 10 == 0:
      fraction = (self.done + step / max(total, 1)) / max(self.total, 1)
      self.stream.write(f"\r{self._bar(fraction)} {self.done}/{self.total} {label} step {step}/{total}".ljust(90))
      self.stream.flush()

  def update(self, label: str) -> None:
    self.done += 1
    line = f"{self._bar(self.done / max(self.total, 1))} {self.done}/{self.total} {label}"
    self.stream.write(("\r" + line.ljust(90)) if self.tty else line + "\n")
    if self.tty and self.done == self.total:
      self.stream.write("\n")
    self.stream.flush()


def run_tasks(tasks, jobs: int = 1, ray_address: str | None = None, seconds: float | None = None,
              env: dict | None = None, progress: Progress | None = None) -> list[TaskResult]:
  """Run (route_path, proc) tasks inline (jobs=1), in a process pool or on Ray; results in task order.
  The pool spawns its workers (no fork of a process holding sockets and threads), so a script that calls
  this with jobs > 1 needs the usual `if __name__ == "__main__":` guard."""
  results: dict[int, TaskResult] = {}

  def done(i: int, r: TaskResult) -> None:
    results[i] = r
    if progress:
      progress.update(f"{r.route}/{r.proc}" + (" ERROR" if r.error else ""))

  if ray_address is not None:
    _run_on_ray(tasks, ray_address, seconds, env, done)
  elif jobs <= 1:
    for i, (route, proc) in enumerate(tasks):
      label = f"{os.path.basename(os.path.normpath(route))}/{proc}"
      on_step = (lambda step, total, label=label: progress.step(label, step, total)) if progress else None
      done(i, run_task(route, proc, seconds, env, on_step))
  else:
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
      futures = {pool.submit(run_task, route, proc, seconds, env): i for i, (route, proc) in enumerate(tasks)}
      for fut in as_completed(futures):
        done(futures[fut], fut.result())
  return [results[i] for i in range(len(tasks))]


def _run_on_ray(tasks, address: str, seconds, env, done) -> None:
  try:
    import ray
  except ImportError:
    raise SystemExit("--ray needs the optional 'ray' package (pip install 'ray[default]'), which is not installed; "
                     "use -j N for local parallelism") from None
  ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
  remote = ray.remote(run_task)
  pending = {remote.remote(route, proc, seconds, env): i for i, (route, proc) in enumerate(tasks)}
  while pending:
    ready, _ = ray.wait(list(pending), num_returns=1)
    for ref in ready:
      done(pending.pop(ref), ray.get(ref))


@dataclass
class Outcome:
  result: TaskResult
  status: str              # PASS | FAIL | ERROR | NO REF | UPDATED
  diffs: list = field(default_factory=list)
  detail: str = ""
  ref: list = field(default_factory=list)   # the reference compared against (cut to the replayed span)


def judge(results: list[TaskResult], refs_dir: str, update: bool, extra_ignore=()) -> list[Outcome]:
  outcomes = []
  for r in results:
    cfg = get_config(r.proc)
    if r.error:
      outcomes.append(Outcome(r, "ERROR", detail=r.error))
    elif update:
      save_ref(refs_dir, r.route, r.proc, r.outputs)
      outcomes.append(Outcome(r, "UPDATED"))
    else:
      try:
        ref = load_ref(refs_dir, r.route, r.proc)
      except RefMissingError as e:
        outcomes.append(Outcome(r, "NO REF", detail=str(e)))
        continue
      if r.end_ns:
        ref = truncate(ref, r.end_ns + int(cfg.processing_time * 1e9))
      diffs = compare_logs(ref, r.outputs, (*cfg.ignore, *extra_ignore), cfg.tolerance)
      outcomes.append(Outcome(r, "FAIL" if diffs else "PASS", diffs, ref=ref))
  return outcomes


def summary_table(outcomes: list[Outcome]) -> str:
  head = (f"{'route':10s} {'process':18s} {'steps':>6s} {'outputs':>8s} {'result':8s} {'diffs':>6s} {'wall s':>7s} "
          f"{'x real':>7s} {'x step':>7s}")
  lines = [head, "-" * len(head)]
  for o in outcomes:
    r = o.result
    lines.append(f"{r.route:10s} {r.proc:18s} {r.steps:6d} {len(r.outputs):8d} {o.status:8s} {len(o.diffs):6d} "
                 f"{r.wall_s:7.1f} {r.realtime_factor:7.2f} {r.step_realtime_factor:7.2f}")
  by_proc: dict = {}
  for o in outcomes:
    if not o.result.error:
      by_proc.setdefault(o.result.proc, []).append(o.result)
  if by_proc:
    factors = ", ".join(f"{p} {sum(r.route_s for r in rs) / sum(r.wall_s for r in rs):.2f}x "
                        f"({sum(r.route_s for r in rs) / max(sum(r.step_s for r in rs), 1e-9):.2f}x stepping)"
                        for p, rs in by_proc.items())
    lines.append(f"achieved real-time factor per worker, launch included (stepping only): {factors}")
    lines.append("x real: route seconds per wall second of the whole task; x step: the same while stepping")
  return "\n".join(lines)


def write_report(path: str, outcomes: list[Outcome], table: str) -> None:
  with open(path, "w") as f:
    f.write(table + "\n\n")
    for o in outcomes:
      name = f"{o.result.route}/{o.result.proc}"
      if o.status == "FAIL":
        f.write(format_diff(o.diffs, name) + "\n\n" + format_diff_long(o.diffs) + "\n\n")
      elif o.detail:
        f.write(f"{name}: {o.status}\n{o.detail}\n\n")
