"""The replay harness: run one real daemon process on recorded routes, one deterministic step at a time.

Invariants:
- The daemon is a real subprocess in a private bus namespace with the fake/gated backend (CEREAL_FAKE=1, fake
  prefix = the process name); only `cfg.main_pub` is gated. The harness may hold several runners at once
  (chain replay, resident daemons): every socket it creates for one runner is created with that runner's
  namespace current, so runners never see each other's messages.
- A step starts only while the process is parked in its gated receive: the harness publishes the queued log
  messages (and the frames of camera states, over VisionIPC, with the logged frameId and timestamps), opens
  the gate once and waits until the process parks again. Everything it published in between is the step's
  output, stamped logMonoTime = trigger's logMonoTime + processing_time. begin_step/finish_step split a step
  so that the chain can run daemons of different namespaces at the same time.
- Resident daemons (`cfg.entry`): the process imports its module once (process_replay.resident) and runs its
  main() once per route. `launch()` starts the import early, so it overlaps with whatever the caller does
  next; the next route's start() ends main() (SIGINT, then the gate until it returns) and drops what it
  published while stopping, then starts main() from scratch in the same process.
- A daemon dies with the harness: every child starts through process_replay.resident, which asks the kernel to
  SIGKILL it when the thread that launched it dies (PR_SET_PDEATHSIG; so launch from a thread that lives as long
  as the runner), and SIGTERM ends a child at any time. A harness that is killed cannot remove its namespaces,
  named replay<pid>_<hex> after it: the first launch of a later harness removes those whose harness is gone
  (sweep_stale_namespaces).
- Frames are decoded ahead, in send order, on one background thread (zstd releases the GIL), and the next
  step's frames are copied into free VisionIPC buffers right after a gate opens (announced only at their own
  step), so decoding and copying overlap with the daemon's work instead of adding to every step.
- A process that exits, or does not park again within `cfg.timeout` s, is a ReplayError naming the process,
  the step and the tail of its output; the harness never waits without a deadline and always kills the child.
"""
from __future__ import annotations

import collections
import contextlib
import json
import os
import queue
import secrets
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import numpy as np

from cereal import log
from cereal.messaging import PubMaster, log_from_bytes, sub_sock
from cereal.route import Route
from msgq import EventTimeoutError, fake_event_handle, wait_for_one_event
from msgq.env import MSGQ_ENV
from msgq.namespace import PREFIX_ENV, Namespace, sweep_dead
from process_replay.configs import VIPC_SERVER, VISION_STREAMS, ProcessConfig
from visionipc import VisionIpcServer

VIPC_BUFFERS = 4
BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
_POLL_S = 0.05
NAMESPACE_PREFIX = "replay"   # a runner's namespace: replay<harness pid>_<hex>
_swept = False                # this process swept the namespaces of dead harnesses once


def sweep_stale_namespaces() -> list[str]:
  """Remove the namespaces (shm and runtime dirs) of harnesses that are gone: a harness that was killed could
  not remove its own, and its daemons died with it. A namespace whose harness pid is alive is never touched."""
  return sweep_dead(NAMESPACE_PREFIX)


class ReplayError(Exception):
  """The replayed process died, hung, or the route lacks what the process needs."""


class LogMessage(NamedTuple):
  log_mono_time: int
  which: str
  data: bytes


def load_messages(route: Route, seconds: float | None = None) -> list[LogMessage]:
  """The route's events as (logMonoTime, service, bytes), sorted stably by time; optionally only the first
  `seconds` of the route."""
  msgs = []
  for i, raw in enumerate(route.raw_events()):
    # only the envelope is read here (a full validating decode costs ~5x more); the daemons decode
    # every message they receive with the validating decoder
    try:
      with log.Event.from_bytes(raw) as evt:
        msgs.append(LogMessage(evt.logMonoTime, evt.which(), raw))
    except Exception as e:
      raise ReplayError(f"route {route.path}: event {i} is malformed ({e})") from None
  msgs.sort(key=lambda m: m.log_mono_time)
  if seconds is not None and msgs:
    end = msgs[0].log_mono_time + int(seconds * 1e9)
    msgs = [m for m in msgs if m.log_mono_time < end]
  return msgs


def restamp(data: bytes, log_mono_time: int) -> bytes:
  with log.Event.from_bytes(data) as evt:
    builder = evt.as_builder()
  builder.logMonoTime = log_mono_time
  return builder.to_bytes()


@dataclass
class ReplayResult:
  proc: str
  outputs: list[bytes]
  steps: int
  route_s: float          # span of the replayed log
  startup_s: float        # launch (or reset) to first gated receive
  step_s: float           # time spent stepping
  stderr_tail: str = ""
  counts: dict = field(default_factory=dict)

  @property
  def realtime_factor(self) -> float:
    """Route seconds replayed per wall second, launch included."""
    total = self.startup_s + self.step_s
    return self.route_s / total if total > 0 else float("inf")

  @property
  def step_realtime_factor(self) -> float:
    return self.route_s / self.step_s if self.step_s > 0 else float("inf")


@contextlib.contextmanager
def in_namespace(prefix: str):
  """Make `prefix` the current bus namespace for the sockets created inside the block."""
  saved = MSGQ_ENV.get(PREFIX_ENV, None)
  os.environ[PREFIX_ENV] = prefix
  try:
    yield
  finally:
    if saved is None:
      os.environ.pop(PREFIX_ENV, None)
    else:
      os.environ[PREFIX_ENV] = saved


class FramePrefetcher:
  """Decodes the frames of camera-state messages in order on a background thread; next() hands them out
  as (key, frame) and returns None once every job was handed out."""

  def __init__(self, jobs: list, depth: int = 6):
    self._queue: queue.Queue = queue.Queue(depth)
    self._stop = threading.Event()
    self._done = False
    self._thread = threading.Thread(target=self._run, args=(jobs,), name="frame-prefetch", daemon=True)
    self._thread.start()

  def _put(self, item) -> bool:
    while not self._stop.is_set():
      try:
        self._queue.put(item, timeout=0.1)
        return True
      except queue.Full:
        continue
    return False

  def _run(self, jobs) -> None:
    for key, reader, i in jobs:
      try:
        item = reader.get(i) if i is not None else None
      except Exception as e:   # handed to the consumer, which raises it at the step that needs the frame
        item = e
      if not self._put((key, item)):
        return
    self._put(None)

  def next(self, timeout: float):
    if self._done:
      return None
    try:
      item = self._queue.get(timeout=timeout)
    except queue.Empty:
      raise ReplayError(f"frame decoding produced nothing within {timeout:g} s") from None
    self._done = item is None
    return item

  def close(self) -> None:
    self._stop.set()
    self._thread.join()


class ProcessRunner:
  """One daemon under replay: launch(), then per route start(route) -> step()... -> finish_route(); stop().
  As a context manager it stops on exit. A resident (cfg.entry) keeps its process across routes."""

  def __init__(self, cfg: ProcessConfig, extra_args=(), env: dict | None = None):
    self.cfg = cfg
    self.extra_args, self.extra_env = tuple(extra_args), dict(env or {})
    self.proc: subprocess.Popen | None = None
    self.steps = 0
    self.counts: dict[str, int] = {}     # this route's outputs per service
    self.routes = 0                      # routes started in this process
    self.route: Route | None = None
    self._ns: Namespace | None = None
    self._handle = self._pm = self._vipc = self._log = None
    self._open_handles: list = []        # disabled handles of the inputs other than main_pub
    self._reply_r: int | None = None
    self._reply_buf = b""
    self._subs: dict = {}
    self._frames: dict = {}
    self._prefetch: FramePrefetcher | None = None
    self._staged: collections.deque = collections.deque()   # (key, frame, filled VisionBuf) not yet announced
    self._running = False                # main() runs (parked or stepping)
    self._stepping: LogMessage | None = None

  @property
  def resident(self) -> bool:
    return bool(self.cfg.entry)

  @property
  def key(self) -> tuple:
    """What a reused resident must match: the same daemon with the same arguments and environment."""
    return (self.cfg.name, self.cfg.entry, self.cfg.args, self.extra_args, tuple(sorted(self.extra_env.items())))

  # ---- lifecycle

  def launch(self) -> None:
    """Start the process without waiting (a resident imports its daemon now); idempotent."""
    if self.proc is not None:
      return
    global _swept
    if not _swept:
      _swept = True
      sweep_stale_namespaces()
    cfg = self.cfg
    self._ns = Namespace(f"{NAMESPACE_PREFIX}{os.getpid()}_{secrets.token_hex(4)}")
    with in_namespace(self._ns.prefix):   # creates its dirs; the caller's namespace stays current
      self._ns.__enter__()
    self._log = tempfile.TemporaryFile()
    env = {**os.environ, PREFIX_ENV: self._ns.prefix, "CEREAL_FAKE": "1", "CEREAL_FAKE_PREFIX": cfg.name,
           "REPLAY": "1",
           # a child whose harness hangs gives up at its gate instead of waiting forever (one whose harness
           # dies is killed by the kernel: process_replay.resident)
           "CEREAL_FAKE_TIMEOUT": str(max(cfg.timeout, cfg.startup_timeout) * 2),
           # one BLAS thread: the summation order (hence the last bits of float32 outputs) must not depend
           # on the caller's environment
           **dict.fromkeys(BLAS_THREAD_VARS, "1"),
           **cfg.env, **self.extra_env}
    if cfg.simulation:
      env["SIMULATION"] = "1"
    pass_fds = ()
    if self.resident:
      self._reply_r, reply_w = os.pipe2(os.O_CLOEXEC)
      os.set_inheritable(reply_w, True)
      argv = [sys.executable, "-m", "process_replay.resident", cfg.entry, str(reply_w), str(os.getpid())]
      pass_fds = (reply_w,)
      stdin = subprocess.PIPE
    else:   # the resident module only asks to die with us, then execs the daemon
      argv = [sys.executable, "-m", "process_replay.resident", "--exec", str(os.getpid()), *cfg.command, *self.extra_args]
      stdin = subprocess.DEVNULL
    try:
      self.proc = subprocess.Popen(argv, env=env, stdin=stdin, stdout=self._log, stderr=subprocess.STDOUT,
                                   start_new_session=True, pass_fds=pass_fds)
    finally:
      if pass_fds:
        os.close(pass_fds[0])

  def _ns_ctx(self):
    return in_namespace(self._ns.prefix)

  def start(self, route: Route, messages: list[LogMessage] | None = None) -> None:
    """Begin a route: its VisionIPC streams, the daemon's main(), and the wait for its first gated receive.
    `messages`: the inputs step() will be given, in order; their frames are decoded from now on."""
    cfg = self.cfg
    self.launch()
    if self._running:          # the previous route's main() still runs (reset lazily: see finish_route)
      try:
        self._end_main()
      except BaseException:
        self.stop()
        raise
    self._close_route()
    self.route, self.steps, self.counts = route, 0, {}
    with self._ns_ctx():
      if self._handle is None:
        self._handle = fake_event_handle(cfg.main_pub, identifier=cfg.name, override=True, enable=True)
        # a receive on an endpoint without a handle looks for one every time (the harness may create it
        # late); a disabled handle per other input makes those receives one flag read, and never gates them
        self._open_handles = [fake_event_handle(s, identifier=cfg.name, override=True, enable=False)
                              for s in cfg.pubs if s != cfg.main_pub]
        self._subs = {s: sub_sock(s) for s in cfg.subs}   # before main(): a late joiner would miss outputs
        self._pm = PubMaster(list(cfg.pubs), allow_foreign=True)
      self._start_vipc(route)
    if messages is not None and self._frames:
      self.prefetch(messages)   # decode while the daemon starts up
    when = "before its first receive"
    if self.resident:
      if self.routes == 0:
        self._await_reply("ready", when, cfg.startup_timeout)
      self._command({"run": [*cfg.args, *self.extra_args]})
    self._running = True
    self.routes += 1
    self._wait_parked(when, cfg.startup_timeout)

  def _start_vipc(self, route: Route) -> None:
    self._frames = {}
    if not self.cfg.vision_pubs:
      return
    self._vipc = VisionIpcServer(VIPC_SERVER)
    for service in self.cfg.vision_pubs:
      camera, stream = VISION_STREAMS[service]
      if camera not in route.cameras:
        raise ReplayError(f"route {route.path} has no {camera!r} frames, which {self.cfg.name} needs")
      try:
        reader = route.frames(camera)
      except (ValueError, OSError) as e:   # FrameFileError is a ValueError
        raise ReplayError(f"route {route.path}: cannot open its {camera!r} frames ({e})") from e
      g = reader.geometry
      self._vipc.create_buffers_with_sizes(stream, VIPC_BUFFERS, g.width, g.height, g.size, g.stride, g.uv_offset)
      self._frames[service] = (stream, reader, {fid: i for i, fid in enumerate(reader.frame_ids())})
    self._vipc.start_listener()

  def prefetch(self, messages: list[LogMessage]) -> None:
    """Start decoding the frames of these messages' camera states, in this order (the order of step())."""
    jobs = []
    for msg in messages:
      if msg.which in self._frames:
        _, reader, index = self._frames[msg.which]
        frame_id = getattr(log_from_bytes(msg.data), msg.which).frameId
        jobs.append(((msg.which, frame_id), reader, index.get(frame_id)))
    self._prefetch = FramePrefetcher(jobs)

  def _close_route(self) -> None:
    if self._prefetch is not None:
      self._prefetch.close()
      self._prefetch = None
    self._staged.clear()
    if self._vipc is not None:
      self._vipc.close()
      self._vipc = None
    self._frames = {}
    self.route = None

  def finish_route(self) -> None:
    """End this route. A resident stays up, its main() parked at the gate: the next start() ends it (so the
    last route of a worker never pays for a reset it does not need) and stop() kills it; anything else stops."""
    if not self.resident or self.proc is None or self.proc.poll() is not None:
      self.stop()
      return
    if self._prefetch is not None:   # nothing more is decoded for this route
      self._prefetch.close()
      self._prefetch = None

  def _end_main(self) -> None:
    """SIGINT the daemon's main() (SIGTERM ends the resident itself), letting it round its loop at the gate until
    it returns."""
    deadline = time.monotonic() + self.cfg.timeout
    self.proc.send_signal(signal.SIGINT)
    called, ready = self._handle.recv_called_event, self._handle.recv_ready_event
    while True:
      reply = self._read_reply(_POLL_S)
      if reply is not None and "returned" in reply:
        break
      rc = self.proc.poll()
      if rc is not None:
        raise ReplayError(f"{self.cfg.name} exited with code {rc} while ending its route; its last output:\n"
                          f"{self.output_tail()}")
      if called.peek():   # parked before it saw the signal: one more round of its loop
        called.clear()
        ready.set()
      if time.monotonic() >= deadline:
        raise ReplayError(f"{self.cfg.name} hung: main() did not return within {self.cfg.timeout:g} s of SIGINT; "
                          f"its last output:\n{self.output_tail()}")
    self._running = False
    for sock in self._subs.values():   # what it published on the way out is no step's output
      while sock.receive(non_blocking=True) is not None:
        pass

  def stop(self) -> None:
    """Kill the process and drop everything (idempotent)."""
    self._close_route()
    if self.proc is not None and self.proc.poll() is None:
      try:
        os.killpg(self.proc.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    if self.proc is not None:
      self.proc.wait()
      if self.proc.stdin is not None:
        self.proc.stdin.close()
    for closeable in (self._pm, *self._subs.values()):
      if closeable is not None:
        closeable.close()
    if self._handle is not None:
      self._handle.close()
    for handle in self._open_handles:
      handle.close()
    self._open_handles = []
    if self._log is not None:
      self._log.close()
    if self._reply_r is not None:
      os.close(self._reply_r)
    if self._ns is not None:
      with in_namespace(self._ns.prefix):   # removes its dirs; the caller's namespace stays current
        self._ns.__exit__(None, None, None)
    self._ns = self._handle = self._pm = self._log = self._reply_r = None
    self._subs, self._running = {}, False

  def __enter__(self) -> "ProcessRunner":
    self.launch()
    return self

  def __exit__(self, *exc) -> None:
    self.stop()

  # ---- the resident's reply channel

  def _command(self, cmd: dict) -> None:
    try:
      self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
      self.proc.stdin.flush()
    except (BrokenPipeError, OSError):
      pass   # it died: the next wait reports how

  def _read_reply(self, timeout: float) -> dict | None:
    """One reply line if one arrives within timeout s, else None."""
    while b"\n" not in self._reply_buf:
      r, _, _ = select.select([self._reply_r], [], [], timeout)
      if not r:
        return None
      chunk = os.read(self._reply_r, 4096)
      if not chunk:
        return None
      self._reply_buf += chunk
    line, self._reply_buf = self._reply_buf.split(b"\n", 1)
    return json.loads(line)

  def _await_reply(self, key: str, when: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
      reply = self._read_reply(_POLL_S)
      if reply is not None and key in reply:
        return reply
      rc = self.proc.poll()
      if rc is not None:
        raise ReplayError(f"{self.cfg.name} exited with code {rc} {when}; its last output:\n{self.output_tail()}")
      if time.monotonic() >= deadline:
        raise ReplayError(f"{self.cfg.name} hung: not ready within {timeout:g} s {when}; its last output:\n"
                          f"{self.output_tail()}")

  # ---- stepping

  def output_tail(self, limit: int = 2000) -> str:
    if self._log is None:
      return ""
    self._log.seek(0, os.SEEK_END)
    size = self._log.tell()
    self._log.seek(max(0, size - limit))
    return self._log.read().decode(errors="replace")

  def _wait_parked(self, when: str, timeout: float) -> None:
    """Return once the process sits in its gated receive; ReplayError if it exits or takes too long."""
    deadline = time.monotonic() + timeout
    called = self._handle.recv_called_event
    while True:
      try:
        wait_for_one_event([called], _POLL_S)
        return
      except EventTimeoutError:
        pass
      rc = self.proc.poll()
      if rc is None and self.resident and self._reply_r is not None:
        reply = self._read_reply(0)
        if reply is not None and "returned" in reply:
          rc = reply["returned"]
          self._running = False
      if rc is not None:
        raise ReplayError(f"{self.cfg.name} exited with code {rc} {when}; its last output:\n{self.output_tail()}")
      if time.monotonic() >= deadline:
        raise ReplayError(f"{self.cfg.name} hung: no gated receive on {self.cfg.main_pub!r} within {timeout:g} s "
                          f"{when}; its last output:\n{self.output_tail()}")

  def _stage_next(self) -> bool:
    """Copy the next decoded frame into the next buffer of its stream; it is announced by _send_frame at its
    own step. False when no frame is left. At most one step ahead, so a buffer the daemon may still read
    (the current frame of each stream) is never refilled."""
    item = self._prefetch.next(self.cfg.timeout)
    if item is None:
      return False
    key, frame = item
    buf = None
    if frame is not None and not isinstance(frame, Exception):
      buf = self._vipc.get_buffer(self._frames[key[0]][0])
      np.frombuffer(buf.data, np.uint8)[:] = np.frombuffer(frame.data, np.uint8)
    self._staged.append((key, frame, buf))
    return True

  def _send_frame(self, msg: LogMessage) -> None:
    stream, reader, index = self._frames[msg.which]
    state = getattr(log_from_bytes(msg.data), msg.which)
    buf = None
    if self._prefetch is not None:
      if not self._staged and not self._stage_next():
        raise ReplayError(f"{msg.which} frameId {state.frameId}: no decoded frame left for it")
      key, frame, buf = self._staged.popleft()
      if key != (msg.which, state.frameId):
        raise ReplayError(f"frame prefetch out of order: expected {(msg.which, state.frameId)}, got {key}")
      if isinstance(frame, Exception):
        raise ReplayError(f"{msg.which} frameId {state.frameId}: cannot read its frame ({frame})") from frame
    else:
      i = index.get(state.frameId)
      frame = reader.get(i) if i is not None else None
    if frame is None:
      raise ReplayError(f"{msg.which} frameId {state.frameId} has no frame in the route's "
                        f"{VISION_STREAMS[msg.which][0]} frame file")
    if buf is not None:
      self._vipc.send_buffer(buf, state.frameId, state.timestampSof, state.timestampEof)
    else:
      self._vipc.send(stream, frame.data, state.frameId, state.timestampSof, state.timestampEof)

  def begin_step(self, messages: list[LogMessage]) -> None:
    """Deliver `messages` (the last one is the trigger) and open the gate once; finish_step() collects."""
    for msg in messages:
      self._pm.send(msg.which, msg.data)
      if msg.which in self._frames:
        self._send_frame(msg)
    called, ready = self._handle.recv_called_event, self._handle.recv_ready_event
    called.clear()
    ready.set()
    self._stepping = messages[-1]
    if self._prefetch is not None:   # the daemon works on this step now: fill the next step's buffers meanwhile
      for _ in range(len(self._frames) - len(self._staged)):
        if not self._stage_next():
          break

  def finish_step(self) -> list[bytes]:
    """Wait until the daemon parks again; its outputs since begin_step, stamped."""
    trigger, self._stepping = self._stepping, None
    self.steps += 1
    self._wait_parked(f"at step {self.steps} ({trigger.which} at logMonoTime {trigger.log_mono_time})",
                      self.cfg.timeout)
    stamp = trigger.log_mono_time + int(self.cfg.processing_time * 1e9)
    outputs = []
    for service, sock in self._subs.items():
      while (data := sock.receive(non_blocking=True)) is not None:
        outputs.append(restamp(data, stamp))
        self.counts[service] = self.counts.get(service, 0) + 1
    return outputs

  @property
  def stepping(self) -> bool:
    return self._stepping is not None

  def step(self, messages: list[LogMessage]) -> list[bytes]:
    """Deliver `messages` (the last one is the trigger), open the gate once, return the stamped outputs."""
    self.begin_step(messages)
    return self.finish_step()


def count_services(outputs: list[bytes]) -> dict:
  counts: dict = {}
  for data in outputs:
    w = log_from_bytes(data).which()
    counts[w] = counts.get(w, 0) + 1
  return counts


def replay(cfg: ProcessConfig, route: Route, seconds: float | None = None, extra_args=(), env: dict | None = None,
           messages: list[LogMessage] | None = None,
           on_step: Callable[[int, ProcessRunner], None] | None = None,
           runner: ProcessRunner | None = None) -> ReplayResult:
  """Replay `route` (its first `seconds`, or the given `messages`) through the process of `cfg`.

  `on_step(step, runner)` runs before each step (progress, fault injection in tests). `runner`: a launched
  ProcessRunner of this cfg to use (a resident stays up afterwards); by default a fresh one, stopped after."""
  msgs = load_messages(route, seconds) if messages is None else messages
  inputs = [m for m in msgs if m.which in cfg.pubs]
  route_s = (msgs[-1].log_mono_time - msgs[0].log_mono_time) / 1e9 if msgs else 0.0
  own = runner is None
  if own:
    runner = ProcessRunner(cfg, extra_args, env)
  outputs: list[bytes] = []
  t0 = time.monotonic()
  try:
    runner.start(route, inputs)
    t1 = time.monotonic()
    batch: list[LogMessage] = []   # inputs since the last step
    pending = set(cfg.trigger)
    for msg in inputs:
      batch.append(msg)
      pending.discard(msg.which)
      if pending:
        continue
      if on_step is not None:
        on_step(runner.steps, runner)
      outputs += runner.step(batch)
      batch, pending = [], set(cfg.trigger)
    t2 = time.monotonic()
    tail = runner.output_tail()
    steps, counts = runner.steps, dict(runner.counts)
    if own:
      runner.stop()
    else:
      runner.finish_route()
  except BaseException:
    runner.stop()
    raise
  return ReplayResult(cfg.name, outputs, steps, route_s, t1 - t0, t2 - t1, tail, counts)
