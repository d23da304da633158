"""FrequencyTracker: the bands and the two-window rule of openpilot's cereal messaging."""
import pytest

from cereal.messaging.frequency import FrequencyTracker


@pytest.mark.parametrize("service_hz, update_hz, is_poll, band", [
  (20., 20., True, (16., 24.)),      # the polled service: [0.8 f, 1.2 f]
  (100., 20., False, (16., 24.)),    # faster than the reader: lo = update_hz
  (20., 100., False, (16., 24.)),    # reader much faster: lo = f
  (4., 20., False, (3.2, 4.8)),
  (20., 30., False, (8., 24.)),      # in between: lo = f / 2
  (0.5, 20., False, (0.8, 1.2)),     # f is never below 1
  (100., 100., True, (80., 120.)),
])
def test_bands(service_hz, update_hz, is_poll, band):
  t = FrequencyTracker(service_hz, update_hz, is_poll)
  assert (t.min_freq, t.max_freq) == pytest.approx(band)


def test_window_lengths():
  t = FrequencyTracker(20., 20., True)
  assert (t.dts.maxlen, t.recent_dts.maxlen) == (200, 20)


def feed(t: FrequencyTracker, start: float, hz: float, n: int) -> float:
  for i in range(n):
    t.record_recv_time(start + i / hz)
  return start + n / hz


def test_not_valid_before_the_first_interval():
  t = FrequencyTracker(20., 20., True)
  assert not t.valid
  t.record_recv_time(0.0)  # a message at clock zero still counts as an arrival
  assert not t.valid
  t.record_recv_time(0.05)
  assert t.valid


@pytest.mark.parametrize("hz, ok", [(20., True), (16.1, True), (15.9, False), (23.9, True), (24.1, False)])
def test_rate_boundaries(hz, ok):
  t = FrequencyTracker(20., 20., True)
  feed(t, 100., hz, 40)
  assert t.valid is ok


def test_either_window_suffices():
  t = FrequencyTracker(20., 20., True)
  end = feed(t, 0., 20., 201)              # long window full at 20 Hz
  end = feed(t, end, 10., 20)              # recent window at 10 Hz, long window still ~18 Hz
  assert not FrequencyTracker._in_band(t, t.recent_dts) and t.valid
  feed(t, end, 10., 200)                   # now both windows at 10 Hz
  assert not t.valid


def test_recent_window_recovers_before_the_long_one():
  t = FrequencyTracker(20., 20., True)
  end = feed(t, 0., 10., 201)
  feed(t, end, 20., 21)
  assert not t._in_band(t.dts) and t.valid


def test_same_instant_arrivals_are_not_a_good_rate():
  t = FrequencyTracker(20., 20., True)
  for _ in range(5):
    t.record_recv_time(3.0)
  assert not t.valid
