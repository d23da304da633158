"""Hybrid waiting for periodic frames: sleep until just before the next frame is due, then poll.

Why: a client asleep in the kernel pays the wake-up of an idle CPU when the announcement lands. On a 2-vCPU
VM that is ~250-300 us p50 (bench/vipc_latency.py, "bus wake-up" row), and the woken client may even be
queued behind the producer on the producer's own CPU. Cameras are periodic, so the client can learn the
period from arrival times, sleep until `lead` before the next frame is due and poll (yielding the CPU each
turn) from there: the frame is then picked up within microseconds, at its doorbell or its announcement
(client.py). This is the hybrid polling of Linux block drivers (sleep for most of the expected completion
time, poll the rest).

Invariants:
- Polling happens only while arrivals are periodic: the last `history` intervals all within `tolerance`
  of their median. Irregular arrivals (a slow consumer, a paused producer, replay at random pace) disable
  it by themselves, and a frame that does not come within LATE_LEADS * `lead` after it was due ends the poll:
  the client then sleeps as usual. So the CPU cost is at most 5 * lead per frame, and about lead + margin
  (below) while frames come on time: the late side is the long one because it costs only when a frame is
  late, as when its producer woke late (~5% of paced frames came >1 ms late on this VM).
- Sleeps end late: on this 2-vCPU VM a client's sleep to a window's start ended ~0.33 ms late p50, ~0.4 ms
  p90, up to ~1 ms p99. A client that wakes after its frame is complete takes it at the announcement's
  wake-up instead of the doorbell, ~0.3-0.5 ms later. So the client reports each lateness (`woke_late`) and
  the window opens earlier by a high quantile of them (`wake_margin`, at most `lead`), and the due time
  comes from the earliest of the last few arrivals (`_due`). With both and the long late side, frames the
  client missed at the doorbell fell from ~30% to ~1.5% (200 paced frames, pinned, per step).
- Env VIPC_SPIN_LEAD_US sets `lead` (default 1000); 0 disables hybrid waiting.
- A realtime (SCHED_FIFO) client's yield gives way only to tasks of its own or a higher priority, so its
  producer must run realtime at no lower priority (camerad does with PYMODELD_REALTIME=1,
  daemons/common/realtime.py): a normal-priority producer queued on the polling client's CPU would wait for
  the window to end. Realtime, or pinning client and producer to different cores, is what keeps a woken client
  off the producer's busy CPU (bench/vipc_latency.py).
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
    between the announcement and the consumer getting its frame, where every cold line costs (see bench)."""
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
    does not move the next window past the frame (as it did, ~10% of frames on this VM: bench)."""
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
