"""A status line's valid share reads 100% only when every frame of the window was valid and 0% only when none
was, so a line that quotes a reason never says 100% valid beside it; a long reason is cut at a word boundary."""
from daemons.common.frame_loop import REASON_CHARS, Frame, FrameStatus, StepResult


class Clock:
  def __init__(self):
    self.t = 0.0

  def __call__(self) -> float:
    return self.t


def _window(valid: list[bool], reason: str = "calibration stale (2.5 s old)") -> str:
  """The line FrameStatus says for one 10 s window of these steps (a first step opens the window)."""
  clock, said = Clock(), []
  status = FrameStatus(10.0, said.append, clock)
  status.record([Frame(b"", 0, 1, 2)], StepResult([], "m", True, []))
  for i, ok in enumerate(valid):
    clock.t = 10.0 * (i + 1) / (len(valid) + 1)
    status.record([Frame(b"", i + 1, 1, 2)], StepResult([], "m", ok, [] if ok else [reason]))
  clock.t = 10.0
  status.tick()
  assert len(said) == 1, said
  return said[0]


def test_a_window_with_one_invalid_frame_in_two_hundred_is_not_called_100_percent_valid():
  line = _window([True] * 199 + [False])
  assert "99% valid" in line and "most often: calibration stale (2.5 s old)" in line, line


def test_a_window_with_one_valid_frame_in_two_hundred_is_not_called_0_percent_valid():
  line = _window([False] * 199 + [True])
  assert "1% valid" in line, line


def test_whole_windows_say_100_and_0_percent():
  assert "100% valid (last 10 s)" in _window([True] * 200)
  assert "0% valid (last 10 s; most often:" in _window([False] * 200)


def test_a_long_reason_is_cut_at_a_word_boundary_with_an_ellipsis():
  reason = "the calibration file " + " ".join(f"part{i}" for i in range(40)) + " is missing"
  line = _window([False] * 10, reason)
  quoted = line.split("most often: ", 1)[1].rstrip(")")
  assert quoted.endswith("\u2026") and len(quoted) <= REASON_CHARS, quoted
  assert reason.startswith(quoted[:-1]) and reason[len(quoted) - 1] == " ", quoted
