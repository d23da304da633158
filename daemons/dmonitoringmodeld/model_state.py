"""The driver monitoring model with everything that is its own: frame programs, validated metadata, calib input.

"ModelState" means the same in both daemons (and in openpilot): one model, its own inputs/state and its
run. The per-frame step (validity, message) is `core.DMonitoringmodeld`.

Invariants:
- The model's metadata is validated at load (required heads, sizes, slices inside the output); its inputs must be
  `input_img` (1, 1382400) and `calib` (1, 3).
- One path: the captured frame program (programs.load_programs). Per frame, the cabin frame's own memory -> warp
  -> model as one runtime program per geometry (daemons/common/frame_program.FramePrograms), `run_frame()`.
- `run_frame()` returns the parsed heads, the raw output and its StageTimes (parse on the host), or raises, as
  modeld's ModelState does: ModelOutputError for an output of the wrong size, NonFiniteOutput naming the heads
  that hold NaN/Inf (daemons/common/outputs.check_output). It never parses a short or non-finite array.
"""
import os
import time

import numpy as np

from daemons.common.dm_warp import DM_INPUT_SIZE
from daemons.common.metadata import ModelContract, ModelMetadata, load_metadata
from daemons.common.outputs import check_output
from daemons.common.stage_times import StageTimes
from daemons.dmonitoringmodeld.parse import HEAD_SIZES, non_finite_heads, parse_outputs

MODEL_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models", "dmonitoring_model.onnx")
INPUT_SHAPES = {"input_img": (1, DM_INPUT_SIZE[0] * DM_INPUT_SIZE[1]), "calib": (1, 3)}
# the DM model contract (README.md states it): checked whole at load, every mismatch in one error
DM_CONTRACT = ModelContract("driver monitoring", {"input_img": ("uint8", INPUT_SHAPES["input_img"]),
                                                  "calib": ("float32", INPUT_SHAPES["calib"])}, HEAD_SIZES,
                            daemon="dmonitoringmodeld")


def load_dm_metadata(path: str) -> ModelMetadata:
  return load_metadata(path, contract=DM_CONTRACT)


class ModelState:
  def __init__(self, metadata: ModelMetadata, frames):
    self.name = "dmonitoring"
    self.frames = frames           # the frame programs (programs.py: FramePrograms)
    self.metadata = metadata
    self.calib = np.zeros(INPUT_SHAPES["calib"], np.float32)
    self.runs = 0

  def run_frame(self, frame, calib: np.ndarray, after_warp=None) -> tuple[dict, np.ndarray, StageTimes]:
    """Run the frame program on this cabin Frame (its buffer bound, not copied) and calibration; `after_warp` is
    called after the program last read the frame, before its lease is released."""
    self.calib[0, :] = calib
    geometry = (frame.width, frame.height, frame.stride, memoryview(frame.data).nbytes)
    raw, times, _ = self.frames.program(geometry).run({"frame": frame.data}, {"calib": self.calib}, after_warp)
    return self._parsed(raw, times)

  def _parsed(self, raw: np.ndarray, times: StageTimes) -> tuple[dict, np.ndarray, StageTimes]:
    check_output(self.name, raw, self.metadata.output_size, lambda r: non_finite_heads(r, self.metadata))
    t0 = time.perf_counter()
    parsed = parse_outputs(raw, self.metadata)
    self.runs += 1
    return parsed, raw, times.host(parse=time.perf_counter() - t0)
