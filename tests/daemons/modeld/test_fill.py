"""fill_model_msg / fill_driving_model_data / fill_pose_msg against hand-computed values."""
import numpy as np
import pytest

from cereal import log
from daemons.modeld.action import Action
from daemons.modeld.constants import OUTPUT_HEADS, T_IDXS, X_IDXS
from daemons.modeld.fill import (FrameInfo, PublishState, fill_driving_model_data, fill_model_msg, fill_pose_msg,
                                 update_confidence, update_hard_brake)
from daemons.modeld.parse import parse_outputs


def event(service):
  e = log.Event.new_message()
  e.init(service)
  return e


def parsed():
  heads = {name: np.zeros((1, w), np.float32) for name, w in OUTPUT_HEADS}
  plan = np.zeros((33, 15), np.float32)
  plan[:, 0] = 2.0 + 3.0 * T_IDXS + 0.5 * T_IDXS ** 2     # x(t): an exact quadratic
  plan[:, 1] = -0.1 * T_IDXS
  heads["plan"][0, :495] = plan.ravel()
  lanes = np.zeros((4, 33, 2), np.float32)
  lanes[:, :, 0] = np.array([-5, -2, 2, 5])[:, None]
  heads["lane_lines"][0, :264] = lanes.ravel()
  heads["lane_lines_prob"][0] = [-9, 9, -9, -9, 9, 9, 0, 0]
  heads["lead"][0, :72] = np.arange(72)
  heads["lead_prob"][0] = [0, 50, -50]
  heads["pose"][0] = np.arange(12)
  heads["road_transform"][0, :6] = [1, 2, 3, 4, 5, 6]
  return parse_outputs(heads)


def test_model_msg_fields():
  e = event("modelV2")
  frame = FrameInfo(frame_id=100, frame_id_extra=99, timestamp_sof=5_000, timestamp_eof=6_000,
                    camera_state_frame_id=103, frame_drop_ratio=0.25)
  m = fill_model_msg(e, parsed(), Action(0.01, -0.5, False), PublishState(), frame, "small", "",
                     raw_pred=np.arange(4, dtype=np.float32))
  assert (m.frameId, m.frameIdExtra, m.frameAge, m.timestampSof, m.timestampEof) == (100, 99, 3, 5_000, 6_000)
  assert m.frameDropPerc == pytest.approx(25.0) and m.modelName == "small"
  np.testing.assert_allclose(list(m.position.t), T_IDXS, rtol=1e-6)
  assert len(m.position.x) == 33 and m.position.xStd[0] == pytest.approx(1.0)
  assert len(m.laneLines) == 4 and list(m.laneLines[0].t) == [] and m.laneLines[3].y[0] == 5
  np.testing.assert_allclose(list(m.laneLines[0].x), X_IDXS, rtol=1e-6)
  np.testing.assert_allclose(list(m.laneLineProbs), [1, 0, 1, 0.5], atol=1e-3)     # the odd entries
  assert len(m.roadEdges) == 2 and len(m.roadEdgeStds) == 2
  assert len(m.leadsV3) == 3 and list(m.leadsV3[0].t) == [0, 2, 4, 6, 8, 10]
  assert list(m.leadsV3[0].x) == [0, 4, 8, 12, 16, 20] and list(m.leadsV3[0].v) == [2, 6, 10, 14, 18, 22]
  assert m.leadsV3[1].prob == pytest.approx(1.0) and m.leadsV3[2].prob < 1e-4
  assert len(m.meta.disengagePredictions.brakeDisengageProbs) == 5 and len(m.meta.disengagePredictions.gasPressProbs) == 6
  assert len(m.meta.desirePrediction) == 32 and len(m.meta.desireState) == 8
  assert m.action.desiredAcceleration == pytest.approx(-0.5)
  assert np.frombuffer(m.rawPredictions, np.float32).tolist() == [0, 1, 2, 3]
  assert str(m.confidence) == "green"


def test_driving_model_data_and_path_polynomial():
  e = event("modelV2")
  m = fill_model_msg(e, parsed(), Action(0.02, 1.0, True), PublishState(), FrameInfo(7, 7, 1, 2), "big", "why not")
  d = event("drivingModelData")
  fill_driving_model_data(d, m)
  dd = d.drivingModelData
  assert (dd.frameId, dd.modelName, dd.fallbackReason, dd.action.shouldStop) == (7, "big", "why not", True)
  np.testing.assert_allclose(list(dd.path.xCoefficients), [2, 3, 0.5, 0, 0], atol=1e-3)
  np.testing.assert_allclose(list(dd.path.yCoefficients), [0, -0.1, 0, 0, 0], atol=1e-4)
  assert (dd.laneLineMeta.leftY, dd.laneLineMeta.rightY) == (-2, 2)
  assert dd.laneLineMeta.leftProb == pytest.approx(0.0, abs=1e-3) and dd.laneLineMeta.rightProb == pytest.approx(1.0, abs=1e-3)


def test_pose_msg():
  e = event("cameraOdometry")
  fill_pose_msg(e, parsed(), FrameInfo(3, 3, 10, 20))
  p = e.cameraOdometry
  assert list(p.trans) == [0, 1, 2] and list(p.rot) == [3, 4, 5]
  np.testing.assert_allclose(list(p.transStd), np.exp([6, 7, 8]), rtol=1e-5)
  assert list(p.roadTransformTrans) == [1, 2, 3] and len(p.wideFromDeviceEuler) == 3
  assert (p.frameId, p.timestampSof, p.timestampEof) == (3, 10, 20)


def test_hard_brake_needs_the_whole_window_above_thresholds():
  ps = PublishState()
  meta = np.zeros(55, np.float32)
  meta[4:31:6] = 0.8      # 3 m/s^2 probabilities
  meta[6:31:6] = 0.2      # 5 m/s^2 probabilities
  results = [update_hard_brake(ps, meta) for _ in range(5)]
  assert results == [False, False, False, False, True]   # true only once all 5 buffered values are high
  meta[6] = 0.1           # 0.1 < 0.15 in the newest slot
  assert not update_hard_brake(ps, meta)


def test_confidence_diagonal_score():
  ps = PublishState()
  meta = np.zeros(55, np.float32)
  assert update_confidence(ps, meta, 40) == "green"
  meta[2:31:6] = [0.1, 0.2, 0.3, 0.4, 0.5]   # brake disengage by horizon
  # increments [0.1, .1/.9, .1/.8, .1/.7, .1/.6]; each shift adds one more diagonal term (row r, column 4-r)
  labels = [update_confidence(ps, meta, 40 * k) for k in range(1, 6)]
  inc = [0.1, 0.1 / 0.9, 0.1 / 0.8, 0.1 / 0.7, 0.1 / 0.6]
  scores = [sum(inc[:k]) / 5 for k in range(1, 6)]     # 0.02, 0.042, 0.067, 0.096, 0.129
  expect = ["green" if s < 0.01165 else "yellow" if s < 0.06157 else "red" for s in scores]
  assert labels == expect == ["yellow", "yellow", "red", "red", "red"]
  assert update_confidence(ps, np.zeros(55, np.float32), 41) == "red"   # not on a 2 s boundary: buffer unchanged
