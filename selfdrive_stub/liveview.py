"""Live view of a running stack: what every process and service is doing, as text.

Invariants:
- ServiceMonitor reads every service through its own non-conflating subscriber, so it counts every message
  (rates are real message counts, not SubMaster estimates) and never slows a publisher down.
- Rates are messages per second. The live rate is (n - 1) intervals over the span of the last RATE_WINDOW_S
  seconds of arrivals, stretched by any silence since the last one, so a steady service reads its true rate
  (1 Hz reads 1.0, not 1.2) and a stopped one decays to 0; the "window" counters (start_window) give the summary
  the same quantity over the whole measured run, so the two agree. Share of valid counts the Event's own
  `valid` flag; a periodic service below VALID_OK of valid is flagged.
- Each selfdriveState change is kept with the events it carried and, per event, why its inputs failed as
  the monitor saw them at that moment (late, invalid with its reason, or never received); each road model
  change with the modelV2 frames that were lost across it (a fallback's gap).
- Rendering is pure: render_screen / render_line take a snapshot and return text; the manager decides where
  it goes (a redrawn terminal screen on a TTY, one compact line otherwise).
"""
from __future__ import annotations

import os
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from cereal import messaging
from selfdrive_stub.selfdrived import MODEL_SERVICES

RATE_WINDOW_S = 5.0
VALID_OK = 0.95      # a service with a lower share of valid messages is flagged
LATE_PERIODS = 10    # SubMaster's alive rule: a service is late after 10 of its periods without a message
LATE_MIN_S = 0.3     # ... but never judged finer than the monitor's own polling (about 0.1 s) allows
MAX_CHANGES = 1000   # state / model changes kept per run (a flapping state must not grow memory forever)
LATENCY_SAMPLES = 200
# daemon -> service that carries its per-frame stageTimings and timestamps
MODEL_OUTPUTS = {"modeld": "modelV2", "dmonitoringmodeld": "driverStateV2"}
VIEW_SERVICES = ("modelV2", "driverStateV2", "driverMonitoringState", "selfdriveState", "extrinsicsCalibration",
                 "carState", "managerState")
# selfdrived event -> the inputs whose state explains it (selfdrive_stub/selfdrived.py collect_events)
EVENT_INPUTS = {
  "modeldLagging": MODEL_SERVICES, "modelInvalid": MODEL_SERVICES, "bigModelLoading": ("modelV2",),
  "bigModelFailed": ("modelV2",), "driverMonitoringUnavailable": ("driverMonitoringState", "driverStateV2"),
  "calibrationInvalid": ("extrinsicsCalibration",), "calibrationIncomplete": ("extrinsicsCalibration",),
  "commIssue": ("carState",),
}


@dataclass
class ServiceStats:
  expected_hz: float
  arrivals: deque = field(default_factory=deque)
  total: int = 0
  valid: int = 0
  malformed: int = 0
  window_count: int = 0
  window_valid: int = 0
  last_recv: float = 0.0
  latest: object = None
  last_valid: bool = True
  last_reason: str = ""


def _note_change(changes: list, t: float, key, *extra) -> bool:
  """Append (t, key, *extra) if key differs from the last entry's (and the list is not full)."""
  if (not changes or changes[-1][1] != key) and len(changes) < MAX_CHANGES:
    changes.append((t, key, *extra))
    return True
  return False


class ServiceMonitor:
  """Counts, validity and the latest message of every service; model latency per daemon."""

  def __init__(self, services: dict[str, float], clock=time.monotonic):
    self._messaging = messaging
    self.clock = clock
    self.stats = {name: ServiceStats(hz) for name, hz in services.items()}
    self.socks = {name: messaging.sub_sock(name, conflate=False) for name in services}
    self.latency_ms = {d: deque(maxlen=LATENCY_SAMPLES) for d in MODEL_OUTPUTS}      # frame end -> published
    self.stage_ms = {d: deque(maxlen=LATENCY_SAMPLES) for d in MODEL_OUTPUTS}        # sum of stageTimings
    self.window_start: float | None = None
    # (time, (modelName, fallbackReason), modelV2 frames lost across the change) at each change
    self.road_models: list[tuple[float, tuple[str, str], int]] = []
    # (time, selfdriveState.state, its events, {event: why}) at each change of state
    self.selfdrive_states: list[tuple[float, str, tuple[str, ...], dict[str, str]]] = []
    self.model_frames_dropped = 0     # modelV2 frame ids skipped over the run (a camerad restart is not a skip)
    self._last_model_frame: int | None = None
    self._unexplained: list[int] = []

  def update(self) -> None:
    now = self.clock()
    for name, sock in self.socks.items():
      st = self.stats[name]
      for raw in self._messaging.drain_sock_raw(sock):
        try:
          evt = self._messaging.log_from_bytes(raw, service=name)
        except self._messaging.MessageDecodeError:
          st.malformed += 1
          continue
        self._record(name, st, evt, now)
      while st.arrivals and st.arrivals[0] < now - RATE_WINDOW_S:
        st.arrivals.popleft()
    for i in self._unexplained:
      t, state, events, _ = self.selfdrive_states[i]
      self.selfdrive_states[i] = (t, state, events, {e: self.explain(e, now) for e in events})
    self._unexplained.clear()

  def _record(self, name: str, st: ServiceStats, evt, now: float) -> None:
    st.total += 1
    st.arrivals.append(now)
    st.last_recv = now
    ok = bool(evt.valid)
    st.valid += ok
    st.last_valid, st.last_reason = ok, "" if ok else str(evt.invalidReason)[:200]
    if self.window_start is not None:
      st.window_count += 1
      st.window_valid += ok
    if name in VIEW_SERVICES:
      st.latest = evt
    if name == "selfdriveState":
      s = evt.selfdriveState
      events = tuple(str(e) for e in s.events)
      if _note_change(self.selfdrive_states, now, str(s.state), events, {}):
        self._unexplained.append(len(self.selfdrive_states) - 1)   # explained once every input is drained
    self._record_latency(name, evt)

  def explain(self, event: str, now: float | None = None) -> str:
    """Why a selfdrived event is active, from what its inputs looked like here: '' if they look fine."""
    now = self.clock() if now is None else now
    model = self.stats["modelV2"].latest if "modelV2" in self.stats else None
    if event == "bigModelFailed" and model is not None and model.modelV2.fallbackReason:
      return f"modelV2 fallback: {model.modelV2.fallbackReason}"
    why = []
    for service in EVENT_INPUTS.get(event, ()):
      st = self.stats.get(service)
      if st is None:
        continue
      if not st.total:
        why.append(f"{service} never received")
      elif st.expected_hz > 0 and now - st.last_recv > max(LATE_PERIODS / st.expected_hz, LATE_MIN_S):
        why.append(f"{service} late ({now - st.last_recv:.1f} s since the last)")
      elif not st.last_valid:
        why.append(f"{service} invalid ({st.last_reason or 'no reason given'})")
    return ", ".join(why)

  def _record_latency(self, name: str, evt) -> None:
    for daemon, service in MODEL_OUTPUTS.items():
      if service != name:
        continue
      body = getattr(evt, name)
      eof = body.timestampEof
      if eof and evt.logMonoTime >= eof:
        self.latency_ms[daemon].append((evt.logMonoTime - eof) / 1e6)
      t = body.stageTimings
      self.stage_ms[daemon].append(t.uploadMs + t.warpMs + t.modelMs + t.readbackMs + t.parseMs)
      if name == "modelV2":
        frame, last = body.frameId, self._last_model_frame
        gap = frame - last - 1 if last is not None and frame > last + 1 else 0
        self.model_frames_dropped += gap
        self._last_model_frame = frame
        _note_change(self.road_models, self.clock(), (str(body.modelName), str(body.fallbackReason)), gap)

  def start_window(self) -> None:
    self.window_start = self.clock()
    for st in self.stats.values():
      st.window_count = st.window_valid = 0

  def window_rate(self, name: str) -> float:
    if self.window_start is None:
      return 0.0
    elapsed = self.clock() - self.window_start
    return self.stats[name].window_count / elapsed if elapsed > 0 else 0.0

  def rate(self, name: str) -> float:
    """Messages per second over the last RATE_WINDOW_S (see the module invariants)."""
    st = self.stats[name]
    n = len(st.arrivals)
    if n < 2:
      return 0.0
    span = st.arrivals[-1] - st.arrivals[0]
    if span <= 0:
      return 0.0
    silence = self.clock() - st.arrivals[-1]
    return (n - 1) / (span + max(0.0, silence - span / (n - 1)))

  def valid_low(self, name: str, window: bool = False) -> bool:
    """A periodic service with messages whose share of valid ones is below VALID_OK."""
    share = self.valid_share(name, window)
    return self.stats[name].expected_hz > 0 and share is not None and share < VALID_OK

  def valid_share(self, name: str, window: bool = False) -> float | None:
    st = self.stats[name]
    count, valid = (st.window_count, st.window_valid) if window else (st.total, st.valid)
    return valid / count if count else None

  def seen_since(self, name: str, t: float) -> bool:
    return self.stats[name].last_recv > t

  def latest(self, name: str):
    st = self.stats.get(name)
    return st.latest if st is not None else None

  def close(self) -> None:
    for sock in self.socks.values():
      close = getattr(sock, "close", None)
      if close:
        close()
    self.socks.clear()


class CpuMeter:
  """CPU share of a pid from /proc/<pid>/stat deltas (user + system, 1.0 = one core)."""

  def __init__(self):
    self._last: dict[int, tuple[float, float]] = {}
    self._tick = os.sysconf("SC_CLK_TCK")

  def percent(self, pid: int | None) -> float | None:
    if pid is None:
      return None
    try:
      with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
      return None
    cpu_s = (int(fields[11]) + int(fields[12])) / self._tick
    now = time.monotonic()
    last = self._last.get(pid)
    self._last[pid] = (now, cpu_s)
    if last is None or now <= last[0]:
      return None
    return 100.0 * (cpu_s - last[1]) / (now - last[0])


def _p50(values) -> str:
  return f"{statistics.median(values):5.1f}" if values else "    -"


def _fmt_share(share: float | None) -> str:
  return "  -" if share is None else f"{100 * share:3.0f}%"


def _cut(text: str, n: int = 70) -> str:
  return text if len(text) <= n else text[:n - 3] + "..."


def process_rows(procs, cpu: CpuMeter) -> list[str]:
  rows = [f"{'process':<18} {'state':<9} {'pid':>7} {'cpu%':>6} {'restarts':>8}  exit  last error"]
  for p in procs:
    load = cpu.percent(p.pid) if p.running else None
    state = "ready" if p.running and p.ready else p.state
    error = _cut(p.last_error) if getattr(p, "crashes", 0) and getattr(p, "last_error", "") else ""
    rows.append(f"{p.name:<18} {state:<9} {p.pid or '-':>7} {'-' if load is None else f'{load:.0f}':>6} "
                f"{p.restarts:>8}  {'' if p.exit_code is None else p.exit_code:<4}  {error}".rstrip())
  return rows


def service_rows(mon: ServiceMonitor) -> list[str]:
  rows = [f"{'service':<24} {'Hz':>7} {'expect':>7} {'valid':>6} {'count':>7}"]
  for name, st in mon.stats.items():
    hz = mon.rate(name)
    flag = ""
    if st.expected_hz > 0 and st.total and hz < 0.8 * st.expected_hz:
      flag = "  LOW"
    if mon.valid_low(name):
      flag += f"  <{100 * VALID_OK:.0f}% valid"
    rows.append(f"{name:<24} {hz:7.1f} {st.expected_hz:7.1f} {_fmt_share(mon.valid_share(name)):>6} "
                f"{st.total:>7}{flag}")
  return rows


def model_rows(mon: ServiceMonitor) -> list[str]:
  rows = [f"{'model daemon':<18} {'p50 ms (frame->msg)':>20} {'p50 ms (stages)':>16}  model"]
  for daemon in MODEL_OUTPUTS:
    name = ""
    if daemon == "modeld" and mon.latest("modelV2") is not None:
      m = mon.latest("modelV2").modelV2
      name = m.modelName or "?"
      if m.fallbackReason:
        name += f" (fallback: {m.fallbackReason})"
    rows.append(f"{daemon:<18} {_p50(mon.latency_ms[daemon]):>20} {_p50(mon.stage_ms[daemon]):>16}  {name}")
  return rows


def driver_line(mon: ServiceMonitor) -> str:
  parts = []
  ds = mon.latest("driverStateV2")
  if ds is not None:
    d = ds.driverStateV2
    side = d.rightDriverData if d.wheelOnRightProb > 0.5 else d.leftDriverData
    parts.append(f"face {side.faceProb:.2f}")
  dm = mon.latest("driverMonitoringState")
  if dm is not None:
    s = dm.driverMonitoringState
    v = s.visionPolicyState
    parts.append(f"distracted {'yes' if v.isDistracted else 'no'}  awareness {v.awarenessPercent}%  "
                 f"alert {s.alertLevel}")
    if len(s.events):
      parts.append("events " + ",".join(s.events))
  return "driver: " + ("  ".join(parts) if parts else "(no driver monitoring yet)")


def selfdrive_line(mon: ServiceMonitor) -> str:
  parts = []
  cal = mon.latest("extrinsicsCalibration")
  if cal is not None:
    c = cal.extrinsicsCalibration
    parts.append(f"calib {c.calStatus} {c.calPerc}%")
  cs = mon.latest("carState")
  if cs is not None:
    parts.append(f"v {cs.carState.vEgo:4.1f} m/s")
  sd = mon.latest("selfdriveState")
  if sd is None:
    return "selfdrive: (no selfdriveState yet)" + ("  " + "  ".join(parts) if parts else "")
  s = sd.selfdriveState
  parts.insert(0, f"state {s.state} enabled {s.enabled} engageable {s.engageable}")
  if s.alertText1:
    parts.append(f"alert '{s.alertText1}'")
  if len(s.events):
    parts.append("events " + ",".join(s.events))
  return "selfdrive: " + "  ".join(parts)


def render_screen(procs, mon: ServiceMonitor, cpu: CpuMeter, header: str) -> str:
  lines = [header, ""]
  lines += process_rows(procs, cpu) + [""] + service_rows(mon) + [""] + model_rows(mon) + [""]
  lines += [driver_line(mon), selfdrive_line(mon)]
  return "\n".join(lines)


def render_line(procs, mon: ServiceMonitor, elapsed: float) -> str:
  """One compact status line for logs (stdout not a TTY)."""
  up = sum(1 for p in procs if p.running)
  wanted = sum(1 for p in procs if p.state != "disabled")   # a process not meant to run is not "down"
  low = [n for n, st in mon.stats.items() if st.expected_hz > 0 and st.total and mon.rate(n) < 0.8 * st.expected_hz]
  errors = "".join(f"; {p.name} crashed: {_cut(p.last_error, 100)}" for p in procs
                   if getattr(p, "crashes", 0) and getattr(p, "last_error", "") and not p.running)
  model = ""
  if mon.latest("modelV2") is not None:
    m = mon.latest("modelV2").modelV2
    model = f" road={m.modelName or '?'}" + (f" (fallback: {m.fallbackReason})" if m.fallbackReason else "")
  lat = " ".join(f"{d}={_p50(mon.latency_ms[d]).strip()}ms" for d in MODEL_OUTPUTS if mon.latency_ms[d])
  sd = mon.latest("selfdriveState")
  state = f" selfdrive={sd.selfdriveState.state}" if sd is not None else ""
  return (f"[{elapsed:6.1f}s] procs {up}/{wanted} up; low rate: {','.join(low) or 'none'}; "
          f"p50 {lat or '-'}{model}{state}{errors}")


CLEAR = "\x1b[H\x1b[2J"
