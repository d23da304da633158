"""manager: runs the whole stack (camerad, car, the model daemons, the safety consumers, the logger) in a
private bus namespace, keeps it running, shows it, and cleans up after it.

Invariants:
- The process list (PROCESSES) is declarative: name, module, arguments, enabled, should_run, start-after
  dependencies. A module that does not exist is reported as "missing" and skipped; the manager carries on.
- Start order: a process starts once every process it is `after` is ready (all the services it owns have
  published since it started), has given up (missing/crashed) or READY_TIMEOUT_S has passed.
- Every run gets its own namespace: OPENPILOT_PREFIX if set (so outside tools can join), a fresh
  manager<pid>_<hex> otherwise; at start, such namespaces left by a SIGKILLed manager are removed.
- A namespace has one owner (selfdrive_stub/supervisor/owner.py: an flock in its runtime dir). A second manager on the
  same prefix refuses in one line naming the owner's pid and touches nothing; so does a manager on a prefix whose
  services live processes already publish (pieces started by hand: named with their pids); a namespace dir another user
  planted is refused in one line saying how to fix it. Exit 2 for all three, as for every user mistake.
- What a live piece holds is never removed: if a process outside the manager still publishes in the namespace at
  exit (a piece started by hand meanwhile), the namespace is left in place and one line says so. Readers that
  joined (a viewer, a recorder) neither block a start nor keep the namespace: their mappings outlive the files.
- On exit — normal, Ctrl-C, SIGTERM, SIGHUP or an exception — every child group gets SIGINT, then SIGKILL
  after 5 s (dependents first, so the logger stops last), and the namespace's shared memory and sockets are
  removed. Children also die with the manager if it is SIGKILLed (PR_SET_PDEATHSIG, see process.py).
- A crashed process is restarted with backoff. The summary is printed however the run ends (also written as
  JSON with --summary-json): a crash we did not cause, a running process that never got ready, or a service
  of a running process that missed its rate over the measured part of the run is a FAIL and a non-zero exit;
  it lists each crash's last error line, each selfdrive state change with its events and their reasons, the
  modelV2 frames lost across a road model fallback, and flags a service under 95 % valid.
- The model files the daemons will load are checked against their contracts before anything starts.
- managerState is published at 1 Hz.
- The live view (a TTY without --no-view) is redrawn to the terminal's size, read at every frame and at once on
  SIGWINCH; the event log under it has the whole texts the table cuts: crashes with their last error, road
  model changes with their fallback reason, selfdrive state changes with their events and reasons.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import signal
import sys
import time
from dataclasses import dataclass

from cereal import messaging
from cereal.messaging import new_message
from cereal.route import CAMERAS, HEADER, Route, RouteError, _writable_route_dir
from cereal.services import SERVICE_LIST
from common.cli import Parser, UsageError, check_cache_dir, run_cli
from common.realtime import CORES_ENV, PRIORITIES, scheduling_plan, stack_pins
from common.text import cut_words
from daemons.common.metadata import load_metadata
from daemons.dmonitoringmodeld.model_state import DM_CONTRACT
from daemons.dmonitoringmodeld.model_state import MODEL_PATH as DM_MODEL_PATH
from daemons.modeld.model_state import ROAD_CONTRACT, model_path
from msgq.env import MSGQ_ENV
from msgq.namespace import PREFIX_ENV, runtime_dir, shm_dir, sweep_dead
from msgq.namespace import prefix as namespace_prefix
from runtime import cl, faults, usb_amd
from runtime import config as runtime_config
from runtime.device import DeviceUnavailable
from runtime.faults import DEVICE_KINDS, FAULT_KINDS
from selfdrive_stub.producers.car import SCENARIOS
from selfdrive_stub.supervisor.liveview import CLEAR, VALID_OK, CpuMeter, ServiceMonitor, render_line, render_screen
from selfdrive_stub.supervisor.owner import NamespaceBusy, NamespaceOwner, clean, holder, label, publishers
from selfdrive_stub.supervisor.process import ManagedProcess, ProcessConfig
from selfdrive_stub.supervisor.viewer import Viewer

READY_TIMEOUT_S = 30.0
LOOP_DT = 0.1
WARMUP_AFTER_READY_S = 2.0
SUMMARY_CHANGES = 8           # selfdrive state changes listed in the text summary
GENERATED_PREFIX = "manager"   # namespaces the manager names itself: manager<pid>_<hex>
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
VIEW_SIZE_FALLBACK = (80, 24)   # a terminal that does not say its size is taken to be the classic one
VIEW_EVENTS = 200               # newest events handed to the view (it shows those that fit)
NAMESPACE_FIX = "remove it (as its owner or root), or use another OPENPILOT_PREFIX (XDG_RUNTIME_DIR for the runtime dir)"


class NamespaceUnusable(Exception):
  """A namespace directory that is not ours to use; the message is one line with the fix."""


def _camerad_args(o) -> list[str]:
  args = ["--camera", o.camera, "--seed", str(o.seed)]
  if o.route:   # a route directory holds camerad's frame files under their standard names
    args += ["--frames", o.route, "--loop"]
  return args


def _car_args(o) -> list[str]:
  args = ["--camera", o.camera, "--seed", str(o.seed), "--scenario", o.scenario]
  return args + (["--chestnut"] if o.usb_gpu else [])


def _modeld_env(o) -> dict[str, str]:
  """--model-device moves modeld's big model (MODEL_DEV; the small standby stays on the CPU) and nothing else."""
  return {"MODEL_DEV": o.model_device} if o.model_device else {}


def _logger_args(o) -> list[str]:
  return ["--out", o.record, "--camera", o.camera, "--seed", str(o.seed), "--cameras", o.record_cameras]


PROCESSES = [
  # the logger goes first so the route starts with the first messages; its camera clients connect when they can
  ProcessConfig("logger", "selfdrive_stub.supervisor.logger", args=_logger_args, should_run=lambda o: bool(o.record),
                ready_check=lambda o: os.path.exists(os.path.join(o.record, "header.json"))),
  ProcessConfig("camerad", "selfdrive_stub.producers.camerad", args=_camerad_args, after=("logger",)),
  ProcessConfig("car", "selfdrive_stub.producers.car", args=_car_args, after=("logger",)),
  ProcessConfig("modeld", "daemons.modeld", env=_modeld_env, after=("camerad",)),
  ProcessConfig("dmonitoringmodeld", "daemons.dmonitoringmodeld", after=("camerad",)),
  ProcessConfig("dmonitoringd", "selfdrive_stub.consumers.dmonitoringd"),
  ProcessConfig("selfdrived", "selfdrive_stub.consumers.selfdrived"),
]


@dataclass(frozen=True)
class Injection:
  at: float
  kind: str          # "amd", "cl", "restart" or "kill"
  target: str        # fault kind for amd and cl, a process name otherwise

  def describe(self) -> str:
    return {"amd": f"USB+AMD fault {self.target}", "cl": f"OpenCL fault {self.target}", "restart": f"restart {self.target}",
            "kill": f"SIGKILL {self.target}"}[self.kind] + f" at {self.at:g} s"


def parse_injection(spec: str, names: list[str]) -> Injection:
  """amd-hang@10, cl-hang@10, camerad-restart@5, kill:dmonitoringmodeld@8 -> Injection; anything else is a
  ValueError."""
  what, sep, when = spec.rpartition("@")
  try:
    at = float(when)
  except ValueError:
    at = -1.0
  if not sep or at < 0:
    raise ValueError(f"bad --inject {spec!r}: expected FAULT@SECONDS, e.g. amd-hang@10")
  if what.startswith("amd-"):
    kind = what[4:]
    if kind not in FAULT_KINDS:
      raise ValueError(f"bad --inject {spec!r}: unknown USB+AMD fault {kind!r}; known: {', '.join(FAULT_KINDS)}")
    return Injection(at, "amd", kind)
  if what.startswith("cl-"):
    kind = what[3:]
    if kind not in DEVICE_KINDS["CL"]:
      raise ValueError(f"bad --inject {spec!r}: the OpenCL device takes only {', '.join(DEVICE_KINDS['CL'])} "
                       f"(cl-hang@S), not {kind!r}")
    return Injection(at, "cl", kind)
  if what.startswith("kill:") or what.endswith("-restart"):
    kind, name = ("kill", what[5:]) if what.startswith("kill:") else ("restart", what[:-len("-restart")])
    if name not in names:
      raise ValueError(f"bad --inject {spec!r}: unknown process {name!r}; known: {', '.join(names)}")
    return Injection(at, kind, name)
  raise ValueError(f"bad --inject {spec!r}: expected amd-<fault>@S, cl-hang@S, <process>-restart@S or kill:<process>@S")


def sweep_stale_namespaces() -> list[str]:
  """Remove namespaces this manager generated in earlier runs whose manager is dead (it was SIGKILLed, so
  its own cleanup never ran). Only names of the form manager<pid>_<hex> are touched, and none a live process holds."""
  return sweep_dead(GENERATED_PREFIX, keep=lambda p: holder(p) is not None)


def owned_services() -> dict[str, list[str]]:
  """process -> the periodic services it publishes (services.py owners)."""
  out: dict[str, list[str]] = {}
  for name, s in SERVICE_LIST.items():
    if s.frequency > 0:
      out.setdefault(s.owner, []).append(name)
  return out


class Manager:
  def __init__(self, opts, processes=None, out=sys.stdout):
    self.opts = opts
    self.out = out
    configs = PROCESSES if processes is None else processes
    self.procs = [ManagedProcess(cfg) for cfg in configs if cfg.enabled and cfg.name not in opts.block]
    self.by_name = {p.name: p for p in self.procs}
    self.injections = sorted((parse_injection(s, list(self.by_name)) for s in opts.inject), key=lambda i: i.at)
    self.owned = owned_services()
    self.events: list[str] = []
    self.monitor = None
    self.rate_failures: list[str] = []
    self.all_up_at: float | None = None   # run time at which every process was settled; rates are measured from a warm-up later
    self.report: dict = {}
    self.started = time.monotonic()
    self.tty = False
    self._noted_models = self._noted_states = 0   # monitor changes already in the event log
    self._resized = False
    self._groups: set[int] = set()   # process groups of every child started (each leads its own)

  # -- bookkeeping -------------------------------------------------------------------------------------
  def note(self, text: str, elapsed: float) -> None:
    line = f"[{elapsed:6.1f}s] {text}"
    self.events.append(line)
    if not self.tty:
      print(line, file=self.out, flush=True)

  def _settled(self, p: ManagedProcess, now: float) -> bool:
    """A dependency is settled once it is ready, cannot run, or had READY_TIMEOUT_S to get ready."""
    return p.ready or p.state in ("missing", "crashed", "disabled") or \
      (p.state == "running" and now - p.started_at > READY_TIMEOUT_S)

  def _update_ready(self, now: float, elapsed: float) -> None:
    for p in self.procs:
      if p.running and not p.ready:
        services = self.owned.get(p.name, [])
        probe = p.cfg.ready_check
        if all(self.monitor.seen_since(s, p.started_at) for s in services) and (probe is None or probe(self.opts)):
          p.ready = True
          self.note(f"{p.name} ready (pid {p.pid}, {now - p.started_at:.1f} s)", elapsed)

  def _ensure_running(self, now: float, elapsed: float, env: dict) -> None:
    for p in self.procs:
      should = p.cfg.should_run(self.opts)
      if not should:
        if p.running:
          p.stop(block=False)
        p.state = "disabled" if not p.running else p.state
        continue
      # p.proc set: running, or exited since _poll_exits looked; the next poll notes that exit before any restart
      if p.state in ("missing", "crashed") or p.proc is not None:
        continue
      if p.state == "backoff" and not p.due_for_restart(now):
        continue
      deps = [self.by_name[d] for d in p.cfg.after if d in self.by_name]
      if not all(self._settled(d, now) for d in deps):
        continue
      was = p.state
      if p.start(env, self.opts):
        self._groups.add(p.pid)
        if was == "backoff":
          p.restarts += 1
          self.note(f"{p.name} restarted (pid {p.pid}, restart #{p.restarts})", elapsed)
        else:
          self.note(f"{p.name} started (pid {p.pid})", elapsed)
      else:
        self.note(p.log[-1], elapsed)

  def _poll_exits(self, now: float, elapsed: float) -> None:
    for p in self.procs:
      kind = p.poll(now)
      if kind is not None:
        error = f": {p.last_error}" if kind == "crash" and p.last_error else ""
        self.note(f"{p.name} {'exited' if kind == 'expected' else 'CRASHED'} (code {p.exit_code}){error}; "
                  f"{'restart in %.1f s' % (p.next_start - now) if p.state == 'backoff' else 'not restarting'}",
                  elapsed)

  def _note_changes(self) -> None:
    """Road model and selfdrive state changes the monitor saw go to the event log, with their whole reasons."""
    mon = self.monitor
    for t, (name, why), dropped in mon.road_models[self._noted_models:]:
      self.note(f"road model: {name or '?'}" + (f" (fallback: {why})" if why else "")
                + (f"; {dropped} frames dropped in the switch" if dropped else ""), t - self.started)
    self._noted_models = len(mon.road_models)
    for i, (t, state, events, reasons) in enumerate(mon.selfdrive_states[self._noted_states:], self._noted_states):
      told = "; ".join(f"{e}: {reasons[e]}" if reasons.get(e) else e for e in events)
      startup = " (the start-up state, before every input arrives)" if i == 0 and state == "disabled" else ""
      self.note(f"selfdrive: {state}{startup}" + (f"; events: {told}" if told else ""), t - self.started)
    self._noted_states = len(mon.selfdrive_states)

  def _inject(self, inj: Injection, elapsed: float) -> None:
    self.note(f"inject: {inj.describe()}", elapsed)
    if inj.kind in ("amd", "cl"):
      faults.inject(inj.target, "USB+AMD" if inj.kind == "amd" else "CL")
      return
    p = self.by_name[inj.target]
    if not p.running:
      self.note(f"inject: {p.name} is not running; nothing to do", elapsed)
      return
    if inj.kind == "kill":
      p.kill(expected=True)
    else:   # a restart we ask for: stop (SIGINT, then SIGKILL after 5 s), counted as injected, start again at once
      p.restart()

  def _publish_state(self, pm) -> None:
    msg = new_message("managerState", valid=True)
    procs = msg.managerState.init("processes", len(self.procs))
    for entry, p in zip(procs, self.procs):
      entry.name = p.name
      entry.pid = p.pid or 0
      entry.running = p.running
      entry.shouldBeRunning = p.state not in ("disabled", "missing")
      entry.exitCode = p.exit_code or 0
      entry.restarts = p.restarts
    pm.send("managerState", msg)

  def _check_rates(self, measured: float) -> list[str]:
    """Services of running processes that missed their rate over the measured window."""
    failures = []
    tol = self.opts.rate_tolerance
    for p in self.procs:
      if p.state in ("missing", "disabled"):
        continue
      for s in self.owned.get(p.name, []):
        expected = self.monitor.stats[s].expected_hz
        count, want = self.monitor.stats[s].window_count, expected * measured
        # one message of slack at each end of the window, so slow services are not judged on rounding
        if not (1 - tol) * want - 1 <= count <= (1 + tol) * want + 1:
          failures.append(f"{s} ({p.name}): {count / measured:.1f} Hz, expected {expected:g} Hz +-{100 * tol:.0f}%")
    return failures

  def summary(self, elapsed: float, measured: float) -> tuple[str, int]:
    crashed = [p for p in self.procs if p.crashes]
    missing = [p.name for p in self.procs if p.state == "missing"]
    never_ready = [p.name for p in self.procs if p.running and not p.ready]
    usage = resource.getrusage(resource.RUSAGE_SELF)
    own_cpu = usage.ru_utime + usage.ru_stime
    mon = self.monitor
    if mon.window_start is not None:
      window = (f"rates and valid shares measured over the last {measured:.1f} s (from t={mon.window_start - self.started:.1f} s, "
                "once every process was up; the live view's valid column counts the same)")
    elif self.all_up_at is not None:
      window = (f"every process was up at t={self.all_up_at:.1f} s but the run ended within the {WARMUP_AFTER_READY_S:g} s "
                "before rates are measured, so rates and valid shares are over the whole run")
    else:
      window = "the stack never came up, so rates and valid shares are over the whole run"
    lines = [f"summary: ran {elapsed:.1f} s, {window}; "
             f"the manager itself used {own_cpu:.1f} s CPU ({100 * own_cpu / max(elapsed, 1e-9):.0f}% of a core)"]
    for p in self.procs:
      lines.append(f"  {p.name:<18} {p.state:<9} restarts {p.restarts}  crashes {p.crashes}  "
                   f"injected exits {p.expected_exits}" + (f"  last error: {p.last_error}" if p.crashes else ""))
    windowed = mon.window_start is not None
    for name, st in mon.stats.items():
      if st.expected_hz > 0 and st.total:
        share = mon.valid_share(name, window=windowed)
        hz = mon.window_rate(name) if windowed else mon.rate(name)
        lines.append(f"  {name:<24} {hz:6.1f} Hz (expect {st.expected_hz:g})  "
                     f"valid {'-' if share is None else f'{100 * share:.0f}%'}"
                     + (f"  BELOW {100 * VALID_OK:.0f}% VALID" if mon.valid_low(name, window=windowed) else ""))
    for t, (name, why), dropped in mon.road_models:
      lines.append(f"  road model at {t - self.started:5.1f} s: {name or '?'}" + (f" (fallback: {why})" if why else "")
                   + (f"; {dropped} frames dropped in the switch" if dropped else ""))
    if mon.model_frames_dropped:
      lines.append(f"  modelV2 frames dropped over the run: {mon.model_frames_dropped}")
    changes = mon.selfdrive_states
    for i, (t, state, events, reasons) in enumerate(changes[:SUMMARY_CHANGES]):
      told = "; ".join(f"{e}: {cut_words(reasons[e], 100)}" if reasons.get(e) else e for e in events)
      # selfdrived starts disabled with an event per input not yet arriving: normal on every run, so say so
      startup = " (the start-up state, before every input arrives)" if i == 0 and state == "disabled" else ""
      lines.append(f"  selfdrive at {t - self.started:5.1f} s: {state}{startup}" + (f"  events: {told}" if told else ""))
    if len(changes) > SUMMARY_CHANGES:
      lines.append(f"  ... {len(changes) - SUMMARY_CHANGES} more selfdrive state changes (see --summary-json)")
    if missing:
      lines.append(f"  not started (module missing): {', '.join(missing)}")
    failures = [f"{p.name} crashed {p.crashes}x (last error: {p.last_error})" for p in crashed]
    failures += [f"{name} never ready (an owned service never published)" for name in never_ready]
    failures += self.rate_failures
    lines += [f"  FAIL {f}" for f in failures] if failures else ["  OK: no crashes, every process ready, every service at rate"]
    self.report = {
      "elapsed_s": elapsed, "measured_s": measured, "manager_cpu_s": own_cpu, "failures": failures, "missing": missing,
      "processes": {p.name: {"state": p.state, "ready": p.ready, "restarts": p.restarts, "crashes": p.crashes,
                             "injected_exits": p.expected_exits, "last_error": p.last_error} for p in self.procs},
      "services": {name: {"hz": mon.window_rate(name) if windowed else mon.rate(name), "expected_hz": st.expected_hz,
                          "count": st.total, "valid_share": mon.valid_share(name, window=windowed),
                          "valid_low": mon.valid_low(name, window=windowed)}
                   for name, st in mon.stats.items()},
      "selfdrive_states": [{"t": t - self.started, "state": state, "events": list(events), "reasons": reasons}
                           for t, state, events, reasons in mon.selfdrive_states],
      "road_models": [{"t": t - self.started, "model": name, "fallback_reason": why, "frames_dropped": dropped}
                      for t, (name, why), dropped in mon.road_models],
      "model_frames_dropped": mon.model_frames_dropped,
      "events": self.events,
    }
    return "\n".join(lines), (1 if failures else 0)

  # -- main loop ---------------------------------------------------------------------------------------
  def run(self) -> int:
    """Own the namespace, run the stack in it, remove it. NamespaceBusy / NamespaceUnusable if it is not ours."""
    self.tty = self.out.isatty() and not self.opts.no_view
    try:
      given = namespace_prefix()
    except ValueError as e:   # OPENPILOT_PREFIX that is not one path component
      raise UsageError(str(e)) from None
    prefix = given or f"{GENERATED_PREFIX}{os.getpid()}_{secrets.token_hex(4)}"
    try:
      owner = NamespaceOwner.acquire(prefix)
    except PermissionError as e:
      raise NamespaceUnusable(_with_fix(e)) from None
    if given:   # with the lock held no other manager can start here; pieces run by hand may already use it
      try:
        refuse_if_in_use(prefix)
      except BaseException:
        owner.release(remove=False)
        raise
    saved_env = MSGQ_ENV.get(PREFIX_ENV, None)
    saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    ours = False   # the namespace dirs were checked as ours: only then are they removed at the end
    try:
      os.environ[PREFIX_ENV] = prefix
      try:
        shm_dir(), runtime_dir()
      except PermissionError as e:
        raise NamespaceUnusable(_with_fix(e)) from None
      ours = True
      sweep_stale_namespaces()
      try:
        return self._run(prefix)
      finally:
        for sig in saved:
          signal.signal(sig, signal.SIG_IGN)   # a second Ctrl-C must not cut the cleanup short
        self.shutdown()
    finally:
      owner.release(remove=ours and not self._kept_in_use(prefix))
      if saved_env is None:
        os.environ.pop(PREFIX_ENV, None)
      else:
        os.environ[PREFIX_ENV] = saved_env
      for sig, handler in saved.items():
        signal.signal(sig, handler)

  def _kept_in_use(self, prefix: str) -> bool:
    """True (and one line saying so) if processes outside the manager still publish in the namespace (a piece
    started by hand meanwhile): removing its segments would cut it off. A reader that joined (a viewer, a
    recorder) keeps what it mapped after the files go, so it does not keep the namespace on /dev/shm."""
    try:
      live = publishers(prefix)
      deadline = time.monotonic() + 1.0
      while live and time.monotonic() < deadline:   # our own children's helpers, killed, may still be going away
        live = {pid: name for pid, name in live.items() if _group_of(pid) not in self._groups}
        if live:
          time.sleep(0.1)
          live = publishers(prefix)
    except OSError:
      live = {}
    if live:
      print(f"pymodeld-manager: {label(prefix)} left in place: still in use by {_name_users(live)}; "
            f"pymodeld-manager --clean {prefix} removes it once they stop", file=sys.stderr, flush=True)
    return bool(live)

  def shutdown(self) -> None:
    """Stop in waves, dependents before what they depend on (e.g. the logger last, so the route ends whole)."""
    remaining = list(self.procs)
    while remaining:
      needed = {d for p in remaining for d in p.cfg.after}
      wave = [p for p in remaining if p.name not in needed] or remaining
      for p in wave:
        p.stop(block=False)
      for p in wave:
        p.stop(block=True)
      remaining = [p for p in remaining if p not in wave]
    self._forward_output()
    if self.monitor is not None:
      self.monitor.close()
    if self.opts.usb_gpu:
      usb_amd.unplug()

  def _forward_output(self) -> None:
    """Children's lines go to our output as they come (off a TTY: on one, the screen shows the last errors)."""
    for p in self.procs:
      lines = p.take_output()
      if lines and not self.tty:   # the runtime's lines do not say whose they are
        print("\n".join(f"{p.name}: {ln}" if ln.startswith("runtime: ") else ln for ln in lines), file=self.out, flush=True)

  def _view_size(self) -> tuple[int, int]:
    """The terminal's (columns, rows) now; VIEW_SIZE_FALLBACK if it does not say."""
    try:
      size = os.get_terminal_size(self.out.fileno())
    except (OSError, ValueError, AttributeError):
      return VIEW_SIZE_FALLBACK
    return (size.columns or VIEW_SIZE_FALLBACK[0], size.lines or VIEW_SIZE_FALLBACK[1])

  def _run(self, prefix: str) -> int:

    def on_term(signum, frame):
      raise KeyboardInterrupt
    # SIGINT too: a manager started with SIGINT ignored (a background job of a script) must still stop on it;
    # SIGHUP (the terminal went away) is a stop like SIGTERM, with the same cleanup
    for sig in STOP_SIGNALS:
      signal.signal(sig, on_term)

    def on_resize(signum, frame):
      self._resized = True
    old_winch = signal.signal(signal.SIGWINCH, on_resize) if self.tty else None

    if self.opts.usb_gpu:
      usb_amd.plug()
    env = {**os.environ, CORES_ENV: self.opts.cores}
    self.monitor = ServiceMonitor({n: s.frequency for n, s in SERVICE_LIST.items() if n != "managerState"})
    pm = messaging.PubMaster(["managerState"], process="manager")
    cpu = CpuMeter()
    viewer = None
    if self.opts.png:
      viewer = Viewer()

    start = self.started = time.monotonic()
    next_state = next_view = next_png = start
    pending = list(self.injections)
    all_ready_at = None
    interrupted = False
    self.note(f"namespace {prefix}; camera {self.opts.camera}; processes: "
              f"{', '.join(p.name for p in self.procs)}; pinned: {self.opts.cores or 'none'}", 0.0)
    try:
      while True:
        now = time.monotonic()
        elapsed = now - start
        if self.opts.duration is not None and elapsed >= self.opts.duration:
          break
        self._poll_exits(now, elapsed)
        self._ensure_running(now, elapsed, env)
        self._forward_output()
        self.monitor.update()
        self._note_changes()
        self._update_ready(now, elapsed)
        if all_ready_at is None and all(self._settled(p, now) or p.state == "disabled" for p in self.procs):
          all_ready_at, self.all_up_at = now, elapsed
          self.note("all processes up", elapsed)
        if all_ready_at is not None and self.monitor.window_start is None and now >= all_ready_at + WARMUP_AFTER_READY_S:
          self.monitor.start_window()
        while pending and elapsed >= pending[0].at:
          self._inject(pending.pop(0), elapsed)
        if now >= next_state:
          self._publish_state(pm)
          next_state += 1.0
        if now >= next_view or self._resized:
          if self.tty:
            self._resized = False
            header = f"pymodeld manager  t={elapsed:.1f}s  camera {self.opts.camera}  namespace {prefix}"
            screen = render_screen(self.procs, self.monitor, cpu, header, self.events[-VIEW_EVENTS:], self._view_size())
            self.out.write(CLEAR + screen)   # no newline after the last row: it would scroll a full screen
            self.out.flush()
            next_view = max(next_view + 0.5, now) if now >= next_view else next_view
          else:
            print(render_line(self.procs, self.monitor, elapsed), file=self.out, flush=True)
            next_view += self.opts.status_every
        if viewer is not None and now >= next_png:
          viewer.update_and_save(self.monitor, self.opts.png)
          next_png += 2.0
        time.sleep(max(0.0, LOOP_DT - (time.monotonic() - now)))
    except KeyboardInterrupt:
      interrupted = True
      self.note("interrupted; stopping", time.monotonic() - start)
    finally:
      if old_winch is not None:
        signal.signal(signal.SIGWINCH, old_winch)
      if viewer is not None:
        try:
          viewer.update_and_save(self.monitor, self.opts.png)
        except Exception as e:   # a picture must never break the shutdown
          print(f"viewer: {e}", file=sys.stderr)
        viewer.close()

    self._poll_exits(time.monotonic(), time.monotonic() - start)
    self.monitor.update()
    elapsed = time.monotonic() - start
    measured = time.monotonic() - self.monitor.window_start if self.monitor.window_start else 0.0
    if self.monitor.window_start is None and self.all_up_at is not None:
      self.rate_failures = [f"no rate was measured: the run ended {elapsed - self.all_up_at:.1f} s after every process was up, "
                            f"within the {WARMUP_AFTER_READY_S:g} s before measuring starts (run longer)"]
    elif self.monitor.window_start is None:
      self.rate_failures = ["the stack never came up (not every process ready before the end)"]
    else:
      self.rate_failures = self._check_rates(measured)
    text, code = self.summary(elapsed, measured)
    print(("\n" if self.tty else "") + text, file=self.out, flush=True)
    if interrupted:   # stopped by a signal: the summary stands, the exit says it was cut short
      code = 130 if self.opts.duration is None else 1
    if self.opts.summary_json:
      with open(self.opts.summary_json, "w") as f:
        json.dump({**self.report, "exit_code": code, "interrupted": interrupted}, f, indent=1)
    return code


def _group_of(pid: int) -> int | None:
  try:
    with open(f"/proc/{pid}/stat") as f:
      return int(f.read().rsplit(")", 1)[1].split()[2])
  except (OSError, ValueError, IndexError):
    return None


def _name_users(live: dict[int, str]) -> str:
  return ", ".join(f"{name} (pid {pid})" for pid, name in sorted(live.items()))


def refuse_if_in_use(prefix: str) -> None:
  """NamespaceBusy, naming them, if live processes publish services of this namespace: pieces started by hand
  own those services (and camerad its camera buffers), so our children would crash on them. A process that only
  reads (a viewer, a recorder) is welcome; at exit _kept_in_use leaves the namespace to whoever still holds it."""
  live = publishers(prefix)
  if live:
    raise NamespaceBusy(prefix, f"{label(prefix)} is in use by {_name_users(live)} (started by hand?); stop them, "
                                "or use another OPENPILOT_PREFIX (unset, the manager picks a fresh one)")


def _with_fix(error: OSError) -> str:
  """A namespace dir error as one line that says how to fix it (msgq's own message may already say so)."""
  text = " ".join(str(error).split())
  return text if "remove it" in text else f"{text}: {NAMESPACE_FIX}"


def parse_args(argv=None) -> argparse.Namespace:
  names = [c.name for c in PROCESSES]
  p = Parser(
    prog="pymodeld-manager", formatter_class=argparse.RawDescriptionHelpFormatter,
    description="Run the whole pymodeld stack on synthetic (or recorded) cameras in a private bus namespace, "
                "with a live view.",
    epilog=f"""processes (start order follows readiness): {', '.join(names)}
  logger runs only with --record. A process whose module does not exist is reported and skipped.

live view: on a terminal the screen is redrawn about twice a second, fitted to the terminal's size (followed
  on a resize): processes, one line each, with state, pid, CPU, restarts and a note (a starting one's compile
  progress, e.g. "compiling 13/34 kernels", or a crashed one's last error); services with measured vs
  expected rate and share of valid (counted from when every process is up, as in the summary); model latency
  p50 per daemon and which road model runs; driver state; selfdrive state and events; and an event log with
  the whole texts the table cuts. Otherwise the processes' own lines and one status line every
  --status-every seconds are printed.

summary: printed at the end of every run (--duration, Ctrl-C, SIGTERM, SIGHUP); exit 0 only if no process
  crashed, every one got ready and every service kept its rate (130 when stopped by a signal without
  --duration, 2 for a mistake on the command line or in the setup).

namespace: OPENPILOT_PREFIX if set (outside tools can join the run), a fresh one otherwise (printed at
  start). One manager owns a namespace; its shared memory and sockets are removed at exit, and every child is
  stopped (SIGINT, SIGKILL after 5 s). E.g. OPENPILOT_PREFIX=demo pymodeld-manager, then in another terminal
  OPENPILOT_PREFIX=demo python -m selfdrive_stub.supervisor.viewer --out view.png. Pieces started by hand leave their
  namespace behind: pymodeld-manager --clean [PREFIX] removes it once nothing uses it.

scheduling: camerad is pinned to the first CPU and modeld to the last (with 2 or more), so that modeld's
  camera client is never queued behind camerad's copy of a frame; PYMODELD_CORES replaces that, e.g.
  PYMODELD_CORES='camerad=0 modeld=1 dmonitoringmodeld=1', and PYMODELD_CORES='' pins nothing.
  PYMODELD_REALTIME=1 runs camerad, modeld and dmonitoringmodeld SCHED_FIFO at the reference priorities.
  Each logs what took effect.

fault injection (--inject, repeatable; the time must fall inside --duration):
  amd-hang@10             arm a USB+AMD fault at 10 s (also amd-disconnect, amd-nan, amd-transfer_error,
                          amd-slow); needs --usb-gpu; modeld falls back to the small model
  cl-hang@10              hang the OpenCL queue at 10 s (its only fault); needs --model-device CL; modeld falls
                          back to the small model within --wait-timeout-ms (3000 ms)
  camerad-restart@5       stop and restart camerad at 5 s (any process name works)
  kill:dmonitoringmodeld@8  SIGKILL a process at 8 s; the manager restarts it

examples:
  pymodeld-manager --duration 30                  headless run, summary, exit 0 if all is well
  pymodeld-manager --camera mici --usb-gpu --inject amd-hang@10
  pymodeld-manager --model-device CL --inject cl-hang@20
  pymodeld-manager --duration 20 --record /tmp/route1
  pymodeld-manager --route /tmp/route1 --png view.png
  pymodeld-manager --clean demo                   remove what pieces run by hand left in namespace demo""")
  p.add_argument("--duration", type=float, default=None, metavar="S",
                 help="run S seconds, print a summary, exit non-zero if a process crashed or a service missed "
                      "its rate")
  p.add_argument("--camera", choices=["tici", "mici"], default=None, help="camera config (default tici, or the route's)")
  p.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the synthetic scenes and drive")
  p.add_argument("--scenario", choices=SCENARIOS, default="default",
                 help="the car stub's drive: default, or lane-change (a scripted left lane change at 2 s)")
  p.add_argument("--route", metavar="DIR", help="camerad plays the frames of this recorded route")
  p.add_argument("--usb-gpu", action="store_true", help="plug the simulated USB+AMD device: modeld runs the big model")
  p.add_argument("--model-device", choices=["CL"], default=None,
                 help="run modeld's big model on this device: CL is the OpenCL device (pocl's CPU device here; a real "
                      "GPU's OpenCL driver works the same way, the runtime takes the first GPU the loader finds). The "
                      "warp and the small standby model stay on the CPU. Refused at once without an OpenCL platform")
  p.add_argument("--inject", action="append", default=[], metavar="FAULT@SECONDS", help="inject a fault (see below)")
  p.add_argument("--record", metavar="DIR", help="run the logger: record a route (messages and frames) into DIR")
  p.add_argument("--record-cameras", default="road,wide,cabin", metavar="CAMS",
                 help="cameras whose frames --record keeps (default road,wide,cabin; '' for messages only). "
                      "Compressing three full-resolution streams costs about a core; on a busy machine the "
                      "logger skips frames it cannot keep up with and counts them in the route header")
  p.add_argument("--png", metavar="PATH", help="render the cabin and road views with predictions to PATH every 2 s")
  p.add_argument("--block", default="", metavar="NAMES", help="comma-separated process names not to run (e.g. modeld)")
  p.add_argument("--rate-tolerance", type=float, default=0.3, metavar="F",
                 help="a service passes if its measured rate is within this fraction of expected (default 0.3)")
  p.add_argument("--status-every", type=float, default=2.0, metavar="S", help="seconds between status lines when not on a TTY")
  p.add_argument("--no-view", action="store_true", help="status lines instead of the full-screen view on a TTY")
  p.add_argument("--summary-json", metavar="PATH", help="also write the summary as JSON to PATH (however the run ends)")
  p.add_argument("--clean", nargs="?", const="", default=None, metavar="PREFIX",
                 help="remove namespace PREFIX (default: OPENPILOT_PREFIX, else the default namespace) that pieces "
                      "run by hand left behind, then exit; refused while a manager owns it or a process uses it")
  opts = p.parse_args(argv)
  if opts.clean is not None:
    return opts
  opts.block = [b for b in opts.block.split(",") if b]
  unknown = [b for b in opts.block if b not in names]
  if unknown:
    p.error(f"--block: unknown process {', '.join(unknown)}; known: {', '.join(names)}")
  if opts.route:
    try:
      route = Route(opts.route)
      route_camera = route.camera
    except RouteError as e:
      p.error(str(e))
    if not route.cameras:   # recorded with --record-cameras '': camerad would have nothing to play
      p.error(f"--route {opts.route} holds no camera frames (recorded messages only); record one with frames to play it")
    if opts.camera and opts.camera != route_camera:
      p.error(f"--camera {opts.camera} does not match the route's camera {route_camera}")
    opts.camera = route_camera
  opts.camera = opts.camera or "tici"
  if opts.record:
    check_record_dir(p, opts)
  if opts.duration is not None and opts.duration <= 0:
    p.error(f"--duration must be > 0, got {opts.duration}")
  if opts.status_every <= 0 or not 0 <= opts.rate_tolerance < 1:
    p.error(f"--status-every must be > 0 and --rate-tolerance in [0, 1), got {opts.status_every} and {opts.rate_tolerance}")
  if opts.png and not os.path.isdir(os.path.dirname(os.path.abspath(opts.png))):
    p.error(f"--png {opts.png}: its directory does not exist")
  try:
    injections = [parse_injection(spec, names) for spec in opts.inject]
  except ValueError as e:
    p.error(str(e))
  late = [i for i in injections if opts.duration is not None and i.at >= opts.duration]
  if late:
    p.error(f"--inject {late[0].describe()} is past the end of the run (--duration {opts.duration:g}); "
            "inject earlier or run longer")
  if any(i.kind == "amd" for i in injections) and not opts.usb_gpu:
    p.error("a USB+AMD fault (--inject amd-...) needs --usb-gpu: without the device modeld never uses it")
  if any(i.kind == "cl" for i in injections) and opts.model_device != "CL":
    p.error("an OpenCL fault (--inject cl-hang@S) needs --model-device CL: without it modeld never uses the device")
  if opts.model_device and opts.usb_gpu:
    p.error(f"--model-device {opts.model_device} and --usb-gpu both choose the big model's device; give one")
  if opts.model_device == "CL":
    try:
      cl.platform_names()
    except DeviceUnavailable as e:
      p.error(f"--model-device CL: {e}")
  opts.cores = stack_pins()
  try:  # the camera daemons would each refuse a bad value at their start; say it once, before starting any
    for process in PRIORITIES:
      scheduling_plan(process, {**os.environ, CORES_ENV: opts.cores})
  except ValueError as e:
    p.error(str(e))
  return opts


def check_record_dir(p: argparse.ArgumentParser, opts) -> None:
  """--record's directory and cameras are checked before anything starts, with the logger's own rules (a
  private directory of this user, no route in it yet), so a bad one is one line now, not a failed run."""
  bad = [c for c in opts.record_cameras.split(",") if c and c not in CAMERAS]
  if bad:
    p.error(f"--record-cameras: unknown camera {', '.join(bad)}; known: {', '.join(CAMERAS)}")
  try:
    fd = _writable_route_dir(opts.record)
  except RouteError as e:
    p.error(f"--record {e}")
  try:
    if os.path.lexists(os.path.join(opts.record, HEADER)):
      p.error(f"--record {opts.record} already holds a route; record into a new directory")
    if not os.access(opts.record, os.W_OK | os.X_OK):
      p.error(f"--record {opts.record} is not writable by you; record into a directory of your own")
  finally:
    os.close(fd)


def check_model_files(opts) -> None:
  """The model files the daemons of this run will load meet their contracts (ModelMetadataError otherwise),
  so a bad model is one line before anything starts, not a crash loop. With --usb-gpu the big model is asked
  for, so a missing one is refused like a wrong one (modeld alone would run small-only and the run say OK); so it
  is with --model-device. The compiled-code cache dir the model daemons will use is checked the same way (CacheError)."""
  if "modeld" not in opts.block:
    load_metadata(model_path("small"), contract=ROAD_CONTRACT)
    if opts.usb_gpu or opts.model_device:
      load_metadata(model_path("big"), contract=ROAD_CONTRACT)
  if "dmonitoringmodeld" not in opts.block:
    load_metadata(DM_MODEL_PATH, contract=DM_CONTRACT)
  if not {"modeld", "dmonitoringmodeld"} <= set(opts.block):   # each would refuse it at its start, at every restart
    check_cache_dir()


def clean_namespace(prefix: str | None, out=sys.stdout) -> int:
  removed = clean(prefix or None)
  where = label(prefix or None)
  print(f"{where}: removed {', '.join(removed)}" if removed else f"{where}: nothing to remove", file=out)
  return 0


def main(argv=None) -> int:
  opts = parse_args(argv)
  runtime_config.set_runtime_dir(runtime_dir)   # the USB+AMD simulator's files live in the run's namespace
  if opts.clean is not None:
    return clean_namespace(opts.clean)
  check_model_files(opts)
  try:
    from setproctitle import setproctitle
    setproctitle("manager")
  except ImportError:
    pass
  return Manager(opts).run()


def cli() -> None:
  """The pymodeld-manager entry point: a user mistake is one line and exit 2 (common.cli)."""
  run_cli("pymodeld-manager", main, errors=(NamespaceBusy, NamespaceUnusable))


if __name__ == "__main__":
  cli()
