"""The logger, run by the manager with --record, writes a route that holds what was on the bus and the frames."""
import os
import subprocess
import sys

import numpy as np

from cereal.route import Route
from selfdrive_stub.producers.scenes import render_frame
from process_replay.compare import compare_logs
from process_replay.configs import get_config
from process_replay.harness import replay
from repo_paths import REPO_ROOT



def test_manager_records_a_route(namespace, tmp_path):
  out = tmp_path / "route"
  proc = subprocess.run([sys.executable, "-m", "selfdrive_stub.supervisor.manager", "--duration", "12", "--camera", "mici",
                         "--seed", "3", "--record", str(out), "--rate-tolerance", "0.6",
                         "--block", "modeld,dmonitoringmodeld,dmonitoringd,selfdrived"],
                        cwd=REPO_ROOT, capture_output=True, text=True, timeout=180)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  with Route(str(out)) as route:
    assert route.header["complete"] and route.camera == "mici" and route.header["seed"] == 3
    assert route.header["generator"] == "selfdrive_stub.supervisor.logger"
    events = route.events()
    times = [e.logMonoTime for e in events]
    assert times == sorted(times)
    kinds = {e.which() for e in events}
    assert {"carState", "extrinsicsCalibration", "deviceState", "narrowRoadCameraState", "cabinCameraState",
            "managerState"} <= kinds
    assert sum(e.which() == "carState" for e in events) > 200
    states = [e.managerState for e in events if e.which() == "managerState"]
    assert len(states) >= 3                                      # 1 Hz
    procs = {p.name: p for p in states[-1].processes}
    assert procs["car"].running and procs["car"].pid > 0 and procs["logger"].running
    assert not procs["modeld"].shouldBeRunning if "modeld" in procs else True
    assert route.cameras == ["cabin", "road", "wide"]
    assert all(route.header["cameras"][c]["skipped"] >= 0 for c in route.cameras)   # frames the logger lost
    for cam, service in (("road", "narrowRoadCameraState"), ("cabin", "cabinCameraState")):
      states = {getattr(e, service).frameId: getattr(e, service) for e in events if e.which() == service}
      frames = route.frames(cam)
      assert len(frames) >= 0.5 * len(states) > 20   # a loaded machine may make the logger skip overwritten frames
      assert set(states) <= set(frames.frame_ids())  # every logged camera state has its frame
      for i in (0, len(frames) // 2, len(frames) - 1):
        f = frames.get(i)
        st = states[f.frame_id]                                  # each frame has its camera state message
        assert (f.timestamp_sof, f.timestamp_eof) == (st.timestampSof, st.timestampEof)
        want = np.frombuffer(render_frame("mici", cam, 3, f.frame_id), np.uint8)
        assert np.array_equal(np.frombuffer(f.data, np.uint8), want)   # the pixels camerad served

    # the recorded route replays through process_replay, and a second replay gives the same outputs
    dm = get_config("dmonitoringmodeld")
    first, second = (replay(dm, route) for _ in range(2))   # all of it: on a loaded machine camerad starts late
    assert len(first.outputs) == len(second.outputs) >= 20
    assert compare_logs(first.outputs, second.outputs, dm.ignore) == []
  assert not os.path.exists(namespace.shm_dir)
