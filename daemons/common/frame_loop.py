"""The skeleton both model daemons share: one frame loop, one per-frame step in one order, and their messages.

The loop (`run_frame_loop`): receive frames -> read the bus -> step -> publish every event -> report.
The step (`FrameStep.step`), for each received frame (or main/extra pair):
  1. the frame is received: the step's clock starts (modelExecutionTime counts from here);
  2. `check`: the daemon's input rules (calibration in camera time, dropped frames, sync, malformed inputs);
  3. `run`: the daemon's model state looks up the captured frame program of the frames' geometry and runs it
     (daemons/common/frame_program.FrameProgram.run: the program warps the frame's own memory and runs the
     model, calling the linked program itself), then the parse of the flat output; the daemon
     adds its own reasons (non-finite output, failure, history filling). The program calls the daemon's
     after-warp hook after it last read the frames: `check_overwritten` asks every frame still_valid there, and
     an overwritten one makes the step invalid ("frame 1258 overwritten while it was warped", naming each such
     frame). The outputs are parsed when it returns: modelExecutionTime ends here;
  4. `build`: the daemon's messages (`model_event`), then the skeleton stamps the timing fields on every one of
     them (`stamp_timings`).
Per-daemon code supplies only check / run / build (and the loop's receive and bus reading). There is one
per-frame path: no host warp, no second engine.

Invariants: `valid` is False exactly when a reason was given; reasons keep this order (inputs, overwrite,
model); every stage time is the program's own (device timeline; in one fused program the warp's seconds are
inside `model` and `warp` is 0), the parse is host wall clock.

The messages: `model_event(service, reasons)` is the one way the daemons build their output Events:
cereal.messaging.new_message (logMonoTime = the bus clock, fields set one by one so no reference cycle is
built), `valid` True exactly when `reasons` is empty and `invalidReason` every reason joined with "; ", so a
consumer sees all of them. `stamp_timings` is the one place their timing fields are written, on every event
whose struct has them, with the meanings openpilot gives them: `modelExecutionTime` = wall seconds of the whole
model step, from the frame received to the outputs parsed; `gpuExecutionTime` = seconds the device
(GPU/accelerator) spent executing the step's stages (StageTimes.device_s); `stageTimings` = the StageTimes in
milliseconds. Other events are left alone.

The status line (`FrameStatus`, `run_frame_loop(status_every=S)`): every S seconds of the loop's clock after the
first published step, one line with that window's frame rate, its p50 latency from the frame's end of exposure
(timestampEof) to its message (logMonoTime, the clock consumers and the latency benches read), the share of its
steps published valid and the reason most of its invalid steps gave; a window without a step says so. Nothing
is said before the first step (the daemons say what they wait for), and S = 0 says nothing.
"""
from __future__ import annotations

import collections
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from cereal.messaging import new_message
from common.text import cut_words
from daemons.common.stage_times import StageTimes

REASON_CHARS = 100   # a status line quotes the window's most frequent invalid reason up to this long
STATUS_EVERY_S = 10.0   # the status line's default period (--status-every)


def status_every(text: str) -> float:
  """--status-every's value: seconds >= 0 (0: no status line)."""
  value = float(text)
  if not value >= 0:   # also NaN
    raise ValueError(text)
  return value


def add_status_every(parser, service: str) -> None:
  """Both daemons' --status-every option (the status line of `service`'s messages)."""
  parser.add_argument("--status-every", type=status_every, default=STATUS_EVERY_S, metavar="S",
                      help="print a status line every S seconds: frame rate, p50 latency from the frame's end to its "
                           f"{service}, share published valid (default {STATUS_EVERY_S:g}; 0: never)")


def model_event(service: str, reasons: Iterable[str] = ()):
  reasons = list(reasons)
  if reasons:
    return new_message(service, valid=False, invalidReason="; ".join(reasons))
  return new_message(service, valid=True)


def stamp_timings(events, times: StageTimes, execution_s: float) -> None:
  """Write the step's timings into each (service, event) whose struct has the fields."""
  for service, msg in events:
    body = getattr(msg, service)
    fields = body.schema.fieldnames
    if "modelExecutionTime" in fields:
      body.modelExecutionTime = execution_s
    if "gpuExecutionTime" in fields:
      body.gpuExecutionTime = times.device_s
    if "stageTimings" in fields:
      times.fill(body.init("stageTimings"))


def overwritten_reason(frames) -> str:
  """The reason for frames overwritten while they were warped; it names them (main first)."""
  return f"frame {', '.join(dict.fromkeys(str(f.frame_id) for f in frames))} overwritten while it was warped"


@dataclass
class Frame:
  """One camera frame as a daemon holds it (a VisionBuf's fields, or plain bytes in tests)."""
  data: Any                          # NV12 bytes (buffer, memoryview or ndarray)
  frame_id: int
  timestamp_sof: int
  timestamp_eof: int
  still_valid: Callable[[], bool] = lambda: True
  width: int = 0                     # geometry, for daemons that size their warp from the frame (0: unknown)
  height: int = 0
  stride: int = 0

  @classmethod
  def from_buf(cls, buf) -> "Frame":
    return cls(buf.data, buf.frame_id, buf.timestamp_sof, buf.timestamp_eof, buf.still_valid, buf.width, buf.height,
               buf.stride)


class FrameDrops:
  """Both daemons' one count of frames skipped: `seen(frame_id)` returns how many frame ids were skipped right
  before this one (0 for the first frame, and when ids go backwards: the camera restarted) and adds them to
  `total`."""

  def __init__(self):
    self.last_frame_id: int | None = None
    self.total = 0

  def seen(self, frame_id: int) -> int:
    last, self.last_frame_id = self.last_frame_id, frame_id
    gap = 0 if last is None else max(0, frame_id - last - 1)
    self.total += gap
    return gap


@dataclass
class ModelOutcome:
  """What `run` returns: the parsed outputs (None if the model failed), the raw flat output and its stage times."""
  parsed: Any
  raw: np.ndarray | None
  times: StageTimes
  model_name: str = ""


@dataclass
class StepResult:
  events: list = field(default_factory=list)   # [(service, Event builder)] in publish order
  model_name: str = ""
  valid: bool = False
  reasons: list = field(default_factory=list)


class FrameStep:
  """Base of a daemon's per-frame step (see the module docstring for the order). `clock` is the wall clock."""
  clock: Callable[[], float] = staticmethod(time.perf_counter)

  def check(self, frames: Sequence[Frame], inputs) -> list[str]:
    raise NotImplementedError

  def run(self, frames: Sequence[Frame], inputs, reasons: list[str]) -> ModelOutcome:
    raise NotImplementedError

  def build(self, frames: Sequence[Frame], inputs, outcome: ModelOutcome, reasons: list[str]) -> list:
    raise NotImplementedError

  def check_overwritten(self, frames: Sequence[Frame], reasons: list[str]) -> bool:
    """Ask every frame still_valid; an overwritten one adds the reason naming it. True when all are valid."""
    overwritten = [f for f in _distinct(frames) if not f.still_valid()]   # every frame is asked
    if overwritten:
      reasons.append(overwritten_reason(overwritten))
    return not overwritten

  def step(self, frames: Sequence[Frame], inputs=None) -> StepResult:
    t0 = self.clock()
    reasons = list(self.check(frames, inputs))
    outcome = self.run(frames, inputs, reasons)
    execution_s = self.clock() - t0
    events = self.build(frames, inputs, outcome, reasons)
    stamp_timings(events, outcome.times, execution_s)
    return StepResult(events, outcome.model_name, not reasons, reasons)


def _distinct(frames: Sequence[Frame]) -> list[Frame]:
  out: list[Frame] = []
  for f in frames:
    if not any(f is g for g in out):
      out.append(f)
  return out


class FrameStatus:
  """The loop's status line, one per `every_s` of `clock` (module docstring); `say` prints it."""

  def __init__(self, every_s: float, say: Callable[[str], None], clock: Callable[[], float] = time.monotonic):
    self.every_s, self.say, self.clock = every_s, say, clock
    self.window_start: float | None = None    # None until the first step
    self.steps = self.valid = 0
    self.latencies_ms: list[float] = []
    self.reasons: collections.Counter = collections.Counter()

  def record(self, frames: Sequence[Frame], result: StepResult) -> None:
    if self.window_start is None:   # the first step starts the first window (its time is the window's zero)
      self.window_start = self.clock()
      return
    self.steps += 1
    self.valid += bool(result.valid)
    self.reasons.update(result.reasons)
    eof = frames[0].timestamp_eof if frames else 0
    stamped = getattr(result.events[0][1], "logMonoTime", 0) if result.events else 0
    if eof and stamped:
      self.latencies_ms.append((stamped - eof) / 1e6)

  def tick(self) -> None:
    """Say the window's line when it is over, and start the next one."""
    if self.window_start is None:
      return
    now = self.clock()
    elapsed = now - self.window_start
    if elapsed < self.every_s:
      return
    self.say(self.line(elapsed))
    self.window_start, self.steps, self.valid, self.latencies_ms = now, 0, 0, []
    self.reasons.clear()

  def line(self, elapsed: float) -> str:
    window = f"last {self.every_s:g} s"
    if not self.steps:
      return f"status: no frames in the {window}"
    latency = f"p50 latency {statistics.median(self.latencies_ms):.1f} ms" if self.latencies_ms else "latency unknown"
    why = ""
    if self.reasons:   # the reason a user most needs: the one most steps of the window gave
      reason, _ = self.reasons.most_common(1)[0]
      why = f"; most often: {cut_words(reason, REASON_CHARS)}"
    share = 100 * self.valid / self.steps
    if 0 < self.valid < self.steps:   # 100% and 0% mean every frame and none: a partial share never rounds to them
      share = min(max(share, 1.0), 99.0)
    return (f"status: {self.steps / elapsed:.1f} fps, {latency} (frame end to publish), "
            f"{share:.0f}% valid ({window}{why})")


def run_frame_loop(receive: Callable[[], Sequence[Frame] | None], read_bus: Callable[[Sequence[Frame]], Any],
                   step: Callable[[Sequence[Frame], Any], StepResult], publish: Callable[[str, Any], None],
                   stop: Callable[[], bool], report: Callable[[Sequence[Frame], StepResult], None] | None = None,
                   status_every: float = 0.0, say: Callable[[str], None] | None = None,
                   clock: Callable[[], float] = time.monotonic) -> int:
  """Both daemons' main loop. receive() waits a bounded time and returns the frames of one step or None;
  read_bus(frames) reads the bus without blocking and returns the step's inputs; every event of the step is
  published in order; report(frames, result) logs. With status_every > 0 and `say`, a status line every
  status_every seconds of `clock` (FrameStatus). Returns the number of steps when stop() says so."""
  status = FrameStatus(status_every, say, clock) if status_every > 0 and say is not None else None
  steps = 0
  while not stop():
    frames = receive()
    if frames is not None:
      result = step(frames, read_bus(frames))
      for service, msg in result.events:
        publish(service, msg)
      steps += 1
      if report is not None:
        report(frames, result)
      if status is not None:
        status.record(frames, result)
    if status is not None:
      status.tick()
  return steps
