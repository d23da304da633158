"""The per-frame work of modeld as a pure object: frames + car inputs in, Event builders out, no sockets.

`Modeld.step((main, extra), car)` is the daemons' shared per-frame step (daemons/common/frame_loop.py: check,
run = the frame program's warp, still_valid and model, build; the skeleton stamps the timings). The daemon loop
and the tests drive it. Invariants:
- one call = one main frame = exactly one modelV2, drivingModelData, cameraOdometry and usbGpuState (in that
  order); a frame is never dropped by a model failure;
- big/small: the active model is the big one only once it has loaded; the first exception from the big model
  (timeout, disconnect, transfer error, non-finite output, anything) switches to the small model for the
  rest of the process and the *same* frame is re-run on the small model; an exception from the small model
  publishes the frame with valid=False and the error as the reason;
- `valid` is true only when: calibration was received, is well formed and is not stale (in camera time,
  daemons/common/calibration.py); no frames were
  dropped right before this one; the frames were not overwritten while warped; main and extra frames are in
  sync; the active model's image pair (t-4, t) is filled from its own history; the big model is not still
  loading; and the model ran. `invalidReason` lists every failed rule;
- messages say which model ran (`modelName`, `modelSource`) and why the daemon is on the small model
  (`fallbackReason`); usbGpuState reports the USB GPU (plugged) and the big model (absent, loading, ready,
  failed, with the reason), as openpilot 2026 publishes its model source and USB GPU state;
- car inputs: the DesireHelper reads carState (blinkers, steering torque, speed, blind spots) and
  carControl.latActive; a malformed car input (non-finite, unknown enum) never reaches the model: the daemon
  keeps the last good values, the frame is published valid=False with the reason, and `malformedInputs`
  counts every rejected message.
"""
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from common.cameras import DeviceCameraConfig
from common.transforms import CalibrationError, check_calibration, get_warp_matrix
from daemons.common.env import send_raw_pred as env_send_raw_pred
from daemons.common.frame_loop import Frame, FrameDrops, FrameStep, ModelOutcome, StepResult, model_event  # noqa: F401 (Frame: modeld's API)
from daemons.common.stage_times import StageTimes
from daemons.modeld.action import Action, get_action_from_model
from daemons.modeld.constants import DESIRE_LEN, DT_MDL, LAT_SMOOTH_SECONDS, LONG_SMOOTH_SECONDS
from daemons.modeld.desire import DesireHelper, DriverInputs
from daemons.modeld.fill import FrameInfo, fill_driving_model_data, fill_model_msg, fill_pose_msg
from daemons.modeld.model_state import ModelState

FRAME_SYNC_NS = 10_000_000          # main and extra frames further apart than this are out of sync
DROP_FILTER_ALPHA = DT_MDL / (10.0 + DT_MDL)   # FirstOrderFilter(rc=10 s, dt=0.05 s)
DROP_WARMUP_FRAMES = 10
DEFAULT_LAT_DELAY = 0.2
DEFAULT_LONG_ACTUATOR_DELAY = 0.15


@dataclass
class CarInputs:
  """What modeld reads from the bus for one step (defaults = the reference's demo values)."""
  v_ego: float = 0.0
  lat_delay: float = DEFAULT_LAT_DELAY
  long_actuator_delay: float = DEFAULT_LONG_ACTUATOR_DELAY
  is_rhd: bool = False
  left_blinker: bool = False
  right_blinker: bool = False
  steering_pressed: bool = False
  steering_torque: float = 0.0
  left_blindspot: bool = False
  right_blindspot: bool = False
  lat_active: bool = False           # carControl.latActive
  camera_state_frame_id: int = 0
  calibration: list | None = None    # extrinsicsCalibration.rpyCalib; None until received
  calibration_stale: bool = False
  calibration_invalid: str = ""      # non-empty when calStatus says invalid
  malformed: str = ""                # why a bus input of this frame was rejected ("" if none was)
  malformed_count: int = 0           # bus inputs rejected as malformed since start


class Modeld(FrameStep):
  """step((main Frame, extra Frame), CarInputs) -> StepResult with modelV2, drivingModelData, cameraOdometry and
  usbGpuState."""

  def __init__(self, small: ModelState, cameras: DeviceCameraConfig, main_geom: tuple[int, int, int, int],
               extra_geom: tuple[int, int, int, int] | None, main_is_wide: bool = False,
               send_raw_pred: bool | None = None, clock: Callable[[], float] = time.perf_counter):
    """main_geom / extra_geom: (width, height, stride, uv_offset) of the streams; extra None = single camera."""
    self.small = small
    self.big: ModelState | None = None
    self.active = small
    self.big_loading = False
    self.plugged = False               # the USB+AMD device opened
    self.big_absent_reason = "not tried"
    self.fallback_reason = ""
    self.main_is_wide = main_is_wide
    self.calib: np.ndarray | None = None
    self.transforms: dict[str, np.ndarray] = {}
    self.set_geometry(cameras, main_geom, extra_geom)
    self.send_raw_pred = env_send_raw_pred() if send_raw_pred is None else send_raw_pred
    self.clock = clock
    self._action_t = (0.0, 0.0)
    self.prev_action = Action()
    self.desire_helper = DesireHelper()
    self.drops = FrameDrops()
    self.frames_dropped_filtered = 0.0
    self.run_count = 0

  def set_geometry(self, cameras: DeviceCameraConfig, main_geom: tuple[int, int, int, int],
                   extra_geom: tuple[int, int, int, int] | None) -> None:
    """Take the streams' geometry, e.g. after camerad restarted with another camera; the active model's past
    came from the old camera, so it starts over. The new geometry's frame program is captured (and the geometry
    checked) by the model's capture, or at its first frame."""
    self.cameras = cameras
    self.main_geom, self.extra_geom = tuple(main_geom), tuple(extra_geom) if extra_geom is not None else None
    # until calibration arrives: a level calibration (outputs are valid=False meanwhile)
    self._set_transforms(self.calib if self.calib is not None else np.zeros(3))
    self.active.reset()

  # ---- model selection ---------------------------------------------------------------------------------
  def start_big_loading(self) -> None:
    self.big_loading, self.plugged, self.big_absent_reason = True, True, ""

  def big_unavailable(self, reason: str) -> None:
    """The big model is not tried (no device, no file, or disabled): usbGpuState says absent and why."""
    self.big_absent_reason = reason

  def usb_gpu_state(self) -> tuple[str, str]:
    """(state, reason) for usbGpuState: absent | loading | ready | failed."""
    if self.fallback_reason:
      return "failed", self.fallback_reason
    if self.big_loading:
      return "loading", ""
    if self.active is self.big and self.big is not None:
      return "ready", ""
    return "absent", self.big_absent_reason

  def big_loaded(self, big: ModelState) -> None:
    """The big model finished loading: it becomes the active model (from its own, empty history)."""
    self.big, self.active, self.big_loading = big, big, False

  def big_load_failed(self, reason: str) -> None:
    self.big_loading = False
    self.fallback_reason = f"big model load failed: {reason}"

  def _switch_to_small(self, err: BaseException) -> None:
    self.fallback_reason = f"big model failed: {type(err).__name__}: {err}"
    # the small model was idle while the big one ran: its history (from the loading period) is stale, so it
    # restarts empty and the switch-over frames are published valid=False until its image pair is filled
    self.small.reset()
    self.active = self.small
    self.run_count = 0   # re-arm the frame-drop warm-up, as the reference does

  # ---- calibration -------------------------------------------------------------------------------------
  def _set_transforms(self, rpy: np.ndarray) -> None:
    """The warp matrices of this calibration: inputs of the frame programs (a new calibration is new data, never
    a new capture)."""
    main_cam = self.cameras.wide if self.main_is_wide else self.cameras.road
    main = get_warp_matrix(rpy, main_cam.intrinsics, bigmodel_frame=False)
    extra = get_warp_matrix(rpy, self.cameras.wide.intrinsics, bigmodel_frame=True) if self.extra_geom is not None else main
    self.transforms = {"road_transform": main, "wide_transform": extra}

  def program_geometry(self, main_len: int, extra_len: int | None = None) -> tuple:
    """The frame programs' key for frames of these byte lengths: ((main), (extra)) camera geometry, each
    (width, height, stride, uv_offset, frame length); one camera serves as both."""
    main = (*self.main_geom, int(main_len))
    if self.extra_geom is None:
      return main, main
    return main, (*self.extra_geom, int(main_len if extra_len is None else extra_len))

  def _update_calibration(self, car: CarInputs) -> str:
    """Apply a new calibration; returns why it cannot be used ("" if it can)."""
    if car.calibration is None:
      return "no calibration received"
    try:
      rpy = check_calibration(car.calibration)
    except CalibrationError as e:
      return f"calibration unusable: {e}"
    if self.calib is None or not np.array_equal(rpy, self.calib):
      self._set_transforms(rpy)
      self.calib = rpy
    if car.calibration_invalid:
      return f"calibration invalid: {car.calibration_invalid}"
    if car.calibration_stale:
      return "calibration stale"
    return ""

  # ---- one frame ---------------------------------------------------------------------------------------
  def _frame_drops(self, frame_id: int) -> tuple[int, float]:
    dropped = self.drops.seen(frame_id)
    self.frames_dropped_filtered += DROP_FILTER_ALPHA * (min(dropped, 10) - self.frames_dropped_filtered)
    if self.run_count < DROP_WARMUP_FRAMES:
      self.frames_dropped_filtered = 0.0
    self.run_count += 1
    f = self.frames_dropped_filtered
    return dropped, f / (1.0 + f)

  def check(self, frames, car: CarInputs) -> list[str]:
    main, extra = frames
    reasons = [f"malformed input: {car.malformed}"] if car.malformed else []
    calib_reason = self._update_calibration(car)
    if calib_reason:
      reasons.append(calib_reason)
    dropped, drop_ratio = self._frame_drops(main.frame_id)
    self._frame = FrameInfo(main.frame_id, extra.frame_id, main.timestamp_sof, main.timestamp_eof,
                            car.camera_state_frame_id, drop_ratio, dropped)
    if dropped:
      reasons.append(f"{dropped} frame{'s' * (dropped != 1)} dropped before frame {main.frame_id}")
    if abs(main.timestamp_sof - extra.timestamp_sof) > FRAME_SYNC_NS:
      reasons.append(f"frames out of sync by {(main.timestamp_sof - extra.timestamp_sof) / 1e6:.1f} ms")
    return reasons

  def _after_warp(self, frames, reasons: list[str]) -> bool:
    """still_valid of the frames after a model's program last read them (asked again when the same frame is
    re-run on the small model; a reason is given once)."""
    found: list[str] = []
    ok = self.check_overwritten(frames, found)
    reasons.extend(r for r in found if r not in reasons)
    return ok

  def run(self, frames, car: CarInputs, reasons: list[str]) -> ModelOutcome:
    traffic = np.zeros(2, np.float32)
    traffic[int(car.is_rhd)] = 1.0
    desire = np.zeros(DESIRE_LEN, np.float32)
    desire[self.desire_helper.desire] = 1.0      # decided on the previous frame, as in the reference
    lat_action_t = car.lat_delay + LAT_SMOOTH_SECONDS + DT_MDL + DT_MDL / 2
    long_action_t = car.long_actuator_delay + LONG_SMOOTH_SECONDS + DT_MDL + DT_MDL / 2
    self._action_t = (lat_action_t, long_action_t)
    action_t = np.array([lat_action_t, long_action_t], np.float32)
    main, extra = frames
    geometry = self.program_geometry(memoryview(main.data).nbytes, memoryview(extra.data).nbytes)

    def after_warp() -> bool:   # still_valid, after the program last read the frames
      return self._after_warp(frames, reasons)

    outs, raw, times, error = None, None, StageTimes(), ""
    # any big-model failure means fallback and the same frame is run again on the small model (modelExecutionTime
    # keeps counting: this frame's model time includes the failed attempt); the small model has no fallback
    for model in (self.active, self.small):
      try:
        outs, raw, times = model.run_frames(geometry, main.data, extra.data, self.transforms, desire, traffic, action_t, after_warp)
        break
      except Exception as e:
        if model is self.small:
          error = f"small model failed: {type(e).__name__}: {e}"
          break
        self._switch_to_small(e)
    if error:
      reasons.append(error)
    elif not model.pair_filled:
      reasons.append(f"{model.name} model history filling ({model.history.frames_pushed}/5 frames)")
    if self.big_loading:
      reasons.append("big model loading")
    return ModelOutcome(outs, raw, times, model.name)

  def build(self, frames, car: CarInputs, outcome: ModelOutcome, reasons: list[str]) -> list:
    outs, raw, frame, model = outcome.parsed, outcome.raw, self._frame, self.active
    mv2, dmd, odo = (model_event(s, reasons) for s in ("modelV2", "drivingModelData", "cameraOdometry"))
    if outs is not None:
      lat_action_t, long_action_t = self._action_t
      action = get_action_from_model(outs, self.prev_action, lat_action_t, long_action_t, max(car.v_ego, 0.0))
      self.prev_action = action
      m = fill_model_msg(mv2, outs, action, model.publish_state, frame, model.name, self.fallback_reason,
                         raw if self.send_raw_pred else None)
      dh = self.desire_helper
      dh.update(DriverInputs(car.v_ego, car.left_blinker, car.right_blinker, car.steering_pressed, car.steering_torque,
                             car.left_blindspot, car.right_blindspot, car.lat_active),
                float(outs["desire_state"][0, 3] + outs["desire_state"][0, 4]))
      m.meta.laneChangeState, m.meta.laneChangeDirection = dh.state, dh.direction
      fill_driving_model_data(dmd, m)
      fill_pose_msg(odo, outs, frame)
    else:
      self._fill_failed(mv2, dmd, odo, frame, outcome.model_name)
    mv2.modelV2.modelSource = dmd.drivingModelData.modelSource = outcome.model_name
    mv2.modelV2.malformedInputs = car.malformed_count
    gpu = model_event("usbGpuState")
    g = gpu.usbGpuState
    g.plugged, g.modelSource = self.plugged, outcome.model_name
    g.state, g.reason = self.usb_gpu_state()
    return [("modelV2", mv2), ("drivingModelData", dmd), ("cameraOdometry", odo), ("usbGpuState", gpu)]

  def _fill_failed(self, mv2, dmd, odo, frame: FrameInfo, model_name: str) -> None:
    """A frame whose model failed still produces its three messages (valid=False, ids and timestamps)."""
    for b in (mv2.modelV2, dmd.drivingModelData):
      b.frameId, b.frameIdExtra = frame.frame_id, frame.frame_id_extra
      b.timestampSof, b.timestampEof = frame.timestamp_sof, frame.timestamp_eof
      b.frameDropPerc = frame.frame_drop_ratio * 100
      b.modelName, b.fallbackReason = model_name, self.fallback_reason
    o = odo.cameraOdometry
    o.frameId, o.timestampSof, o.timestampEof = frame.frame_id, frame.timestamp_sof, frame.timestamp_eof
