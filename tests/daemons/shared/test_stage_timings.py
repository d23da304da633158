"""What the timing fields mean, the same in both daemons (openpilot's meanings):
- gpuExecutionTime: seconds the device spent executing the step's stages (its timeline), never host time;
- modelExecutionTime: wall seconds of the whole step, from the frame received to the outputs parsed;
- stageTimings: upload/model/readback from the device timeline, warp/parse on the host.
Pinned with a model that spends a known time in a command on a real runtime device and a known time on the host,
behind the frames seam done on the host (tests/host_frames.py: its warp is host time)."""
import time

import numpy as np
import pytest

from daemons.common.calibration import camera_time
from common.cameras import TICI
from daemons.common.frame_loop import Frame, StepResult, run_frame_loop
from daemons.common.stage_times import stage_times_from_runtime
from daemons.dmonitoringmodeld.core import Calibration, DMonitoringmodeld
from daemons.dmonitoringmodeld.model_state import MODEL_PATH, ModelState as DMModelState, load_dm_metadata
from daemons.modeld.core import CarInputs, Modeld
from daemons.modeld.model_state import MODEL_PATHS, ModelState as RoadModelState
from cereal.messaging import new_message
from host_frames import HostDMFrames, HostRoadFrames
from runtime.device import Device
from visionipc import get_nv12_info

DEVICE_S = 0.05     # spent in a compute command on the CPU device
HOST_S = 0.25       # spent on the host inside the runner, outside any device command
CHECK_S = 0.1       # spent on the host in still_valid (after the warp, before the model)


class SleepyRunner:
  """Returns a fixed finite output; its stage times are the runtime's own for one sleeping compute command."""

  def __init__(self, size: int):
    self.size = size

  def __call__(self, inputs):
    dev = Device["CPU"]
    with dev.stage_timer() as t:
      dev.wait(dev.submit(lambda: time.sleep(DEVICE_S), stage="compute"))
    time.sleep(HOST_S)
    return np.zeros(self.size, np.float32), stage_times_from_runtime(
      {"upload_s": t.upload_s, "compute_s": t.compute_s, "readback_s": t.readback_s})


def slow_check():
  time.sleep(CHECK_S)
  return True


def _calibrated():
  cal = new_message("extrinsicsCalibration", valid=True)
  cal.extrinsicsCalibration.rpyCalib, cal.extrinsicsCalibration.calStatus = [0.0, 0.0, 0.0], "calibrated"
  c = Calibration()
  c.update(cal.extrinsicsCalibration, camera_time(0))
  return c


def dm_step() -> StepResult:
  dm = DMonitoringmodeld(DMModelState(load_dm_metadata(MODEL_PATH), HostDMFrames(SleepyRunner(553))), send_raw_pred=False)
  frame = np.zeros(get_nv12_info(1928, 1208)[3], np.uint8)
  return dm.step([Frame(frame, 1, 0, 0, slow_check, 1928, 1208, 2048)], _calibrated())


def modeld_step() -> StepResult:
  small = RoadModelState.load("small", lambda path: HostRoadFrames(SleepyRunner(2576)), MODEL_PATHS["small"])
  stride, y_height, _, size = get_nv12_info(1928, 1208)
  geom = (1928, 1208, stride, stride * y_height)
  md = Modeld(small, TICI, geom, geom, send_raw_pred=False)
  main = Frame(np.zeros(size, np.uint8), 1, 0, 0, slow_check)
  return md.step((main, main), CarInputs(calibration=[0.0, 0.0, 0.0]))


def test_dm_gpu_execution_time_is_the_device_timeline_and_excludes_host_time():
  ds = dm_step().events[0][1].driverStateV2
  assert DEVICE_S <= ds.gpuExecutionTime < HOST_S                 # the host's sleep is not GPU time
  assert ds.stageTimings.modelMs == pytest.approx(ds.gpuExecutionTime * 1e3, rel=1e-4)
  assert ds.stageTimings.uploadMs == ds.stageTimings.readbackMs == 0.0


@pytest.mark.parametrize("step", [dm_step, modeld_step], ids=["dmonitoringmodeld", "modeld"])
def test_model_execution_time_spans_frame_received_to_outputs_parsed(step):
  result = step()
  timed = [(s, getattr(m, s)) for s, m in result.events if "modelExecutionTime" in getattr(m, s).schema.fieldnames]
  assert timed, "no model output carries modelExecutionTime"
  for service, body in timed:
    t = body.stageTimings
    stages_ms = t.warpMs + t.uploadMs + t.modelMs + t.readbackMs + t.parseMs
    # the device command, the runner's host time and the overwrite check all lie inside the step
    assert body.modelExecutionTime >= DEVICE_S + HOST_S + CHECK_S, service
    assert body.modelExecutionTime * 1e3 >= stages_ms, service
    assert t.warpMs > 0 and t.parseMs > 0 and DEVICE_S * 1e3 <= t.modelMs < HOST_S * 1e3, service
  assert len({b.modelExecutionTime for _, b in timed}) == 1      # one step, one value on every message


def test_modeld_stamps_the_same_stage_timings_on_every_output():
  result = modeld_step()
  by_service = {s: getattr(m, s) for s, m in result.events}
  ref = by_service["modelV2"].stageTimings
  for service in ("drivingModelData", "cameraOdometry"):
    st = by_service[service].stageTimings
    assert (st.warpMs, st.modelMs, st.parseMs) == (ref.warpMs, ref.modelMs, ref.parseMs), service
  assert "stageTimings" not in by_service["usbGpuState"].schema.fieldnames


def test_the_frame_loop_publishes_each_steps_events_in_order_and_skips_empty_receives():
  received = [None, ["a"], None, ["b"]]
  published, reported = [], []

  def step(frames, bus):
    return StepResult([(f"{frames[0]}1", bus), (f"{frames[0]}2", bus)], valid=True)

  steps = run_frame_loop(lambda: received.pop(0), lambda frames: f"bus-{frames[0]}", step,
                         lambda s, m: published.append((s, m)), lambda: not received,
                         lambda frames, r: reported.append(frames[0]))
  assert steps == 2 and reported == ["a", "b"]
  assert published == [("a1", "bus-a"), ("a2", "bus-a"), ("b1", "bus-b"), ("b2", "bus-b")]
