"""Live view of a running stack: what every process and service is doing, as text.

Invariants:
- ServiceMonitor reads every service through its own non-conflating subscriber, so it counts every message
  (rates are real message counts, not SubMaster estimates) and never slows a publisher down.
- Rates are messages per second. The live rate is (n - 1) intervals over the span of the last RATE_WINDOW_S
  seconds of arrivals, stretched by any silence since the last one, so a steady service reads its true rate
  (1 Hz reads 1.0, not 1.2) and a stopped one decays to 0; the "window" counters (start_window) give the summary
  the same quantity over the whole measured run, so the two agree. Share of valid counts the Event's own
  `valid` flag, counted over ONE window for the view and the summary alike: the measured part of the run
  (start_window, once every process is up; before it the view shows "-"), and both say so; a periodic service
  below VALID_OK of valid there is flagged.
- Each selfdriveState change is kept with the events it carried and, per event, why its inputs failed as
  the monitor saw them at that moment (late, invalid with its reason, or never received); each road model
  change with the modelV2 frames that were lost across it (a fallback's gap).
- Rendering is pure: render_screen / render_line take a snapshot and return text; the manager decides where
  it goes (a redrawn terminal screen on a TTY, one compact line otherwise).
- A screen fits the terminal it is given (columns x rows): no line is wider than the columns, and there are
  never more lines than rows. The header and the process table (one line per process) are always shown; the
  other sections are shortened or dropped in a fixed order when rows run out, and the event log takes the
  rows left. A long text is cut with an ellipsis in its table cell; the event log shows it whole (wrapped).
  A child's text is shown without its control characters (it must not drive the terminal).
- A process that is not ready yet says why in its row: the runtime's compile progress ("compiling 13/34
  kernels") or else the last line it printed.
"""
from __future__ import annotations

import os
import re
import statistics
import time
import unicodedata
from collections import deque
from dataclasses import dataclass, field
from cereal import messaging
from selfdrive_stub.consumers.selfdrived import MODEL_SERVICES

RATE_WINDOW_S = 5.0
VALID_OK = 0.95      # a service with a lower share of valid messages is flagged
LATE_PERIODS = 10    # SubMaster's alive rule: a service is late after 10 of its periods without a message
LATE_MIN_S = 0.3     # ... but never judged finer than the monitor's own polling (about 0.1 s) allows
RECENT_INVALID_S = 1.0  # an invalid message this recent still explains an event whose state change is read after it
MAX_CHANGES = 1000   # state / model changes kept per run (a flapping state must not grow memory forever)
LATENCY_SAMPLES = 200
EVENT_ROWS_MIN = 4   # rows the event log keeps (its title and three lines) before optional sections are added
# the runtime's compile progress on a child's stderr (runtime/compiler.py compile_many)
COMPILE_PROGRESS = re.compile(r"runtime: compiled (\d+)/(\d+) (\w+)")
# daemon -> service that carries its per-frame stageTimings and timestamps
MODEL_OUTPUTS = {"modeld": "modelV2", "dmonitoringmodeld": "driverStateV2"}
VIEW_SERVICES = ("modelV2", "driverStateV2", "driverMonitoringState", "selfdriveState", "extrinsicsCalibration",
                 "carState", "managerState")
# selfdrived event -> the inputs whose state explains it (selfdrive_stub/consumers/selfdrived.py collect_events)
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
  last_sent_ns: int = 0               # the newest logMonoTime seen (CLOCK_MONOTONIC ns, the publisher's clock)
  latest: object = None
  last_valid: bool = True
  last_reason: str = ""
  invalid_at: float = float("-inf")   # when the newest invalid message arrived, and its reason: a one-frame
  invalid_reason: str = ""            # invalid (a dropped frame) is over before the state change is explained


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
    self.created = clock()
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
    st.last_sent_ns = max(st.last_sent_ns, evt.logMonoTime)
    ok = bool(evt.valid)
    st.valid += ok
    st.last_valid, st.last_reason = ok, "" if ok else str(evt.invalidReason)[:200]
    if not ok:
      st.invalid_at, st.invalid_reason = now, st.last_reason
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
      elif now - st.invalid_at <= RECENT_INVALID_S:
        why.append(f"{service} was invalid for a moment ({st.invalid_reason or 'no reason given'})")
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

  def window_label(self) -> str:
    """Which messages the valid shares count (the view's column and the summary say the same)."""
    if self.window_start is None:
      return "valid: counted once every process is up"
    return f"valid: since t={self.window_start - self.created:.0f} s, as the summary"

  def valid_low(self, name: str, window: bool = False) -> bool:
    """A periodic service with messages whose share of valid ones is below VALID_OK."""
    share = self.valid_share(name, window)
    return self.stats[name].expected_hz > 0 and share is not None and share < VALID_OK

  def valid_share(self, name: str, window: bool = False) -> float | None:
    st = self.stats[name]
    count, valid = (st.window_count, st.window_valid) if window else (st.total, st.valid)
    return valid / count if count else None

  def seen_since(self, name: str, t: float) -> bool:
    """A message of `name` was sent after monotonic time t (seconds). By send time, not by when it was drained:
    a message the previous incarnation of a restarted process sent, drained after the restart, is not a sign
    that the new one is up."""
    return self.stats[name].last_sent_ns > t * 1e9

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


def _printable(text: str) -> str:
  """text without control characters (tabs and the like become spaces): a child's line must not move the cursor
  or clear the screen."""
  return "".join(" " if unicodedata.category(c)[0] == "C" else c for c in text)


def _char_width(c: str) -> int:
  if unicodedata.combining(c):
    return 0
  return 2 if unicodedata.east_asian_width(c) in ("W", "F") else 1


def text_width(text: str) -> int:
  """Terminal columns of text (wide characters take two, combining ones none)."""
  return sum(_char_width(c) for c in text)


def fit(text: str, width: int) -> str:
  """text in at most `width` terminal columns, cut with an ellipsis when longer."""
  text = _printable(text)
  if text_width(text) <= width:
    return text
  out, used = [], 0
  for c in text:
    w = _char_width(c)
    if used + w > width - 1:
      break
    out.append(c)
    used += w
  return "".join(out) + "\u2026"


def wrap(text: str, width: int, indent: str = "  ") -> list[str]:
  """text whole, in lines of at most `width` columns (continuations indented); a word longer than a line is split."""
  words, lines, line = _printable(text).split(), [], ""
  for word in words:
    candidate = f"{line} {word}" if line else word
    if text_width(candidate) <= width or not line.strip():
      line = candidate
    else:
      lines.append(line)
      line = indent + word
    while text_width(line) > width:   # one word wider than the line: split it where the line ends
      head, used = "", 0
      for c in line:
        if used + _char_width(c) > width:
          break
        head += c
        used += _char_width(c)
      lines.append(head)
      line = indent + line[len(head):]
  if line.strip():
    lines.append(line)
  return lines


def process_note(p) -> str:
  """Why a process is where it is: compile progress while the runtime compiles, the last line a starting one
  printed, or the last error of one that crashed."""
  tail = getattr(p, "tail", ())
  last = tail[-1] if tail else ""
  m = COMPILE_PROGRESS.match(last)
  if p.running and m and int(m.group(1)) < int(m.group(2)):
    return f"compiling {m.group(1)}/{m.group(2)} {m.group(3)}"
  if p.running and not p.ready:
    if m:
      return f"compiled {m.group(2)} {m.group(3)}"
    return last.removeprefix(f"{p.name}: ")
  if not p.running and getattr(p, "crashes", 0) and getattr(p, "last_error", ""):
    return p.last_error
  return ""


def process_rows(procs, cpu: CpuMeter, width: int | None = None) -> list[str]:
  """One line per process; the manager's own names (never the kernel's 15-byte comm), the note cut to width."""
  name_w = max([17, *(len(p.name) for p in procs)])
  rows = [f"{'process':<{name_w}} {'state':<9} {'pid':>7} {'cpu%':>4} {'restarts':>8} {'exit':>4}  note"]
  for p in procs:
    load = cpu.percent(p.pid) if p.running else None
    state = ("ready" if p.ready else "starting") if p.running else p.state
    head = (f"{p.name:<{name_w}} {state:<9} {p.pid or '-':>7} {'-' if load is None else f'{load:.0f}':>4} "
            f"{p.restarts:>8} {'' if p.exit_code is None else p.exit_code:>4}  ")
    note = process_note(p)
    if width is not None:
      note = fit(note, max(0, width - len(head))) if len(head) < width else ""
    rows.append((head + _printable(note)).rstrip())
  return rows


def _service_flag(mon: ServiceMonitor, name: str, st: ServiceStats) -> str:
  flag = ""
  if st.expected_hz > 0 and st.total and mon.rate(name) < 0.8 * st.expected_hz:
    flag = "  LOW"
  if mon.valid_low(name, window=True):
    flag += f"  <{100 * VALID_OK:.0f}% valid"
  return flag


def _service_header(mon: ServiceMonitor) -> str:
  return f"{'service':<24} {'Hz':>7} {'expect':>7} {'valid':>6} {'count':>7}  ({mon.window_label()})"


def _service_row(mon: ServiceMonitor, name: str, st: ServiceStats) -> str:
  return (f"{name:<24} {mon.rate(name):7.1f} {st.expected_hz:7.1f} {_fmt_share(mon.valid_share(name, window=True)):>6} "
          f"{st.total:>7}{_service_flag(mon, name, st)}")


def service_rows(mon: ServiceMonitor) -> list[str]:
  """Every service: live rate (last RATE_WINDOW_S), expected rate, share of valid (the summary's window), count."""
  return [_service_header(mon)] + [_service_row(mon, name, st) for name, st in mon.stats.items()]


def compact_service_rows(mon: ServiceMonitor, rows: int) -> list[str]:
  """The services in at most `rows` lines (rows >= 1): a count line, then the flagged ones."""
  flagged = [(n, st) for n, st in mon.stats.items() if _service_flag(mon, n, st)]
  silent = sum(1 for st in mon.stats.values() if st.expected_hz > 0 and not st.total)
  head = (f"services: {len(mon.stats) - len(flagged) - silent} of {len(mon.stats)} fine, {len(flagged)} flagged, "
          f"{silent} not yet seen ({mon.window_label()})")
  shown = flagged[:max(0, rows - 1)]
  if len(shown) < len(flagged):
    shown = flagged[:max(0, rows - 2)]
    return [head] + [_service_row(mon, n, st) for n, st in shown] + [f"  ... {len(flagged) - len(shown)} more flagged"]
  return [head] + [_service_row(mon, n, st) for n, st in shown]


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


def _event_log(events, width: int, rows: int) -> list[str]:
  """The newest events that fit in `rows` lines, each whole (wrapped), under a title line."""
  if rows <= 0:
    return []
  out: list[str] = []
  for event in reversed(list(events)):
    lines = wrap(event, width)
    if len(out) + len(lines) > rows - 1:
      if not out:   # the newest alone is longer than the log: its start, cut
        out = lines[:rows - 2] + [fit(" ".join(lines[rows - 2:]), width)] if rows > 1 else []
      break
    out = lines + out
  return [fit("events (newest last; whole texts here):", width)] + out


def render_screen(procs, mon: ServiceMonitor, cpu: CpuMeter, header: str, events=(), size: tuple[int, int] | None = None) -> str:
  """The screen for a terminal of size (columns, rows), or unbounded (every section in full) when size is None.

  Order on screen: header, processes, services, model daemons, driver, selfdrive, event log. When rows are short,
  the optional sections are added by priority (selfdrive line, model daemons, services in full or compact,
  driver line) while the event log keeps EVENT_ROWS_MIN rows; the event log then takes what is left."""
  cols, rows = size if size is not None else (10**6, 10**6)
  width = max(20, cols - 1)   # the last column stays free: a terminal without deferred wrap would scroll
  fixed = [header] + process_rows(procs, cpu, width if size is not None else None)
  full = ([""] + service_rows(mon) + [""] + model_rows(mon) + ["", driver_line(mon), selfdrive_line(mon)])
  if size is None or len(fixed) + len(full) + EVENT_ROWS_MIN + 1 <= rows:
    body = fixed + full + ([""] if events else [])
  else:
    avail = rows - len(fixed) - min(EVENT_ROWS_MIN, max(0, rows - len(fixed)))
    chosen: dict[str, list[str]] = {}
    for key, block in (("selfdrive", [selfdrive_line(mon)]), ("model", model_rows(mon)),
                       ("services", service_rows(mon)), ("driver", [driver_line(mon)])):
      if key == "services" and len(block) > avail - 1:   # one row left for the driver line if it can be had
        block = compact_service_rows(mon, max(1, avail - 1)) if avail > 1 else []
      if block and len(block) <= avail:
        chosen[key] = block
        avail -= len(block)
    body = fixed + [line for key in ("services", "model", "driver", "selfdrive") for line in chosen.get(key, [])]
  body = [fit(line, width).rstrip() for line in body[:rows]]
  return "\n".join(body + _event_log(events, width, rows - len(body)) if size is not None else
                   body + ([fit("events:", width)] + list(events) if events else []))


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
