"""One road model with everything that is *its own*: frame programs, validated slices, history and publish state.

"ModelState" means the same in both daemons (and in openpilot): one model, its own inputs/state and its
`run()`. The per-frame step is `core.Modeld`.

Invariants:
- output slices come from the model's metadata and are validated against its output size at load
  (ModelMetadataError at startup, never a short array per frame);
- `run_frames()` either returns finite, parsed outputs or raises: a non-finite output is `NonFiniteOutput`, so a
  model on a faulty device can never publish garbage as if it were a prediction;
- history (image pair, features, desire) and publish state (hard-brake/confidence buffers) belong to this
  model, never to another one; a model that stood by while another ran is `reset()` before it takes over,
  so it reports `pair_filled=False` for its first FRAME_SKIP frames instead of mixing in stale frames.

The temporal inputs (`ModelHistory`, semantics of openpilot's modeld.py history buffers, kept in numpy), per
20 Hz step t:
- images: the frame program keeps the warped frames and gives the model the pair (t-4, t); the history counts the
  frames, and `pair_filled` is false until frame t-4 is a real frame;
- features_buffer: the hidden states of steps t-96 ... t-4 (every 4th of the last 96), oldest first; the
  current step's own hidden state is *not* included (the model appends it);
- desire_pulse: the last 100 rising-edge desire vectors, max-pooled over groups of 4 to (1, 25, 8);
- a desire is sent once, on its rising edge (class 0 "none" is never sent);
- everything starts at zero; `reset()` returns to that state.
"""
import os
import time
from typing import Callable

import numpy as np

from daemons.common.env import DAEMONS_ENV
from daemons.common.metadata import ModelContract, ModelMetadata, load_metadata
from daemons.common.outputs import ModelOutputError, NonFiniteOutput, check_output  # noqa: F401 (modeld's API)
from daemons.common.stage_times import StageTimes
from daemons.modeld.constants import DESIRE_HISTORY, DESIRE_LEN, FEATURE_LEN, FRAME_SKIP, HISTORY_LEN, OUTPUT_HEADS, \
  TRAFFIC_CONVENTION_LEN
from daemons.modeld.fill import PublishState
from daemons.modeld.parse import parse_outputs

MODELS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")
MODEL_PATHS = {"small": os.path.join(MODELS_DIR, "driving_small.onnx"),
               "big": os.path.join(MODELS_DIR, "driving_big.onnx")}
# env overrides of the model files (process_replay points a daemon at a modified copy with these)
MODEL_PATH_ENV = {"small": "PYMODELD_ROAD_MODEL_SMALL", "big": "PYMODELD_ROAD_MODEL_BIG"}


# the road model contract (README.md states it), the same for the big and the small model: checked whole at load
ROAD_CONTRACT = ModelContract("road", {
  "img": ("uint8", (1, 12, 128, 256)), "big_img": ("uint8", (1, 12, 128, 256)),
  "features_buffer": ("float32", (1, HISTORY_LEN, FEATURE_LEN)), "desire_pulse": ("float32", (1, DESIRE_HISTORY, DESIRE_LEN)),
  "traffic_convention": ("float32", (1, TRAFFIC_CONVENTION_LEN)), "action_t": ("float32", (1, 2)),
}, {name: width for name, width in OUTPUT_HEADS if name != "pad"}, daemon="modeld")


def model_path(name: str) -> str:
  return DAEMONS_ENV.get(MODEL_PATH_ENV[name]) or MODEL_PATHS[name]


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


class ModelState:
  def __init__(self, name: str, metadata: ModelMetadata, frames):
    self.name = name
    self.frames = frames      # the captured frame programs (programs.py: FramePrograms)
    self.metadata = metadata
    self.history = ModelHistory()
    self.publish_state = PublishState()
    self.runs = 0

  @classmethod
  def load(cls, name: str, frames_factory: Callable[[str], object], path: str | None = None) -> "ModelState":
    """The model at `path` (default: model_path(name)), its contract checked before anything is compiled, run by
    the frame programs `frames_factory(path)` builds."""
    path = path or model_path(name)
    metadata = load_metadata(path, contract=ROAD_CONTRACT)
    return cls(name, metadata, frames_factory(path))

  def run_frames(self, geometry, main_frame, extra_frame, transforms: dict[str, np.ndarray], desire: np.ndarray,
                 traffic_convention: np.ndarray, action_t: np.ndarray, after_warp=None) -> tuple[dict, np.ndarray, StageTimes]:
    """One 20 Hz step on the frames themselves: the frame program of `geometry` ((main, extra) camera geometry,
    each (width, height, stride, uv_offset, frame length)) warps them with `transforms` (road_transform,
    wide_transform), pairs them with its own image history and runs the model; `after_warp` is called after it
    last read the frames."""
    inputs = self.history.push(desire)
    inputs.update(transforms)
    inputs.update(_step_inputs(traffic_convention, action_t))
    program = self.frames.program(geometry)
    raw, timings, _ = program.run({"road_frame": main_frame, "wide_frame": extra_frame}, inputs, after_warp)
    return self._checked(raw, timings)

  def capture(self, geometry) -> None:
    """Capture the frame program of this geometry now (startup), not at its first frame, and run it once on
    zero frames and inputs (as the reference's warmup: the device is touched before a real frame needs it);
    the image rings are reset after, and the history is not touched."""
    program = self.frames.program(geometry)
    main, extra = geometry
    inputs = {n: np.zeros(shape, np.float32) for n, shape in self.metadata.input_shapes.items() if "img" not in n}
    inputs.update(road_transform=np.eye(3, dtype=np.float32), wide_transform=np.eye(3, dtype=np.float32))
    program.run({"road_frame": np.zeros(main[-1], np.uint8), "wide_frame": np.zeros(extra[-1], np.uint8)}, inputs)
    self.frames.reset()

  def _checked(self, raw: np.ndarray, timings: StageTimes) -> tuple[dict, np.ndarray, StageTimes]:
    check_output(self.name, raw, self.metadata.output_size)
    t0 = time.perf_counter()
    outs = parse_outputs(self.metadata.slice_outputs(raw))
    self.history.update_hidden(outs["hidden_state"])
    self.runs += 1
    return outs, raw, timings.host(parse=time.perf_counter() - t0)

  def reset(self) -> None:
    """Forget the past (history, the frame programs' image rings, publish state), e.g. after standing by while
    another model ran."""
    self.history.reset()
    self.frames.reset()
    self.publish_state = PublishState()

  @property
  def pair_filled(self) -> bool:
    return self.history.pair_filled


def _step_inputs(traffic_convention: np.ndarray, action_t: np.ndarray) -> dict[str, np.ndarray]:
  return {"traffic_convention": np.asarray(traffic_convention, np.float32).reshape(1, 2),
          "action_t": np.asarray(action_t, np.float32).reshape(1, 2)}
