"""Temporal inputs of the driving model, kept in numpy (semantics of openpilot's modeld.py history buffers).

Invariants, per 20 Hz step t (one `ModelHistory` per model, so a model never sees another model's past):
- images: the frame program keeps the warped frames and gives the model the pair (t-4, t); the history counts the
  frames, and `pair_filled` is false until frame t-4 is a real frame;
- features_buffer: the hidden states of steps t-96 ... t-4 (every 4th of the last 96), oldest first; the
  current step's own hidden state is *not* included (the model appends it);
- desire_pulse: the last 100 rising-edge desire vectors, max-pooled over groups of 4 to (1, 25, 8);
- a desire is sent once, on its rising edge (class 0 "none" is never sent);
- everything starts at zero; `reset()` returns to that state.
"""
import numpy as np

from daemons.modeld.constants import DESIRE_HISTORY, DESIRE_LEN, FEATURE_LEN, FRAME_SKIP, HISTORY_LEN

N_IMG_SLOTS = FRAME_SKIP + 1               # frames t-4 ... t
N_FEAT = HISTORY_LEN * FRAME_SKIP          # 96 hidden states at 20 Hz
N_DESIRE = DESIRE_HISTORY * FRAME_SKIP     # 100 desire pulses at 20 Hz


class HistoryError(ValueError):
  """An input of the wrong shape pushed into the history."""


class ModelHistory:
  def __init__(self):
    # rings: entry k of step n lives at n % size; reads gather the right order (no per-step shifting)
    self._feat_q = np.zeros((N_FEAT, FEATURE_LEN), np.float32)
    self._desire_q = np.zeros((N_DESIRE, DESIRE_LEN), np.float32)
    self._features = np.zeros((1, HISTORY_LEN, FEATURE_LEN), np.float32)
    self._desires = np.zeros((1, DESIRE_HISTORY, DESIRE_LEN), np.float32)
    self.prev_feat = np.zeros(FEATURE_LEN, np.float32)
    self.prev_desire = np.zeros(DESIRE_LEN, np.float32)
    self.frames_pushed = 0

  def reset(self) -> None:
    self.__init__()

  @property
  def pair_filled(self) -> bool:
    return self.frames_pushed >= N_IMG_SLOTS

  def desire_edge(self, desire: np.ndarray) -> np.ndarray:
    """Rising-edge pulse of a one-hot desire vector; updates the remembered previous desire."""
    desire = np.asarray(desire, np.float32).reshape(-1).copy()
    if desire.shape != (DESIRE_LEN,):
      raise HistoryError(f"desire must have {DESIRE_LEN} entries, got shape {desire.shape}")
    desire[0] = 0.0
    pulse = np.where(desire - self.prev_desire > 0.99, desire, 0.0).astype(np.float32)
    self.prev_desire = desire
    return pulse

  def push(self, desire: np.ndarray) -> dict[str, np.ndarray]:
    """Advance one step: the desire and feature queues, and the frame count that `pair_filled` reads (the image
    pair is the frame program's: it holds the warped frames in its own ring, daemons/common/frame_program.py).
    Returns features_buffer and desire_pulse, owned by the history and overwritten by the next push."""
    pulse = self.desire_edge(desire)
    n = self.frames_pushed
    self.frames_pushed += 1
    # after this push the queue, oldest first, is ring[(n + 1 + k) % size] for k = 0 .. size-1
    self._feat_q[n % N_FEAT] = self.prev_feat
    np.take(self._feat_q, (n + 1 + np.arange(0, N_FEAT, FRAME_SKIP)) % N_FEAT, axis=0, out=self._features[0])
    self._desire_q[n % N_DESIRE] = pulse
    ordered = np.take(self._desire_q, (n + 1 + np.arange(N_DESIRE)) % N_DESIRE, axis=0)
    np.max(ordered.reshape(DESIRE_HISTORY, FRAME_SKIP, DESIRE_LEN), axis=1, out=self._desires[0])
    return {"features_buffer": self._features, "desire_pulse": self._desires}

  def update_hidden(self, hidden_state: np.ndarray) -> None:
    """Remember this step's hidden state; it enters the feature queue on the next push."""
    hidden = np.asarray(hidden_state, np.float32).reshape(-1)
    if hidden.shape != (FEATURE_LEN,):
      raise HistoryError(f"hidden_state must have {FEATURE_LEN} entries, got shape {hidden.shape}")
    self.prev_feat = hidden.copy()
