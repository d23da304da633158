"""The lanechange sample route (car stub scenario lane-change): replayed through modeld, its DesireHelper takes
carState and carControl.latActive from the log and the desire goes none -> laneChangeLeft -> none."""
import itertools

from cereal.messaging import log_from_bytes
from cereal.route import Route
from process_replay.configs import get_config
from process_replay.harness import replay


def desire(meta) -> str:
  """openpilot's DESIRES table: a lane-change desire only while starting or finishing."""
  if str(meta.laneChangeState) in ("laneChangeStarting", "laneChangeFinishing"):
    return {"left": "laneChangeLeft", "right": "laneChangeRight"}.get(str(meta.laneChangeDirection), "none")
  return "none"


def test_desire_goes_none_lane_change_left_none(lanechange_route_path):
  with Route(lanechange_route_path) as route:
    assert route.header["scenario"] == "lane-change"
    res = replay(get_config("modeld"), route)
  metas = [(e.logMonoTime, e.modelV2.meta) for e in map(log_from_bytes, res.outputs) if e.which() == "modelV2"]
  seq = [d for d, _ in itertools.groupby(desire(m) for _, m in metas)]
  assert seq == ["none", "laneChangeLeft", "none"]
  states = [k for k, _ in itertools.groupby(str(m.laneChangeState) for _, m in metas)]
  assert states[:3] == ["off", "preLaneChange", "laneChangeStarting"]
  t0 = metas[0][0]
  start = next(t for t, m in metas if desire(m) == "laneChangeLeft")
  assert 2.5 <= (start - t0) / 1e9 <= 2.6            # the nudge at 2.5 s, one frame later
