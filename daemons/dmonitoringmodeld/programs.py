"""The DM model's captured frame programs: one per cabin geometry (daemons/common/frame_program.FramePrograms).

Kept apart from model_state.py so that reading the DM contract (the manager does) does not load the graph
importer; the daemon loads this when it runs on our runtime.
"""
from common.cameras import config_for_frame
from daemons.common.dm_warp import dm_transform
from daemons.common.frame_program import FramePrograms, ModelGraph, device_table, dm_frame_program
from daemons.dmonitoringmodeld.model_state import MODEL_PATH, ModelState, load_dm_metadata
from runtime import config as runtime_config


def dm_devices() -> dict[str, str]:
  """The daemon's device table: DEV (the runtime's default device) moves the whole daemon, as it did before the
  frame program; WARP_DEV / MODEL_DEV then move a part."""
  return device_table("dmonitoringmodeld", default=runtime_config.default_device())


def dm_frame_programs(path: str = MODEL_PATH, devices: dict[str, str] | None = None) -> FramePrograms:
  """The DM frame programs of the model at `path`, keyed by (width, height, stride, frame length), on the
  daemon's device table unless `devices` is given."""
  graph = ModelGraph(path)
  devs = devices or dm_devices()

  def build(geometry):
    width, height, stride, frame_len = geometry
    return dm_frame_program(graph, dm_transform(config_for_frame(width, height).cabin), width, height, stride,
                            frame_len, devs)
  return FramePrograms(build)


def load_programs(path: str = MODEL_PATH, devices: dict[str, str] | None = None) -> ModelState:
  """The daemon's path: the validated model with its frame programs (captured per geometry on first use)."""
  meta = load_dm_metadata(path)
  return ModelState(meta, dm_frame_programs(path, devices))
