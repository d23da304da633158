"""FrequencyTracker: is a service arriving at its expected rate, as judged by a reader running at update_hz.

The rules are openpilot's (cereal/messaging's FrequencyTracker):
- f = max(min(service_hz, update_hz), 1).
- The polled service must arrive at f: band [0.8·f, 1.2·f].
- Other services are sampled once per update, so the band is [0.8·lo, 1.2·hi] with hi = min(f, update_hz)
  and lo = update_hz if service_hz >= 2·update_hz, f if update_hz >= 2·service_hz, else f/2.
- Inter-arrival dts feed a long window of int(10·f) samples and a recent one of int(f) samples; the rate is
  ok when 1/mean(dt) of either window is inside the band. No dt yet means not ok.
"""
from collections import deque


class FrequencyTracker:
  def __init__(self, service_hz: float, update_hz: float, is_poll: bool):
    f = max(min(service_hz, update_hz), 1.)
    if is_poll:
      lo = hi = f
    else:
      hi = min(f, update_hz)
      if service_hz >= 2 * update_hz:
        lo = update_hz
      elif update_hz >= 2 * service_hz:
        lo = f
      else:
        lo = f / 2.
    self.min_freq = 0.8 * lo
    self.max_freq = 1.2 * hi
    self.dts = deque(maxlen=int(10 * f))
    self.recent_dts = deque(maxlen=int(f))
    self.prev_time: float | None = None

  def record_recv_time(self, t: float) -> None:
    if self.prev_time is not None:
      dt = t - self.prev_time
      self.dts.append(dt)
      self.recent_dts.append(dt)
    self.prev_time = t

  def _in_band(self, dts: deque) -> bool:
    total = sum(dts)
    # a zero or negative span (same-instant arrivals, clock step) is no evidence of a good rate
    return total > 0 and self.min_freq <= len(dts) / total <= self.max_freq

  @property
  def valid(self) -> bool:
    return len(self.dts) > 0 and (self._in_band(self.dts) or self._in_band(self.recent_dts))
