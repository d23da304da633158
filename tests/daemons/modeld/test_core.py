"""Modeld.step, the pure per-frame work: each `valid` rule, messages, SEND_RAW_PRED, small-model failure."""
import itertools

import numpy as np
import pytest

from cereal import messaging
from common.cameras import MICI, TICI
from common.transforms import get_warp_matrix
from daemons.common.env import send_raw_pred
from daemons.common.frame_loop import run_frame_loop
from msgq.env import EnvError
from daemons.common.stage_times import StageTimes
from daemons.modeld.core import CarInputs, Frame, Modeld
from daemons.modeld.model_state import MODEL_PATHS, ModelOutputError, ModelState
from visionipc import get_nv12_info
from daemons.modeld.car_inputs import car_inputs
from daemons.modeld.daemon import SUBSCRIPTIONS
from daemons.modeld.daemon import pair_extra
from daemons.modeld.programs import road_frame_programs
from daemons.common.frame_program import device_table
from host_frames import HostRoadFrames, RuntimeModel
from call_chain import record_linked_runs

CALIB = [0.0, 0.02, -0.01]


@pytest.fixture(scope="module")
def small_runtime():
  """The small model on our runtime over host-warped images: the model a fake wraps (tests/host_frames.py)."""
  return RuntimeModel(MODEL_PATHS["small"], "CPU")


@pytest.fixture(scope="module")
def small_model():
  """The small model on the daemon's frame programs (shared by the module's tests: a new Modeld resets their
  image rings)."""
  frames = road_frame_programs(MODEL_PATHS["small"], device_table("modeld.small", {}))
  return ModelFactory(lambda: ModelState.load("small", lambda path: frames))


class ModelFactory:
  def __init__(self, make):
    self.make = make


def geometry(cam):
  stride, y_height, _, size = get_nv12_info(cam.width, cam.height)
  return (cam.width, cam.height, stride, stride * y_height), size


def make(small, device=TICI, single=False, **kw):
  """small: the small_model ModelFactory, or a fake model `inputs -> (flat output, StageTimes)` behind the host
  frames seam (HostRoadFrames: the numpy warp oracle)."""
  geom, size = geometry(device.road)
  small = small.make() if isinstance(small, ModelFactory) else ModelState.load("small", lambda path: HostRoadFrames(small))
  md = Modeld(small, device, geom, None if single else geom, main_is_wide=single, **kw)
  frame = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8)
  return md, frame


def step(md, frame, i, car=None, sof_offset=0, still_valid=lambda: True, extra=True):
  t = 1_000_000_000 + i * 50_000_000
  main = Frame(frame, i, t, t + 20_000_000, still_valid)
  ext = Frame(frame, i, t + sof_offset, t + sof_offset + 20_000_000) if extra else main
  return md.step((main, ext), car or CarInputs(v_ego=15.0, calibration=CALIB))


def test_valid_after_history_fills_and_messages_are_complete(small_model):
  md, frame = make(small_model)
  results = [step(md, frame, i) for i in range(6)]
  assert [r.valid for r in results] == [False] * 4 + [True] * 2
  assert "small model history filling (1/5 frames)" in results[0].reasons
  names = [s for s, _ in results[-1].events]
  assert names == ["modelV2", "drivingModelData", "cameraOdometry", "usbGpuState"]
  mv2, dmd, odo, gpu = (m for _, m in results[-1].events)
  assert str(mv2.modelV2.modelSource) == "small" and str(dmd.drivingModelData.modelSource) == "small"
  assert str(gpu.usbGpuState.state) == "absent" and not gpu.usbGpuState.plugged and gpu.valid
  m = mv2.modelV2
  assert mv2.valid and mv2.invalidReason == "" and m.modelName == "small" and m.fallbackReason == ""
  assert (m.frameId, m.frameIdExtra, m.timestampSof) == (5, 5, 1_250_000_000)
  assert m.stageTimings.modelMs > 0 and m.stageTimings.warpMs == 0 and m.modelExecutionTime > 0   # the warp is inside the one program
  assert len(m.position.x) == 33 and len(m.laneLines) == 4 and len(m.leadsV3) == 3 and len(m.rawPredictions) == 0
  assert 5 < m.velocity.x[0] < 30 and np.isfinite(m.action.desiredAcceleration)
  assert dmd.valid and dmd.drivingModelData.frameId == 5 and len(dmd.drivingModelData.path.xCoefficients) == 5
  assert odo.valid and len(odo.cameraOdometry.trans) == 3 and odo.cameraOdometry.timestampEof == m.timestampEof
  assert not results[0].events[0][1].valid and results[0].events[2][1].invalidReason == results[0].events[0][1].invalidReason
  for service, msg in results[0].events + results[-1].events:   # what subscribers decode, strictly
    assert messaging.log_from_bytes(msg.to_bytes(), service=service).valid == msg.valid


def warm(md, frame, n=5):
  for i in range(n):
    step(md, frame, i)
  return n


@pytest.mark.parametrize("car, reason", [
  (CarInputs(calibration=None), "no calibration received"),
  (CarInputs(calibration=[0.0, 0.1]), "calibration unusable: rpyCalib must hold 3 values"),
  (CarInputs(calibration=CALIB, calibration_stale=True), "calibration stale"),
  (CarInputs(calibration=CALIB, calibration_invalid="calStatus invalid"), "calibration invalid: calStatus invalid"),
])
def test_calibration_rules(small_model, car, reason):
  md, frame = make(small_model)
  i = warm(md, frame)
  r = step(md, frame, i, car)
  assert not r.valid and any(x.startswith(reason) for x in r.reasons), r.reasons
  assert step(md, frame, i + 1).valid


def test_a_calibration_change_reruns_the_warp_index_program_and_not_the_capture(small_model):
  md, frame = make(small_model)
  step(md, frame, 0)
  prog = md.small.frames.program(md.program_geometry(frame.nbytes, frame.nbytes))
  runs = prog.index_runs
  before = md.transforms["road_transform"].copy()
  step(md, frame, 1)
  assert prog.index_runs == runs                              # the same calibration: the held tables serve
  step(md, frame, 2, CarInputs(calibration=[0.0, 0.05, 0.0]))
  assert prog.index_runs == runs + 1 and not np.array_equal(before, md.transforms["road_transform"])
  assert md.small.frames.program(md.program_geometry(frame.nbytes, frame.nbytes)) is prog


def test_dropped_overwritten_and_unsynced_frames_are_invalid(small_model):
  md, frame = make(small_model)
  i = warm(md, frame, 12)
  r = step(md, frame, i + 3)          # frames i, i+1, i+2 never arrived
  assert not r.valid and "3 frames dropped before frame 15" in r.reasons
  x = 3 * 0.05 / 10.05          # FirstOrderFilter(rc=10 s, dt=50 ms) after one update with 3 drops
  assert r.events[0][1].modelV2.frameDropPerc == pytest.approx(100 * x / (1 + x), rel=1e-5)
  assert step(md, frame, i + 4).valid
  r = step(md, frame, i + 5, still_valid=lambda: False)
  assert r.reasons == [f"frame {i + 5} overwritten while it was warped"]
  r = step(md, frame, i + 6, sof_offset=12_000_000)
  assert r.reasons == ["frames out of sync by -12.0 ms"]
  r = step(md, frame, i + 8)          # one frame, i + 7, never arrived
  assert "1 frame dropped before frame %d" % (i + 8) in r.reasons


def test_single_camera_device_uses_main_for_both_inputs(small_model):
  md, frame = make(small_model, device=MICI, single=True)
  r = [step(md, frame, i, extra=False) for i in range(6)][-1]
  assert r.valid and r.events[0][1].modelV2.frameIdExtra == 5


def test_big_model_loading_marks_frames_invalid(small_model):
  md, frame = make(small_model)
  md.start_big_loading()
  i = warm(md, frame)
  assert step(md, frame, i).reasons == ["big model loading"]
  md.big_load_failed("DeviceUnavailable: unplugged")
  r = step(md, frame, i + 1)
  assert r.valid and r.events[0][1].modelV2.fallbackReason == "big model load failed: DeviceUnavailable: unplugged"


def test_small_model_failure_publishes_invalid_and_keeps_running(small_runtime):
  state = {"fail": False}

  def flaky(inputs):
    out, t = small_runtime(inputs)
    return (np.full_like(out, np.nan), t) if state["fail"] else (out, t)

  md, frame = make(flaky)
  i = warm(md, frame)
  state["fail"] = True
  r = step(md, frame, i)
  assert not r.valid and r.reasons[0].startswith("small model failed: NonFiniteOutput")
  m = r.events[0][1].modelV2
  assert m.frameId == i and m.modelName == "small" and len(m.position.x) == 0
  for service, msg in r.events[:3]:   # usbGpuState describes the GPU, which is fine
    assert not messaging.log_from_bytes(msg.to_bytes(), service=service).valid
  state["fail"] = False
  assert step(md, frame, i + 1).valid


def test_send_raw_pred(small_model, monkeypatch):
  assert [send_raw_pred(v) for v in ("1", "true", "YES", " yes ")] == [True] * 4
  assert [send_raw_pred(v) for v in ("0", "", "false", "no")] == [False] * 4
  with pytest.raises(EnvError, match="SEND_RAW_PRED must be 1/true/yes or 0/false/no, got '2'"):
    send_raw_pred("2")
  monkeypatch.setenv("SEND_RAW_PRED", "1")
  md, frame = make(small_model)
  raw = np.frombuffer(step(md, frame, 0).events[0][1].modelV2.rawPredictions, np.float32)
  assert raw.shape == (2576,) and np.isfinite(raw).all()


def test_wrong_output_size_is_refused():
  md, frame = make(lambda inputs: (np.zeros(100, np.float32), StageTimes()))
  r = step(md, frame, 0)
  assert r.reasons[-1] == "small model failed: ModelOutputError: small model returned 100 values, expected 2576"
  with pytest.raises(ModelOutputError, match="expected 2576"):
    md.small.run_frames(md.program_geometry(frame.nbytes, frame.nbytes), frame, frame, md.transforms, np.zeros(8),
                        np.zeros(2), np.ones(2))


def test_extra_frames_pair_by_start_of_frame():
  from types import SimpleNamespace
  ms = 1_000_000
  queue = [SimpleNamespace(timestamp_sof=t * ms) for t in (0, 50, 100, 150)]
  recv = lambda: queue.pop(0) if queue else None
  assert pair_extra(100 * ms, None, recv).timestamp_sof == 100 * ms      # skips the stale 0 and 50 ms frames
  held = SimpleNamespace(timestamp_sof=100 * ms)
  assert pair_extra(120 * ms, held, recv) is held                        # within 25 ms: reused, nothing read
  assert pair_extra(125 * ms, held, recv).timestamp_sof == 150 * ms      # exactly 25 ms old is too old
  assert pair_extra(300 * ms, None, recv) is None                        # stream ran dry: skip this main frame


def test_camera_geometry_change_rebuilds_warps_and_restarts_history(small_model):
  md, frame = make(small_model, device=TICI)
  i = warm(md, frame, 6)
  mici_geom, mici_size = geometry(MICI.road)
  md.set_geometry(MICI, mici_geom, mici_geom)
  assert (md.main_geom[0], md.extra_geom[1]) == (1344, 760)
  np.testing.assert_array_equal(md.transforms["road_transform"], get_warp_matrix(CALIB, MICI.road.intrinsics))
  mici_frame = np.random.default_rng(2).integers(0, 256, mici_size, dtype=np.uint8)
  results = [step(md, mici_frame, i + k) for k in range(5)]
  assert [r.valid for r in results] == [False] * 4 + [True]
  assert "small model history filling (1/5 frames)" in results[0].reasons


def test_car_inputs_from_the_bus():
  now = [50.0]
  sm = messaging.SubMaster(SUBSCRIPTIONS, clock=lambda: now[0])
  car = car_inputs(sm)
  assert car.calibration is None and car.lat_delay == CarInputs.lat_delay and not car.calibration_stale
  msgs = []
  for s in ("extrinsicsCalibration", "carState", "lateralDelay", "driverMonitoringState", "narrowRoadCameraState"):
    m = messaging.new_message(s)
    msgs.append(m)
  msgs[0].extrinsicsCalibration.rpyCalib = [0.0, 0.03, -0.01]
  msgs[1].carState.vEgo = -0.5
  msgs[2].lateralDelay.lateralDelay = 0.3
  msgs[3].driverMonitoringState.isRHD = True
  msgs[4].narrowRoadCameraState.frameId = 77
  sm.update_msgs(now[0], [m.as_reader() for m in msgs])
  car = car_inputs(sm)
  assert car.calibration == pytest.approx([0.0, 0.03, -0.01]) and car.v_ego == 0.0 and car.lat_delay == pytest.approx(0.3)
  assert car.is_rhd and car.camera_state_frame_id == 77 and car.calibration_invalid == ""
  now[0] += 3.0                                   # wall clock past 10 periods of 4 Hz: not what modeld judges
  sm.update_msgs(now[0], [])
  assert not sm.alive["extrinsicsCalibration"] and not car_inputs(sm).calibration_stale
  bad = messaging.new_message("extrinsicsCalibration", valid=False, invalidReason="too few inputs")
  bad.extrinsicsCalibration.calStatus = "invalid"
  sm.update_msgs(now[0], [bad.as_reader()])
  assert car_inputs(sm).calibration_invalid == "calStatus invalid"
  bad.extrinsicsCalibration.calStatus = "calibrated"
  sm.update_msgs(now[0], [bad.as_reader()])
  assert car_inputs(sm).calibration_invalid == "message invalid (too few inputs)"


def test_lane_change_state_reaches_the_messages_and_the_next_desire(small_model):
  md, frame = make(small_model)
  drive = dict(v_ego=25.0, calibration=CALIB, lat_active=True)
  i = warm(md, frame)
  step(md, frame, i, CarInputs(**drive))
  step(md, frame, i + 1, CarInputs(left_blinker=True, **drive))
  step(md, frame, i + 2, CarInputs(left_blinker=True, **drive))
  r = step(md, frame, i + 3, CarInputs(left_blinker=True, steering_pressed=True, steering_torque=1.0, **drive))
  mv2, dmd = r.events[0][1].modelV2, r.events[1][1].drivingModelData
  assert (str(mv2.meta.laneChangeState), str(mv2.meta.laneChangeDirection)) == ("laneChangeStarting", "left")
  assert str(dmd.meta.laneChangeState) == "laneChangeStarting"
  assert md.desire_helper.desire == 3          # laneChangeLeft goes into the next frame's desire pulse
  step(md, frame, i + 4, CarInputs(left_blinker=True, **drive))
  assert md.small.history.prev_desire[3] == 1


def test_drop_filter_warms_up_for_ten_frames(small_model):
  md, frame = make(small_model)
  step(md, frame, 0)
  r = step(md, frame, 4)
  assert "3 frames dropped before frame 4" in r.reasons
  assert r.events[0][1].modelV2.frameDropPerc == 0.0        # the filter is held at 0 for the first 10 runs
  assert not r.events[2][1].valid                            # cameraOdometry too


def test_steps_leave_no_cyclic_garbage(small_model):
  """Per-frame objects must be freed by reference counting: cycles (e.g. pycapnp's schema objects, built when a
  text field is passed to new_message as a keyword) pile up in the old GC generation of a long-running daemon."""
  import gc
  md, frame = make(small_model)
  step(md, frame, 0)
  gc.collect()
  gc.disable()
  try:
    for i in range(1, 6):
      for service, msg in step(md, frame, i).events:
        msg.to_bytes()
    assert gc.collect() == 0
  finally:
    gc.enable()


def test_a_whole_lane_change_reaches_the_model_as_one_rising_edge_pulse(small_model):
  md, frame = make(small_model)
  drive = dict(v_ego=25.0, calibration=CALIB, lat_active=True)
  pulses = []
  seen = md.small.history.desire_edge

  def record(desire):
    pulse = seen(desire)
    pulses.append(int(np.argmax(pulse)) if pulse.any() else 0)
    return pulse
  md.small.history.desire_edge = record
  i = warm(md, frame)
  script = [CarInputs(**drive)] * 2 + [CarInputs(left_blinker=True, **drive)] * 2 + \
           [CarInputs(left_blinker=True, steering_pressed=True, steering_torque=1.0, **drive)] + \
           [CarInputs(left_blinker=True, **drive)] * 30 + [CarInputs(v_ego=25.0, calibration=CALIB)] * 3
  desires = []
  for k, car in enumerate(script):
    step(md, frame, i + k, car)
    desires.append(md.desire_helper.desire)
  assert [d for d, _ in itertools.groupby(desires)] == [0, 3, 0]     # none -> laneChangeLeft -> none (latActive off)
  assert pulses.count(3) == 1 and sum(1 for p in pulses if p) == 1   # the model sees laneChangeLeft once, on its edge


def test_a_road_frame_reaches_the_linked_program_in_five_calls_from_the_frame_loop(small_model, monkeypatch):
  """The daemon's main calls run_frame_loop; from there a steady-state frame is five calls from Linked.run."""
  md, frame = make(small_model)
  warm(md, frame)
  callers = record_linked_runs(monkeypatch)
  pending = [(Frame(frame, 5, 1_250_000_000, 1_270_000_000), Frame(frame, 5, 1_250_000_000, 1_270_000_000))]
  run_frame_loop(pending.pop, lambda frames: CarInputs(v_ego=15.0, calibration=CALIB), md.step, lambda *_: None,
                 lambda: not pending)
  prog = md.small.frames.program(md.program_geometry(frame.nbytes, frame.nbytes))
  assert callers == [(prog.model.linked, ["run_frame_loop", "FrameStep.step", "Modeld.run", "ModelState.run_frames",
                                          "FrameProgram.run"])]
