"""The frame loop's status line: after the first published step, one line per period of the loop's clock with
the window's frame rate, p50 latency from the frame's end to its message, valid share and most frequent reason;
a window without frames says so, and a period of 0 says nothing. Driven on a fake clock, so no test waits."""
from dataclasses import dataclass

from daemons.common.frame_loop import Frame, FrameStatus, StepResult, run_frame_loop


@dataclass
class Stamped:
  logMonoTime: int


class Clock:
  def __init__(self):
    self.t = 0.0

  def __call__(self) -> float:
    return self.t


def _frame(i: int, eof_ns: int) -> Frame:
  return Frame(b"", i, eof_ns - 1, eof_ns)


def _drive(clock, frames_at, latencies_ms, valid, reasons=None, period=1.0):
  """Run the loop over steps at the times in `frames_at` (None: a receive with no frame), each published
  latency_ms after its frame's end; returns the lines said."""
  said: list[str] = []
  plan = list(zip(frames_at, latencies_ms, valid, reasons or [[]] * len(frames_at)))
  steps = iter(plan)
  current: dict = {}

  def receive():
    at, latency, ok, why = next(steps)
    clock.t = at if at is not None else clock.t + 0.1
    if at is None:
      return None
    eof = 1_000_000_000 + int(at * 1e9)
    current.update(event=Stamped(eof + int(latency * 1e6)), ok=ok, why=why)
    return [_frame(int(at * 100), eof)]

  def step(frames, inputs):
    return StepResult([("driverStateV2", current["event"])], "m", current["ok"], list(current["why"]))

  left = [len(plan)]

  def stop():
    left[0] -= 1
    return left[0] < 0

  run_frame_loop(receive, lambda frames: None, step, lambda s, m: None, stop, status_every=period, say=said.append,
                 clock=clock)
  return said


def test_a_status_line_gives_the_windows_frame_rate_median_latency_and_valid_share():
  clock = Clock()
  times = [i * 0.05 for i in range(22)]          # 20 frames a second; the first starts the window
  latencies = [5.0] * 10 + [7.0] * 12
  valid = [True] * 17 + [False] * 5
  reasons = [[]] * 17 + [["calibration missing"]] * 4 + [["frame 20 overwritten while it was warped"]]
  said = _drive(clock, times, latencies, valid, reasons)
  assert said == ["status: 20.0 fps, p50 latency 7.0 ms (frame end to publish), 80% valid "
                  "(last 1 s; most often: calibration missing)"], said


def test_nothing_is_said_before_the_first_frame_and_a_window_without_frames_says_so():
  clock = Clock()
  said = _drive(clock, [None] * 30, [0] * 30, [True] * 30)
  assert said == []                              # 3 s without a frame: the daemons' own waiting lines cover it
  clock = Clock()
  said = _drive(clock, [0.0, 0.5, 1.0] + [None] * 20, [1.0] * 23, [True] * 23)
  assert said[0].startswith("status: 2.0 fps, p50 latency 1.0 ms") and "100% valid (last 1 s)" in said[0], said
  assert "status: no frames in the last 1 s" in said[1:], said


def test_a_period_of_zero_says_nothing():
  clock = Clock()
  assert _drive(clock, [i * 0.05 for i in range(60)], [1.0] * 60, [True] * 60, period=0) == []


def test_a_frame_without_timestamps_counts_but_gives_no_latency():
  status = FrameStatus(1.0, print)
  status.record([Frame(b"", 1, 0, 0)], StepResult([], "m", True, []))
  status.record([Frame(b"", 2, 0, 0)], StepResult([], "m", True, []))
  assert status.line(1.0) == "status: 1.0 fps, latency unknown (frame end to publish), 100% valid (last 1 s)"
