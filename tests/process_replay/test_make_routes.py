"""Sample-route generator: deterministic inputs, all three cameras, car and calibration, regen outputs merged."""
import collections
import os

import pytest

from process_replay.make_routes import FRAME_NS, TICK_NS, make_route, write_base_route
from cereal.route import Route
from visionipc.nv12 import padded_nv12_layout


def _files(path):
  return {name: open(os.path.join(path, name), "rb").read() for name in sorted(os.listdir(path)) if name != "header.json"}


def test_base_route_is_a_pure_function_of_its_arguments(tmp_path):
  a, b = str(tmp_path / "a"), str(tmp_path / "b")
  write_base_route(a, "tici", 0.5, seed=3)
  write_base_route(b, "tici", 0.5, seed=3)
  assert _files(a) == _files(b)
  with Route(a) as route:
    assert route.cameras == ["cabin", "road", "wide"]
    for camera in route.cameras:
      frames = route.frames(camera)
      assert frames.frame_ids() == list(range(10))
      g = frames.geometry
      assert (g.size, g.stride, g.uv_offset) == padded_nv12_layout(1928, 1208)
    counts = collections.Counter(e.which() for e in route.events())
    assert counts["carState"] == int(0.5e9 // TICK_NS)
    assert counts["cabinCameraState"] == counts["narrowRoadCameraState"] == int(0.5e9 // FRAME_NS)
    assert counts["extrinsicsCalibration"] >= 2 and counts["deviceState"] >= 1 and counts["engageRequest"] >= 1


def test_make_route_merges_the_daemon_outputs(tmp_path):
  out = str(tmp_path / "mici")
  make_route(out, "mici", 0.5, seed=0, procs=("dmonitoringmodeld",), log=lambda *_: None)
  with Route(out) as route:
    assert route.header["complete"] and route.camera == "mici"
    events = route.events()
    states = [e.cabinCameraState.frameId for e in events if e.which() == "cabinCameraState"]
    outputs = [e.driverStateV2.frameId for e in events if e.which() == "driverStateV2"]
    assert outputs == states == list(range(10))
    assert [e.logMonoTime for e in events] == sorted(e.logMonoTime for e in events)
    assert route.frames("cabin").geometry.width == 1344


def test_too_short_a_route_is_refused(tmp_path):
  with pytest.raises(ValueError, match="seconds=0.01"):
    write_base_route(str(tmp_path / "r"), "tici", 0.01, seed=0)
  assert not (tmp_path / "r").exists()
