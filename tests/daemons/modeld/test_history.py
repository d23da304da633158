"""History queue semantics: the pair count, 5 Hz feature history, max-pooled desire, rising-edge pulses (the image
pair itself is the frame program's ring: tests/daemons/shared/test_frame_program.py)."""
import numpy as np
import pytest

from daemons.modeld.model_state import HistoryError, ModelHistory


def desire(i):
  d = np.zeros(8, np.float32)
  d[i] = 1
  return d


def test_the_pair_is_filled_from_the_fifth_frame_on():
  h = ModelHistory()
  for t in range(1, 11):
    h.push(desire(0))
    assert h.pair_filled == (t >= 5)


def test_features_buffer_holds_every_4th_past_hidden_state_oldest_first():
  h = ModelHistory()
  for t in range(1, 121):
    ins = h.push(desire(0))
    fb = ins["features_buffer"]
    assert fb.shape == (1, 24, 512)
    # slot j holds the hidden state of step t-96+4j (0 before the history reaches back that far)
    expected = [max(t - 96 + 4 * j, 0) for j in range(24)]
    np.testing.assert_array_equal(fb[0, :, 0], expected)
    assert fb[0, -1, 0] != t   # the current step's own state is never in the buffer
    h.update_hidden(np.full(512, t, np.float32))


def test_desire_is_a_rising_edge_pulse_max_pooled_to_5hz():
  h = ModelHistory()
  seq = [0, 3, 3, 3, 0, 0, 4, 4, 0, 3]
  pulses = [h.desire_edge(desire(d)) for d in seq]
  sent = [int(np.argmax(p)) if p.any() else 0 for p in pulses]
  assert sent == [0, 3, 0, 0, 0, 0, 4, 0, 0, 3]    # once per rising edge; class 0 never sent

  h = ModelHistory()
  for t in range(8):
    ins = h.push(desire(5 if t == 5 else 0))
  dp = ins["desire_pulse"]
  assert dp.shape == (1, 25, 8)
  # pushes 0..7 fill the last 8 of 100 slots; step 5 lands in the last group of 4 (slots 96..99)
  assert dp[0, 24, 5] == 1 and dp[0, :24].sum() == 0 and dp.sum() == 1
  for _ in range(4):
    ins = h.push(desire(0))
  assert ins["desire_pulse"][0, 23, 5] == 1 and ins["desire_pulse"][0, 24].sum() == 0


def test_reset_and_shape_errors():
  h = ModelHistory()
  for _ in range(6):
    h.push(desire(2))
  h.update_hidden(np.ones(512))
  h.reset()
  assert not h.pair_filled and h.prev_feat.sum() == 0 and h.prev_desire.sum() == 0
  with pytest.raises(HistoryError, match="512 entries"):
    h.update_hidden(np.zeros(511))
  with pytest.raises(HistoryError, match="8 entries"):
    h.desire_edge(np.zeros(7))
