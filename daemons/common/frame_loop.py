"""The skeleton both model daemons share: one frame loop and one per-frame step, in one order.

The loop (`run_frame_loop`): receive frames -> read the bus -> step -> publish every event -> report.
The step (`FrameStep.step`), for each received frame (or main/extra pair):
  1. the frame is received: the step's clock starts (modelExecutionTime counts from here);
  2. `check`: the daemon's input rules (calibration in camera time, dropped frames, sync, malformed inputs);
  3. `prepare`: the daemon's warp of the frames into its model inputs (host wall clock: stage `warp`);
  4. still_valid: every frame read in 3 is checked after its pixels were last read; an overwritten one makes
     the step invalid ("frame 1258 overwritten while it was warped", naming each such frame). A step whose
     warp runs inside `run` (a captured frame program: `warps_in_run(frames)` is True) does this check from
     the program's after-warp hook instead (`check_overwritten`), after the program last read the frames;
  5. `run`: the daemon's model(s) through the runner protocol (daemons/common/runner.py) and the parse of the
     flat output; the daemon adds its own reasons (non-finite output, failure, history filling). The
     outputs are parsed when it returns: modelExecutionTime ends here;
  6. `build`: the daemon's messages (daemons/common/messages.model_event), then the skeleton stamps the
     timing fields on every one of them (messages.stamp_timings).
Per-daemon code supplies only check / prepare / run / build (and the loop's receive and bus reading).

Invariants: `valid` is False exactly when a reason was given; reasons keep this order (inputs, overwrite,
model); a runner that measured the warp itself (a captured frame program: `warp` in its on_device) keeps its
device time, otherwise the warp is the host wall time of `prepare`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from daemons.common.messages import stamp_timings
from daemons.common.runner import StageTimes

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

  def prepare(self, frames: Sequence[Frame], inputs) -> Any:
    raise NotImplementedError

  def run(self, model_inputs, inputs, reasons: list[str]) -> ModelOutcome:
    raise NotImplementedError

  def build(self, frames: Sequence[Frame], inputs, outcome: ModelOutcome, reasons: list[str]) -> list:
    raise NotImplementedError

  def warps_in_run(self, frames: Sequence[Frame]) -> bool:
    """True when `run` warps these frames itself (and calls check_overwritten after its last read of them)."""
    return False

  def check_overwritten(self, frames: Sequence[Frame], reasons: list[str]) -> bool:
    """Ask every frame still_valid; an overwritten one adds the reason naming it. True when all are valid."""
    overwritten = [f for f in _distinct(frames) if not f.still_valid()]   # every frame is asked
    if overwritten:
      reasons.append(overwritten_reason(overwritten))
    return not overwritten

  def step(self, frames: Sequence[Frame], inputs=None) -> StepResult:
    t0 = self.clock()
    reasons = list(self.check(frames, inputs))
    t1 = self.clock()
    model_inputs = self.prepare(frames, inputs)
    warp_s = self.clock() - t1
    if not self.warps_in_run(frames):
      self.check_overwritten(frames, reasons)
    outcome = self.run(model_inputs, inputs, reasons)
    execution_s = self.clock() - t0
    times = outcome.times if "warp" in outcome.times.on_device else outcome.times.host(warp=warp_s)
    events = self.build(frames, inputs, outcome, reasons)
    stamp_timings(events, times, execution_s)
    return StepResult(events, outcome.model_name, not reasons, reasons)


def _distinct(frames: Sequence[Frame]) -> list[Frame]:
  out: list[Frame] = []
  for f in frames:
    if not any(f is g for g in out):
      out.append(f)
  return out


def run_frame_loop(receive: Callable[[], Sequence[Frame] | None], read_bus: Callable[[Sequence[Frame]], Any],
                   step: Callable[[Sequence[Frame], Any], StepResult], publish: Callable[[str, Any], None],
                   stop: Callable[[], bool], report: Callable[[Sequence[Frame], StepResult], None] | None = None) -> int:
  """Both daemons' main loop. receive() waits a bounded time and returns the frames of one step or None;
  read_bus(frames) reads the bus without blocking and returns the step's inputs; every event of the step is
  published in order; report(frames, result) logs. Returns the number of steps when stop() says so."""
  steps = 0
  while not stop():
    frames = receive()
    if frames is None:
      continue
    result = step(frames, read_bus(frames))
    for service, msg in result.events:
      publish(service, msg)
    steps += 1
    if report is not None:
      report(frames, result)
  return steps
