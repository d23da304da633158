"""The runner seam for captured per-frame programs: (geometry, frames, inputs) -> (flat output, StageTimes, hook).

Invariants:
- The daemon's per-frame work (warp + model) runs as the frame program of the frame's geometry
  (frame_program.FramePrograms: built once per geometry, replayed per frame); nothing of it runs on the host.
- Frames are handed over as the VisionIPC buffer's own memory (a memoryview or array over the mapping): the
  program binds them as leased external memory, with no host copy before the warp, and releases the lease after
  the readback. `after_warp` (the daemon's still_valid check) runs after the program last read the frames and
  before the release; its result is returned as the third element.
- Stage times come from the device timeline, every stage but the parse on_device. When the warp is a program of
  its own (the device table splits the warp and the model) its seconds are `warp`; in one fused program the
  warp's device seconds are inside `model` and `warp` is 0.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from daemons.common.frame_program import FrameProgram, FramePrograms
from daemons.common.stage_times import StageTimes


DEVICE_STAGES = frozenset({"warp", "upload", "model", "readback"})


class FrameRunner:
  """Frame programs by geometry behind one call; `output` names the model output returned flat (default: the
  first)."""

  def __init__(self, build: Callable[[tuple], FrameProgram], output: str | None = None, max_entries: int = 4):
    self.programs = FramePrograms(build, max_entries)
    self.output = output
    self.runs = 0

  def program(self, geometry) -> FrameProgram:
    """The program of this geometry (captured on first use)."""
    return self.programs.get(geometry)

  def reset(self) -> None:
    """Forget every program's frame history (a model that stood by starts over)."""
    for prog in self.programs.programs.values():
      prog.reset()

  def __call__(self, geometry, frames: dict, inputs: dict, after_warp=None) -> tuple[np.ndarray, StageTimes, object]:
    prog = self.programs.get(geometry)
    outs, info = prog.run(frames, inputs, after_warp)
    name = self.output or next(iter(prog.model.output_specs))
    times = StageTimes(warp=float(info["warp"]), upload=float(info["upload"]), model=float(info["model"]),
                       readback=float(info["readback"]), on_device=DEVICE_STAGES)
    self.runs += 1
    return np.asarray(outs[name], dtype=np.float32).reshape(-1), times, info["after_warp"]
