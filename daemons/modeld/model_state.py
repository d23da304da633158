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
"""
import os
import time
from typing import Callable

import numpy as np

from daemons.common.env import DAEMONS_ENV
from daemons.common.metadata import ModelContract, ModelMetadata, load_metadata
from daemons.common.outputs import ModelOutputError, NonFiniteOutput, check_output  # noqa: F401 (modeld's API)
from daemons.common.stage_times import StageTimes
from daemons.modeld.constants import DESIRE_HISTORY, DESIRE_LEN, FEATURE_LEN, HISTORY_LEN, OUTPUT_HEADS, \
  TRAFFIC_CONVENTION_LEN
from daemons.modeld.fill import PublishState
from daemons.modeld.history import ModelHistory
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
