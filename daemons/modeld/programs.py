"""The road models' captured frame programs: one per (main, extra) camera geometry and model
(daemons/common/frame_program.FramePrograms), on the device table of `modeld.small` / `modeld.big`.

Kept apart from model_state.py so that reading the road contract does not load the graph importer.
"""
from daemons.common.frame_program import FramePrograms, ModelGraph, device_table, road_frame_program
from daemons.modeld.model_state import ModelState


def road_frame_programs(path: str, devices: dict[str, str]) -> FramePrograms:
  """The frame programs of the road model at `path`, keyed by ((main geometry), (extra geometry)), each
  (width, height, stride, uv_offset, frame length); the main camera feeds `img`, the extra one `big_img`, and a
  run returns the flat `outputs`."""
  graph = ModelGraph(path)

  def build(geometry):
    main, extra = geometry
    return road_frame_program(graph, {"road": main, "wide": extra}, devices)
  return FramePrograms(build)


def load_programs(name: str, devices: dict[str, str] | None = None, path: str | None = None) -> ModelState:
  """The daemon's path for road model `name` ("small" or "big"): its validated contract, then its frame programs
  (captured per geometry by `ModelState.capture` or on first use)."""
  devs = devices or device_table(f"modeld.{name}")
  return ModelState.load(name, lambda p: road_frame_programs(p, devs), path)
