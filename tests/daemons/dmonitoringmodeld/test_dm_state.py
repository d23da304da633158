"""Per-frame step and output decoding: clipping, slice validation, safe metadata, and every `valid` reason."""
import base64
import json
import os
import pickle

import numpy as np
import onnx
import pytest

from cereal.messaging import log_from_bytes, new_message
from daemons.common.calibration import camera_time
from common.cameras import UnknownCameraError
from daemons.common.frame_loop import Frame
from daemons.common.metadata import ModelMetadataError
from daemons.common.frame_program import FramePrograms
from daemons.common.stage_times import StageTimes
from daemons.dmonitoringmodeld.core import Calibration, DMonitoringmodeld
from daemons.dmonitoringmodeld.model_state import MODEL_PATH, ModelState, load_dm_metadata
from daemons.dmonitoringmodeld.parse import non_finite_heads, parse_outputs
from daemons.dmonitoringmodeld.programs import dm_frame_programs
from host_frames import HostDMFrames
from selfdrive_stub.producers.scenes import SceneRenderer

META = load_dm_metadata(MODEL_PATH)
TICI = (1928, 1208, 2048)


def slices_json():
  model = onnx.load(MODEL_PATH, load_external_data=False)
  return json.loads({p.key: p.value for p in model.metadata_props}["output_slices_json"])


def model_with_props(tmp_path, props: dict) -> str:
  model = onnx.load(MODEL_PATH)
  del model.metadata_props[:]
  onnx.helper.set_model_props(model, props)
  path = str(tmp_path / "m.onnx")
  onnx.save(model, path)
  return path


def calib_msg(rpy=(0.0, 0.02, -0.01), status="calibrated", valid=True):
  msg = new_message("extrinsicsCalibration", valid=valid)
  msg.extrinsicsCalibration.rpyCalib = list(rpy)
  msg.extrinsicsCalibration.calStatus = status
  return msg.extrinsicsCalibration


def good_calib(now=0.0):
  c = Calibration()
  c.update(calib_msg(), now)
  return c


class FixedOutput:
  """A fake model that returns a given raw output: drives the parse/validity paths with exact numbers."""
  def __init__(self, out):
    self.out = np.asarray(out, np.float32)

  def __call__(self, inputs):
    assert inputs["input_img"].shape == (1, 1382400) and inputs["calib"].shape == (1, 3)
    return self.out.copy(), StageTimes(model=0.001)


def decoded(result):
  (service, msg), = result.events
  assert service == "driverStateV2" and result.valid == msg.valid
  return log_from_bytes(msg.to_bytes())


def dm(model, send_raw_pred=False) -> DMonitoringmodeld:
  """model: the daemon's frame programs, or a fake model behind the host frames seam (the numpy warp oracle)."""
  frames = model if isinstance(model, FramePrograms) else HostDMFrames(model)
  return DMonitoringmodeld(ModelState(META, frames), send_raw_pred=send_raw_pred)


def cabin(data, frame_id, still_valid=lambda: True, sof=0, eof=0, geometry=(1928, 1208, 2048)) -> list[Frame]:
  return [Frame(data, frame_id, sof, eof, still_valid, *geometry)]


@pytest.fixture(scope="module")
def tici_frame():
  return np.frombuffer(SceneRenderer("tici", 0).frame("cabin", 20), np.uint8)


# ---- decoding numerics

def test_sigmoid_floor_and_std_cap():
  out = np.zeros(553, np.float32)
  s = slices_json()
  out[s["face_prob_lhd"][0]] = -1e6
  out[s["face_prob_rhd"][0]] = 1e6
  out[s["face_descs_lhd"][0] + 6:s["face_descs_lhd"][1]] = 1e6
  p = parse_outputs(out, META)
  assert p["lhd"]["faceProb"] == pytest.approx(1 / (1 + np.exp(11)), rel=1e-6)   # ≈ 1.67e-5, never 0
  assert p["rhd"]["faceProb"] == 1.0
  assert p["lhd"]["faceOrientationStd"] == pytest.approx([np.exp(11)] * 3, rel=1e-6)
  assert len(p["lhd"]["facePosition"]) == 2 and len(p["lhd"]["faceOrientation"]) == 3


def test_face_descs_layout():
  out = np.zeros(553, np.float32)
  a = slices_json()["face_descs_rhd"][0]
  out[a:a + 12] = np.arange(12) * 0.1
  d = parse_outputs(out, META)["rhd"]
  assert d["faceOrientation"] == pytest.approx([0.0, 0.1, 0.2])
  assert d["facePosition"] == pytest.approx([0.3, 0.4])
  assert d["faceOrientationStd"] == pytest.approx(np.exp([0.6, 0.7, 0.8]))
  assert d["facePositionStd"] == pytest.approx(np.exp([0.9, 1.0]))


def test_nan_is_found_by_head_name():
  out = np.zeros(553, np.float32)
  out[slices_json()["sleep_prob_rhd"][0]] = np.nan
  assert non_finite_heads(out, META) == ["sleep_prob_rhd"]


# ---- metadata validated at load

def test_missing_head_is_startup_error(tmp_path):
  s = slices_json()
  del s["sleep_prob_rhd"]
  with pytest.raises(ModelMetadataError, match="sleep_prob_rhd"):
    load_dm_metadata(model_with_props(tmp_path, {"output_slices_json": json.dumps(s)}))


def test_slice_past_the_end_is_startup_error(tmp_path):
  s = slices_json()
  s["features"] = [41, 600]
  with pytest.raises(ModelMetadataError, match="features.*553"):
    load_dm_metadata(model_with_props(tmp_path, {"output_slices_json": json.dumps(s)}))


def test_wrong_head_size_is_startup_error(tmp_path):
  s = slices_json()
  s["face_descs_lhd"] = [0, 9]
  with pytest.raises(ModelMetadataError, match="face_descs_lhd.*9 values, expected 12"):
    load_dm_metadata(model_with_props(tmp_path, {"output_slices_json": json.dumps(s)}))


def test_reference_pickled_slices_are_read(tmp_path):
  s = {k: slice(*v) for k, v in slices_json().items()}
  meta = load_dm_metadata(model_with_props(tmp_path, {"output_slices": base64.b64encode(pickle.dumps(s)).decode()}))
  assert meta.output_slices == s


class Exploit:
  def __reduce__(self):
    return (os.system, ("touch /tmp/pwned-by-model",))


def test_malicious_pickled_metadata_is_refused(tmp_path):
  blob = base64.b64encode(pickle.dumps({"face_prob_lhd": Exploit()})).decode()
  with pytest.raises(ModelMetadataError, match="refusing to unpickle"):
    load_dm_metadata(model_with_props(tmp_path, {"output_slices": blob}))


# ---- one frame through the real model, and each valid reason

@pytest.fixture(scope="module")
def runner():
  """The daemon's frame programs of the DM model on the CPU."""
  return dm_frame_programs(MODEL_PATH, {"warp": "CPU", "model": "CPU"})


def test_good_frame_is_valid_and_complete(runner, tici_frame):
  msg = decoded(dm(runner, send_raw_pred=True).step(cabin(tici_frame, 20, sof=111, eof=222), good_calib(camera_time(19))))
  assert msg.valid and msg.invalidReason == ""
  ds = msg.driverStateV2
  assert ds.frameId == 20 and ds.timestampSof == 111 and ds.timestampEof == 222 and ds.framesDropped == 0
  assert ds.leftDriverData.faceProb > 0.8 and ds.rightDriverData.faceProb > 0.8
  assert 0 < ds.wheelOnRightProb < 0.5
  raw = np.frombuffer(ds.rawPredictions, "<f4")
  assert raw.size == 553 and parse_outputs(raw, META)["lhd"]["faceProb"] == pytest.approx(ds.leftDriverData.faceProb)
  t = ds.stageTimings
  assert t.warpMs == 0 and t.modelMs > 0 and t.parseMs > 0     # the warp is inside the one program
  assert ds.modelExecutionTime * 1e3 >= t.warpMs + t.uploadMs + t.modelMs + t.readbackMs + t.parseMs
  assert ds.gpuExecutionTime * 1e3 == pytest.approx(t.uploadMs + t.modelMs + t.readbackMs, rel=1e-3)


def test_raw_predictions_off_by_default(runner, tici_frame):
  msg = decoded(dm(runner).step(cabin(tici_frame, 1), good_calib()))
  assert msg.driverStateV2.rawPredictions == b""


def test_dropped_frames_counted(runner, tici_frame):
  state = dm(runner)
  for fid in (5, 6, 9, 10, 14):
    msg = decoded(state.step(cabin(tici_frame, fid), good_calib(camera_time(fid))))
  assert msg.driverStateV2.framesDropped == 5


@pytest.mark.parametrize("make_calib,reason", [
  (lambda: Calibration(), "calibration missing"),
  (lambda: _calib(calib_msg(status="invalid")), r"calibration invalid \(calStatus=invalid"),
  (lambda: _calib(calib_msg(), valid=False), r"calibration invalid .*valid=False"),
  (lambda: _calib(calib_msg(rpy=(0.0, 0.1))), r"calibration unusable: rpyCalib must hold 3 values \(roll, pitch, yaw\), got 2"),
  (lambda: _calib(calib_msg(rpy=(0.0, float("nan"), 0.0))), "calibration unusable: rpyCalib has non-finite values"),
  (lambda: _calib(calib_msg(), at=camera_time(0)), r"calibration stale \(10.0 s old\)"),
])
def test_calibration_problems_invalidate(runner, tici_frame, make_calib, reason):
  msg = decoded(dm(runner).step(cabin(tici_frame, 200), make_calib()))     # frame 200: 10 s of camera time
  assert not msg.valid
  assert __import__("re").search(reason, msg.invalidReason), msg.invalidReason


def _calib(reader, valid=True, at=camera_time(199)):
  c = Calibration()
  c.update(reader, at, valid)
  return c


def test_bad_calibration_keeps_last_good_value():
  c = good_calib()
  c.update(calib_msg(rpy=(1.0, 2.0)), 1.0)
  assert c.rpy.tolist() == pytest.approx([0.0, 0.02, -0.01])


def test_overwritten_frame_invalidates(runner, tici_frame):
  msg = decoded(dm(runner).step(cabin(tici_frame, 7, still_valid=lambda: False), good_calib()))
  assert not msg.valid and msg.invalidReason == "frame 7 overwritten while it was warped"


def test_non_finite_output_invalidates_with_head_names(tici_frame):
  out = np.zeros(553, np.float32)
  out[slices_json()["face_descs_lhd"][0]] = np.inf
  msg = decoded(dm(FixedOutput(out)).step(cabin(tici_frame, 1), good_calib()))
  assert not msg.valid and msg.invalidReason == ("dmonitoring model failed: NonFiniteOutput: non-finite dmonitoring model output "
                                                 "(1 values in ['face_descs_lhd'])")
  assert msg.driverStateV2.frameId == 1 and msg.driverStateV2.leftDriverData.faceProb == 0   # not parsed, not published


def test_reasons_accumulate_inputs_then_overwrite_then_model(tici_frame):
  out = np.full(553, np.nan, np.float32)
  msg = decoded(dm(FixedOutput(out)).step(cabin(tici_frame, 1, still_valid=lambda: False), Calibration()))
  reasons = msg.invalidReason.split("; ")
  assert reasons[:2] == ["calibration missing", "frame 1 overwritten while it was warped"]
  assert reasons[2].startswith("dmonitoring model failed: NonFiniteOutput: non-finite dmonitoring model output") and len(reasons) == 3


def test_an_output_of_the_wrong_size_is_published_invalid_and_never_parsed(tici_frame):
  msg = decoded(dm(FixedOutput(np.zeros(551))).step(cabin(tici_frame, 1), good_calib()))
  assert not msg.valid
  assert msg.invalidReason == "dmonitoring model failed: ModelOutputError: dmonitoring model returned 551 values, expected 553"


def test_known_cabin_geometries_pass_and_an_unknown_one_is_refused(runner):
  state = dm(runner)
  state.check_geometry(1928, 1208)
  state.check_geometry(1344, 760)
  with pytest.raises(UnknownCameraError, match="640x480"):
    state.check_geometry(640, 480)
  frame = np.zeros(640 * 480 * 3 // 2, np.uint8)
  with pytest.raises(UnknownCameraError, match="640x480"):   # the step refuses it too, before any program
    state.step(cabin(frame, 1, geometry=(640, 480, 640)), good_calib())


def test_calibration_age_is_camera_time_and_restarts_reanchor():
  c = Calibration()
  c.update(calib_msg(), now=50.0)          # received at frame 1000
  assert c.problem(52.0) == ""
  assert c.problem(0.05) == ""             # the camera restarted: frame ids start over
  assert c.problem(2.0) == "" and "stale" in c.problem(2.7)
