"""Hybrid waiting for periodic frames: sleep until just before the next frame is due, then poll.

Why: a client asleep in the kernel pays an idle CPU's wake-up when the announcement lands, and may be
queued behind the producer on its CPU. Cameras are periodic, so the client learns the period from arrival
times, sleeps until `lead` before the next frame is due and polls (yielding the CPU each turn) from there,
taking the frame within microseconds at its doorbell or announcement (client.py): the hybrid polling of
Linux block drivers. bench/vipc_latency.py measures the sleeping and the polling client side by side.

Invariants:
- Polling happens only while arrivals are periodic: the last `history` intervals all within `tolerance` of
  their median. Irregular arrivals (a slow consumer, a paused producer, replay at random pace) turn it off
  by themselves, and a frame that has not come LATE_LEADS * `lead` after it was due ends the poll: the
  client sleeps as usual. So polling costs at most (1 + LATE_LEADS) * lead + wake_margin of CPU per frame;
  the late side is the long one because it costs only when a frame is late (its producer woke late).
- Sleeps end late, so the client reports each lateness (`woke_late`) and the window opens earlier by a high
  quantile of them (`wake_margin`, at most `lead`), and the due time is the earliest projection of the last
  PHASE_FRAMES arrivals (`_due`): neither a late wake-up nor one late frame makes it miss the next one.
- Env VIPC_SPIN_LEAD_US sets `lead` (default 1000); 0 disables hybrid waiting.
- A realtime (SCHED_FIFO) client's yield gives way only to tasks of its own or a higher priority, so its
  producer must run realtime at no lower priority (camerad does with PYMODELD_REALTIME=1,
  common/realtime.py), or the two must be pinned to different cores: otherwise a normal-priority
  producer queued on the polling client's CPU waits for the window to end.
"""
import statistics
from collections import deque

from visionipc.env import VISIONIPC_ENV

DEFAULT_LEAD_S = VISIONIPC_ENV.number("VIPC_SPIN_LEAD_US", 1000) / 1e6
PHASE_FRAMES = 4  # arrivals the due time is taken from (_due)
LATE_LEADS = 3  # the poll window ends this many leads after the due time


class ArrivalPacing:
  """Learns the period of frame arrivals and says when polling for the next one should start and stop."""

  def __init__(self, lead_s: float = DEFAULT_LEAD_S, history: int = 8, tolerance: float = 0.25,
               lateness_history: int = 16):
    if lead_s < 0:
      raise ValueError(f"lead must be >= 0 s, got {lead_s!r}")
    self.lead_s = lead_s
    self.tolerance = tolerance
    self._intervals: deque[float] = deque(maxlen=history)
    self._last: float | None = None
    self._lateness: deque[float] = deque(maxlen=lateness_history)

  def arrived(self, t: float) -> None:
    """Record a frame taken off the bus at monotonic time `t` (seconds). Kept to an append: this runs
    between the announcement and the consumer getting its frame."""
    if self._last is not None:
      self._intervals.append(t - self._last)
    self._last = t

  def woke_late(self, late_s: float) -> None:
    """Record how long after a poll window's start a sleep until that start ended."""
    self._lateness.append(max(0.0, late_s))

  @property
  def wake_margin(self) -> float:
    """How much earlier the window opens to make up for late wake-ups: the ~90th percentile of the recent
    lateness (a rare 2 ms one does not keep the client polling for long), at most `lead`."""
    if not self._lateness:
      return 0.0
    ordered = sorted(self._lateness)
    return min(ordered[int(0.9 * (len(ordered) - 1))], self.lead_s)

  def reset(self) -> None:
    """Forget the arrival history (e.g. the server restarted: its phase and period may differ); the wake-up
    lateness is the machine's and stays."""
    self._intervals.clear()
    self._last = None

  @property
  def period(self) -> float | None:
    """The learned period in seconds, or None while arrivals are not (yet) periodic."""
    return self._steady_period()

  def poll_window(self) -> tuple[float, float] | None:
    """(start, end) monotonic times between which to poll for the next frame, or None to just sleep."""
    period = self._steady_period() if self.lead_s > 0 else None
    if period is None:
      return None
    due = self._due(period)
    return due - self.lead_s - self.wake_margin, due + LATE_LEADS * self.lead_s

  def _due(self, period: float) -> float:
    """When the next frame is due: the earliest of the last PHASE_FRAMES arrivals, each projected forward by
    whole periods. A frame is late, never early (its producer or this client woke late), so one late arrival
    does not move the next window past the frame."""
    due = self._last + period
    back = 0.0
    for frames_ago, interval in enumerate(list(self._intervals)[:-PHASE_FRAMES:-1], start=1):
      back += interval
      due = min(due, self._last - back + (frames_ago + 1) * period)
    return due

  def _steady_period(self) -> float | None:
    if len(self._intervals) < self._intervals.maxlen:
      return None
    median = statistics.median(self._intervals)
    if median <= (2 + LATE_LEADS) * self.lead_s:  # so close together that polling would hardly ever sleep
      return None
    if any(abs(i - median) > self.tolerance * median for i in self._intervals):
      return None
    return median
