"""Hybrid waiting: the client learns a periodic producer's period, polls around the due time, and falls back
to sleeping when frames stop being periodic. No frame may be lost or reordered by it."""
import numpy as np
import pytest

from msgq.fake import FAKE_ENV
from visionipc import VISION_STREAM_CABIN, VisionIpcClient
from visionipc.pacing import LATE_LEADS, PHASE_FRAMES, ArrivalPacing

RECV_TIMEOUT_MS = 10_000


def fed(pacing: ArrivalPacing, times) -> ArrivalPacing:
  for t in times:
    pacing.arrived(t)
  return pacing


def test_no_poll_window_until_a_full_history_of_steady_intervals():
  pacing = ArrivalPacing(lead_s=0.001, history=4)
  assert pacing.poll_window() is None
  fed(pacing, [0.0, 0.05, 0.10, 0.15])
  assert pacing.poll_window() is None, "three intervals are not yet a history of four"
  pacing.arrived(0.20)
  assert pacing.period == pytest.approx(0.05)
  start, end = pacing.poll_window()
  assert start == pytest.approx(0.249) and end == pytest.approx(0.25 + LATE_LEADS * 0.001)


def test_irregular_arrivals_turn_polling_off_until_they_are_steady_again():
  pacing = fed(ArrivalPacing(lead_s=0.001, history=4), [0.0, 0.05, 0.10, 0.15, 0.20])
  pacing.arrived(0.40)  # a late frame: one interval 4x the others
  assert pacing.period is None and pacing.poll_window() is None
  fed(pacing, [0.45, 0.50, 0.55])
  assert pacing.period is None, "the outlier is still in the history"
  pacing.arrived(0.60)
  assert pacing.period == pytest.approx(0.05)


def test_one_late_arrival_does_not_move_the_next_window_past_its_frame():
  """Frames are late, never early: the due time comes from the earliest of the last PHASE_FRAMES arrivals."""
  pacing = fed(ArrivalPacing(lead_s=0.001, history=4), [0.0, 0.05, 0.10, 0.15, 0.20])
  pacing.arrived(0.2530)  # 3 ms late (its producer woke late)
  start, end = pacing.poll_window()
  assert start == pytest.approx(0.299, abs=1e-4), "the next frame is due on the old phase, at 0.30"
  for t in (0.30, 0.35, 0.40):  # the producer's phase moved by 3 ms for good
    pacing.arrived(t + 0.003)
  assert PHASE_FRAMES == 4 and pacing.poll_window()[0] == pytest.approx(0.452, abs=1e-4), \
    "after PHASE_FRAMES late arrivals the window follows the new phase"


def test_late_wake_ups_open_the_window_earlier_by_a_high_quantile_at_most_one_lead():
  pacing = fed(ArrivalPacing(lead_s=0.001, history=4, lateness_history=10), [0.0, 0.05, 0.10, 0.15, 0.20])
  assert pacing.wake_margin == 0.0
  for late in [0.0002] * 8 + [0.0004, 0.0020]:  # mostly 0.2 ms late, one 2 ms outlier
    pacing.woke_late(late)
  assert pacing.wake_margin == pytest.approx(0.0004), "the 90th percentile, not the outlier"
  assert pacing.poll_window()[0] == pytest.approx(0.25 - 0.001 - 0.0004)
  for _ in range(10):
    pacing.woke_late(0.005)
  assert pacing.wake_margin == pytest.approx(0.001), "never more than one lead"
  pacing.woke_late(-1.0)  # woken early (a signal): counts as on time
  pacing.reset()
  assert pacing.wake_margin == pytest.approx(0.001), "the lateness is the machine's: a new server keeps it"


def test_reset_forgets_the_period_and_lead_zero_or_fast_frames_never_poll():
  pacing = fed(ArrivalPacing(lead_s=0.001, history=3), [0.0, 0.05, 0.10, 0.15])
  assert pacing.poll_window() is not None
  pacing.reset()
  assert pacing.period is None and pacing.poll_window() is None
  assert fed(ArrivalPacing(lead_s=0.0, history=3), [0.0, 0.05, 0.10, 0.15]).poll_window() is None
  fast = fed(ArrivalPacing(lead_s=0.001, history=3), [0.0, 0.005, 0.010, 0.015])
  assert fast.poll_window() is None, "frames no farther apart than a whole window: polling would never sleep"
  with pytest.raises(ValueError, match="-0.5"):
    ArrivalPacing(lead_s=-0.5)


def test_a_periodic_producer_is_learned_and_every_frame_arrives_in_order_even_after_a_late_one(server_process):
  server = server_process().start([(VISION_STREAM_CABIN, 8, 64, 48, "tight")])
  client = VisionIpcClient("camerad", VISION_STREAM_CABIN, conflate=False, spin_lead_s=0.002)
  assert client.connect(blocking=True, timeout=30)
  count = 30
  server.begin(f"pace {VISION_STREAM_CABIN} 100 {count} 20 300")  # the last frame comes 300 ms late
  got, periods = [], []
  for _ in range(count):
    buf = client.recv(RECV_TIMEOUT_MS)
    assert buf is not None, f"frame {100 + len(got)} never arrived"
    assert np.all(np.frombuffer(buf.data, np.uint8)[:8] == (buf.frame_id & 0xFF))
    got.append(buf.frame_id)
    periods.append(client._pacing.period)
  server.reply("pace")
  assert got == list(range(100, 100 + count))
  learned = [p for p in periods if p is not None]
  assert learned, "the 20 ms period was never learned"
  # generous bounds: scheduling on a loaded machine jitters arrivals, but the median stays near 20 ms
  assert 0.010 < float(np.median(learned)) < 0.030
  assert client._pacing._lateness, "the client never reported how late a sleep to a poll window ended"
  assert client._pacing.period is None, "the late last frame must switch polling off"
  assert client.recv(50) is None


def test_under_the_gated_replay_backend_the_client_never_polls(monkeypatch):
  monkeypatch.setenv(FAKE_ENV, "1")  # every receive() there is a replay step, so polling would step it
  client = VisionIpcClient("camerad", VISION_STREAM_CABIN)
  assert client._pacing.lead_s == 0 and client._pacing.poll_window() is None
  client.close()
