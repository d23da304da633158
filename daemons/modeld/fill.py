"""Fill modelV2, drivingModelData and cameraOdometry from parsed outputs (semantics of openpilot
selfdrive/modeld/fill_model_msg.py), plus our additions: sof/eof timestamps, which model ran and why, and a reason
whenever `valid` is false. The timing fields (modelExecutionTime, stageTimings) are stamped on every message by
the daemons' skeleton (daemons/common/frame_loop.stamp_timings), not here.

Invariants:
- `valid` is decided by the caller (core.Modeld.step) and written with its reason; these functions never set it
  to True on their own;
- laneLines/roadEdges are indexed by X_IDXS (their `t` stays empty); the plan by T_IDXS; leads by LEAD_T_IDXS;
- `PublishState` carries the only cross-frame state here (hard-brake and confidence buffers); each model has its
  own, like its history.
"""
from dataclasses import dataclass, field

import numpy as np

from daemons.modeld.action import Action
from daemons.modeld.constants import (CONFIDENCE_BUFFER_LEN, FCW_THRESHOLDS_3MS2, FCW_THRESHOLDS_5MS2, LEAD_T_IDXS,
                                      META_T_IDXS, NUM_LEADS, POLY_PATH_DEGREE, RYG_GREEN, RYG_YELLOW, T_IDXS, X_IDXS,
                                      Meta, Plan)

T_LIST = T_IDXS.astype(np.float32).tolist()
X_LIST = X_IDXS.astype(np.float32).tolist()
CONFIDENCE_EVERY = 40   # frames (2 s at 20 Hz)
# least-squares fit on the fixed T_IDXS grid is a fixed linear map: coefficients = PATH_FIT @ samples
PATH_FIT = np.linalg.pinv(np.polynomial.polynomial.polyvander(T_IDXS, POLY_PATH_DEGREE))


@dataclass
class PublishState:
  disengage_buffer: np.ndarray = field(default_factory=lambda: np.zeros(CONFIDENCE_BUFFER_LEN * 5, np.float32))
  prev_brake_5ms2_probs: np.ndarray = field(default_factory=lambda: np.zeros(5, np.float32))
  prev_brake_3ms2_probs: np.ndarray = field(default_factory=lambda: np.zeros(2, np.float32))


@dataclass
class FrameInfo:
  """The frames one model step consumed."""
  frame_id: int               # main stream VisionIPC frame id
  frame_id_extra: int         # wide stream frame id (== frame_id on single-camera devices)
  timestamp_sof: int          # main frame, monotonic ns
  timestamp_eof: int
  camera_state_frame_id: int = 0   # narrowRoadCameraState.frameId as last seen (only for frameAge)
  frame_drop_ratio: float = 0.0
  dropped_frames: int = 0          # VisionIPC frames skipped right before this one


def _floats(a) -> list:
  return np.asarray(a, dtype=np.float32).reshape(-1).tolist()


def fill_xyzt(b, t, x, y, z, x_std=None, y_std=None, z_std=None) -> None:
  b.t = t
  b.x, b.y, b.z = _floats(x), _floats(y), _floats(z)
  if x_std is not None:
    b.xStd, b.yStd, b.zStd = _floats(x_std), _floats(y_std), _floats(z_std)


def update_hard_brake(ps: PublishState, meta: np.ndarray) -> bool:
  ps.prev_brake_5ms2_probs[:-1] = ps.prev_brake_5ms2_probs[1:]
  ps.prev_brake_5ms2_probs[-1] = meta[Meta.HARD_BRAKE_5][0]
  ps.prev_brake_3ms2_probs[:-1] = ps.prev_brake_3ms2_probs[1:]
  ps.prev_brake_3ms2_probs[-1] = meta[Meta.HARD_BRAKE_3][0]
  return bool((ps.prev_brake_5ms2_probs > FCW_THRESHOLDS_5MS2).all() and (ps.prev_brake_3ms2_probs > FCW_THRESHOLDS_3MS2).all())


def update_confidence(ps: PublishState, meta: np.ndarray, frame_id: int) -> str:
  """Every 2 s shift the per-horizon disengage increments into the buffer; every frame score its diagonal."""
  if frame_id % CONFIDENCE_EVERY == 0:
    brake, gas, steer = meta[Meta.BRAKE_DISENGAGE], meta[Meta.GAS_DISENGAGE], meta[Meta.STEER_OVERRIDE]
    any_dp = 1.0 - (1.0 - brake) * (1.0 - gas) * (1.0 - steer)
    increments = np.concatenate([any_dp[:1], np.diff(any_dp) / (1.0 - any_dp[:-1])])
    ps.disengage_buffer[:-5] = ps.disengage_buffer[5:]
    ps.disengage_buffer[-5:] = increments
  score = sum(ps.disengage_buffer[i * 5 + 4 - i] for i in range(5)) / 5
  return "green" if score < RYG_GREEN else "yellow" if score < RYG_YELLOW else "red"


def fill_model_msg(event, outs: dict, action: Action, ps: PublishState, frame: FrameInfo, model_name: str,
                   fallback_reason: str, raw_pred: np.ndarray | None = None):
  """Fill event.modelV2 (the caller has set event.valid / invalidReason); returns the modelV2 builder."""
  m = event.modelV2
  m.frameId = frame.frame_id
  m.frameIdExtra = frame.frame_id_extra
  m.frameAge = max(frame.camera_state_frame_id - frame.frame_id, 0)
  m.frameDropPerc = frame.frame_drop_ratio * 100
  m.timestampSof = frame.timestamp_sof
  m.timestampEof = frame.timestamp_eof
  m.modelName = model_name
  m.fallbackReason = fallback_reason

  plan, plan_stds = outs["plan"][0], outs["plan_stds"][0]
  fill_xyzt(m.init("position"), T_LIST, *plan[:, Plan.POSITION].T, *plan_stds[:, Plan.POSITION].T)
  fill_xyzt(m.init("velocity"), T_LIST, *plan[:, Plan.VELOCITY].T)
  fill_xyzt(m.init("acceleration"), T_LIST, *plan[:, Plan.ACCELERATION].T)
  fill_xyzt(m.init("orientation"), T_LIST, *plan[:, Plan.T_FROM_CURRENT_EULER].T)
  fill_xyzt(m.init("orientationRate"), T_LIST, *plan[:, Plan.ORIENTATION_RATE].T)

  act = m.init("action")
  act.desiredCurvature, act.desiredAcceleration, act.shouldStop = action.desired_curvature, action.desired_acceleration, action.should_stop

  lanes = outs["lane_lines"][0]
  lane_lines = m.init("laneLines", lanes.shape[0])
  for i in range(lanes.shape[0]):
    fill_xyzt(lane_lines[i], [], X_LIST, lanes[i, :, 0], lanes[i, :, 1])
  m.laneLineStds = _floats(outs["lane_lines_stds"][0, :, 0, 0])
  m.laneLineProbs = _floats(outs["lane_lines_prob"][0, 1::2])
  edges = outs["road_edges"][0]
  road_edges = m.init("roadEdges", edges.shape[0])
  for i in range(edges.shape[0]):
    fill_xyzt(road_edges[i], [], X_LIST, edges[i, :, 0], edges[i, :, 1])
  m.roadEdgeStds = _floats(outs["road_edges_stds"][0, :, 0, 0])

  leads = m.init("leadsV3", NUM_LEADS)
  for i in range(NUM_LEADS):
    lead, std = outs["lead"][0, i], outs["lead_stds"][0, i]
    leads[i].prob = float(outs["lead_prob"][0, i])
    leads[i].t = LEAD_T_IDXS
    leads[i].x, leads[i].y, leads[i].v, leads[i].a = (_floats(c) for c in lead.T)
    leads[i].xStd, leads[i].yStd, leads[i].vStd = (_floats(c) for c in std.T[:3])

  meta = outs["meta"][0]
  md = m.init("meta")
  md.desireState = _floats(outs["desire_state"][0])
  md.desirePrediction = _floats(outs["desire_pred"][0])
  md.engagedProb = float(meta[Meta.ENGAGED][0])
  dp = md.init("disengagePredictions")
  dp.t = META_T_IDXS
  dp.brakeDisengageProbs = _floats(meta[Meta.BRAKE_DISENGAGE])
  dp.gasDisengageProbs = _floats(meta[Meta.GAS_DISENGAGE])
  dp.steerOverrideProbs = _floats(meta[Meta.STEER_OVERRIDE])
  dp.brake3MetersPerSecondSquaredProbs = _floats(meta[Meta.HARD_BRAKE_3])
  dp.brake4MetersPerSecondSquaredProbs = _floats(meta[Meta.HARD_BRAKE_4])
  dp.brake5MetersPerSecondSquaredProbs = _floats(meta[Meta.HARD_BRAKE_5])
  dp.gasPressProbs = _floats(meta[Meta.GAS_PRESS])
  dp.brakePressProbs = _floats(meta[Meta.BRAKE_PRESS])
  md.hardBrakePredicted = update_hard_brake(ps, meta)
  m.confidence = update_confidence(ps, meta, frame.frame_id)
  if raw_pred is not None:
    m.rawPredictions = np.asarray(raw_pred, dtype=np.float32).tobytes()
  return m


def fill_driving_model_data(event, modelv2) -> None:
  """Copy the compact drivingModelData from a filled modelV2 (after laneChangeState/Direction are set)."""
  d = event.drivingModelData
  d.frameId, d.frameIdExtra = modelv2.frameId, modelv2.frameIdExtra
  d.frameDropPerc = modelv2.frameDropPerc
  d.timestampSof, d.timestampEof = modelv2.timestampSof, modelv2.timestampEof
  d.modelName, d.fallbackReason = modelv2.modelName, modelv2.fallbackReason
  d.action = modelv2.action
  meta = d.init("meta")
  meta.laneChangeState, meta.laneChangeDirection = modelv2.meta.laneChangeState, modelv2.meta.laneChangeDirection
  llm = d.init("laneLineMeta")
  llm.leftY, llm.rightY = modelv2.laneLines[1].y[0], modelv2.laneLines[2].y[0]
  llm.leftProb, llm.rightProb = modelv2.laneLineProbs[1], modelv2.laneLineProbs[2]
  pos = modelv2.position
  coeffs = PATH_FIT @ np.array([list(pos.x), list(pos.y), list(pos.z)], dtype=np.float64).T   # (5, 3)
  path = d.init("path")
  path.xCoefficients, path.yCoefficients, path.zCoefficients = (_floats(c) for c in coeffs.T)


def fill_pose_msg(event, outs: dict, frame: FrameInfo) -> None:
  p = event.cameraOdometry
  p.frameId = frame.frame_id
  p.timestampSof, p.timestampEof = frame.timestamp_sof, frame.timestamp_eof
  pose, pose_stds = outs["pose"][0], outs["pose_stds"][0]
  p.trans, p.rot = _floats(pose[:3]), _floats(pose[3:])
  p.transStd, p.rotStd = _floats(pose_stds[:3]), _floats(pose_stds[3:])
  p.wideFromDeviceEuler = _floats(outs["wide_from_device_euler"][0])
  p.wideFromDeviceEulerStd = _floats(outs["wide_from_device_euler_stds"][0])
  p.roadTransformTrans = _floats(outs["road_transform"][0, :3])
  p.roadTransformTransStd = _floats(outs["road_transform_stds"][0, :3])
