"""dmonitoringmodeld's daemon path is the captured frame program: every frame's warp and model run inside it (one
linked program run per frame, the numpy warp never called), the VisionIPC frame's own memory is bound (not
copied) and its lease released after the readback, an overwrite is seen from the program's after-warp hook, and
driverStateV2 is byte-identical to the numpy warp oracle + OnnxRunner behind the host frames seam."""
import numpy as np
import pytest

import runtime.link
from cereal.messaging import new_message
from selfdrive_stub.supervisor.cabin_warp import WarpPlan
from daemons.common.frame_loop import Frame, run_frame_loop
from daemons.dmonitoringmodeld.core import Calibration, DMonitoringmodeld
from daemons.dmonitoringmodeld.model_state import MODEL_PATH, ModelState
from daemons.dmonitoringmodeld.programs import load_programs
from selfdrive_stub.producers.scenes import SceneRenderer
from host_frames import HostDMFrames, RuntimeModel
from visionipc import VISION_STREAM_CABIN, VisionIpcClient, VisionIpcServer, get_nv12_info
from call_chain import record_linked_runs


def _calib(now=0.0) -> Calibration:
  msg = new_message("extrinsicsCalibration")
  msg.extrinsicsCalibration.rpyCalib = [0.01, -0.02, 0.03]
  msg.extrinsicsCalibration.calStatus = "calibrated"
  c = Calibration()
  c.update(msg.extrinsicsCalibration, now)
  return c


@pytest.fixture(scope="module")
def programs():
  return DMonitoringmodeld(load_programs(MODEL_PATH), send_raw_pred=True)


@pytest.fixture(scope="module")
def cabin_frames():
  scene = SceneRenderer("tici", 0)
  return [np.frombuffer(scene.frame("cabin", i), np.uint8).copy() for i in (10, 20)]


def _frame(data, frame_id, still_valid=lambda: True):
  return [Frame(data, frame_id, 0, 0, still_valid, 1928, 1208, 2048)]


def test_the_daemon_path_runs_warp_and_model_as_one_program_run_and_never_the_numpy_warp(programs, cabin_frames,
                                                                                          monkeypatch):
  runs = []
  real_run = runtime.link.Linked.run
  monkeypatch.setattr(runtime.link.Linked, "run", lambda self, *a, **k: (runs.append(self), real_run(self, *a, **k))[1])

  def no_numpy_warp(*_a, **_k):
    raise AssertionError("the daemon path called the numpy warp")
  monkeypatch.setattr(WarpPlan, "__call__", no_numpy_warp)
  calib = _calib()
  for i, data in enumerate(cabin_frames):
    result = programs.step(_frame(data, i + 1), calib)
    assert result.valid, result.reasons
  prog = programs.model.frames.program((1928, 1208, 2048, cabin_frames[0].nbytes))
  assert len(runs) == len(cabin_frames) and all(r is prog.model.linked for r in runs)


def test_the_daemon_paths_driver_state_is_byte_identical_to_the_numpy_warp_and_runner_path(programs, cabin_frames):
  oracle = DMonitoringmodeld(ModelState(programs.model.metadata, HostDMFrames(RuntimeModel(MODEL_PATH))), send_raw_pred=True)
  calib = _calib()
  for i, data in enumerate(cabin_frames):
    got, want = programs.step(_frame(data, i + 1), calib), oracle.step(_frame(data, i + 1), calib)
    a, b = got.events[0][1].driverStateV2, want.events[0][1].driverStateV2
    assert a.rawPredictions == b.rawPredictions and len(a.rawPredictions) == 553 * 4
    assert a.leftDriverData.to_dict() == b.leftDriverData.to_dict()
    assert a.rightDriverData.to_dict() == b.rightDriverData.to_dict()
    assert a.wheelOnRightProb == b.wheelOnRightProb


def test_a_frame_overwritten_during_the_program_is_reported_from_its_after_warp_hook(programs, cabin_frames):
  asked = []

  def overwritten():
    prog = programs.model.frames.program((1928, 1208, 2048, cabin_frames[0].nbytes))
    asked.append(("frame" in prog.model.bound, prog.leases["frame"].released))
    return False
  result = programs.step(_frame(cabin_frames[0], 3, overwritten), _calib())
  assert asked == [(True, False)]   # asked once, while the program still held the frame
  assert not result.valid and result.reasons == ["frame 3 overwritten while it was warped"]
  assert not result.events[0][1].valid


def test_the_visionipc_frame_is_bound_in_place_and_its_lease_released_after_the_readback(programs, cabin_frames):
  w, h = 1928, 1208
  stride, y_height, _, size = get_nv12_info(w, h)
  server = VisionIpcServer("camerad")
  server.create_buffers_with_sizes(VISION_STREAM_CABIN, 2, w, h, size, stride, stride * y_height)
  server.start_listener()
  client = VisionIpcClient("camerad", VISION_STREAM_CABIN, conflate=True)
  try:
    assert client.connect(True)
    src = cabin_frames[1]
    server.send(VISION_STREAM_CABIN, src[:size] if src.nbytes >= size else np.resize(src, size), frame_id=5)
    buf = client.recv(1000)
    assert buf is not None
    address = np.frombuffer(buf.data, np.uint8).ctypes.data
    seen = {}
    prog = programs.model.frames.program((w, h, buf.stride, len(buf.data)))

    def still_valid():
      array, lease_holder = prog.model.linked.bound["frame"]
      seen["address"], seen["released"] = array.ctypes.data, prog.leases["frame"].released
      return buf.still_valid()
    frame = Frame.from_buf(buf)
    frame.still_valid = still_valid
    result = programs.step([frame], _calib())
    assert result.valid, result.reasons
    assert seen == {"address": address, "released": False}     # the program read the mapping itself, no copy
    assert prog.leases["frame"].released and "frame" not in prog.model.bound   # after the readback: let go
  finally:
    client.close()
    server.close()


def test_a_cabin_frame_reaches_the_linked_program_in_five_calls_from_the_frame_loop(programs, cabin_frames, monkeypatch):
  """The daemon's main calls run_frame_loop; from there a frame is five calls from Linked.run."""
  callers = record_linked_runs(monkeypatch)
  pending = [_frame(cabin_frames[0], 4)]
  run_frame_loop(pending.pop, lambda frames: _calib(), programs.step, lambda *_: None, lambda: not pending)
  prog = programs.model.frames.program((1928, 1208, 2048, cabin_frames[0].nbytes))
  assert callers == [(prog.model.linked, ["run_frame_loop", "FrameStep.step", "DMonitoringmodeld.run", "ModelState.run_frame",
                                          "FrameProgram.run"])]
