"""End to end: camerad stub + car stub + `python -m daemons.modeld` as real processes on the real bus."""
import pytest

from .stack import LOAD_REASONS, collect, spawn, stop, warming_up


@pytest.mark.parametrize("camera", ["tici", "mici"])
def test_camerad_to_modelv2(camera):
  def enough(got):
    return (sum(not warming_up(m) for m in got["modelV2"]) >= 10 and any(m.valid for m in got["modelV2"])
            and any(m.valid for m in got["drivingModelData"]))

  procs = [spawn("selfdrive_stub.producers.camerad", "--camera", camera, "--duration", "120"),
           spawn("selfdrive_stub.producers.car", "--camera", camera, "--duration", "120"),
           spawn("daemons.modeld", "--no-big")]
  try:
    got = collect(["modelV2", "drivingModelData", "cameraOdometry", "narrowRoadCameraState"], enough)
  finally:
    codes = stop(procs)
    output = procs[2].stdout.read()
  assert codes[2] == 0, f"modeld exit {codes[2]}:\n{output}"
  models = got["modelV2"]
  running = [m for m in models if not warming_up(m)]
  assert len(running) >= 10 and any(m.valid for m in running), (len(models), [m.invalidReason for m in models[-5:]])
  # once calibrated and filled, the only reasons left are the load-dependent frame rules
  assert all(m.valid or LOAD_REASONS.search(m.invalidReason) for m in running), [m.invalidReason for m in running]
  cam_eof = {m.narrowRoadCameraState.frameId: m.narrowRoadCameraState.timestampEof for m in got["narrowRoadCameraState"]}
  ids = [m.modelV2.frameId for m in models]
  assert ids == sorted(set(ids))                        # one output per frame, in order
  for m in models:
    mv2 = m.modelV2
    assert mv2.modelName == "small" and mv2.fallbackReason == ""
    if mv2.frameId in cam_eof:
      assert mv2.timestampEof == cam_eof[mv2.frameId]  # stamped from the camera frame it ran on
    if m.valid:
      assert mv2.frameIdExtra == mv2.frameId and len(mv2.position.x) == 33 and mv2.stageTimings.modelMs > 0
  valid_ids = {m.modelV2.frameId for m in models if m.valid}
  assert valid_ids & {m.drivingModelData.frameId for m in got["drivingModelData"] if m.valid}
