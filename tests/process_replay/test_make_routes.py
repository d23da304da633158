"""Sample-route generator: deterministic inputs, all three cameras, car and calibration, regen outputs merged."""
import collections
import os
import subprocess
import sys

import pytest

from process_replay.make_routes import FRAME_NS, TICK_NS, make_route, write_base_route
from cereal.route import Route
from repo_paths import REPO_ROOT
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


def make_routes_cli(*args):
  return subprocess.run([sys.executable, "-m", "process_replay.make_routes", *args], capture_output=True, text=True,
                        timeout=300, env={**os.environ, "PYTHONPATH": REPO_ROOT})


@pytest.mark.parametrize("args,message", [
  (["--routes", "nope"], "invalid choice: 'nope'"),
  (["--routes", "tici", "--out", "{tmp}"], "exists; pass --force to replace it"),
  (["--routes", "tici", "--out", "{tmp}", "--force", "--seconds", "0.01"], "seconds=0.01"),
])
def test_make_routes_mistakes_are_one_line_and_exit_2(tmp_path, args, message):
  (tmp_path / "tici").mkdir()
  r = make_routes_cli(*[a.format(tmp=tmp_path) for a in args])
  assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_the_lane_change_scenario_scripts_the_driver(tmp_path):
  path = str(tmp_path / "lc")
  write_base_route(path, "tici", 3.0, seed=0, scenario="lane-change")
  with Route(path) as route:
    assert route.header["scenario"] == "lane-change"
    cs = [e for e in route.events() if e.which() == "carState"]
    cc = [e for e in route.events() if e.which() == "carControl"]
  t = lambda e: (e.logMonoTime - cs[0].logMonoTime) / 1e9
  assert all(e.carState.vEgo > 20 * 0.44704 for e in cs)                           # fast enough for a lane change
  assert [round(t(e), 2) for e in cs if e.carState.leftBlinker][:1] == [2.0]
  nudges = [e for e in cs if e.carState.steeringPressed]
  assert nudges and all(e.carState.steeringTorque > 0 for e in nudges) and 2.5 <= t(nudges[0]) < 2.51
  assert not cc[0].carControl.latActive and all(e.carControl.latActive for e in cc if 0.5 <= t(e) < 3.0)
