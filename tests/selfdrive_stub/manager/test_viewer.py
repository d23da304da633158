"""The viewer draws predictions where the camera geometry puts them."""
import numpy as np
from PIL import Image

from common.cameras import TICI
from selfdrive_stub.supervisor.viewer import (FACE_COLOR, LANE_COLOR, PATH_COLOR, Scene, face_pixel, project, render_cabin,
                                   render_road, render_view)
from repo_paths import REPO_ROOT


def _straight(y, z, xs=np.linspace(2, 60, 40)):
  return np.stack([xs, np.full_like(xs, y), np.full_like(xs, z)], 1)


def test_projection_of_a_point_ahead():
  # 20 m ahead on the road surface, straight camera: centre column, f * h / d below the centre row
  px = project(np.array([[20.0, 0.0, 1.22]]), (0, 0, 0), TICI.road.intrinsics)
  assert np.allclose(px, [[964.0, 604.0 + 2648.0 * 1.22 / 20]])
  # pitching the device down moves the point up in the image; points behind the camera are dropped
  assert project(np.array([[20.0, 0.0, 1.22]]), (0, 0.05, 0), TICI.road.intrinsics)[0, 1] < px[0, 1]
  assert len(project(np.array([[-5.0, 0.0, 1.22], [0.1, 0, 0]]), (0, 0, 0), TICI.road.intrinsics)) == 0


def test_path_and_lanes_are_drawn_where_they_project():
  scene = Scene(road_y=np.zeros((1208, 1928), np.uint8), road_intrinsics=TICI.road.intrinsics,
                path=_straight(0.0, 0.0), lanes=[(_straight(-1.8, 1.22), 0.9), (_straight(1.8, 1.22), 0.01)])
  img = np.asarray(render_road(scene))
  v = round(604 + 2648 * 1.22 / 20)
  assert tuple(img[v, 964]) == PATH_COLOR
  assert tuple(img[v, round(964 - 2648 * 1.8 / 20)]) == LANE_COLOR
  assert tuple(img[v, round(964 + 2648 * 1.8 / 20)]) == (0, 0, 0)     # a lane with prob 0.01 is not drawn
  assert tuple(img[100, 100]) == (0, 0, 0)


def test_face_marker_sits_at_the_predicted_position():
  assert face_pixel((0.0, 0.0)) == (720.0, 356.0)
  img = np.asarray(render_cabin(Scene(cabin=np.full((960, 1440), 90, np.uint8), face_position=(0.0, 0.0),
                                      face_prob=0.9)))
  assert tuple(img[356, 720]) == FACE_COLOR
  assert tuple(img[900, 100]) == (90, 90, 90)


def test_view_png_round_trip(tmp_path):
  scene = Scene(road_y=np.full((760, 1344), 50, np.uint8), road_intrinsics=TICI.road.intrinsics,
                path=_straight(0.0, 0.0), lines=["road model: small", "driver: face prob 0.90"])
  out = tmp_path / "view.png"
  render_view(scene).save(out)   # cabin missing: a grey placeholder, not an error
  img = Image.open(out)
  assert img.format == "PNG" and img.mode == "RGB" and img.width <= 1600 and img.height > 300


def test_viewer_cli_without_a_stack_says_so(tmp_path):
  import subprocess
  import sys
  out = tmp_path / "v.png"
  root = REPO_ROOT
  proc = subprocess.run([sys.executable, "-m", "selfdrive_stub.supervisor.viewer", "--out", str(out), "--wait", "0.3"],
                        cwd=root, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert "no camera frames" in proc.stdout and "no messages from: modelV2" in proc.stdout
  assert Image.open(out).format == "PNG"


def test_the_viewer_run_where_no_stack_is_leaves_no_namespace_behind(tmp_path, namespace):
  """A read-only tool: what its subscribers created in /dev/shm and the runtime dir goes."""
  import os
  import subprocess
  import sys
  for d in (namespace.shm_dir, namespace.runtime_dir):   # no stack here: nothing of the namespace exists
    os.rmdir(d)
  proc = subprocess.run([sys.executable, "-m", "selfdrive_stub.supervisor.viewer", "--out", str(tmp_path / "v.png"), "--wait",
                         "0.3"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert not os.path.exists(namespace.shm_dir) and not os.path.exists(namespace.runtime_dir)


def test_the_viewer_next_to_a_running_stack_leaves_its_namespace_alone(tmp_path, namespace):
  import os
  import subprocess
  import sys
  marker = os.path.join(namespace.shm_dir, "someones_segment")
  open(marker, "wb").close()
  proc = subprocess.run([sys.executable, "-m", "selfdrive_stub.supervisor.viewer", "--out", str(tmp_path / "v.png"), "--wait",
                         "0.3"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert os.path.exists(marker) and os.path.isdir(namespace.runtime_dir)
