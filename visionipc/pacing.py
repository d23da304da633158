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
  it by themselves, and a frame that does not come within `lead` after it was due ends the poll: the
  client then sleeps as usual. So the CPU cost is bounded by 2 * lead per frame.
- Env VIPC_SPIN_LEAD_US sets `lead` (default 1000); 0 disables hybrid waiting.
- A realtime (SCHED_FIFO) client's yield gives way only to tasks of its own or a higher priority, so its
  producer must run realtime at no lower priority (camerad does with PYMODELD_REALTIME=1,
  daemons/common/realtime.py): a normal-priority producer queued on the polling client's CPU would wait for
  the window to end. Realtime, or pinning client and producer to different cores, is what keeps a woken client
  off the producer's busy CPU (bench/vipc_latency.py).
"""
import os
import statistics
from collections import deque

DEFAULT_LEAD_S = float(os.environ.get("VIPC_SPIN_LEAD_US", "1000")) / 1e6


class ArrivalPacing:
  """Learns the period of frame arrivals and says when polling for the next one should start and stop."""

  def __init__(self, lead_s: float = DEFAULT_LEAD_S, history: int = 8, tolerance: float = 0.25):
    if lead_s < 0:
      raise ValueError(f"lead must be >= 0 s, got {lead_s!r}")
    self.lead_s = lead_s
    self.tolerance = tolerance
    self._intervals: deque[float] = deque(maxlen=history)
    self._last: float | None = None

  def arrived(self, t: float) -> None:
    """Record a frame taken off the bus at monotonic time `t` (seconds). Kept to an append: this runs
    between the announcement and the consumer getting its frame, where every cold line costs (see bench)."""
    if self._last is not None:
      self._intervals.append(t - self._last)
    self._last = t

  def reset(self) -> None:
    """Forget the history (e.g. the server restarted: its phase and period may differ)."""
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
    due = self._last + period
    return due - self.lead_s, due + self.lead_s

  def _steady_period(self) -> float | None:
    if len(self._intervals) < self._intervals.maxlen:
      return None
    median = statistics.median(self._intervals)
    if median <= 2 * self.lead_s:  # frames so close together that the plain bus spin already covers them
      return None
    if any(abs(i - median) > self.tolerance * median for i in self._intervals):
      return None
    return median
