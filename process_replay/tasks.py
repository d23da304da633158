"""Replay tasks: one (route, process) replay each, or one chain replay per route, run inline, in a process
pool or on Ray, then judged against the references. Everything here is importable by worker processes.

Invariants:
- run_task never raises for a replay or route problem: it returns a TaskResult with `error` set (naming the
  route and the process), so one bad task never hides the others' results.
- run_tasks returns results in task order whatever order they run or finish in, so -j N and -j 1 (and Ray)
  report the same.
- Each worker (the inline runner, a pool worker, a Ray worker) keeps its daemons resident across tasks
  (`Worker`): a route resets a daemon by ending and restarting its main(), not its process. Inline, the
  daemons of the next tasks are launched while the current one replays, so their import overlaps it.
- Ctrl-C (KeyboardInterrupt) in run_tasks stops every daemon of every worker and removes its namespace before
  it raises Interrupted with the results of the tasks that finished. Pool workers never see a KeyboardInterrupt
  of their own between tasks (it would end them with a traceback): SIGINT and SIGTERM interrupt a worker's
  running task once, and its exit, at the pool's shutdown, stops its residents.
"""
from __future__ import annotations

import atexit
import os
import shutil
import signal
import stat
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from multiprocessing import connection, get_context, util

from cereal.messaging import log_from_bytes
from cereal.route import Route, RouteError
from process_replay.chain import replay_chain
from process_replay.compare import compare_logs, format_diff, format_diff_long, format_diff_summary
from process_replay.configs import CHAIN, CHAIN_NAME, get_config, owner_of
from process_replay.harness import ProcessRunner, ReplayError, load_messages, replay
from process_replay.references import RefMissingError, load_ref, save_ref, truncate
from selfdrive_stub.supervisor.process import die_with_parent

ROUTES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "routes")
PRELAUNCH_AHEAD = 1    # inline runs launch the daemons of this many next tasks early
WORKER_STOP_S = 30.0   # an interrupted pool worker stops its daemons within this, else it is killed


class Interrupted(Exception):
  """Ctrl-C during run_tasks. Every daemon was stopped and its namespace removed; `results` are the tasks that
  finished, in task order."""

  def __init__(self, results: list):
    super().__init__(f"interrupted after {len(results)} finished task(s)")
    self.results = results


class UsageError(ValueError):
  """A mistake in what the user asked for (a route, a process); the CLI prints it in one line and exits 2."""


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


def task_procs(proc: str) -> tuple[str, ...]:
  return CHAIN if proc == CHAIN_NAME else (proc,)


class Worker:
  """The resident daemons of one worker process, keyed by (daemon, arguments, environment)."""

  def __init__(self):
    self.runners: dict[tuple, ProcessRunner] = {}
    self._closing_registered = False

  def runner(self, proc: str, env: dict | None) -> ProcessRunner:
    fresh = ProcessRunner(get_config(proc), env=env)
    r = self.runners.get(fresh.key)
    if r is None or r.proc is None or r.proc.poll() is not None:
      if r is not None:
        r.stop()
      r = self.runners[fresh.key] = fresh
      self._register_close()
    r.launch()
    return r

  def prelaunch(self, proc: str, env: dict | None) -> None:
    for name in task_procs(proc):
      self.runner(name, env)

  def drop(self, runner: ProcessRunner) -> None:
    """Forget a runner after a failure (it was stopped; the next task launches a new one)."""
    runner.stop()
    self.runners = {k: r for k, r in self.runners.items() if r is not runner}

  def close(self) -> None:
    for r in self.runners.values():
      r.stop()
    self.runners = {}

  def _register_close(self) -> None:
    if not self._closing_registered:
      atexit.register(self.close)
      util.Finalize(self, Worker.close, args=(self,), exitpriority=10)   # pool/Ray workers skip atexit
      self._closing_registered = True


WORKER = Worker()


def run_task(route_path: str, proc: str, seconds: float | None = None, env: dict | None = None,
             on_step=None, worker: Worker | None = None) -> TaskResult:
  """Replay one (route, process), or the chain (proc "chain"); a ReplayError becomes TaskResult.error.
  Runs inline, in a pool worker or as a Ray task. on_step(step, total) reports progress (inline runs only)."""
  worker = worker or WORKER
  name = os.path.basename(os.path.normpath(route_path))
  t0 = time.monotonic()
  runners: dict[str, ProcessRunner] = {}
  try:
    runners = {p: worker.runner(p, env) for p in task_procs(proc)}
    with Route(route_path) as route:
      msgs = load_messages(route, seconds)
      if proc == CHAIN_NAME:
        total = len(msgs)
        report = (lambda done, n: on_step(done, total)) if on_step is not None else None
        res = replay_chain(route, messages=msgs, runners=runners, on_event=report)
        outputs, steps, route_s, step_s = res.outputs, sum(res.steps.values()), res.route_s, res.step_s
      else:
        cfg = get_config(proc)
        total = sum(m.which == cfg.trigger[0] for m in msgs)
        report = (lambda step, runner: on_step(step, total)) if on_step is not None else None
        res = replay(cfg, route, messages=msgs, env=env, on_step=report, runner=runners[proc])
        outputs, steps, route_s, step_s = res.outputs, res.steps, res.route_s, res.step_s
  except (ReplayError, RouteError, OSError) as e:
    for r in runners.values():   # whatever state a failed task left them in, the next task starts afresh
      worker.drop(r)
    return TaskResult(name, proc, error=f"{name}/{proc}: {type(e).__name__}: {e}", wall_s=time.monotonic() - t0)
  end_ns = msgs[0].log_mono_time + int(seconds * 1e9) if seconds is not None and msgs else 0
  return TaskResult(name, proc, outputs, steps, route_s, time.monotonic() - t0, step_s, end_ns)


def resolve_routes(names) -> list[str]:
  """Route directories for --routes names (sample route names or paths); UsageError for an unknown one."""
  if not names:
    if not os.path.isdir(ROUTES_DIR):
      raise UsageError(f"no sample routes in {ROUTES_DIR}; make them with python -m process_replay.make_routes")
    return sorted(os.path.join(ROUTES_DIR, n) for n in os.listdir(ROUTES_DIR)
                  if os.path.isfile(os.path.join(ROUTES_DIR, n, "header.json")))
  out = []
  for n in names:
    path = n if os.path.isdir(n) else os.path.join(ROUTES_DIR, n)
    if not os.path.isfile(os.path.join(path, "header.json")):
      known = sorted(d for d in os.listdir(ROUTES_DIR)) if os.path.isdir(ROUTES_DIR) else []
      raise UsageError(f"--routes: {n!r} is neither a route directory nor a sample route (known: {', '.join(known)})")
    out.append(path)
  return out


def _fmt_s(s: float) -> str:
  return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


class Progress:
  """A progress bar with an ETA: done fraction = finished tasks + the running one's step fraction, each task
  weighted by its route seconds; ETA = elapsed * (1 - done) / done."""

  def __init__(self, total: int, stream=sys.stderr, weights: list[float] | None = None):
    self.total, self.done, self.stream = total, 0, stream
    self.weights = weights or [1.0] * total
    self.tty = stream.isatty()
    self.t0 = time.monotonic()
    self._done_weight = 0.0

  def _bar(self, fraction: float) -> str:
    filled = int(30 * fraction)
    return f"[{'#' * filled}{'.' * (30 - filled)}]"

  def _eta(self, fraction: float) -> str:
    if fraction <= 0:
      return "ETA --"
    return f"ETA {_fmt_s((time.monotonic() - self.t0) * (1 - fraction) / fraction)}"

  def _fraction(self, running: float = 0.0) -> float:
    total = sum(self.weights) or 1.0
    nxt = self.weights[self.done] if self.done < len(self.weights) else 0.0
    return min((self._done_weight + running * nxt) / total, 1.0)

  def step(self, label: str, step: int, total: int) -> None:
    """Within-task progress; drawn only on a terminal, at most every 10 steps."""
    if self.tty and step % 10 == 0:
      f = self._fraction(step / max(total, 1))
      self.stream.write(f"\r{self._bar(f)} {self.done}/{self.total} {label} step {step}/{total} {self._eta(f)}".ljust(100))
      self.stream.flush()

  def update(self, label: str, index: int | None = None) -> None:
    self._done_weight += self.weights[index if index is not None else self.done] if self.done < len(self.weights) else 0
    self.done += 1
    f = self._fraction()
    line = f"{self._bar(f)} {self.done}/{self.total} {label} " + (self._eta(f) if self.done < self.total else
                                                                   f"done in {_fmt_s(time.monotonic() - self.t0)}")
    self.stream.write(("\r" + line.ljust(100)) if self.tty else line + "\n")
    if self.tty and self.done == self.total:
      self.stream.write("\n")
    self.stream.flush()


def route_seconds(route_path: str) -> float:
  """The route's length from its header (for progress weights); 1.0 when it cannot be read."""
  try:
    with Route(route_path) as r:
      return max(float(r.header.get("duration_s", 1.0)), 0.05)
  except (RouteError, OSError, ValueError, TypeError):
    return 1.0


_in_task = False    # a pool worker runs a task now
_stopping = False   # a pool worker was told to stop: it starts no task


def _pool_worker_init(parent_pid: int) -> None:
  """A pool worker dies with the CLI that started it (a SIGKILLed CLI left workers waiting on their task queue
  forever, their daemons with them); its daemons die with the worker (process_replay.resident). SIGINT (Ctrl-C
  reaches the whole foreground process group) and SIGTERM (the driver's) stop it the quiet way: _worker_stop."""
  die_with_parent(parent_pid)
  for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, _worker_stop)


def _worker_stop(signum, frame) -> None:
  """Interrupt the running task, once: the replay stops its daemons on the way out (a second signal must not
  interrupt that cleanup). Between tasks nothing is interrupted; the pool's shutdown ends the worker, whose
  exit stops its residents (Worker's finalizer)."""
  global _stopping
  first, _stopping = not _stopping, True
  if first and _in_task:
    raise KeyboardInterrupt


def _pool_task(*args) -> TaskResult:
  global _in_task
  _in_task = True   # before the check: a signal in between then interrupts the task instead of being lost
  try:
    if _stopping:
      raise KeyboardInterrupt
    return run_task(*args)
  finally:
    _in_task = False


def _stop_pool(pool: ProcessPoolExecutor) -> None:
  """Cancel the queued tasks and interrupt the running ones; a worker that does not exit within WORKER_STOP_S
  is killed (its daemons die with it; the next run removes their namespaces)."""
  workers = list(getattr(pool, "_processes", {}).values())   # the executor has no public list of its processes
  pool.shutdown(wait=False, cancel_futures=True)
  for w in workers:
    try:
      os.kill(w.pid, signal.SIGTERM)
    except ProcessLookupError:
      pass
  deadline = time.monotonic() + WORKER_STOP_S
  pending = [w for w in workers if w.exitcode is None]
  while pending and time.monotonic() < deadline:
    connection.wait([w.sentinel for w in pending], timeout=max(deadline - time.monotonic(), 0))
    pending = [w for w in pending if w.is_alive()]
  for w in pending:
    w.kill()


def execution_order(tasks) -> list[int]:
  """Task indices grouped by process (stable): consecutive tasks of one daemon reuse its resident."""
  first = {}
  for i, (_, proc) in enumerate(tasks):
    first.setdefault(proc, i)
  return sorted(range(len(tasks)), key=lambda i: (first[tasks[i][1]], i))


def run_tasks(tasks, jobs: int = 1, ray_address: str | None = None, seconds: float | None = None,
              env: dict | None = None, progress: Progress | None = None, ray_ship_routes: bool = False) -> list[TaskResult]:
  """Run (route_path, proc) tasks inline (jobs=1), in a process pool or on Ray; results in task order.
  The pool spawns its workers (no fork of a process holding sockets and threads), so a script that calls
  this with jobs > 1 needs the usual `if __name__ == "__main__":` guard."""
  results: dict[int, TaskResult] = {}

  def done(i: int, r: TaskResult) -> None:
    results[i] = r
    if progress:
      progress.update(f"{r.route}/{r.proc}" + (" ERROR" if r.error else ""), i)

  order = execution_order(tasks)
  try:
    if ray_address is not None:
      _run_on_ray(tasks, order, ray_address, jobs, seconds, env, done, ray_ship_routes)
    elif jobs <= 1:
      for n, i in enumerate(order):
        route, proc = tasks[i]
        for j in order[n + 1:n + 1 + PRELAUNCH_AHEAD]:
          WORKER.prelaunch(tasks[j][1], env)
        label = f"{os.path.basename(os.path.normpath(route))}/{proc}"
        on_step = (lambda step, total, label=label: progress.step(label, step, total)) if progress else None
        done(i, run_task(route, proc, seconds, env, on_step))
    else:
      _run_in_pool(tasks, order, jobs, seconds, env, done)
  except KeyboardInterrupt:
    WORKER.close()   # the inline daemons, the running task's and the prelaunched ones
    raise Interrupted([results[i] for i in sorted(results)]) from None
  return [results[i] for i in range(len(tasks))]


def _run_in_pool(tasks, order, jobs: int, seconds, env, done) -> None:
  with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn"), initializer=_pool_worker_init,
                           initargs=(os.getpid(),)) as pool:
    futures = {pool.submit(_pool_task, tasks[i][0], tasks[i][1], seconds, env): i for i in order}
    try:
      for fut in as_completed(futures):
        i = futures[fut]
        try:
          r = fut.result()
        except Exception as e:   # the worker process itself died
          route, proc = tasks[i]
          name = os.path.basename(os.path.normpath(route))
          r = TaskResult(name, proc, error=f"{name}/{proc}: worker failed: {type(e).__name__}: {e}")
        done(i, r)
    except KeyboardInterrupt:
      _stop_pool(pool)
      raise


# ---- Ray

def pack_route(path: str) -> dict[str, bytes]:
  """A route directory's regular files as {name: bytes}, to ship through Ray's object store."""
  out = {}
  for name in sorted(os.listdir(path)):
    p = os.path.join(path, name)
    if os.path.isfile(p) and not os.path.islink(p):
      with open(p, "rb") as f:
        out[name] = f.read()
  return out


_UNPACKED: dict[str, str] = {}
UNPACK_PREFIX = "replay_route_"   # + "<pid of the worker>_": whose dir it is, for sweeping a killed worker's


def remove_unpacked() -> None:
  """Remove every route this process unpacked: at exit, and from RayWorker.close() (Ray kills an actor without
  running atexit)."""
  for d in _UNPACKED.values():
    shutil.rmtree(os.path.dirname(d), ignore_errors=True)
  _UNPACKED.clear()


atexit.register(remove_unpacked)


def sweep_unpacked(tmp: str | None = None) -> None:
  """Remove unpacked-route dirs left by workers that are gone (killed before close() or atexit ran): ours, real
  directories (never a link), whose worker pid no longer runs. A live pid's dir is left, whoever holds it now."""
  tmp = tmp or tempfile.gettempdir()
  try:
    names = os.listdir(tmp)
  except OSError:
    return
  for n in names:
    if not n.startswith(UNPACK_PREFIX):
      continue
    pid = n[len(UNPACK_PREFIX):].split("_", 1)[0]
    if not pid.isdigit() or int(pid) == os.getpid():
      continue
    p = os.path.join(tmp, n)
    try:
      st = os.lstat(p)
      if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        continue
      os.kill(int(pid), 0)
    except ProcessLookupError:
      shutil.rmtree(p, ignore_errors=True)
    except OSError:   # gone meanwhile, or a live process of another user
      continue


def unpack_route(name: str, files: dict[str, bytes]) -> str:
  """Write a shipped route into this worker's temporary dir once (cached by name and content size)."""
  key = f"{name}:{sum(len(v) for v in files.values())}"
  if key not in _UNPACKED:
    sweep_unpacked()
    d = os.path.join(tempfile.mkdtemp(prefix=f"{UNPACK_PREFIX}{os.getpid()}_"), name)
    os.mkdir(d, 0o700)
    for fname, data in files.items():
      if os.path.basename(fname) != fname or fname in (".", ".."):
        raise RouteError(f"shipped route {name}: bad file name {fname!r}")
      with open(os.path.join(d, fname), "xb") as f:
        f.write(data)
    _UNPACKED[key] = d
  return _UNPACKED[key]


class RayWorker:
  """A Ray actor: one worker slot with its resident daemons; close() stops them (Ray kills actor processes
  without running their finalizers, so the daemons' namespaces would otherwise stay behind)."""

  def __init__(self):
    self.worker = Worker()

  def run(self, route_ref, name: str, proc: str, seconds, env) -> TaskResult:
    """The route is a path on a shared filesystem, or files from the object store."""
    try:
      path = route_ref if isinstance(route_ref, str) else unpack_route(name, route_ref)
    except (RouteError, OSError) as e:
      return TaskResult(name, proc, error=f"{name}/{proc}: cannot unpack the route on the worker: {e}")
    if not os.path.isdir(path):
      return TaskResult(name, proc, error=f"{name}/{proc}: route {path} is not on this worker (use --ray-ship-routes "
                                          "or a shared path)")
    r = run_task(path, proc, seconds, env, worker=self.worker)
    r.route = name
    return r

  def close(self) -> None:
    self.worker.close()
    remove_unpacked()


def _run_on_ray(tasks, order, address: str, jobs: int, seconds, env, done, ship: bool) -> None:
  """`jobs` RayWorker actors (one CPU each) take the tasks in execution order, the next as one finishes."""
  try:
    import ray
  except ImportError:
    raise UsageError("--ray needs the 'ray' package (pip install 'ray[default]'); use -j N for local parallelism") from None
  if address == "local":
    ray.init(num_cpus=max(jobs, 1), include_dashboard=False, log_to_driver=False, ignore_reinit_error=True,
             configure_logging=False)
  else:
    ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
  actor_cls = ray.remote(num_cpus=1, max_restarts=0, max_task_retries=0)(RayWorker)
  actors = [actor_cls.remote() for _ in range(max(jobs, 1))]
  shipped: dict[str, object] = {}
  queue_ = list(order)
  pending: dict = {}

  def submit(actor) -> None:
    i = queue_.pop(0)
    route, proc = tasks[i]
    name = os.path.basename(os.path.normpath(route))
    if ship and route not in shipped:
      shipped[route] = ray.put(pack_route(route))
    ref = shipped[route] if ship else os.path.abspath(route)
    pending[actor.run.remote(ref, name, proc, seconds, env)] = (i, actor)

  try:
    for actor in actors:
      if queue_:
        submit(actor)
    while pending:
      ready, _ = ray.wait(list(pending), num_returns=1)
      for ref in ready:
        i, actor = pending.pop(ref)
        try:
          r = ray.get(ref)
        except Exception as e:   # the actor or its worker process died (RayActorError, RayTaskError)
          route, proc = tasks[i]
          name = os.path.basename(os.path.normpath(route))
          r = TaskResult(name, proc, error=f"{name}/{proc}: Ray worker failed: {type(e).__name__}: {str(e).splitlines()[0]}")
          actor = actor_cls.remote()   # replace the dead slot
          actors.append(actor)
        done(i, r)
        if queue_:
          submit(actor)
  finally:
    closing = [a.close.remote() for a in actors]
    try:
      ray.get(closing, timeout=60)
    except Exception:
      pass   # a dead actor has nothing left to close
    for a in actors:
      ray.kill(a)
    if address != "local":   # a private local cluster is reused by the next call and shut down at exit
      ray.shutdown()


# ---- judging

@dataclass
class Outcome:
  result: TaskResult
  status: str              # PASS | FAIL | ERROR | NO REF | UPDATED
  diffs: list = field(default_factory=list)
  detail: str = ""
  ref: list = field(default_factory=list)   # the reference compared against (cut to the replayed span)


def compare_task(proc: str, ref: list[bytes], new: list[bytes], extra_ignore=(), ignore_msgs=(),
                 tolerance: float | None = None) -> list:
  """Differences of one task; a chain's outputs are compared per daemon with that daemon's rules. The caller's
  ignore paths and services add to each daemon's; its tolerance, when given, replaces each daemon's."""
  def rules(name: str) -> tuple:
    cfg = get_config(name)
    return (*cfg.ignore, *extra_ignore), cfg.tolerance if tolerance is None else tolerance

  if proc != CHAIN_NAME:
    ignore, tol = rules(proc)
    return compare_logs(ref, new, ignore, tol, ignore_msgs=ignore_msgs)
  diffs = []
  for name in CHAIN:
    ignore, tol = rules(name)
    mine = lambda log: [d for d in log if owner_of(log_from_bytes(d).which()) == name]
    diffs += compare_logs(mine(ref), mine(new), ignore, tol, ignore_msgs=ignore_msgs)
  return diffs


def judge(results: list[TaskResult], refs_dir: str, update: bool, extra_ignore=(), ignore_msgs=(),
          tolerance: float | None = None) -> list[Outcome]:
  outcomes = []
  for r in results:
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
      new = r.outputs
      if r.end_ns and r.proc == CHAIN_NAME:
        # an output stamped before the cut has all its inputs (log or other daemons') before it, in both runs
        ref, new = truncate(ref, r.end_ns), truncate(new, r.end_ns)
      elif r.end_ns:
        ref = truncate(ref, r.end_ns + int(get_config(r.proc).processing_time * 1e9))
      diffs = compare_task(r.proc, ref, new, extra_ignore, ignore_msgs, tolerance)
      outcomes.append(Outcome(r, "FAIL" if diffs else "PASS", diffs, ref=ref))
  return outcomes


def summary_table(outcomes: list[Outcome], wall_s: float | None = None) -> str:
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
    lines.append("real-time factor per process, per worker, launch included (stepping only):")
    for p, rs in by_proc.items():
      route_s, wall, step = sum(r.route_s for r in rs), sum(r.wall_s for r in rs), sum(r.step_s for r in rs)
      lines.append(f"  {p:18s} {route_s / wall if wall else 0:6.2f}x ({route_s / step if step else 0:.2f}x stepping) "
                   f"over {route_s:.1f} route s in {len(rs)} task(s)")
    if wall_s:
      total = sum(o.result.route_s for o in outcomes if not o.result.error)
      lines.append(f"  {'all tasks':18s} {total / wall_s:6.2f}x: {total:.1f} route s in {wall_s:.1f} s of wall time")
    lines.append("x real: route seconds per wall second of the task, its daemon's launch or reset included; "
                 "x step: while stepping")
  return "\n".join(lines)


def write_report(path: str, outcomes: list[Outcome], table: str, per_field: int | None = 20) -> None:
  """The table, then per failing task a summary and its differences: with per_field, the first per_field of
  each field plus the count of the rest (a big-vs-small comparison differs in every float); None: all."""
  with open(path, "w") as f:
    f.write(table + "\n\n")
    for o in outcomes:
      name = f"{o.result.route}/{o.result.proc}"
      if o.status == "FAIL":
        body = format_diff_long(o.diffs) if per_field is None else format_diff_summary(o.diffs, per_field)
        f.write(format_diff(o.diffs, name) + "\n\n" + body + "\n\n")
      elif o.detail:
        f.write(f"{name}: {o.status}\n{o.detail}\n\n")

