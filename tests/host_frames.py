"""The daemons' frames seam done on the host, for tests: a numpy oracle warp, then a plain model callable.

The daemons run each frame through a captured frame program (daemons/common/frame_program.FramePrograms:
`frames.program(geometry).run(frames, inputs, after_warp) -> (flat output, StageTimes, after_warp's result)`, plus
`reset()`). A test that needs a model the program cannot be (one that fails on cue, returns a wrong size or
NaN, sleeps a known time) or an oracle to compare the program with plugs one of these in its place:
- `HostRoadFrames(model)`: modeld's seam: the numpy road warp (warp_oracles.RoadWarp) of both cameras, the
  image pair (t-4, t) from a ring of the last five warped frames per camera, then `model(inputs)`;
- `HostDMFrames(model)`: dmonitoringmodeld's seam: the numpy DM warp plan, then `model(inputs)`;
- `RuntimeModel(path, device)`: a model file on our runtime as such a callable: (flat output, StageTimes).
`model(inputs) -> (flat float32 output, StageTimes)`; the warp is timed by the host's clock here (not on_device).
"""
import time

import numpy as np

from selfdrive_stub.supervisor.cabin_warp import plan_for_camera
from daemons.common.stage_times import StageTimes, last_stage_times
from runtime import OnnxRunner
from warp_oracles import RoadWarp

PAIR = 5                      # frames t-4 .. t
ROAD_IMG = (6, 128, 256)
ROAD_PARTS = (("road", "road_frame", "road_transform", "img"), ("wide", "wide_frame", "wide_transform", "big_img"))


class RuntimeModel:
  """A model file on our runtime, called as model(inputs) -> (flat output of its first output, StageTimes)."""

  def __init__(self, path: str, device: str = "CPU"):
    self.model = OnnxRunner(path, device=device)
    self.output = next(iter(self.model.output_specs))

  def __call__(self, inputs: dict) -> tuple[np.ndarray, StageTimes]:
    out = self.model(**inputs)[self.output]
    return np.asarray(out, np.float32).reshape(-1), last_stage_times(self.model)


def _checked(result) -> tuple[np.ndarray, StageTimes]:
  raw, times = result
  return np.asarray(raw, np.float32).reshape(-1), times


class HostRoadFrames:
  def __init__(self, model):
    self.model = model
    self.warps: dict[str, tuple[tuple, RoadWarp]] = {}
    self.reset()

  def program(self, geometry):
    for (cam, *_), g in zip(ROAD_PARTS, geometry):
      if cam not in self.warps or self.warps[cam][0] != tuple(g):
        self.warps[cam] = (tuple(g), RoadWarp(*g[:4]))
    return self

  def reset(self) -> None:
    self.rings = {img: np.zeros((PAIR, *ROAD_IMG), np.uint8) for *_, img in ROAD_PARTS}
    self.pushed = 0

  def run(self, frames: dict, inputs: dict, after_warp=None):
    t0 = time.perf_counter()
    slot, old = self.pushed % PAIR, (self.pushed - (PAIR - 1)) % PAIR
    pairs = {}
    for cam, frame, transform, img in ROAD_PARTS:
      warp = self.warps[cam][1]
      m = inputs[transform]
      if warp.transform is None or not np.array_equal(warp.transform, m):
        warp.set_transform(m)
      ring = self.rings[img]
      warp.warp(frames[frame], out=ring[slot])
      pairs[img] = np.concatenate([ring[old], ring[slot]])[None]
    warp_s = time.perf_counter() - t0
    ok = after_warp() if after_warp else True
    self.pushed += 1
    model_inputs = {n: a for n, a in inputs.items() if n not in ("road_transform", "wide_transform")}
    raw, times = _checked(self.model({**model_inputs, **pairs}))
    return raw, times.host(warp=warp_s), ok


class HostDMFrames:
  def __init__(self, model):
    self.model = model
    self.plans: dict[tuple, object] = {}
    self.plan = None

  def program(self, geometry):
    width, height, stride, _ = geometry
    if geometry not in self.plans:
      self.plans[geometry] = plan_for_camera(width, height, stride)
    self.plan = self.plans[geometry]
    return self

  def reset(self) -> None:
    pass

  def run(self, frames: dict, inputs: dict, after_warp=None):
    t0 = time.perf_counter()
    img = self.plan(frames["frame"])
    warp_s = time.perf_counter() - t0
    ok = after_warp() if after_warp else True
    raw, times = _checked(self.model({"input_img": img, **inputs}))
    return raw, times.host(warp=warp_s), ok
