"""The logger on its own: what it refuses, and a recording of just the bus."""
import subprocess
import sys

from cereal import messaging
from cereal.messaging import new_message
from cereal.route import Route, RouteWriter
from selfdrive_stub.supervisor.logger import Logger
from repo_paths import REPO_ROOT



def _logger(*args, **kw):
  return subprocess.run([sys.executable, "-m", "selfdrive_stub.supervisor.logger", *args], cwd=REPO_ROOT, capture_output=True,
                        text=True, timeout=120, **kw)


def test_refuses_unknown_camera_and_an_existing_route(tmp_path):
  bad = _logger("--out", str(tmp_path / "a"), "--cameras", "road,rear")
  assert bad.returncode == 2 and "unknown camera rear" in bad.stderr
  RouteWriter(str(tmp_path / "b"), camera="tici", generator="test").close()
  again = _logger("--out", str(tmp_path / "b"), "--duration", "1")
  assert again.returncode != 0 and "already holds a route" in again.stderr


def test_records_the_bus_without_cameras(tmp_path):
  out = tmp_path / "r"
  proc = subprocess.Popen([sys.executable, "-m", "selfdrive_stub.supervisor.logger", "--out", str(out), "--cameras", "",
                           "--duration", "60"], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
  try:
    pm = messaging.PubMaster(["carState"], allow_foreign=True)
    import time
    deadline = time.monotonic() + 60
    while not (out / "header.json").exists() and time.monotonic() < deadline:   # subscribed once the header exists
      time.sleep(0.05)
    for i in range(50):
      m = new_message("carState", valid=True)
      m.carState.vEgo = float(i)
      pm.send("carState", m)
    time.sleep(0.5)
    proc.send_signal(2)
    assert proc.wait(timeout=30) == 0
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
    proc.stdout.close()
  route = Route(str(out))
  assert route.header["complete"] and route.cameras == []
  assert [e.carState.vEgo for e in route.events()] == [float(i) for i in range(50)]


def test_camera_states_wait_for_their_frames(tmp_path):
  logger = Logger(str(tmp_path / "r"), "tici", ["road"])   # recorder threads not started: frames marked by hand
  pm = messaging.PubMaster(["narrowRoadCameraState"], allow_foreign=True)
  for fid in (1, 2, 3):
    m = new_message("narrowRoadCameraState", valid=True)
    m.narrowRoadCameraState.frameId = fid
    pm.send("narrowRoadCameraState", m)
  road = logger.by_service["narrowRoadCameraState"]
  road.recorded.add(1)
  logger.drain()
  assert logger.writer.header["events"] == 1 and len(logger.pending) == 2   # 2 and 3 still wait
  road.recorded.add(3)
  logger.settle_camera_states(now=1e12)                                      # long past STATE_WAIT_S
  assert logger.writer.header["events"] == 2 and logger.dropped_states == 1 and logger.pending == []
  logger.writer.close()
